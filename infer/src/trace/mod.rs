//! Traces of a run that Perfetto's UI and `chrome://tracing` open: where a frame's time went,
//! op by op, on the device's own units.
//!
//! A [`Trace`] is a bounded ring of fixed-size [`Event`]s, allocated once by [`Trace::new`].
//! Pipelines ([`Pipeline::set_trace`](crate::pipeline::Pipeline::set_trace)) record one
//! [`Event::Op`] per completion they see and one [`Event::Frame`] per frame they hand to
//! postprocessing; streams ([`Streams::with_trace`](crate::sched::streams::Streams::with_trace)) add
//! each scheduler decision and each frame's wait from arrival to dispatch; recoveries add
//! [`Event::Fault`]s. A device that keeps activity records
//! ([`Accelerator::record_activity`]) is asked for them every [`DRAIN_EVERY`] while the run
//! goes on and once more at the end: what each unit ran and when, as the device timed it
//! ([`Event::Activity`]). Recording takes an uncontended lock and copies one event into the
//! ring: **no allocation** once the trace is built. When the ring is full the oldest event is
//! dropped and counted ([`Trace::dropped`]).
//!
//! [`Trace::save`] writes the Chrome trace-event JSON ([`chrome`]):
//!
//! - per device, a process with a track per **unit** (copy, compute: the device's activity
//!   records as slices named by what they did and the frame and stream they belong to, and
//!   context switches as instants carrying the SRAM refill that followed), a track per
//!   **queue** (each op from when it could start to when the host saw its completion: the
//!   host's view, for devices that keep no activity records), the **scheduler**'s decisions
//!   as instants, faults and recoveries as instants, and counters: frames in flight, each
//!   queue's depth, the SRAM hit rate per context, pool buffers out;
//! - a process of **streams**, a track per stream with each frame from its arrival (or its
//!   preprocessing) to its result;
//! - a process of the **host**'s own work, a track per [`Trace::track`] the program named,
//!   with its [`Event::Span`]s (a file's reads, a soak's bursts).
//!
//! Times are nanoseconds since the trace's epoch ([`Trace::epoch`]); device timestamps
//! (CLOCK_MONOTONIC) are put on the same clock with [`monotonic_ns`].
//!
//! ```
//! use userdma_infer::trace::{Event, OpSeen, OpStep, Trace};
//!
//! let trace = Trace::new(1024);
//! let stream = trace.stream("camera");
//! trace.record(Event::Op(OpSeen {
//!     device: 0, stream, frame: 0, queue: 0, command: 1, step: OpStep::ToDevice, status: 0,
//!     announced_ns: 1_000, done_ns: 5_000,
//! }));
//! let mut json = Vec::new();
//! let summary = trace.write_json(&mut json)?;
//! assert_eq!(summary.events, 1);
//! assert!(String::from_utf8(json).unwrap().contains("\"traceEvents\""));
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! | module | owns |
//! |---|---|
//! | this one | [`Trace`], [`Event`], [`OpSeen`], [`OpStep`], [`FaultKind`], recording and draining |
//! | [`chrome`] | the Chrome trace-event JSON: tracks, slices, instants, derived counters; [`Summary`] |

pub mod chrome;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::accel::{monotonic_ns, Accelerator, Activity, QueueSpec};
use userdma::pool::Pool;

pub use self::chrome::Summary;

/// How often a run's device activity records are drained into the trace (a device keeps a
/// bounded buffer of them).
pub const DRAIN_EVERY: Duration = Duration::from_millis(10);

/// Activity records a device is asked to keep per unit between two drains.
pub const DEVICE_RECORDS: u32 = 1 << 14;

/// The most events a trace holds ([`Trace::new`]): 16 Mi events, about 1 GiB.
pub const MAX_EVENTS: usize = 1 << 24;

/// Which op of a frame an [`Event::Op`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum OpStep {
    /// The input's copy to the device.
    ToDevice,
    /// Model step `n` (from 1, in the model's order).
    Step(u16),
    /// The result's copy to the host.
    ToHost,
    /// A wait for another queue (a split pipeline's order between units).
    Wait,
}

impl OpStep {
    /// A short name: `"to_device"`, `"step 3"`, `"to_host"`, `"wait"`.
    pub fn name(self) -> std::borrow::Cow<'static, str> {
        match self {
            OpStep::ToDevice => "to_device".into(),
            OpStep::Step(n) => format!("step {n}").into(),
            OpStep::ToHost => "to_host".into(),
            OpStep::Wait => "wait".into(),
        }
    }
}

