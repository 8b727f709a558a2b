//! Streams on devices that fail mid-run: a removed device's streams stop while the other
//! device's go on at their rate; a device whose frames time out is reset and its pipelines
//! recovered, the run going on; every fault reported, every lost frame counted, every result
//! that is handed over right, nothing leaked.

use std::sync::Arc;
use std::time::Duration;

use userdma::{Code, Runtime};
use userdma_infer::pipeline::{Config, Model, Pipeline};
use userdma_infer::sched::streams::{Arrivals, Recovery, RunReport, Stream, StreamReport, Streams};
use userdma_infer::sched::{Policy, StreamId, StreamSpec};
use userdma_loopback::fault::{Injection, Kind};
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};

mod frames;

use frames::{expected, fill};

fn runtime(cost: Cost) -> Runtime {
    Runtime::loopback(loopback::Config::default().cost(cost).queues(8)).expect("loopback device")
}

fn stream(rt: &Runtime, model: &Model, s: usize, arrivals: Arrivals, timeout: Duration) -> Stream {
    let context = s as u32 + 1;
    let config = Config {
        queue: 0,
        context,
        timeout,
        ..Config::default()
    };
    Stream {
        spec: StreamSpec::new(format!("s{s}"), 0, context),
        arrivals,
        pipeline: Pipeline::new(rt, model.clone(), config).expect("pipeline"),
    }
}

/// Runs for `ms`, checking every result handed over; returns the report and per stream the
/// frame numbers seen.
fn run(streams: &mut Streams, model: &Model, ms: u64) -> (RunReport, u64) {
    let mut scratch = vec![0u8; model.input().bytes as usize];
    let mut got = vec![0u8; model.result().bytes as usize];
    let mut wrong = 0u64;
    let report = streams
        .run(
            Duration::from_millis(ms),
            |id: StreamId, n, input| {
                fill(id.0, n, &mut scratch);
                input.write(0, &scratch)
            },
            |id, done| {
                if let Ok(out) = done.result {
                    out.read(0, &mut got).unwrap();
                    wrong += u64::from(got != expected(model, id.0, done.frame));
                }
            },
        )
        .expect("the run survives the fault");
    (report, wrong)
}

#[test]
fn a_removed_device_stops_its_streams_and_the_other_device_goes_on() {
    let model = Model::chain(2, 4096).unwrap();
    let (a, b) = (runtime(Cost::npu()), runtime(Cost::npu()));
    let period = Arrivals::Periodic { period: 10_000_000 };
    let timeout = Duration::from_secs(10);
    let streams = vec![
        stream(&a, &model, 0, period, timeout),
        stream(&b, &model, 1, period, timeout),
    ];
    let mut s = Streams::new(Policy::RoundRobin, streams, 1).unwrap();
    let doomed = Arc::clone(b.loopback_device().unwrap());
    let remover = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        doomed.remove();
    });
    let (report, wrong) = run(&mut s, &model, 1000);
    remover.join().unwrap();
    assert_eq!(wrong, 0, "every result handed over is right");
    assert_eq!(report.faults.len(), 1, "{:?}", report.faults);
    let fault = &report.faults[0];
    assert_eq!(fault.device, 1);
    assert!(fault.removed);
    assert_eq!(fault.code, Code::Removed);
    assert!(
        (250_000_000..900_000_000).contains(&fault.at_ns),
        "seen at {} ns",
        fault.at_ns
    );
    let (s0, s1) = (&report.streams[0], &report.streams[1]);
    // The healthy device ran its stream at its rate all along (100 frames/s for 1 s).
    assert!(s0.frames >= 80, "{s0:?}");
    assert_eq!(s0.lost, 0);
    // The removed one ran until the removal, then nothing.
    assert!(s1.frames >= 15 && s1.frames <= 45, "{s1:?}");
    assert_eq!(s1.lost, fault.lost);
    assert!(s1.frames + s1.lost + s1.dropped + s1.left_waiting > s1.frames);
    // Every frame that arrived is accounted for, on both devices.
    for st in &report.streams {
        assert_eq!(
            st.arrived,
            st.frames + st.failed + st.lost + st.dropped + st.left_waiting,
            "{st:?}"
        );
    }
    drop(s.into_streams());
    assert_eq!(userdma::ring::leaks().queues, 0);
}

