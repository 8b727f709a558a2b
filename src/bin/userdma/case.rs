//! `userdma demo`: the two-stream video-analytics case on the loopback device, run "before" and
//! "after" in one invocation.
//!
//! Two (or more) YOLOv5s-like streams share one modelled NPU: a live stream arriving at
//! `--live-fps` with high priority, and playback streams as fast as the device allows at low
//! priority, each in its own device context with its working set declared in the SRAM model.
//!
//! - **before**: per frame a heap input, fresh DMA mappings and a fresh device arena, the
//!   stages synchronous (`pipeline::naive::Naive`), streams taken round-robin per frame;
//! - **after**: the buffer pool, the planned arena, double-buffered pipelines, priority with
//!   batch switching (`--k`) and a maximum wait on the playback streams (`--max-wait-ms`).
//!
//! Every frame's detections are checked against the model run on the host (frames cycle through
//! a few input patterns, each computed once), exit code 1 on a wrong one. Printed side by side:
//! per stream frames/s, mean and p99 latency from arrival, the longest wait; per run
//! allocations/s, DMA maps/s, context switches/s (the scheduler's and the device's) and each
//! context's SRAM hit rate; the device bound from what the device charged; the published
//! figures of the case in their own column, labelled as published.

use std::time::{Duration, Instant};

use serde::Serialize;
use userdma::device::loopback::{self, Cost, Unit};
use userdma::pipeline::{naive::Naive, zoo, Config, Model, Pipeline, WorkingSet};
use userdma::sched::streams::{ArrivalQueue, Arrivals, Stream, Streams};
use userdma::sched::{Policy, Scheduler, StreamId, StreamSpec};
use userdma::Runtime;

use crate::pipeline::Error;

/// Arguments of `userdma demo` (the case study).
#[derive(Debug, Clone, clap::Args, Serialize)]
pub(crate) struct CaseArgs {
    /// Seconds each of the two runs lasts.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=3600))]
    seconds: u64,
    /// Frames per second of the live stream.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..=1000))]
    live_fps: u32,
    /// Playback streams beside the live one (each as fast as the device allows).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=9))]
    playback: u8,
    /// "after": frames one stream may run in a row while another waits (batch switching).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    k: u32,
    /// "after": the longest a playback frame may wait before it runs, whatever its priority.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    max_wait_ms: u64,
    /// The contexts share the model's weights in device SRAM (one model, one copy).
    #[arg(long)]
    share_weights: bool,
}

/// One stream's figures in one run.
#[derive(Debug, Clone, Serialize)]
struct StreamFigures {
    name: String,
    frames: u64,
    fps: f64,
    latency_mean_ms: f64,
    latency_p99_ms: f64,
    longest_wait_ms: f64,
    sram_hit_rate: Option<f64>,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
struct RunFigures {
    name: &'static str,
    policy: Policy,
    seconds: f64,
    streams: Vec<StreamFigures>,
    total_fps: f64,
    allocations_per_sec: f64,
    dma_maps_per_sec: f64,
    switches_per_sec: f64,
    device_switches: u64,
    scheduler_switches: u64,
    /// Total frames/s the device allows from what it charged in this run.
    device_bound_fps: f64,
    wrong: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    config: CaseArgs,
    model_arena_bytes: u64,
    before: RunFigures,
    after: RunFigures,
    /// The case's published figures (not measured here).
    published: Published,
}

#[derive(Debug, Serialize)]
struct Published {
    fps_before: f64,
    fps_after: f64,
    latency_mean_ms_before: f64,
    latency_mean_ms_after: f64,
    allocations_per_sec_before: f64,
    allocations_per_sec_after: f64,
    switches_per_sec_before: f64,
    switches_per_sec_after: f64,
}

const PUBLISHED: Published = Published {
    fps_before: 12.0,
    fps_after: 27.0,
    latency_mean_ms_before: 83.0,
    latency_mean_ms_after: 37.0,
    allocations_per_sec_before: 200.0,
    allocations_per_sec_after: 0.0,
    switches_per_sec_before: 50.0,
    switches_per_sec_after: 12.0,
};

/// Input patterns the frames cycle through (each one's detections computed once).
const PATTERNS: u64 = 4;
/// Hot activations per context besides the weights.
const ACTIVATIONS: u64 = 2_400_000;

fn pattern(p: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (((i as u64).wrapping_mul(2_654_435_761) >> 7) ^ (p * 0x9d)) as u8)
        .collect()
}

struct Frames {
    inputs: Vec<Vec<u8>>,
    expected: Vec<Vec<u8>>,
}

