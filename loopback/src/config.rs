//! The loopback device's configuration ([`Config`], [`Mode`])
//! and its counters ([`Counters`]).

use std::time::Duration;

use super::cost::Cost;
use super::engine::Settings;
use super::fault::Injection;
use super::process::Program;
use super::regs;
use crate::Error as LoopbackError;
use userdma::device::Error;
use userdma::ring;

/// Where the engine runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Mode {
    /// A thread of this process.
    #[default]
    Thread,
    /// A child process running `Program`, which reaches host memory only through shared
    /// files: every region mapped into the device's DMA space must be a memfd or hugetlbfs file
    /// ([`Region::fd`](userdma::memory::Region::fd)).
    Process(Program),
}

/// The loopback device's configuration, built with chained setters from [`Config::default`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub(super) name: String,
    /// Whether [`Config::name`] set the name; if not, the device takes the lowest
    /// `loopback<N>` no other live device of this process has ([`crate::npu::Number`]).
    pub(super) named: bool,
    pub(super) queues: u16,
    pub(super) memory_size: usize,
    max_depth: u32,
    pub(super) dma_mask_bits: u32,
    cost: Cost,
    max_burst: u32,
    idle_spin: Duration,
    pub(super) engine_cpu: Option<u32>,
    pub(super) mode: Mode,
    pub(super) numa_node: Option<u32>,
    faults: Vec<(u16, Injection)>,
    pub(super) ack_timeout: Duration,
}

impl Default for Config {
    /// `loopback0` (or `loopback1`, ... while devices named so live: the lowest number free in
    /// this process, taken when the device starts): 4 queues, 64 MiB of device memory, depth
    /// up to 4096, a 48-bit DMA mask, the [`Cost::npu`] model, bursts of 32, 50 µs of idle
    /// spinning, a thread on any CPU, memory on no particular NUMA node, 5 s for the device to
    /// acknowledge.
    fn default() -> Config {
        Config {
            name: "loopback0".into(),
            named: false,
            queues: 4,
            memory_size: 64 << 20,
            max_depth: 4096,
            dma_mask_bits: 48,
            cost: Cost::npu(),
            max_burst: 32,
            idle_spin: Duration::from_micros(50),
            engine_cpu: None,
            mode: Mode::Thread,
            numa_node: None,
            faults: Vec::new(),
            ack_timeout: Duration::from_secs(5),
        }
    }
}

