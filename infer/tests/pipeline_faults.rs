//! The pipeline when its device fails: [`Pipeline::recover`] after a reset with frames in
//! flight (every slot back, the lost frames named, the next frames right), after the device
//! was removed (slots back, new frames refused, every buffer returned), and after a timeout on
//! a device that stopped answering.

use std::sync::Arc;
use std::time::Duration;

use userdma::device::{Device, Wait};
use userdma::{Code, Runtime};
use userdma_infer::pipeline::{Config, Model, Pipeline, Results};
use userdma_infer::Error;
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};

mod frames;

use frames::{expected, fill};

fn runtime(cost: Cost) -> Runtime {
    Runtime::loopback(loopback::Config::default().cost(cost)).expect("loopback device")
}

fn config(split: bool) -> Config {
    Config {
        depth: 4,
        batch: 1,
        split,
        results: Results::Copy,
        wait: Wait::Interrupt,
        timeout: Duration::from_secs(10),
        ..Config::default()
    }
}

/// Submits frames until every slot is in flight; returns their numbers.
fn fill_slots(p: &mut Pipeline, model: &Model) -> Vec<u64> {
    let mut scratch = vec![0u8; model.input().bytes as usize];
    let mut frames = Vec::new();
    while let Some(n) = p
        .try_submit(|n, input| {
            fill(0, n, &mut scratch);
            input.write(0, &scratch)
        })
        .unwrap()
    {
        frames.push(n);
    }
    p.flush().unwrap();
    frames
}

/// Runs `frames` more frames and checks every result.
fn run_checked(p: &mut Pipeline, model: &Model, frames: u64) -> Vec<u64> {
    let mut scratch = vec![0u8; model.input().bytes as usize];
    let mut seen = Vec::new();
    p.run(
        frames,
        |n, input| {
            fill(0, n, &mut scratch);
            input.write(0, &scratch)
        },
        |done| {
            let out = done.result.expect("no device error");
            let mut got = vec![0u8; out.len()];
            out.read(0, &mut got).unwrap();
            assert_eq!(got, expected(model, 0, done.frame), "frame {}", done.frame);
            seen.push(done.frame);
        },
    )
    .expect("run");
    seen
}

#[test]
fn recovery_after_a_reset_with_frames_in_flight_names_the_lost_ones_and_goes_on() {
    // A slow device, so the frames are still in flight when the recovery resets it.
    let cost = Cost {
        compute_bytes_per_sec: 50_000_000,
        ..Cost::zero()
    };
    for split in [true, false] {
        let rt = runtime(cost);
        let model = Model::chain(3, 4000).unwrap();
        let mut p = Pipeline::new(&rt, model.clone(), config(split)).unwrap();
        let before = run_checked(&mut p, &model, 3);
        assert_eq!(before, vec![0, 1, 2]);
        let in_flight = fill_slots(&mut p, &model);
        assert_eq!(in_flight.len(), 4);
        let mut finished = Vec::new();
        let recovery = p
            .recover(|done| {
                assert!(done.result.is_ok(), "a frame that finished is whole");
                finished.push(done.frame);
            })
            .expect("recovered");
        assert!(!recovery.removed);
        assert_eq!(recovery.finished, finished.len());
        // Every frame in flight either finished (in order, first) or is named as lost.
        let mut all = finished.clone();
        all.extend(&recovery.lost);
        assert_eq!(all, in_flight, "{recovery:?}");
        assert!(
            !recovery.lost.is_empty(),
            "the slow device had not finished: {recovery:?}"
        );
        assert_eq!(p.in_flight(), 0);
        // The pipeline runs again, every slot usable, every result right.
        let after = run_checked(&mut p, &model, 8);
        assert_eq!(after, (7..15).collect::<Vec<_>>());
        let summary = p.shutdown(|_| panic!("nothing in flight")).unwrap();
        assert_eq!(summary.failed, 0);
    }
}

#[test]
fn recovery_on_a_removed_device_takes_every_slot_back_and_refuses_new_frames() {
    let cost = Cost {
        compute_bytes_per_sec: 50_000_000,
        ..Cost::zero()
    };
    let rt = runtime(cost);
    let device = Arc::clone(rt.loopback_device().unwrap());
    let model = Model::chain(3, 4000).unwrap();
    let mut p = Pipeline::new(&rt, model.clone(), config(true)).unwrap();
    let in_flight = fill_slots(&mut p, &model);
    // A fence of the last frame in flight: it must signal once the frame is given up as lost.
    let last = p.fence(*in_flight.last().unwrap()).unwrap();
    device.remove();
    // The wait says why, at once.
    let err = p.wait(|_| {}).unwrap_err();
    assert_eq!(err.code(), Code::Removed, "{err}");
    let recovery = p.recover(|_| {}).expect("recovered");
    assert!(recovery.removed);
    let mut all = (0..recovery.finished as u64).collect::<Vec<_>>();
    all.extend(&recovery.lost);
    assert_eq!(all, in_flight);
    assert_eq!(p.in_flight(), 0);
    assert!(last.is_signalled().unwrap(), "a lost frame's fence signals");
    let err = p.try_submit(|_, _| Ok(())).unwrap_err();
    assert!(
        matches!(&err, Error::Driver(userdma::Error::Device(_))),
        "{err:?}"
    );
    assert_eq!(err.code(), Code::Removed);
    assert!(p.waitable().is_none());
    assert_eq!(
        p.wait(|_| {}).unwrap(),
        0,
        "nothing in flight, nothing to wait for"
    );
    drop(p);
    assert_eq!(userdma::ring::leaks().queues, 0);
    assert!(device.is_removed());
}

#[test]
fn a_device_that_stops_answering_times_out_and_recovers() {
    // Each frame takes ~200 ms of modelled compute; the pipeline gives up after 20 ms.
    let cost = Cost {
        compute_bytes_per_sec: 100_000,
        ..Cost::zero()
    };
    let rt = runtime(cost);
    let model = Model::chain(2, 4000).unwrap();
    let mut p = Pipeline::new(
        &rt,
        model.clone(),
        Config {
            timeout: Duration::from_millis(20),
            ..config(true)
        },
    )
    .unwrap();
    let in_flight = fill_slots(&mut p, &model);
    let err = p.wait(|_| panic!("nothing finishes in 20 ms")).unwrap_err();
    assert_eq!(err.code(), Code::Timeout, "{err}");
    let recovery = p.recover(|_| {}).unwrap();
    assert_eq!(recovery.lost, in_flight, "{recovery:?}");
    assert!(recovery.took < Duration::from_secs(5), "{recovery:?}");
    assert_eq!(p.in_flight(), 0);
}
