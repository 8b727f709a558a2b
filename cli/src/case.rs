//! `userdma demo`: the two-stream video-analytics case on the loopback device, run "before" and
//! "after" in one invocation.
//!
//! YOLOv5s-like streams share modelled NPUs: by default a live stream arriving at `--live-fps`
//! with high priority and playback streams as fast as the device allows at low priority
//! (`--stream NAME:PRIORITY:FPS|asap[:WAIT_MS]`, repeated, gives any other mix), each in its
//! own device context with its working set declared in the SRAM model, spread over
//! `--devices` loopback devices (stream i on device i mod N, each device its own scheduler,
//! device d's memory on the d-th of the machine's NUMA nodes in turn).
//!
//! - **before**: per frame a heap input, fresh DMA mappings and a fresh device arena, the
//!   stages synchronous (`pipeline::naive::Naive`), streams taken round-robin per frame;
//! - **after**: the buffer pool, the planned arena, double-buffered pipelines, priority with
//!   batch switching (`--k`) and a maximum wait on the lower-priority streams (`--max-wait-ms`);
//! - **strict**: the same pipelines under strict priority (the lower streams keep their maximum
//!   wait), the setting that puts the top stream's latency before fewer context switches. On
//!   a device that runs each frame to its end, a periodic stream cannot both keep its latency
//!   within one period and cause fewer than two switches per frame against a stream that
//!   always has work: fewer switches means its frames gather into batches and wait for each
//!   other. The two "after" runs measure both sides of that trade.
//!
//! Every frame's detections are checked against the model run on the host (frames cycle through
//! a few input patterns, each computed once), exit code 1 on a wrong one. Printed side by side:
//! per stream frames/s, mean and p99 latency from arrival, the longest wait beside the bound
//! the run's scheduler states for it (`Scheduler::wait_bound`, with each frame's service the
//! longer of its worst device time under the cost model and the longest a frame held its device
//! in the run: a bound holds for the service the device gave, and a device or host slower than
//! the model, a sanitized build's, shows in the service beside it), where every frame that arrived went (done, failed, lost to a
//! device fault, dropped, left waiting: they add up); per run
//! allocations/s, DMA maps/s, context switches/s (the schedulers' and the devices') and each
//! context's SRAM hit rate; the device bound from what the devices charged; the case's targets,
//! met or not, per run (every run: every frame accounted for; the scheduled runs: every stream
//! within its stated bound); the published figures of the case in their own column, labelled as
//! published. `--svg DIR` draws the latency CDF of every stream in every run and, per run, a
//! timeline of which stream's frame held each device when.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use userdma::memory::numa;
use userdma::Runtime;
use userdma_infer::pipeline::{naive::Naive, zoo, Config, Model, Pipeline, WorkingSet};
use userdma_infer::sched::streams::{
    ArrivalQueue, Arrivals, FrameSpan, RunReport, Stream, Streams,
};
use userdma_infer::sched::{Nanos, Policy, Scheduler, StreamId, StreamSpec};
use userdma_infer::stats::{self, svg};
use userdma_loopback::{self as loopback, Cost, Unit};

use crate::pipeline::Error;
use userdma_loopback::LoopbackRuntime as _;

/// One stream of the mix, as `--stream` gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct StreamArg {
    name: String,
    priority: u8,
    /// Frames per second; `None`: as fast as the device allows.
    fps: Option<u32>,
    /// Its maximum wait in ms in the "after" runs; `None`: `--max-wait-ms` if it is below
    /// the top priority, else none.
    max_wait_ms: Option<u64>,
}

/// Parses `NAME:PRIORITY:FPS|asap[:WAIT_MS]`.
fn parse_stream(text: &str) -> Result<StreamArg, String> {
    let form = "give NAME:PRIORITY:FPS|asap[:WAIT_MS], e.g. live:1:25 or playback:0:asap:250";
    let parts: Vec<&str> = text.split(':').collect();
    if !(3..=4).contains(&parts.len()) {
        return Err(format!("{text:?} has {} fields: {form}", parts.len()));
    }
    let name = parts[0].trim();
    if name.is_empty() || name.len() > 32 {
        return Err(format!(
            "stream name {name:?}: use 1 to 32 characters; {form}"
        ));
    }
    let priority = parts[1]
        .parse::<u8>()
        .map_err(|_| format!("priority {:?}: use 0 to 255 (higher runs first)", parts[1]))?;
    let fps = match parts[2] {
        "asap" => None,
        f => match f.parse::<u32>() {
            Ok(n) if (1..=1000).contains(&n) => Some(n),
            _ => return Err(format!("rate {f:?}: use 1 to 1000 frames/s, or asap")),
        },
    };
    let max_wait_ms = match parts.get(3) {
        None => None,
        Some(w) => match w.parse::<u64>() {
            Ok(n) if (1..=60_000).contains(&n) => Some(n),
            _ => return Err(format!("maximum wait {w:?}: use 1 to 60000 ms")),
        },
    };
    Ok(StreamArg {
        name: name.to_owned(),
        priority,
        fps,
        max_wait_ms,
    })
}

