//! A small user-space NVMe driver on userdma: the controller is opened through VFIO, its queues
//! are `userdma::ring` queue pairs in DMA memory, data moves through PRPs to `userdma::pool`
//! buffers, and completions arrive as MSI-X interrupts on eventfds.
//!
//! ```text
//! nvme BDF [--blocks N] [--seed S] [--lba L] [--verify-only]
//! ```
//!
//! What it does, in order (each step names the module that holds it):
//!
//! 1. opens the controller (bound to `vfio-pci`) with two MSI-X vectors: 0 for the admin CQ,
//!    1 for the I/O CQ (`main`);
//! 2. reads CAP, disables the controller (CC.EN = 0, waits for CSTS.RDY = 0 within CAP.TO),
//!    programs AQA/ASQ/ACQ with an admin queue pair, configures CC (4 KiB pages, 64-byte SQ and
//!    16-byte CQ entries, NVM command set) and enables it (`controller`, `regs`);
//! 3. Identify Controller (model, serial, MDTS) and Identify Namespace (LBA size and count),
//!    Set Features Number of Queues, Create I/O CQ (interrupts on vector 1) and Create I/O SQ
//!    (`controller`, `command`);
//! 4. writes `N` blocks from LBA `L` with a pattern derived from the seed, cut into commands
//!    of every PRP shape (one page, two pages, a PRP list, data starting inside a page), flushes,
//!    then reads them back into poisoned buffers and compares (`io`);
//! 5. deletes the I/O queues and shuts the controller down (CC.SHN, waits for CSTS.SHST).
//!
//! `--verify-only` skips the writes: it reads and checks what an earlier run with the same seed
//! wrote (so a second process, or a host looking at the disk image, can check persistence).
//!
//! Exit status: 0 when everything was written and read back correctly; 1 on any device, setup or
//! command failure; 2 on bad arguments; 3 when data read back differs from the pattern.
//!
//! The driver runs on a `userdma::Runtime` that owns the device: its pool comes from
//! `Runtime::pool_with`, its queues from `Runtime::open_queue` in the driver's queue format
//! (`queue::Format`), its buffers are `pool::OwnedBuffer`s. The driver logic takes any
//! `Runtime`, so its tests run it against a software controller (`fake`, a `device::Device` on
//! the loopback DMA space), without a device or hugepages: `cargo test --example nvme`. On real
//! hardware (or QEMU's emulated controller, as `tests/guest/run.sh` does):
//!
//! ```text
//! userdma bind 0000:00:04.0 --driver vfio-pci
//! cargo run --release --example nvme -- 0000:00:04.0 --blocks 256 --seed 7
//! cargo run --release --example nvme -- 0000:00:04.0 --blocks 256 --seed 7 --verify-only
//! ```

use std::error::Error as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use userdma::device::vfio::{IrqKind, Options};
use userdma::device::{self, Vfio};
use userdma::memory::PageSize;
use userdma::pci::Bdf;
use userdma::pool::Pool;
use userdma::Runtime;

mod command;
mod controller;
#[cfg(test)]
mod fake;
mod io;
mod pattern;
mod prp;
mod queue;
mod regs;

use controller::{Admin, Controller};
use io::{Direction, Io, Report};

/// Entries in each admin queue.
const ADMIN_DEPTH: u32 = 32;
/// The admin queue pair's id (its CQ interrupts on the MSI-X vector of that number).
const ADMIN_QID: u16 = 0;
/// The I/O queue pair's id.
const IO_QID: u16 = 1;
/// The MSI-X vector of the I/O CQ: the runtime waits on the vector of the queue's id.
const IO_VECTOR: u16 = IO_QID;

