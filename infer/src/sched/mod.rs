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
//! | this one | [`StreamSpec`], [`Policy`], [`Decision`], [`Scheduler`] |
//! | `decide` | how [`Scheduler::decide`] picks: the maximum-wait rule, then the policy |
//! | `error` | [`Error`] |
//! | `mask` | sets of streams as 64-bit masks |
//! | `bound` | the formulas of [`Scheduler::wait_bound`] |
//! | [`sim`] | a discrete-event simulator of streams on a non-preemptive device, to check the bounds |

mod bound;
mod decide;
mod error;
mod mask;
pub mod sim;
#[cfg(not(loom))]
pub mod streams;
#[cfg(test)]
mod tests;

use std::fmt;

pub use self::error::Error;

use self::decide::Batch;
use self::mask::mask_of;

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
