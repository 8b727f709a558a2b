//! `userdma demo transfers [--size 64K] [--count N] [--batch B] [--depth D] [--queues Q]
//! [--cost npu|zero] [--process] [--engine-cpu CPU | --no-pin]`: the transfer demo on the
//! software loopback device.
//!
//! Opens a loopback device, maps one memfd region into its DMA space and builds a buffer pool
//! over it, then runs `--count` transfers split over `--queues` queues (one host thread and one
//! device context each). Every transfer is three descriptors — host to device, a compute pass
//! in device memory (`(w ^ 0x5a5a5a5a) + 0x01010101` per 32-bit word, the device's
//! vectorised kernel), device to host — and every byte that comes back is checked against the
//! same transform computed on the host (while the device works). A batch of `--batch`
//! transfers goes out with one doorbell, and each queue keeps `--depth` batches in flight (2:
//! the next is written while the host checks the last). It prints the throughput, the latency
//! of a transfer (from its batch's doorbell to its last completion) at p50, p99 and p99.9, the
//! device's counters, and the device's measured busy time against its modelled time.
//!
//! **Modelled against measured.** The engine holds each completion until its modelled time has
//! passed, so busy time matches modelled time when the engine's own work at host speed is
//! shorter and its thread runs when its waits end. The demo prints both, their ratio, and, when
//! they are more than 5 % apart, why: `host` if the engine's work (one transfer's copies and
//! compute timed on host buffers in the same run) is longer than the modelled time, `late` if it
//! is shorter and the engine thread ran late. By default the engine has a CPU of its own (the
//! last one the process may use, or `--engine-cpu`) and the host threads run on the others: on a
//! two-CPU machine, two host threads checking every byte beside an unpinned engine keep it from
//! its CPU past its modelled waits. Runs of the defaults on a two-CPU machine: `--no-pin`, busy
//! 1.3–3.7× modelled; pinned, 1.00–1.01 while no other process ran, more (reported as `late`)
//! while another process's build shared the engine's CPU.
//!
//! `--cost npu` (default) runs the device's small-NPU cost model; `--cost zero` runs it as fast
//! as the host can. `--process` runs the device engine in a child process (this binary's hidden
//! `loopback-device` subcommand) that reaches host memory only through the shared mappings.
//!
//! JSON (`--json`): `{"config": {"size", "count", "batch", "depth", "queues", "cost",
//! "process", "engine_cpu", "no_pin"}, "transfers", "bytes", "seconds", "bytes_per_sec",
//! "transfers_per_sec", "latency_ns": {"p50", "p99", "p999", "max"}, "device": {"descriptors",
//! "bytes", "context_switches", "errors", "busy_ns", "interrupts", "modelled_ns", "queues":
//! [{"completed", "errors", "sram_hits", "sram_touched"}], "units": [...]}, "timing":
//! {"busy_ns", "modelled_ns", "ratio", "within_5_percent", "bound" (model, host, late or
//! unmodelled), "engine_work_ns_per_transfer", "modelled_ns_per_transfer", "placement":
//! {"engine_cpu", "host_cpus"}, "cpus", "load_average", "units": [{"unit", "busy_ns",
//! "modelled_ns", "ratio"}]}, "pool": {"arena_bytes", "high_water_bytes"}}`. Exit code 1 if
//! any byte differs or any descriptor fails.

mod driver;
mod error;
mod placement;
mod report;
mod timing;

use std::io::{self, Write};
use std::sync::Arc;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::Serialize;
use userdma::memory::PageSize;
use userdma::pool;
use userdma::Runtime;
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime, Mode, Program};

use driver::drive;
pub(crate) use error::DemoError;
use placement::Placement;
use report::{histogram, render, Latency, PoolReport, Report};
use timing::{engine_work_per_transfer, Timing};

/// The cost models the demo offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CostModel {
    /// A small NPU behind PCIe (12 GB/s DMA, 8 GB/s compute, 1 µs per descriptor, 20 µs per
    /// context switch).
    Npu,
    /// No cost: as fast as the host can.
    Zero,
}

/// Arguments of `userdma demo transfers`.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub(crate) struct DemoArgs {
    /// Bytes per transfer (a multiple of 4; K and M suffixes), at most 1M.
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    size: usize,

    /// Transfers in total.
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,

    /// Transfers per doorbell.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=16))]
    batch: u32,

    /// Batches each queue keeps in flight: the next goes out while the host checks the last.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=4))]
    depth: u32,

    /// Queues, each driven by its own thread in its own device context.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=8))]
    queues: u16,

    /// The device's cost model.
    #[arg(long, value_enum, default_value = "npu")]
    cost: CostModel,

    /// Run the device engine in a child process.
    #[arg(long)]
    process: bool,

    /// Pin the device engine to this CPU (one the process may use; `taskset -p <pid>`), and
    /// the host threads to the others. Default: the last CPU the process may use, if it may
    /// use more than one.
    #[arg(long, value_name = "CPU", conflicts_with = "no_pin")]
    engine_cpu: Option<u32>,

    /// Pin nothing: the engine and the host threads share every CPU (a host thread then
    /// delays the engine past its modelled time whenever the CPUs are all busy).
    #[arg(long)]
    no_pin: bool,
}

