//! The scheduler's decisions under random streams, policies and `(now, oldest)` sequences
//! (time may go backwards, frames come and go), against a model: `Scheduler::new` refuses
//! exactly the specs the model refuses, with the model's error; `decide` never panics,
//! returns a stream exactly when one has a frame waiting and only such a stream; a frame
//! overdue by its maximum wait (counted from the later of its arrival and its stream's last
//! dispatch) is chosen before any other, the most overdue first; an unforced choice is the
//! policy's (round-robin: least recently served; strict: highest priority, least recently
//! served among equals; batch: a stream never runs more than K frames in a row while another
//! waits); the switch flags and counts are the model's; `wait_bound` never panics.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma_infer::sched::{Error, Nanos, Policy, Scheduler, StreamId, StreamSpec, MAX_STREAMS};

#[derive(Debug, Arbitrary)]
struct Stream {
    priority: u8,
    context: u8,
    max_wait: Option<u16>,
    /// Named like the first stream.
    duplicate: bool,
}

#[derive(Debug, Arbitrary)]
enum PolicyIn {
    RoundRobin,
    Strict,
    Batch(u8),
}

#[derive(Debug, Arbitrary)]
struct Step {
    /// Time step; negative goes backwards.
    dt: i16,
    /// Which streams have a frame waiting.
    waiting: u64,
    /// How long before `now` the waiting frames arrived (per stream, cycled).
    ages: Vec<u8>,
}

#[derive(Debug, Arbitrary)]
struct Input {
    policy: PolicyIn,
    streams: Vec<Stream>,
    /// Add this many plain streams, to reach the limit of 64 (and pass it).
    extra: u8,
    steps: Vec<Step>,
    service: Vec<u16>,
    switch: u16,
}

/// The error `Scheduler::new` must give, if any.
fn expected_error(policy: Policy, specs: &[StreamSpec]) -> Option<Error> {
    if specs.is_empty() {
        return Some(Error::NoStreams);
    }
    if specs.len() > MAX_STREAMS {
        return Some(Error::TooManyStreams {
            count: specs.len(),
            max: MAX_STREAMS,
        });
    }
    if policy == (Policy::Batch { k: 0 }) {
        return Some(Error::ZeroBatch);
    }
    for (i, s) in specs.iter().enumerate() {
        if s.max_wait == Some(0) {
            return Some(Error::ZeroMaxWait {
                stream: s.name.clone(),
            });
        }
        if let Some(first) = specs[..i].iter().position(|o| o.name == s.name) {
            return Some(Error::DuplicateName {
                name: s.name.clone(),
                first,
                second: i,
            });
        }
    }
    None
}

fuzz_target!(|input: Input| {
    let policy = match input.policy {
        PolicyIn::RoundRobin => Policy::RoundRobin,
        PolicyIn::Strict => Policy::StrictPriority,
        PolicyIn::Batch(k) => Policy::Batch {
            k: u32::from(k % 10),
        },
    };
    let mut specs: Vec<StreamSpec> = input
        .streams
        .iter()
        .take(16)
        .enumerate()
        .map(|(i, s)| StreamSpec {
            name: if s.duplicate && i > 0 {
                "s0".to_owned()
            } else {
                format!("s{i}")
            },
            priority: s.priority % 4,
            max_wait: s.max_wait.map(Nanos::from),
            context: u32::from(s.context % 4),
        })
        .collect();
    if input.extra > 200 {
        let from = specs.len();
        specs.extend(
            (from..from + usize::from(input.extra - 200))
                .map(|i| StreamSpec::new(format!("x{i}"), (i % 3) as u8, (i % 5) as u32)),
        );
    }
    let made = Scheduler::new(policy, specs.clone());
    let mut s = match (made, expected_error(policy, &specs)) {
        (Ok(s), None) => s,
        (Err(e), Some(want)) => {
            assert_eq!(e, want);
            return;
        }
        (got, want) => panic!("new: got {got:?}, the model says {want:?}"),
    };
    let n = specs.len();
    let k = match policy {
        Policy::Batch { k } => k,
        _ => u32::MAX,
    };

    // The model.
    let mut served = vec![0u64; n];
    let mut dispatched = vec![0 as Nanos; n];
    let mut last: Option<usize> = None;
    let (mut decisions, mut switches) = (0u64, 0u64);
    let mut streak = 0u32;
    let mut now: Nanos = 1 << 20;
    let mut oldest = vec![None; n];
    for step in input.steps.iter().take(256) {
        now = now.saturating_add_signed(i64::from(step.dt));
        for (i, o) in oldest.iter_mut().enumerate() {
            let age = step
                .ages
                .get(i % step.ages.len().max(1))
                .copied()
                .unwrap_or(0);
            *o = ((step.waiting >> (i % 64)) & 1 == 1).then(|| now.saturating_sub(u64::from(age)));
        }
        let d = s.decide(now, &oldest);
        let Some(d) = d else {
            assert!(
                oldest.iter().all(Option::is_none),
                "no decision with frames waiting"
            );
            continue;
        };
        let i = d.stream.0;
        assert!(i < n && oldest[i].is_some(), "{i} has nothing waiting");
        // Overdue streams, and how late each is.
        let late = |j: usize| -> Option<Nanos> {
            let w = specs[j].max_wait?;
            let since = oldest[j]?.max(dispatched[j]);
            now.saturating_sub(since).checked_sub(w)
        };
        let most_late = (0..n).filter_map(late).max();
        match most_late {
            Some(m) => {
                assert!(d.forced, "an overdue frame waits");
                assert_eq!(late(i), Some(m), "not the most overdue");
                let best = (0..n)
                    .filter(|&j| late(j) == Some(m))
                    .map(|j| specs[j].priority)
                    .max();
                assert_eq!(Some(specs[i].priority), best, "ties by priority");
            }
            None => assert!(!d.forced, "forced with nothing overdue"),
        }
        let others = (0..n).any(|j| j != i && oldest[j].is_some());
        if !d.forced {
            let waiting = || (0..n).filter(|&j| oldest[j].is_some());
            match policy {
                Policy::RoundRobin => {
                    assert_eq!(Some(served[i]), waiting().map(|j| served[j]).min());
                }
                Policy::StrictPriority => {
                    let top = waiting().map(|j| specs[j].priority).max();
                    assert_eq!(Some(specs[i].priority), top);
                    let lru = waiting()
                        .filter(|&j| Some(specs[j].priority) == top)
                        .map(|j| served[j])
                        .min();
                    assert_eq!(Some(served[i]), lru);
                }
                Policy::Batch { .. } => {}
            }
        }
        // Batches: at most K unforced frames in a row while another stream waits.
        if last == Some(i) {
            if others && !d.forced {
                streak += 1;
            }
        } else {
            streak = u32::from(others && !d.forced);
        }
        assert!(
            streak <= k,
            "{streak} frames in a row against waiting streams"
        );
        let switch = last.is_some_and(|l| specs[l].context != specs[i].context);
        assert_eq!(d.switch, switch);
        decisions += 1;
        switches += u64::from(switch);
        served[i] = decisions;
        dispatched[i] = now;
        last = Some(i);
        assert_eq!(s.decisions(), decisions);
        assert_eq!(s.switches(), switches);
    }
    // Bounds: any service times, a wrong stream, a short slice: no panic.
    let service: Vec<Nanos> = input.service.iter().map(|&t| Nanos::from(t)).collect();
    for i in 0..=n {
        let b = s.wait_bound(StreamId(i), &service, Nanos::from(input.switch));
        if i == n || service.len() < n {
            assert_eq!(b, None);
        }
    }
});