#[test]
fn a_device_that_stops_answering_is_reset_and_the_run_goes_on() {
    // Each frame takes ~40 ms of modelled compute; the pipelines give up after 10 ms, so
    // every frame times out, is recovered (reset, slots back, queues reopened) and counted
    // as lost, and the run still ends on time with the device usable.
    let model = Model::chain(2, 4096).unwrap();
    let slow = Cost {
        compute_bytes_per_sec: 200_000,
        ..Cost::zero()
    };
    let rt = runtime(slow);
    let streams = vec![stream(
        &rt,
        &model,
        0,
        Arrivals::Periodic { period: 50_000_000 },
        Duration::from_millis(10),
    )];
    let mut s = Streams::new(Policy::RoundRobin, streams, 1).unwrap();
    let (report, wrong) = run(&mut s, &model, 300);
    assert_eq!(wrong, 0);
    assert!(!report.faults.is_empty(), "{report:?}");
    assert!(report
        .faults
        .iter()
        .all(|f| !f.removed && f.code == Code::Timeout));
    let lost: u64 = report.faults.iter().map(|f| f.lost).sum();
    assert_eq!(report.streams[0].lost, lost);
    assert!(lost >= 1);
    let st = &report.streams[0];
    assert_eq!(
        st.arrived,
        st.frames + st.failed + st.lost + st.dropped + st.left_waiting,
        "every frame that arrived is accounted for: {st:?}"
    );
    assert!(report.seconds < 2.0, "{}", report.seconds);
    let rt_device = rt.loopback_device().unwrap();
    assert!(
        rt_device.is_running(),
        "the device is usable after the resets"
    );
    drop(s.into_streams());
    assert_eq!(userdma::ring::leaks().queues, 0);
}

/// Injects `injection` into every queue of `rt`'s device: every descriptor it serves.
fn inject_everywhere(rt: &Runtime, injection: &Injection) {
    let device = rt.loopback_device().unwrap();
    for q in 0..device.config().queue_count() {
        device.inject(q, injection).unwrap();
    }
}

/// The pipeline timeout of a healthy device's streams beside a failing one.
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether a healthy stream ran at its rate beside a failing device: every frame that arrived
/// finished but the last two. Under a sanitizer the loop and the loopback engines run at a
/// fraction of their speed on a shared machine and a 200 frames/s stream falls behind whatever
/// the other device does, so there it must finish at least half (the waits, counted as the
/// bounds count them, are checked beside this in both builds).
fn kept_its_rate(s: &StreamReport) -> bool {
    if cfg!(any(
        userdma_sanitize = "address",
        userdma_sanitize = "thread"
    )) {
        s.frames * 2 >= s.arrived
    } else {
        s.frames + 2 >= s.arrived
    }
}

/// Every frame that arrived is accounted for, on every stream.
fn accounted(report: &RunReport) {
    for st in &report.streams {
        assert_eq!(
            st.arrived,
            st.frames + st.failed + st.lost + st.dropped + st.left_waiting,
            "{st:?}"
        );
    }
}

