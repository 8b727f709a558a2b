//! Several streams on one device: which stream's frame the device runs next.
//!
//! A stream is one pipeline's frames ([`StreamSpec`]: a name, a priority, an optional maximum
//! wait, the device context it runs on). Each time the device can take another frame, the
//! caller passes the arrival time of every stream's oldest frame not yet dispatched and
//! [`Scheduler::decide`] names the stream whose frame goes next. The device is non-preemptive:
//! a dispatched frame runs to its end. Pure logic: no I/O, no threads, no unsafe; all state
//! is allocated by [`Scheduler::new`] and `decide` allocates nothing.
//!
//! ```
//! use userdma_infer::sched::{Policy, Scheduler, StreamId, StreamSpec};
//!
//! let live = StreamSpec::new("live", 1, 0);
//! let playback = StreamSpec::new("playback", 0, 1).with_max_wait(200_000_000);
//! let mut s = Scheduler::new(Policy::Batch { k: 4 }, vec![live, playback])?;
//! // Both have a frame waiting: the live one (higher priority) runs first.
//! let d = s.decide(1_000, &[Some(0), Some(0)]).unwrap();
//! assert_eq!(d.stream, StreamId(0));
//! // Device time of one frame per stream, the most a switch costs: how long can a frame wait?
//! let bound = s.wait_bound(StreamId(1), &[18_000_000, 18_000_000], 1_000_000);
//! assert_eq!(bound, Some(2 * 1_000_000 + 18_000_000 + 4 * 18_000_000));
//! # Ok::<(), userdma_infer::sched::Error>(())
//! ```
//!
//! # Policies
//!
//! - [`Policy::RoundRobin`]: one frame per stream in turn, priorities ignored (the least
//!   recently served waiting stream runs next). The baseline: every frame may switch context.
//! - [`Policy::StrictPriority`]: the highest-priority waiting stream runs; equal priorities
//!   take turns (least recently served first). A lower stream runs only when no higher one has
//!   a frame waiting, so it can starve.
//! - [`Policy::Batch`]: priority with batch switching. The device switches context only
//!   between *batches*: a stream that has the device keeps it while it has frames, for up to
//!   `k` frames dispatched while another stream is waiting (frames it runs while nobody else
//!   waits do not count). When a batch ends (its stream has no frame waiting, or it ran `k`
//!   frames against a waiting stream and yields), the next batch goes to the highest-priority
//!   waiting stream, except that after a batch chosen by priority, a waiting stream of lower
//!   priority than it gets the next batch (its *turn*; the least recently served of them),
//!   unless a stream of higher priority than that batch's is waiting (it goes first, and the
//!   turn comes after its batch). So the top stream runs up to `k` frames in a row before a
//!   lower one may run, gets every other batch while lower ones wait, and no stream starves.
//!   Two streams that both always have frames alternate batches of `k`: priority decides who
//!   goes first, and with three or more levels it gives the top stream every other batch.
//!
//!   Frames a stream ran forced by its maximum wait (below) outside its own batch count
//!   towards its next batch, which still runs at least one frame: a maximum wait changes
//!   when a stream's frames run more than how many, so it does not let a stream take a
//!   larger share of the device than its batches give it.
//!
//!   A lower stream that has the device also keeps it for its `k` frames when a higher one
//!   arrives, rather than yielding after one frame. A switch costs its save and restore and
//!   the refill of the device SRAM the other context evicted, and the frames after it pay
//!   the refill. A stream that arrives one frame at a time (25 FPS of live video against 18 ms
//!   of compute has at most one frame waiting) never has a batch of its own: if the lower
//!   stream yielded after one frame, the device would switch twice per live frame, exactly as
//!   round-robin does. Keeping `k` frames on both sides lets the live frames gather while the
//!   lower stream runs, and both sides amortise a switch over their batch. The price is stated
//!   below: the higher stream's frame may wait for `k` frames of the lower one.
//!
//! Under every policy, a stream's **maximum wait** W ([`StreamSpec::max_wait`]) overrides the
//! policy: a frame that has waited W runs next, whatever its priority ([`Decision::forced`]);
//! when several have, the most overdue (waited longest beyond its W) runs first, ties by
//! priority, then least recently served. A forced frame is one frame: the batch it interrupts
//! resumes after it. The wait counts from when the frame became its stream's oldest waiting
//! frame (its arrival, or the dispatch of its stream's previous frame if that is later): a
//! stream whose frames arrive faster than it is served cannot take the device for itself by
//! piling up overdue frames.
//!
//! **Context affinity**: a stream always runs on its own [`StreamSpec::context`] (its hardware
//! queue); the scheduler never moves it. Streams that share a context switch between each
//! other for free ([`Decision::switch`] is false), which only makes the bounds below looser.
//!
//! # The bounds
//!
//! A frame's **wait** runs from when it becomes its stream's oldest waiting frame to the
//! decision that dispatches it (a stream's frames run in order, so a frame behind `q` others
//! of its own stream waits for them too; with at most one frame of a stream waiting at a
//! time, as when its next frame comes only after the previous one is dispatched, this is the
//! wait from its arrival). Notation: `T_k` is one frame's device time of stream `k`, `T_max`
//! the largest, `C` the most one context switch costs. For a frame of stream `s`: `A` the
//! streams of higher priority, `E` the other streams of equal priority, `B` those of lower
//! priority, `Y` the streams other than `s` below the top priority, `#X` the number of
//! streams in a set `X`, `T_ℓ` the largest `T` of the streams at priority level `ℓ`, `T_B`
//! the largest in `B`. Every bound opens with `C + T_max`, the frame the device is running
//! when the wait starts (non-preemptive).
//!
//! | policy | a frame of `s` waits at most |
//! |---|---|
//! | `RoundRobin` | `Σ_k (C + T_k)`: one frame of every stream, `s`'s previous one included |
//! | `StrictPriority` | `C + T_max + Σ_E (C + T_e)` if no stream has a higher priority than `s`; no bound otherwise |
//! | `Batch { k }` | `C + T_max + S_A + S_E + S_B` (below) |
//! | max wait `W_s` | `W_s + C + T_max + Σ_{j≠s with a W} (C + T_j)`; with one max-wait stream, `W_s + C + T_max` |
//!
//! Under `Batch { k }`, where a batch of stream `x` holds the device for at most `C + k·T_x`
//! of the wait:
//! - `S_A`, the batches of higher streams: 0 if `A` is empty, else
//!   `(#Y + 1)·Σ_ℓ (C + k·T_ℓ) + Σ_{y∈Y} (C + k·T_y)` with `ℓ` over the priority levels of
//!   `A`: runs of batches of rising priority, each ended by a turn of a lower stream (`s`'s
//!   own turn ends the last);
//! - `S_E`, one batch of each equal stream: `Σ_{e∈E} (C + k·T_e)` if `A` is empty (otherwise
//!   `E` is part of `Y`, counted in `S_A`);
//! - `S_B`, a lower stream's turn after each batch at `s`'s level, `s`'s own previous one
//!   included: `(#E + 1)·(C + k·T_B)` if `B` is not empty, else 0.
//!
//! With two streams under `Batch { k }` this is `W_hi ≤ 2C + T_max + k·T_lo` and
//! `W_lo ≤ 2C + T_max + k·T_hi`: the running batch's `k` frames, the switch into it, and the
//! frame in progress.
//!
//! The policy bounds above hold with no max-wait stream. Each max-wait stream `j ≠ s` can
//! interrupt with forced frames at least `W_j` apart, each costing `2C + T_j` (its switch, its
//! frame, the switch back), so with them the bound is the least `L` with
//! `L ≥ P_s + Σ_{j≠s with a W} (⌊L / W_j⌋ + 1)·(2C + T_j)` where `P_s` is the policy bound
//! (none when the forced frames could fill the device). A stream with its own `W_s` has the
//! smaller of that and its max-wait bound. [`Scheduler::wait_bound`] computes exactly these
//! formulas; the simulator ([`sim`]) and the tests check them.
//!
//! The bounds assume the caller asks for a decision when the device becomes free (one frame
//! on the device at a time, as the simulator does). A caller that keeps `q` frames queued
//! on the device decides earlier: up to `(q − 1)·(C + T_max)` more work is ahead of every
//! decision, which adds that much to every bound, and a frame starts on the device up to that
//! much after its decision.
//!
//! # Latency against switches
//!
//! A periodic stream (period `P`, frame time `T`) sharing a non-preemptive device with a
//! stream that always has work (frame time `T'`) cannot have both a latency under `P` and
//! fewer than two switches per frame of its own:
//! - its frames run in batches of `b` between the other stream's frames, two switches per
//!   batch: `2 / (b·P)` switches per second. The first frame of a batch waits for the other
//!   `b − 1` to arrive, so its latency is at least `(b − 1)·P + T`: under `P` only for
//!   `b = 1`, which is two switches per frame (50 a second at 25 FPS);
//! - even at `b = 1` (strict priority), a frame that arrives just after the other stream's
//!   frame began waits for it and a switch, then runs after another: up to
//!   `2C + T' + T`, under `P` only if `2C < P − T − T'`. With 18 ms frames at 25 FPS that
//!   leaves 4 ms for two switches, each of which also refills the device SRAM the other
//!   context evicted (several ms for an 8 MiB SRAM refilled at 1.5 GB/s), unless both
//!   contexts share their weights.
//!
//! So "switches down by 70 %" (live batches of three or more) and "live p99 within one
//! period" (batches of one) exclude each other on such a device without idling it or
//! starving the other stream. `userdma demo` runs both settings, batch switching and
//! strict priority, and reports which targets each meets.
//!
//! | module | owns |
//! |---|---|
//! | this one | [`StreamSpec`], [`Policy`], [`Decision`], [`Scheduler`], [`Error`] |
//! | `bound` | the formulas of [`Scheduler::wait_bound`] |
//! | [`sim`] | a discrete-event simulator of streams on a non-preemptive device, to check the bounds |

