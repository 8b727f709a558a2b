//! Streams of real pipelines on one device under a [`Scheduler`]: the driver that turns its
//! decisions into frames.
//!
//! Each [`Stream`] owns a [`Pipeline`] (its own queues in its own device context) and an
//! arrival process ([`Arrivals`]): frames that arrive at a fixed rate (live video) wait in a
//! bounded queue of arrival times; a stream that runs as fast as it can has its next frame
//! ready whenever its previous one has been dispatched. [`Streams::run`] keeps at most
//! `in_flight` frames on the device (1: the device is non-preemptive and the scheduler decides
//! every frame at the moment the device can take it, so its bounds hold; 2 lets the next
//! frame's input copy overlap the current frame's compute, at the price of one more frame of
//! wait). Each time the device can take a frame it asks the scheduler which stream's oldest
//! waiting frame goes, submits it to that stream's pipeline, and hands every finished frame
//! to postprocessing with its arrival time, so latency counts from arrival.
//!
//! Streams may run on several devices (several loopback devices stand in for a machine with
//! several NPUs): the streams whose pipelines share a device share that device's scheduler,
//! each device decides on its own (`in_flight` is per device), and one thread drives them
//! all, sleeping on every busy pipeline's interrupt at once.
//!
//! What a run reports per stream ([`StreamReport`]): frames, frames per second, latency
//! from arrival to the result (mean, p50, p99, max), the longest wait from arrival to
//! dispatch, frames dropped because its arrival queue was full; per device
//! ([`DeviceReport`]) the switches its scheduler caused, to set beside the device's own
//! count. With [`Streams::with_timeline`] it also keeps each frame's arrival, dispatch and
//! result times ([`FrameSpan`]), for a picture of which context ran when.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Nanos, Policy, Scheduler, StreamId, StreamSpec};
use crate::pipeline::{Finished, Input, Pipeline};
use userdma::irq::Waiter;
use userdma_loopback::Loopback;

mod error;
pub use self::error::Error;

/// When a stream's frames become ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Arrivals {
    /// One frame every `period` nanoseconds from the start (a camera).
    Periodic {
        /// Nanoseconds between two frames.
        period: Nanos,
    },
    /// The next frame is ready as soon as the previous one is dispatched (a file played back
    /// as fast as the device allows).
    Asap,
}

/// One stream: what the scheduler knows of it, how its frames arrive, its pipeline.
#[derive(Debug)]
pub struct Stream {
    /// Its scheduling parameters (its `context` must be its pipeline's).
    pub spec: StreamSpec,
    /// How its frames arrive.
    pub arrivals: Arrivals,
    /// The pipeline its frames run through.
    pub pipeline: Pipeline,
}

/// The most frames a run's timeline keeps ([`Streams::with_timeline`]): about 64 MiB of
/// them; a larger capacity is taken as this.
pub const MAX_TIMELINE: usize = 1 << 20;

/// Arrival times waiting per stream at most; later arrivals are dropped (and counted).
pub const MAX_WAITING: usize = 256;

/// One stream's frames that have arrived and wait for dispatch, by arrival time: what a
/// driver passes [`Scheduler::decide`] as the stream's oldest. Preallocated; arrivals beyond
/// [`MAX_WAITING`] are dropped and counted.
#[derive(Debug, Clone)]
pub struct ArrivalQueue {
    arrivals: Arrivals,
    waiting: VecDeque<Nanos>,
    next: Nanos,
    arrived: u64,
    dropped: u64,
}

impl ArrivalQueue {
    /// An empty queue whose first periodic frame arrives at time 0.
    pub fn new(arrivals: Arrivals) -> ArrivalQueue {
        ArrivalQueue {
            arrivals,
            waiting: VecDeque::with_capacity(MAX_WAITING),
            next: 0,
            arrived: 0,
            dropped: 0,
        }
    }

    /// Starts the clock again: nothing waits, the next periodic frame arrives at time 0, and
    /// the counts start from zero (allocates nothing).
    pub fn restart(&mut self) {
        self.waiting.clear();
        self.next = 0;
        self.arrived = 0;
        self.dropped = 0;
    }

    /// Frames arriving up to `now`; an as-fast-as-possible stream gets its next frame once
    /// nothing of it waits and none of it is `busy` on the device.
    pub fn arrive(&mut self, now: Nanos, busy: bool) {
        match self.arrivals {
            Arrivals::Periodic { period } => {
                while self.next <= now {
                    self.arrived += 1;
                    if self.waiting.len() < MAX_WAITING {
                        self.waiting.push_back(self.next);
                    } else {
                        self.dropped += 1;
                    }
                    self.next = self.next.saturating_add(period.max(1));
                }
            }
            Arrivals::Asap => {
                if self.waiting.is_empty() && !busy {
                    self.arrived += 1;
                    self.waiting.push_back(now);
                }
            }
        }
    }

    /// The arrival time of the oldest waiting frame.
    pub fn oldest(&self) -> Option<Nanos> {
        self.waiting.front().copied()
    }

    /// Takes the oldest waiting frame's arrival time.
    pub fn take(&mut self) -> Option<Nanos> {
        self.waiting.pop_front()
    }

    /// Puts back a frame taken but not dispatched.
    pub fn put_back(&mut self, arrival: Nanos) {
        self.waiting.push_front(arrival);
    }

    /// When the next periodic frame arrives (`None` for an as-fast-as-possible stream).
    pub fn next_arrival(&self) -> Option<Nanos> {
        match self.arrivals {
            Arrivals::Periodic { .. } => Some(self.next),
            Arrivals::Asap => None,
        }
    }

