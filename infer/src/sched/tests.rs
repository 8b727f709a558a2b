//! Unit tests of the decisions and the bound formulas, step by step. The simulator sweeps
//! that check the bounds on whole runs are in `infer/tests/sched.rs`.

use super::*;

const MS: Nanos = 1_000_000;

fn spec(name: &str, priority: u8, context: u32) -> StreamSpec {
    StreamSpec::new(name, priority, context)
}

fn sched(policy: Policy, specs: &[StreamSpec]) -> Scheduler {
    Scheduler::new(policy, specs.to_vec()).unwrap()
}

/// The streams chosen over `steps` decisions with every stream always waiting.
fn sequence(s: &mut Scheduler, steps: usize) -> Vec<usize> {
    let all = vec![Some(0); s.streams().len()];
    (0..steps)
        .map(|i| s.decide(i as Nanos, &all).unwrap().stream.0)
        .collect()
}

#[test]
fn new_refuses_bad_specs_saying_what_to_do() {
    let ok = || vec![spec("a", 0, 0), spec("b", 0, 1)];
    let e = |p, v| Scheduler::new(p, v).unwrap_err();
    assert_eq!(e(Policy::RoundRobin, vec![]), Error::NoStreams);
    let many: Vec<_> = (0..65).map(|i| spec(&format!("s{i}"), 0, 0)).collect();
    let err = e(Policy::RoundRobin, many);
    assert_eq!(err, Error::TooManyStreams { count: 65, max: 64 });
    assert!(err.to_string().contains("one scheduler per device"));
    let err = e(Policy::Batch { k: 0 }, ok());
    assert_eq!(err, Error::ZeroBatch);
    assert!(err.to_string().contains("K >= 1"));
    let err = e(
        Policy::StrictPriority,
        vec![spec("a", 0, 0), spec("b", 0, 0).with_max_wait(0)],
    );
    assert_eq!(err, Error::ZeroMaxWait { stream: "b".into() });
    let err = e(Policy::RoundRobin, vec![spec("a", 0, 0), spec("", 0, 0)]);
    assert_eq!(err, Error::EmptyName { index: 1 });
    let err = e(
        Policy::RoundRobin,
        vec![spec("a", 0, 0), spec("b", 0, 0), spec("a", 1, 1)],
    );
    assert_eq!(
        err,
        Error::DuplicateName {
            name: "a".into(),
            first: 0,
            second: 2
        }
    );
    assert!(err.to_string().contains("its own name"));
    let full: Vec<_> = (0..64).map(|i| spec(&format!("s{i}"), 0, i)).collect();
    assert!(Scheduler::new(Policy::Batch { k: 1 }, full).is_ok());
}

#[test]
fn nothing_waiting_is_no_decision() {
    let mut s = sched(Policy::RoundRobin, &[spec("a", 0, 0), spec("b", 0, 1)]);
    assert_eq!(s.decide(5, &[None, None]), None);
    assert_eq!(s.decide(5, &[]), None);
    assert_eq!((s.decisions(), s.switches()), (0, 0));
    // Entries beyond the streams are ignored.
    assert_eq!(s.decide(5, &[None, None, Some(0)]), None);
    let d = s.decide(6, &[None, Some(1), Some(0)]).unwrap();
    assert_eq!(d.stream, StreamId(1));
    assert_eq!(s.decisions(), 1);
}

#[test]
fn round_robin_takes_turns_ignoring_priority() {
    let mut s = sched(
        Policy::RoundRobin,
        &[spec("a", 9, 0), spec("b", 0, 1), spec("c", 3, 2)],
    );
    assert_eq!(sequence(&mut s, 7), [0, 1, 2, 0, 1, 2, 0]);
    assert_eq!(s.switches(), 6);
    // A stream that was not waiting comes in at its turn: least recently served first.
    let d = s.decide(10, &[Some(0), None, Some(0)]).unwrap();
    assert_eq!(d.stream, StreamId(2));
    let d = s.decide(11, &[Some(0), Some(0), Some(0)]).unwrap();
    assert_eq!(d.stream, StreamId(1));
}

#[test]
fn strict_priority_runs_the_highest_and_rotates_equals() {
    let mut s = sched(
        Policy::StrictPriority,
        &[spec("lo", 0, 0), spec("hi1", 5, 1), spec("hi2", 5, 2)],
    );
    assert_eq!(sequence(&mut s, 6), [1, 2, 1, 2, 1, 2]);
    let d = s.decide(9, &[Some(0), None, None]).unwrap();
    assert_eq!(d.stream, StreamId(0));
}