impl Config {
    /// The device's name in messages (and its engine thread's name), as given: two devices may
    /// share it. Without it each device takes the lowest `loopback<N>` free in this process.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Config {
        self.name = name.into();
        self.named = true;
        self
    }

    /// Queues (and interrupt vectors), 1 to [`regs::MAX_QUEUES`].
    #[must_use]
    pub fn queues(mut self, queues: u16) -> Config {
        self.queues = queues;
        self
    }

    /// Bytes of device memory (BAR 2), rounded up to whole pages; at least one page.
    #[must_use]
    pub fn memory_size(mut self, bytes: usize) -> Config {
        self.memory_size = bytes;
        self
    }

    /// The largest queue depth the device accepts (a power of two up to
    /// [`ring::MAX_DEPTH`]).
    #[must_use]
    pub fn max_depth(mut self, depth: u32) -> Config {
        self.max_depth = depth;
        self
    }

    /// The device's DMA mask width, 12 to 64 bits.
    #[must_use]
    pub fn dma_mask_bits(mut self, bits: u32) -> Config {
        self.dma_mask_bits = bits;
        self
    }

    /// The cost model.
    #[must_use]
    pub fn cost(mut self, cost: Cost) -> Config {
        self.cost = cost;
        self
    }

    /// How long the host waits for the device to acknowledge its start, a queue's enable, a
    /// reset or a fault programming before it gives up with
    /// [`DeviceError::Timeout`](userdma::device::Error::Timeout) (default 5 s). A short one
    /// stands in for a device that hangs in reset: an engine held up by a
    /// [`Kind::Slow`](super::fault::Kind::Slow) descriptor acknowledges a reset only when the
    /// descriptor is done.
    #[must_use]
    pub fn ack_timeout(mut self, timeout: Duration) -> Config {
        self.ack_timeout = timeout;
        self
    }

    /// Descriptors the engine takes from one queue before looking at the next (at least 1).
    #[must_use]
    pub fn max_burst(mut self, descriptors: u32) -> Config {
        self.max_burst = descriptors;
        self
    }

    /// How long an idle engine spins before it sleeps (lower: fewer cycles burnt; higher:
    /// lower latency after a pause).
    #[must_use]
    pub fn idle_spin(mut self, spin: Duration) -> Config {
        self.idle_spin = spin;
        self
    }

    /// Runs the engine on CPU `cpu` only (both units' threads, or the device process), as a DMA engine
    /// is a piece of hardware of its own: the host's threads then never share its core, and
    /// measurements of it do not move with the scheduler. `cpu` must be one the process may
    /// run on (`taskset -p <pid>` lists them); [`Loopback::new`](super::Loopback::new) fails
    /// with [`LoopbackError::Config`] otherwise. Default: wherever the scheduler puts it.
    #[must_use]
    pub fn engine_cpu(mut self, cpu: u32) -> Config {
        self.engine_cpu = Some(cpu);
        self
    }

    /// Where the engine runs.
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> Config {
        self.mode = mode;
        self
    }

    /// The NUMA node the device sits on, as an NPU on that node would: the device's own memory
    /// (BAR 2, host RAM here) is bound there, and [`Device::numa_node`](userdma::device::Device)
    /// reports it, so a [`Runtime`](userdma::Runtime) places the pools, mappings, host arenas and
    /// queue rings it makes for the device there too. Several loopback devices on different
    /// nodes stand in for a machine with one NPU per node. `None` (the default): no placement.
    /// [`Loopback::new`](super::Loopback::new) fails with
    /// [`memory::Error::NoSuchNode`](userdma::memory::Error::NoSuchNode), naming the online
    /// nodes, for a node that does not exist.
    #[must_use]
    pub fn numa_node(mut self, node: Option<u32>) -> Config {
        self.numa_node = node;
        self
    }

    /// Injects faults into queue `queue` from the start, as
    /// [`Loopback::inject`](super::Loopback::inject) does at run time (see
    /// [`fault`](super::fault)); a later call for the same queue replaces it. In
    /// [`Mode::Process`] the device process starts without it: program it with
    /// `Loopback::inject` once the device is up.
    #[must_use]
    pub fn inject(mut self, queue: u16, injection: Injection) -> Config {
        self.faults.retain(|(q, _)| *q != queue);
        self.faults.push((queue, injection));
        self
    }

    /// The fault injections the device starts with ([`Config::inject`]).
    pub fn injections(&self) -> &[(u16, Injection)] {
        &self.faults
    }

    /// The cost model.
    pub fn cost_model(&self) -> Cost {
        self.cost
    }

    /// Queues.
    pub fn queue_count(&self) -> u16 {
        self.queues
    }

    /// Bytes of device memory asked for.
    pub fn memory_bytes(&self) -> usize {
        self.memory_size
    }

    /// Where the engine runs.
    pub fn engine_mode(&self) -> &Mode {
        &self.mode
    }

    /// The CPU the engine is pinned to, if any.
    pub fn engine_cpu_pin(&self) -> Option<u32> {
        self.engine_cpu
    }

    /// The NUMA node the device's memory goes on, if one was set ([`Config::numa_node`]).
    pub fn memory_node(&self) -> Option<u32> {
        self.numa_node
    }

    pub(super) fn check(&self) -> Result<(), Error> {
        let bad = |field, value: u64, expected| {
            Err(LoopbackError::Config {
                field,
                value,
                expected,
            }
            .into())
        };
        if self.queues == 0 || self.queues > regs::MAX_QUEUES {
            return bad("queues", self.queues.into(), "1 to 32");
        }
        if self.memory_size == 0 {
            return bad("memory_size", 0, "at least one page");
        }
        if !self.max_depth.is_power_of_two()
            || self.max_depth < 2
            || self.max_depth > ring::MAX_DEPTH
        {
            return bad(
                "max_depth",
                self.max_depth.into(),
                "a power of two from 2 to 32768",
            );
        }
        if !(12..=64).contains(&self.dma_mask_bits) {
            return bad("dma_mask_bits", self.dma_mask_bits.into(), "12 to 64");
        }
        if self.max_burst == 0 {
            return bad("max_burst", 0, "at least 1");
        }
        if self.ack_timeout.is_zero() {
            return bad("ack_timeout", 0, "at least 1 ns (5 s by default)");
        }
        for (queue, injection) in &self.faults {
            if *queue >= self.queues {
                return bad(
                    "inject (queue)",
                    (*queue).into(),
                    "a queue of the device (below `queues`)",
                );
            }
            injection.registers()?;
        }
        Ok(())
    }

    pub(super) fn settings(&self) -> Settings {
        Settings {
            queues: self.queues,
            max_depth: self.max_depth,
            dma_mask_bits: self.dma_mask_bits,
            cost: self.cost,
            max_burst: self.max_burst,
            idle_spin: self.idle_spin,
            cpu: self.engine_cpu,
            faults: self
                .faults
                .iter()
                .filter_map(|(q, injection)| Some((*q, injection.programme().ok()??)))
                .collect(),
        }
    }
}