/// What went wrong on a device, or what was done about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum FaultKind {
    /// A fault was detected (a timeout, a broken queue): `code` is the error's
    /// [`Code`](userdma::Code) number.
    Detected {
        /// The error's code.
        code: u32,
    },
    /// The device was reset.
    Reset,
    /// The device is gone.
    Removed,
    /// A recovery ended: `lost` frames were in flight and must be run again, `finished`
    /// were handed to postprocessing.
    Recovered {
        /// Frames lost.
        lost: u32,
        /// Frames that had finished.
        finished: u32,
    },
}

/// One op of a frame as the host saw it ([`Event::Op`]): announced to queue `queue` (its
/// doorbell) at `announced_ns`, its completion seen at `done_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpSeen {
    /// The device ([`Trace::device`]).
    pub device: u16,
    /// The stream ([`Trace::stream`]).
    pub stream: u32,
    /// The frame's number in its pipeline.
    pub frame: u64,
    /// The device's queue id.
    pub queue: u16,
    /// The device's command id (what matches its activity record).
    pub command: u16,
    /// Which op of the frame.
    pub step: OpStep,
    /// 0, or the device's status code.
    pub status: u32,
    /// Announced to the device.
    pub announced_ns: u64,
    /// Its completion seen.
    pub done_ns: u64,
}

/// One recorded event. Times are nanoseconds since the trace's epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event {
    /// One op of a frame as the host saw it.
    Op(OpSeen),
    /// A frame through a pipeline: preprocessing began, its ops were announced, its result
    /// was handed to postprocessing.
    Frame {
        /// The device.
        device: u16,
        /// The stream.
        stream: u32,
        /// The frame's number in its pipeline.
        frame: u64,
        /// Preprocessing began.
        preprocess_ns: u64,
        /// Announced to the device.
        submitted_ns: u64,
        /// Handed to postprocessing.
        done_ns: u64,
        /// It completed without error.
        ok: bool,
    },
    /// A stream's frame waited from its arrival to its dispatch.
    Waited {
        /// The device.
        device: u16,
        /// The stream.
        stream: u32,
        /// The frame's number in its pipeline.
        frame: u64,
        /// It arrived.
        arrived_ns: u64,
        /// The scheduler dispatched it.
        dispatched_ns: u64,
    },
    /// A scheduler decision: `stream`'s oldest frame goes next.
    Decision {
        /// The device.
        device: u16,
        /// The stream chosen.
        stream: u32,
        /// When.
        at_ns: u64,
        /// By the maximum-wait rule.
        forced: bool,
        /// The device switches context for it.
        switch: bool,
    },
    /// What a unit of the device ran, as the device timed it (times already on the trace's
    /// clock).
    Activity {
        /// The device.
        device: u16,
        /// The record.
        activity: Activity,
    },
    /// A pool's buffers out.
    PoolOut {
        /// The pool ([`Trace::pool`]).
        pool: u16,
        /// When.
        at_ns: u64,
        /// Buffers allocated and not yet freed.
        buffers: u64,
    },
    /// A span of the program's own work on one of its tracks ([`Trace::track`]): a file read,
    /// a transfer of a test, anything timed on the host.
    Span {
        /// The track.
        track: u16,
        /// The item's number (shown after the track's name).
        id: u64,
        /// It began.
        start_ns: u64,
        /// It ended.
        end_ns: u64,
        /// Bytes it moved (0: none).
        bytes: u64,
        /// It succeeded.
        ok: bool,
    },
    /// A fault or a step of its recovery.
    Fault {
        /// The device.
        device: u16,
        /// When.
        at_ns: u64,
        /// What.
        what: FaultKind,
    },
}

impl Event {
    /// When it happened (its start, for spans).
    pub fn at_ns(&self) -> u64 {
        match *self {
            Event::Op(op) => op.announced_ns,
            Event::Frame { preprocess_ns, .. } => preprocess_ns,
            Event::Waited { arrived_ns, .. } => arrived_ns,
            Event::Decision { at_ns, .. }
            | Event::PoolOut { at_ns, .. }
            | Event::Fault { at_ns, .. } => at_ns,
            Event::Activity { activity, .. } => activity.start_ns,
            Event::Span { start_ns, .. } => start_ns,
        }
    }
}

/// A device the trace knows.
#[derive(Debug)]
pub(crate) struct DeviceInfo {
    pub(crate) device: Arc<dyn Accelerator>,
    pub(crate) name: String,
    /// It keeps activity records for this trace.
    pub(crate) activity: bool,
    /// Why not, when it does not.
    pub(crate) no_activity: Option<String>,
    /// Its queues as pipelines opened them.
    pub(crate) queues: Vec<QueueSpec>,
}

