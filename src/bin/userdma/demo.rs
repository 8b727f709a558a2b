//! `userdma demo transfers [--size 64K] [--count N] [--batch B] [--queues Q] [--cost npu|zero]
//! [--process]`: the transfer demo on the software loopback device.
//!
//! Opens a loopback device, maps one memfd region into its DMA space and builds a buffer pool
//! over it, then runs `--count` transfers split over `--queues` queues (one host thread and one
//! device context each). Every transfer is three descriptors — host to device, a compute pass
//! in device memory (`(w ^ 0x5a5a5a5a) + 0x01010101` per 32-bit word), device to host — and
//! every byte that comes back is checked against the same transform computed on the host. A
//! batch of `--batch` transfers goes out with one doorbell per queue. It prints the throughput,
//! the latency of a transfer (from its batch's doorbell to its last completion) at p50, p99 and
//! p99.9, and the device's counters.
//!
//! `--cost npu` (default) runs the device's small-NPU cost model; `--cost zero` runs it as fast
//! as the host can. `--process` runs the device engine in a child process (this binary's hidden
//! `loopback-device` subcommand) that reaches host memory only through the shared mappings.
//!
//! JSON (`--json`): `{"config": {"size", "count", "batch", "queues", "cost", "process"},
//! "transfers", "bytes", "seconds", "bytes_per_sec", "transfers_per_sec", "latency_ns": {"p50",
//! "p99", "p999", "max"}, "device": {"descriptors", "bytes", "context_switches", "errors",
//! "busy_ns", "interrupts", "modelled_ns", "queues": [{"completed", "errors", "sram_hits",
//! "sram_touched"}], "units": [...]}, "pool": {"arena_bytes",
//! "high_water_bytes"}}`. Exit code 1 if any byte differs or any descriptor fails.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use userdma::device::loopback::{self, Code, Cost, Descriptor, Mode, Program, Wait};
use userdma::memory::{self, PageSize};
use userdma::pool::{self, OwnedBuffer, Pool};
use userdma::{ring, Runtime};

use crate::exit;

/// The compute pass every transfer goes through.
const XOR: u32 = 0x5a5a_5a5a;
const ADD: u32 = 0x0101_0101;
/// How long any single wait may take before the demo gives up.
const TIMEOUT: Option<Duration> = Some(Duration::from_secs(30));

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

    /// Transfers per doorbell (each queue keeps one batch in flight).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=16))]
    batch: u32,

    /// Queues, each driven by its own thread in its own device context.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=8))]
    queues: u16,

    /// The device's cost model.
    #[arg(long, value_enum, default_value = "npu")]
    cost: CostModel,

    /// Run the device engine in a child process.
    #[arg(long)]
    process: bool,

    /// Pin the device engine to this CPU (one the process may use; `taskset -p <pid>`).
    #[arg(long, value_name = "CPU")]
    engine_cpu: Option<u32>,
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