mod bound;
pub mod sim;
#[cfg(not(loom))]
pub mod streams;
#[cfg(test)]
mod tests;

use std::fmt;

/// Nanoseconds on the caller's clock (monotonic; a driver passes `Instant`-derived
/// nanoseconds, the simulator its simulated clock).
pub type Nanos = u64;

/// The most streams one [`Scheduler`] takes (the waiting set is one 64-bit mask). A machine
/// with more streams runs one scheduler per device.
pub const MAX_STREAMS: usize = 64;

/// A stream: its index in the specs given to [`Scheduler::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct StreamId(pub usize);

/// One stream's scheduling parameters.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StreamSpec {
    /// Its name in reports (unique within a scheduler).
    pub name: String,
    /// Higher runs first.
    pub priority: u8,
    /// W: a frame that has waited this long runs next, whatever its priority. `None`: no
    /// maximum.
    pub max_wait: Option<Nanos>,
    /// The device context (hardware queue) it runs on; streams on equal contexts switch
    /// between each other at no cost.
    pub context: u32,
}

impl StreamSpec {
    /// A stream with no maximum wait.
    pub fn new(name: impl Into<String>, priority: u8, context: u32) -> StreamSpec {
        StreamSpec {
            name: name.into(),
            priority,
            max_wait: None,
            context,
        }
    }