/// A healthy device and one that stalls every descriptor, so that every frame it is given
/// times out, and every reset brings it back only to fail again. The run answers each fault
/// with a reset, holds the device's frames back for a growing back-off from the second fault in
/// a row, and quarantines it at the fifth, while the healthy device's stream runs at its rate
/// all along; the next run leaves the quarantined device alone.
#[test]
fn a_device_that_fails_after_every_reset_is_backed_off_then_quarantined() {
    let model = Model::chain(2, 4096).unwrap();
    let (good, bad) = (runtime(Cost::npu()), runtime(Cost::npu()));
    let period = Arrivals::Periodic { period: 5_000_000 };
    let timeout = Duration::from_millis(20);
    // The healthy device's timeout is long: a loaded machine can hold one of its frames past
    // 20 ms, which is no fault of the device under test.
    let streams = vec![
        stream(&good, &model, 0, period, HEALTHY_TIMEOUT),
        stream(&bad, &model, 1, period, timeout),
    ];
    inject_everywhere(&bad, &Injection::next(Kind::Stall, u32::MAX));
    let recovery = Recovery::default();
    let mut s = Streams::new(Policy::RoundRobin, streams, 1)
        .unwrap()
        .with_recovery(recovery)
        .unwrap();
    let (report, wrong) = run(&mut s, &model, 1500);
    assert_eq!(wrong, 0);
    accounted(&report);
    let faults = &report.faults;
    assert_eq!(
        faults.len(),
        recovery.max_faults as usize,
        "one fault per reset until the quarantine: {faults:#?}"
    );
    for (n, fault) in faults.iter().enumerate() {
        let n = n as u32 + 1;
        assert_eq!(fault.device, 1);
        assert_eq!(fault.code, Code::Timeout, "{fault:?}");
        assert!(!fault.removed);
        assert_eq!(fault.in_a_row, n, "{fault:?}");
        assert_eq!(fault.resets, 1, "every reset worked: {fault:?}");
        assert_eq!(fault.reset_error, None);
        assert_eq!(fault.lost, 1, "the one frame in flight: {fault:?}");
        assert_eq!(fault.quarantined, n == recovery.max_faults, "{fault:?}");
        let held = match n {
            1 => Duration::ZERO,
            _ if n == recovery.max_faults => Duration::ZERO,
            _ => recovery.backoff * (1 << (n - 2)),
        };
        assert_eq!(fault.held_ns, held.as_nanos() as u64, "{fault:?}");
    }
    // Each back-off was kept: the next fault came after it and the timeout.
    for pair in faults.windows(2) {
        let gap = pair[1].at_ns - pair[0].at_ns;
        assert!(
            gap >= pair[0].held_ns + timeout.as_nanos() as u64,
            "{gap} ns between faults: {pair:#?}"
        );
    }
    let (s0, s1) = (&report.streams[0], &report.streams[1]);
    assert_eq!(s1.frames, 0, "{s1:?}");
    assert_eq!(s1.lost, recovery.max_faults as u64, "{s1:?}");
    // The healthy device ran its stream at its rate (200 frames/s) all along.
    assert_eq!((s0.lost, s0.failed, s0.dropped), (0, 0, 0), "{s0:?}");
    assert!(kept_its_rate(s0) && s0.arrived >= 250, "{s0:?}");

    // Quarantined for good: the next run gives it nothing and reports no fault.
    let (again, wrong) = run(&mut s, &model, 200);
    assert_eq!(wrong, 0);
    accounted(&again);
    assert!(again.faults.is_empty(), "{:?}", again.faults);
    assert_eq!(again.streams[1].frames + again.streams[1].lost, 0);
    assert!(
        kept_its_rate(&again.streams[0]) && again.streams[0].arrived >= 30,
        "{:?}",
        again.streams[0]
    );
    drop(s.into_streams());
    assert_eq!(userdma::ring::leaks().queues, 0);
}

