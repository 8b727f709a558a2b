//! The `tracing` spans and events of the inference layer and the loopback device (the
//! `tracing` feature, which turns on the driver's too; docs/tracing-events.md), caught by a
//! subscriber of the test's own (tests/common/capture.rs): a pipeline's build and its queues
//! as spans with their ids, a recovery as a span with the reset and the frames lost in it, a
//! removal named once, a run of streams answering a fault, and the loopback device's units
//! reporting a queue they fault and a translation they refuse from their own threads.
//!
//! `cargo test -p userdma-infer --features tracing --test tracing_events`

use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::Wait;
use userdma::dma::{DeviceOffset, Iova};
use userdma::memory::PageSize;
use userdma::{ring, Code, Runtime};
use userdma_infer::pipeline::{Config, Model, Pipeline, Results};
use userdma_infer::sched::streams::{Arrivals, Stream, Streams};
use userdma_infer::sched::{Policy, StreamSpec};
use userdma_loopback::{
    self as loopback, regs, Cost, Descriptor, LoopbackRuntime, LoopbackStatus, StatusCode,
};

#[path = "../../tests/common/capture.rs"]
mod capture;

use capture::{Capture, Fields};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A loopback runtime named `name`; `compute_bytes_per_sec` slows the compute unit so frames
/// stay in flight.
fn runtime(name: &str, compute_bytes_per_sec: u64) -> Runtime {
    let cost = Cost {
        compute_bytes_per_sec,
        ..Cost::zero()
    };
    Runtime::loopback(loopback::Config::default().name(name).cost(cost)).expect("loopback device")
}

fn config(split: bool, timeout: Duration) -> Config {
    Config {
        depth: 4,
        batch: 1,
        split,
        results: Results::Copy,
        wait: Wait::Interrupt,
        timeout,
        ..Config::default()
    }
}

/// Submits frames until every slot is in flight; how many.
fn fill_slots(p: &mut Pipeline, model: &Model) -> usize {
    let input = vec![7u8; model.input().bytes as usize];
    let mut frames = 0;
    while p
        .try_submit(|_, slot| slot.write(0, &input))
        .expect("submitted")
        .is_some()
    {
        frames += 1;
    }
    p.flush().expect("announced");
    frames
}

#[test]
fn a_pipeline_and_its_queues_are_spans_with_their_ids() {
    let ((), capture) = Capture::run(|| {
        let rt = runtime("trace-build", 0);
        let model = Model::chain(2, 4096).unwrap();
        let p = Pipeline::new(&rt, model, config(true, TIMEOUT)).expect("pipeline");
        p.shutdown(|_| {}).expect("shut down");
    });
    let built = capture.spans_named("pipeline.new");
    assert_eq!(built.len(), 1, "{:#?}", capture.spans());
    assert_eq!(built[0].field("device"), Some("trace-build (simulated)"));
    assert_eq!(built[0].field("depth"), Some("4"));
    assert_eq!(built[0].field("split"), Some("true"));
    // A split pipeline: H2D, compute and D2H on queues 0, 1 and 2, each opened in its span,
    // the driver's queue span inside it.
    let opened = capture.spans_named("accel.open_queue");
    let ids: Vec<&str> = opened.iter().filter_map(|s| s.field("queue")).collect();
    assert_eq!(ids, ["0", "1", "2"], "{opened:#?}");
    assert_eq!(opened[1].field("unit"), Some("Compute"));
    let rings = capture.events_saying("ring created");
    assert_eq!(rings.len(), 3);
    for (ring, id) in rings.iter().zip(["0", "1", "2"]) {
        assert_eq!(ring.field("queue"), Some(id));
        let span = ring
            .within("accel.open_queue")
            .expect("in its queue's span");
        assert_eq!(span.field("queue"), Some(id));
        assert_eq!(
            ring.within("queue.open").and_then(|s| s.field("queue")),
            Some(id)
        );
        assert!(ring.within("pipeline.new").is_some());
    }
    let ready = capture.events_saying("pipeline ready");
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].field("queues"), Some("3"));
    assert!(ready[0].within("pipeline.new").is_some());
    assert!(
        capture.events_saying("frames lost").is_empty(),
        "nothing went wrong"
    );
}

