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

use std::fmt::Write as _;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use userdma::device::Range;
use userdma::memory::{self, PageSize};
use userdma::pool::{self, OwnedBuffer, Pool};
use userdma::{ring, Runtime};
use userdma_loopback::{self as loopback, Cost, Descriptor, Mode, Program, StatusCode, Wait};

use crate::exit;
use userdma_loopback::LoopbackRuntime as _;

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
    /// The host's reference computation refused a transfer (its size is not a positive
    /// multiple of 4 bytes).
    #[error("cannot compute the expected bytes of a transfer on the host")]
    Reference(#[source] loopback::reference::Error),
    /// Reading or setting a thread's CPU affinity failed.
    #[error(
        "cannot restrict the host threads to CPUs {cpus:?}, away from the engine's: check \
         the CPUs this process may use (`taskset -p <pid>`), or pass --no-pin"
    )]
    Affinity {
        /// The CPUs asked for (empty: reading the allowed set failed).
        cpus: Vec<usize>,
        /// The cause.
        #[source]
        source: io::Error,
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
    StatusCode::from_raw(code).map_or_else(|| "unknown".to_owned(), |c| format!("{c:?}"))
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
    fn of(h: &Histogram<u64>) -> Latency {
        Latency {
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// A histogram of latencies in ns (1 ns to an hour, three significant digits): a fixed size
/// whatever `--count` is.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

/// Pool figures for the report.
#[derive(Debug, Serialize)]
struct PoolReport {
    arena_bytes: u64,
    high_water_bytes: u64,
}

/// How far measured busy time may be from modelled before the demo says so.
const TOLERANCE: f64 = 0.05;

/// What bound the device's busy time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Bound {
    /// Busy within 5 % of modelled: the modelled device held.
    Model,
    /// The engine's own work at host speed is longer than the modelled time: the host
    /// cannot run the model this fast.
    Host,
    /// The engine's own work fits in the modelled time, yet busy is longer: the engine thread
    /// was not running when its modelled waits ended (the host's CPUs were busy).
    Late,
    /// The zero-cost model charges nothing: busy is the host's work.
    Unmodelled,
}

/// Measured against modelled busy time, for the device and for each unit that worked.
#[derive(Debug, Serialize)]
struct Timing {
    busy_ns: u64,
    modelled_ns: u64,
    /// `busy_ns / modelled_ns` (absent under the zero-cost model).
    ratio: Option<f64>,
    /// The ratio is within 5 % of 1.
    within_5_percent: bool,
    bound: Bound,
    /// The engine's own work per transfer at host speed (copy in, compute, copy out timed
    /// on host buffers in this run), and the modelled time per transfer.
    engine_work_ns_per_transfer: u64,
    modelled_ns_per_transfer: u64,
    /// Where the engine and the host threads ran.
    placement: Placement,
    /// The host's CPUs, and its one-minute load average at the end of the run (if known).
    cpus: usize,
    load_average: Option<f64>,
    units: Vec<UnitTiming>,
}

/// One unit's busy and modelled time.
#[derive(Debug, Serialize)]
struct UnitTiming {
    unit: &'static str,
    busy_ns: u64,
    modelled_ns: u64,
    ratio: Option<f64>,
}

/// `busy / modelled`, if anything was modelled.
fn ratio(busy_ns: u64, modelled_ns: u64) -> Option<f64> {
    (modelled_ns > 0).then(|| busy_ns as f64 / modelled_ns as f64)
}

impl Timing {
    fn of(
        device: &loopback::Counters,
        transfers: u64,
        engine_work_ns_per_transfer: u64,
        placement: Placement,
    ) -> Timing {
        let ratio_all = ratio(device.busy_ns, device.modelled_ns);
        let within = ratio_all.is_some_and(|r| (r - 1.0).abs() <= TOLERANCE);
        let modelled_ns_per_transfer = device.modelled_ns / transfers.max(1);
        let bound = match ratio_all {
            None => Bound::Unmodelled,
            Some(_) if within => Bound::Model,
            Some(_) if engine_work_ns_per_transfer > modelled_ns_per_transfer => Bound::Host,
            Some(_) => Bound::Late,
        };
        let units = [loopback::Unit::Copy, loopback::Unit::Compute]
            .into_iter()
            .map(|unit| (unit, &device.units[unit as usize]))
            .filter(|(_, c)| c.descriptors > 0)
            .map(|(unit, c)| UnitTiming {
                unit: match unit {
                    loopback::Unit::Copy => "copy",
                    loopback::Unit::Compute => "compute",
                },
                busy_ns: c.busy_ns,
                modelled_ns: c.modelled_ns,
                ratio: ratio(c.busy_ns, c.modelled_ns),
            })
            .collect();
        Timing {
            busy_ns: device.busy_ns,
            modelled_ns: device.modelled_ns,
            ratio: ratio_all,
            within_5_percent: within,
            bound,
            engine_work_ns_per_transfer,
            modelled_ns_per_transfer,
            placement,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            load_average: load_average(),
            units,
        }
    }

    /// The verdict, for humans.
    fn verdict(&self) -> String {
        let work = micros(self.engine_work_ns_per_transfer);
        let modelled = micros(self.modelled_ns_per_transfer);
        let load = self
            .load_average
            .map_or_else(String::new, |l| format!(", load average {l:.1}"));
        match self.bound {
            Bound::Model => "within 5 %: the device ran as modelled".to_owned(),
            Bound::Host => format!(
                "MORE than 5 % apart: the host is the bound (the engine's own work, {work} a \
                 transfer on host buffers, exceeds the modelled {modelled}); try larger \
                 --size or a slower cost model"
            ),
            Bound::Late => format!(
                "MORE than 5 % apart, not for the engine's work ({work} a transfer on host \
                 buffers fits in the modelled {modelled}): its thread was not running when \
                 modelled waits ended, the host's {} CPUs being busy ({}{load}); {}",
                self.cpus,
                if self.placement.engine_cpu.is_some() {
                    "other processes on the engine's CPU"
                } else {
                    "the engine shares them with this demo's host threads"
                },
                if self.placement.engine_cpu.is_some() {
                    "run it on an idle machine or another --engine-cpu"
                } else {
                    "leave the engine a CPU of its own (no --no-pin)"
                },
            ),
            Bound::Unmodelled => {
                "nothing modelled (zero-cost model): busy is the engine's work at host speed"
                    .to_owned()
            }
        }
    }
}

/// The one-minute load average, from `/proc/loadavg` (none if unreadable).
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
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
    timing: Timing,
    pool: PoolReport,
}

/// What rides with each descriptor, with the number of its transfer.
enum Payload {
    /// The source buffer (host to device), held until the device has read it.
    Source(#[allow(dead_code)] OwnedBuffer, u64),
    /// Nothing host-side (the compute pass).
    Compute(u64),
    /// The destination buffer, the transfer's slot, and its batch's doorbell time.
    Destination(OwnedBuffer, u64, usize, Instant),
}

impl Payload {
    /// The transfer the descriptor belongs to.
    fn transfer(&self) -> u64 {
        match *self {
            Payload::Source(_, n) | Payload::Compute(n) | Payload::Destination(_, n, _, _) => n,
        }
    }
}

/// The input of the layer kernel that makes the demo's data (any constant will do; 4 KiB, so
/// the kernel's runs between wraps of it are long).
static PATTERN: [u8; 4096] = [0; 4096];

/// Deterministic input bytes of transfer `n` (`bytes` a positive multiple of 4 long): word `j`
/// is the layer mixing function of `n` and `j` ([`loopback::reference::mix`]), different for
/// every transfer and every word, made by the host's vectorised layer kernel.
fn input(n: u64, bytes: &mut [u8]) -> Result<(), DemoError> {
    // Transfers 2^32 apart share a pattern: far beyond any run's count.
    let seed = n as u32 ^ (n >> 32) as u32;
    loopback::reference::layer(seed, &[&PATTERN[..]], bytes)
        .map(drop)
        .map_err(DemoError::Reference)
}

/// Into `out`, the bytes the device must give back for `input` (the compute pass), by the
/// host's reference of the device's kernel.
fn expected(input: &[u8], out: &mut [u8]) -> Result<(), DemoError> {
    loopback::reference::compute(XOR, ADD, input, out)
        .map(drop)
        .map_err(DemoError::Reference)
}

/// One queue's host side: its ring, its slots of device memory (one per transfer in flight,
/// `depth` groups of `batch`), and the bytes each slot's transfer must come back as.
struct Driver<'a> {
    q: u16,
    context: u32,
    size: usize,
    batch: usize,
    depth: usize,
    pool: &'a Arc<Pool>,
    queue: loopback::Queue<Payload>,
    window: Range,
    scratch: Vec<u8>,
    /// Per slot: what its transfer must come back as (computed while the device works).
    want: Vec<Vec<u8>>,
}

impl Driver<'_> {
    fn ring_error(&self, source: ring::Error) -> DemoError {
        DemoError::Ring {
            queue: self.q,
            source,
        }
    }

    /// Writes batch number `b` (transfers `transfers`) into the ring, in slot group
    /// `b % depth` (free: the batch that used it last has completed), and rings the doorbell
    /// once. Returns its descriptor count.
    fn submit(&mut self, b: usize, transfers: &[u64]) -> Result<usize, DemoError> {
        let (size, context) = (self.size, self.context);
        let group = (b % self.depth) * self.batch;
        let mut holding = Vec::with_capacity(3 * transfers.len());
        for (i, &n) in transfers.iter().enumerate() {
            let slot = group + i;
            input(n, &mut self.scratch)?;
            let source = self.pool.alloc_owned(size)?;
            source.write(0, &self.scratch)?;
            expected(&self.scratch, &mut self.want[slot])?;
            let destination = self.pool.alloc_owned(size)?;
            let at = self
                .window
                .at((slot * size) as u64)
                .expect("inside the window");
            let len = size as u64;
            let to_device = Descriptor::to_device(source.iova(), at, len).context(context);
            let compute = Descriptor::compute(at, at, len, XOR, ADD).context(context);
            let to_host = Descriptor::to_host(at, destination.iova(), len).context(context);
            holding.push((to_device.build(), Payload::Source(source, n)));
            holding.push((compute.build(), Payload::Compute(n)));
            let done = Payload::Destination(destination, n, slot, Instant::now());
            holding.push((to_host.build(), done));
        }
        // The clock starts at the doorbell, once the batch is written.
        let rung = Instant::now();
        let descriptors = holding.len();
        for (descriptor, payload) in holding {
            let payload = match payload {
                Payload::Destination(buffer, n, slot, _) => {
                    Payload::Destination(buffer, n, slot, rung)
                }
                other => other,
            };
            self.queue
                .push_wait(descriptor, payload, TIMEOUT)
                .map_err(|rejected| self.ring_error(rejected.error))?;
        }
        self.queue.flush().map_err(|e| self.ring_error(e))?;
        Ok(descriptors)
    }

    /// Takes the next completion; for a transfer's last descriptor, checks every byte that
    /// came back and returns its latency.
    fn complete(&mut self, check: &mut [u8]) -> Result<Option<u64>, DemoError> {
        let done = self.queue.wait(TIMEOUT).map_err(|e| self.ring_error(e))?;
        if !done.entry.is_success() {
            return Err(DemoError::Failed {
                queue: self.q,
                transfer: done.payload.transfer(),
                code: done.entry.code(),
            });
        }
        let Payload::Destination(buffer, n, slot, rung) = done.payload else {
            return Ok(None);
        };
        let latency = u64::try_from(rung.elapsed().as_nanos()).unwrap_or(u64::MAX);
        buffer.read(0, check)?;
        let want = &self.want[slot];
        if check != &want[..] {
            let offset = check.iter().zip(want).position(|(a, b)| a != b);
            return Err(DemoError::Corrupted {
                queue: self.q,
                transfer: n,
                offset: offset.unwrap_or(0),
            });
        }
        Ok(Some(latency))
    }
}