    /// The same stream with a maximum wait of `w` nanoseconds.
    pub fn with_max_wait(self, w: Nanos) -> StreamSpec {
        StreamSpec {
            max_wait: Some(w),
            ..self
        }
    }
}

/// How the next stream is chosen (see the [module docs](self) for each policy's bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Policy {
    /// One frame per stream in turn, priorities ignored.
    RoundRobin,
    /// The highest priority first; equal priorities in turn. Lower streams can starve.
    StrictPriority,
    /// Priority with batch switching: a stream keeps the device for up to `k` frames
    /// dispatched while another waits, then a waiting lower stream gets a batch.
    Batch {
        /// Frames per batch (at least 1).
        k: u32,
    },
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::RoundRobin => f.write_str("round-robin"),
            Policy::StrictPriority => f.write_str("strict priority"),
            Policy::Batch { k } => write!(f, "batch K={k}"),
        }
    }
}

/// What [`Scheduler::decide`] chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Decision {
    /// The stream whose oldest frame goes next.
    pub stream: StreamId,
    /// Its context differs from the previous decision's: the device switches context.
    pub switch: bool,
    /// Chosen by the maximum-wait rule, not by the policy.
    pub forced: bool,
}

/// Why [`Scheduler::new`] refused its streams or policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No streams.
    #[error("no streams: give the scheduler at least one stream")]
    NoStreams,
    /// More streams than [`MAX_STREAMS`].
    #[error(
        "{count} streams: a scheduler takes at most {max}; run one scheduler per device, or \
         merge streams that share a context"
    )]
    TooManyStreams {
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// `Batch { k: 0 }`.
    #[error(
        "batch switching with K = 0: K is how many frames a stream runs before another may, \
         use K >= 1 (K = 1 gives up the device after every frame)"
    )]
    ZeroBatch,
    /// A maximum wait of zero.
    #[error(
        "stream {stream:?}: a maximum wait of 0 would force every frame; give a positive \
         wait, or none for no maximum"
    )]
    ZeroMaxWait {
        /// The stream's name.
        stream: String,
    },
    /// A stream with an empty name.
    #[error("stream {index} has an empty name: name every stream, reports use the names")]
    EmptyName {
        /// Its index.
        index: usize,
    },
    /// Two streams with one name.
    #[error("streams {first} and {second} are both named {name:?}: give each stream its own name")]
    DuplicateName {
        /// The name.
        name: String,
        /// The first stream with it.
        first: usize,
        /// The second.
        second: usize,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](userdma::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> userdma::Code {
        match self {
            Error::NoStreams
            | Error::TooManyStreams { .. }
            | Error::ZeroBatch
            | Error::ZeroMaxWait { .. }
            | Error::EmptyName { .. }
            | Error::DuplicateName { .. } => userdma::Code::InvalidArgument,
        }
    }
}

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
struct Batch {
    /// The stream holding the device.
    holder: usize,
    /// Its frames dispatched in this batch while another stream was waiting.
    run: u32,
    kind: Kind,
}

