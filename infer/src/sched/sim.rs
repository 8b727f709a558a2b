//! A discrete-event simulator of streams on one non-preemptive device, to check a
//! [`Scheduler`] against its stated bounds. Pure and deterministic: the same scheduler, loads
//! and parameters give the same [`Report`].
//!
//! Each stream has an arrival process ([`Arrivals`]: periodic at a rate, as fast as possible
//! with a bounded number of frames in the system, or an explicit trace) and a service time
//! (one frame's device time). The device takes one frame at a time: whenever it is free and a
//! frame waits, the simulator asks [`Scheduler::decide`] at the current simulated time,
//! dispatches the oldest frame of the stream it names and runs it for the stream's service
//! time, plus the switch cost when the frame's context differs from the device's previous
//! one. The device keeps its own last context and counts its own switches, so a test can
//! compare them with [`Scheduler::switches`].
//!
//! ```
//! use userdma_infer::sched::sim::{self, Arrivals, Load};
//! use userdma_infer::sched::{Policy, Scheduler, StreamId, StreamSpec};
//!
//! const MS: u64 = 1_000_000;
//! let streams = vec![StreamSpec::new("live", 1, 0), StreamSpec::new("playback", 0, 1)];
//! let mut s = Scheduler::new(Policy::Batch { k: 4 }, streams)?;
//! let loads = [
//!     Load { arrivals: Arrivals::Periodic { period: 40 * MS, offset: 0 }, service: 18 * MS },
//!     Load { arrivals: Arrivals::Saturating { in_flight: 1 }, service: 18 * MS },
//! ];
//! let report = sim::run(&mut s, &loads, MS, 10_000 * MS)?;
//! assert_eq!(report.switches, s.switches());
//! assert!(report.fps(StreamId(0)) > 24.5); // 250 frames in 10 s, the last may still wait
//! let bound = s.wait_bound(StreamId(0), &[18 * MS, 18 * MS], MS).unwrap();
//! assert!(report.streams[0].max_wait <= bound);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::VecDeque;

use super::{Nanos, Scheduler, StreamId};

/// When a stream's frames arrive.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Arrivals {
    /// One frame every `period` nanoseconds, the first at `offset`.
    Periodic {
        /// Nanoseconds between frames (1 / rate).
        period: Nanos,
        /// The first frame's arrival.
        offset: Nanos,
    },
    /// As fast as possible: `in_flight` frames at time 0, and a new one each time one of the
    /// stream's frames completes (so `in_flight` are always waiting or on the device).
    Saturating {
        /// Frames of the stream in the system at any time.
        in_flight: u32,
    },
    /// Frames at these times (non-decreasing).
    Trace(Vec<Nanos>),
}

/// The most frames a saturating stream keeps in flight in the simulator (its queue is
/// preallocated to that many).
pub const MAX_IN_FLIGHT: u32 = 1 << 16;

/// One stream's load.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Load {
    /// Its arrival process.
    pub arrivals: Arrivals,
    /// One frame's device time.
    pub service: Nanos,
}

/// Why [`run`] refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Not one load per stream.
    #[error("{loads} loads for {streams} streams: give one load per stream, in stream order")]
    LoadCount {
        /// Loads given.
        loads: usize,
        /// Streams of the scheduler.
        streams: usize,
    },
    /// A periodic stream with period 0.
    #[error("stream {stream}: a period of 0 is infinitely many frames; give a positive period")]
    ZeroPeriod {
        /// The stream's index.
        stream: usize,
    },
    /// A saturating stream with no frame in flight.
    #[error(
        "stream {stream}: as fast as possible with 0 frames in flight runs nothing; use 1 or more"
    )]
    ZeroInFlight {
        /// The stream's index.
        stream: usize,
    },
    /// More frames kept in flight than the simulator holds.
    #[error("stream {stream}: {in_flight} frames in flight are more than the simulator holds ({MAX_IN_FLIGHT}); use fewer")]
    InFlight {
        /// The stream's index.
        stream: usize,
        /// The frames asked for.
        in_flight: u32,
    },
    /// A trace whose times go down.
    #[error("stream {stream}: trace time {index} is earlier than the one before; sort the trace")]
    UnsortedTrace {
        /// The stream's index.
        stream: usize,
        /// The first out-of-order entry.
        index: usize,
    },
}

