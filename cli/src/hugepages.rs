//! `userdma hugepages [--reserve N] [--size 2M|1G] [--node K]`: the kernel's hugepage pools,
//! and resizing one.
//!
//! Without `--reserve`, prints every pool (each size system-wide, then per NUMA node). With
//! `--reserve N`, sets the pool of `--size` (2M by default; on `--node K`, or system-wide) to N
//! pages by writing its `nr_hugepages` (needs root), prints what the kernel granted, then the
//! pools; fewer pages granted than asked is an error (exit 1) after printing.
//!
//! JSON (`--json`): `{"pools": [{"page_size" ("2M" | "1G"), "node" (number | null), "total",
//! "free", "reserved" (number | null: per-node pools have none), "surplus"}], "reservation":
//! null | {"page_size", "node", "previous", "requested", "granted"}}`.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;
use userdma::memory::hugepages::{self, Reservation, Status};
use userdma::memory::{self, PageSize};

use crate::exit;

/// Arguments of `userdma hugepages`.
#[derive(Debug, clap::Args)]
pub(crate) struct HugepagesArgs {
    /// Set the pool to N pages (needs root); the kernel may grant fewer.
    #[arg(long, value_name = "N")]
    reserve: Option<u64>,

    /// Page size of the pool to resize: 2M or 1G.
    #[arg(long, value_name = "SIZE", default_value = "2M", value_parser = parse_size)]
    size: PageSize,

    /// Resize the pool of this NUMA node instead of the system-wide one.
    #[arg(long, value_name = "K")]
    node: Option<u32>,
}

/// Accepts hugepage sizes only (`4K` is a page size, but has no pool).
fn parse_size(text: &str) -> Result<PageSize, String> {
    match text.parse::<PageSize>() {
        Ok(size) if size.is_huge() => Ok(size),
        Ok(_) => Err("base pages have no pool: use 2M or 1G".to_owned()),
        Err(err) => Err(err.to_string()),
    }
}

/// Why `userdma hugepages` failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// Reading or writing the pools failed, or the kernel granted fewer pages than asked.
    #[error(transparent)]
    Memory(#[from] memory::Error),
    /// Writing the output failed.
    #[error("cannot write the output")]
    Output(#[source] io::Error),
    /// Encoding JSON failed.
    #[error("cannot encode the output as JSON")]
    Json(#[source] serde_json::Error),
    /// More pages asked for than the machine has memory: refused before the pool is touched.
    #[error(
        "--reserve {count} pages of {label} is more than this machine's {total_mib} MiB of \
         memory: ask for at most {most} (and leave the rest of the system room)"
    )]
    TooMany {
        count: u64,
        label: &'static str,
        total_mib: u64,
        most: u64,
    },
}

impl Error {
    /// The documented exit code for this failure.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Error::Memory(memory::Error::NoSuchPool { .. }) | Error::TooMany { .. } => exit::USAGE,
            Error::Memory(memory::Error::SysfsWrite { source, .. })
                if source.kind() == io::ErrorKind::PermissionDenied =>
            {
                exit::REFUSED
            }
            _ => exit::FAILURE,
        }
    }
}

/// The JSON document.
#[derive(Debug, Serialize)]
struct Report<'a> {
    pools: &'a [hugepages::Counts],
    reservation: Option<&'a Reservation>,
}

/// Runs `userdma hugepages` against the sysfs tree at `sysfs_root` (`/sys`, or the tool's
/// `--sysfs-root`).
pub(crate) fn run(args: &HugepagesArgs, json: bool, sysfs_root: &Path) -> Result<(), Error> {
    let reservation = match args.reserve {
        Some(count) => {
            fits_in_memory(count, args.size)?;
            Some(hugepages::reserve(sysfs_root, count, args.size, args.node)?)
        }
        None => None,
    };
    let status = hugepages::status(sysfs_root)?;
    let text = if json {
        let report = Report {
            pools: &status.pools,
            reservation: reservation.as_ref(),
        };
        let mut text = serde_json::to_string_pretty(&report).map_err(Error::Json)?;
        text.push('\n');
        text
    } else {
        render(&status, reservation.as_ref())
    };
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Error::Output)?;
    match reservation {
        Some(reservation) => Ok(reservation.require_complete()?),
        None => Ok(()),
    }
}

/// Refuses a reservation larger than the machine's memory (`/proc/meminfo`'s `MemTotal`): the
/// kernel would take what it can find, and leave the system without memory. Where the total
/// cannot be read, the kernel decides.
fn fits_in_memory(count: u64, size: PageSize) -> Result<(), Error> {
    let Some(total) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total_bytes(&text))
    else {
        return Ok(());
    };
    let page = size.bytes() as u64;
    if count.checked_mul(page).is_some_and(|bytes| bytes <= total) {
        return Ok(());
    }
    Err(Error::TooMany {
        count,
        label: size.label(),
        total_mib: total >> 20,
        most: total / page,
    })
}

/// `MemTotal` of `/proc/meminfo`'s text, in bytes.
fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Where a pool is, in words.
fn scope(node: Option<u32>) -> String {
    node.map_or_else(|| "all".to_owned(), |node| format!("node{node}"))
}