/// The error for an engine CPU the engine could not be pinned to.
pub(super) fn bad_engine_cpu(cpu: Option<u32>) -> Error {
    LoopbackError::Config {
        field: "engine_cpu",
        value: cpu.map_or(u64::MAX, u64::from),
        expected: "a CPU this process may run on; `taskset -p <pid>` lists them",
    }
    .into()
}

/// One queue's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct QueueCounters {
    /// Descriptors executed.
    pub completed: u64,
    /// Error completions.
    pub errors: u64,
    /// Bytes its compute descriptors were served from device SRAM (with a working set
    /// declared and the cost model's SRAM on).
    pub sram_hits: u64,
    /// Bytes its compute descriptors touched with a working set declared.
    pub sram_touched: u64,
}

impl QueueCounters {
    /// The context's SRAM hit rate, `sram_hits / sram_touched` (`None` before it touched any).
    pub fn sram_hit_rate(&self) -> Option<f64> {
        (self.sram_touched > 0).then(|| self.sram_hits as f64 / self.sram_touched as f64)
    }
}

/// One unit's counters ([`regs::UnitRegs`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct UnitCounters {
    /// Descriptors the unit executed.
    pub descriptors: u64,
    /// Bytes moved or computed by the unit's successful descriptors.
    pub bytes: u64,
    /// Times the unit took a descriptor of another context than its previous one.
    pub context_switches: u64,
    /// The unit's error completions.
    pub errors: u64,
    /// Nanoseconds the unit spent executing: its utilisation over an interval is the growth
    /// of this over the interval's length.
    pub busy_ns: u64,
    /// Interrupts the unit raised.
    pub interrupts: u64,
    /// Nanoseconds of modelled time its descriptors were charged (0 with the zero-cost
    /// model). Beside `busy_ns`: the two agree when the modelled device holds, that is when
    /// the unit's own work at host speed is shorter than the model says.
    pub modelled_ns: u64,
}

/// The device's counters, read from its registers: each device-wide figure is the sum of the
/// two units' ([`Counters::units`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Counters {
    /// Descriptors executed.
    pub descriptors: u64,
    /// Bytes moved or computed by successful descriptors.
    pub bytes: u64,
    /// Moves from one context to another.
    pub context_switches: u64,
    /// Error completions.
    pub errors: u64,
    /// Nanoseconds spent executing, summed over the units (including modelled time; see
    /// [`regs::GlobalRegs::busy_ns`] for when it is brought up to date). With both units busy
    /// it grows up to twice as fast as the wall clock.
    pub busy_ns: u64,
    /// Interrupts raised.
    pub interrupts: u64,
    /// Modelled nanoseconds charged, summed over the units.
    pub modelled_ns: u64,
    /// Per queue.
    pub queues: Vec<QueueCounters>,
    /// Per unit, indexed by [`Unit`](regs::Unit) (`units[Unit::Compute as usize]`).
    pub units: [UnitCounters; 2],
}
