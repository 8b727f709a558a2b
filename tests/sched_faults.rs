//! Streams on devices that fail mid-run: a removed device's streams stop while the other
//! device's go on at their rate; a device whose frames time out is reset and its pipelines
//! recovered, the run going on; every fault reported, every lost frame counted, every result
//! that is handed over right, nothing leaked.

use std::sync::Arc;
use std::time::Duration;

use userdma::device::loopback::{self, Cost};
use userdma::pipeline::{Config, Model, Pipeline};
use userdma::sched::streams::{Arrivals, Stream, Streams};
use userdma::sched::{Policy, StreamId, StreamSpec};
use userdma::{Code, Runtime};

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
fn run(streams: &mut Streams, model: &Model, ms: u64) -> (userdma::sched::streams::RunReport, u64) {
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
