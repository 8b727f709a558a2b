//! The scheduler against its stated bounds, on the simulator (`userdma_infer::sched::sim`): broad
//! sweeps of 2 to 4 streams (every policy, K from 1 to 8, no, one or every stream with a
//! maximum wait, equal, skewed and random service times, periodic, saturating and random
//! arrivals, shared and separate contexts, from a fixed-seed generator) asserting that no
//! frame waits longer than `Scheduler::wait_bound` says, that a max-wait stream's frames are
//! dispatched within W + the longest service + the switches, and that the scheduler's switch
//! count is the device's; then the case study (live 25 FPS at high priority, playback as fast
//! as possible, 18 ms frames): batch switching with K = 4 against round-robin; strict
//! priority's starvation; round-robin's fair shares.

use userdma_infer::sched::sim::{self, Arrivals, Load, Report};
use userdma_infer::sched::{Nanos, Policy, Scheduler, StreamId, StreamSpec};

const US: Nanos = 1_000;
const MS: Nanos = 1_000_000;

/// splitmix64: a small fixed-seed generator, so every run sweeps the same cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// One simulated case.
struct Case {
    policy: Policy,
    specs: Vec<StreamSpec>,
    loads: Vec<Load>,
    switch: Nanos,
    until: Nanos,
}

/// The largest observed wait ÷ bound over a set of runs, per policy kind.
#[derive(Default)]
struct Tightness {
    worst: f64,
    frames: u64,
    runs: u64,
}

/// Runs a case and asserts every bound on every frame (and on frames still waiting at the
/// end); returns the report and the largest observed wait ÷ bound.
fn check(case: &Case) -> (Report, f64) {
    let mut s = Scheduler::new(case.policy, case.specs.clone()).expect("valid case");
    let report = sim::run(&mut s, &case.loads, case.switch, case.until).expect("valid loads");
    let what = || format!("{} {:?} {:?}", case.policy, case.specs, case.loads);
    assert_eq!(report.refused, 0, "{}", what());
    assert_eq!(report.switches, s.switches(), "switch counts: {}", what());
    assert_eq!(s.decisions(), report.frames.len() as u64);
    let service: Vec<Nanos> = case.loads.iter().map(|l| l.service).collect();
    let t_max = *service.iter().max().unwrap();
    let c = case.switch;
    let bounds: Vec<Option<Nanos>> = (0..case.specs.len())
        .map(|i| s.wait_bound(StreamId(i), &service, c))
        .collect();
    // W + C + T_max + one frame and switch of every other max-wait stream.
    let w_bound = |i: usize| {
        let w = case.specs[i].max_wait?;
        let others: Nanos = (0..case.specs.len())
            .filter(|&j| j != i && case.specs[j].max_wait.is_some())
            .map(|j| c + service[j])
            .sum();
        Some(w + c + t_max + others)
    };
    let one_w = case.specs.iter().filter(|s| s.max_wait.is_some()).count() == 1;
    let mut worst = 0.0f64;
    let waits = report
        .frames
        .iter()
        .map(|f| (f.stream.0, f.wait(), Some(f)));
    let pending = report
        .streams
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.pending.map(|p| (i, p, None)));
    for (i, wait, frame) in waits.chain(pending) {
        if let Some(b) = bounds[i] {
            assert!(
                wait <= b,
                "stream {i} waited {wait} > bound {b} ({frame:?}): {}",
                what()
            );
            worst = worst.max(wait as f64 / b as f64);
        }
        if let Some(b) = w_bound(i) {
            assert!(
                wait <= b,
                "stream {i} waited {wait} > W bound {b}: {}",
                what()
            );
            if let (true, Some(f)) = (one_w, frame) {
                // One max-wait stream: W + the longest service + a switch, from arrival
                // when the frame did not queue behind its own stream.
                let w = case.specs[i].max_wait.unwrap();
                if f.head == f.arrival {
                    assert!(f.arrival_wait() <= w + t_max + c, "{f:?}: {}", what());
                }
            }
        }
    }
    (report, worst)
}

