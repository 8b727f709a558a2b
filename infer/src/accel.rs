//! The accelerator contract: what a pipeline and a scheduler need from a device, so they run on
//! any device that provides it: the loopback NPU, a PCI device through VFIO, a device whose
//! operations come from C.
//!
//! An [`Accelerator`] states what it can do ([`Capabilities`]), hands out arenas for the
//! model's tensors ([`Accelerator::alloc_arena`]: device memory, or host memory where the
//! device has none) and the pool the host buffers come from, and opens [`Queue`]s. A queue
//! takes a frame's work as [`Op`]s (host→device and device→host transfers by IOVA, model steps
//! at planned arena offsets, and waits on another queue), runs them **in order**, and hands
//! back one [`Completion`] per op, in order, carrying the caller's tag.
//!
//! **Compute on the host.** A step the device cannot run ([`Capabilities::runs`] false: a
//! device with no compute unit, or one without on-device filtering given a `Compact`) is run
//! by the pipeline on the host, explicitly: its queue holds the ops after it until everything
//! before it completed, reads the step's inputs out of the arena ([`Accelerator::read_arena`]),
//! computes, and writes the output back ([`Accelerator::write_arena`]). The pipeline's
//! [`Summary::host_steps`](crate::pipeline::Summary::host_steps) counts them and
//! [`Pipeline::compute`](crate::pipeline::Pipeline::compute) says where compute ran.
//!
//! **Activity records.** A device that keeps records of what its units ran
//! ([`Accelerator::record_activity`]) hands them out as [`Activity`]s
//! ([`Accelerator::drain_activity`]): the device's own start and end of each op (queue wait
//! excluded, unlike a completion seen by the host), its unit, queue, command and context, its
//! bytes, whether it switched its unit's context and what it missed in on-chip memory. The
//! times are `CLOCK_MONOTONIC` nanoseconds; [`monotonic_ns`] puts the host's own `Instant`s on
//! that clock, so a trace can show both side by side. Devices without records say so
//! ([`userdma::Error::Unsupported`]).
//!
//! **Ownership.** A buffer named by an op stays allocated and untouched by the host until the
//! op's completion was handed back, or the queue's [`Queue::shutdown`] returned it among the
//! completed or the aborted (the device then no longer touches it). A queue whose shutdown
//! fails leaves its buffers to the caller to leak, never to free.
//!
//! | module | owns |
//! |---|---|
//! | this one | [`Accelerator`], [`Queue`], [`Op`], [`Completion`], [`Capabilities`], [`Activity`] |
//! | [`loopback`] | the loopback NPU as an accelerator ([`LoopbackEngine`]) |
//! | [`memory`] | a plain host-memory engine: one copy engine, no compute ([`MemoryEngine`]) |
//! | `host` | the queue adapter that runs the steps a device cannot on the host |

pub mod loopback;
pub mod memory;

mod host;
#[cfg(test)]
mod tests;

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::Wait;
use userdma::dma::{Iova, Mapping};
use userdma::irq::EventFd;
use userdma::memory::Region;
use userdma::pool::Pool;
use userdma::ring;

use crate::pipeline::{Step, WorkingSet};

pub use self::host::{HostSteps, HOST_COMMAND};
pub use self::loopback::LoopbackEngine;
pub use self::memory::MemoryEngine;

/// What a device's queues do (a queue is served by one unit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Unit {
    /// Transfers between host memory and the arenas.
    Copy,
    /// Model steps.
    Compute,
}

/// Where a pipeline's compute steps run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum ComputeAt {
    /// On the device.
    #[default]
    Device,
    /// On the host, by the pipeline, between the device's transfers (the device has no
    /// compute unit).
    Host,
    /// Some steps on the device, the others on the host (the device lacks a capability a
    /// step needs, such as on-device filtering).
    Mixed,
}