/// Parses `4096`, `64K`, `1M` (binary multiples), a multiple of 4 from 4 bytes to 1 MiB.
fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let (digits, scale) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1 << 10),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1 << 20),
        _ => (t, 1),
    };
    let value: usize = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size: use e.g. 4096, 64K, 1M"))?;
    let bytes = value
        .checked_mul(scale)
        .filter(|&b| (4..=1 << 20).contains(&b) && b % 4 == 0)
        .ok_or_else(|| format!("{text:?}: the size must be a multiple of 4 from 4 to 1M"))?;
    Ok(bytes)
}

/// Runs `userdma demo transfers`.
pub(crate) fn run(args: &DemoArgs, json: bool) -> Result<(), DemoError> {
    let mode = if args.process {
        Mode::Process(Program::current_exe().map_err(DemoError::Executable)?)
    } else {
        Mode::Thread
    };
    let cost = match args.cost {
        CostModel::Npu => Cost::npu(),
        CostModel::Zero => Cost::zero(),
    };
    let in_flight =
        usize::from(args.queues) * args.depth as usize * args.batch as usize * args.size;
    let config = loopback::Config::default()
        .name("demo0")
        .queues(args.queues)
        .cost(cost)
        .memory_size(in_flight)
        .mode(mode);
    let placement = Placement::of(args)?;
    let config = match placement.engine_cpu {
        Some(cpu) => config.engine_cpu(cpu),
        None => config,
    };
    let runtime = Runtime::loopback(config)?;
    // Two buffers per transfer in flight, rounded up to their size class, plus room for the
    // pool's alignment and slabs.
    let class = args.size.next_power_of_two().max(pool::MIN_ALIGN);
    let host_len =
        (2 * usize::from(args.queues) * args.depth as usize * args.batch as usize * class
            + (8 << 20))
            .next_multiple_of(2 << 20);
    let pool = runtime.pool_with(host_len, PageSize::Base, pool::Config::default())?;
    let engine_work = engine_work_per_transfer(args.size)?;

    let start = Instant::now();
    let threads: Vec<_> = (0..args.queues)
        .map(|q| {
            let (runtime, pool, args) = (runtime.clone(), Arc::clone(&pool), args.clone());
            let placement = placement.clone();
            std::thread::spawn(move || {
                placement.pin_host_thread()?;
                drive(&runtime, &pool, &args, q)
            })
        })
        .collect();
    let results: Vec<Result<Histogram<u64>, DemoError>> = threads
        .into_iter()
        .map(|thread| thread.join().unwrap_or(Err(DemoError::Thread)))
        .collect();
    let seconds = start.elapsed().as_secs_f64();
    let mut latencies = histogram();
    for result in results {
        let _ = latencies.add(result?);
    }
    let device = runtime.loopback_device().expect("a loopback runtime");
    let counters = device.counters()?;
    let stats = pool.stats();
    let high_water_bytes = stats
        .classes
        .iter()
        .map(|c| c.high_water * c.size)
        .sum::<u64>()
        + stats.large.high_water_bytes;
    let transfers = latencies.len();
    let bytes = transfers * args.size as u64;
    let report = Report {
        config: args.clone(),
        transfers,
        bytes,
        seconds,
        bytes_per_sec: bytes as f64 / seconds,
        transfers_per_sec: transfers as f64 / seconds,
        latency_ns: Latency::of(&latencies),
        timing: Timing::of(&counters, transfers, engine_work, placement),
        device: counters,
        pool: PoolReport {
            arena_bytes: stats.arena_bytes,
            high_water_bytes,
        },
    };
    let text = if json {
        let mut text = serde_json::to_string_pretty(&report).map_err(DemoError::Json)?;
        text.push('\n');
        text
    } else {
        render(&report)
    };
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(DemoError::Output)
}

/// The hidden `loopback-device` subcommand: serve a loopback device for the parent process
/// that started this one (see `userdma_loopback::serve_process`).
pub(crate) fn serve_device() -> Result<(), DemoError> {
    Ok(loopback::serve_process()?)
}

#[cfg(test)]
mod tests;