/// Arguments of `userdma demo` (the case study).
#[derive(Debug, Clone, clap::Args, Serialize)]
pub(crate) struct CaseArgs {
    /// Seconds each run lasts.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=3600))]
    seconds: u64,
    /// Frames per second of the live stream (the default mix).
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..=1000))]
    live_fps: u32,
    /// Playback streams beside the live one (the default mix).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=9))]
    playback: u8,
    /// Frames per second of each playback stream; 0: as fast as the device allows.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000))]
    playback_fps: u32,
    /// A stream of your own mix, NAME:PRIORITY:FPS|asap[:WAIT_MS] (repeat it; replaces the
    /// live and playback streams). Higher priority runs first; WAIT_MS is its maximum wait.
    #[arg(long = "stream", value_name = "SPEC", value_parser = parse_stream)]
    streams: Vec<StreamArg>,
    /// Loopback devices (modelled NPUs) the streams are spread over: stream i on device i mod N.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
    devices: u8,
    /// "after": frames one stream may run in a row while another waits (batch switching).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    k: u32,
    /// "after": the longest a lower-priority frame may wait before it runs, whatever its
    /// priority (for streams whose --stream gives no WAIT_MS).
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    max_wait_ms: u64,
    /// The contexts share the model's weights in device SRAM (one model, one copy).
    #[arg(long)]
    share_weights: bool,
    /// Write plots to this directory: latency.svg (every stream's latency CDF in every run)
    /// and timeline-<run>.svg (which stream's frame held each device when).
    #[arg(long, value_name = "DIR")]
    svg: Option<PathBuf>,
}

/// One stream's figures in one run.
#[derive(Debug, Clone, Serialize)]
struct StreamFigures {
    name: String,
    device: usize,
    /// Its device's NUMA node, where its memory is.
    numa_node: Option<u32>,
    priority: u8,
    /// Its arrival rate; `None`: as fast as the device allows.
    target_fps: Option<u32>,
    /// Frames that arrived in the run; every one is accounted for below:
    /// `arrived = frames + failed + lost + dropped + left_waiting`.
    arrived: u64,
    /// Frames finished (checked against the host's result).
    frames: u64,
    /// Frames the device completed with an error.
    failed: u64,
    /// Frames in flight when a device fault was recovered.
    lost: u64,
    /// Frames that arrived while 256 of the stream's were waiting (never run).
    dropped: u64,
    /// Frames that had arrived but still waited when the run ended.
    left_waiting: u64,
    fps: f64,
    latency_mean_ms: f64,
    latency_p99_ms: f64,
    longest_wait_ms: f64,
    /// The longest wait as the stated bound counts it: from when the frame became its
    /// stream's oldest waiting frame (its arrival, or its stream's previous dispatch if
    /// later); `longest_wait_ms` counts from arrival, which grows without bound for a stream
    /// whose frames arrive faster than it is served.
    longest_head_wait_ms: f64,
    /// The longest any of its frames may wait for dispatch, as the run's scheduler states it
    /// (`Scheduler::wait_bound`, with each frame's service `frame_service_ms`); `None` where the policy states none (strict priority below a
    /// stream with no maximum wait) or the run's frames were not scheduled on a device
    /// ("before" runs them synchronously on the host).
    stated_wait_bound_ms: Option<f64>,
    /// The bound at the model's pace (`modelled_frame_ms` a frame): where it is stated but
    /// `stated_wait_bound_ms` is not, the device was too slow for any bound to exist.
    bound_at_model_ms: Option<f64>,
    /// The service time per frame the bound takes for its device: the longer of the worst
    /// its model can take (`Model::worst_frame_ns`, `modelled_frame_ms`) and the longest a
    /// frame held the device in this run (`DeviceReport::longest_frame_ns`: a device or host
    /// slower than the model shows here); `None` for a run no scheduler dispatches.
    frame_service_ms: Option<f64>,
    /// The worst one frame can take on its device under the cost model.
    modelled_frame_ms: Option<f64>,
    /// Its maximum wait W in this run.
    max_wait_ms: Option<u64>,
    sram_hit_rate: Option<f64>,
}