    /// Frames waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Frames dropped because [`MAX_WAITING`] were waiting (since the last restart).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Frames that arrived since the last restart, dropped ones included.
    pub fn arrived(&self) -> u64 {
        self.arrived
    }
}

struct State {
    stream: Stream,
    queue: ArrivalQueue,
    /// Which device group it belongs to.
    group: usize,
    /// Per frame in flight, in frame order: (arrival, dispatch).
    dispatched: VecDeque<(Nanos, Nanos)>,
    latency: hdrhistogram::Histogram<u64>,
    frames: u64,
    failed: u64,
    /// Frames lost to device faults this run (in flight when the device was recovered).
    lost: u64,
    max_wait: Nanos,
    /// The longest wait as the bounds count it ([`StreamReport::max_head_wait_ns`]), and when
    /// the stream last had a frame dispatched in this run.
    max_head_wait: Nanos,
    last_dispatch: Nanos,
}

/// The streams of one device and the scheduler that picks among them (the device is
/// non-preemptive, so each device decides on its own).
struct Group {
    scheduler: Scheduler,
    /// Indices into `Streams::states`, in the order given.
    members: Vec<usize>,
    /// Per member: the arrival of its oldest waiting frame (the scheduler's input).
    oldest: Vec<Option<Nanos>>,
    /// The scheduler's switches and decisions when the current run began.
    at_start: (u64, u64),
    /// The device was removed or quarantined: its streams get no more frames.
    retired: bool,
    /// Faults in a row: since the last frame the device finished (by itself, not handed back
    /// by a recovery).
    streak: u32,
    /// After repeated faults: no frames before this.
    hold_until: Option<Instant>,
    /// Its reset failed: tried again at `retry_at` (its frames in flight stay with it).
    down: Option<Down>,
    /// When the device last showed progress while busy (took a frame while idle, or finished
    /// one), in ns from the run's start: with several devices the loop sleeps on all of them
    /// and declares one stuck when it shows none for its pipelines' timeout, not counting the
    /// time the loop spent in the caller's code meanwhile.
    progress: Nanos,
    /// `Streams::host_ns` at `progress`.
    host_at_progress: Nanos,
    /// The longest of its pipelines' timeouts.
    timeout: Duration,
    /// When it last finished a frame in this run (ns from its start), and the longest a frame
    /// held it ([`DeviceReport::longest_frame_ns`]).
    last_done: Nanos,
    longest_frame: Nanos,
    /// When it last took a frame in this run (the loop's clock, as waits are counted).
    last_dispatch: Option<Nanos>,
}

/// A device being reset, or whose reset failed and waits for the next try.
#[derive(Debug)]
struct Down {
    /// The fault being recovered from (index into `Streams::faults`).
    fault: usize,
    /// The reset, running on a thread of its own (a device that hangs in reset holds it up
    /// to the device's acknowledgement timeout; the other devices' streams go on meanwhile).
    reset: Option<std::thread::JoinHandle<Result<(), userdma::device::Error>>>,
    /// With no reset running: when the next one starts.
    retry_at: Instant,
}

/// How often the loop looks at a reset running on its own thread.
const RESET_POLL: Duration = Duration::from_millis(1);

impl Group {
    /// Whether the scheduler may give the device a frame at `now`.
    fn takes_frames(&self, now: Instant) -> bool {
        !self.retired && self.down.is_none() && self.hold_until.is_none_or(|t| now >= t)
    }
}

/// How a run treats a device that keeps failing ([`Streams::with_recovery`]). Each fault is
/// answered with a reset; a reset that fails is tried again after a back-off, and faults in
/// a row (no frame finished by the device between them) hold the device's frames back for a
/// growing back-off; a device past either limit is quarantined: its streams get no more
/// frames in this run or the next, the others go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Recovery {
    /// Faults in a row after which the device is quarantined (at least 1; 5 by default).
    pub max_faults: u32,
    /// Resets tried for one fault before the device is quarantined (at least 1; 6 by
    /// default).
    pub max_resets: u32,
    /// The first back-off (10 ms by default): a failed reset's k-th try waits
    /// `backoff * 2^(k-1)`; after the n-th fault in a row (n >= 2) the device gets no frames
    /// for `backoff * 2^(n-2)`.
    pub backoff: Duration,
    /// The longest back-off (1 s by default).
    pub max_backoff: Duration,
}

impl Default for Recovery {
    fn default() -> Recovery {
        Recovery {
            max_faults: 5,
            max_resets: 6,
            backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(1),
        }
    }
}