/// One dispatched frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Frame {
    /// Its stream.
    pub stream: StreamId,
    /// When it arrived.
    pub arrival: Nanos,
    /// When it became its stream's oldest waiting frame (its arrival, or the dispatch of the
    /// stream's previous frame if later).
    pub head: Nanos,
    /// When the scheduler chose it.
    pub dispatch: Nanos,
    /// When the device finished it (switch and service).
    pub done: Nanos,
    /// The device switched context for it.
    pub switch: bool,
    /// Chosen by the maximum-wait rule.
    pub forced: bool,
}

impl Frame {
    /// Its wait as the [bounds](super#the-bounds) count it: from `head` to `dispatch`.
    pub fn wait(&self) -> Nanos {
        self.dispatch - self.head
    }

    /// From its arrival to its dispatch.
    pub fn arrival_wait(&self) -> Nanos {
        self.dispatch - self.arrival
    }

    /// From its arrival to its end on the device.
    pub fn latency(&self) -> Nanos {
        self.done - self.arrival
    }
}

/// One stream's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct StreamReport {
    /// Frames run.
    pub frames: u64,
    /// The longest [`Frame::wait`].
    pub max_wait: Nanos,
    /// The longest [`Frame::arrival_wait`].
    pub max_arrival_wait: Nanos,
    /// Mean [`Frame::latency`] (0 with no frames).
    pub mean_latency: Nanos,
    /// The longest [`Frame::latency`].
    pub max_latency: Nanos,
    /// How long its oldest frame still waiting at the end had waited (counted as
    /// [`Frame::wait`] is), if one was: a starved stream shows here.
    pub pending: Option<Nanos>,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Every dispatched frame, in dispatch order.
    pub frames: Vec<Frame>,
    /// Per stream, in stream order.
    pub streams: Vec<StreamReport>,
    /// Context switches the device made.
    pub switches: u64,
    /// Device time spent switching.
    pub switch_time: Nanos,
    /// Device time spent switching and serving.
    pub busy: Nanos,
    /// When the run ended: the first time the device was free at or after the horizon.
    pub end: Nanos,
    /// Times the scheduler returned no stream while frames waited, or a stream with none
    /// waiting (the run stops there). 0 for a correct scheduler.
    pub refused: u64,
}

impl Report {
    /// Frames per second of `stream` over the run (0 for an unknown stream).
    pub fn fps(&self, stream: StreamId) -> f64 {
        match self.streams.get(stream.0) {
            Some(s) if self.end > 0 => s.frames as f64 * 1e9 / self.end as f64,
            _ => 0.0,
        }
    }

    /// Context switches per second over the run.
    pub fn switches_per_sec(&self) -> f64 {
        if self.end == 0 {
            return 0.0;
        }
        self.switches as f64 * 1e9 / self.end as f64
    }
}

/// A stream's arrival state.
#[derive(Debug)]
struct Source<'a> {
    load: &'a Load,
    /// The next periodic arrival, or the next trace index.
    next: u64,
    waiting: VecDeque<Nanos>,
    last_dispatch: Option<Nanos>,
}

impl Source<'_> {
    /// The next arrival still to come, if it comes before `until`.
    fn upcoming(&self, until: Nanos) -> Option<Nanos> {
        let at = match &self.load.arrivals {
            Arrivals::Periodic { .. } => Some(self.next),
            Arrivals::Trace(times) => times.get(self.next as usize).copied(),
            Arrivals::Saturating { .. } => None,
        };
        at.filter(|&a| a < until)
    }

    /// Takes in every frame that has arrived by `t` (and before `until`).
    fn admit(&mut self, t: Nanos, until: Nanos) {
        while let Some(a) = self.upcoming(until).filter(|&a| a <= t) {
            self.waiting.push_back(a);
            self.next = match self.load.arrivals {
                Arrivals::Periodic { period, .. } => a.saturating_add(period),
                _ => self.next + 1,
            };
        }
    }
}

