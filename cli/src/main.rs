//! The `userdma` command-line tool: list PCI devices, show one, bind it to a user-space driver
//! and back.
//!
//! ```text
//! userdma list                                    # every device, one line each
//! userdma info 0000:01:00.0                       # BARs, capabilities, IOMMU group, driver
//! userdma bind 0000:01:00.0 --driver vfio-pci     # or uio_pci_generic; [--force-group]
//! userdma unbind 0000:01:00.0                     # back to the kernel's default driver
//! userdma plan model.json --strategy auto         # tensor offsets in one arena
//! userdma stage weights.bin --direct --depth 16   # a file into pool buffers via io_uring
//! userdma faults --transfers 100000 --kinds drop,stall  # fault injection, detection, recovery
//! ```
//!
//! Global options: `--json` prints one JSON document on stdout instead of text; `--sysfs-root
//! DIR` reads (and, for bind/unbind, writes) another sysfs tree instead of `/sys`; `--log
//! FILTER` prints the libraries' spans and events on stderr (docs/tracing-events.md).
//!
//! # Exit codes
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | the system failed (a sysfs read or write, a kernel refusal) |
//! | 2 | bad usage or input (unknown option, malformed BDF, unknown driver) |
//! | 3 | no such device |
//! | 4 | refused, nothing changed (IOMMU group conflict, driver not loaded, no IOMMU group, a bridge, permission denied) |
//! | 5 | failed after a change and rolled back: the system is as it was |
//! | 6 | failed, and the rollback failed too: the message names the device left on the wrong driver and how to repair it |
//!
//! Errors are one line on stderr, `userdma: error: ` then the message and its causes joined by
//! `: `. With `--json` the same message is also printed on stdout as
//! `{"error": {"exit_code": N, "message": "..."}}`.
//!
//! # JSON output
//!
//! Field names are stable; fields may be added. IDs are lower-case hex strings without `0x`
//! (`"vendor": "1af4"`, `"class": "020000"`), addresses are `0x`-prefixed hex strings, sizes and
//! counts are numbers, and unknown values are `null`.
//!
//! * `list`: `{"iommu": {"active", "units", "groups", "noiommu_mode"}, "drivers_loaded":
//!   {"vfio-pci", "uio_pci_generic"}, "devices": [{"bdf", "vendor", "device", "vendor_name",
//!   "device_name", "class", "class_name", "driver", "driver_override", "iommu_group",
//!   "numa_node", "dma_paths"}]}` — `dma_paths` holds `"vfio"`, `"vfio-noiommu"`, `"uio"`.
//! * `info`: the `list` device fields (with `iommu_group` an object `{"number", "domain_type",
//!   "noiommu", "members": [{"bdf", "driver"}]}`) plus `"subsystem_vendor"`,
//!   `"subsystem_device"`, `"subsystem_name"`, `"revision"`, `"interrupt_pin"`, `"bars": [{"index",
//!   "kind" ("bar" | "rom"), "start", "end", "size", "type" ("mem" | "io"), "prefetchable",
//!   "is_64bit"}]`, and `"capabilities": {"known", "status" ("complete" | "truncated" |
//!   "unreadable" | "malformed"), "detail", "list": [{"offset", "id", "name"}], "msi", "msix",
//!   "pcie"}`.
//! * `bind`: `{"bdf", "driver", "changes": [{"bdf", "from", "to"}]}` (empty `changes`: it was
//!   already bound).
//! * `unbind`: `{"bdf", "from", "to", "changed"}`.

mod bind;
mod bounded;
mod case;
mod demo;
mod exit;
mod faults;
mod hugepages;
mod ids;
mod info;
mod list;
mod log;
mod names;
mod pipeline;
mod plan;
mod serve;
mod signals;
mod stage;
mod top;
mod unbind;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use userdma::pci::{Bdf, Sysfs};

use crate::exit::Failure;

/// Heap allocations of the whole process are counted, for the per-frame figures `userdma
/// pipeline` prints (measured, not assumed).
#[global_allocator]
static GLOBAL: userdma_infer::stats::CountingAllocator = userdma_infer::stats::CountingAllocator;

