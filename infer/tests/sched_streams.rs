//! Streams of real pipelines on the loopback device under the scheduler: every result right,
//! the scheduler's switch count equal to the compute unit's, batches of at most K against a
//! waiting stream, periodic arrivals all run, bad settings refused.

use std::time::Duration;

use userdma::{Code, Runtime};
use userdma_infer::pipeline::{Config, Model, Pipeline};
use userdma_infer::sched::streams::{self, Arrivals, Stream, Streams};
use userdma_infer::sched::{self, Policy, StreamId, StreamSpec};
use userdma_infer::Error;
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime, Unit};

mod frames;

use frames::{expected, fill};

fn runtime() -> Runtime {
    let config = loopback::Config::default().cost(Cost::npu()).queues(8);
    Runtime::loopback(config).expect("loopback device")
}

/// Stream `s` on queues `3 s ..` in context `s + 1`.
fn stream(rt: &Runtime, model: &Model, s: usize, priority: u8, arrivals: Arrivals) -> Stream {
    let context = s as u32 + 1;
    let config = Config {
        queue: 3 * s as u16,
        context,
        ..Config::default()
    };
    Stream {
        spec: StreamSpec::new(format!("s{s}"), priority, context),
        arrivals,
        pipeline: Pipeline::new(rt, model.clone(), config).expect("pipeline"),
    }
}

/// Runs `streams` for `ms` milliseconds, checking every result; returns the report, the
/// order frames were dispatched in (stream indices), and the compute unit's switches.
fn run(
    rt: &Runtime,
    model: &Model,
    policy: Policy,
    streams: Vec<Stream>,
    ms: u64,
) -> (userdma_infer::sched::streams::RunReport, Vec<usize>, u64) {
    let before = rt.loopback_device().unwrap().counters().unwrap().units[Unit::Compute as usize]
        .context_switches;
    let mut s = Streams::new(policy, streams, 1).expect("streams");
    let mut order = Vec::new();
    let mut scratch = vec![0u8; model.input().bytes as usize];
    let mut wrong = 0u64;
    let mut got = vec![0u8; model.result().bytes as usize];
    let report = s
        .run(
            Duration::from_millis(ms),
            |id: StreamId, n, input| {
                order.push(id.0);
                fill(id.0, n, &mut scratch);
                input.write(0, &scratch)
            },
            |id, done| {
                let out = done.result.expect("no device error");
                out.read(0, &mut got).unwrap();
                wrong += u64::from(got != expected(model, id.0, done.frame));
            },
        )
        .expect("run");
    assert_eq!(wrong, 0, "wrong results");
    let after = rt.loopback_device().unwrap().counters().unwrap().units[Unit::Compute as usize]
        .context_switches;
    for st in s.into_streams() {
        st.pipeline.shutdown(|_| {}).unwrap();
    }
    (report, order, after - before)
}

#[test]
fn two_saturating_streams_alternate_in_batches_and_the_switches_match_the_device() {
    let model = Model::chain(2, 4096).unwrap();
    for k in [1, 3] {
        // A fresh device: its compute unit's last context is none, as the scheduler's.
        let rt = runtime();
        let streams = vec![
            stream(&rt, &model, 0, 1, Arrivals::Asap),
            stream(&rt, &model, 1, 0, Arrivals::Asap),
        ];
        let (report, order, device) = run(&rt, &model, Policy::Batch { k }, streams, 300);
        assert!(order.len() > 20, "{order:?}");
        let frames: u64 = report.streams.iter().map(|s| s.frames).sum();
        assert_eq!(frames, order.len() as u64);
        // Both saturate: runs of exactly k (the last may be cut short by the end).
        let mut runs = Vec::new();
        let mut at = 0;
        while at < order.len() {
            let len = order[at..].iter().take_while(|&&x| x == order[at]).count();
            runs.push(len);
            at += len;
        }
        assert!(runs.iter().all(|&r| r <= k as usize), "k {k}: {runs:?}");
        assert!(
            runs[..runs.len() - 1].iter().all(|&r| r == k as usize),
            "k {k}: {runs:?}"
        );
        assert_eq!(report.switches, runs.len() as u64 - 1);
        assert_eq!(report.switches, device, "scheduler against compute unit");
    }
}

