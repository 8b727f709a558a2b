//! Streams on two devices of different kinds in one process: `sched::streams::Streams` drives
//! one stream on edu through VFIO ([`EduEngine`]: one DMA engine, no compute, so the model's
//! steps run on the host) and one on a loopback NPU (`LoopbackEngine`: every step on the
//! device), grouped into two devices with a scheduler each, one thread sleeping on both
//! devices' interrupts at once (edu's MSI and the loopback queue's eventfd).
//!
//! The model's tensors are 6000 bytes, so each edu frame's input crosses edu's 4 KiB buffer in
//! two chunks (four transfers); its results are read in place out of the arena (host memory).
//! Checked: every result of both streams is the model run on the host over that frame's input,
//! in order, none failed or lost; both streams made progress (the loopback's frames take
//! microseconds and are not held up behind edu's, which take about 400 ms); edu ran exactly
//! the transfers its frames need, one MSI each.

use std::sync::Arc;
use std::time::Duration;

use userdma::device::vfio::IrqKind;
use userdma::device::Device;
use userdma::Runtime;
use userdma_infer::accel::{Accelerator, ComputeAt, LoopbackEngine};
use userdma_infer::pipeline::{Config, Model, Pipeline, Results};
use userdma_infer::sched::streams::{Arrivals, Stream, Streams};
use userdma_infer::sched::{Policy, StreamId, StreamSpec};
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};

use super::pipeline::{fill, Check};
use super::vfio;
use crate::edu_engine::queue::transfers_for;
use crate::edu_engine::EduEngine;
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};

/// The model: two layers over tensors of this many bytes (two chunks of edu's buffer).
const LAYERS: u32 = 2;
const BYTES: u64 = 6000;
/// How long frames are dispatched (the frames in flight then finish).
const RUN: Duration = Duration::from_secs(3);
/// The fewest frames each stream must finish: edu about one every 400 ms, the loopback NPU
/// (no cost model) thousands a second, less what the host spends checking them.
const EDU_FRAMES: u64 = 3;
const LOOPBACK_FRAMES: u64 = 50;
/// How long the interrupts of the last transfers may take to be counted.
const SETTLE: Duration = Duration::from_secs(1);