/// A user-space NVMe driver: writes blocks with a seeded pattern through VFIO and reads them back.
#[derive(Debug, Parser)]
#[command(name = "nvme", version)]
#[command(after_help = "The controller must be bound to vfio-pci first \
(userdma bind BDF --driver vfio-pci). Exit status: 0 success, 1 failure, 2 bad arguments, \
3 data read back differs.")]
struct Args {
    /// PCI address of the NVMe controller, e.g. 0000:00:04.0.
    bdf: Bdf,
    /// Logical blocks to write and read back.
    #[arg(long, default_value_t = 64)]
    blocks: u64,
    /// Seed of the data pattern.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// First logical block.
    #[arg(long, default_value_t = 0)]
    lba: u64,
    /// Only read and check what an earlier run with the same seed wrote.
    #[arg(long)]
    verify_only: bool,
    /// Namespace to use.
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    /// Entries in the I/O queue pair (a power of two; at most CAP.MQES + 1).
    #[arg(long, default_value_t = 32)]
    queue_depth: u32,
    /// Seconds a command (or a controller state change) may take.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
    /// MiB of 2 MiB hugepages for the buffer pool.
    #[arg(long, default_value_t = 4)]
    pool_mib: usize,
    /// Back the buffer pool with 4 KiB pages instead of hugepages (the IOMMU maps them into one
    /// IOVA range; without an IOMMU, use hugepages).
    #[arg(long)]
    base_pages: bool,
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
enum Error {
    /// The device could not be opened or used.
    #[error(
        "{bdf}: {what} failed (is it bound to vfio-pci? `userdma bind {bdf} --driver vfio-pci`)"
    )]
    Device {
        /// The controller.
        bdf: Bdf,
        /// The step.
        what: &'static str,
        /// The cause (boxed, as the others: errors stay small to move).
        #[source]
        source: Box<device::Error>,
    },
    /// Driving the controller failed.
    #[error("{bdf}: controller")]
    Controller {
        /// The controller.
        bdf: Bdf,
        /// The cause.
        #[source]
        source: Box<controller::Error>,
    },
    /// Moving data failed.
    #[error("{bdf}: namespace {nsid}")]
    Io {
        /// The controller.
        bdf: Bdf,
        /// The namespace.
        nsid: u32,
        /// The cause.
        #[source]
        source: Box<io::Error>,
    },
    /// A bad argument.
    #[error("{0}")]
    Argument(String),
}

impl Error {
    /// The exit status for this error.
    fn exit_code(&self) -> u8 {
        match self {
            Error::Io { source, .. } if matches!(**source, io::Error::Mismatch { .. }) => 3,
            Error::Argument(_) => 2,
            _ => 1,
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let mut text = err.to_string();
            let mut cause = err.source();
            while let Some(c) = cause {
                text.push_str(": ");
                text.push_str(&c.to_string());
                cause = c.source();
            }
            eprintln!("nvme: error: {text}");
            ExitCode::from(err.exit_code())
        }
    }
}

/// The largest power of two at most `n` (`n >= 1`).
fn floor_pow2(n: u32) -> u32 {
    1 << (31 - n.max(1).leading_zeros())
}

/// Checks the arguments, opens the controller through VFIO with two MSI-X vectors, and drives it.
fn run(args: &Args) -> Result<(), Error> {
    let bdf = args.bdf;
    check_arguments(args)?;
    let dev_error = |what| {
        move |source| Error::Device {
            bdf,
            what,
            source: Box::new(source),
        }
    };
    // MSI-X vector 0 for the admin CQ, 1 for the I/O CQ.
    let options = Options::new().interrupts(IrqKind::MsiX, 2);
    let device = Vfio::open_with(bdf, &options).map_err(dev_error("opening through VFIO"))?;
    // The runtime (and every queue and pool made from it) keeps the device open until the
    // controller is shut down; the last of them dropped releases the interrupts, the DMA
    // mappings and the function.
    let runtime = Runtime::from_device(Arc::new(device));
    drive(args, &runtime)
}