#[test]
fn switches_count_context_changes_only() {
    // a and b share context 0; c is on 1.
    let mut s = sched(
        Policy::RoundRobin,
        &[spec("a", 0, 0), spec("b", 0, 0), spec("c", 0, 1)],
    );
    let flags: Vec<bool> = (0..6)
        .map(|i| s.decide(i, &[Some(0); 3]).unwrap().switch)
        .collect();
    // a (first: nothing to switch from), b (same context), c, a, b, c.
    assert_eq!(flags, [false, false, true, true, false, true]);
    assert_eq!(s.switches(), 3);
}

#[test]
fn batch_runs_k_in_a_row_each_way_when_both_wait() {
    for k in 1..=5 {
        let mut s = sched(Policy::Batch { k }, &[spec("lo", 0, 0), spec("hi", 1, 1)]);
        let got = sequence(&mut s, 4 * k as usize);
        let k = k as usize;
        let mut want = vec![1; k];
        want.extend(vec![0; k]);
        want.extend(vec![1; k]);
        want.extend(vec![0; k]);
        assert_eq!(got, want, "k = {k}");
        assert_eq!(s.switches(), 3);
    }
}

#[test]
fn batch_does_not_idle_for_the_high_stream_and_counts_only_contended_frames() {
    let mut s = sched(
        Policy::Batch { k: 2 },
        &[spec("lo", 0, 0), spec("hi", 1, 1)],
    );
    let only_lo = [Some(0), None];
    let both = [Some(0), Some(0)];
    // The high stream has nothing: the low one runs, as long as it likes.
    for t in 0..5 {
        assert_eq!(s.decide(t, &only_lo).unwrap().stream, StreamId(0));
    }
    // The high one arrives: the low one keeps the device for 2 more frames, then yields.
    assert_eq!(s.decide(5, &both).unwrap().stream, StreamId(0));
    assert_eq!(s.decide(6, &both).unwrap().stream, StreamId(0));
    let d = s.decide(7, &both).unwrap();
    assert_eq!((d.stream, d.switch, d.forced), (StreamId(1), true, false));
    // The high one runs 2 against the waiting low one, then the low one's turn.
    assert_eq!(s.decide(8, &both).unwrap().stream, StreamId(1));
    assert_eq!(s.decide(9, &both).unwrap().stream, StreamId(0));
    // The low one's turn: 2 frames against the waiting high one, then the high one, which
    // runs alone while the low one has nothing, and the low one's turn again.
    assert_eq!(s.decide(10, &both).unwrap().stream, StreamId(0));
    assert_eq!(s.decide(11, &both).unwrap().stream, StreamId(1));
    assert_eq!(s.decide(12, &[None, Some(0)]).unwrap().stream, StreamId(1));
    assert_eq!(s.decide(13, &only_lo).unwrap().stream, StreamId(0));
}

#[test]
fn batch_gives_every_other_batch_to_the_top_and_turns_to_the_rest() {
    // Three levels, all saturated, K = 1: the top stream alternates with the lower ones,
    // which take turns; nobody starves.
    let mut s = sched(
        Policy::Batch { k: 1 },
        &[spec("lo", 0, 0), spec("mid", 1, 1), spec("top", 2, 2)],
    );
    assert_eq!(sequence(&mut s, 8), [2, 1, 2, 0, 2, 1, 2, 0]);
    // Two equal tops and a low one: the tops take turns, the low one gets a turn after each.
    let mut s = sched(
        Policy::Batch { k: 2 },
        &[spec("t1", 1, 0), spec("t2", 1, 1), spec("lo", 0, 2)],
    );
    assert_eq!(sequence(&mut s, 12), [0, 0, 2, 2, 1, 1, 2, 2, 0, 0, 2, 2]);
}

#[test]
fn an_overdue_frame_runs_next_whatever_its_priority() {
    let mut s = sched(
        Policy::StrictPriority,
        &[spec("lo", 0, 0).with_max_wait(10), spec("hi", 1, 1)],
    );
    let d = s.decide(9, &[Some(0), Some(0)]).unwrap();
    assert_eq!((d.stream, d.forced), (StreamId(1), false));
    let d = s.decide(10, &[Some(0), Some(0)]).unwrap();
    assert_eq!((d.stream, d.forced, d.switch), (StreamId(0), true, true));
    // Its next frame, waiting since before that dispatch, is due 10 after the dispatch.
    let d = s.decide(19, &[Some(1), Some(0)]).unwrap();
    assert_eq!(d.stream, StreamId(1));
    let d = s.decide(20, &[Some(1), Some(0)]).unwrap();
    assert_eq!((d.stream, d.forced), (StreamId(0), true));
}

