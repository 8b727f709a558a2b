//! How [`Scheduler::decide`] picks the next stream: the maximum-wait rule first (the most
//! overdue waiting stream), then the policy's choice: round-robin, strict priority, or
//! batch switching with its running [`Batch`] and the lower streams' turns (see the
//! [module docs](super) for each policy and its bound).

use super::mask::{bit, Bits};
use super::{Decision, Nanos, Policy, Scheduler, StreamId};

/// How the running batch was chosen ([`Policy::Batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The highest-priority waiting stream.
    Priority,
    /// A lower stream's turn after a batch chosen by priority.
    Turn,
}

/// The running batch ([`Policy::Batch`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Batch {
    /// The stream holding the device.
    holder: usize,
    /// Its frames dispatched in this batch while another stream was waiting.
    run: u32,
    kind: Kind,
}

impl Scheduler {
    /// The stream whose oldest frame the device should run next, or `None` when no stream has
    /// a frame waiting. Allocates nothing.
    ///
    /// `oldest[i]` is the arrival time of stream `i`'s oldest frame not yet dispatched (`None`:
    /// nothing waiting); entries beyond the streams are ignored, missing ones mean nothing
    /// waiting. `now` is the caller's clock; a `now` earlier than a previous one (or than an
    /// arrival) counts as no time waited. The caller dispatches one frame of the returned
    /// stream; the scheduler records that.
    pub fn decide(&mut self, now: Nanos, oldest: &[Option<Nanos>]) -> Option<Decision> {
        let n = self.streams.len();
        let mut waiting = 0u64;
        for (i, o) in oldest.iter().take(n).enumerate() {
            waiting |= u64::from(o.is_some()) << i;
        }
        if waiting == 0 {
            return None;
        }
        let (stream, forced) = match self.overdue(now, oldest, waiting) {
            Some(i) => (i, true),
            None => (self.by_policy(waiting), false),
        };
        if let (Some(b), true) = (&mut self.batch, forced) {
            if b.holder != stream {
                // An advance on its next batch.
                self.forced_since[stream] = self.forced_since[stream].saturating_add(1);
            } else if waiting & !bit(stream) != 0 {
                b.run = b.run.saturating_add(1);
            }
        }
        let switch = self
            .last
            .is_some_and(|l| self.context[l] != self.context[stream]);
        self.decisions += 1;
        self.switches += u64::from(switch);
        self.served[stream] = self.decisions;
        self.dispatched[stream] = now;
        self.last = Some(stream);
        Some(Decision {
            stream: StreamId(stream),
            switch,
            forced,
        })
    }

    /// The most overdue waiting stream with a maximum wait, if any has waited its W.
    fn overdue(&self, now: Nanos, oldest: &[Option<Nanos>], waiting: u64) -> Option<usize> {
        let mut best: Option<(usize, Nanos)> = None;
        for i in Bits(waiting & self.waits) {
            let Some(arrived) = oldest[i] else { continue };
            // The wait counts from when the frame became its stream's oldest: its arrival or
            // the dispatch of the stream's previous frame, whichever is later.
            let waited = now.saturating_sub(arrived.max(self.dispatched[i]));
            let Some(late) = waited.checked_sub(self.max_wait[i]) else {
                continue;
            };
            let better = match best {
                None => true,
                Some((b, b_late)) => late > b_late || (late == b_late && self.key(i) < self.key(b)),
            };
            if better {
                best = Some((i, late));
            }
        }
        best.map(|(i, _)| i)
    }

    /// Ordering among candidates: higher priority, then least recently served, then index.
    fn key(&self, i: usize) -> (std::cmp::Reverse<u8>, u64, usize) {
        (std::cmp::Reverse(self.priority[i]), self.served[i], i)
    }

    /// The least recently served stream of a non-empty set; ties (streams never served) by
    /// priority if `by_priority`, then by the lower index.
    fn least_recent(&self, set: u64, by_priority: bool) -> usize {
        let key = |i: usize| {
            let p = if by_priority { self.priority[i] } else { 0 };
            (self.served[i], std::cmp::Reverse(p), i)
        };
        let mut bits = Bits(set);
        let mut best = bits.next().unwrap_or(0);
        for i in bits {
            if key(i) < key(best) {
                best = i;
            }
        }
        best
    }

    /// The highest-priority stream of a non-empty set, least recently served among equals.
    fn highest(&self, set: u64) -> usize {
        let mut bits = Bits(set);
        let mut best = bits.next().unwrap_or(0);
        for i in bits {
            if self.key(i) < self.key(best) {
                best = i;
            }
        }
        best
    }

    /// The policy's choice among the waiting streams (a non-empty set).
    fn by_policy(&mut self, waiting: u64) -> usize {
        match self.policy {
            Policy::RoundRobin => self.least_recent(waiting, false),
            Policy::StrictPriority => self.highest(waiting),
            Policy::Batch { k } => self.batched(waiting, k),
        }
    }

    /// [`Policy::Batch`]: continue the running batch, or start the next one.
    fn batched(&mut self, waiting: u64, k: u32) -> usize {
        let mut candidates = waiting;
        if let Some(b) = &mut self.batch {
            let others = waiting & !bit(b.holder);
            if waiting & bit(b.holder) != 0 {
                if others == 0 {
                    // Nobody else waits: frames that cost no one anything do not count.
                    return b.holder;
                }
                if b.run < k {
                    b.run += 1;
                    return b.holder;
                }
                // It ran its `k` frames against waiting streams: it yields.
                candidates = others;
            }
        }
        // A turn for the streams below a batch chosen by priority, unless a stream above it
        // is waiting now: that one goes first, and the turn comes after its batch.
        let (next, kind) = match self.batch {
            Some(Batch {
                holder,
                kind: Kind::Priority,
                ..
            }) if candidates & self.below[holder] != 0 && candidates & self.above[holder] == 0 => (
                self.least_recent(candidates & self.below[holder], true),
                Kind::Turn,
            ),
            _ => (self.highest(candidates), Kind::Priority),
        };
        // Its forced frames since its last batch count towards this one, which still runs
        // at least the frame dispatched now.
        let advance = std::mem::take(&mut self.forced_since[next]).min(k - 1);
        let run = advance + u32::from(waiting & !bit(next) != 0);
        self.batch = Some(Batch {
            holder: next,
            run,
            kind,
        });
        next
    }
}