/// A random case of `n` streams under `policy`; `waits`: 0 none, 1 one stream, 2 every
/// stream with a maximum wait.
fn random_case(rng: &mut Rng, n: usize, policy: Policy, waits: u32) -> Case {
    let base = rng.range(1, 10) * 10 * US;
    let mix = rng.range(0, 2);
    let service: Vec<Nanos> = (0..n)
        .map(|i| match mix {
            0 => base,
            1 => base * (1 + 2 * (i as u64 % 2)),
            _ => rng.range(base / 4, base * 4),
        })
        .collect();
    let t_max = *service.iter().max().unwrap();
    let switch = match rng.range(0, 3) {
        0 => 0,
        1 => 2 * US,
        2 => rng.range(1, base),
        _ => rng.range(base, 4 * base),
    };
    let w_stream = rng.range(0, n as u64 - 1) as usize;
    let specs = (0..n)
        .map(|i| {
            let spec = StreamSpec::new(
                format!("s{i}"),
                rng.range(0, 3) as u8,
                // Some streams share a context.
                rng.range(0, n as u64 - 1) as u32,
            );
            let with_w = waits == 2 || (waits == 1 && i == w_stream);
            if with_w {
                spec.with_max_wait(rng.range(t_max / 2, 20 * t_max).max(1))
            } else {
                spec
            }
        })
        .collect();
    let until = 3000 * base;
    let loads = service
        .iter()
        .map(|&t| {
            let arrivals = match rng.range(0, 3) {
                0 => Arrivals::Saturating {
                    in_flight: rng.range(1, 2) as u32,
                },
                1 => Arrivals::Periodic {
                    period: rng.range(t, 6 * t * n as u64),
                    offset: rng.range(0, 5 * t),
                },
                2 => {
                    // Bursts: a few frames at once, then a gap.
                    let mut times = Vec::new();
                    let mut at = 0;
                    while at < until {
                        for _ in 0..rng.range(1, 4) {
                            times.push(at);
                        }
                        at += rng.range(0, 8 * t * n as u64);
                    }
                    Arrivals::Trace(times)
                }
                _ => Arrivals::Saturating { in_flight: 1 },
            };
            Load {
                arrivals,
                service: t,
            }
        })
        .collect();
    Case {
        policy,
        specs,
        loads,
        switch,
        until,
    }
}

/// Random cases per stream count, policy and max-wait setting (`USERDMA_SCHED_REPEATS`
/// overrides it, `USERDMA_SCHED_SEED` the generator's seed, for longer sweeps).
const REPEATS: usize = 12;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number"))
    })
}

#[test]
fn no_frame_waits_longer_than_its_bound_over_random_cases() {
    let mut rng = Rng(env_or("USERDMA_SCHED_SEED", 0x5eed_0015));
    let repeats = env_or("USERDMA_SCHED_REPEATS", REPEATS);
    let mut policies = vec![Policy::RoundRobin, Policy::StrictPriority];
    policies.extend((1..=8).map(|k| Policy::Batch { k }));
    let mut tight: Vec<Tightness> = policies.iter().map(|_| Tightness::default()).collect();
    let mut runs = 0;
    for n in 2..=4 {
        for (p, &policy) in policies.iter().enumerate() {
            for waits in 0..=2 {
                for _ in 0..repeats {
                    let case = random_case(&mut rng, n, policy, waits);
                    let (report, worst) = check(&case);
                    let t = &mut tight[p];
                    t.worst = t.worst.max(worst);
                    t.frames += report.frames.len() as u64;
                    t.runs += 1;
                    runs += 1;
                }
            }
        }
    }
    for (policy, t) in policies.iter().zip(&tight) {
        println!(
            "{policy:>16}: {} runs, {} frames, longest wait {:.0}% of its bound",
            t.runs,
            t.frames,
            t.worst * 100.0
        );
    }
    assert_eq!(runs, 3 * policies.len() * 3 * repeats);
}

/// Two saturating streams under batch switching, double-buffered (a frame waits from its
/// predecessor's dispatch): the observed longest waits, and the bound's slack, which is at
/// most one switch plus the gap between the longest service and the stream's own.
#[test]
fn the_two_stream_batch_bound_is_nearly_reached() {
    for k in 1..=8 {
        let (t_lo, t_hi, c) = (30 * US, 10 * US, 5 * US);
        let load = |service| Load {
            arrivals: Arrivals::Saturating { in_flight: 2 },
            service,
        };
        let case = Case {
            policy: Policy::Batch { k },
            specs: vec![StreamSpec::new("lo", 0, 0), StreamSpec::new("hi", 1, 1)],
            loads: vec![load(t_lo), load(t_hi)],
            switch: c,
            until: 100 * MS,
        };
        let (report, _) = check(&case);
        let s = Scheduler::new(case.policy, case.specs.clone()).unwrap();
        // A frame waits for its predecessor (with the switch into it when the batch is that
        // one frame), the other stream's batch and the switch into it.
        let first = if k == 1 { c } else { 0 };
        let k = Nanos::from(k);
        let lo = report.streams[0].max_wait;
        let hi = report.streams[1].max_wait;
        assert_eq!(lo, t_lo + first + c + k * t_hi, "k = {k}");
        assert_eq!(hi, t_hi + first + c + k * t_lo, "k = {k}");
        let bound = |i| s.wait_bound(StreamId(i), &[t_lo, t_hi], c).unwrap();
        assert!(bound(0) - lo <= c, "k = {k}");
        assert!(bound(1) - hi <= c + (t_lo - t_hi), "k = {k}");
    }
}