impl StreamFigures {
    /// Whether every frame that arrived is accounted for.
    fn accounted(&self) -> bool {
        self.arrived == self.frames + self.failed + self.lost + self.dropped + self.left_waiting
    }
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
    /// Total frames/s the devices allow from what they charged in this run.
    device_bound_fps: f64,
    wrong: u64,
}

/// A run's figures and what its plots need.
struct Run {
    figures: RunFigures,
    latency: Vec<hdrhistogram::Histogram<u64>>,
    timeline: Vec<FrameSpan>,
}

/// One of the case's targets, for one run.
#[derive(Debug, Clone, Serialize)]
struct Target {
    target: String,
    run: &'static str,
    measured: String,
    met: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    config: CaseArgs,
    streams: Vec<StreamArg>,
    model_arena_bytes: u64,
    before: RunFigures,
    after: RunFigures,
    /// "after" under strict priority (the lower streams' maximum wait kept).
    strict: RunFigures,
    targets: Vec<Target>,
    /// The plots written (`--svg`).
    svg: Vec<PathBuf>,
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
/// Streams one device takes: three queues each, of the loopback device's 32.
const STREAMS_PER_DEVICE: usize = 10;

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

/// The streams of a run and where each runs.
struct Mix {
    streams: Vec<StreamArg>,
    /// Per stream: its device, and its first queue on that device.
    device: Vec<usize>,
    queue: Vec<u16>,
    /// Streams per device.
    on_device: Vec<usize>,
    top: u8,
    max_wait_ms: u64,
    /// The machine's NUMA nodes with memory (`None`: sysfs does not say).
    nodes: Option<numa::NodeList>,
}

impl Mix {
    fn new(args: &CaseArgs) -> Result<Mix, Error> {
        let streams = if args.streams.is_empty() {
            let mut s = vec![StreamArg {
                name: "live".into(),
                priority: 1,
                fps: Some(args.live_fps),
                max_wait_ms: None,
            }];
            s.extend((0..args.playback).map(|p| StreamArg {
                name: format!("playback{}", p + 1),
                priority: 0,
                fps: (args.playback_fps > 0).then_some(args.playback_fps),
                max_wait_ms: None,
            }));
            s
        } else {
            args.streams.clone()
        };
        for (i, s) in streams.iter().enumerate() {
            if streams[..i].iter().any(|o| o.name == s.name) {
                return Err(Error::DuplicateStream {
                    name: s.name.clone(),
                });
            }
        }
        let devices = usize::from(args.devices);
        let device: Vec<usize> = (0..streams.len()).map(|i| i % devices).collect();
        let mut on_device = vec![0usize; devices];
        let mut queue = Vec::with_capacity(streams.len());
        for &d in &device {
            queue.push(u16::try_from(3 * on_device[d]).unwrap_or(u16::MAX));
            on_device[d] += 1;
        }
        if let Some(&count) = on_device.iter().find(|&&n| n > STREAMS_PER_DEVICE) {
            return Err(Error::StreamsPerDevice {
                count,
                max: STREAMS_PER_DEVICE,
            });
        }
        let top = streams.iter().map(|s| s.priority).max().unwrap_or(0);
        Ok(Mix {
            streams,
            device,
            queue,
            on_device,
            top,
            max_wait_ms: args.max_wait_ms,
            nodes: numa::with_memory(Path::new("/sys"))
                .ok()
                .filter(|n| !n.as_slice().is_empty()),
        })
    }

    fn len(&self) -> usize {
        self.streams.len()
    }

    /// Stream `i`'s maximum wait in the "after" runs.
    fn max_wait_ms(&self, i: usize) -> Option<u64> {
        let s = &self.streams[i];
        s.max_wait_ms
            .or((s.priority < self.top).then_some(self.max_wait_ms))
    }

    /// Stream `i`'s scheduling parameters (context i + 1), with its maximum wait if `wait`.
    fn spec(&self, i: usize, wait: bool) -> StreamSpec {
        let s = &self.streams[i];
        let spec = StreamSpec::new(s.name.clone(), s.priority, i as u32 + 1);
        match self.max_wait_ms(i).filter(|_| wait) {
            Some(w) => spec.with_max_wait(w * 1_000_000),
            None => spec,
        }
    }