#[test]
fn a_recovery_is_a_span_with_the_reset_and_the_frames_lost() {
    let ((in_flight, lost), capture) = Capture::run(|| {
        // ~200 ms of modelled compute a frame: every frame is still in flight at the reset.
        let rt = runtime("trace-recover", 100_000);
        let model = Model::chain(2, 4000).unwrap();
        let mut p = Pipeline::new(&rt, model.clone(), config(true, TIMEOUT)).expect("pipeline");
        let in_flight = fill_slots(&mut p, &model);
        let recovery = p.recover(|_| {}).expect("recovered");
        (in_flight, recovery.lost)
    });
    assert_eq!(in_flight, 4);
    assert_eq!(lost.len(), 4);
    let recovers = capture.spans_named("pipeline.recover");
    assert_eq!(recovers.len(), 1);
    assert_eq!(
        recovers[0].field("device"),
        Some("trace-recover (simulated)")
    );
    assert_eq!(recovers[0].field("in_flight"), Some("4"));
    assert_eq!(recovers[0].level, tracing::Level::INFO);
    // The reset, as the pipeline and as the device report it, inside the recovery.
    let reset = capture.events_saying("accelerator reset");
    assert_eq!(reset.len(), 1, "{:#?}", capture.events());
    assert!(reset[0].within("pipeline.recover").is_some());
    let device_reset = capture.events_saying("device reset");
    assert_eq!(device_reset.len(), 1);
    assert_eq!(
        device_reset[0].field("device"),
        Some("trace-recover (simulated)")
    );
    assert_eq!(device_reset[0].field("reset"), Some("register"));
    assert!(device_reset[0].within("pipeline.recover").is_some());
    // The frames lost, named, inside the reclaim inside the recovery.
    let lost_events = capture.events_saying("frames lost");
    assert_eq!(lost_events.len(), 1);
    assert_eq!(lost_events[0].level, tracing::Level::WARN);
    assert_eq!(lost_events[0].field("lost"), Some("4"));
    assert_eq!(
        lost_events[0].field("frames"),
        Some(format!("{lost:?}").as_str())
    );
    let reclaim = lost_events[0]
        .within("pipeline.reclaim")
        .expect("in the reclaim");
    assert_eq!(reclaim.field("removed"), Some("false"));
    assert!(lost_events[0].within("pipeline.recover").is_some());
    // The queues opened again, inside the recovery.
    let reopened = capture
        .events_saying("ring created")
        .into_iter()
        .filter(|e| e.within("pipeline.recover").is_some())
        .count();
    assert_eq!(reopened, 3);
}

#[test]
fn a_removal_is_named_once_and_the_recovery_resets_nothing() {
    let (lost, capture) = Capture::run(|| {
        let rt = runtime("trace-removed", 100_000);
        let device = Arc::clone(rt.loopback_device().unwrap());
        let model = Model::chain(2, 4000).unwrap();
        let mut p = Pipeline::new(&rt, model.clone(), config(false, TIMEOUT)).expect("pipeline");
        fill_slots(&mut p, &model);
        device.remove();
        let err = p.wait(|_| {}).unwrap_err();
        assert_eq!(err.code(), Code::Removed);
        let recovery = p.recover(|_| {}).expect("recovered");
        assert!(recovery.removed);
        recovery.lost.len()
    });
    let removed = capture.events_saying("device removed");
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].field("device"), Some("trace-removed"));
    assert!(capture.events_saying("accelerator reset").is_empty());
    assert!(capture.events_saying("device reset").is_empty());
    let lost_events = capture.events_saying("frames lost");
    assert_eq!(lost_events.len(), 1);
    assert_eq!(
        lost_events[0].field("lost"),
        Some(lost.to_string().as_str())
    );
    assert_eq!(lost_events[0].field("removed"), Some("true"));
}