/// Chooses the next stream; counts its decisions and the context switches they cause.
///
/// Build it once with the streams ([`Scheduler::new`]); call [`Scheduler::decide`] each time
/// the device can take another frame and dispatch one frame of the stream it names.
#[derive(Debug, Clone)]
pub struct Scheduler {
    policy: Policy,
    streams: Vec<StreamSpec>,
    /// Per stream: its priority, context, W (0 = none), the streams of lower and of higher
    /// priority.
    priority: Vec<u8>,
    context: Vec<u32>,
    max_wait: Vec<Nanos>,
    below: Vec<u64>,
    above: Vec<u64>,
    /// Streams with a maximum wait.
    waits: u64,
    /// Per stream: the decision number of its last dispatch (0 = never), and its time.
    served: Vec<u64>,
    dispatched: Vec<Nanos>,
    /// Per stream: its frames forced outside its own batch since its last batch began.
    forced_since: Vec<u32>,
    last: Option<usize>,
    batch: Option<Batch>,
    decisions: u64,
    switches: u64,
}

impl Scheduler {
    /// A scheduler for `streams` (a stream's [`StreamId`] is its index here) under `policy`.
    ///
    /// # Errors
    ///
    /// [`Error`]: no streams, more than [`MAX_STREAMS`], `Batch { k: 0 }`, a maximum wait of
    /// 0, an empty or duplicate name.
    pub fn new(policy: Policy, streams: Vec<StreamSpec>) -> Result<Scheduler, Error> {
        let n = streams.len();
        if n == 0 {
            return Err(Error::NoStreams);
        }
        if n > MAX_STREAMS {
            return Err(Error::TooManyStreams {
                count: n,
                max: MAX_STREAMS,
            });
        }
        if policy == (Policy::Batch { k: 0 }) {
            return Err(Error::ZeroBatch);
        }
        for (i, s) in streams.iter().enumerate() {
            if s.name.is_empty() {
                return Err(Error::EmptyName { index: i });
            }
            if s.max_wait == Some(0) {
                return Err(Error::ZeroMaxWait {
                    stream: s.name.clone(),
                });
            }
            if let Some(first) = streams[..i].iter().position(|o| o.name == s.name) {
                return Err(Error::DuplicateName {
                    name: s.name.clone(),
                    first,
                    second: i,
                });
            }
        }
        let below = streams
            .iter()
            .map(|s| mask_of(&streams, |o| o.priority < s.priority))
            .collect();
        let above = streams
            .iter()
            .map(|s| mask_of(&streams, |o| o.priority > s.priority))
            .collect();
        Ok(Scheduler {
            policy,
            priority: streams.iter().map(|s| s.priority).collect(),
            context: streams.iter().map(|s| s.context).collect(),
            max_wait: streams.iter().map(|s| s.max_wait.unwrap_or(0)).collect(),
            below,
            above,
            waits: mask_of(&streams, |s| s.max_wait.is_some()),
            served: vec![0; n],
            dispatched: vec![0; n],
            forced_since: vec![0; n],
            last: None,
            batch: None,
            decisions: 0,
            switches: 0,
            streams,
        })
    }

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

