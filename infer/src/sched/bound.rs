//! The formulas of [`Scheduler::wait_bound`], as stated in the [module docs](super#the-bounds)
//! with the argument for each. Checked arithmetic throughout: a bound that does not fit in a
//! [`Nanos`] is `None`, never a wrapped number.
//!
//! Why they hold (a frame `f` of stream `s` waits from `h`, when it becomes its stream's oldest
//! waiting frame, to its dispatch; the device never idles while `f` waits):
//!
//! - At `h` the device may be running one frame, which ends within `C + T_max`.
//! - Every stream's last-served stamp is updated at each of its dispatches, and ties go to
//!   the least recently served. A stream `x` picked while `s` waits is served more recently
//!   than `s` from then on, so it is never again preferred to `s` in a choice both take part
//!   in. Round-robin: each other stream runs at most once before `s` (one round). Strict
//!   priority with `s` at the top: each equal stream at most once.
//! - Batches: every frame dispatched while `f` waits counts towards its batch's `k` (`s` is
//!   waiting), so a batch holds the device for at most `C + k·T` of `f`'s wait. A batch
//!   chosen by priority from `A` is followed either by a turn among the waiting streams
//!   below it, `s` included, or (when a stream above it waits) by a batch chosen by priority
//!   from a higher level of `A`: so the batches of `A` come in runs of rising priority, at
//!   most one per level, each run ended by a turn. Each stream of `Y` takes at most one turn
//!   before `s`, so there are at most `#Y + 1` runs. Each stream of `E` runs at most one
//!   batch before `s` (it takes part in the same choices as `s`), and each batch chosen by
//!   priority at `s`'s level (an `E` stream's, or `s`'s own before `h`) may be followed by one
//!   turn of a `B` stream; a batch of `B` chosen by priority before `h` is followed by `s`
//!   or a higher stream, never by a turn, since `s` waits above it. The batch running at `h`
//!   is one of these.
//! - Max wait: `f` is overdue from `h + W_s` on; from then every decision is forced and goes
//!   to an overdue frame at least as overdue as `f`. A stream `j` forced then has its next
//!   frame due no earlier than `h + W_s + W_j`, after `f`: so each other max-wait stream runs
//!   at most one frame before `f`, after the frame in progress.
//! - Forced frames of `j` are at least `W_j` apart (its next frame's wait starts at the
//!   previous dispatch), so at most `⌊L/W_j⌋ + 1` of them fall in a wait of length `L`; each
//!   costs `T_j`, its switch and the switch back into the batch it interrupted. The least
//!   `L` with `L ≥ P_s + Σ_j (⌊L/W_j⌋ + 1)·(2C + T_j)` bounds the wait: if `f` still waited at
//!   `h + L`, the decisions up to then would have kept the device busy past it, which is more
//!   work than the right-hand side allows. Any `L` meeting the inequality is a valid bound;
//!   the iteration from `P_s` finds the least one, and if it has not settled after
//!   [`ITERATIONS`] steps, doubling finds a larger one.

use super::{Nanos, Policy, Scheduler};

/// Steps of the fixed-point iteration, then of doubling, before giving up.
const ITERATIONS: u32 = 64;