impl Frames {
    fn new(model: &Model) -> Frames {
        let inputs: Vec<Vec<u8>> = (0..PATTERNS)
            .map(|p| pattern(p, model.input().bytes as usize))
            .collect();
        let expected = inputs.iter().map(|input| model.expected(input)).collect();
        Frames { inputs, expected }
    }

    fn of(stream: usize, frame: u64) -> usize {
        ((stream as u64 + frame) % PATTERNS) as usize
    }
}

fn specs(args: &CaseArgs, max_wait: bool) -> (Vec<StreamSpec>, Vec<Arrivals>) {
    let mut specs = vec![StreamSpec::new("live", 1, 1)];
    let mut arrivals = vec![Arrivals::Periodic {
        period: 1_000_000_000 / u64::from(args.live_fps),
    }];
    for p in 0..args.playback {
        let mut s = StreamSpec::new(format!("playback{}", p + 1), 0, u32::from(p) + 2);
        if max_wait {
            s = s.with_max_wait(args.max_wait_ms * 1_000_000);
        }
        specs.push(s);
        arrivals.push(Arrivals::Asap);
    }
    (specs, arrivals)
}

fn working_set(args: &CaseArgs) -> WorkingSet {
    WorkingSet {
        private: ACTIVATIONS,
        shared: zoo::YOLOV5S_WEIGHTS,
        key: u32::from(args.share_weights),
    }
}