    fn arrivals(&self, i: usize) -> Arrivals {
        match self.streams[i].fps {
            Some(fps) => Arrivals::Periodic {
                period: 1_000_000_000 / u64::from(fps),
            },
            None => Arrivals::Asap,
        }
    }

    /// The NUMA node of device `d`: the machine's nodes with memory in turn, as NPUs spread
    /// over the sockets of a machine would be (`None` where sysfs does not say).
    fn node(&self, d: usize) -> Option<u32> {
        let nodes = self.nodes.as_ref()?;
        nodes
            .as_slice()
            .get(d % nodes.as_slice().len().max(1))
            .copied()
    }

    /// One loopback device per `--devices`, each with room for its streams, its memory on its
    /// NUMA node.
    fn runtimes(&self, model: &Model) -> Result<Vec<Runtime>, Error> {
        self.on_device
            .iter()
            .enumerate()
            .map(|(d, &n)| {
                let n = n.max(1);
                let memory = usize::try_from((model.arena_bytes() + (1 << 20)) * 4 * n as u64)
                    .unwrap_or(usize::MAX)
                    + (64 << 20);
                let config = loopback::Config::default()
                    .cost(Cost::npu())
                    .queues(u16::try_from(3 * n).unwrap_or(u16::MAX).min(32))
                    .memory_size(memory)
                    .numa_node(self.node(d));
                Ok(Runtime::loopback(config)?)
            })
            .collect()
    }