/// Drives queue `q`: transfers `first, first + stride, ...` below `count`, `--depth` batches
/// in flight (the next written while the host checks what came back). Returns the latencies
/// of its transfers. Nothing it keeps grows with `--count`.
fn drive(
    runtime: &Runtime,
    pool: &Arc<Pool>,
    args: &DemoArgs,
    q: u16,
) -> Result<Histogram<u64>, DemoError> {
    let context = u32::from(q) + 1;
    let (size, batch, depth) = (args.size, args.batch as usize, args.depth as usize);
    // Room for every descriptor in flight (three a transfer).
    let entries = u32::try_from(3 * batch * depth)
        .unwrap_or(u32::MAX)
        .next_power_of_two()
        .max(64);
    let config = ring::Config::new(entries).with_id(q).with_context(context);
    let window = runtime
        .device_memory()?
        .alloc((depth * batch * size) as u64, pool::MIN_ALIGN as u64)?;
    let mut driver = Driver {
        q,
        context,
        size,
        batch,
        depth,
        pool,
        queue: runtime.queue_with(config, Wait::Interrupt)?,
        window,
        scratch: vec![0u8; size],
        want: vec![vec![0u8; size]; depth * batch],
    };
    let mut check = vec![0u8; size];
    let mut latencies = histogram();
    // This queue's transfers: q, q + queues, ... below count; batch b holds the b-th run of
    // `batch` of them, made when it is submitted.
    let (first, stride) = (u64::from(q), u64::from(args.queues));
    let mine = args.count.saturating_sub(first).div_ceil(stride);
    let batches = mine.div_ceil(batch as u64);
    let mut ids = Vec::with_capacity(batch);
    let mut submit = |driver: &mut Driver<'_>, b: u64| {
        ids.clear();
        let from = b * batch as u64;
        ids.extend((from..mine.min(from + batch as u64)).map(|k| first + k * stride));
        // `b` counts batches of this queue, at most `count`: it fits a usize here (the
        // driver uses it modulo the depth).
        driver.submit(b as usize, &ids)
    };
    // Descriptors still to complete of each batch in flight, oldest first (a queue completes
    // in order).
    let mut open = std::collections::VecDeque::with_capacity(depth);
    let mut next = 0u64;
    while next < batches && open.len() < depth {
        open.push_back(submit(&mut driver, next)?);
        next += 1;
    }
    while let Some(left) = open.front_mut() {
        *left -= 1;
        let last_of_batch = *left == 0;
        if let Some(ns) = driver.complete(&mut check)? {
            let _ = latencies.record(ns.max(1));
        }
        if last_of_batch {
            open.pop_front();
            if next < batches {
                open.push_back(submit(&mut driver, next)?);
                next += 1;
            }
        }
    }
    Ok(latencies)
}