#[test]
fn periodic_frames_all_run_and_round_robin_serves_both() {
    let rt = runtime();
    let model = Model::chain(1, 1024).unwrap();
    let streams = vec![
        stream(&rt, &model, 0, 1, Arrivals::Periodic { period: 10_000_000 }),
        stream(&rt, &model, 1, 0, Arrivals::Asap),
    ];
    let (report, order, device) = run(&rt, &model, Policy::RoundRobin, streams, 400);
    let live = &report.streams[0];
    // 400 ms at one frame per 10 ms: 40 or 41 frames arrived (the one at t = 0 included),
    // each run or, on a machine too busy to keep up, still waiting at the end.
    let arrived = live.frames + live.left_waiting + live.dropped;
    assert!((40..=41).contains(&arrived), "{live:?}");
    assert_eq!(live.arrived, arrived, "{live:?}");
    assert_eq!(live.dropped, 0);
    assert!(report.streams[1].frames > 0);
    assert_eq!(report.switches, device);
    assert!(order.contains(&0) && order.contains(&1));
    assert!(live.latency_p99_ns >= live.latency_p50_ns);
}

#[test]
fn bad_settings_are_errors_that_say_what_to_do() {
    let rt = runtime();
    let model = Model::chain(1, 64).unwrap();
    let one = || vec![stream(&rt, &model, 0, 0, Arrivals::Asap)];
    let err = Streams::new(Policy::RoundRobin, one(), 0).unwrap_err();
    assert!(
        matches!(err, Error::Streams(streams::Error::ZeroInFlight))
            && err.to_string().contains("at least 1"),
        "{err}"
    );
    let err = Streams::new(Policy::RoundRobin, Vec::new(), 1).unwrap_err();
    assert!(
        matches!(err, Error::Streams(streams::Error::NoStreams)),
        "{err}"
    );
    assert!(err.to_string().contains("stream"), "{err}");
    let mut wrong = one();
    wrong[0].spec.context = 9;
    let err = Streams::new(Policy::RoundRobin, wrong, 1).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Streams(streams::Error::Context {
                context: 9,
                pipeline: 1,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("Config::context"), "{err}");
    let mut zero = one();
    zero[0].arrivals = Arrivals::Periodic { period: 0 };
    let err = Streams::new(Policy::RoundRobin, zero, 1).unwrap_err();
    assert!(
        matches!(err, Error::Streams(streams::Error::ZeroPeriod { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("period"), "{err}");
    let err = Streams::new(Policy::Batch { k: 0 }, one(), 1).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Streams(streams::Error::Scheduler {
                device: None,
                source: sched::Error::ZeroBatch,
            })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("K = 0"), "{err}");
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[test]
fn streams_on_two_devices_each_decide_alone_and_match_their_devices() {
    let model = Model::chain(2, 4096).unwrap();
    let (a, b) = (runtime(), runtime());
    // Streams 0 and 2 on device a, 1 and 3 on device b: given interleaved, grouped by device.
    let mut streams = Vec::new();
    for s in 0..4usize {
        let rt = if s % 2 == 0 { &a } else { &b };
        let context = s as u32 + 1;
        let config = Config {
            queue: 3 * (s as u16 / 2),
            context,
            ..Config::default()
        };
        let arrivals = if s < 2 {
            Arrivals::Periodic { period: 5_000_000 }
        } else {
            Arrivals::Asap
        };
        streams.push(Stream {
            spec: StreamSpec::new(format!("s{s}"), u8::from(s < 2), context),
            arrivals,
            pipeline: Pipeline::new(rt, model.clone(), config).expect("pipeline"),
        });
    }
    let switches = |rt: &Runtime| {
        rt.loopback_device().unwrap().counters().unwrap().units[Unit::Compute as usize]
            .context_switches
    };
    let mut s = Streams::new(Policy::Batch { k: 2 }, streams, 1)
        .expect("streams")
        .with_timeline(100_000);
    assert_eq!(s.schedulers().count(), 2);
    assert_eq!(
        (0..4).map(|i| s.device_of(StreamId(i))).collect::<Vec<_>>(),
        [0, 1, 0, 1]
    );
    let mut scratch = vec![0u8; model.input().bytes as usize];
    let mut got = vec![0u8; model.result().bytes as usize];
    let mut wrong = 0u64;
    let report = s
        .run(
            Duration::from_millis(400),
            |id: StreamId, n, input| {
                fill(id.0, n, &mut scratch);
                input.write(0, &scratch)
            },
            |id, done| {
                let out = done.result.expect("no device error");
                out.read(0, &mut got).unwrap();
                wrong += u64::from(got != expected(&model, id.0, done.frame));
            },
        )
        .expect("run");
    assert_eq!(wrong, 0);
    assert_eq!(report.devices.len(), 2);
    assert_eq!(report.devices[0].streams, ["s0", "s2"]);
    assert_eq!(report.devices[1].streams, ["s1", "s3"]);
    assert_eq!(report.devices[0].switches, switches(&a), "device a");
    assert_eq!(report.devices[1].switches, switches(&b), "device b");
    assert_eq!(
        report.switches,
        report.devices[0].switches + report.devices[1].switches
    );
    for (i, st) in report.streams.iter().enumerate() {
        assert_eq!(st.device, i % 2);
        assert!(st.frames > 0, "{st:?}");
    }
    // Both devices worked at once: some frame of one was dispatched while the other's ran.
    let spans: Vec<_> = s.timeline().copied().collect();
    let total: u64 = report.streams.iter().map(|st| st.frames).sum();
    assert_eq!(spans.len() as u64, total);
    let overlap = spans.iter().any(|x| {
        spans
            .iter()
            .any(|y| x.device != y.device && x.dispatch_ns < y.done_ns && y.dispatch_ns < x.done_ns)
    });
    assert!(overlap, "the two devices never ran at the same time");
    // One frame in flight per device: a device's frames never overlap.
    for d in 0..2 {
        let mut on: Vec<_> = spans.iter().filter(|x| x.device == d).collect();
        on.sort_by_key(|x| x.dispatch_ns);
        for w in on.windows(2) {
            assert!(
                w[0].done_ns <= w[1].dispatch_ns,
                "{:?} then {:?}",
                w[0],
                w[1]
            );
        }
        for x in &on {
            assert!(x.arrival_ns <= x.dispatch_ns && x.dispatch_ns <= x.done_ns && x.ok);
            assert_eq!(x.device, s.device_of(x.stream));
        }
    }
    for st in s.into_streams() {
        st.pipeline.shutdown(|_| {}).unwrap();
    }
}

#[test]
fn a_timeline_keeps_the_last_frames_and_a_second_run_starts_its_counts_again() {
    let rt = runtime();
    let model = Model::chain(1, 1024).unwrap();
    let streams = vec![
        stream(&rt, &model, 0, 1, Arrivals::Asap),
        stream(&rt, &model, 1, 0, Arrivals::Asap),
    ];
    let mut s = Streams::new(Policy::RoundRobin, streams, 1)
        .unwrap()
        .with_timeline(8);
    let mut reports = Vec::new();
    for _ in 0..2 {
        let r = s
            .run(
                Duration::from_millis(100),
                |_, _, _| Ok(()),
                |_, done| assert!(done.result.is_ok()),
            )
            .unwrap();
        let frames: u64 = r.streams.iter().map(|st| st.frames).sum();
        assert!(frames > 8, "{r:?}");
        assert_eq!(s.timeline().count(), 8);
        let last: Vec<_> = s.timeline().map(|f| f.done_ns).collect();
        assert!(last.windows(2).all(|w| w[0] <= w[1]), "{last:?}");
        let hist: u64 = (0..2).map(|i| s.latency(StreamId(i)).len()).sum();
        assert_eq!(hist, frames, "the histograms hold this run only");
        reports.push(r);
    }
    // Counts of the second run are its own, not the sum of both.
    for r in &reports {
        let frames: u64 = r.streams.iter().map(|st| st.frames).sum();
        assert_eq!(r.decisions, frames, "{r:?}");
    }
    for st in s.into_streams() {
        st.pipeline.shutdown(|_| {}).unwrap();
    }
}

#[test]
fn two_streams_with_one_name_are_refused() {
    let (a, b) = (runtime(), runtime());
    let model = Model::chain(1, 64).unwrap();
    let mut x = stream(&a, &model, 0, 0, Arrivals::Asap);
    let y = stream(&b, &model, 1, 0, Arrivals::Asap);
    x.spec.name = "cam".into();
    let mut y = y;
    y.spec.name = "cam".into();
    let err = Streams::new(Policy::RoundRobin, vec![x, y], 1).unwrap_err();
    assert!(err.to_string().contains("both named \"cam\""), "{err}");
}
