//! What a run reports ([`Streams::run`](super::Streams::run)): per stream
//! ([`StreamReport`]), per device ([`DeviceReport`]), per fault survived ([`FaultReport`]),
//! the whole run ([`RunReport`]), and each frame of the timeline ([`FrameSpan`]).

use crate::sched::{Nanos, Policy, StreamId};

/// One frame in a run's timeline: when it arrived, when the scheduler dispatched it to its
/// device, when its result was handed over. Times in ns from the run's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FrameSpan {
    /// Its stream.
    pub stream: StreamId,
    /// The device its stream runs on (index into [`RunReport::devices`]).
    pub device: usize,
    /// Its number within its stream's pipeline.
    pub frame: u64,
    /// When it arrived.
    pub arrival_ns: Nanos,
    /// When it was dispatched.
    pub dispatch_ns: Nanos,
    /// When its result was handed to postprocessing.
    pub done_ns: Nanos,
    /// Whether the device completed it without error.
    pub ok: bool,
}

/// What one stream did in a run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StreamReport {
    /// Its name.
    pub name: String,
    /// The device it ran on (index into [`RunReport::devices`]).
    pub device: usize,
    /// Frames that arrived in the run. Every one is accounted for: `arrived = frames + failed
    /// + lost + dropped + left_waiting` (the run ends with nothing in flight).
    pub arrived: u64,
    /// Frames finished.
    pub frames: u64,
    /// Frames the device failed.
    pub failed: u64,
    /// Frames that arrived while [`MAX_WAITING`] of its frames were waiting, never run.
    ///
    /// [`MAX_WAITING`]: super::MAX_WAITING
    pub dropped: u64,
    /// Frames finished per second of the run.
    pub fps: f64,
    /// Latency from arrival to the result handed over, in ns.
    pub latency_mean_ns: f64,
    /// Its median.
    pub latency_p50_ns: u64,
    /// Its 99th percentile.
    pub latency_p99_ns: u64,
    /// Its maximum.
    pub latency_max_ns: u64,
    /// The longest wait from arrival to dispatch, in ns (a stream whose frames arrive faster
    /// than it is served waits longer with every frame).
    pub max_wait_ns: u64,
    /// The longest wait as [`Scheduler::wait_bound`] counts it, in ns: from when the frame
    /// became its stream's oldest waiting frame (its arrival, or the dispatch of its stream's
    /// previous frame if that is later) to its dispatch. What a stated bound is checked
    /// against.
    ///
    /// [`Scheduler::wait_bound`]: crate::sched::Scheduler::wait_bound
    pub max_head_wait_ns: u64,
    /// Frames that had arrived but were still waiting when the run ended (not run).
    pub left_waiting: u64,
    /// Frames in flight when its device failed and was recovered (or removed): never
    /// finished (see [`RunReport::faults`]).
    pub lost: u64,
}

/// A device fault a run survived ([`RunReport::faults`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FaultReport {
    /// The device (index into [`RunReport::devices`]).
    pub device: usize,
    /// When it was seen, in ns from the run's start.
    pub at_ns: Nanos,
    /// What was seen (a timeout, a protocol error, the removal).
    pub error: String,
    /// Its kind.
    pub code: userdma::Code,
    /// The device was removed: its streams ran no more frames this run.
    pub removed: bool,
    /// Frames of the device's streams that finished while it was being stopped.
    pub finished: u64,
    /// Frames of the device's streams that were lost.
    pub lost: u64,
    /// How long the recovery took, from the fault to the device taking frames again (resets
    /// tried, slots back, queues reopened; not the back-off after it), in ns; for a
    /// quarantined device, until it was quarantined.
    pub recovery_ns: u64,
    /// Resets tried (0 for a removed device; more than 1 when a reset failed and was tried
    /// again).
    pub resets: u32,
    /// Why the last reset failed, if it did.
    pub reset_error: Option<String>,
    /// Faults of this device in a row, this one included ([`Recovery::max_faults`]).
    ///
    /// [`Recovery::max_faults`]: super::Recovery::max_faults
    pub in_a_row: u32,
    /// The device got no frames for this long after it came back (a back-off after faults in
    /// a row), in ns.
    pub held_ns: u64,
    /// The device was quarantined (too many faults in a row, or its resets kept failing):
    /// its streams got no more frames, the other devices' went on. Its frames in flight stay
    /// with their pipelines when its reset failed (the device might still write them), and
    /// are never freed under it.
    pub quarantined: bool,
}

/// What one device's scheduler did in a run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceReport {
    /// The streams on it, by name.
    pub streams: Vec<String>,
    /// Context switches its scheduler's decisions caused.
    pub switches: u64,
    /// Decisions its scheduler made.
    pub decisions: u64,
    /// The longest one frame held the device, as the loop saw it, in ns (0 if it finished
    /// none): from its dispatch (its `preprocess` included) or the device's previous
    /// completion, whichever came later, to its completion; and, where the next frame was
    /// already waiting when it finished, from its dispatch to that next dispatch (its
    /// `postprocess` and the loop's turn included, as the waiting frame saw them). The service
    /// time a stated wait bound holds for ([`Scheduler::wait_bound`]): a device (or a host)
    /// slower than its model shows here.
    ///
    /// [`Scheduler::wait_bound`]: crate::sched::Scheduler::wait_bound
    pub longest_frame_ns: Nanos,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunReport {
    /// The policy.
    pub policy: Policy,
    /// Seconds it ran.
    pub seconds: f64,
    /// Per stream, in the order given.
    pub streams: Vec<StreamReport>,
    /// Per device, in the order its first stream was given.
    pub devices: Vec<DeviceReport>,
    /// Context switches the scheduler's decisions caused, over all devices.
    pub switches: u64,
    /// Decisions made, over all devices.
    pub decisions: u64,
    /// Device faults survived, in the order they happened: a device that stopped answering
    /// or broke its queue protocol was reset and its pipelines recovered (their frames in
    /// flight lost, the run going on), or quarantined when it kept failing ([`Recovery`]); a
    /// removed device's streams stopped while the others went on.
    ///
    /// [`Recovery`]: super::Recovery
    pub faults: Vec<FaultReport>,
}