/// The text report: the reservation (if any), then one line per pool.
fn render(status: &Status, reservation: Option<&Reservation>) -> String {
    let mut text = String::new();
    if let Some(r) = reservation {
        let _ = writeln!(
            text,
            "{} pool ({}): {} -> {} pages (asked for {}){}",
            r.page_size.label(),
            scope(r.node),
            r.previous,
            r.granted,
            r.requested,
            if r.is_complete() {
                ""
            } else {
                "; the kernel could not find enough contiguous memory"
            }
        );
    }
    if status.pools.is_empty() {
        text.push_str("no hugepage pools: the kernel has no hugetlb support\n");
        return text;
    }
    let _ = writeln!(
        text,
        "{:<5} {:<6} {:>8} {:>8} {:>8} {:>8}",
        "size", "node", "total", "free", "reserved", "surplus"
    );
    for pool in &status.pools {
        let reserved = pool
            .reserved
            .map_or_else(|| "-".to_owned(), |count| count.to_string());
        let _ = writeln!(
            text,
            "{:<5} {:<6} {:>8} {:>8} {:>8} {:>8}",
            pool.page_size.label(),
            scope(pool.node),
            pool.total,
            pool.free,
            reserved,
            pool.surplus
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use std::fs;

    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: HugepagesArgs,
    }

    fn fake_pool(root: &Path, size: PageSize, node: Option<u32>, nr: u64, free: u64) {
        let dir = hugepages::pool_dir(root, size, node);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("nr_hugepages"), format!("{nr}\n")).unwrap();
        fs::write(dir.join("free_hugepages"), format!("{free}\n")).unwrap();
        fs::write(dir.join("surplus_hugepages"), "0\n").unwrap();
        if node.is_none() {
            fs::write(dir.join("resv_hugepages"), "1\n").unwrap();
        }
    }

    #[test]
    fn arguments_parse_with_defaults() {
        let cli = Cli::try_parse_from(["hugepages"]).unwrap();
        assert_eq!(
            (cli.args.reserve, cli.args.size, cli.args.node),
            (None, PageSize::Huge2M, None)
        );
        let cli =
            Cli::try_parse_from(["hugepages", "--reserve", "4", "--size", "1G", "--node", "1"])
                .unwrap();
        assert_eq!(
            (cli.args.reserve, cli.args.size, cli.args.node),
            (Some(4), PageSize::Huge1G, Some(1))
        );
        let err = Cli::try_parse_from(["hugepages", "--size", "4K"]).unwrap_err();
        assert!(err.to_string().contains("use 2M or 1G"), "{err}");
        assert!(Cli::try_parse_from(["hugepages", "--size", "3M"]).is_err());
    }

    #[test]
    fn a_reservation_larger_than_memory_is_refused_before_the_pool_is_touched() {
        assert_eq!(
            mem_total_bytes("MemTotal:       24563716 kB\nMemFree: 1 kB\n"),
            Some(24_563_716 * 1024)
        );
        assert_eq!(mem_total_bytes("MemFree: 1 kB\n"), None);
        let err = fits_in_memory(u64::MAX, PageSize::Huge2M).unwrap_err();
        assert_eq!(err.exit_code(), exit::USAGE);
        let message = err.to_string();
        assert!(message.contains("ask for at most"), "{message}");
        assert!(fits_in_memory(1 << 40, PageSize::Huge1G).is_err());
        fits_in_memory(1, PageSize::Huge2M).unwrap();
    }

    #[test]
    fn reserve_on_a_fake_tree_then_render() {
        let dir = tempfile::tempdir().unwrap();
        fake_pool(dir.path(), PageSize::Huge2M, None, 2, 2);
        fake_pool(dir.path(), PageSize::Huge2M, Some(0), 2, 2);
        let args = Cli::try_parse_from(["hugepages", "--reserve", "6", "--node", "0"])
            .unwrap()
            .args;
        run(&args, true, dir.path()).unwrap();
        let status = hugepages::status(dir.path()).unwrap();
        assert_eq!(status.pool(PageSize::Huge2M, Some(0)).unwrap().total, 6);
        let reservation = Reservation {
            page_size: PageSize::Huge2M,
            node: Some(0),
            previous: 2,
            requested: 6,
            granted: 6,
        };
        let text = render(&status, Some(&reservation));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "2M pool (node0): 2 -> 6 pages (asked for 6)");
        assert!(lines[1].starts_with("size  node"), "{text}");
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["2M", "all", "2", "2", "1", "0"]
        );
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["2M", "node0", "6", "2", "-", "0"]
        );
    }

    #[test]
    fn short_grant_and_missing_pool_have_exit_codes() {
        let short = Reservation {
            page_size: PageSize::Huge1G,
            node: None,
            previous: 0,
            requested: 8,
            granted: 3,
        };
        let text = render(&Status { pools: Vec::new() }, Some(&short));
        assert!(
            text.contains("0 -> 3 pages (asked for 8); the kernel could not"),
            "{text}"
        );
        let err = Error::from(short.require_complete().unwrap_err());
        assert_eq!(err.exit_code(), exit::FAILURE);

        let dir = tempfile::tempdir().unwrap();
        let args = Cli::try_parse_from(["hugepages", "--reserve", "1", "--size", "1G"])
            .unwrap()
            .args;
        let err = run(&args, false, dir.path()).unwrap_err();
        assert_eq!(err.exit_code(), exit::USAGE, "{err}");
    }
}