/// Streams on edu and on a loopback NPU, in one run.
pub(crate) fn edu_and_loopback(env: &Env) -> Result<(), Failure> {
    let options = vfio::options(env).interrupts(IrqKind::Msi, 1);
    let (bound, vfio, device) = vfio::open(env, &options)?;
    let vector = vfio
        .interrupt(0)
        .context(|| "the MSI vector's eventfd".to_owned())?;
    let runtime = vfio::runtime(&vfio);
    let engine = Arc::new(EduEngine::new(runtime.clone(), device, Some(vector))?);
    let npu_runtime = Runtime::loopback(
        loopback::Config::default()
            .cost(Cost::zero())
            .memory_size(4 << 20),
    )
    .context(|| "start a loopback NPU".to_owned())?;
    let npu: Arc<dyn Accelerator> = Arc::new(
        LoopbackEngine::new(&npu_runtime).context(|| "the loopback NPU's engine".to_owned())?,
    );
    let edu: Arc<dyn Accelerator> = Arc::clone(&engine) as Arc<dyn Accelerator>;
    let model = Model::chain(LAYERS, BYTES)
        .map_err(userdma_infer::Error::from)
        .context(|| format!("a {LAYERS}-layer chain of {BYTES}-byte tensors"))?;

    let stream = |device: &Arc<dyn Accelerator>,
                  name: &str,
                  context: u32,
                  results: Results|
     -> Result<Stream, Failure> {
        let config = Config {
            context,
            results,
            ..Config::for_device(device.as_ref(), &model)
        };
        let pipeline = Pipeline::on(Arc::clone(device), model.clone(), config)
            .context(|| format!("build stream {name}'s pipeline on {}", device.identity()))?;
        Ok(Stream {
            spec: StreamSpec::new(name, 0, context),
            arrivals: Arrivals::Asap,
            pipeline,
        })
    };
    // edu's results read in place: a copy back would be four more transfers a frame, and the
    // measurement of `Results::Auto` ten.
    let streams = vec![
        stream(&edu, "edu", 1, Results::InPlace)?,
        stream(&npu, "loopback", 2, Results::Auto)?,
    ];
    let mut s = Streams::new(Policy::RoundRobin, streams, 1)
        .context(|| "schedule the two streams".to_owned())?;
    ensure!(
        s.schedulers().count() == 2,
        "{} schedulers for streams on two devices: want one per device",
        s.schedulers().count()
    );
    let mut checks = [Check::new(&model, 0), Check::new(&model, 1)];
    let mut scratch = vec![0_u8; usize::try_from(model.input().bytes).expect("a small model")];
    let before = engine.stats();
    let report = s
        .run(
            RUN,
            |id: StreamId, n, input| {
                fill(id.0 as u32, n, &mut scratch);
                input.write(0, &scratch)
            },
            |id, done| {
                if let Some(check) = checks.get_mut(id.0) {
                    check.take(done);
                }
            },
        )
        .context(|| format!("run the streams for {RUN:?}"))?;
    let after = engine.settle_interrupts(SETTLE)?;

    for (check, st) in checks.iter_mut().zip(&report.streams) {
        if let Some(failure) = check.failure.take() {
            return Err(Failure::Check(format!("stream {}: {failure}", st.name)));
        }
        ensure!(
            check.right == st.frames && st.failed == 0 && st.lost == 0,
            "stream {}: {} frames finished, {} checked right, {} failed, {} lost",
            st.name,
            st.frames,
            check.right,
            st.failed,
            st.lost
        );
    }
    ensure!(
        report.faults.is_empty(),
        "{} device faults during the run, the first: {:?}",
        report.faults.len(),
        report.faults.first()
    );
    let (on_edu, on_npu) = (&report.streams[0], &report.streams[1]);
    ensure!(
        on_edu.frames >= EDU_FRAMES && on_npu.frames >= LOOPBACK_FRAMES,
        "edu's stream finished {} frames and the loopback's {} in {RUN:?}: want at least {EDU_FRAMES} and {LOOPBACK_FRAMES} (both making progress)",
        on_edu.frames,
        on_npu.frames
    );
    ensure!(
        (on_edu.device, on_npu.device) == (0, 1),
        "the streams ran on devices {} and {}: want 0 and 1",
        on_edu.device,
        on_npu.device
    );
    let transfers = after.transfers - before.transfers;
    let per_frame = transfers_for(model.input().bytes);
    ensure!(
        transfers == on_edu.frames * per_frame,
        "edu ran {transfers} transfers for {} frames: want {per_frame} a frame (the input in, the results read in place)",
        on_edu.frames
    );
    ensure!(
        after.interrupts - before.interrupts == transfers,
        "{} interrupts for {transfers} transfers: want one each",
        after.interrupts - before.interrupts
    );

    for st in &report.streams {
        println!(
            "INFO streams-edu-loopback: stream {} on device {}: {} frames in {:.2} s ({:.1} frames/s), latency p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            st.name,
            st.device,
            st.frames,
            report.seconds,
            st.fps,
            st.latency_p50_ns as f64 / 1e6,
            st.latency_p99_ns as f64 / 1e6,
            st.latency_max_ns as f64 / 1e6
        );
    }
    println!(
        "INFO streams-edu-loopback: edu: {transfers} transfers ({per_frame} a frame of {BYTES} bytes, through its {}-byte chunks), {} interrupts, results read in place; every result of both streams checked against the model run on the host",
        crate::edu::MAX_TRANSFER,
        after.interrupts - before.interrupts
    );

    for st in s.into_streams() {
        let want = if st.spec.name == "edu" {
            ComputeAt::Host
        } else {
            ComputeAt::Device
        };
        ensure!(
            st.pipeline.compute() == want,
            "stream {}: compute {:?}, want {want:?}",
            st.spec.name,
            st.pipeline.compute()
        );
        let name = st.spec.name.clone();
        st.pipeline
            .shutdown(|_| {})
            .context(|| format!("shut stream {name}'s pipeline down"))?;
    }
    drop(edu);
    drop(npu);
    drop(npu_runtime);
    drop(engine);
    vfio.disable_interrupts()
        .context(|| "disable interrupts".to_owned())?;
    drop(runtime);
    drop(vfio);
    bound.release()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edu_frame_is_two_chunks_in() {
        let model = Model::chain(LAYERS, BYTES).unwrap();
        assert_eq!(transfers_for(model.input().bytes), 4);
        assert!(model.input().bytes > crate::edu::MAX_TRANSFER as u64);
    }
}