/// Find, inspect and bind PCIe devices for user-space DMA (VFIO / UIO).
#[derive(Debug, Parser)]
#[command(name = "userdma", version, after_help = exit::HELP)]
struct Cli {
    /// Print one JSON document on stdout instead of text (field names are stable).
    #[arg(long, global = true)]
    json: bool,

    /// Root of the sysfs tree to read and write (a copy or fake tree, for tests).
    #[arg(long, global = true, value_name = "DIR", default_value = "/sys")]
    sysfs_root: PathBuf,

    /// Print the libraries' spans and events on stderr: a level (error, warn, info, debug,
    /// trace) or levels per target (`warn,userdma_infer=debug`); see docs/tracing-events.md.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<log::Filter>,

    #[command(subcommand)]
    command: Command,
}

/// The subcommands; each lives in its own module with its `Args` and `run`.
#[derive(Debug, Subcommand)]
enum Command {
    /// List PCI devices: address, IDs and names, class, driver, IOMMU group, NUMA node, and the
    /// DMA paths (vfio, vfio-noiommu, uio) each can use.
    List(list::Args),
    /// Show one device: BARs, capabilities (MSI, MSI-X, PCIe), IOMMU group members, driver.
    Info(info::Args),
    /// Bind a device to vfio-pci or uio_pci_generic (rolled back on failure).
    Bind(bind::Args),
    /// Return a device from a user-space driver to the kernel's default driver.
    Unbind(unbind::Args),
    /// Show hugepage pools per size and NUMA node, or reserve pages (`--reserve N`).
    Hugepages(hugepages::HugepagesArgs),
    /// Run the main job on the software loopback device: the two-stream video-analytics case
    /// (a live and a playback YOLOv5s-like stream on one modelled NPU), before (per-frame
    /// allocation and mapping, synchronous, round-robin) and after (pool, planned arena,
    /// double buffering, priority with batch switching), every frame checked, side by side
    /// with the published figures. `demo transfers`: the transfer demo.
    Demo(DemoCommand),
    /// Run frames through the N-deep inference pipeline on the loopback device, every result
    /// checked, with the naive per-frame path beside it (`--naive`).
    Pipeline(pipeline::PipelineArgs),
    /// Plan a model's tensors into one arena: offsets, arena size, lower bound, every
    /// strategy compared (`userdma plan FILE [--strategy S] [--svg FILE]`).
    Plan(plan::PlanArgs),
    /// Read a file into pool buffers through io_uring fixed buffers (O_DIRECT with
    /// `--direct` where the file system supports it): GB/s, the path used, CPU time per GB.
    Stage(stage::StageArgs),
    /// Soak the loopback device with injected faults (stalls, lost, doubled and wrong-id
    /// completions, error statuses, corrupted descriptors, slow descriptors): every fault
    /// detected and recovered from, every byte checked; prints the accounting per kind.
    Faults(faults::FaultsArgs),
    /// The device owner: one process owns the (loopback) device and runs the streams of
    /// every client process under one scheduler, over a Unix socket (`--allow-uid`,
    /// `--model NAME=SPEC`, limits per client); until SIGINT or SIGTERM.
    Serve(serve::ServeArgs),
    /// A live view of a device owner: per unit busy share, per stream frames/s and latency,
    /// switches/s, pool use, clients; attached (`--socket`) or wrapping a run (`--demo N`,
    /// `-- COMMAND`); `q` quits; JSON lines with `--json` or when stdout is not a terminal.
    Top(top::TopArgs),
    /// A client of the device owner, as the case study runs it (started by the tool).
    #[command(name = "owner-client", hide = true)]
    OwnerClient(case::OwnerClientArgs),
    /// The loopback device's engine as a child process (started by the library, not by hand).
    #[command(name = "loopback-device", hide = true)]
    LoopbackDevice,
}

/// What every subcommand gets: where sysfs is, and how to print.
#[derive(Debug)]
pub(crate) struct Context {
    /// The sysfs tree.
    pub(crate) sysfs: Sysfs,
    /// Print JSON instead of text.
    pub(crate) json: bool,
}

impl Context {
    /// Prints `value` as pretty JSON on stdout.
    pub(crate) fn print_json<T: serde::Serialize>(&self, value: &T) -> Result<(), Failure> {
        let text = serde_json::to_string_pretty(value).map_err(Failure::Json)?;
        print(&format!("{text}\n"))
    }
}