/// The CPUs the calling thread may run on (`sched_getaffinity`), in ascending order.
fn allowed_cpus() -> io::Result<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))?;
    let cpus = (0..nix::sched::CpuSet::count()).filter(|&cpu| set.is_set(cpu).unwrap_or(false));
    Ok(cpus.collect())
}

/// Restricts the calling thread to `cpus` (`sched_setaffinity`; each below `CPU_SETSIZE`).
fn pin_to(cpus: &[usize]) -> io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &cpu in cpus {
        // A CPU past the set's size is EINVAL.
        set.set(cpu)?;
    }
    Ok(nix::sched::sched_setaffinity(
        nix::unistd::Pid::from_raw(0),
        &set,
    )?)
}

/// Where the engine and the host threads run: the engine on a CPU of its own (`--engine-cpu`,
/// or the last allowed one), the host threads on the other allowed CPUs; nothing pinned with
/// `--no-pin` or a single allowed CPU.
#[derive(Debug, Clone, Default, Serialize)]
struct Placement {
    engine_cpu: Option<u32>,
    /// The host threads' CPUs (empty: wherever the scheduler puts them).
    host_cpus: Vec<usize>,
}

impl Placement {
    fn of(args: &DemoArgs) -> Result<Placement, DemoError> {
        if args.no_pin {
            return Ok(Placement::default());
        }
        let allowed = allowed_cpus().map_err(|source| DemoError::Affinity {
            cpus: Vec::new(),
            source,
        })?;
        let engine = match args.engine_cpu {
            Some(cpu) => Some(cpu),
            None if allowed.len() > 1 => allowed.last().and_then(|&c| u32::try_from(c).ok()),
            None => None,
        };
        let host_cpus = match engine {
            Some(cpu) => allowed
                .into_iter()
                .filter(|&c| u32::try_from(c).ok() != Some(cpu))
                .collect(),
            None => Vec::new(),
        };
        Ok(Placement {
            engine_cpu: engine,
            host_cpus,
        })
    }