fn check_arguments(args: &Args) -> Result<(), Error> {
    if args.blocks == 0 {
        return Err(Error::Argument("--blocks must be at least 1".to_owned()));
    }
    if args.queue_depth < 2 || !args.queue_depth.is_power_of_two() {
        return Err(Error::Argument(format!(
            "--queue-depth {} is not a power of two from 2",
            args.queue_depth
        )));
    }
    if args.pool_mib == 0 || args.pool_mib.checked_mul(1 << 20).is_none() {
        return Err(Error::Argument(format!(
            "--pool-mib {} is not a usable pool size (1 MiB or more)",
            args.pool_mib
        )));
    }
    Ok(())
}

/// Resets, sets up and enables the controller on `runtime`'s device, runs the session, and
/// shuts the controller down.
fn drive(args: &Args, runtime: &Runtime) -> Result<(), Error> {
    let bdf = args.bdf;
    let start = Instant::now();
    let timeout = Duration::from_secs(args.timeout.max(1));
    let ctl_error = |source| Error::Controller {
        bdf,
        source: Box::new(source),
    };
    let bar = runtime.device().bar(0).map_err(|source| Error::Device {
        bdf,
        what: "mapping BAR0",
        source: Box::new(source),
    })?;
    let controller = Controller::new(bar).map_err(ctl_error)?;
    let cap = controller.cap();
    let (major, minor, tertiary) = controller.version().map_err(ctl_error)?;
    println!(
        "nvme {bdf}: NVMe {major}.{minor}.{tertiary}, up to {} entries per queue, ready timeout {:?}, doorbell stride {} bytes",
        cap.max_queue_entries(),
        cap.ready_timeout(),
        cap.doorbell_stride()
    );

    controller.disable().map_err(ctl_error)?;
    // Buffers in flight hold the pool (they are owned buffers), so it outlives the queues.
    let page = if args.base_pages {
        PageSize::Base
    } else {
        PageSize::Huge2M
    };
    // Checked by `check_arguments`: fits.
    let pool_bytes = args.pool_mib.saturating_mul(1 << 20);
    let pool = controller::pool(runtime, pool_bytes, page).map_err(ctl_error)?;
    // Opening the admin queue programs AQA/ASQ/ACQ (`queue::Format`).
    let admin_queue = controller
        .open_queue(runtime, ADMIN_QID, ADMIN_DEPTH)
        .map_err(ctl_error)?;
    controller.enable().map_err(ctl_error)?;
    println!(
        "controller ready {} ms after start",
        start.elapsed().as_millis()
    );
    let mut admin = Admin {
        queue: admin_queue,
        controller: controller.clone(),
        timeout,
    };

    let result = session(args, runtime, &controller, &mut admin, &pool, timeout);
    // Shut down even when the session failed: the controller then stops all DMA.
    let shutdown = controller.shutdown().map_err(ctl_error);
    let admin_stats = admin.queue.stats();
    result?;
    shutdown?;
    println!(
        "admin queue: {} commands, {} SQ doorbells, {} CQ doorbells, {} sleeps on MSI-X",
        admin_stats.completed,
        admin_stats.sq_doorbells,
        admin_stats.cq_doorbells,
        admin_stats.sleeps
    );
    println!(
        "shutdown: complete, {} ms after start",
        start.elapsed().as_millis()
    );
    Ok(())
}

