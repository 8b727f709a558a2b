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
//! Streams may run on several devices, of one kind or of several (any
//! [`Accelerator`](crate::accel::Accelerator); several loopback devices stand in for a machine
//! with several NPUs): the streams whose pipelines share a device share that device's scheduler,
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
use std::time::{Duration, Instant};

use super::{Nanos, Policy, Scheduler, StreamId, StreamSpec};
use crate::pipeline::Pipeline;
use userdma::irq::Waiter;

mod arrivals;
mod dispatch;
mod error;
mod reap;
mod recovery;
mod report;
mod run;

pub use self::arrivals::{ArrivalQueue, Arrivals, MAX_WAITING};
pub use self::error::Error;
pub use self::recovery::Recovery;
pub use self::report::{DeviceReport, FaultReport, FrameSpan, RunReport, StreamReport};

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
    reset: Option<recovery::Resetting>,
    /// With no reset running: when the next one starts.
    retry_at: Instant,
}

impl Group {
    /// Whether the scheduler may give the device a frame at `now`.
    #[inline]
    fn takes_frames(&self, now: Instant) -> bool {
        !self.retired && self.down.is_none() && self.hold_until.is_none_or(|t| now >= t)
    }
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
    /// Where decisions, waits and faults are recorded ([`Streams::with_trace`]).
    trace: Option<Tracing>,
}

/// A run's trace: the trace, and how it numbers each group's device and each stream.
#[derive(Debug)]
struct Tracing {
    trace: std::sync::Arc<crate::trace::Trace>,
    devices: Vec<u16>,
    streams: Vec<u32>,
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

#[inline]
fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

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
        let mut devices: Vec<usize> = Vec::new();
        for s in &streams {
            let d = s.pipeline.device().key();
            let g = match devices.iter().position(|&o| o == d) {
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
        // Several devices: one waiter over every interrupt there is; a pipeline without one
        // (a polled engine) is polled between short sleeps on it (`sleep_any`), so no device
        // paces another.
        let waiter = if groups.len() > 1 {
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
            trace: None,
        })
    }

    /// Records every run into `trace`: each pipeline's ops and frames
    /// ([`Pipeline::set_trace`], each stream under its name), each scheduler decision, each
    /// frame's wait from arrival to dispatch, and faults and recoveries. Recording allocates
    /// nothing.
    #[must_use]
    pub fn with_trace(mut self, trace: std::sync::Arc<crate::trace::Trace>) -> Streams {
        let mut devices = vec![0u16; self.groups.len()];
        let mut streams = Vec::with_capacity(self.states.len());
        for s in &mut self.states {
            let number = trace.stream(&s.stream.spec.name);
            s.stream
                .pipeline
                .set_trace(std::sync::Arc::clone(&trace), number);
            devices[s.group] = trace.device(s.stream.pipeline.device());
            streams.push(number);
        }
        self.trace = Some(Tracing {
            trace,
            devices,
            streams,
        });
        self
    }

    /// Records a fault or a recovery step of group `g`'s device.
    pub(super) fn trace_fault(&self, g: usize, what: crate::trace::FaultKind) {
        if let Some(t) = &self.trace {
            t.trace.record(crate::trace::Event::Fault {
                device: t.devices[g],
                at_ns: t.trace.ns(Instant::now()),
                what,
            });
        }
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

    /// Gives the streams back (to shut their pipelines down, read their counters).
    pub fn into_streams(self) -> Vec<Stream> {
        self.states.into_iter().map(|s| s.stream).collect()
    }
}