impl Recovery {
    /// `backoff * 2^k`, at most `max_backoff`.
    fn backoff(&self, k: u32) -> Duration {
        self.backoff
            .checked_mul(1u32.checked_shl(k).unwrap_or(u32::MAX))
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

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
    pub faults: Vec<FaultReport>,
}

/// Streams on one or more devices, one scheduler per device.
pub struct Streams {
    groups: Vec<Group>,
    states: Vec<State>,
    in_flight: usize,
    /// Sleeps on every pipeline's interrupt at once, when there are several devices.
    waiter: Option<Waiter>,
    timeline: VecDeque<FrameSpan>,
    timeline_capacity: usize,
    /// The faults of the current run.
    faults: Vec<FaultReport>,
    /// A device fault seen while dispatching, handled after it.
    pending_fault: Option<(usize, crate::Error)>,
    recovery: Recovery,
    /// Time spent outside the devices' reach: in `preprocess` and `postprocess`, and
    /// recovering devices (ns, growing over every run). A device is not overdue for what the
    /// loop did not see of it meanwhile.
    host_ns: Nanos,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streams")
            .field("policy", self.groups[0].scheduler.policy())
            .field("streams", &self.states.len())
            .field("devices", &self.groups.len())
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

/// How long a wait on several devices sleeps at most before it looks again (the pipelines'
/// own timeout still decides when a device is declared stuck).
const MAX_SLEEP: Duration = Duration::from_millis(100);

impl Streams {
    /// Schedules `streams` with `policy`, at most `in_flight` frames on each device at once.
    ///
    /// Streams whose pipelines run on one device ([`Pipeline::device`]) share that device's
    /// scheduler; each device decides on its own, so a stream stays on its device and its
    /// queue (context affinity), and the bounds of the [`super`] docs hold per device.
    ///
    /// # Errors
    /// [`crate::Error::Streams`] ([`Error`]) for no streams, an `in_flight` of 0, two streams
    /// with one name, a stream whose context is not its pipeline's, a periodic stream with a
    /// period of 0, and what a device's scheduler refuses ([`Error::Scheduler`]: its message
    /// says what to change); what the interrupt waiter fails with, for streams on several
    /// devices.
    pub fn new(
        policy: Policy,
        streams: Vec<Stream>,
        in_flight: usize,
    ) -> Result<Streams, crate::Error> {
        if in_flight == 0 {
            return Err(Error::ZeroInFlight.into());
        }
        if streams.is_empty() {
            return Err(Error::NoStreams.into());
        }
        for (i, s) in streams.iter().enumerate() {
            if s.spec.context != s.pipeline.config().context {
                return Err(Error::Context {
                    stream: s.spec.name.clone(),
                    context: s.spec.context,
                    pipeline: s.pipeline.config().context,
                }
                .into());
            }
            if s.arrivals == (Arrivals::Periodic { period: 0 }) {
                return Err(Error::ZeroPeriod {
                    stream: s.spec.name.clone(),
                }
                .into());
            }
            if let Some(j) = streams[..i].iter().position(|o| o.spec.name == s.spec.name) {
                return Err(Error::DuplicateName {
                    name: s.spec.name.clone(),
                    first: j,
                    second: i,
                }
                .into());
            }
        }
        // Group by device, in the order each device's first stream comes.
        let mut device_of = Vec::with_capacity(streams.len());
        let mut devices: Vec<&Arc<Loopback>> = Vec::new();
        for s in &streams {
            let d = s.pipeline.device();
            let g = match devices.iter().position(|o| Arc::ptr_eq(o, d)) {
                Some(g) => g,
                None => {
                    devices.push(d);
                    devices.len() - 1
                }
            };
            device_of.push(g);
        }
        let mut groups = Vec::with_capacity(devices.len());
        for g in 0..devices.len() {
            let members: Vec<usize> = (0..streams.len()).filter(|&i| device_of[i] == g).collect();
            let specs = members.iter().map(|&i| streams[i].spec.clone()).collect();
            let scheduler = Scheduler::new(policy, specs).map_err(|source| Error::Scheduler {
                device: (devices.len() > 1).then_some(g),
                source,
            })?;
            let timeout = members
                .iter()
                .map(|&i| streams[i].pipeline.config().timeout)
                .max()
                .unwrap_or(Duration::MAX);
            groups.push(Group {
                at_start: (0, 0),
                retired: false,
                streak: 0,
                hold_until: None,
                down: None,
                progress: 0,
                host_at_progress: 0,
                timeout,
                last_done: 0,
                longest_frame: 0,
                last_dispatch: None,
                scheduler,
                oldest: vec![None; members.len()],
                members,
            });
        }
        let waiter = if groups.len() > 1 && streams.iter().all(|s| s.pipeline.interrupt().is_some())
        {
            let mut waiter = Waiter::new()?;
            for (i, s) in streams.iter().enumerate() {
                if let Some(fd) = s.pipeline.interrupt() {
                    waiter.add(fd, i as u64)?;
                }
            }
            Some(waiter)
        } else {
            None
        };
        let states = streams
            .into_iter()
            .enumerate()
            .map(|(i, stream)| {
                let group = device_of[i];
                State {
                    queue: ArrivalQueue::new(stream.arrivals),
                    stream,
                    group,
                    dispatched: VecDeque::with_capacity(1024),
                    latency: histogram(),
                    frames: 0,
                    failed: 0,
                    lost: 0,
                    max_wait: 0,
                    max_head_wait: 0,
                    last_dispatch: 0,
                }
            })
            .collect();
        Ok(Streams {
            groups,
            states,
            in_flight,
            waiter,
            timeline: VecDeque::new(),
            timeline_capacity: 0,
            faults: Vec::new(),
            pending_fault: None,
            recovery: Recovery::default(),
            host_ns: 0,
        })
    }

    /// Treats devices that keep failing by `recovery` instead of [`Recovery::default`].
    ///
    /// # Errors
    /// [`crate::Error::Streams`] ([`Error::Recovery`], [`Error::Backoff`]) for a limit of 0 or
    /// a back-off of 0 or longer than its maximum.
    pub fn with_recovery(mut self, recovery: Recovery) -> Result<Streams, crate::Error> {
        if recovery.max_faults == 0 || recovery.max_resets == 0 {
            return Err(Error::Recovery {
                max_faults: recovery.max_faults,
                max_resets: recovery.max_resets,
            }
            .into());
        }
        if recovery.backoff.is_zero() || recovery.backoff > recovery.max_backoff {
            return Err(Error::Backoff {
                backoff: recovery.backoff,
                max_backoff: recovery.max_backoff,
            }
            .into());
        }
        self.recovery = recovery;
        Ok(self)
    }