/// What a device can do; the pipeline refuses a configuration that needs what it lacks, with
/// an error that names the capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Capabilities {
    /// A short name of the engine's kind ("loopback NPU", "edu", "host memory").
    pub kind: &'static str,
    /// It runs the model's `Compute` and `Layer` steps; without it they run on the host.
    pub compute: bool,
    /// It runs `Compact` (on-device result filtering); without it filtering runs on the host.
    pub filter: bool,
    /// Copy and compute are separate units that run at once (a split pipeline overlaps one
    /// frame's copies with another's compute).
    pub separate_units: bool,
    /// A queue's op can wait for another queue's ([`Op::After`]): what a split pipeline
    /// orders a frame's steps with.
    pub cross_queue_order: bool,
    /// The arenas are in device memory (not host memory).
    pub device_memory: bool,
    /// A result can be read straight out of the arena ([`Accelerator::read_arena`]) as a
    /// result path.
    pub read_in_place: bool,
    /// Queues run in contexts and the device counts and charges switches between them.
    pub contexts: bool,
    /// Queues can raise interrupts ([`Queue::waitable`]); without them waits poll.
    pub interrupts: bool,
    /// The number of queues (ids `0..queues`).
    pub queues: u16,
}

impl Capabilities {
    /// Whether it needs the host for some steps of `steps`.
    pub fn compute_at(&self, steps: &[Step]) -> ComputeAt {
        let here = steps.iter().filter(|s| self.runs(s)).count();
        match (here, steps.len()) {
            (_, 0) => ComputeAt::Device,
            (h, n) if h == n => ComputeAt::Device,
            (0, _) => ComputeAt::Host,
            _ => ComputeAt::Mixed,
        }
    }

    /// Whether a pipeline of `steps` can be split across the units: separate copy and compute
    /// units, ordering across queues, and every step on the device.
    pub fn splits(&self, steps: &[Step]) -> bool {
        self.separate_units && self.cross_queue_order && self.compute_at(steps) == ComputeAt::Device
    }

    /// Whether the device runs `step` (or the host must).
    pub fn runs(&self, step: &Step) -> bool {
        match step {
            Step::Compute { .. } | Step::Layer { .. } => self.compute,
            Step::Compact { .. } => self.filter,
        }
    }
}

/// How a queue is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSpec {
    /// The queue's id, below [`Capabilities::queues`].
    pub id: u16,
    /// Ops it holds at once (a power of two).
    pub depth: u32,
    /// The context its work runs in (devices with [`Capabilities::contexts`]).
    pub context: u32,
    /// The unit that serves it.
    pub unit: Unit,
    /// How the host waits for its completions.
    pub wait: Wait,
    /// The largest arena its steps run over (what a host step reads and writes at most).
    pub arena_bytes: u64,
}

/// A host buffer as an op names it: its IOVA (what a device uses) and its address in this
/// process (what a host engine or a host step uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSpan {
    /// Its IOVA in the device's DMA space.
    pub iova: Iova,
    /// Its first byte in this process.
    pub ptr: NonNull<u8>,
    /// Bytes.
    pub len: u64,
}

// SAFETY: a `HostSpan` is an address and a length, not access: memory is reached through it
// only by an engine (or a host step) under the ownership rule of the module docs, on whichever
// thread drives the queue, so moving or sharing the span itself between threads is sound.
unsafe impl Send for HostSpan {}
// SAFETY: as for `Send`: `&HostSpan` gives nothing but the address.
unsafe impl Sync for HostSpan {}

/// One op of a frame. Arena addresses are the engine's own ([`Arena::at`] plus an offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Copies `from` (host memory) to arena address `to`.
    ToDevice {
        /// The host buffer.
        from: HostSpan,
        /// Where in an arena.
        to: u64,
    },
    /// Runs `step` over the arena at `arena` (its offsets are from there).
    Step {
        /// The arena's address.
        arena: u64,
        /// The step.
        step: Step,
    },
    /// Copies `to.len` bytes at arena address `from` into `to` (host memory).
    ToHost {
        /// Where in an arena.
        from: u64,
        /// The host buffer.
        to: HostSpan,
    },
    /// Waits until the first `count` ops pushed to queue `queue` (of this device, counted
    /// from when it was opened) have completed ([`Capabilities::cross_queue_order`]).
    After {
        /// The queue waited for.
        queue: u16,
        /// How many of its ops.
        count: u64,
    },
}

