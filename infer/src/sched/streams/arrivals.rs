//! When a stream's frames arrive ([`Arrivals`]) and where they wait for dispatch: its
//! [`ArrivalQueue`], preallocated, of at most [`MAX_WAITING`] arrival times.

use std::collections::VecDeque;

use crate::sched::Nanos;

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

/// Arrival times waiting per stream at most; later arrivals are dropped (and counted).
pub const MAX_WAITING: usize = 256;

/// One stream's frames that have arrived and wait for dispatch, by arrival time: what a
/// driver passes [`Scheduler::decide`] as the stream's oldest. Preallocated; arrivals beyond
/// [`MAX_WAITING`] are dropped and counted.
///
/// [`Scheduler::decide`]: crate::sched::Scheduler::decide
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
