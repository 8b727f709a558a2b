//! Two video streams on one NPU, the way an SDK wires them with userdma: a live camera at
//! 25 FPS with high priority and a recorded video played back as fast as the device allows at
//! low priority, both running a YOLOv5s-like model (planned into one arena per slot, the
//! detections filtered on the device) through double-buffered pipelines, each in its own
//! device context, under priority scheduling with batch switching.
//!
//! ```text
//! cargo run --release --example two_streams            # 3 s of each policy on the loopback device
//! cargo run --release --example two_streams -- 10      # 10 s
//! ```
//!
//! It prints, per policy, each stream's frames/s, latency from arrival (mean, p99) and longest
//! wait, the context switches per second the scheduler caused (and the device counted), and
//! each context's SRAM hit rate. Every figure is measured in the run.

use std::time::Duration;

use userdma::Runtime;
use userdma_infer::pipeline::{zoo, Config, Pipeline, WorkingSet};
use userdma_infer::sched::streams::{Arrivals, Stream, Streams};
use userdma_infer::sched::{Policy, StreamSpec};
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime, Unit};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = std::env::args().nth(1).map_or(Ok(3), |s| s.parse())?;
    let model = zoo::yolov5s_like(300)?;
    for policy in [Policy::RoundRobin, Policy::Batch { k: 4 }] {
        // One device per run, so each starts with a cold SRAM and zeroed counters.
        let rt = Runtime::loopback(
            loopback::Config::default()
                .cost(Cost::npu())
                .queues(6)
                .memory_size(64 << 20),
        )?;
        // Each stream: its own three queues (H2D, compute, D2H) in its own context, and
        // its working set in device SRAM (the weights and about 2.4 MB of hot activations).
        let stream = |index: u16,
                      name: &str,
                      priority: u8,
                      arrivals|
         -> Result<Stream, userdma_infer::Error> {
            let context = u32::from(index) + 1;
            let config = Config {
                depth: 2,
                queue: 3 * index,
                context,
                working_set: Some(WorkingSet {
                    private: 2_400_000,
                    shared: zoo::YOLOV5S_WEIGHTS,
                    key: 0,
                }),
                ..Config::default()
            };
            Ok(Stream {
                spec: StreamSpec::new(name, priority, context),
                arrivals,
                pipeline: Pipeline::new(&rt, model.clone(), config)?,
            })
        };
        let live = stream(0, "live", 1, Arrivals::Periodic { period: 40_000_000 })?;
        let playback = stream(1, "playback", 0, Arrivals::Asap)?;
        let mut streams = Streams::new(policy, vec![live, playback], 1)?;
        // A frame's input, written straight into the slot's DMA buffer: a camera or a
        // decoder would write its pixels here.
        let frame = vec![0x5au8; model.input().bytes as usize];
        let mut detections = 0u64;
        let report = streams.run(
            Duration::from_secs(seconds),
            |_, _, input| input.write(0, &frame),
            |_, done| {
                if let Ok(out) = done.result {
                    let mut count = [0u8; 4];
                    if out.read(0, &mut count).is_ok() {
                        detections += u64::from(u32::from_le_bytes(count));
                    }
                }
            },
        )?;
        let counters = rt.loopback_device().expect("loopback").counters()?;
        println!("{policy}, {:.1} s, {detections} detections", report.seconds);
        for (s, q) in report.streams.iter().zip([1, 4]) {
            println!(
                "  {:<9} {:>6.1} FPS  latency mean {:>6.1} ms  p99 {:>6.1} ms  longest wait {:>6.1} ms  SRAM hits {:>5.1} %",
                s.name,
                s.fps,
                s.latency_mean_ns / 1e6,
                s.latency_p99_ns as f64 / 1e6,
                s.max_wait_ns as f64 / 1e6,
                100.0 * counters.queues[q].sram_hit_rate().unwrap_or(0.0),
            );
        }
        println!(
            "  switches: {:.1}/s by the scheduler, {} on the device's compute unit",
            report.switches as f64 / report.seconds,
            counters.units[Unit::Compute as usize].context_switches
        );
        for s in streams.into_streams() {
            s.pipeline.shutdown(|_| {})?;
        }
    }
    Ok(())
}