    /// Room for every frame a run of `seconds` can finish (preallocated: recording allocates
    /// nothing during the run).
    fn timeline_capacity(&self, seconds: u64) -> usize {
        usize::try_from(seconds).unwrap_or(3600) * 200 * self.on_device.len() + 1024
    }
}

fn working_set(args: &CaseArgs) -> WorkingSet {
    WorkingSet {
        private: ACTIVATIONS,
        shared: zoo::YOLOV5S_WEIGHTS,
        key: u32::from(args.share_weights),
    }
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What the devices counted in a run: context switches of `unit` summed over devices, the
/// bound on total frames/s from each device's busiest unit's modelled time and the frames it
/// ran, and per stream the SRAM hit rate of its queue `queue + offset`.
fn device_figures(
    rts: &[Runtime],
    mix: &Mix,
    unit: Unit,
    offset: u16,
    frames: &[u64],
) -> Result<(u64, f64, Vec<Option<f64>>), Error> {
    let mut switches = 0;
    let mut bound = 0.0;
    let mut counters = Vec::with_capacity(rts.len());
    for (d, rt) in rts.iter().enumerate() {
        let c = rt
            .loopback_device()
            .expect("a loopback runtime")
            .counters()
            .map_err(userdma::Error::Device)?;
        switches += c.units[unit as usize].context_switches;
        let modelled = c.units.iter().map(|u| u.modelled_ns).max().unwrap_or(0);
        let ran: u64 = (0..mix.len())
            .filter(|&i| mix.device[i] == d)
            .map(|i| frames[i])
            .sum();
        if modelled > 0 {
            bound += ran as f64 * 1e9 / modelled as f64;
        }
        counters.push(c);
    }
    let rates = (0..mix.len())
        .map(|i| {
            counters[mix.device[i]]
                .queues
                .get(usize::from(mix.queue[i] + offset))
                .and_then(|q| q.sram_hit_rate())
        })
        .collect();
    Ok((switches, bound, rates))
}

/// "before": naive frames, round-robin, synchronous.
fn before(args: &CaseArgs, mix: &Mix, model: &Model, frames: &Frames) -> Result<Run, Error> {
    let n = mix.len();
    let specs: Vec<StreamSpec> = (0..n).map(|i| mix.spec(i, false)).collect();
    let rts = mix.runtimes(model)?;
    let timeout = Duration::from_secs(30);
    let mut naive = Vec::with_capacity(n);
    for (i, s) in specs.iter().enumerate() {
        let rt = &rts[mix.device[i]];
        let ws = working_set(args);
        rt.loopback_device()
            .expect("a loopback runtime")
            .set_working_set(mix.queue[i], ws.private, ws.shared, ws.key)
            .map_err(userdma::Error::Device)?;
        naive.push(Naive::new(
            rt,
            model.clone(),
            mix.queue[i],
            s.context,
            timeout,
        )?);
    }
    let mut scheduler =
        Scheduler::new(Policy::RoundRobin, specs.clone()).map_err(Error::Schedule)?;
    let mut queues: Vec<ArrivalQueue> =
        (0..n).map(|i| ArrivalQueue::new(mix.arrivals(i))).collect();
    let mut oldest = vec![None; n];
    let mut latency: Vec<_> = (0..n).map(|_| histogram()).collect();
    let mut done = vec![0u64; n];
    let mut longest = vec![0u64; n];
    let (mut head_longest, mut last_dispatch) = (vec![0u64; n], vec![0u64; n]);
    let mut wrong = 0u64;
    // The context each device ran last: a frame in another one is a switch on that device.
    let mut last: Vec<Option<u32>> = vec![None; mix.on_device.len()];
    let mut switches = 0u64;
    let mut timeline = Vec::with_capacity(mix.timeline_capacity(args.seconds));
    let end = args.seconds * 1_000_000_000;
    let (allocs0, maps0) = (
        crate::pipeline::allocations(),
        rts.iter()
            .map(|rt| rt.dma_space().stats().maps)
            .sum::<u64>(),
    );
    let start = Instant::now();
    loop {
        let now = nanos(start.elapsed());
        if now >= end {
            break;
        }
        // Frames run synchronously: nothing of any stream is on a device here.
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
        let device = mix.device[i];
        let context = specs[i].context;
        switches += u64::from(last[device].is_some_and(|c| c != context));
        last[device] = Some(context);
        let arrival = queues[i].take().unwrap_or(now);
        longest[i] = longest[i].max(now - arrival);
        head_longest[i] = head_longest[i].max(now - arrival.max(last_dispatch[i]));
        last_dispatch[i] = now;
        let frame = done[i];
        let p = Frames::of(i, frame);
        let mut ok = true;
        naive[i].frame(
            frame,
            &mut |_, input: &mut [u8]| input.copy_from_slice(&frames.inputs[p]),
            &mut |_, result, _| {
                ok = result.is_ok_and(|r| r == frames.expected[p].as_slice());
            },
        )?;
        wrong += u64::from(!ok);
        let finished = nanos(start.elapsed());
        let _ = latency[i].record(finished.saturating_sub(arrival).max(1));
        if timeline.len() < timeline.capacity() {
            timeline.push(FrameSpan {
                stream: StreamId(i),
                device,
                frame,
                arrival_ns: arrival,
                dispatch_ns: now,
                done_ns: finished,
                ok,
            });
        }
        done[i] += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    let allocs = crate::pipeline::allocations() - allocs0;
    let maps = rts
        .iter()
        .map(|rt| rt.dma_space().stats().maps)
        .sum::<u64>()
        - maps0;
    // The naive queues are the copy engine's (every step of a frame on one queue).
    let (device_switches, bound, rates) = device_figures(&rts, mix, Unit::Copy, 0, &done)?;
    for q in naive {
        q.shutdown()?;
    }
    let total: u64 = done.iter().sum();
    let figures = RunFigures {
        name: "before",
        policy: Policy::RoundRobin,
        seconds,
        streams: (0..n)
            .map(|i| StreamFigures {
                name: specs[i].name.clone(),
                device: mix.device[i],
                numa_node: mix.node(mix.device[i]),
                priority: specs[i].priority,
                target_fps: mix.streams[i].fps,
                arrived: queues[i].arrived(),
                frames: done[i],
                failed: 0,
                lost: 0,
                dropped: queues[i].dropped(),
                left_waiting: queues[i].len() as u64,
                fps: done[i] as f64 / seconds,
                latency_mean_ms: latency[i].mean() / 1e6,
                latency_p99_ms: latency[i].value_at_quantile(0.99) as f64 / 1e6,
                longest_wait_ms: longest[i] as f64 / 1e6,
                longest_head_wait_ms: head_longest[i] as f64 / 1e6,
                stated_wait_bound_ms: None,
                bound_at_model_ms: None,
                frame_service_ms: None,
                modelled_frame_ms: None,
                max_wait_ms: None,
                sram_hit_rate: rates[i],
            })
            .collect(),
        total_fps: total as f64 / seconds,
        allocations_per_sec: allocs as f64 / seconds,
        dma_maps_per_sec: maps as f64 / seconds,
        switches_per_sec: switches as f64 / seconds,
        device_switches,
        scheduler_switches: switches,
        device_bound_fps: bound,
        wrong,
    };
    Ok(Run {
        figures,
        latency,
        timeline,
    })
}

/// "after": pipelines under `policy` (priority with batch switching, or strict priority),
/// the lower streams with a maximum wait.
fn after(
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
    };
    Ok(Run {
        figures,
        latency,
        timeline,
    })
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

/// The targets every run has: every frame accounted for, and (for the runs a scheduler
/// dispatches to devices) no stream waiting longer than its stated bound.
fn run_targets(r: &RunFigures) -> Vec<Target> {
    let mut t = Vec::new();
    let accounted = r.streams.iter().all(StreamFigures::accounted);
    let arrived: u64 = r.streams.iter().map(|s| s.arrived).sum();
    t.push(Target {
        target: "every frame accounted for".into(),
        run: r.name,
        measured: format!("{arrived} arrived"),
        met: accounted,
    });
    if r.streams.iter().any(|s| s.bound_at_model_ms.is_some()) {
        // A stream with a bound at the model's pace but none at its device's: the device ran
        // so far behind its model that no bound exists (its forced frames could fill it).
        let unbounded = r
            .streams
            .iter()
            .find(|s| s.bound_at_model_ms.is_some() && s.stated_wait_bound_ms.is_none());
        let within = unbounded.is_none()
            && r.streams.iter().all(|s| {
                s.stated_wait_bound_ms
                    .is_none_or(|bound| s.longest_head_wait_ms <= bound)
            });
        let measured = match unbounded {
            Some(s) => format!(
                "{}: no bound at a {:.0} ms frame (model {:.0} ms)",
                s.name,
                s.frame_service_ms.unwrap_or(0.0),
                s.modelled_frame_ms.unwrap_or(0.0)
            ),
            None => {
                let worst = r
                    .streams
                    .iter()
                    .filter_map(|s| s.stated_wait_bound_ms.map(|b| s.longest_head_wait_ms / b))
                    .fold(0.0f64, f64::max);
                format!("longest wait {worst:.2}x its bound")
            }
        };
        t.push(Target {
            target: "every stream within its stated wait bound".into(),
            run: r.name,
            measured,
            met: within,
        });
    }
    t
}

/// The case's targets for an "after" run against "before".
fn targets(b: &RunFigures, a: &RunFigures) -> Vec<Target> {
    let mut t = Vec::new();
    let mut add = |target: String, measured: String, met: bool| {
        t.push(Target {
            target,
            run: a.name,
            measured,
            met,
        });
    };
    let ratio = a.total_fps / b.total_fps.max(1e-9);
    add(
        "total frames/s at least 2x before".into(),
        format!("{ratio:.2}x"),
        ratio >= 2.0,
    );
    let share = a.total_fps / a.device_bound_fps.max(1e-9);
    add(
        "total frames/s at least 0.95x the device bound".into(),
        format!("{share:.3}x"),
        share >= 0.95,
    );
    add(
        "0 allocations/s and 0 DMA maps/s".into(),
        format!("{:.0} / {:.0}", a.allocations_per_sec, a.dma_maps_per_sec),
        a.allocations_per_sec == 0.0 && a.dma_maps_per_sec == 0.0,
    );
    let fewer = 1.0 - a.switches_per_sec / b.switches_per_sec.max(1e-9);
    add(
        "context switches down at least 70 %".into(),
        format!("{:.0} %", 100.0 * fewer),
        b.switches_per_sec > 0.0 && fewer >= 0.70,
    );
    for s in &a.streams {
        if let Some(fps) = s.target_fps {
            // The first and last frame of a run fall at its edges: 1 frame of slack.
            let keeps = s.fps * a.seconds + 1.0 >= f64::from(fps) * a.seconds;
            let budget = 1000.0 / f64::from(fps);
            add(
                format!("{} keeps {fps} FPS with p99 under {budget:.0} ms", s.name),
                format!("{:.1} FPS, p99 {:.1} ms", s.fps, s.latency_p99_ms),
                keeps && s.latency_p99_ms < budget,
            );
        }
        if let Some(w) = s.max_wait_ms {
            add(
                format!("no {} frame waits longer than W = {w} ms", s.name),
                format!("longest {:.1} ms", s.longest_wait_ms),
                s.longest_wait_ms <= w as f64,
            );
        }
    }
    t
}

/// Writes the plots of `runs` to `dir`; returns their paths.
fn plots(dir: &Path, mix: &Mix, runs: &[&Run]) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let labels: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            mix.streams
                .iter()
                .map(|s| format!("{} {}", s.name, r.figures.name))
                .collect()
        })
        .collect();
    let mut lines = Vec::new();
    for (r, run) in runs.iter().enumerate() {
        for (i, h) in run.latency.iter().enumerate() {
            lines.push(svg::Cdf {
                label: &labels[r][i],
                histogram: h,
                colour: r * mix.len() + i,
                dashed: r == 0,
            });
        }
    }
    let path = dir.join("latency.svg");
    svg::cdfs(
        "Latency from arrival per stream (dashed: before)",
        &lines,
        &path,
    )?;
    written.push(path);
    let lanes: Vec<String> = (0..mix.len())
        .map(|i| format!("device {} {}", mix.device[i], mix.streams[i].name))
        .collect();
    for run in runs {
        // The last second of the run (or all of it): frames from dispatch to result.
        let end = run.timeline.iter().map(|f| f.done_ns).max().unwrap_or(0);
        let from = end.saturating_sub(1_000_000_000);
        let bars: Vec<svg::Bar> = run
            .timeline
            .iter()
            .filter(|f| f.done_ns >= from)
            .map(|f| svg::Bar {
                lane: f.stream.0,
                span: stats::Span::new(f.dispatch_ns.max(from), f.done_ns),
                colour: f.stream.0,
            })
            .collect();
        let path = dir.join(format!("timeline-{}.svg", run.figures.name));
        let title = format!(
            "{} ({}): which stream held its device, last second",
            run.figures.name, run.figures.policy
        );
        svg::lanes(&title, &lanes, &bars, &path)?;
        written.push(path);
    }
    Ok(written)
}