/// Identify, I/O queue pair, writes, reads, queue deletion.
fn session(
    args: &Args,
    runtime: &Runtime,
    controller: &Controller,
    admin: &mut Admin,
    pool: &Arc<Pool>,
    timeout: Duration,
) -> Result<(), Error> {
    let bdf = args.bdf;
    let nsid = args.nsid;
    let ctl_error = |source| Error::Controller {
        bdf,
        source: Box::new(source),
    };
    let io_error = |source| Error::Io {
        bdf,
        nsid,
        source: Box::new(source),
    };

    let id = admin.identify_controller(pool).map_err(ctl_error)?;
    let min_page = controller.cap().min_page();
    let max_transfer = id.max_transfer(min_page);
    println!(
        "controller: model {:?}, serial {:?}, firmware {:?}, vendor {:#06x}, MDTS {} ({}), {} namespaces",
        id.model,
        id.serial,
        id.firmware,
        id.vendor,
        id.mdts,
        max_transfer.map_or("no limit".to_owned(), |b| format!("max transfer {} KiB", b >> 10)),
        id.namespaces
    );
    let ns = admin.identify_namespace(pool, nsid).map_err(ctl_error)?;
    println!(
        "namespace {nsid}: {} blocks of {} bytes ({} KiB), LBA format {}, {} metadata bytes",
        ns.blocks,
        ns.lba_size,
        (ns.blocks * u64::from(ns.lba_size)) >> 10,
        ns.format,
        ns.metadata
    );
    let end = args.lba.checked_add(args.blocks);
    if end.is_none_or(|end| end > ns.blocks) {
        return Err(Error::Argument(format!(
            "LBAs {}..{} are not inside namespace {nsid}, which has {} blocks: use a smaller --lba or --blocks",
            args.lba,
            args.lba.saturating_add(args.blocks),
            ns.blocks
        )));
    }
    let (sqs, cqs) = admin.set_queue_count().map_err(ctl_error)?;
    println!("I/O queues granted: {sqs} submission, {cqs} completion");

    let depth = floor_pow2(args.queue_depth.min(controller.cap().max_queue_entries()));
    let queue = controller
        .open_queue(runtime, IO_QID, depth)
        .map_err(ctl_error)?;
    admin
        .create_io_queues(&queue, IO_VECTOR)
        .map_err(ctl_error)?;
    println!("I/O queue pair {IO_QID}: {depth} entries, MSI-X vector {IO_VECTOR}");

    let mut io = Io {
        queue,
        pool: Arc::clone(pool),
        nsid,
        lba_size: ns.lba_size,
        timeout,
    };
    let max_bytes = max_transfer
        .and_then(|b| usize::try_from(b).ok())
        .map_or(io::MAX_CHUNK, |b| b.min(io::MAX_CHUNK));
    let chunks = prp::plan(args.lba, args.blocks, ns.lba_size, max_bytes);
    let moved = transfer(args, &mut io, &chunks).map_err(io_error);
    // Delete the queues on the controller whatever happened, then drop the ring (nothing is in
    // flight: every command completed, or the failure left it to the queue's Drop, which
    // disables the controller before freeing buffers, as it does when the deletion failed and
    // the controller still serves the queue).
    let deleted = admin.delete_io_queues(IO_QID).map_err(ctl_error);
    let stats = io.queue.stats();
    drop(io);
    moved?;
    deleted?;
    println!(
        "I/O queue: {} commands, {} SQ doorbells, {} CQ doorbells, {} sleeps on MSI-X, {} times full",
        stats.completed, stats.sq_doorbells, stats.cq_doorbells, stats.sleeps, stats.full
    );
    Ok(())
}

/// The writes (unless verify-only), the flush, and the reads with their check.
fn transfer(args: &Args, io: &mut Io, chunks: &[prp::Chunk]) -> Result<(), io::Error> {
    if !args.verify_only {
        let report = io.run(Direction::Write, args.seed, chunks)?;
        print_report("write", &report);
        io.flush_cache()?;
        println!("flush: done");
    }
    let report = io.run(Direction::Read, args.seed, chunks)?;
    print_report("read", &report);
    println!(
        "verified {} blocks at LBA {}..{} against seed {}",
        report.blocks,
        args.lba,
        args.lba + args.blocks,
        args.seed
    );
    Ok(())
}

fn print_report(what: &str, report: &Report) {
    println!(
        "{what}: {} blocks ({} KiB) in {} commands ({} with a PRP list, {} starting inside a page), {:.1} ms: {:.2} MiB/s, {:.0} IOPS",
        report.blocks,
        report.bytes >> 10,
        report.commands,
        report.prp_lists,
        report.in_page,
        report.elapsed.as_secs_f64() * 1e3,
        report.mib_per_s(),
        report.iops()
    );
}

#[cfg(test)]
mod tests;