    /// Keeps the last `frames` frames of each run in a timeline ([`Streams::timeline`]),
    /// allocated here once: recording allocates nothing. 0 (the default) records none; at
    /// most [`MAX_TIMELINE`].
    #[must_use]
    pub fn with_timeline(mut self, frames: usize) -> Streams {
        let frames = frames.min(MAX_TIMELINE);
        self.timeline = VecDeque::with_capacity(frames);
        self.timeline_capacity = frames;
        self
    }

    /// The last run's frames (the last [`Streams::with_timeline`] of them), in the order
    /// their results were handed over.
    pub fn timeline(&self) -> impl Iterator<Item = &FrameSpan> + '_ {
        self.timeline.iter()
    }

    /// The last run's latencies of `stream`, from arrival to the result handed over, in ns.
    ///
    /// # Panics
    /// For a stream that is not one of these.
    pub fn latency(&self, stream: StreamId) -> &hdrhistogram::Histogram<u64> {
        &self.states[stream.0].latency
    }

    /// The devices' schedulers (their switch counts, their policy), in the order of
    /// [`RunReport::devices`].
    pub fn schedulers(&self) -> impl Iterator<Item = &Scheduler> + '_ {
        self.groups.iter().map(|g| &g.scheduler)
    }

    /// Which device (index into [`RunReport::devices`]) `stream` runs on.
    ///
    /// # Panics
    /// For a stream that is not one of these.
    pub fn device_of(&self, stream: StreamId) -> usize {
        self.states[stream.0].group
    }