/// A device whose reset fails (its engine is held up by a slow descriptor past the host's
/// wait for the reset's acknowledgement) keeps its frame in flight while the reset is tried
/// again after a back-off; the healthy device's stream goes on meanwhile. Once the slow
/// descriptor is done the reset works and the device comes back; it fails again, and the
/// run ends with every frame accounted for.
#[test]
fn a_device_whose_reset_fails_is_tried_again_after_a_back_off() {
    let model = Model::chain(2, 4096).unwrap();
    let good = runtime(Cost::npu());
    // A reset attempt takes `ack` to fail: long beside what a busy machine can hold the loop
    // (tens of ms under a sanitizer with both cores taken), so a loop that waited for one
    // shows in the healthy stream's waits.
    let ack = Duration::from_millis(300);
    let bad = Runtime::loopback(
        loopback::Config::default()
            .cost(Cost::npu())
            .queues(8)
            .ack_timeout(ack),
    )
    .unwrap();
    let period = Arrivals::Periodic { period: 5_000_000 };
    let timeout = Duration::from_millis(30);
    let streams = vec![
        stream(&good, &model, 0, period, HEALTHY_TIMEOUT),
        stream(&bad, &model, 1, period, timeout),
    ];
    let slow = Duration::from_millis(600);
    inject_everywhere(&bad, &Injection::next(Kind::Slow, u32::MAX).delay(slow));
    // Tries at most 40 ms apart (after the 300 ms each failed one takes), for long enough that
    // a reset works before the window closes even where it does only once both units' slow
    // descriptors are done (1.1-1.9 s into ThreadSanitizer runs).
    let recovery = Recovery {
        max_resets: 10,
        max_backoff: Duration::from_millis(40),
        ..Recovery::default()
    };
    let mut s = Streams::new(Policy::RoundRobin, streams, 1)
        .unwrap()
        .with_recovery(recovery)
        .unwrap();
    let (report, wrong) = run(&mut s, &model, 2500);
    assert_eq!(wrong, 0);
    accounted(&report);
    let first = report.faults.first().expect("a fault");
    assert_eq!(first.device, 1);
    assert!(
        first.resets >= 2,
        "the first reset fails (the engine is in its 600 ms descriptor): {first:?}"
    );
    let why = first.reset_error.as_deref().unwrap_or_default();
    assert!(why.contains("reset"), "{first:?}");
    assert!(
        !first.quarantined && first.recovery_ns >= 300_000_000,
        "recovered once the descriptor was done: {first:?}"
    );
    assert!(report.faults.iter().all(|f| f.device == 1 && !f.removed));
    // The healthy stream went on while the other device was being reset: no frame of it
    // waited as long as one reset attempt takes to fail (the resets ran beside the loop).
    let s0 = &report.streams[0];
    assert_eq!((s0.lost, s0.failed, s0.dropped), (0, 0, 0), "{s0:?}");
    assert!(kept_its_rate(s0) && s0.arrived >= 300, "{s0:?}");
    assert!(s0.max_head_wait_ns < ack.as_nanos() as u64, "{s0:?}");
    drop(s.into_streams());
}

/// With one reset allowed per fault, a device whose reset fails is quarantined at once: its
/// frame in flight is lost (its slot stays with the pipeline, never freed under the device),
/// the run goes on and ends on time.
#[test]
fn a_device_whose_only_reset_fails_is_quarantined() {
    let model = Model::chain(2, 4096).unwrap();
    let bad = Runtime::loopback(
        loopback::Config::default()
            .cost(Cost::npu())
            .queues(8)
            .ack_timeout(Duration::from_millis(10)),
    )
    .unwrap();
    let streams = vec![stream(
        &bad,
        &model,
        0,
        Arrivals::Periodic { period: 5_000_000 },
        Duration::from_millis(20),
    )];
    inject_everywhere(
        &bad,
        &Injection::next(Kind::Slow, 1).delay(Duration::from_millis(300)),
    );
    let recovery = Recovery {
        max_resets: 1,
        ..Recovery::default()
    };
    let mut s = Streams::new(Policy::RoundRobin, streams, 1)
        .unwrap()
        .with_recovery(recovery)
        .unwrap();
    let (report, wrong) = run(&mut s, &model, 200);
    assert_eq!(wrong, 0);
    accounted(&report);
    assert_eq!(report.faults.len(), 1, "{:?}", report.faults);
    let fault = &report.faults[0];
    assert!(
        fault.quarantined && fault.resets == 1 && fault.reset_error.is_some(),
        "{fault:?}"
    );
    assert_eq!((fault.lost, report.streams[0].lost), (1, 1));
    assert!(report.seconds < 1.0, "{}", report.seconds);
    // The slow descriptor finishes, the device is stopped on the way out: nothing leaks.
    std::thread::sleep(Duration::from_millis(300));
    drop(s.into_streams());
}