/// Why `userdma demo transfers` failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DemoError {
    /// Starting or driving the loopback device, its memory or its pool failed.
    #[error("the loopback device failed")]
    Runtime(#[from] userdma::Error),
    /// A queue operation failed.
    #[error("queue {queue} failed")]
    Ring {
        /// The queue.
        queue: u16,
        /// The cause.
        #[source]
        source: ring::Error,
    },
    /// A descriptor completed with an error status.
    #[error("transfer {transfer} on queue {queue}: the device completed a descriptor with status {code} ({})", code_name(*.code))]
    Failed {
        /// The queue.
        queue: u16,
        /// The transfer's number.
        transfer: u64,
        /// The status code.
        code: u16,
    },
    /// Data came back different from what was sent through the transform.
    #[error("transfer {transfer} on queue {queue}: byte {offset} came back wrong")]
    Corrupted {
        /// The queue.
        queue: u16,
        /// The transfer's number.
        transfer: u64,
        /// The first wrong byte.
        offset: usize,
    },
    /// Finding this executable (for `--process`) failed.
    #[error("cannot find this executable to run the device process")]
    Executable(#[source] io::Error),
    /// A host thread panicked.
    #[error("a host thread panicked")]
    Thread,
    /// Writing the output failed.
    #[error("cannot write the output")]
    Output(#[source] io::Error),
    /// Encoding JSON failed.
    #[error("cannot encode the output as JSON")]
    Json(#[source] serde_json::Error),
}

impl From<pool::Error> for DemoError {
    fn from(err: pool::Error) -> DemoError {
        DemoError::Runtime(err.into())
    }
}

impl From<userdma::device::Error> for DemoError {
    fn from(err: userdma::device::Error) -> DemoError {
        DemoError::Runtime(err.into())
    }
}

impl DemoError {
    /// The documented exit code for this failure.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            DemoError::Runtime(userdma::Error::Memory(memory::Error::Lock { .. })) => exit::REFUSED,
            _ => exit::FAILURE,
        }
    }
}

/// A status code's name.
fn code_name(code: u16) -> String {
    Code::from_raw(code).map_or_else(|| "unknown".to_owned(), |c| format!("{c:?}"))
}

/// Latency percentiles, in nanoseconds.
#[derive(Debug, Default, Serialize)]
struct Latency {
    p50: u64,
    p99: u64,
    p999: u64,
    max: u64,
}

impl Latency {
    fn of(mut samples: Vec<u64>) -> Latency {
        samples.sort_unstable();
        let at = |q: f64| {
            let index = ((samples.len() as f64 * q).ceil() as usize).saturating_sub(1);
            samples.get(index).copied().unwrap_or(0)
        };
        Latency {
            p50: at(0.50),
            p99: at(0.99),
            p999: at(0.999),
            max: samples.last().copied().unwrap_or(0),
        }
    }
}

/// Pool figures for the report.
#[derive(Debug, Serialize)]
struct PoolReport {
    arena_bytes: u64,
    high_water_bytes: u64,
}

/// The JSON document.
#[derive(Debug, Serialize)]
struct Report {
    config: DemoArgs,
    transfers: u64,
    bytes: u64,
    seconds: f64,
    bytes_per_sec: f64,
    transfers_per_sec: f64,
    latency_ns: Latency,
    device: loopback::Counters,
    pool: PoolReport,
}

/// What rides with each descriptor.
enum Payload {
    /// The source buffer (host to device), held until the device has read it.
    Source(#[allow(dead_code)] OwnedBuffer),
    /// Nothing host-side (the compute pass).
    Compute,
    /// The destination buffer, the transfer's number, and its batch's doorbell time.
    Destination(OwnedBuffer, u64, Instant),
}

/// Deterministic input bytes of transfer `n`.
fn input(n: u64, bytes: &mut [u8]) {
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in bytes.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// The bytes the device must give back for `bytes` (the compute pass).
fn expected(bytes: &mut [u8]) {
    for word in bytes.chunks_exact_mut(4) {
        let w = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        word.copy_from_slice(&(w ^ XOR).wrapping_add(ADD).to_le_bytes());
    }
}

/// Drives queue `q`: transfers `first, first + stride, ...` below `count`, one batch in flight.
/// Returns the latencies of its transfers.
fn drive(
    runtime: &Runtime,
    pool: &Arc<Pool>,
    args: &DemoArgs,
    q: u16,
) -> Result<Vec<u64>, DemoError> {
    let context = u32::from(q) + 1;
    let ring_error = |source| DemoError::Ring { queue: q, source };
    let config = ring::Config::new(64).with_id(q).with_context(context);
    let mut queue: loopback::Queue<Payload> = runtime.queue_with(config, Wait::Interrupt)?;
    let size = args.size;
    let batch = args.batch as usize;
    // This queue's slots in device memory: one per transfer of a batch.
    let window = runtime
        .device_memory()?
        .alloc((batch * size) as u64, pool::MIN_ALIGN as u64)?;
    let mut latencies = Vec::new();
    let mut scratch = vec![0u8; size];
    let mut check = vec![0u8; size];
    let mine: Vec<u64> = (u64::from(q)..args.count)
        .step_by(usize::from(args.queues))
        .collect();
    for transfers in mine.chunks(batch) {
        let mut pending = 0usize;
        let mut holding = Vec::with_capacity(transfers.len());
        for (i, &n) in transfers.iter().enumerate() {
            input(n, &mut scratch);
            let source = pool.alloc_owned(size)?;
            source.write(0, &scratch)?;
            let destination = pool.alloc_owned(size)?;
            let slot = window.at((i * size) as u64).expect("inside the window");
            let len = size as u64;
            let to_device = Descriptor::to_device(source.iova(), slot, len).context(context);
            let compute = Descriptor::compute(slot, slot, len, XOR, ADD).context(context);
            let to_host = Descriptor::to_host(slot, destination.iova(), len).context(context);
            holding.push((to_device.build(), Payload::Source(source)));
            holding.push((compute.build(), Payload::Compute));
            holding.push((
                to_host.build(),
                Payload::Destination(destination, n, Instant::now()),
            ));
        }
        // The clock starts at the doorbell, once the batch is written.
        let rung = Instant::now();
        for (descriptor, payload) in holding {
            let payload = match payload {
                Payload::Destination(buffer, n, _) => Payload::Destination(buffer, n, rung),
                other => other,
            };
            queue
                .push_wait(descriptor, payload, TIMEOUT)
                .map_err(|rejected| ring_error(rejected.error))?;
            pending += 1;
        }
        queue.flush().map_err(ring_error)?;
        while pending > 0 {
            let done = queue.wait(TIMEOUT).map_err(ring_error)?;
            pending -= 1;
            if !done.entry.is_success() {
                let transfer = match &done.payload {
                    Payload::Destination(_, n, _) => *n,
                    _ => transfers[0],
                };
                return Err(DemoError::Failed {
                    queue: q,
                    transfer,
                    code: done.entry.code(),
                });
            }
            if let Payload::Destination(buffer, n, rung) = done.payload {
                latencies.push(u64::try_from(rung.elapsed().as_nanos()).unwrap_or(u64::MAX));
                buffer.read(0, &mut check)?;
                input(n, &mut scratch);
                expected(&mut scratch);
                if let Some(offset) = check.iter().zip(&scratch).position(|(a, b)| a != b) {
                    return Err(DemoError::Corrupted {
                        queue: q,
                        transfer: n,
                        offset,
                    });
                }
            }
        }
    }
    Ok(latencies)
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
    let in_flight = usize::from(args.queues) * args.batch as usize * args.size;
    let config = loopback::Config::default()
        .name("demo0")
        .queues(args.queues)
        .cost(cost)
        .memory_size(in_flight)
        .mode(mode);
    let config = match args.engine_cpu {
        Some(cpu) => config.engine_cpu(cpu),
        None => config,
    };
    let runtime = Runtime::loopback(config)?;
    // Two buffers per transfer in flight, rounded up to their size class, plus room for the
    // pool's alignment and slabs.
    let class = args.size.next_power_of_two().max(pool::MIN_ALIGN);
    let host_len = (2 * usize::from(args.queues) * args.batch as usize * class + (8 << 20))
        .next_multiple_of(2 << 20);
    let pool = runtime.pool_with(host_len, PageSize::Base, pool::Config::default())?;

    let start = Instant::now();
    let threads: Vec<_> = (0..args.queues)
        .map(|q| {
            let (runtime, pool, args) = (runtime.clone(), Arc::clone(&pool), args.clone());
            std::thread::spawn(move || drive(&runtime, &pool, &args, q))
        })
        .collect();
    let results: Vec<Result<Vec<u64>, DemoError>> = threads
        .into_iter()
        .map(|thread| thread.join().unwrap_or(Err(DemoError::Thread)))
        .collect();
    let seconds = start.elapsed().as_secs_f64();
    let mut latencies = Vec::new();
    for result in results {
        latencies.extend(result?);
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
    let transfers = latencies.len() as u64;
    let bytes = transfers * args.size as u64;
    let report = Report {
        config: args.clone(),
        transfers,
        bytes,
        seconds,
        bytes_per_sec: bytes as f64 / seconds,
        transfers_per_sec: transfers as f64 / seconds,
        latency_ns: Latency::of(latencies),
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
/// that started this one (see `userdma::device::loopback::serve_process`).
pub(crate) fn serve_device() -> Result<(), DemoError> {
    Ok(loopback::serve_process()?)
}

/// Microseconds, for humans.
fn micros(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1000.0)
}

/// The text report.
fn render(r: &Report) -> String {
    let mut text = String::new();
    let c = &r.config;
    let _ = writeln!(
        text,
        "loopback demo: {} transfers of {} bytes (to device, compute, to host) on {} queues, \
         batches of {}, {} cost model{}",
        r.transfers,
        c.size,
        c.queues,
        c.batch,
        match c.cost {
            CostModel::Npu => "npu",
            CostModel::Zero => "zero",
        },
        if c.process {
            ", device in a child process"
        } else {
            ""
        }
    );
    let _ = writeln!(
        text,
        "verified:   every byte of {} transfers ({} bytes)",
        r.transfers, r.bytes
    );
    let _ = writeln!(
        text,
        "throughput: {:.2} GB/s, {:.0} transfers/s in {:.3} s",
        r.bytes_per_sec / 1e9,
        r.transfers_per_sec,
        r.seconds
    );
    let l = &r.latency_ns;
    let _ = writeln!(
        text,
        "latency:    p50 {}  p99 {}  p99.9 {}  max {}",
        micros(l.p50),
        micros(l.p99),
        micros(l.p999),
        micros(l.max)
    );
    let d = &r.device;
    let _ = writeln!(
        text,
        "device:     {} descriptors, {} bytes, {} context switches, {} errors, busy {:.3} s \
         (modelled {:.3} s), {} interrupts",
        d.descriptors,
        d.bytes,
        d.context_switches,
        d.errors,
        d.busy_ns as f64 / 1e9,
        d.modelled_ns as f64 / 1e9,
        d.interrupts
    );
    for (q, queue) in d.queues.iter().enumerate() {
        let _ = writeln!(
            text,
            "  queue {q}:  {} descriptors, {} errors",
            queue.completed, queue.errors
        );
    }
    let _ = writeln!(
        text,
        "pool:       {} bytes of arena, high water {} bytes",
        r.pool.arena_bytes, r.pool.high_water_bytes
    );
    text
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: DemoArgs,
    }

    #[test]
    fn arguments_parse_with_defaults() {
        let args = Cli::try_parse_from(["demo"]).unwrap().args;
        assert_eq!(
            (args.size, args.count, args.batch, args.queues, args.cost),
            (64 << 10, 2048, 8, 2, CostModel::Npu)
        );
        let args = Cli::try_parse_from(["demo", "--size", "1M", "--cost", "zero", "--process"])
            .unwrap()
            .args;
        assert_eq!(
            (args.size, args.cost, args.process),
            (1 << 20, CostModel::Zero, true)
        );
        for bad in ["3", "2M", "0", "x"] {
            assert!(
                Cli::try_parse_from(["demo", "--size", bad]).is_err(),
                "{bad}"
            );
        }
        assert!(Cli::try_parse_from(["demo", "--batch", "0"]).is_err());
        assert!(Cli::try_parse_from(["demo", "--queues", "9"]).is_err());
    }

    #[test]
    fn percentiles() {
        let latency = Latency::of((1..=1000).rev().collect());
        assert_eq!(
            (latency.p50, latency.p99, latency.p999, latency.max),
            (500, 990, 999, 1000)
        );
        assert_eq!(Latency::of(Vec::new()).max, 0);
    }

    #[test]
    fn a_small_run_verifies_every_byte() {
        let args = Cli::try_parse_from(["demo", "--size", "4K", "--count", "64", "--cost", "zero"])
            .unwrap()
            .args;
        run(&args, true).unwrap();
    }

    /// The lowest CPU this thread may run on.
    fn first_allowed_cpu() -> usize {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it in; CPU_ISSET
        // reads bits inside it (below CPU_SETSIZE).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                0
            );
            (0..libc::CPU_SETSIZE as usize)
                .find(|&cpu| libc::CPU_ISSET(cpu, &set))
                .expect("a CPU to run on")
        }
    }

    #[test]
    fn the_engine_can_be_pinned_and_a_bad_cpu_is_refused() {
        let demo = |cpu: &str| {
            let argv = [
                "demo",
                "--size",
                "4K",
                "--count",
                "16",
                "--cost",
                "zero",
                "--engine-cpu",
                cpu,
            ];
            let args = Cli::try_parse_from(argv).unwrap().args;
            run(&args, true)
        };
        demo(&first_allowed_cpu().to_string()).unwrap();
        // What `userdma` prints for it.
        let text = crate::exit::Failure::from(demo("4096").unwrap_err()).chain();
        assert!(
            text.contains("engine_cpu") && text.contains("taskset"),
            "{text}"
        );
        assert!(Cli::try_parse_from(["demo", "--engine-cpu", "x"]).is_err());
    }
}