#[test]
fn the_most_overdue_runs_first() {
    let mut s = sched(
        Policy::RoundRobin,
        &[
            spec("a", 0, 0).with_max_wait(100),
            spec("b", 0, 1).with_max_wait(10),
            spec("c", 9, 2),
        ],
    );
    // a is 50 past its W, b 140 past its: b first, then a.
    let d = s.decide(150, &[Some(0), Some(0), Some(0)]).unwrap();
    assert_eq!((d.stream, d.forced), (StreamId(1), true));
    let d = s.decide(151, &[Some(0), Some(140), Some(0)]).unwrap();
    assert_eq!((d.stream, d.forced), (StreamId(0), true));
    // Equally overdue: priority decides.
    let mut s = sched(
        Policy::RoundRobin,
        &[
            spec("a", 0, 0).with_max_wait(10),
            spec("b", 1, 1).with_max_wait(10),
        ],
    );
    let d = s.decide(20, &[Some(0), Some(0)]).unwrap();
    assert_eq!((d.stream, d.forced), (StreamId(1), true));
}

#[test]
fn a_forced_frame_does_not_end_the_batch_it_interrupts() {
    let mut s = sched(
        Policy::Batch { k: 3 },
        &[spec("lo", 0, 0).with_max_wait(5), spec("hi", 1, 1)],
    );
    let both = |t| [Some(t), Some(0)];
    // hi's batch begins; lo's frame arrived at 0 and is due at 5.
    assert_eq!(s.decide(0, &both(0)).unwrap().stream, StreamId(1));
    assert_eq!(s.decide(5, &both(0)).unwrap().stream, StreamId(0));
    // hi resumes its batch: two more frames against the waiting lo.
    assert_eq!(s.decide(6, &both(6)).unwrap().stream, StreamId(1));
    assert_eq!(s.decide(7, &both(6)).unwrap().stream, StreamId(1));
    assert_eq!(s.decide(8, &both(6)).unwrap().stream, StreamId(0));
    assert_eq!(s.switches(), 3);
    // lo's turn is 3 frames less the one it ran forced: 2.
    assert_eq!(s.decide(9, &both(8)).unwrap().stream, StreamId(0));
    assert_eq!(s.decide(10, &both(9)).unwrap().stream, StreamId(1));
}

#[test]
fn time_going_backwards_counts_as_no_wait() {
    let mut s = sched(
        Policy::Batch { k: 2 },
        &[spec("a", 0, 0).with_max_wait(10), spec("b", 1, 1)],
    );
    assert!(s.decide(1000, &[Some(0), Some(0)]).unwrap().forced);
    // Earlier than the last dispatch, and than the arrival: nothing is overdue.
    let d = s.decide(5, &[Some(900), Some(0)]).unwrap();
    assert!(!d.forced);
    let d = s.decide(0, &[Some(u64::MAX), Some(u64::MAX)]).unwrap();
    assert!(!d.forced);
    assert_eq!(s.decisions(), 3);
}

#[test]
fn bounds_of_two_streams_under_each_policy() {
    let specs = [spec("lo", 0, 0), spec("hi", 1, 1)];
    let (t, c) = ([10 * MS, 18 * MS], MS);
    let rr = sched(Policy::RoundRobin, &specs);
    assert_eq!(rr.wait_bound(StreamId(0), &t, c), Some(2 * c + 28 * MS));
    assert_eq!(rr.wait_bound(StreamId(1), &t, c), Some(2 * c + 28 * MS));
    let strict = sched(Policy::StrictPriority, &specs);
    assert_eq!(strict.wait_bound(StreamId(0), &t, c), None);
    assert_eq!(strict.wait_bound(StreamId(1), &t, c), Some(c + 18 * MS));
    for k in 1..=8u64 {
        let b = sched(Policy::Batch { k: k as u32 }, &specs);
        // W_lo <= 2C + T_max + K·T_hi, W_hi <= 2C + T_max + K·T_lo.
        let lo = b.wait_bound(StreamId(0), &t, c);
        assert_eq!(lo, Some(2 * c + 18 * MS + k * 18 * MS));
        let hi = b.wait_bound(StreamId(1), &t, c);
        assert_eq!(hi, Some(2 * c + 18 * MS + k * 10 * MS));
    }
}