/// Runs `loads` (one per stream of `sched`, in order) on a device whose switches cost
/// `switch`, from time 0 until the device is first free at or after `until`.
///
/// # Errors
///
/// [`Error`] for a load count that does not match the streams, a period or `in_flight` of
/// 0, or an unsorted trace.
pub fn run(
    sched: &mut Scheduler,
    loads: &[Load],
    switch: Nanos,
    until: Nanos,
) -> Result<Report, Error> {
    let n = sched.streams().len();
    if loads.len() != n {
        return Err(Error::LoadCount {
            loads: loads.len(),
            streams: n,
        });
    }
    let mut sources = Vec::with_capacity(n);
    for (stream, load) in loads.iter().enumerate() {
        let mut source = Source {
            load,
            next: 0,
            waiting: VecDeque::new(),
            last_dispatch: None,
        };
        match &load.arrivals {
            Arrivals::Periodic { period: 0, .. } => return Err(Error::ZeroPeriod { stream }),
            Arrivals::Periodic { offset, .. } => source.next = *offset,
            Arrivals::Saturating { in_flight: 0 } => return Err(Error::ZeroInFlight { stream }),
            Arrivals::Saturating { in_flight } if *in_flight > MAX_IN_FLIGHT => {
                return Err(Error::InFlight {
                    stream,
                    in_flight: *in_flight,
                })
            }
            Arrivals::Saturating { in_flight } => {
                source.waiting.extend((0..*in_flight).map(|_| 0));
            }
            Arrivals::Trace(times) => {
                if let Some(index) = times.windows(2).position(|w| w[1] < w[0]) {
                    return Err(Error::UnsortedTrace {
                        stream,
                        index: index + 1,
                    });
                }
            }
        }
        sources.push(source);
    }
    let context: Vec<u32> = sched.streams().iter().map(|s| s.context).collect();
    let mut report = Report {
        frames: Vec::new(),
        streams: vec![StreamReport::default(); n],
        switches: 0,
        switch_time: 0,
        busy: 0,
        end: 0,
        refused: 0,
    };
    let mut latency_sum = vec![0u128; n];
    let mut oldest = vec![None; n];
    let mut device_context: Option<u32> = None;
    let mut t: Nanos = 0;
    while t < until {
        for s in &mut sources {
            s.admit(t, until);
        }
        for (o, s) in oldest.iter_mut().zip(&sources) {
            *o = s.waiting.front().copied();
        }
        if oldest.iter().all(Option::is_none) {
            // Idle until the next arrival.
            match sources.iter().filter_map(|s| s.upcoming(until)).min() {
                Some(next) => {
                    t = next;
                    continue;
                }
                None => break,
            }
        }
        let Some(d) = sched.decide(t, &oldest) else {
            report.refused += 1;
            break;
        };
        let i = d.stream.0;
        let Some(arrival) = sources.get_mut(i).and_then(|s| s.waiting.pop_front()) else {
            report.refused += 1;
            break;
        };
        let source = &mut sources[i];
        let head = source.last_dispatch.map_or(arrival, |l| l.max(arrival));
        source.last_dispatch = Some(t);
        let switched = device_context.is_some_and(|c| c != context[i]);
        device_context = Some(context[i]);
        let cost = if switched { switch } else { 0 };
        let done = t.saturating_add(cost).saturating_add(source.load.service);
        if switched {
            report.switches += 1;
            report.switch_time = report.switch_time.saturating_add(cost);
        }
        report.busy = report.busy.saturating_add(done - t);
        let frame = Frame {
            stream: d.stream,
            arrival,
            head,
            dispatch: t,
            done,
            switch: switched,
            forced: d.forced,
        };
        let r = &mut report.streams[i];
        r.frames += 1;
        r.max_wait = r.max_wait.max(frame.wait());
        r.max_arrival_wait = r.max_arrival_wait.max(frame.arrival_wait());
        r.max_latency = r.max_latency.max(frame.latency());
        latency_sum[i] += u128::from(frame.latency());
        report.frames.push(frame);
        if matches!(source.load.arrivals, Arrivals::Saturating { .. }) && done < until {
            source.waiting.push_back(done);
        }
        t = done;
    }
    report.end = t.max(until);
    for ((r, s), sum) in report.streams.iter_mut().zip(&sources).zip(latency_sum) {
        if r.frames > 0 {
            r.mean_latency = Nanos::try_from(sum / u128::from(r.frames)).unwrap_or(Nanos::MAX);
        }
        r.pending = s.waiting.front().map(|&a| {
            let head = s.last_dispatch.map_or(a, |l| l.max(a));
            report.end.saturating_sub(head)
        });
    }
    Ok(report)
}
