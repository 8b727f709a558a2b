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
//! What a run reports per stream ([`StreamReport`]): frames, frames per second, latency
//! from arrival to the result (mean, p50, p99, max), the longest wait from arrival to
//! dispatch, frames dropped because its arrival queue was full; and the scheduler's switch
//! count beside the device's.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{Nanos, Policy, Scheduler, StreamId, StreamSpec};
use crate::pipeline::{Finished, Input, Pipeline};
use crate::Error;

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
    dropped: u64,
}

impl ArrivalQueue {
    /// An empty queue whose first periodic frame arrives at time 0.
    pub fn new(arrivals: Arrivals) -> ArrivalQueue {
        ArrivalQueue {
            arrivals,
            waiting: VecDeque::with_capacity(MAX_WAITING),
            next: 0,
            dropped: 0,
        }
    }

    /// Starts the clock again: nothing waits, the next periodic frame arrives at time 0
    /// (allocates nothing).
    pub fn restart(&mut self) {
        self.waiting.clear();
        self.next = 0;
    }

    /// Frames arriving up to `now`; an as-fast-as-possible stream gets its next frame once
    /// nothing of it waits and none of it is `busy` on the device.
    pub fn arrive(&mut self, now: Nanos, busy: bool) {
        match self.arrivals {
            Arrivals::Periodic { period } => {
                while self.next <= now {
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

    /// Frames dropped because [`MAX_WAITING`] were waiting.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

struct State {
    stream: Stream,
    queue: ArrivalQueue,
    /// Per frame in flight, in frame order: (arrival, dispatch).
    dispatched: VecDeque<(Nanos, Nanos)>,
    latency: hdrhistogram::Histogram<u64>,
    frames: u64,
    failed: u64,
    max_wait: Nanos,
}

/// What one stream did in a run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StreamReport {
    /// Its name.
    pub name: String,
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
    /// The longest wait from arrival to dispatch, in ns.
    pub max_wait_ns: u64,
    /// Frames that had arrived but were still waiting when the run ended (not run).
    pub left_waiting: u64,
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
    /// Context switches the scheduler's decisions caused.
    pub switches: u64,
    /// Decisions it made.
    pub decisions: u64,
}

/// Streams on one device under one scheduler.
pub struct Streams {
    scheduler: Scheduler,
    states: Vec<State>,
    in_flight: usize,
    oldest: Vec<Option<Nanos>>,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streams")
            .field("policy", self.scheduler.policy())
            .field("streams", &self.states.len())
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Streams {
    /// Schedules `streams` with `policy`, at most `in_flight` frames on the device at once.
    ///
    /// # Errors
    /// [`Error::Invalid`] for no streams, an `in_flight` of 0, a stream whose context is not
    /// its pipeline's, a periodic stream with a period of 0, and what the scheduler refuses
    /// (its message says what to change).
    pub fn new(policy: Policy, streams: Vec<Stream>, in_flight: usize) -> Result<Streams, Error> {
        if in_flight == 0 {
            return Err(Error::Invalid {
                what: "0 frames in flight".into(),
                hint: "allow at least 1 frame on the device (1 keeps the scheduler's bounds)",
            });
        }
        for s in &streams {
            if s.spec.context != s.pipeline.config().context {
                return Err(Error::Invalid {
                    what: format!(
                        "stream {:?} in context {} over a pipeline in context {}",
                        s.spec.name,
                        s.spec.context,
                        s.pipeline.config().context
                    ),
                    hint: "build each stream's pipeline with Config::context equal to its spec's",
                });
            }
            if s.arrivals == (Arrivals::Periodic { period: 0 }) {
                return Err(Error::Invalid {
                    what: format!("stream {:?} with a period of 0 ns", s.spec.name),
                    hint: "give a periodic stream a period of at least 1 ns, or make it Asap",
                });
            }
        }
        let specs = streams.iter().map(|s| s.spec.clone()).collect();
        let scheduler = Scheduler::new(policy, specs).map_err(|e| Error::Invalid {
            what: e.to_string(),
            hint: "fix the streams or the policy as the message says",
        })?;
        let n = streams.len();
        let states = streams
            .into_iter()
            .map(|stream| State {
                queue: ArrivalQueue::new(stream.arrivals),
                stream,
                dispatched: VecDeque::with_capacity(1024),
                latency: hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                    .expect("valid bounds"),
                frames: 0,
                failed: 0,
                max_wait: 0,
            })
            .collect();
        Ok(Streams {
            scheduler,
            states,
            in_flight,
            oldest: vec![None; n],
        })
    }

    /// The scheduler (its switch count, its policy).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Runs for `duration`: frames arrive, the scheduler picks, `preprocess(stream, frame,
    /// input)` fills each dispatched frame's input, `postprocess(stream, finished)` gets each
    /// result; then the frames in flight are drained. Returns what each stream did.
    ///
    /// # Errors
    /// What the pipelines return (a broken queue, a device that stopped answering).
    pub fn run(
        &mut self,
        duration: Duration,
        mut preprocess: impl FnMut(StreamId, u64, &Input<'_>) -> Result<(), Error>,
        mut postprocess: impl FnMut(StreamId, Finished<'_>),
    ) -> Result<RunReport, Error> {
        let start = Instant::now();
        let end = nanos(duration);
        let (switches0, decisions0) = (self.scheduler.switches(), self.scheduler.decisions());
        for s in &mut self.states {
            s.queue.restart();
        }
        loop {
            let now = nanos(start.elapsed());
            let open = now < end;
            if open {
                self.arrive(now);
            }
            let busy: usize = self.states.iter().map(|s| s.dispatched.len()).sum();
            if open && busy < self.in_flight {
                for (o, s) in self.oldest.iter_mut().zip(&self.states) {
                    *o = s.queue.oldest();
                }
                if let Some(d) = self.scheduler.decide(now, &self.oldest) {
                    let i = d.stream.0;
                    let s = &mut self.states[i];
                    let arrival = s.queue.take().unwrap_or(now);
                    let submitted = s
                        .stream
                        .pipeline
                        .try_submit(|n, input| preprocess(d.stream, n, input))?;
                    if submitted.is_some() {
                        s.stream.pipeline.flush()?;
                        s.max_wait = s.max_wait.max(now.saturating_sub(arrival));
                        s.dispatched.push_back((arrival, now));
                        continue;
                    }
                    // Its pipeline is full (depth below in_flight): the frame waits again.
                    s.queue.put_back(arrival);
                }
            }
            if busy == 0 {
                if !open {
                    break;
                }
                // Nothing on the device: sleep until the next arrival (or a little).
                let next = self
                    .states
                    .iter()
                    .filter_map(|s| s.queue.next_arrival())
                    .min()
                    .unwrap_or(now + 100_000)
                    .min(end);
                if next > now {
                    std::thread::sleep(Duration::from_nanos(next - now));
                }
                continue;
            }
            // Wait for the oldest frame on the device, then take whatever else finished.
            let oldest = (0..self.states.len())
                .filter(|&i| !self.states[i].dispatched.is_empty())
                .min_by_key(|&i| self.states[i].dispatched[0].1)
                .expect("busy > 0");
            self.reap(oldest, start, true, &mut postprocess)?;
            for i in 0..self.states.len() {
                self.reap(i, start, false, &mut postprocess)?;
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        Ok(RunReport {
            policy: *self.scheduler.policy(),
            seconds,
            streams: self
                .states
                .iter()
                .map(|s| StreamReport {
                    name: s.stream.spec.name.clone(),
                    frames: s.frames,
                    failed: s.failed,
                    dropped: s.queue.dropped(),
                    fps: s.frames as f64 / seconds.max(1e-9),
                    latency_mean_ns: s.latency.mean(),
                    latency_p50_ns: s.latency.value_at_quantile(0.5),
                    latency_p99_ns: s.latency.value_at_quantile(0.99),
                    latency_max_ns: s.latency.max(),
                    max_wait_ns: s.max_wait,
                    left_waiting: s.queue.len() as u64,
                })
                .collect(),
            switches: self.scheduler.switches() - switches0,
            decisions: self.scheduler.decisions() - decisions0,
        })
    }

    /// Frames arriving up to `now`.
    fn arrive(&mut self, now: Nanos) {
        for s in &mut self.states {
            s.queue.arrive(now, !s.dispatched.is_empty());
        }
    }

    /// Hands stream `i`'s finished frames to `postprocess` (waiting for one if `block`).
    fn reap(
        &mut self,
        i: usize,
        start: Instant,
        block: bool,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), Error> {
        let s = &mut self.states[i];
        if s.dispatched.is_empty() {
            return Ok(());
        }
        let dispatched = &mut s.dispatched;
        let latency = &mut s.latency;
        let (frames, failed) = (&mut s.frames, &mut s.failed);
        let mut each = |done: Finished<'_>| {
            let (arrival, _) = dispatched.pop_front().unwrap_or((0, 0));
            let now = nanos(start.elapsed());
            let _ = latency.record(now.saturating_sub(arrival).max(1));
            *frames += 1;
            if done.result.is_err() {
                *failed += 1;
            }
            postprocess(StreamId(i), done);
        };
        if block {
            s.stream.pipeline.wait(&mut each)?;
        } else {
            s.stream.pipeline.poll(&mut each)?;
        }
        Ok(())
    }

    /// Gives the streams back (to shut their pipelines down, read their counters).
    pub fn into_streams(self) -> Vec<Stream> {
        self.states.into_iter().map(|s| s.stream).collect()
    }
}