/// Writes `text` to stdout.
pub(crate) fn print(text: &str) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Parses a number of seconds within `range` (`hint`: what to give instead), for a clap
/// `value_parser`. NaN is in no range, so it is refused too.
pub(crate) fn parse_seconds_in(
    text: &str,
    range: std::ops::RangeInclusive<f64>,
    hint: &str,
) -> Result<std::time::Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number: {hint}"))?;
    if !range.contains(&secs) {
        return Err(format!("{text} s is out of range: {hint}"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Parses a BDF argument (kept as text in clap so the error has this tool's one-line form).
pub(crate) fn parse_bdf(text: &str) -> Result<Bdf, Failure> {
    Ok(text.parse()?)
}

/// `userdma demo [transfers]`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
struct DemoCommand {
    #[command(subcommand)]
    what: Option<DemoWhat>,
    #[command(flatten)]
    case: case::CaseArgs,
}

#[derive(Debug, clap::Subcommand)]
enum DemoWhat {
    /// Pool buffers host -> device -> compute -> host across several queues, every byte
    /// verified; prints throughput, latency percentiles and the device counters.
    Transfers(demo::DemoArgs),
}

/// clap's error text on one line: without the `error: ` prefix and the usage block.
fn usage_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    let body = text.split("\n\nUsage:").next().unwrap_or(text);
    let body = body
        .split("\n\nFor more information")
        .next()
        .unwrap_or(body);
    let words: Vec<&str> = body.split_whitespace().collect();
    format!("{} (see --help)", words.join(" "))
}

fn main() -> ExitCode {
    let wants_json = std::env::args().any(|a| a == "--json");
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version: clap prints them, and they succeed.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(&Failure::Usage(usage_line(&e)), wants_json),
    };
    if let Err(e) = log::install(cli.log.as_ref()) {
        return fail(&e, cli.json);
    }
    let ctx = Context {
        sysfs: Sysfs::new(&cli.sysfs_root),
        json: cli.json,
    };
    let result = match cli.command {
        Command::List(args) => list::run(&ctx, &args),
        Command::Info(args) => info::run(&ctx, &args),
        Command::Bind(args) => bind::run(&ctx, &args),
        Command::Unbind(args) => unbind::run(&ctx, &args),
        Command::Demo(DemoCommand {
            what: Some(DemoWhat::Transfers(args)),
            ..
        }) => demo::run(&args, ctx.json).map_err(Failure::from),
        Command::Demo(DemoCommand { what: None, case }) => {
            case::run(&case, ctx.json).map_err(Failure::from)
        }
        Command::LoopbackDevice => demo::serve_device().map_err(Failure::from),
        Command::Serve(args) => serve::run(&args, ctx.json).map_err(Failure::from),
        Command::Top(args) => top::run(&args, ctx.json).map_err(Failure::from),
        Command::OwnerClient(args) => case::owner_client(&args).map_err(Failure::from),
        Command::Plan(args) => plan::run(&args, ctx.json).map_err(Failure::from),
        Command::Stage(args) => stage::run(&args, ctx.json).map_err(Failure::from),
        Command::Faults(args) => faults::run(&args, ctx.json).map_err(Failure::from),
        Command::Pipeline(args) => pipeline::run(&args, ctx.json).map_err(Failure::from),
        Command::Hugepages(args) => {
            hugepages::run(&args, ctx.json, ctx.sysfs.root()).map_err(Failure::from)
        }
    };
    match result {
        Ok(()) => ExitCode::from(exit::OK),
        // The reader went away (`userdma list | head`): not an error.
        Err(Failure::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => {
            ExitCode::from(exit::OK)
        }
        Err(e) => fail(&e, ctx.json),
    }
}

/// Reports `failure` (stderr, and stdout as JSON when asked) and returns its exit code.
fn fail(failure: &Failure, json: bool) -> ExitCode {
    let code = failure.exit_code();
    let message = failure.chain();
    eprintln!("userdma: error: {message}");
    if json {
        let doc = serde_json::json!({ "error": { "exit_code": code, "message": message } });
        let _ = print(&format!("{doc}\n"));
    }
    ExitCode::from(code)
}