#[test]
fn a_recovery_policy_out_of_range_is_refused() {
    let model = Model::chain(2, 4096).unwrap();
    let rt = runtime(Cost::zero());
    for bad in [
        Recovery {
            max_faults: 0,
            ..Recovery::default()
        },
        Recovery {
            max_resets: 0,
            ..Recovery::default()
        },
        Recovery {
            backoff: Duration::ZERO,
            ..Recovery::default()
        },
        Recovery {
            backoff: Duration::from_secs(2),
            ..Recovery::default()
        },
    ] {
        let streams = vec![stream(
            &rt,
            &model,
            0,
            Arrivals::Asap,
            Duration::from_secs(1),
        )];
        let err = Streams::new(Policy::RoundRobin, streams, 1)
            .unwrap()
            .with_recovery(bad)
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}: {err}");
    }
}

/// With several devices the loop sleeps on all of them and keeps each one's deadline itself:
/// time it spends in the caller's code (here a `preprocess` three times as long as the
/// pipelines' timeout, on every frame of one stream) is not time a device failed to answer.
/// No device is declared stuck, and every frame finishes.
#[test]
fn a_slow_preprocess_is_no_device_fault() {
    let model = Model::chain(2, 4096).unwrap();
    let rts = [runtime(Cost::npu()), runtime(Cost::npu())];
    // Long enough that a loaded machine does not hold a frame past it; the preprocess sleeps
    // three times as long.
    let timeout = Duration::from_millis(50);
    let period = Arrivals::Periodic { period: 5_000_000 };
    let streams = vec![
        stream(&rts[0], &model, 0, period, timeout),
        stream(&rts[1], &model, 1, period, timeout),
    ];
    let mut s = Streams::new(Policy::RoundRobin, streams, 1).unwrap();
    let report = s
        .run(
            Duration::from_millis(1500),
            |id: StreamId, _, _| {
                if id.0 == 0 {
                    std::thread::sleep(3 * timeout);
                }
                Ok(())
            },
            |_, done| assert!(done.result.is_ok()),
        )
        .unwrap();
    assert!(report.faults.is_empty(), "{:#?}", report.faults);
    accounted(&report);
    for st in &report.streams {
        assert_eq!((st.lost, st.failed), (0, 0), "{st:?}");
        assert!(st.frames >= 5, "{st:?}");
    }
    drop(s.into_streams());
}

/// A device that faults while the frames in flight are drained, after the run's window has
/// closed (two devices, so the loop sleeps on both and finds the stalled one overdue only
/// then): its reset (on a thread of its own) is waited for before the run ends, and the frame
/// it had is counted lost, so every frame that arrived is accounted for.
#[test]
fn a_fault_while_draining_after_the_window_is_still_accounted_for() {
    let model = Model::chain(2, 4096).unwrap();
    let (good, bad) = (runtime(Cost::zero()), runtime(Cost::zero()));
    // The stalled device's first frame goes out at once; the window closes at 30 ms; its
    // pipeline gives up on the frame at 150 ms, while the loop drains.
    let streams = vec![
        stream(
            &good,
            &model,
            0,
            Arrivals::Periodic { period: 5_000_000 },
            HEALTHY_TIMEOUT,
        ),
        stream(
            &bad,
            &model,
            1,
            Arrivals::Periodic {
                period: 1_000_000_000,
            },
            Duration::from_millis(150),
        ),
    ];
    inject_everywhere(&bad, &Injection::next(Kind::Stall, u32::MAX));
    let mut s = Streams::new(Policy::RoundRobin, streams, 1).unwrap();
    let (report, wrong) = run(&mut s, &model, 30);
    assert_eq!(wrong, 0);
    accounted(&report);
    let st = &report.streams[1];
    assert_eq!((st.arrived, st.frames, st.lost), (1, 0, 1), "{report:?}");
    assert_eq!(report.faults.len(), 1, "{report:?}");
    let fault = &report.faults[0];
    assert_eq!((fault.device, fault.code), (1, Code::Timeout), "{fault:?}");
    assert_eq!(fault.lost, 1, "{fault:?}");
    assert!(
        fault.at_ns >= 30_000_000,
        "the fault is found after the window closed: {fault:?}"
    );
    drop(s.into_streams());
    assert_eq!(userdma::ring::leaks().queues, 0);
}
