//! The "after" runs: double-buffered pipelines under a scheduling policy (priority with batch
//! switching, or strict priority), and each stream's wait bound as its scheduler states it.

use std::sync::Arc;
use std::time::Duration;

use userdma::Runtime;
use userdma_infer::pipeline::{Config, Model, Pipeline};
use userdma_infer::sched::streams::{RunReport, Stream, Streams};
use userdma_infer::sched::{Nanos, Policy, Scheduler, StreamId};
use userdma_infer::trace::Trace;
use userdma_loopback::{LoopbackRuntime, Unit};

use super::figures::{device_figures, Run, RunFigures, StreamFigures};
use super::mix::{working_set, Frames, Mix};
use super::CaseArgs;
use crate::pipeline::Error;

/// "after": pipelines under `policy` (priority with batch switching, or strict priority),
/// the lower streams with a maximum wait.
pub(super) fn after(
    name: &'static str,
    policy: Policy,
    args: &CaseArgs,
    mix: &Mix,
    model: &Model,
    frames: &Frames,
) -> Result<Run, Error> {
    let n = mix.len();
    let rts = mix.runtimes(model)?;
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        let spec = mix.spec(i, true);
        let config = Config {
            depth: 2,
            queue: mix.queue[i],
            context: spec.context,
            working_set: Some(working_set(args)),
            ..Config::default()
        };
        streams.push(Stream {
            spec,
            arrivals: mix.arrivals(i),
            pipeline: Pipeline::new(&rts[mix.device[i]], model.clone(), config)?,
        });
    }
    let mut streams =
        Streams::new(policy, streams, 1)?.with_timeline(mix.timeline_capacity(args.seconds));
    // The trace of the first "after" run, when asked for.
    let trace = match (&args.trace, name) {
        (Some(_), "after") => Some(Trace::new(trace_capacity(args.seconds, mix, model))),
        _ => None,
    };
    if let Some(t) = &trace {
        streams = streams.with_trace(Arc::clone(t));
    }
    let mut wrong = 0u64;
    let mut got = vec![0u8; model.result().bytes as usize];
    let maps = |rts: &[Runtime]| {
        rts.iter()
            .map(|rt| rt.dma_space().stats().maps)
            .sum::<u64>()
    };
    let (allocs0, maps0) = (crate::pipeline::allocations(), maps(&rts));
    // Allocations up to the last frame handed over (building the run's report allocates).
    let mut allocs_at_last = allocs0;
    let report = streams.run(
        Duration::from_secs(args.seconds),
        |id: StreamId, n, input| input.write(0, &frames.inputs[Frames::of(id.0, n)]),
        |id, done| {
            let right = done.result.is_ok_and(|out| {
                out.read(0, &mut got).is_ok()
                    && got == frames.expected[Frames::of(id.0, done.frame)]
            });
            wrong += u64::from(!right);
            allocs_at_last = crate::pipeline::allocations();
        },
    )?;
    let allocs = allocs_at_last - allocs0;
    let maps = maps(&rts) - maps0;
    let done: Vec<u64> = report.streams.iter().map(|s| s.frames).collect();
    let (device_switches, bound, rates) = device_figures(&rts, mix, Unit::Compute, 1, &done)?;
    let latency = (0..n)
        .map(|i| streams.latency(StreamId(i)).clone())
        .collect();
    let timeline = streams.timeline().copied().collect();
    let trace = match (&trace, &args.trace) {
        (Some(t), Some(path)) => Some(t.save(path)?),
        _ => None,
    };
    let bounds = stated_bounds(&streams, &report, &rts, model);
    for s in streams.into_streams() {
        s.pipeline.shutdown(|_| {})?;
    }
    let total: u64 = done.iter().sum();
    let figures = RunFigures {
        name,
        policy: report.policy,
        seconds: report.seconds,
        streams: report
            .streams
            .iter()
            .enumerate()
            .map(|(i, s)| StreamFigures {
                name: s.name.clone(),
                device: s.device,
                numa_node: mix.node(s.device),
                priority: mix.streams[i].priority,
                target_fps: mix.streams[i].fps,
                arrived: s.arrived,
                frames: s.frames,
                failed: s.failed,
                lost: s.lost,
                dropped: s.dropped,
                left_waiting: s.left_waiting,
                fps: s.fps,
                latency_mean_ms: s.latency_mean_ns / 1e6,
                latency_p99_ms: s.latency_p99_ns as f64 / 1e6,
                longest_wait_ms: s.max_wait_ns as f64 / 1e6,
                longest_head_wait_ms: s.max_head_wait_ns as f64 / 1e6,
                stated_wait_bound_ms: bounds[i].and_then(|b| b.bound).map(|b| b as f64 / 1e6),
                bound_at_model_ms: bounds[i].and_then(|b| b.at_model).map(|b| b as f64 / 1e6),
                frame_service_ms: bounds[i].map(|b| b.service as f64 / 1e6),
                modelled_frame_ms: bounds[i].map(|b| b.modelled as f64 / 1e6),
                max_wait_ms: mix.max_wait_ms(i),
                sram_hit_rate: rates[i],
            })
            .collect(),
        total_fps: total as f64 / report.seconds,
        allocations_per_sec: allocs as f64 / report.seconds,
        dma_maps_per_sec: maps as f64 / report.seconds,
        switches_per_sec: report.switches as f64 / report.seconds,
        device_switches,
        scheduler_switches: report.switches,
        device_bound_fps: bound,
        wrong,
        trace,
    };
    Ok(Run {
        figures,
        latency,
        timeline,
    })
}