/// The completion of one op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The tag the op was pushed with.
    pub tag: u64,
    /// 0: done; otherwise the device's status code ([`Accelerator::status_name`]).
    pub status: u32,
    /// The completion's result field (an address or offset for range errors).
    pub result: u64,
    /// The queue it completed on.
    pub queue: u16,
    /// The device's id of the op (a command id), for messages.
    pub command: u16,
}

/// The status of a step the host ran and could not (the arena could not be read or written).
pub const HOST_STEP_FAILED: u32 = 0xFFFF_0001;

/// The name of `status` for an engine that gives its codes none.
pub fn default_status_name(status: u32) -> &'static str {
    match status {
        0 => "success",
        HOST_STEP_FAILED => "host step failed (the arena could not be read or written)",
        _ => "device error",
    }
}

/// One op as the device ran it (device-side timing): what [`Accelerator::drain_activity`]
/// hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Activity {
    /// The unit that ran it.
    pub unit: Unit,
    /// Its queue.
    pub queue: u16,
    /// The command id its completion carries ([`Completion::command`]).
    pub command: u16,
    /// Its queue's context.
    pub context: u32,
    /// What it was.
    pub kind: ActivityKind,
    /// 0: done; otherwise the device's status code ([`Accelerator::status_name`]).
    pub status: u32,
    /// When the device began it, `CLOCK_MONOTONIC` nanoseconds ([`monotonic_ns`]).
    pub start_ns: u64,
    /// When the device finished it, `CLOCK_MONOTONIC` nanoseconds; a unit's ops never overlap.
    pub end_ns: u64,
    /// Bytes it moved (a transfer) or computed over (a step); 0 if it failed.
    pub bytes: u64,
    /// It made its unit switch from another context (what the device's switch counter counts).
    pub switched: bool,
    /// Bytes of on-chip memory (SRAM) it touched, where the device models one.
    pub sram_touched: u64,
    /// Of those, the bytes it missed and refilled from device memory.
    pub sram_missed: u64,
}

/// What an [`Activity`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ActivityKind {
    /// A host-to-device transfer ([`Op::ToDevice`]).
    ToDevice,
    /// A device-to-host transfer ([`Op::ToHost`]).
    ToHost,
    /// A model step ([`Op::Step`]).
    Compute,
    /// A wait for another queue ([`Op::After`]).
    Wait,
    /// Anything else the device ran (an op of its own, or one it could not decode).
    Other,
}

/// What one [`Accelerator::drain_activity`] counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct ActivityDrained {
    /// Records handed out.
    pub records: u64,
    /// Records the device wrote and overwrote (or reset away) before they were read: drain
    /// more often, or record with more records per unit.
    pub lost: u64,
    /// Records that made no sense (a device fault) and were skipped, and times the device's
    /// count of records went backwards.
    pub bad: u64,
}

/// `at` in `CLOCK_MONOTONIC` nanoseconds, the clock of [`Activity`]'s times (through an anchor
/// this process takes once: an `Instant` and a `CLOCK_MONOTONIC` reading of the same moment).
pub fn monotonic_ns(at: Instant) -> u64 {
    userdma_loopback::activity::monotonic_ns(at)
}

/// What a queue's [`Queue::shutdown`] hands back.
#[derive(Debug, Default)]
pub struct Stopped {
    /// Ops that completed, in order.
    pub completed: Vec<Completion>,
    /// The tags of ops the device was stopped before completing (it no longer touches their
    /// buffers).
    pub aborted: Vec<u64>,
}

/// An arena: device (or host) memory for one slot's tensors, freed when dropped.
pub struct Arena {
    /// Its address as ops name it.
    pub at: u64,
    /// Bytes.
    pub bytes: u64,
    /// What keeps it allocated.
    pub keep: Box<dyn std::any::Any + Send + Sync>,
}