    /// Context switches its decisions caused (consecutive decisions on different contexts).
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// Decisions made (calls of [`Scheduler::decide`] that returned a stream).
    pub fn decisions(&self) -> u64 {
        self.decisions
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The streams, in [`StreamId`] order.
    pub fn streams(&self) -> &[StreamSpec] {
        &self.streams
    }

    /// The stream with this name.
    pub fn find(&self, name: &str) -> Option<StreamId> {
        self.streams
            .iter()
            .position(|s| s.name == name)
            .map(StreamId)
    }

    /// The bound on how long a frame of `stream` can wait before it is dispatched, given
    /// `service[i]` (one frame's device time of stream `i`), `switch` (the most one context
    /// switch costs) and the policy: the formulas of the [module docs](self#the-bounds).
    ///
    /// `None` when the policy gives none (strict priority below a higher stream with no
    /// maximum wait of its own; forced frames of max-wait streams that could fill the
    /// device), when the bound does not fit in a [`Nanos`], and for a `stream` that is not one
    /// of the scheduler's or a `service` shorter than the streams.
    pub fn wait_bound(&self, stream: StreamId, service: &[Nanos], switch: Nanos) -> Option<Nanos> {
        bound::wait_bound(self, stream.0, service, switch)
    }
}

/// The single bit of stream `i`.
fn bit(i: usize) -> u64 {
    1u64 << i
}

/// The streams (at most 64) for which `f` holds, as a mask.
fn mask_of(streams: &[StreamSpec], f: impl Fn(&StreamSpec) -> bool) -> u64 {
    streams
        .iter()
        .enumerate()
        .filter(|(_, s)| f(s))
        .fold(0, |m, (i, _)| m | bit(i))
}

/// The set bits of a mask, lowest first.
#[derive(Debug, Clone, Copy)]
struct Bits(u64);

impl Iterator for Bits {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let i = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(i)
    }
}