/// The case study's mix: live video at 25 FPS and high priority, a recorded video played
/// back as fast as possible at low priority, 18 ms of device time per frame each, two device
/// contexts, a switch costing 20 µs plus the SRAM refill.
fn case_study(policy: Policy, refill: Nanos, playback_w: Option<Nanos>) -> Case {
    let playback = StreamSpec::new("playback", 0, 1);
    Case {
        policy,
        specs: vec![
            StreamSpec::new("live", 1, 0),
            match playback_w {
                Some(w) => playback.with_max_wait(w),
                None => playback,
            },
        ],
        loads: vec![
            Load {
                arrivals: Arrivals::Periodic {
                    period: 40 * MS,
                    offset: 0,
                },
                service: 18 * MS,
            },
            Load {
                arrivals: Arrivals::Saturating { in_flight: 1 },
                service: 18 * MS,
            },
        ],
        switch: 20 * US + refill,
        until: 60_000 * MS,
    }
}

#[test]
fn batch_switching_cuts_the_case_studys_switches_by_70_percent_and_live_keeps_25_fps() {
    println!(
        "{:>9} {:>12} {:>10} {:>9} {:>9} {:>13} {:>13}",
        "refill", "policy", "switches/s", "live FPS", "play FPS", "live wait ms", "play wait ms"
    );
    for refill in [0, 500 * US, 2 * MS] {
        let (rr, _) = check(&case_study(Policy::RoundRobin, refill, None));
        let (batch, _) = check(&case_study(Policy::Batch { k: 4 }, refill, None));
        for (name, r) in [("round-robin", &rr), ("batch K=4", &batch)] {
            println!(
                "{:>7}us {name:>12} {:>10.1} {:>9.2} {:>9.2} {:>13.1} {:>13.1}",
                refill / US,
                r.switches_per_sec(),
                r.fps(StreamId(0)),
                r.fps(StreamId(1)),
                r.streams[0].max_wait as f64 / 1e6,
                r.streams[1].max_wait as f64 / 1e6
            );
        }
        let cut = 1.0 - batch.switches as f64 / rr.switches as f64;
        assert!(cut >= 0.70, "refill {refill}: switches cut by {cut:.3}");
        for r in [&rr, &batch] {
            // The live stream keeps up: of its 1500 frames in 60 s, at most the last one is
            // still waiting when the run ends.
            assert!(r.streams[0].frames >= 1499, "refill {refill}");
            assert!(r.fps(StreamId(0)) >= 24.95);
        }
        // The device does more useful work with fewer switches.
        assert!(batch.streams[1].frames >= rr.streams[1].frames);
    }
}

#[test]
fn a_playback_max_wait_holds_in_the_case_study() {
    for w in [30 * MS, 60 * MS, 100 * MS] {
        for policy in [Policy::Batch { k: 4 }, Policy::StrictPriority] {
            let case = case_study(policy, 500 * US, Some(w));
            let (report, _) = check(&case);
            println!(
                "{policy:>16}, playback W {:>3} ms: live {:.2} FPS, playback {:.2} FPS, \
                 {:.1} switches/s, playback waited at most {:.1} ms",
                w / MS,
                report.fps(StreamId(0)),
                report.fps(StreamId(1)),
                report.switches_per_sec(),
                report.streams[1].max_wait as f64 / 1e6
            );
            // W + the longest service + a switch: the frame in progress when it fell due.
            assert!(report.streams[1].max_wait <= w + 18 * MS + case.switch);
            assert!(report.streams[1].frames > 0);
            assert!(report.streams[0].frames >= 1499);
        }
    }
}

