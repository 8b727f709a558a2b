//! The cost of one scheduling decision (`Scheduler::decide`) for 2, 4, 16 and 64 streams
//! under each policy, against a baseline in the same run: `fifo`, the oldest waiting frame
//! across all streams (one scan of the same arrival times, the least a scheduler can do).
//! Printed first as one table (ns per decision, best of several rounds, the ratio to `fifo`,
//! the share of decisions forced by a maximum wait), then criterion timings.
//!
//! ```text
//! cargo bench --bench sched                # the table (10^6 decisions per round) and the timings
//! cargo bench --bench sched -- --test      # quick: 10^4 decisions per round, each bench once
//! cargo bench --bench sched -- table-only  # the table alone (a filter no criterion bench matches)
//! ```
//!
//! The load is the worst case for the scans: every stream always has a frame waiting (a new
//! one arrives when one is dispatched), priorities on three levels, contexts on five, and
//! every other stream with a maximum wait short enough that some decisions are forced. The
//! target is under 1 µs per decision.

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion};
use userdma_infer::sched::{Nanos, Policy, Scheduler, StreamSpec};

const POLICIES: [Policy; 4] = [
    Policy::RoundRobin,
    Policy::StrictPriority,
    Policy::Batch { k: 1 },
    Policy::Batch { k: 4 },
];
const STREAMS: [usize; 4] = [2, 4, 16, 64];
/// Simulated time between decisions.
const STEP: Nanos = 1_000;

fn scheduler(policy: Policy, n: usize) -> Scheduler {
    let specs = (0..n)
        .map(|i| {
            let s = StreamSpec::new(format!("s{i}"), (i % 3) as u8, (i % 5) as u32);
            if i % 2 == 1 {
                // Three rounds of decisions: round-robin never forces, strict priority and
                // batches force the low streams now and then.
                s.with_max_wait(3 * STEP * n as Nanos)
            } else {
                s
            }
        })
        .collect();
    Scheduler::new(policy, specs).expect("valid streams")
}

/// The baseline: the stream with the oldest waiting frame.
fn fifo(oldest: &[Option<Nanos>]) -> Option<usize> {
    let mut best: Option<(usize, Nanos)> = None;
    for (i, o) in oldest.iter().enumerate() {
        if let Some(a) = *o {
            if best.is_none_or(|(_, b)| a < b) {
                best = Some((i, a));
            }
        }
    }
    best.map(|(i, _)| i)
}

/// One step of the load: decide at `now`, and the dispatched stream's next frame arrives.
fn step(s: &mut Scheduler, oldest: &mut [Option<Nanos>], now: Nanos) -> bool {
    let d = s.decide(now, black_box(oldest)).expect("frames waiting");
    oldest[d.stream.0] = Some(now);
    d.forced
}

fn fifo_step(oldest: &mut [Option<Nanos>], now: Nanos) {
    let i = fifo(black_box(oldest)).expect("frames waiting");
    oldest[i] = Some(now);
}

/// Best-of-`rounds` nanoseconds per step of `f` over `steps` steps.
fn best_ns(rounds: u32, steps: u64, mut f: impl FnMut(u64)) -> f64 {
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for i in 0..steps {
                f(i);
            }
            t.elapsed().as_secs_f64() * 1e9 / steps as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn table(steps: u64, rounds: u32) {
    println!("decide(): ns per decision, best of {rounds} rounds of {steps} (target < 1000 ns)");
    print!("{:<18}", "policy");
    for n in STREAMS {
        print!(" {:>24}", format!("{n} streams"));
    }
    println!();
    let mut fifo_ns = Vec::new();
    print!("{:<18}", "fifo (baseline)");
    for n in STREAMS {
        let mut oldest = vec![Some(0); n];
        let ns = best_ns(rounds, steps, |i| fifo_step(&mut oldest, i * STEP));
        fifo_ns.push(ns);
        print!(" {:>24}", format!("{ns:.1}"));
    }
    println!();
    for policy in POLICIES {
        print!("{:<18}", policy.to_string());
        for (&n, base) in STREAMS.iter().zip(&fifo_ns) {
            let mut s = scheduler(policy, n);
            let mut oldest = vec![Some(0); n];
            let mut forced = 0u64;
            let mut now = 0;
            let ns = best_ns(rounds, steps, |_| {
                now += STEP;
                forced += u64::from(step(&mut s, &mut oldest, now));
            });
            let share = forced as f64 * 100.0 / (steps * u64::from(rounds)) as f64;
            let cell = format!("{ns:.1} ({:.1}x, {share:.0}% forced)", ns / base);
            print!(" {cell:>24}");
        }
        println!();
    }
    println!("(the ratio is to fifo with as many streams; forced: chosen by a maximum wait)");
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    if quick {
        table(10_000, 2);
    } else {
        table(1_000_000, 7);
    }
    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group("sched/decide");
    for n in STREAMS {
        g.bench_function(BenchmarkId::new("fifo", n), |b| {
            let mut oldest = vec![Some(0); n];
            let mut now = 0;
            b.iter(|| {
                now += STEP;
                fifo_step(&mut oldest, now)
            })
        });
        for policy in POLICIES {
            let id = BenchmarkId::new(policy.to_string().replace(' ', "-"), n);
            g.bench_function(id, |b| {
                let mut s = scheduler(policy, n);
                let mut oldest = vec![Some(0); n];
                let mut now = 0;
                b.iter(|| {
                    now += STEP;
                    step(&mut s, &mut oldest, now)
                })
            });
        }
    }
    g.finish();
    c.final_summary();
}