/// Events a trace of a run of `seconds` holds without dropping any: per frame (at most 100
/// per second on each device, more than the modelled NPU runs) an op and an activity record
/// for each of its ops, its frame, wait and decision events, and the pools' samples.
fn trace_capacity(seconds: u64, mix: &Mix, model: &Model) -> usize {
    let ops = model.steps().len() + 4;
    let devices = mix.device.iter().copied().max().unwrap_or(0) as u64 + 1;
    let frames = seconds.saturating_mul(100).saturating_mul(devices);
    let per_frame = 2 * ops as u64 + 4;
    let samples = seconds * 1000 / 10 * mix.len() as u64;
    usize::try_from(frames * per_frame + samples).unwrap_or(usize::MAX)
}

/// A stream's stated wait bound and the service time per frame it takes.
#[derive(Clone, Copy)]
struct Stated {
    /// For the service its device gave (`None`: the policy states none, or none exists at
    /// that pace: a max-wait stream's forced frames could fill the device).
    bound: Option<Nanos>,
    /// For the service the model says (what the run would be held to at the model's pace).
    at_model: Option<Nanos>,
    service: Nanos,
    modelled: Nanos,
}

/// Each stream's wait bound as its device's scheduler states it for `report`'s run: every
/// frame's service time the longer of the worst its model can take on that device
/// (`Model::worst_frame_ns`, the switches included, so the switch cost given the formulas is
/// 0) and the longest a frame held the device in the run (`DeviceReport::longest_frame_ns`).
/// The formulas hold for the service the device gave; a device slower than its model (a
/// loaded or sanitized host runs the loopback engine behind its cost model) gets the bound its
/// pace allows, and the service shows beside it.
fn stated_bounds(
    streams: &Streams,
    report: &RunReport,
    rts: &[Runtime],
    model: &Model,
) -> Vec<Option<Stated>> {
    let schedulers: Vec<&Scheduler> = streams.schedulers().collect();
    report
        .streams
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let scheduler = schedulers.get(s.device)?;
            let device = rts.get(s.device)?.loopback_device()?;
            let modelled = model.worst_frame_ns(&device.config().cost_model());
            let held = report
                .devices
                .get(s.device)
                .map_or(0, |d| d.longest_frame_ns);
            let service = modelled.max(held);
            // Its place among its device's streams, which are in the order given.
            let position = report.streams[..i]
                .iter()
                .filter(|o| o.device == s.device)
                .count();
            let members = report
                .streams
                .iter()
                .filter(|o| o.device == s.device)
                .count();
            let bound = |frame| scheduler.wait_bound(StreamId(position), &vec![frame; members], 0);
            Some(Stated {
                bound: bound(service),
                at_model: bound(modelled),
                service,
                modelled,
            })
        })
        .collect()
}