/// Names and devices: written while runs are set up, read by the drain and the export.
#[derive(Debug, Default)]
pub(crate) struct Names {
    pub(crate) devices: Vec<DeviceInfo>,
    pub(crate) streams: Vec<String>,
    pub(crate) pools: Vec<Arc<Pool>>,
    /// The program's own tracks ([`Trace::track`]).
    pub(crate) tracks: Vec<String>,
}

/// The ring of events.
#[derive(Debug)]
struct Ring {
    events: Box<[Event]>,
    /// Index of the oldest event.
    head: usize,
    len: usize,
    dropped: u64,
    recorded: u64,
    /// Activity records the devices lost (overwritten before a drain) and refused as
    /// malformed.
    activity_lost: u64,
    activity_bad: u64,
    last_drain: Instant,
}

impl Ring {
    #[inline]
    fn push(&mut self, event: Event) {
        let capacity = self.events.len();
        let at = (self.head + self.len) % capacity;
        self.events[at] = event;
        if self.len == capacity {
            self.head = (self.head + 1) % capacity;
            self.dropped += 1;
        } else {
            self.len += 1;
        }
        self.recorded += 1;
    }
}

/// A bounded, preallocated trace of a run. See the module docs.
#[derive(Debug)]
pub struct Trace {
    epoch: Instant,
    epoch_mono: u64,
    ring: Mutex<Ring>,
    names: Mutex<Names>,
}