#[test]
fn strict_priority_starves_a_lower_stream_and_states_no_bound() {
    let specs = vec![StreamSpec::new("hi", 1, 0), StreamSpec::new("lo", 0, 1)];
    let loads = vec![
        Load {
            arrivals: Arrivals::Saturating { in_flight: 2 },
            service: 10 * US,
        },
        Load {
            arrivals: Arrivals::Periodic {
                period: 100 * US,
                offset: 0,
            },
            service: 10 * US,
        },
    ];
    let mut s = Scheduler::new(Policy::StrictPriority, specs.clone()).unwrap();
    let report = sim::run(&mut s, &loads, US, 10 * MS).unwrap();
    assert_eq!(report.streams[1].frames, 0, "the low stream never runs");
    // Its first frame has waited the whole run.
    assert_eq!(report.streams[1].pending, Some(report.end));
    assert_eq!(s.wait_bound(StreamId(1), &[10 * US, 10 * US], US), None);
    assert_eq!(
        s.wait_bound(StreamId(0), &[10 * US, 10 * US], US),
        Some(US + 10 * US)
    );
    // The same load under batch switching: the low stream runs, within its bound.
    for k in [1, 4, 8] {
        let mut s = Scheduler::new(Policy::Batch { k }, specs.clone()).unwrap();
        let report = sim::run(&mut s, &loads, US, 10 * MS).unwrap();
        let bound = s.wait_bound(StreamId(1), &[10 * US, 10 * US], US).unwrap();
        assert!(report.streams[1].frames >= 99, "k = {k}");
        assert!(report.streams[1].max_wait <= bound);
    }
}

#[test]
fn round_robin_shares_the_device_frame_by_frame() {
    for n in 2..=4 {
        let specs: Vec<_> = (0..n)
            .map(|i| StreamSpec::new(format!("s{i}"), (n - i) as u8, i as u32))
            .collect();
        let loads: Vec<_> = (0..n)
            .map(|i| Load {
                arrivals: Arrivals::Saturating { in_flight: 2 },
                service: (1 + i as u64) * 10 * US,
            })
            .collect();
        let mut s = Scheduler::new(Policy::RoundRobin, specs).unwrap();
        let report = sim::run(&mut s, &loads, 2 * US, 50 * MS).unwrap();
        // Priorities ignored: every stream within one frame of the others, and a switch
        // before every frame but the first.
        let frames: Vec<u64> = report.streams.iter().map(|r| r.frames).collect();
        let (lo, hi) = (frames.iter().min().unwrap(), frames.iter().max().unwrap());
        assert!(hi - lo <= 1, "{frames:?}");
        assert_eq!(report.switches, report.frames.len() as u64 - 1);
        // The bound is one round: every stream's frame and switch.
        let service: Vec<Nanos> = loads.iter().map(|l| l.service).collect();
        let round: Nanos = service.iter().map(|t| t + 2 * US).sum();
        for i in 0..n {
            assert_eq!(s.wait_bound(StreamId(i), &service, 2 * US), Some(round));
            assert!(report.streams[i].max_wait <= round);
        }
    }
}

#[test]
fn batch_switching_starves_nobody_at_any_level() {
    // Four levels, all saturating: every stream runs, within its bound.
    for k in 1..=8 {
        let specs: Vec<_> = (0..4)
            .map(|i| StreamSpec::new(format!("p{i}"), i as u8, i as u32))
            .collect();
        let loads: Vec<_> = (0..4)
            .map(|i| Load {
                arrivals: Arrivals::Saturating { in_flight: 1 },
                service: (4 - i as u64) * 5 * US,
            })
            .collect();
        let case = Case {
            policy: Policy::Batch { k },
            specs,
            loads,
            switch: 3 * US,
            until: 20 * MS,
        };
        let (report, _) = check(&case);
        let frames: Vec<u64> = report.streams.iter().map(|r| r.frames).collect();
        assert!(frames.iter().all(|&f| f > 100), "k = {k}: {frames:?}");
        // The top stream gets every other batch: about half the frames... of batches.
        let top_batches = report
            .frames
            .windows(2)
            .filter(|w| w[1].stream == StreamId(3) && w[0].stream != StreamId(3))
            .count();
        let batches = report
            .frames
            .windows(2)
            .filter(|w| w[1].stream != w[0].stream)
            .count();
        assert!(
            top_batches * 2 + 2 >= batches,
            "k = {k}: {top_batches} of {batches}"
        );
    }
}