#[test]
fn bounds_of_batches_over_several_levels() {
    // top (2), mid1 and mid2 (1), lo (0), service 1, 2, 3, 4, switch 10, K = 2.
    let specs = [
        spec("top", 2, 0),
        spec("mid1", 1, 1),
        spec("mid2", 1, 2),
        spec("lo", 0, 3),
    ];
    let (t, c, k) = ([1, 2, 3, 4], 10, 2);
    let s = sched(Policy::Batch { k: k as u32 }, &specs);
    let batch = |x: u64| c + k * x;
    let t_max = 4;
    // top: no stream above or equal; one batch of the lowest below it.
    assert_eq!(s.wait_bound(StreamId(0), &t, c), Some(c + t_max + batch(4)));
    // mid1: Y = {mid2, lo}; #Y+1 batches of top, one of each in Y, then #E+1 = 2 of lo.
    assert_eq!(
        s.wait_bound(StreamId(1), &t, c),
        Some(c + t_max + 3 * batch(1) + batch(3) + batch(4) + 2 * batch(4))
    );
    // lo: A = {top, mid1, mid2} on two levels (T 1, and 3), Y = {mid1, mid2}: #Y+1 runs of
    // a batch per level, one of each in Y; nothing below.
    assert_eq!(
        s.wait_bound(StreamId(3), &t, c),
        Some(c + t_max + 3 * (batch(1) + batch(3)) + batch(2) + batch(3))
    );
}

#[test]
fn max_wait_bounds() {
    let (t, c) = ([10 * MS, 18 * MS], MS);
    // Strict priority below a saturating stream: no bound, unless the stream has a W.
    let strict = sched(
        Policy::StrictPriority,
        &[spec("lo", 0, 0).with_max_wait(50 * MS), spec("hi", 1, 1)],
    );
    assert_eq!(
        strict.wait_bound(StreamId(0), &t, c),
        Some(50 * MS + c + 18 * MS)
    );
    // The high stream now also suffers lo's forced frames, at least 50 ms apart, each
    // 2C + T_lo: L = 19 + (⌊L/50⌋ + 1)·12 gives 31 (ms).
    assert_eq!(strict.wait_bound(StreamId(1), &t, c), Some(31 * MS));
    // A batch bound tighter than W wins.
    let b = sched(
        Policy::Batch { k: 1 },
        &[spec("lo", 0, 0).with_max_wait(500 * MS), spec("hi", 1, 1)],
    );
    assert_eq!(b.wait_bound(StreamId(0), &t, c), Some(2 * c + 36 * MS));
    // Two max-wait streams: each may have the other's frame ahead of it.
    let both = sched(
        Policy::StrictPriority,
        &[
            spec("lo", 0, 0).with_max_wait(50 * MS),
            spec("hi", 1, 1).with_max_wait(30 * MS),
        ],
    );
    assert_eq!(
        both.wait_bound(StreamId(0), &t, c),
        Some(50 * MS + c + 18 * MS + c + 18 * MS)
    );
}

#[test]
fn bounds_refuse_what_they_cannot_state() {
    let s = sched(Policy::RoundRobin, &[spec("a", 0, 0), spec("b", 0, 1)]);
    assert_eq!(s.wait_bound(StreamId(2), &[1, 1], 1), None);
    assert_eq!(s.wait_bound(StreamId(0), &[1], 1), None);
    assert_eq!(s.wait_bound(StreamId(0), &[u64::MAX, 1], 1), None);
    // Forced frames that could fill the device: W = 10, each forced frame costs 2 + 9.
    let s = sched(
        Policy::StrictPriority,
        &[spec("a", 0, 0).with_max_wait(10), spec("b", 1, 1)],
    );
    assert_eq!(s.wait_bound(StreamId(1), &[9, 5], 1), None);
    assert_eq!(s.wait_bound(StreamId(0), &[9, 5], 1), Some(10 + 1 + 9));
}

fn j<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap()
}

#[test]
fn public_types_serialize_for_reports() {
    assert_eq!(j(&Policy::Batch { k: 4 }), r#"{"Batch":{"k":4}}"#);
    assert_eq!(j(&Policy::RoundRobin), r#""RoundRobin""#);
    assert_eq!(
        j(&spec("live", 1, 0).with_max_wait(5)),
        r#"{"name":"live","priority":1,"max_wait":5,"context":0}"#
    );
    let d = Decision {
        stream: StreamId(3),
        switch: true,
        forced: false,
    };
    assert_eq!(j(&d), r#"{"stream":3,"switch":true,"forced":false}"#);
    assert_eq!(Policy::Batch { k: 4 }.to_string(), "batch K=4");
    let s = sched(Policy::RoundRobin, &[spec("a", 0, 0), spec("b", 0, 1)]);
    assert_eq!(s.find("b"), Some(StreamId(1)));
    assert_eq!(s.find("c"), None);
}
