//! Streams of real pipelines on the loopback device under the scheduler: every result right,
//! the scheduler's switch count equal to the compute unit's, batches of at most K against a
//! waiting stream, periodic arrivals all run, bad settings refused.

use std::time::Duration;

use userdma::device::loopback::{self, Cost, Unit};
use userdma::pipeline::{Config, Model, Pipeline};
use userdma::sched::streams::{Arrivals, Stream, Streams};
use userdma::sched::{Policy, StreamId, StreamSpec};
use userdma::{Error, Runtime};

fn runtime() -> Runtime {
    let config = loopback::Config::default().cost(Cost::npu()).queues(8);
    Runtime::loopback(config).expect("loopback device")
}

/// Stream `s`'s frame `n`: words that differ per stream, frame and position.
fn fill(s: usize, n: u64, input: &mut [u8]) {
    for (j, w) in input.chunks_exact_mut(4).enumerate() {
        let v = ((n as u32) ^ ((s as u32) << 24)).wrapping_mul(0x0100_0193)
            ^ (j as u32).wrapping_mul(0x9e37_79b9);
        w.copy_from_slice(&v.to_le_bytes());
    }
}

fn expected(model: &Model, s: usize, n: u64) -> Vec<u8> {
    let mut input = vec![0u8; model.input().bytes as usize];
    fill(s, n, &mut input);
    let mut arena = vec![0u8; model.arena_bytes() as usize];
    let mut result = vec![0u8; model.result().bytes as usize];
    model.reference(&input, &mut arena, &mut result);
    result
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
) -> (userdma::sched::streams::RunReport, Vec<usize>, u64) {
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
    assert!(matches!(err, Error::Invalid { .. }) && err.to_string().contains("at least 1"));
    let err = Streams::new(Policy::RoundRobin, Vec::new(), 1).unwrap_err();
    assert!(err.to_string().contains("stream"), "{err}");
    let mut wrong = one();
    wrong[0].spec.context = 9;
    let err = Streams::new(Policy::RoundRobin, wrong, 1).unwrap_err();
    assert!(err.to_string().contains("Config::context"), "{err}");
    let mut zero = one();
    zero[0].arrivals = Arrivals::Periodic { period: 0 };
    let err = Streams::new(Policy::RoundRobin, zero, 1).unwrap_err();
    assert!(err.to_string().contains("period"), "{err}");
    let err = Streams::new(Policy::Batch { k: 0 }, one(), 1).unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
}