impl Arena {
    /// What is wrong with this arena as an answer to `alloc_arena(bytes, align)`, if
    /// anything: fewer bytes than asked for, an address not a multiple of `align` (0: none
    /// asked), or an end past 2^64. Every arena address a pipeline makes is `at` plus an offset
    /// below `bytes`, so any of these would name memory that is not the arena; a pipeline
    /// refuses such an arena when it is built ([`crate::pipeline::Error::Arena`]).
    pub fn fault(&self, bytes: u64, align: u64) -> Option<String> {
        if self.bytes < bytes {
            Some(format!(
                "holds {} bytes, fewer than the {bytes} asked for",
                self.bytes
            ))
        } else if align != 0 && self.at % align != 0 {
            Some(format!("is not aligned to {align} bytes"))
        } else if self.at.checked_add(self.bytes).is_none() {
            Some(format!(
                "leaves no room for {} bytes below 2^64",
                self.bytes
            ))
        } else {
            None
        }
    }
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("at", &self.at)
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// One queue of an accelerator: ops in, completions out, both in order.
pub trait Queue: Send {
    /// Its id.
    fn id(&self) -> u16;

    /// Queues `op` with `tag` (not yet announced to the device: [`Queue::flush`]).
    ///
    /// # Errors
    /// The queue is full or broken, or the op is one the device refuses outright.
    fn push(&mut self, op: Op, tag: u64) -> Result<(), crate::Error>;

    /// Announces every queued op (one doorbell).
    ///
    /// # Errors
    /// The device or the queue failed.
    fn flush(&mut self) -> Result<(), crate::Error>;

    /// The next completion, if one is in.
    ///
    /// # Errors
    /// The queue broke (a completion it does not know, a removed device).
    fn poll(&mut self) -> Result<Option<Completion>, crate::Error>;

    /// Waits up to `timeout` for the next completion. The default polls, then sleeps between
    /// polls (up to 1 ms); a device with an interrupt sleeps on it instead.
    ///
    /// # Errors
    /// [`Queue::overdue`]'s error when nothing came, and what [`Queue::poll`] fails with.
    fn wait(&mut self, timeout: Duration) -> Result<Completion, crate::Error> {
        // Polls: a few times back to back (a completion moments away), then between sleeps
        // that double up to 1 ms (a slow device does not keep a CPU busy).
        let start = Instant::now();
        let mut nap = Duration::ZERO;
        loop {
            if let Some(done) = self.poll()? {
                return Ok(done);
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(self.overdue(waited));
            }
            if nap.is_zero() && waited < Duration::from_micros(20) {
                std::thread::yield_now();
            } else {
                nap = (nap * 2).clamp(Duration::from_micros(10), Duration::from_millis(1));
                std::thread::sleep(nap.min(timeout - waited));
            }
        }
    }

    /// What to sleep on for its completions, with [`ring::wait_any`]; `None` when it has no
    /// interrupt (or has work it can do right now: poll instead of sleeping).
    fn waitable(&mut self) -> Option<&mut dyn ring::Waitable> {
        None
    }

    /// Its interrupt, to add to an [`userdma::irq::Waiter`].
    fn interrupt(&self) -> Option<&EventFd> {
        None
    }

    /// The error for nothing completing in `waited` (name the queue and what is in flight:
    /// [`ring::Error::Timeout`]).
    fn overdue(&self, waited: Duration) -> crate::Error;

    /// Stops the queue: every op is completed or aborted, and the device touches none of
    /// their buffers any more. A device that was reset or removed stops at once.
    ///
    /// # Errors
    /// The device could not be made to stop (leak the buffers of every op still out).
    fn shutdown(self: Box<Self>) -> Result<Stopped, crate::Error>;
}

/// A device the inference layer runs on. See the module docs.
pub trait Accelerator: Send + Sync + fmt::Debug {
    /// The device, for messages (a BDF, "loopback0").
    fn identity(&self) -> String;

    /// What it can do.
    fn capabilities(&self) -> Capabilities;

    /// A pool of host buffers of about `bytes`, mapped into the device's DMA space once, in
    /// the page-aligned layout (no cache colouring, whatever the device allows): a pipeline's
    /// slots are read from and written to files opened for direct I/O through the stager, which
    /// needs them aligned to the file's blocks, and they are allocated once per pipeline, so
    /// the coloured layout's faster allocation would buy nothing there.
    ///
    /// # Errors
    /// No memory, no IOVA space.
    fn host_pool(&self, bytes: usize) -> Result<Arc<Pool>, crate::Error>;