    /// Runs for `duration`: frames arrive, each device's scheduler picks whenever the device
    /// can take a frame, `preprocess(stream, frame, input)` fills each dispatched frame's
    /// input, `postprocess(stream, finished)` gets each result; then the frames in flight
    /// are drained. Returns what each stream and each device did in this run (the counts
    /// start again at every run).
    ///
    /// A device that fails mid-run (its pipeline's wait times out, its queue protocol breaks,
    /// it is removed) does not end the run: it is reset (unless removed), every pipeline on it
    /// takes its slots back and reopens its queues ([`Pipeline::reclaim`]), the frames that
    /// were in flight there are counted as lost, and the run goes on; a removed device's
    /// streams get no more frames while the other devices' go on. A device that keeps
    /// failing is treated by the [`Recovery`] policy ([`Streams::with_recovery`]): a reset
    /// that fails is tried again after a back-off (the device gets no frames meanwhile),
    /// faults in a row hold its frames back for a growing back-off, and past the policy's
    /// limits the device is quarantined: its streams get no more frames, the others go on.
    /// Each fault is in [`RunReport::faults`].
    ///
    /// # Errors
    /// What the pipelines return that is not a device fault, and what `preprocess` returns.
    pub fn run(
        &mut self,
        duration: Duration,
        mut preprocess: impl FnMut(StreamId, u64, &Input<'_>) -> Result<(), crate::Error>,
        mut postprocess: impl FnMut(StreamId, Finished<'_>),
    ) -> Result<RunReport, crate::Error> {
        let start = Instant::now();
        let end = nanos(duration);
        // Nothing here allocates: a run's steady state allocates nothing.
        for g in &mut self.groups {
            g.at_start = (g.scheduler.switches(), g.scheduler.decisions());
            (g.last_done, g.longest_frame, g.last_dispatch) = (0, 0, None);
        }
        for s in &mut self.states {
            s.queue.restart();
            s.latency.reset();
            (s.frames, s.failed, s.lost, s.max_wait) = (0, 0, 0, 0);
            (s.max_head_wait, s.last_dispatch) = (0, 0);
        }
        self.timeline.clear();
        self.faults.clear();
        let mut closed = false;
        loop {
            let now = nanos(start.elapsed());
            let open = now < end;
            if !open && !closed {
                // Periodic frames due before the window closed count as arrived even when the
                // loop was waiting on a device then: they are left waiting (busy: an
                // as-fast-as-possible stream gets no frame after the close).
                closed = true;
                for s in &mut self.states {
                    s.queue.arrive(end.saturating_sub(1), true);
                }
                // No more tries: a reset under way is waited for, and a device whose reset
                // failed is quarantined, its frames in flight lost.
                for g in 0..self.groups.len() {
                    self.away(|this| this.finish_reset(g, start, &mut postprocess))?;
                    if let Some(fault) = self.groups[g].down.as_ref().map(|d| d.fault) {
                        self.quarantine(g, fault, start);
                    }
                }
            }
            if open {
                self.away(|this| this.poll_resets(start, &mut postprocess))?;
                self.arrive(now);
                let dispatched = self.dispatch(now, start, &mut preprocess)?;
                if let Some((g, err)) = self.pending_fault.take() {
                    self.recover(g, err, start, &mut postprocess)?;
                    continue;
                }
                if dispatched {
                    continue;
                }
            }
            // Frames on devices that answer (a device whose reset failed keeps its frames
            // until it is reset or quarantined).
            let busy: usize = (0..self.states.len())
                .filter(|&i| self.reapable(i))
                .map(|i| self.states[i].dispatched.len())
                .sum();
            if busy == 0 {
                if !open {
                    break;
                }
                // Nothing on any device: sleep until the next arrival, back-off's end or
                // reset's retry (or a little).
                let next = self.next_wake(start).unwrap_or(now + 100_000).min(end);
                if next > now {
                    std::thread::sleep(Duration::from_nanos(next - now));
                }
                continue;
            }
            if self.waiter.is_none() {
                // One device (or pipelines without an interrupt to sleep on together): wait
                // for the oldest frame on the devices (its device can take nothing more until
                // one finishes, or it would have been given it above).
                let oldest = (0..self.states.len())
                    .filter(|&i| self.reapable(i))
                    .min_by_key(|&i| self.states[i].dispatched[0].1)
                    .expect("busy > 0");
                self.reap_or_recover(oldest, start, true, &mut postprocess)?;
            } else {
                // Several devices: sleep on every busy pipeline until one finishes or a frame
                // arrives for a device that could take it.
                // Or until a device is overdue.
                let wake = if open { self.next_wake(start) } else { None };
                let wake = wake.into_iter().chain(self.deadlines()).min();
                let left = wake.map_or(MAX_SLEEP, |w| {
                    Duration::from_nanos(w.saturating_sub(nanos(start.elapsed())))
                });
                self.sleep_any(left.min(MAX_SLEEP))?;
            }
            for i in 0..self.states.len() {
                if self.reapable(i) {
                    self.reap_or_recover(i, start, false, &mut postprocess)?;
                }
            }
            if self.waiter.is_some() {
                self.recover_overdue(start, &mut postprocess)?;
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        let devices: Vec<DeviceReport> = self
            .groups
            .iter()
            .map(|g| (g, g.at_start))
            .map(|(g, (s0, d0))| DeviceReport {
                streams: g
                    .members
                    .iter()
                    .map(|&i| self.states[i].stream.spec.name.clone())
                    .collect(),
                switches: g.scheduler.switches() - s0,
                decisions: g.scheduler.decisions() - d0,
                longest_frame_ns: g.longest_frame,
            })
            .collect();
        Ok(RunReport {
            policy: *self.groups[0].scheduler.policy(),
            seconds,
            streams: self
                .states
                .iter()
                .map(|s| StreamReport {
                    name: s.stream.spec.name.clone(),
                    device: s.group,
                    arrived: s.queue.arrived(),
                    frames: s.frames,
                    failed: s.failed,
                    dropped: s.queue.dropped(),
                    fps: s.frames as f64 / seconds.max(1e-9),
                    latency_mean_ns: s.latency.mean(),
                    latency_p50_ns: s.latency.value_at_quantile(0.5),
                    latency_p99_ns: s.latency.value_at_quantile(0.99),
                    latency_max_ns: s.latency.max(),
                    max_wait_ns: s.max_wait,
                    max_head_wait_ns: s.max_head_wait,
                    left_waiting: s.queue.len() as u64,
                    lost: s.lost,
                })
                .collect(),
            switches: devices.iter().map(|d| d.switches).sum(),
            decisions: devices.iter().map(|d| d.decisions).sum(),
            devices,
            faults: std::mem::take(&mut self.faults),
        })
    }

    /// [`Streams::reap`], recovering stream `i`'s device if it failed.
    fn reap_or_recover(
        &mut self,
        i: usize,
        start: Instant,
        block: bool,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        match self.reap(i, start, block, postprocess) {
            Err(err) if is_device_fault(&err) => {
                let g = self.states[i].group;
                self.recover(g, err, start, postprocess)
            }
            other => other,
        }
    }

    /// Answers device group `g`'s fault `err` (see [`Streams::run`] and [`Recovery`]): a
    /// removed device's pipelines take their slots back and its streams stop; any other is
    /// reset ([`Streams::start_reset`]).
    fn recover(
        &mut self,
        g: usize,
        err: crate::Error,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        self.away(|this| this.recover_from(g, err, start, postprocess))
    }

    /// Runs `work` (recovering a device) and counts its time as time away from the devices
    /// (`host_ns`; `postprocess` inside it is counted once).
    fn away<R>(&mut self, work: impl FnOnce(&mut Self) -> R) -> R {
        let began = Instant::now();
        let before = self.host_ns;
        let result = work(self);
        let inside = self.host_ns - before;
        self.host_ns += nanos(began.elapsed()).saturating_sub(inside);
        result
    }

    /// [`Streams::recover`]'s work.
    fn recover_from(
        &mut self,
        g: usize,
        err: crate::Error,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        let at_ns = nanos(start.elapsed());
        let Some(&first) = self.groups[g].members.first() else {
            return Err(err);
        };
        let device = Arc::clone(self.states[first].stream.pipeline.device());
        let removed = userdma::device::Device::is_removed(device.as_ref());
        let group = &mut self.groups[g];
        group.streak = group.streak.saturating_add(1);
        group.hold_until = None;
        self.faults.push(FaultReport {
            device: g,
            at_ns,
            error: err.to_string(),
            code: err.code(),
            removed,
            finished: 0,
            lost: 0,
            recovery_ns: 0,
            resets: 0,
            reset_error: None,
            in_a_row: group.streak,
            held_ns: 0,
            quarantined: false,
        });
        let f = self.faults.len() - 1;
        if removed {
            self.groups[g].retired = true;
            self.reclaim(g, f, start, postprocess)?;
            self.faults[f].recovery_ns = nanos(start.elapsed()).saturating_sub(at_ns);
            return Ok(());
        }
        self.start_reset(g, f, start, postprocess)
    }

    /// Takes the resets that are done, starts those whose back-off is over.
    fn poll_resets(
        &mut self,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        let now = Instant::now();
        for g in 0..self.groups.len() {
            let Some(down) = &self.groups[g].down else {
                continue;
            };
            match &down.reset {
                Some(reset) if reset.is_finished() => self.finish_reset(g, start, postprocess)?,
                None if now >= down.retry_at => {
                    self.start_reset(g, down.fault, start, postprocess)?
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Resets device group `g` for fault `f` on a thread of its own ([`Down`]); the loop
    /// takes the outcome ([`Streams::finish_reset`]) when it is done. Where no thread can be
    /// started, the reset runs here.
    fn start_reset(
        &mut self,
        g: usize,
        f: usize,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        let first = self.groups[g].members[0];
        let device = Arc::clone(self.states[first].stream.pipeline.device());
        self.faults[f].resets += 1;
        let spawned = std::thread::Builder::new()
            .name("userdma-reset".into())
            .spawn({
                let device = Arc::clone(&device);
                move || userdma::device::Device::reset(device.as_ref())
            });
        let reset = spawned.ok();
        let inline = reset.is_none();
        self.groups[g].down = Some(Down {
            fault: f,
            reset,
            retry_at: Instant::now(),
        });
        if inline {
            let result = userdma::device::Device::reset(device.as_ref()).map_err(|e| e.to_string());
            self.reset_done(g, f, result, start, postprocess)?;
        }
        Ok(())
    }

    /// Waits for device group `g`'s reset under way, if any, and acts on its outcome.
    fn finish_reset(
        &mut self,
        g: usize,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        let Some(down) = self.groups[g].down.as_mut() else {
            return Ok(());
        };
        let Some(reset) = down.reset.take() else {
            return Ok(());
        };
        let f = down.fault;
        let result = match reset.join() {
            Ok(done) => done.map_err(|err| err.to_string()),
            Err(_) => Err("the reset panicked".to_string()),
        };
        self.reset_done(g, f, result, start, postprocess)
    }

    /// Acts on the outcome of device group `g`'s reset for fault `f`: every pipeline on it
    /// takes its slots back, delivering what finished and counting what was lost. A reset
    /// that failed leaves the frames in flight with their pipelines (the device may still
    /// write them) and is tried again after a back-off, up to [`Recovery::max_resets`] times;
    /// a device that comes back after its n-th fault in a row gets no frames for a back-off,
    /// and one at [`Recovery::max_faults`] (or that cannot be made to stop its queues or
    /// reopen them) is quarantined.
    fn reset_done(
        &mut self,
        g: usize,
        f: usize,
        result: Result<(), String>,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        if let Err(err) = result {
            self.faults[f].reset_error = Some(err);
            let tries = self.faults[f].resets;
            if tries >= self.recovery.max_resets {
                self.quarantine(g, f, start);
            } else {
                self.groups[g].down = Some(Down {
                    fault: f,
                    reset: None,
                    retry_at: Instant::now() + self.recovery.backoff(tries - 1),
                });
            }
            return Ok(());
        }
        self.groups[g].down = None;
        if let Err(err) = self.reclaim(g, f, start, postprocess) {
            // A queue the device would not stop (its slots are leaked, never freed under it)
            // or queues that would not open again: nothing more to try.
            self.faults[f].reset_error = Some(format!("after the reset: {err}"));
            self.quarantine(g, f, start);
            return Ok(());
        }
        let streak = self.groups[g].streak;
        if streak >= self.recovery.max_faults {
            self.quarantine(g, f, start);
            return Ok(());
        }
        if streak >= 2 {
            let hold = self.recovery.backoff(streak - 2);
            self.groups[g].hold_until = Some(Instant::now() + hold);
            self.faults[f].held_ns = nanos(hold);
        }
        self.faults[f].recovery_ns = nanos(start.elapsed()).saturating_sub(self.faults[f].at_ns);
        Ok(())
    }

    /// Every pipeline on device group `g` (reset or removed) takes its slots back: what
    /// finished is delivered, what was in flight counted lost, both in fault `f`.
    fn reclaim(
        &mut self,
        g: usize,
        f: usize,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        for k in 0..self.groups[g].members.len() {
            let i = self.groups[g].members[k];
            let before = self.states[i].frames;
            let took = self.take_finished(i, start, postprocess, false, |pipeline, each| {
                pipeline.reclaim(each)
            });
            self.faults[f].finished += self.states[i].frames - before;
            took?;
            // What is still listed as dispatched never finished.
            let s = &mut self.states[i];
            let gone = s.dispatched.len() as u64;
            s.dispatched.clear();
            s.lost += gone;
            self.faults[f].lost += gone;
        }
        Ok(())
    }

    /// Takes device group `g` out of the run (fault `f`): its streams get no more frames, the
    /// frames still in flight on it are lost. Their slots stay with the pipelines, which
    /// free them only once the device is stopped (or leak them: [`userdma::ring::leaks`]).
    fn quarantine(&mut self, g: usize, f: usize, start: Instant) {
        let group = &mut self.groups[g];
        group.retired = true;
        group.down = None;
        group.hold_until = None;
        for k in 0..self.groups[g].members.len() {
            let s = &mut self.states[self.groups[g].members[k]];
            let gone = s.dispatched.len() as u64;
            s.dispatched.clear();
            s.lost += gone;
            self.faults[f].lost += gone;
        }
        let fault = &mut self.faults[f];
        fault.quarantined = true;
        fault.recovery_ns = nanos(start.elapsed()).saturating_sub(fault.at_ns);
    }

    /// When each busy device that answers is overdue (its last progress plus its timeout), in
    /// ns from the run's start.
    fn deadlines(&self) -> impl Iterator<Item = Nanos> + '_ {
        (0..self.groups.len())
            .filter(|&g| self.groups[g].down.is_none() && self.busy(g) > 0)
            .map(|g| {
                let group = &self.groups[g];
                let away = self.host_ns - group.host_at_progress;
                group
                    .progress
                    .saturating_add(nanos(group.timeout))
                    .saturating_add(away)
            })
    }

    /// Treats each busy device that showed no progress for its timeout as stuck (what a
    /// pipeline's own wait reports on one device: [`Pipeline::overdue`]), with several devices,
    /// where the loop sleeps on all of them instead of waiting on one.
    fn recover_overdue(
        &mut self,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        for g in 0..self.groups.len() {
            let now = nanos(start.elapsed());
            let group = &self.groups[g];
            let away = self.host_ns - group.host_at_progress;
            let silent = now.saturating_sub(group.progress).saturating_sub(away);
            if group.down.is_some() || self.busy(g) == 0 || silent < nanos(group.timeout) {
                continue;
            }
            // The member whose frame went first.
            let Some(i) = group
                .members
                .iter()
                .copied()
                .filter(|&i| !self.states[i].dispatched.is_empty())
                .min_by_key(|&i| self.states[i].dispatched[0].1)
            else {
                continue;
            };
            let err = self.states[i]
                .stream
                .pipeline
                .overdue(Duration::from_nanos(silent));
            self.recover(g, err, start, postprocess)?;
        }
        Ok(())
    }

    /// Whether stream `i` has frames in flight on a device that answers (not one whose reset
    /// failed and waits to be tried again).
    fn reapable(&self, i: usize) -> bool {
        let s = &self.states[i];
        !s.dispatched.is_empty() && self.groups[s.group].down.is_none()
    }

    /// Frames arriving up to `now`.
    fn arrive(&mut self, now: Nanos) {
        for s in &mut self.states {
            s.queue.arrive(now, !s.dispatched.is_empty());
        }
    }

    /// When the loop has something to do next without a completion: a periodic frame
    /// arriving for a device with room for it, a device's back-off ending, a failed reset's
    /// next try; in ns from `start`.
    fn next_wake(&self, start: Instant) -> Option<Nanos> {
        let now = Instant::now();
        let at = |t: Instant| nanos(t.saturating_duration_since(start));
        let arrival = self
            .states
            .iter()
            .filter(|s| self.groups[s.group].takes_frames(now))
            .filter(|s| self.busy(s.group) < self.in_flight)
            .filter_map(|s| s.queue.next_arrival());
        let device = self.groups.iter().filter(|g| !g.retired).filter_map(|g| {
            match &g.down {
                Some(Down { reset: Some(_), .. }) => Some(now + RESET_POLL),
                Some(down) => Some(down.retry_at),
                None => g.hold_until.filter(|&t| t > now),
            }
            .map(at)
        });
        arrival.chain(device).min()
    }

    /// Frames in flight on device group `g`.
    fn busy(&self, g: usize) -> usize {
        self.groups[g]
            .members
            .iter()
            .map(|&i| self.states[i].dispatched.len())
            .sum()
    }

    /// Gives each device with room a frame, if its scheduler picks one. Returns whether any
    /// was dispatched.
    fn dispatch(
        &mut self,
        now: Nanos,
        start: Instant,
        preprocess: &mut impl FnMut(StreamId, u64, &Input<'_>) -> Result<(), crate::Error>,
    ) -> Result<bool, crate::Error> {
        let mut any = false;
        let clock = Instant::now();
        for g in 0..self.groups.len() {
            if !self.groups[g].takes_frames(clock) || self.busy(g) >= self.in_flight {
                continue;
            }
            let idle = self.busy(g) == 0;
            let group = &mut self.groups[g];
            for (o, &i) in group.oldest.iter_mut().zip(&group.members) {
                *o = self.states[i].queue.oldest();
            }
            let Some(d) = group.scheduler.decide(now, &group.oldest) else {
                continue;
            };
            let i = group.members[d.stream.0];
            // The device's progress, if it was idle: from here (an earlier device's
            // `preprocess` in this pass is behind), with this frame's `preprocess` away.
            let (at, host_before) = (nanos(start.elapsed()), self.host_ns);
            let host = &mut self.host_ns;
            let s = &mut self.states[i];
            let arrival = s.queue.take().unwrap_or(now);
            let submitted = match s.stream.pipeline.try_submit(|n, input| {
                let began = Instant::now();
                let filled = preprocess(StreamId(i), n, input);
                *host += nanos(began.elapsed());
                filled
            }) {
                Err(err) if is_device_fault(&err) => {
                    s.queue.put_back(arrival);
                    self.pending_fault = Some((g, err));
                    return Ok(any);
                }
                other => other?,
            };
            if submitted.is_some() {
                if let Err(err) = s.stream.pipeline.flush() {
                    if !is_device_fault(&err) {
                        return Err(err);
                    }
                    // The frame went into the queue: it is in flight (and lost with the rest).
                    s.dispatched.push_back((arrival, now));
                    self.pending_fault = Some((g, err));
                    return Ok(true);
                }
                s.max_wait = s.max_wait.max(now.saturating_sub(arrival));
                // As the bounds count it: from when it became its stream's oldest waiting
                // frame (its arrival, or its stream's previous dispatch if that is later).
                let head = arrival.max(s.last_dispatch);
                s.max_head_wait = s.max_head_wait.max(now.saturating_sub(head));
                s.last_dispatch = now;
                // The device's previous frame held it until this one could go, if this one was
                // waiting when that one finished: from that dispatch to this one, its
                // postprocess and the loop's own turn included, as this frame's wait saw it.
                let group = &mut self.groups[g];
                if let Some(prev) = group.last_dispatch {
                    if head <= group.last_done && group.last_done >= prev {
                        group.longest_frame = group.longest_frame.max(now.saturating_sub(prev));
                    }
                }
                group.last_dispatch = Some(now);
                s.dispatched.push_back((arrival, now));
                if idle {
                    self.groups[g].progress = at;
                    self.groups[g].host_at_progress = host_before;
                }
                any = true;
            } else {
                // Its pipeline is full (depth below in_flight): the frame waits again.
                s.queue.put_back(arrival);
            }
        }
        Ok(any)
    }

    /// Sleeps until a busy pipeline has a completion, or `timeout` passes.
    fn sleep_any(&mut self, timeout: Duration) -> Result<(), crate::Error> {
        let groups = &self.groups;
        let busy = |s: &State| !s.dispatched.is_empty() && groups[s.group].down.is_none();
        if self
            .states
            .iter()
            .any(|s| busy(s) && s.stream.pipeline.finishing())
        {
            std::thread::yield_now();
            return Ok(());
        }
        let mut ready = false;
        for s in self.states.iter_mut().filter(|s| busy(s)) {
            // A completion that came in while arming: no need to sleep.
            let Some(queue) = s.stream.pipeline.waitable() else {
                // No queues (its device was removed): nothing to sleep on.
                ready = true;
                break;
            };
            if queue.arm_interrupt()? {
                ready = true;
                break;
            }
        }
        let slept = match (&mut self.waiter, ready) {
            (Some(waiter), false) => waiter.wait(Some(timeout)).map(|_| ()),
            _ => Ok(()),
        };
        for s in self.states.iter_mut().filter(|s| busy(s)) {
            if let Some(queue) = s.stream.pipeline.waitable() {
                queue.disarm_interrupt();
            }
        }
        slept.map_err(crate::Error::from)
    }

    /// Hands stream `i`'s finished frames to `postprocess` (waiting for one if `block`).
    fn reap(
        &mut self,
        i: usize,
        start: Instant,
        block: bool,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        if self.states[i].dispatched.is_empty() {
            return Ok(());
        }
        self.take_finished(i, start, postprocess, true, |pipeline, each| {
            if block {
                pipeline.wait(each).map(|_| ())
            } else {
                pipeline.poll(each).map(|_| ())
            }
        })
    }

    /// Runs `take` on stream `i`'s pipeline with a callback that records each finished frame
    /// (latency, counts, timeline) and hands it to `postprocess`. `answered`: the frames were
    /// finished by the device by itself (not handed back by a recovery), which ends its run
    /// of faults.
    fn take_finished<R>(
        &mut self,
        i: usize,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
        answered: bool,
        take: impl FnOnce(&mut Pipeline, &mut dyn FnMut(Finished<'_>)) -> Result<R, crate::Error>,
    ) -> Result<R, crate::Error> {
        let s = &mut self.states[i];
        let group = &mut self.groups[s.group];
        let dispatched = &mut s.dispatched;
        let latency = &mut s.latency;
        let (frames, failed) = (&mut s.frames, &mut s.failed);
        let timeline = &mut self.timeline;
        let capacity = self.timeline_capacity;
        let host = &mut self.host_ns;
        let device = s.group;
        let mut each = |done: Finished<'_>| {
            let (arrival, dispatch) = dispatched.pop_front().unwrap_or((0, 0));
            let now = nanos(start.elapsed());
            let _ = latency.record(now.saturating_sub(arrival).max(1));
            *frames += 1;
            let ok = done.result.is_ok();
            if !ok {
                *failed += 1;
            }
            if answered {
                group.streak = 0;
                group.progress = now;
                group.host_at_progress = *host;
                let held = now.saturating_sub(dispatch.max(group.last_done));
                group.longest_frame = group.longest_frame.max(held);
                group.last_done = now;
            }
            if capacity > 0 {
                if timeline.len() == capacity {
                    timeline.pop_front();
                }
                timeline.push_back(FrameSpan {
                    stream: StreamId(i),
                    device,
                    frame: done.frame,
                    arrival_ns: arrival,
                    dispatch_ns: dispatch,
                    done_ns: now,
                    ok,
                });
            }
            let began = Instant::now();
            postprocess(StreamId(i), done);
            *host += nanos(began.elapsed());
        };
        take(&mut s.stream.pipeline, &mut each)
    }

    /// Gives the streams back (to shut their pipelines down, read their counters).
    pub fn into_streams(self) -> Vec<Stream> {
        self.states.into_iter().map(|s| s.stream).collect()
    }
}

/// Whether `err` is a device fault a run recovers from: a wait that timed out (the device
/// stopped answering), the device breaking its protocol, or its removal.
fn is_device_fault(err: &crate::Error) -> bool {
    matches!(
        err.code(),
        userdma::Code::Timeout | userdma::Code::Device | userdma::Code::Removed
    )
}