/// [`Scheduler::wait_bound`].
pub(super) fn wait_bound(
    sched: &Scheduler,
    s: usize,
    service: &[Nanos],
    c: Nanos,
) -> Option<Nanos> {
    let n = sched.streams.len();
    if s >= n || service.len() < n {
        return None;
    }
    let t = &service[..n];
    let policy = policy_bound(sched, s, t, c).and_then(|p| with_forced(sched, s, t, c, p));
    let own = own_max_wait(sched, s, t, c);
    match (policy, own) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The policy's bound with no forced frames (`P_s`).
fn policy_bound(sched: &Scheduler, s: usize, t: &[Nanos], c: Nanos) -> Option<Nanos> {
    let prio = &sched.priority;
    let p = prio[s];
    let t_max = t.iter().copied().max().unwrap_or(0);
    let in_progress = c.checked_add(t_max)?;
    let frame = |x: Nanos| c.checked_add(x);
    match sched.policy {
        Policy::RoundRobin => sum(t.iter().map(|&x| frame(x))),
        Policy::StrictPriority => {
            if prio.iter().any(|&q| q > p) {
                return None;
            }
            let equal = sum(others(s, t, |i| prio[i] == p).map(|(_, x)| frame(x)))?;
            in_progress.checked_add(equal)
        }
        Policy::Batch { k } => {
            let batch = |x: Nanos| c.checked_add(Nanos::from(k).checked_mul(x)?);
            let times = |x: u64, y: Option<Nanos>| x.checked_mul(y?);
            let top = prio.iter().copied().max().unwrap_or(p);
            let equal = others(s, t, |i| prio[i] == p).count() as u64;
            let above = others(s, t, |i| prio[i] > p);
            // Σ_ℓ (C + k·T_ℓ) over the levels above `s`: each level once, at its first stream.
            let levels = sum(above.clone().filter_map(|(i, _)| {
                let first = prio.iter().position(|&q| q == prio[i]) == Some(i);
                let t_level = t.iter().zip(prio).filter(|&(_, &q)| q == prio[i]);
                first.then(|| batch(t_level.map(|(&x, _)| x).max().unwrap_or(0)))
            }));
            let t_below = others(s, t, |i| prio[i] < p).map(|(_, x)| x).max();
            let mut total = in_progress;
            match above.clone().next() {
                None => {
                    let e = sum(others(s, t, |i| prio[i] == p).map(|(_, x)| batch(x)))?;
                    total = total.checked_add(e)?;
                }
                Some(_) => {
                    let turns = others(s, t, |i| prio[i] < top);
                    let y = turns.clone().count() as u64;
                    let a = times(y + 1, levels)?;
                    let ys = sum(turns.map(|(_, x)| batch(x)))?;
                    total = total.checked_add(a)?.checked_add(ys)?;
                }
            }
            if let Some(t_b) = t_below {
                total = total.checked_add(times(equal + 1, batch(t_b))?)?;
            }
            Some(total)
        }
    }
}

/// The max-wait bound of a stream with its own W: `W_s + C + T_max + Σ_{j≠s with a W}
/// (C + T_j)`.
fn own_max_wait(sched: &Scheduler, s: usize, t: &[Nanos], c: Nanos) -> Option<Nanos> {
    let w = sched.streams[s].max_wait?;
    let t_max = t.iter().copied().max().unwrap_or(0);
    let competitors =
        sum(others(s, t, |i| sched.streams[i].max_wait.is_some()).map(|(_, x)| c.checked_add(x)))?;
    w.checked_add(c)?
        .checked_add(t_max)?
        .checked_add(competitors)
}

/// `P_s` with the forced frames of the other max-wait streams: the least `L` (or a larger
/// one) with `L ≥ p + Σ_j (⌊L/W_j⌋ + 1)·(2C + T_j)`.
fn with_forced(sched: &Scheduler, s: usize, t: &[Nanos], c: Nanos, p: Nanos) -> Option<Nanos> {
    // (W_j, 2C + T_j) of each other max-wait stream.
    let forcing = || {
        others(s, t, |i| sched.streams[i].max_wait.is_some()).map(move |(i, x)| {
            (
                sched.max_wait[i],
                c.checked_mul(2).and_then(|d| d.checked_add(x)),
            )
        })
    };
    if forcing().next().is_none() {
        return Some(p);
    }
    let f = |l: Nanos| -> Option<Nanos> {
        p.checked_add(sum(
            forcing().map(|(w, cost)| (l / w + 1).checked_mul(cost?))
        )?)
    };
    let mut l = p;
    for _ in 0..ITERATIONS {
        let next = f(l)?;
        if next <= l {
            return Some(l);
        }
        l = next;
    }
    for _ in 0..ITERATIONS {
        if f(l)? <= l {
            return Some(l);
        }
        l = l.checked_mul(2)?;
    }
    None
}

/// The streams other than `s` for which `f` holds, with their service times.
fn others<'a>(
    s: usize,
    t: &'a [Nanos],
    f: impl Fn(usize) -> bool + Clone + 'a,
) -> impl Iterator<Item = (usize, Nanos)> + Clone + 'a {
    t.iter()
        .copied()
        .enumerate()
        .filter(move |&(i, _)| i != s && f(i))
}

/// The sum of terms that may each have overflowed; `None` if any did or the sum does.
fn sum(mut terms: impl Iterator<Item = Option<Nanos>>) -> Option<Nanos> {
    terms.try_fold(0u64, |acc, x| acc.checked_add(x?))
}