/// Runs the case study.
pub(crate) fn run(args: &CaseArgs, json: bool) -> Result<(), Error> {
    // Never empty: the default mix has its live stream, and --stream adds at least one.
    let mix = Mix::new(args)?;
    let model = zoo::yolov5s_like(300)?;
    let frames = Frames::new(&model);
    if !json {
        let each: Vec<String> = mix
            .streams
            .iter()
            .map(|s| match s.fps {
                Some(f) => format!("{} ({f} FPS, priority {})", s.name, s.priority),
                None => format!("{} (as fast as it can, priority {})", s.name, s.priority),
            })
            .collect();
        eprintln!(
            "case study: {} on {} device(s), YOLOv5s-like; {} runs of {} s",
            each.join(", "),
            args.devices,
            3,
            args.seconds
        );
        eprintln!("  before: naive frames, round-robin ...");
    }
    let before = before(args, &mix, &model, &frames)?;
    if !json {
        eprintln!("  after: pipelines, batch K={} ...", args.k);
    }
    let after = after(
        "after",
        Policy::Batch { k: args.k },
        args,
        &mix,
        &model,
        &frames,
    )?;
    if !json {
        eprintln!("  after, strict priority ...");
    }
    let strict = self::after(
        "strict",
        Policy::StrictPriority,
        args,
        &mix,
        &model,
        &frames,
    )?;
    let mut targets = run_targets(&before.figures);
    targets.extend(self::targets(&before.figures, &after.figures));
    targets.extend(run_targets(&after.figures));
    targets.extend(self::targets(&before.figures, &strict.figures));
    targets.extend(run_targets(&strict.figures));
    let svg = match &args.svg {
        Some(dir) => plots(dir, &mix, &[&before, &after, &strict])?,
        None => Vec::new(),
    };
    let report = Report {
        config: args.clone(),
        streams: mix.streams.clone(),
        model_arena_bytes: model.arena_bytes(),
        before: before.figures,
        after: after.figures,
        strict: strict.figures,
        targets,
        svg,
        published: PUBLISHED,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    let runs = [&report.before, &report.after, &report.strict];
    let wrong: u64 = runs.iter().map(|r| r.wrong).sum();
    if wrong > 0 {
        let frames = runs.iter().flat_map(|r| &r.streams);
        return Err(Error::Wrong {
            wrong,
            frames: frames.map(|s| s.frames).sum(),
            first: 0,
        });
    }
    Ok(())
}

fn print_text(r: &Report) {
    let p = &r.published;
    let runs = [&r.before, &r.after, &r.strict];
    let head: Vec<String> = runs
        .iter()
        .map(|f| format!("{} ({})", f.name, f.policy))
        .collect();
    // The label column fits the longest label: a stream's name and its longest row's title.
    let longest_name = r
        .before
        .streams
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0);
    let width = 34.max(longest_name + " longest wait / as bounded / bound ms".len());
    let row = |name: &str, cells: Vec<String>, published: String| {
        let cells: String = cells.iter().map(|c| format!(" {c:>20}")).collect();
        println!("{name:<width$}{cells}   {published:>18}");
    };
    row("", head, "published b -> a".into());
    let each = |f: &dyn Fn(&RunFigures) -> String| runs.iter().map(|r| f(r)).collect::<Vec<_>>();
    row(
        "total frames/s",
        each(&|r| format!("{:.1}", r.total_fps)),
        format!("{} -> {}", p.fps_before, p.fps_after),
    );
    let rate = |r: Option<f64>| r.map_or("-".into(), |r| format!("{:.1} %", 100.0 * r));
    for (i, s) in r.before.streams.iter().enumerate() {
        let top = s.priority
            == r.before
                .streams
                .iter()
                .map(|s| s.priority)
                .max()
                .unwrap_or(0);
        row(
            &format!("{} frames/s", s.name),
            each(&|r| format!("{:.1}", r.streams[i].fps)),
            String::new(),
        );
        row(
            &format!("{} latency mean / p99 ms", s.name),
            each(&|r| {
                format!(
                    "{:.0} / {:.0}",
                    r.streams[i].latency_mean_ms, r.streams[i].latency_p99_ms
                )
            }),
            if top {
                format!(
                    "{} -> {} (mean)",
                    p.latency_mean_ms_before, p.latency_mean_ms_after
                )
            } else {
                String::new()
            },
        );
        row(
            &format!("{} longest wait / as bounded / bound ms", s.name),
            each(&|r| {
                let s = &r.streams[i];
                let b = s
                    .stated_wait_bound_ms
                    .map_or("-".into(), |b| format!("{b:.0}"));
                format!(
                    "{:.0} / {:.0} / {b}",
                    s.longest_wait_ms, s.longest_head_wait_ms
                )
            }),
            String::new(),
        );
        row(
            &format!("{} frame service / model ms", s.name),
            each(&|r| {
                let s = &r.streams[i];
                match (s.frame_service_ms, s.modelled_frame_ms) {
                    (Some(f), Some(m)) => format!("{f:.1} / {m:.1}"),
                    _ => "- / -".into(),
                }
            }),
            String::new(),
        );
        row(
            &format!("{} frames arrived (=)", s.name),
            each(&|r| {
                let s = &r.streams[i];
                format!(
                    "{} = {}+{}+{}+{}+{}",
                    s.arrived, s.frames, s.failed, s.lost, s.dropped, s.left_waiting
                )
            }),
            String::new(),
        );
        row(
            &format!("{} SRAM hit rate", s.name),
            each(&|r| rate(r.streams[i].sram_hit_rate)),
            if top {
                "85 -> >82 %".into()
            } else {
                String::new()
            },
        );
    }
    row(
        "allocations/s",
        each(&|r| format!("{:.0}", r.allocations_per_sec)),
        format!(
            "{} -> {}",
            p.allocations_per_sec_before, p.allocations_per_sec_after
        ),
    );
    row(
        "DMA maps/s",
        each(&|r| format!("{:.0}", r.dma_maps_per_sec)),
        String::new(),
    );
    row(
        "context switches/s (device count)",
        each(&|r| format!("{:.1} ({})", r.switches_per_sec, r.device_switches)),
        format!(
            "~{} -> ~{}",
            p.switches_per_sec_before, p.switches_per_sec_after
        ),
    );
    row(
        "device bound frames/s (ratio)",
        each(&|r| {
            format!(
                "{:.1} ({:.2})",
                r.device_bound_fps,
                r.total_fps / r.device_bound_fps.max(1e-9)
            )
        }),
        String::new(),
    );
    println!(
        "every frame checked: {} wrong; published figures: the case study's own, not measured here",
        runs.iter().map(|r| r.wrong).sum::<u64>()
    );
    println!(
        "frames arrived = done + failed + lost (device faults) + dropped (256 waiting) + left waiting at the end; \
         bound: the longest wait the run's scheduler states for the service per frame beside it \
         (the longer of the model's worst frame and the longest a frame held its device)"
    );
    println!();
    println!("{:<52} {:>10} {:>26}  met", "target", "run", "measured");
    for t in &r.targets {
        println!(
            "{:<52} {:>10} {:>26}  {}",
            t.target,
            t.run,
            t.measured,
            if t.met { "yes" } else { "NO" }
        );
    }
    for p in &r.svg {
        println!("wrote {}", p.display());
    }
}