    /// Pins the calling host thread (nothing if no CPUs are left for it).
    fn pin_host_thread(&self) -> Result<(), DemoError> {
        if self.host_cpus.is_empty() {
            return Ok(());
        }
        pin_to(&self.host_cpus).map_err(|source| DemoError::Affinity {
            cpus: self.host_cpus.clone(),
            source,
        })
    }
}

/// How much of a modelled run the engine's own work at host speed would take: one transfer's
/// device work (a copy in, the compute pass, a copy out, as the engine runs them) timed on
/// host buffers, the median of a few, in nanoseconds. An estimate made in this run, to tell a
/// host that cannot keep up with the model from one that runs the engine late.
fn engine_work_per_transfer(size: usize) -> Result<u64, DemoError> {
    const RUNS: usize = 9;
    let mut source = vec![0u8; size];
    input(1, &mut source)?;
    let (mut slot, mut computed, mut destination) =
        (vec![0u8; size], vec![0u8; size], vec![0u8; size]);
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        slot.copy_from_slice(&source);
        expected(&slot, &mut computed)?;
        destination.copy_from_slice(&computed);
        times.push(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
        std::hint::black_box(&destination);
    }
    times.sort_unstable();
    Ok(times[RUNS / 2])
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
    let t = &r.timing;
    let _ = writeln!(
        text,
        "modelled:   busy {:.3} s against {:.3} s modelled{}: {}",
        t.busy_ns as f64 / 1e9,
        t.modelled_ns as f64 / 1e9,
        t.ratio
            .map_or_else(String::new, |r| format!(", ratio {r:.2}")),
        t.verdict()
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
mod tests;