/// Locks `m`; a poisoned lock (a panic while recording) still holds whole events.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Trace {
    /// A trace holding up to `capacity` events (at least 1, at most [`MAX_EVENTS`]), its
    /// epoch now. An event is 64 bytes or less.
    pub fn new(capacity: usize) -> Arc<Trace> {
        let capacity = capacity.clamp(1, MAX_EVENTS);
        let epoch = Instant::now();
        let filler = Event::PoolOut {
            pool: 0,
            at_ns: 0,
            buffers: 0,
        };
        Arc::new(Trace {
            epoch,
            epoch_mono: monotonic_ns(epoch),
            ring: Mutex::new(Ring {
                events: vec![filler; capacity].into_boxed_slice(),
                head: 0,
                len: 0,
                dropped: 0,
                recorded: 0,
                activity_lost: 0,
                activity_bad: 0,
                last_drain: epoch,
            }),
            names: Mutex::new(Names::default()),
        })
    }

    /// The trace's time zero.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Nanoseconds from the epoch to `at` (0 before it).
    #[inline]
    pub fn ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The events it holds at most.
    pub fn capacity(&self) -> usize {
        lock(&self.ring).events.len()
    }

    /// Events dropped because the ring was full (the oldest go first).
    pub fn dropped(&self) -> u64 {
        lock(&self.ring).dropped
    }

    /// Records `event` (the oldest is dropped when the ring is full). Allocates nothing.
    #[inline]
    pub fn record(&self, event: Event) {
        lock(&self.ring).push(event);
    }

    /// The number of stream `name` (registering it the first time): what [`Event`]s name it
    /// by.
    pub fn stream(&self, name: &str) -> u32 {
        let mut names = lock(&self.names);
        if let Some(i) = names.streams.iter().position(|s| s == name) {
            return i as u32;
        }
        names.streams.push(name.to_owned());
        (names.streams.len() - 1) as u32
    }

    /// The number of the program's own track `name` (registering it the first time), for
    /// [`Event::Span`]s: in the exported trace a track of the `host` process.
    pub fn track(&self, name: &str) -> u16 {
        let mut names = lock(&self.names);
        if let Some(i) = names.tracks.iter().position(|s| s == name) {
            return i as u16;
        }
        names.tracks.push(name.to_owned());
        (names.tracks.len() - 1) as u16
    }

    /// The number of `device` (registering it the first time, by its
    /// [`key`](Accelerator::key)), and asks it to keep activity records for the trace. A
    /// device that cannot is traced from the host's side only (its queue tracks), and the
    /// export says why.
    pub fn device(&self, device: &Arc<dyn Accelerator>) -> u16 {
        let mut names = lock(&self.names);
        let key = device.key();
        if let Some(i) = names.devices.iter().position(|d| d.device.key() == key) {
            return i as u16;
        }
        let (activity, no_activity) = match device.record_activity(DEVICE_RECORDS) {
            Ok(()) => (true, None),
            Err(e) => (false, Some(e.to_string())),
        };
        names.devices.push(DeviceInfo {
            device: Arc::clone(device),
            name: device.identity(),
            activity,
            no_activity,
            queues: Vec::new(),
        });
        (names.devices.len() - 1) as u16
    }

    /// Notes that `queue` of `device` was opened as `spec` (named on its track).
    pub fn queue(&self, device: u16, spec: QueueSpec) {
        let mut names = lock(&self.names);
        if let Some(d) = names.devices.get_mut(usize::from(device)) {
            if let Some(q) = d.queues.iter_mut().find(|q| q.id == spec.id) {
                *q = spec;
            } else {
                d.queues.push(spec);
            }
        }
    }

    /// The number of `pool` (registering it the first time): its buffers out are sampled
    /// with each drain.
    pub fn pool(&self, pool: &Arc<Pool>) -> u16 {
        let mut names = lock(&self.names);
        if let Some(i) = names.pools.iter().position(|p| Arc::ptr_eq(p, pool)) {
            return i as u16;
        }
        names.pools.push(Arc::clone(pool));
        (names.pools.len() - 1) as u16
    }

    /// Drains the devices' activity records if [`DRAIN_EVERY`] passed since the last drain
    /// (what a run calls once per frame). Allocates nothing.
    #[inline]
    pub fn tick(&self) {
        let now = Instant::now();
        let due = {
            let ring = lock(&self.ring);
            now.saturating_duration_since(ring.last_drain) >= DRAIN_EVERY
        };
        if due {
            self.drain_at(now);
        }
    }

    /// Drains every device's activity records into the trace now, and samples the pools.
    pub fn drain(&self) {
        self.drain_at(Instant::now());
    }

    fn drain_at(&self, now: Instant) {
        let names = lock(&self.names);
        let mut ring = lock(&self.ring);
        ring.last_drain = now;
        let at_ns = self.ns(now);
        for (i, pool) in names.pools.iter().enumerate() {
            ring.push(Event::PoolOut {
                pool: i as u16,
                at_ns,
                buffers: pool.buffers_out(),
            });
        }
        let epoch_mono = self.epoch_mono;
        for (i, d) in names.devices.iter().enumerate().filter(|(_, d)| d.activity) {
            let device = i as u16;
            let ring = &mut *ring;
            let drained = d.device.drain_activity(&mut |a: &Activity| {
                let mut activity = *a;
                activity.start_ns = activity.start_ns.saturating_sub(epoch_mono);
                activity.end_ns = activity.end_ns.saturating_sub(epoch_mono);
                ring.push(Event::Activity { device, activity });
            });
            if let Ok(drained) = drained {
                ring.activity_lost += drained.lost;
                ring.activity_bad += drained.bad;
            }
        }
    }

    /// Drains what the devices still hold and stops their activity records (the trace is
    /// complete). Recording goes on being possible; the devices keep no more records.
    pub fn finish(&self) {
        self.drain();
        let mut names = lock(&self.names);
        for d in names.devices.iter_mut().filter(|d| d.activity) {
            d.device.stop_activity();
            d.activity = false;
        }
    }

    /// The events held, oldest first.
    pub fn events(&self) -> Vec<Event> {
        let ring = lock(&self.ring);
        let capacity = ring.events.len();
        (0..ring.len)
            .map(|i| ring.events[(ring.head + i) % capacity])
            .collect()
    }

    /// Writes the trace as Chrome trace-event JSON (see [`chrome`]) after
    /// [`finishing`](Trace::finish) it.
    ///
    /// # Errors
    /// What writing to `out` fails with.
    pub fn write_json(&self, out: &mut dyn std::io::Write) -> std::io::Result<Summary> {
        self.finish();
        let events = self.events();
        let (dropped, recorded, lost, bad) = {
            let ring = lock(&self.ring);
            (
                ring.dropped,
                ring.recorded,
                ring.activity_lost,
                ring.activity_bad,
            )
        };
        let names = lock(&self.names);
        chrome::write(
            out,
            &chrome::Input {
                events: &events,
                names: &names,
                dropped,
                recorded,
                activity_lost: lost,
                activity_bad: bad,
            },
        )
    }

    /// Writes the trace to the file at `path` ([`Trace::write_json`]).
    ///
    /// # Errors
    /// The file cannot be created or written; the message names it.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<Summary, crate::Error> {
        let path = path.as_ref();
        let io = |e: std::io::Error| crate::Error::Trace {
            path: path.to_path_buf(),
            error: e,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut out = std::io::BufWriter::new(file);
        let summary = self.write_json(&mut out).map_err(io)?;
        std::io::Write::flush(&mut out).map_err(io)?;
        Ok(summary)
    }
}