#[test]
fn a_run_of_streams_reports_the_fault_and_the_reset() {
    let ((), capture) = Capture::run(|| {
        // ~40 ms of compute a frame against a 10 ms timeout: every frame times out.
        let rt = runtime("trace-streams", 200_000);
        let model = Model::chain(2, 4096).unwrap();
        let pipeline = Pipeline::new(
            &rt,
            model.clone(),
            Config {
                context: 1,
                timeout: Duration::from_millis(10),
                ..Config::default()
            },
        )
        .expect("pipeline");
        let streams = vec![Stream {
            spec: StreamSpec::new("s0", 0, 1),
            arrivals: Arrivals::Periodic { period: 50_000_000 },
            pipeline,
        }];
        let mut s = Streams::new(Policy::RoundRobin, streams, 1).unwrap();
        let input = vec![7u8; model.input().bytes as usize];
        let report = s
            .run(
                Duration::from_millis(200),
                |_, _, slot| slot.write(0, &input),
                |_, _| {},
            )
            .expect("the run survives the fault");
        assert!(!report.faults.is_empty());
    });
    let faults = capture.events_saying("device fault");
    assert!(!faults.is_empty(), "{:#?}", capture.events());
    assert_eq!(faults[0].level, tracing::Level::WARN);
    assert_eq!(faults[0].field("device"), Some("trace-streams (simulated)"));
    assert_eq!(faults[0].field("removed"), Some("false"));
    let span = faults[0]
        .within("streams.recover")
        .expect("in the recovery");
    assert_eq!(span.field("group"), Some("0"));
    assert_eq!(span.field("code"), Some("Timeout"));
    let started = capture.events_saying("accelerator reset started");
    assert!(!started.is_empty());
    assert_eq!(started[0].field("attempt"), Some("1"));
    assert!(!capture.events_saying("accelerator reset").is_empty());
}

/// Waits for queue `q` of `device` to be faulted by the device.
fn wait_faulted(device: &loopback::Loopback, q: u16) {
    let start = Instant::now();
    while !device
        .get(regs::queue_field(regs::Q_STATUS, q).unwrap())
        .unwrap()
        .contains(regs::QueueStatus::FAULT)
    {
        assert!(start.elapsed() < TIMEOUT, "no fault");
        std::thread::yield_now();
    }
}

#[test]
fn the_device_threads_report_a_queue_they_fault_and_a_translation_they_refuse() {
    let (unmapped, capture) = Capture::run(|| {
        let rt = runtime("trace-engine", 0);
        let device = Arc::clone(rt.loopback_device().unwrap());
        // An address nothing is mapped at: an error completion, and the fault reported.
        let pool = rt.pool(4 << 20, PageSize::Base).expect("a pool");
        let mut queue = rt.queue(ring::Config::new(16)).expect("queue 0");
        let unmapped = Iova(1 << 40);
        let buffer = pool.alloc_owned(64).unwrap();
        queue
            .submit(
                Descriptor::to_device(unmapped, DeviceOffset(0), 64).build(),
                buffer,
            )
            .unwrap();
        let done = queue.wait(Some(TIMEOUT)).expect("completed");
        assert_eq!(done.entry.loopback_code(), Ok(StatusCode::HostUnmapped));
        // An impossible SQ tail on queue 2: the device faults the queue.
        let faulted = rt
            .queue_with::<()>(ring::Config::new(16).with_id(2), Wait::Poll)
            .expect("queue 2");
        device
            .set(regs::queue_field(regs::Q_SQ_TAIL, 2).unwrap(), 1000)
            .unwrap();
        wait_faulted(&device, 2);
        drop(faulted);
        unmapped
    });
    let refused = capture.events_saying("DMA translation fault");
    assert_eq!(refused.len(), 1, "{:#?}", capture.events());
    assert_eq!(
        refused[0].field("iova"),
        Some(unmapped.to_string().as_str())
    );
    assert_eq!(refused[0].field("len"), Some("64"));
    assert_eq!(refused[0].field("access"), Some("read"));
    assert_eq!(
        refused[0].field("status"),
        Some(StatusCode::HostUnmapped.name())
    );
    let engine = refused[0]
        .within("loopback.engine")
        .expect("on the device's thread");
    assert_eq!(engine.field("device"), Some("trace-engine"));
    let faults = capture.events_saying("queue faulted by the device");
    assert_eq!(faults.len(), 1, "{:#?}", capture.events());
    assert_eq!(faults[0].field("queue"), Some("2"));
    assert_eq!(faults[0].field("fault"), Some("BadSqTail"));
    assert!(faults[0].within("loopback.engine").is_some());
    // The device's creation, as a span with its name.
    let made = capture.spans_named("loopback.new");
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].field("device"), Some("trace-engine"));
    assert_eq!(made[0].field("process"), Some("false"));
}