    /// Maps `region` (host memory, perhaps shared with another process) into the device's DMA
    /// space for ops to name by IOVA: a device owner maps each client's pool this way.
    /// Default: [`userdma::Error::Unsupported`].
    ///
    /// # Errors
    /// No IOVA space; a device that cannot map memory it did not allocate.
    fn map_host(&self, region: Arc<Region>) -> Result<Mapping, crate::Error> {
        let _ = region;
        Err(userdma::Error::Unsupported {
            device: self.identity(),
            what: "mapping a caller's host memory",
            hint: "implement Accelerator::map_host for this device",
        }
        .into())
    }

    /// An arena of `bytes` aligned to `align` (a power of two).
    ///
    /// # Errors
    /// The memory is exhausted (fewer slots, a smaller model).
    fn alloc_arena(&self, bytes: u64, align: u64) -> Result<Arena, crate::Error>;

    /// Reads `dst.len()` bytes at arena address `at`.
    ///
    /// # Errors
    /// The range leaves the device's memory, or it cannot be read from the host.
    fn read_arena(&self, at: u64, dst: &mut [u8]) -> Result<(), crate::Error>;

    /// Writes `src` at arena address `at` (what a step run on the host writes back).
    ///
    /// # Errors
    /// As [`Accelerator::read_arena`].
    fn write_arena(&self, at: u64, src: &[u8]) -> Result<(), crate::Error>;

    /// Opens a queue.
    ///
    /// # Errors
    /// No such queue, a depth it does not take, a removed device.
    fn open_queue(&self, spec: QueueSpec) -> Result<Box<dyn Queue>, crate::Error>;

    /// Declares the working set of the context of queue `queue` (devices with an on-chip
    /// memory model charge its refill on a switch). Default: nothing to declare.
    ///
    /// # Errors
    /// The device refused it.
    fn set_working_set(&self, queue: u16, set: WorkingSet) -> Result<(), crate::Error> {
        let _ = (queue, set);
        Ok(())
    }

    /// Resets the device: every queue stops at once (their owners take their buffers back
    /// and open them again).
    ///
    /// # Errors
    /// The device did not come back.
    fn reset(&self) -> Result<(), crate::Error>;

    /// Whether the device is gone.
    fn is_removed(&self) -> bool {
        false
    }

    /// The name of status code `status` (for a [`Completion`] that failed).
    fn status_name(&self, status: u32) -> &'static str {
        default_status_name(status)
    }

    /// Starts keeping activity records: from now on the device records each op its units run,
    /// `records_per_unit` records per unit between two [`Accelerator::drain_activity`] calls
    /// (a power of two; older ones are overwritten, and counted lost). Starting again
    /// restarts the records (those not drained are dropped). Default: the device keeps none.
    ///
    /// # Errors
    /// [`userdma::Error::Unsupported`] for a device that keeps no activity records; a size
    /// the device does not take; no memory for the records.
    fn record_activity(&self, records_per_unit: u32) -> Result<(), crate::Error> {
        let _ = records_per_unit;
        Err(userdma::Error::Unsupported {
            device: self.identity(),
            what: "activity records",
            hint: "the device keeps no activity records: take the ops' times from their \
                   completions on the host",
        }
        .into())
    }

    /// Hands every activity record made since the last call to `out`, oldest first per unit,
    /// and counts those lost and bad. Allocates nothing (call it periodically during a run).
    /// Default (and before [`Accelerator::record_activity`]): nothing.
    ///
    /// # Errors
    /// The device's records could not be read.
    fn drain_activity(
        &self,
        out: &mut dyn FnMut(&Activity),
    ) -> Result<ActivityDrained, crate::Error> {
        let _ = out;
        Ok(ActivityDrained::default())
    }

    /// Stops keeping activity records (those not drained are dropped). Default: nothing.
    fn stop_activity(&self) {}

    /// One value per device: engines that give the same key drive one device (a scheduler
    /// groups the pipelines on it, and a reset of one resets all). Default: this engine's
    /// address.
    fn key(&self) -> usize {
        (self as *const Self).cast::<()>() as usize
    }
}