fn runtime(model: &Model, streams: usize) -> Result<Runtime, Error> {
    let memory = usize::try_from((model.arena_bytes() + (1 << 20)) * 4 * streams as u64)
        .unwrap_or(usize::MAX)
        + (64 << 20);
    let config = loopback::Config::default()
        .cost(Cost::npu())
        .queues(u16::try_from(3 * streams).unwrap_or(u16::MAX).min(32))
        .memory_size(memory);
    Ok(Runtime::loopback(config)?)
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Device-side figures of a run: (context switches of `unit`, the unit that runs the models'
/// steps, total modelled ns of the busiest unit, per-queue hit rates).
fn device_figures(rt: &Runtime, unit: Unit) -> Result<(u64, u64, Vec<Option<f64>>), Error> {
    let c = rt
        .loopback_device()
        .expect("a loopback runtime")
        .counters()
        .map_err(userdma::Error::Device)?;
    let switches = c.units[unit as usize].context_switches;
    let modelled = c.units.iter().map(|u| u.modelled_ns).max().unwrap_or(0);
    Ok((
        switches,
        modelled,
        c.queues.iter().map(|q| q.sram_hit_rate()).collect(),
    ))
}

/// "before": naive frames, round-robin, synchronous.
fn before(args: &CaseArgs, model: &Model, frames: &Frames) -> Result<RunFigures, Error> {
    let (specs, arrivals) = specs(args, false);
    let n = specs.len();
    let rt = runtime(model, n)?;
    let device = rt.loopback_device().expect("a loopback runtime").clone();
    let timeout = Duration::from_secs(30);
    let mut naive = Vec::with_capacity(n);
    for (i, s) in specs.iter().enumerate() {
        let queue = 3 * i as u16;
        let ws = working_set(args);
        device
            .set_working_set(queue, ws.private, ws.shared, ws.key)
            .map_err(userdma::Error::Device)?;
        naive.push(Naive::new(&rt, model.clone(), queue, s.context, timeout)?);
    }
    let mut scheduler = Scheduler::new(Policy::RoundRobin, specs.clone())
        .map_err(|e| Error::Library(invalid(e)))?;
    let mut queues: Vec<ArrivalQueue> = arrivals.iter().map(|&a| ArrivalQueue::new(a)).collect();
    let mut oldest = vec![None; n];
    let mut latency: Vec<_> = (0..n).map(|_| histogram()).collect();
    let mut done = vec![0u64; n];
    let mut longest = vec![0u64; n];
    let mut sent = vec![0u64; n];
    let mut wrong = 0u64;
    let end = args.seconds * 1_000_000_000;
    let (allocs0, maps0) = (crate::pipeline::allocations(), rt.dma_space().stats().maps);
    let start = Instant::now();
    loop {
        let now = nanos(start.elapsed());
        if now >= end {
            break;
        }
        // Frames run synchronously: nothing of any stream is on the device here.
        for (q, o) in queues.iter_mut().zip(&mut oldest) {
            q.arrive(now, false);
            *o = q.oldest();
        }
        let Some(d) = scheduler.decide(now, &oldest) else {
            let next = queues
                .iter()
                .filter_map(ArrivalQueue::next_arrival)
                .min()
                .unwrap_or(now)
                .min(end);
            std::thread::sleep(Duration::from_nanos(next.saturating_sub(now).max(1000)));
            continue;
        };
        let i = d.stream.0;
        let arrival = queues[i].take().unwrap_or(now);
        longest[i] = longest[i].max(now - arrival);
        let frame = sent[i];
        sent[i] += 1;
        let p = Frames::of(i, frame);
        naive[i].frame(
            frame,
            &mut |_, input: &mut [u8]| input.copy_from_slice(&frames.inputs[p]),
            &mut |_, result, _| {
                wrong += u64::from(result.map_or(true, |r| r != frames.expected[p].as_slice()));
            },
        )?;
        let _ = latency[i].record(nanos(start.elapsed()).saturating_sub(arrival).max(1));
        done[i] += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    let allocs = crate::pipeline::allocations() - allocs0;
    let maps = rt.dma_space().stats().maps - maps0;
    // The naive queues are the copy engine's (every step of a frame on one queue).
    let (device_switches, modelled, rates) = device_figures(&rt, Unit::Copy)?;
    for q in naive {
        q.shutdown()?;
    }
    let total: u64 = done.iter().sum();
    Ok(RunFigures {
        name: "before",
        policy: Policy::RoundRobin,
        seconds,
        streams: (0..n)
            .map(|i| StreamFigures {
                name: specs[i].name.clone(),
                frames: done[i],
                fps: done[i] as f64 / seconds,
                latency_mean_ms: latency[i].mean() / 1e6,
                latency_p99_ms: latency[i].value_at_quantile(0.99) as f64 / 1e6,
                longest_wait_ms: longest[i] as f64 / 1e6,
                sram_hit_rate: rates.get(3 * i).copied().flatten(),
            })
            .collect(),
        total_fps: total as f64 / seconds,
        allocations_per_sec: allocs as f64 / seconds,
        dma_maps_per_sec: maps as f64 / seconds,
        switches_per_sec: scheduler.switches() as f64 / seconds,
        device_switches,
        scheduler_switches: scheduler.switches(),
        device_bound_fps: bound(total, modelled),
        wrong,
    })
}

fn bound(frames: u64, modelled_ns: u64) -> f64 {
    if modelled_ns == 0 {
        0.0
    } else {
        frames as f64 * 1e9 / modelled_ns as f64
    }
}

fn invalid(e: userdma::sched::Error) -> userdma::Error {
    userdma::Error::Invalid {
        what: e.to_string(),
        hint: "change --k, --max-wait-ms or the stream counts",
    }
}

/// "after": pipelines, priority with batch switching and a maximum wait.
fn after(args: &CaseArgs, model: &Model, frames: &Frames) -> Result<RunFigures, Error> {
    let (specs, arrivals) = specs(args, true);
    let n = specs.len();
    let rt = runtime(model, n)?;
    let mut streams = Vec::with_capacity(n);
    for (i, (spec, arrivals)) in specs.iter().zip(&arrivals).enumerate() {
        let config = Config {
            depth: 2,
            queue: 3 * i as u16,
            context: spec.context,
            working_set: Some(working_set(args)),
            ..Config::default()
        };
        streams.push(Stream {
            spec: spec.clone(),
            arrivals: *arrivals,
            pipeline: Pipeline::new(&rt, model.clone(), config)?,
        });
    }
    let mut streams = Streams::new(Policy::Batch { k: args.k }, streams, 1)?;
    let mut wrong = 0u64;
    let mut got = vec![0u8; model.result().bytes as usize];
    let (allocs0, maps0) = (crate::pipeline::allocations(), rt.dma_space().stats().maps);
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
    let maps = rt.dma_space().stats().maps - maps0;
    let (device_switches, modelled, rates) = device_figures(&rt, Unit::Compute)?;
    for s in streams.into_streams() {
        s.pipeline.shutdown(|_| {})?;
    }
    let total: u64 = report.streams.iter().map(|s| s.frames).sum();
    Ok(RunFigures {
        name: "after",
        policy: report.policy,
        seconds: report.seconds,
        streams: report
            .streams
            .iter()
            .enumerate()
            .map(|(i, s)| StreamFigures {
                name: s.name.clone(),
                frames: s.frames,
                fps: s.fps,
                latency_mean_ms: s.latency_mean_ns / 1e6,
                latency_p99_ms: s.latency_p99_ns as f64 / 1e6,
                longest_wait_ms: s.max_wait_ns as f64 / 1e6,
                sram_hit_rate: rates.get(3 * i + 1).copied().flatten(),
            })
            .collect(),
        total_fps: total as f64 / report.seconds,
        allocations_per_sec: allocs as f64 / report.seconds,
        dma_maps_per_sec: maps as f64 / report.seconds,
        switches_per_sec: report.switches as f64 / report.seconds,
        device_switches,
        scheduler_switches: report.switches,
        device_bound_fps: bound(total, modelled),
        wrong,
    })
}

/// Runs the case study.
pub(crate) fn run(args: &CaseArgs, json: bool) -> Result<(), Error> {
    let model = zoo::yolov5s_like(300)?;
    let frames = Frames::new(&model);
    if !json {
        eprintln!(
            "case study: 1 live stream at {} FPS and {} playback stream(s), YOLOv5s-like; {} s before, {} s after",
            args.live_fps, args.playback, args.seconds, args.seconds
        );
    }
    let before = before(args, &model, &frames)?;
    let after = after(args, &model, &frames)?;
    let report = Report {
        config: args.clone(),
        model_arena_bytes: model.arena_bytes(),
        before,
        after,
        published: PUBLISHED,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    let wrong = report.before.wrong + report.after.wrong;
    if wrong > 0 {
        let frames = report.before.streams.iter().chain(&report.after.streams);
        return Err(Error::Wrong {
            wrong,
            frames: frames.map(|s| s.frames).sum(),
            first: 0,
        });
    }
    Ok(())
}

fn print_text(r: &Report) {
    let (b, a, p) = (&r.before, &r.after, &r.published);
    println!(
        "{:<34} {:>14} {:>14}   {:>16}",
        "",
        "before (RR)",
        format!("after ({})", a.policy),
        "published b -> a"
    );
    let row = |name: &str, x: String, y: String, published: String| {
        println!("{name:<34} {x:>14} {y:>14}   {published:>16}");
    };
    row(
        "total frames/s",
        format!("{:.1}", b.total_fps),
        format!("{:.1}", a.total_fps),
        format!("{} -> {}", p.fps_before, p.fps_after),
    );
    for (sb, sa) in b.streams.iter().zip(&a.streams) {
        row(
            &format!("{} frames/s", sb.name),
            format!("{:.1}", sb.fps),
            format!("{:.1}", sa.fps),
            String::new(),
        );
        row(
            &format!("{} latency mean / p99 ms", sb.name),
            format!("{:.0} / {:.0}", sb.latency_mean_ms, sb.latency_p99_ms),
            format!("{:.0} / {:.0}", sa.latency_mean_ms, sa.latency_p99_ms),
            if sb.name == "live" {
                format!(
                    "{} -> {} (mean)",
                    p.latency_mean_ms_before, p.latency_mean_ms_after
                )
            } else {
                String::new()
            },
        );
        row(
            &format!("{} longest wait ms", sb.name),
            format!("{:.0}", sb.longest_wait_ms),
            format!("{:.0}", sa.longest_wait_ms),
            String::new(),
        );
        let rate = |r: Option<f64>| r.map_or("-".into(), |r| format!("{:.1} %", 100.0 * r));
        row(
            &format!("{} SRAM hit rate", sb.name),
            rate(sb.sram_hit_rate),
            rate(sa.sram_hit_rate),
            if sb.name == "live" {
                "85 -> >82 %".into()
            } else {
                String::new()
            },
        );
    }
    row(
        "allocations/s",
        format!("{:.0}", b.allocations_per_sec),
        format!("{:.0}", a.allocations_per_sec),
        format!(
            "{} -> {}",
            p.allocations_per_sec_before, p.allocations_per_sec_after
        ),
    );
    row(
        "DMA maps/s",
        format!("{:.0}", b.dma_maps_per_sec),
        format!("{:.0}", a.dma_maps_per_sec),
        String::new(),
    );
    row(
        "context switches/s (device count)",
        format!("{:.1} ({})", b.switches_per_sec, b.device_switches),
        format!("{:.1} ({})", a.switches_per_sec, a.device_switches),
        format!(
            "~{} -> ~{}",
            p.switches_per_sec_before, p.switches_per_sec_after
        ),
    );
    row(
        "device bound frames/s (ratio)",
        format!(
            "{:.1} ({:.2})",
            b.device_bound_fps,
            b.total_fps / b.device_bound_fps.max(1e-9)
        ),
        format!(
            "{:.1} ({:.2})",
            a.device_bound_fps,
            a.total_fps / a.device_bound_fps.max(1e-9)
        ),
        String::new(),
    );
    println!(
        "after / before: {:.2}x the frames/s, {:.0} % fewer context switches; every frame checked: {} wrong",
        a.total_fps / b.total_fps.max(1e-9),
        100.0 * (1.0 - a.switches_per_sec / b.switches_per_sec.max(1e-9)),
        a.wrong + b.wrong
    );
    println!("published figures: the case study's own, not measured here");
}
