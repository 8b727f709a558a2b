//! `userdma pipeline [--depth N] [--frames N] [--layers L] [--size BYTES] [--batch B]
//! [--naive] [--cost npu|zero] [--poll] [--json]`: frames through the N-deep pipeline on the
//! loopback device, a chain model of `--layers` compute steps over `--size`-byte tensors
//! planned into one arena; every frame's result checked against the model run on the host
//! (exit code 1 on any mismatch). Prints frames/s, end-to-end latency percentiles, the time
//! split per frame, heap allocations and DMA maps per frame (measured: the binary counts its
//! allocations) and the device counters. `--naive` also runs the per-frame allocate, map and
//! copy path on the same model in the same run, for comparison.

use std::time::{Duration, Instant};

use serde::Serialize;
use userdma::device::Wait;
use userdma::Runtime;
use userdma_infer::pipeline::{
    self, naive, Config, Finished, Input, Model, Pipeline, ResultPath, Summary, Times,
};
use userdma_infer::stats::{self, Recorder, Stage};
use userdma_loopback::{self as loopback, Cost};

use crate::demo::CostModel;
use crate::exit;
use userdma_loopback::LoopbackRuntime as _;

/// Arguments of `userdma pipeline`.
#[derive(Debug, Clone, clap::Args, Serialize)]
pub(crate) struct PipelineArgs {
    /// Slots in the ring: frames in flight at most (1 synchronous, 2 double buffering).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=1024))]
    depth: u16,
    /// Frames to run.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    frames: u64,
    /// The model: a chain of equal layers (`--layers`, `--size`), or YOLOv5s's graph at
    /// 640x640 (its tensors planned into one arena, detections filtered on the device).
    #[arg(long, value_enum, default_value = "chain")]
    model: ModelArg,
    /// Compute steps of the chain model.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    layers: u32,
    /// Bytes of each tensor (the input, every activation and the result), rounded up to 4.
    /// The default, 1 MiB, gives the npu model a frame of about 1 ms on the device, more than
    /// the host spends on it, so the run shows the device's bound; small tensors show the
    /// host's (on a two-core machine the loopback device's own work shares the host's CPUs).
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(4..=(16 << 20)))]
    size: u64,
    /// Frames per doorbell.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    batch: u16,
    /// Also run the naive path (heap buffers, a DMA map per buffer per frame, synchronous).
    #[arg(long)]
    naive: bool,
    /// The device's cost model.
    #[arg(long, value_enum, default_value = "npu")]
    cost: CostModel,
    /// Poll for completions instead of waiting for interrupts.
    #[arg(long)]
    poll: bool,
    /// Every descriptor on one queue of the copy engine (no copy/compute overlap on the
    /// device), instead of H2D and D2H on the copy engine and the layers on the compute unit.
    #[arg(long)]
    single_queue: bool,
    /// Filter the result on the device (32-byte records, about one in 16 passing, at most one
    /// in 8 copied back) instead of copying the whole result tensor back.
    #[arg(long)]
    filter: bool,
    /// How results come back: a D2H copy, read in place through the device-memory BAR (a
    /// PCIe round trip per 8 bytes under the npu model), or whichever measured faster for
    /// the result's size when the pipeline was built.
    #[arg(long, value_enum, default_value = "auto")]
    results: ResultsArg,
    /// Write SVG plots here: per path a latency CDF and a timeline (a row per stage, a bar per
    /// frame) of the last frames.
    #[arg(long, value_name = "DIR")]
    svg: Option<std::path::PathBuf>,
    /// Write the metrics in the Prometheus text format to this file.
    #[arg(long, value_name = "FILE")]
    metrics: Option<std::path::PathBuf>,
}

/// `--model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ModelArg {
    /// `--layers` layers over `--size`-byte tensors.
    Chain,
    /// YOLOv5s's graph, its weights and hot activations declared as the context's working
    /// set in device SRAM.
    Yolov5s,
}

/// `--results`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ResultsArg {
    /// A D2H copy into a host buffer.
    Copy,
    /// Read in place through the device-memory BAR.
    InPlace,
    /// Measure both when the pipeline is built and use the faster.
    Auto,
}

impl From<ResultsArg> for pipeline::Results {
    fn from(r: ResultsArg) -> pipeline::Results {
        match r {
            ResultsArg::Copy => pipeline::Results::Copy,
            ResultsArg::InPlace => pipeline::Results::InPlace,
            ResultsArg::Auto => pipeline::Results::Auto,
        }
    }
}

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The library failed.
    #[error(transparent)]
    Library(#[from] userdma_infer::Error),
    /// The model could not be built.
    #[error(transparent)]
    Model(#[from] pipeline::ModelError),
    /// Some frames came back wrong.
    #[error("{wrong} of {frames} frames came back wrong (first: frame {first}); the device or the plan is broken")]
    Wrong {
        /// Wrong frames.
        wrong: u64,
        /// Frames run.
        frames: u64,
        /// The first wrong one.
        first: u64,
    },
    /// Writing the output failed.
    #[error("cannot write the output")]
    Output(#[from] std::io::Error),
    /// Drawing a plot failed.
    #[error(transparent)]
    Plot(#[from] stats::Error),
    /// Encoding JSON failed.
    #[error("cannot encode the output as JSON")]
    Json(#[from] serde_json::Error),
    /// Two `--stream`s with one name.
    #[error("two streams named {name:?}: give each --stream its own name")]
    DuplicateStream {
        /// The name.
        name: String,
    },
    /// More streams on one device than the case study gives queues.
    #[error(
        "{count} streams on one device: a device takes at most {max}: use fewer streams or more \
         --devices"
    )]
    StreamsPerDevice {
        /// Streams on the busiest device.
        count: usize,
        /// The most one device takes.
        max: usize,
    },
    /// The scheduler refused the streams or the policy the options make. (Its message is
    /// this one's start: not a `source`, which would repeat it in the one-line chain.)
    #[error("{0}: change --k, --max-wait-ms or the streams")]
    Schedule(userdma_infer::sched::Error),
}

impl From<userdma::Error> for Error {
    fn from(e: userdma::Error) -> Error {
        Error::Library(e.into())
    }
}

impl Error {
    /// The exit code: 1 for wrong frames and library failures, 2 for a model that cannot be
    /// built from the arguments, streams or a policy the options make wrong, and a library
    /// failure that is a bad argument.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Error::Model(_)
            | Error::DuplicateStream { .. }
            | Error::StreamsPerDevice { .. }
            | Error::Schedule(_) => exit::USAGE,
            Error::Library(e) if e.code() == userdma::Code::InvalidArgument => exit::USAGE,
            _ => exit::FAILURE,
        }
    }
}

/// What one path measured.
#[derive(Debug, Clone, Serialize)]
struct PathReport {
    path: &'static str,
    depth: usize,
    frames: u64,
    wrong: u64,
    failed: u64,
    seconds: f64,
    frames_per_sec: f64,
    /// Latencies per stage and end to end, the time split, the DMA/compute overlap, slot
    /// occupancy and the data-movement share (the stats module's report).
    stats: stats::Report,
    allocations_per_frame: f64,
    dma_maps_per_frame: f64,
    doorbells_per_frame: f64,
    /// Per frame, the modelled time of the busier device unit (counted by the device over
    /// the run), in ns: one frame per this is the most the modelled device allows.
    modelled_ns_per_frame: f64,
}

/// What the paths' postprocessing keeps: the recorder, the wrong frames.
struct Tally {
    recorder: Recorder,
    previous: Option<Instant>,
    wrong: u64,
    first_wrong: Option<u64>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            recorder: Recorder::new(Instant::now(), TIMELINE),
            previous: None,
            wrong: 0,
            first_wrong: None,
        }
    }

    /// The report of a path that ran `run` in `seconds`, with `(allocations, DMA maps)`
    /// counted over it; the recorder; the first wrong frame.
    fn finish(
        mut self,
        path: &'static str,
        depth: usize,
        run: Summary,
        seconds: f64,
        (allocs, maps): (u64, u64),
    ) -> (PathReport, Recorder, Option<u64>) {
        let frames = run.frames;
        let c = &mut self.recorder.counters;
        c.frames = frames;
        c.allocations = allocs;
        c.dma_maps = maps;
        c.doorbells = run.doorbells;
        c.bytes_to_device = run.bytes_to_device;
        c.bytes_to_host = run.bytes_to_host;
        c.errors = run.failed;
        let per_frame = |v: u64| v as f64 / frames.max(1) as f64;
        let report = PathReport {
            path,
            depth,
            frames,
            wrong: self.wrong,
            failed: run.failed,
            seconds,
            frames_per_sec: frames as f64 / seconds.max(1e-9),
            stats: self.recorder.report(),
            allocations_per_frame: per_frame(allocs),
            dma_maps_per_frame: per_frame(maps),
            doorbells_per_frame: per_frame(run.doorbells),
            modelled_ns_per_frame: 0.0,
        };
        (report, self.recorder, self.first_wrong)
    }

    /// Frame `n` was checked (`right`); its postprocessing began at `post`.
    fn frame(&mut self, n: u64, right: bool, times: &Times, post: Instant) {
        if !right {
            self.wrong += 1;
            self.first_wrong.get_or_insert(n);
        }
        let post = (post, Instant::now());
        record(
            &mut self.recorder,
            n,
            right,
            times,
            post,
            &mut self.previous,
        );
    }
}

/// Records one finished frame's spans (host-side times) into `recorder`. On one in-order
/// queue the device starts a frame's H2D copy only after the previous frame's last descriptor:
/// the time from the doorbell to then (`previous`, the previous frame's D2H completion) is
/// queue wait, not DMA.
fn record(
    recorder: &mut Recorder,
    n: u64,
    ok: bool,
    t: &Times,
    post: (Instant, Instant),
    previous: &mut Option<Instant>,
) {
    let e = recorder.epoch();
    let started = previous.map_or(t.submitted, |p| p.clamp(t.submitted, t.to_device));
    let mut f = stats::Frame::new(n, 0);
    f.set_instants(Stage::Preprocess, e, t.preprocess, t.submitted)
        .set_instants(Stage::QueueWait, e, t.submitted, started)
        .set_instants(Stage::ToDevice, e, started, t.to_device)
        .set_instants(Stage::Compute, e, t.to_device, t.computed)
        .set_instants(Stage::ToHost, e, t.computed, t.to_host)
        .set_instants(Stage::Postprocess, e, post.0, post.1);
    f.ok = ok;
    recorder.record(&f);
    *previous = Some(t.to_host);
}

/// Frames the timeline keeps (the SVG's bars and the overlap figures).
const TIMELINE: usize = 48;

/// Frame `n`'s input, word by word.
fn fill(n: u64, input: &mut [u8]) {
    fill_from(n, 0, input);
}

/// Words `first..` of frame `n`'s input, into `out`.
fn fill_from(n: u64, first: usize, out: &mut [u8]) {
    for (j, w) in out.chunks_exact_mut(4).enumerate() {
        let v =
            (n as u32).wrapping_mul(0x0100_0193) ^ ((first + j) as u32).wrapping_mul(0x9e37_79b9);
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// Frame `n`'s input written into the slot's DMA buffer a cache-sized piece at a time: no
/// frame-sized host buffer in between.
fn write_input(n: u64, input: &Input<'_>) -> Result<(), userdma_infer::Error> {
    let mut piece = [0u8; 4096];
    let mut at = 0;
    while at < input.len() {
        let len = piece.len().min(input.len() - at);
        fill_from(n, at / 4, &mut piece[..len]);
        input.write(at, &piece[..len])?;
        at += len;
    }
    Ok(())
}

/// The host's view of a frame: the model run on the host, in preallocated buffers.
struct Checker {
    model: Model,
    input: Vec<u8>,
    arena: Vec<u8>,
    expected: Vec<u8>,
    got: Vec<u8>,
}

impl Checker {
    fn new(model: &Model) -> Checker {
        Checker {
            model: model.clone(),
            input: vec![0u8; model.input().bytes as usize],
            arena: vec![0u8; model.arena_bytes() as usize],
            expected: vec![0u8; model.result().bytes as usize],
            got: vec![0u8; model.result().bytes as usize],
        }
    }

    /// Frame `n`'s result computed on the host, into `into`.
    fn expect(&mut self, n: u64, into: &mut [u8]) {
        fill(n, &mut self.input);
        self.model.reference(&self.input, &mut self.arena, into);
    }

    /// Whether `got` (already in `self.got`) is frame `n`'s result.
    fn is_right(&mut self, n: u64) -> bool {
        let mut expected = std::mem::take(&mut self.expected);
        self.expect(n, &mut expected);
        let right = self.got == expected;
        self.expected = expected;
        right
    }
}

fn pipelined(
    rt: &Runtime,
    model: &Model,
    args: &PipelineArgs,
    path: &mut Option<ResultPath>,
    first_wrong: &mut Option<u64>,
) -> Result<(PathReport, Recorder), Error> {
    let config = Config {
        depth: usize::from(args.depth),
        batch: usize::from(args.batch),
        wait: if args.poll {
            Wait::Poll
        } else {
            Wait::Interrupt
        },
        split: !args.single_queue,
        results: args.results.into(),
        working_set: (args.model == ModelArg::Yolov5s).then_some(YOLOV5S_WORKING_SET),
        ..Config::default()
    };
    let mut p = Pipeline::new(rt, model.clone(), config)?;
    *path = Some(p.result_path());
    let mut checker = Checker::new(model);
    let depth = u64::from(args.depth);
    // Frame `n`'s expected result in entry `n % depth`, computed on the host right after the
    // frame is submitted, while the device works on it (frame `n + depth` can only be
    // submitted once frame `n` has been checked, so an entry is never overwritten early).
    let mut expected: Vec<Vec<u8>> = (0..depth)
        .map(|_| vec![0u8; model.result().bytes as usize])
        .collect();
    // Warm-up: every slot used once, so the counted frames are steady state.
    p.run(depth, |_, _| Ok(()), |_| {})?;
    // Before the counts start: reading the counters allocates.
    let modelled_before = modelled(rt);
    let mut tally = Tally::new();
    let (allocs, maps) = (allocations(), dma_maps(rt));
    let before = p.summary();
    let first = depth;
    let end = first.saturating_add(args.frames);
    let (mut next, mut next_expected) = (first, first);
    let start = Instant::now();
    while next < end || p.in_flight() > 0 {
        while next < end {
            match p.try_submit(|n, input| write_input(n - first, input))? {
                Some(_) => next += 1,
                None => break,
            }
        }
        p.flush()?;
        while next_expected < next {
            let slot = &mut expected[(next_expected % depth) as usize];
            checker.expect(next_expected - first, slot);
            next_expected += 1;
        }
        let mut post = |done: Finished<'_>| {
            let at = Instant::now();
            let right = match &done.result {
                Ok(out) => {
                    out.read(0, &mut checker.got).is_ok()
                        && checker.got == expected[(done.frame % depth) as usize]
                }
                Err(_) => false,
            };
            tally.frame(done.frame - first, right, &done.times, at);
        };
        p.poll(&mut post)?;
        if p.in_flight() == config.depth || next >= end {
            p.wait(&mut post)?;
        }
    }
    let summary = p.summary();
    let seconds = start.elapsed().as_secs_f64();
    let (allocs, maps) = (allocations() - allocs, dma_maps(rt) - maps);
    p.shutdown(|_| {})?;
    let run = Summary {
        frames: summary.frames - before.frames,
        failed: summary.failed - before.failed,
        doorbells: summary.doorbells - before.doorbells,
        bytes_to_device: summary.bytes_to_device - before.bytes_to_device,
        bytes_to_host: summary.bytes_to_host - before.bytes_to_host,
    };
    let mut report = tally.finish("pipeline", config.depth, run, seconds, (allocs, maps));
    let after = modelled(rt);
    let busiest = (0..2)
        .map(|u| after[u].saturating_sub(modelled_before[u]))
        .max()
        .unwrap_or(0);
    report.0.modelled_ns_per_frame = busiest as f64 / run.frames.max(1) as f64;
    if let Some(first) = report.2 {
        first_wrong.get_or_insert(first);
    }
    Ok((report.0, report.1))
}

/// Each unit's modelled nanoseconds so far (0 without a loopback device).
fn modelled(rt: &Runtime) -> [u64; 2] {
    rt.loopback_device()
        .and_then(|d| d.counters().ok())
        .map_or([0; 2], |c| c.units.map(|u| u.modelled_ns))
}

fn naive_path(
    rt: &Runtime,
    model: &Model,
    args: &PipelineArgs,
    first_wrong: &mut Option<u64>,
) -> Result<(PathReport, Recorder), Error> {
    let mut checker = Checker::new(model);
    let mut tally = Tally::new();
    let (allocs, maps) = (allocations(), dma_maps(rt));
    let start = Instant::now();
    let summary = naive::run(
        rt,
        model,
        0,
        args.frames,
        Duration::from_secs(30),
        fill,
        |n, result, times| {
            let post = Instant::now();
            let right = match result {
                Ok(bytes) => {
                    checker.got.copy_from_slice(bytes);
                    checker.is_right(n)
                }
                Err(_) => false,
            };
            tally.frame(n, right, &times, post);
        },
    )?;
    let seconds = start.elapsed().as_secs_f64();
    let (allocs, maps) = (allocations() - allocs, dma_maps(rt) - maps);
    let report = tally.finish("naive", 1, summary, seconds, (allocs, maps));
    if let Some(first) = report.2 {
        first_wrong.get_or_insert(first);
    }
    Ok((report.0, report.1))
}

pub(crate) fn allocations() -> u64 {
    stats::allocations()
}

fn dma_maps(rt: &Runtime) -> u64 {
    rt.dma_space().stats().maps
}

/// The whole run, for `--json`.
#[derive(Debug, Serialize)]
struct Report {
    config: PipelineArgs,
    arena_bytes: u64,
    steps: usize,
    /// Bytes of result per frame.
    result_bytes: u64,
    /// How the pipeline brought results back, and what it measured to choose.
    result_path: Option<ResultPath>,
    /// Frames per second the device itself allows with this cost model, from the formula
    /// (one frame per the busier unit's modelled time, every compute byte from SRAM), 0 for
    /// the zero-cost model.
    device_bound_fps: f64,
    /// The same from what the device's counters charged during the run (SRAM misses and
    /// context switches included): the bound the run was up against.
    modelled_bound_fps: f64,
    paths: Vec<PathReport>,
    device: Option<loopback::Counters>,
}

/// The modelled device time of one frame in nanoseconds (the cost module's formula: a fixed
/// cost per descriptor, DMA bytes at the DMA rate, compute bytes at the compute rate): on one
/// queue the sum, split across the two units the busier unit's share (the copy engine: the
/// H2D copy, and unless results are read in place a wait and the D2H copy; the compute unit:
/// a wait and the steps).
fn device_ns(model: &Model, cost: &Cost, split: bool, in_place: bool) -> f64 {
    let at = |bytes: u64, per_sec: u64| {
        if per_sec == 0 {
            0.0
        } else {
            bytes as f64 * 1e9 / per_sec as f64
        }
    };
    let d = cost.descriptor_ns as f64;
    let steps = model.steps().len() as f64;
    let back = if in_place { 0 } else { model.result().bytes };
    let copy = at(model.input().bytes + back, cost.dma_bytes_per_sec);
    let compute = at(model.compute_bytes(), cost.compute_bytes_per_sec);
    let copies = if in_place { 1.0 } else { 2.0 };
    if split {
        ((2.0 * copies - 1.0) * d + copy).max((1.0 + steps) * d + compute)
    } else {
        (copies + steps) * d + copy + compute
    }
}

/// What a YOLOv5s context keeps in device SRAM: its weights and about 2.4 MB of hot
/// activations, about 9.6 MB on the default 8 MiB: at most 87 % of its traffic hits.
const YOLOV5S_WORKING_SET: pipeline::WorkingSet = pipeline::WorkingSet {
    private: 2_400_000,
    shared: pipeline::zoo::YOLOV5S_WEIGHTS,
    key: 1,
};

/// Runs the command.
pub(crate) fn run(args: &PipelineArgs, json: bool) -> Result<(), Error> {
    let cost = match args.cost {
        CostModel::Npu => Cost::npu(),
        CostModel::Zero => Cost::zero(),
    };
    let mut model = match args.model {
        ModelArg::Chain => Model::chain(args.layers, args.size)?,
        ModelArg::Yolov5s => pipeline::zoo::yolov5s_like(300)?,
    };
    let memory = usize::try_from(
        (model.arena_bytes() + (1 << 20)) * (u64::from(args.depth) + 1) + (64 << 20),
    )
    .unwrap_or(usize::MAX);
    let rt = Runtime::loopback(loopback::Config::default().cost(cost).memory_size(memory))?;
    if args.filter && args.model == ModelArg::Chain {
        let records = (model.result().bytes / 32).max(1);
        model = model.with_filter(pipeline::Filter {
            record: 32,
            score_at: 0,
            threshold: u32::MAX - u32::MAX / 16,
            capacity: u32::try_from(records.div_ceil(8)).unwrap_or(u32::MAX),
        })?;
    }
    let mut first_wrong = None;
    let mut result_path = None;
    let (report, recorder) = pipelined(&rt, &model, args, &mut result_path, &mut first_wrong)?;
    let mut paths = vec![report];
    let mut recorders = vec![("pipeline", recorder)];
    if args.naive {
        let (report, recorder) = naive_path(&rt, &model, args, &mut first_wrong)?;
        paths.push(report);
        recorders.push(("naive", recorder));
    }
    if let Some(dir) = &args.svg {
        std::fs::create_dir_all(dir)?;
        for (name, r) in &recorders {
            stats::svg::latency_cdf(r, dir.join(format!("{name}-latency.svg")))?;
            stats::svg::timeline(r, dir.join(format!("{name}-timeline.svg")))?;
        }
    }
    if let Some(file) = &args.metrics {
        let mut text = String::new();
        for (name, r) in &recorders {
            text.push_str(&r.report().prometheus(&format!("userdma_{name}")));
        }
        std::fs::write(file, text)?;
    }
    let device = rt
        .loopback_device()
        .map(|d| d.counters())
        .transpose()
        .map_err(userdma::Error::Device)?;
    let report = Report {
        config: args.clone(),
        arena_bytes: model.arena_bytes(),
        steps: model.steps().len(),
        result_bytes: model.result().bytes,
        result_path,
        device_bound_fps: match device_ns(
            &model,
            &cost,
            !args.single_queue,
            result_path.is_some_and(|p| p.in_place),
        ) {
            ns if ns > 0.0 => 1e9 / ns,
            _ => 0.0,
        },
        modelled_bound_fps: match paths[0].modelled_ns_per_frame {
            ns if ns > 0.0 => 1e9 / ns,
            _ => 0.0,
        },
        paths,
        device,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    let wrong: u64 = report.paths.iter().map(|p| p.wrong).sum();
    if let Some(first) = first_wrong {
        return Err(Error::Wrong {
            wrong,
            frames: report.paths.iter().map(|p| p.frames).sum(),
            first,
        });
    }
    Ok(())
}

fn print_text(r: &Report) {
    println!(
        "model: {:?}, {} device steps over {} B tensors, arena {} B, {} B back per frame; cost {:?}; {}; every frame checked",
        r.config.model,
        r.steps,
        if r.config.model == ModelArg::Chain {
            r.config.size.to_string()
        } else {
            "planned".to_string()
        },
        r.arena_bytes,
        r.result_bytes,
        r.config.cost,
        if r.config.single_queue {
            "one queue"
        } else {
            "H2D/D2H on the copy engine, layers on the compute unit"
        }
    );
    println!(
        "{:<9} {:>5} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}  {:>8} {:>8} {:>8} {:>8} {:>8}  {:>7} {:>6} {:>6}",
        "path", "depth", "frames", "frames/s", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us",
        "pre us", "wait us", "h2d us", "comp us", "d2h us", "alloc/f", "map/f", "wrong"
    );
    let us = |ns: u64| ns as f64 / 1e3;
    for p in &r.paths {
        let l = &p.stats.end_to_end;
        let mean = |stage| p.stats.stage(stage).mean_ns / 1e3;
        println!(
            "{:<9} {:>5} {:>7} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}  {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}  {:>7.2} {:>6.2} {:>6}",
            p.path, p.depth, p.frames, p.frames_per_sec, us(l.p50_ns), us(l.p90_ns),
            us(l.p99_ns), us(l.p999_ns), us(l.max_ns), mean(Stage::Preprocess),
            mean(Stage::QueueWait), mean(Stage::ToDevice), mean(Stage::Compute), mean(Stage::ToHost),
            p.allocations_per_frame, p.dma_maps_per_frame, p.wrong
        );
    }
    for p in &r.paths {
        let t = &p.stats.timeline;
        println!(
            "{}: DMA/compute overlap {:.2}, {:.2} frames in flight on average (max {}), {:.0} % of end-to-end time moving data ({:?})",
            p.path,
            t.dma_compute_overlap,
            t.occupancy_mean,
            t.occupancy_max,
            100.0 * t.data_movement_share,
            t.verdict
        );
    }
    if let Some(p) = &r.result_path {
        let how = if p.in_place {
            "read in place through the BAR"
        } else {
            "copied back (D2H)"
        };
        match (p.copy_ns, p.in_place_ns) {
            (Some(copy), Some(read)) => println!(
                "results: {how}; measured for {} B: D2H round trip {:.1} us, in-place read {:.1} us",
                r.result_bytes,
                copy as f64 / 1e3,
                read as f64 / 1e3
            ),
            _ => println!("results: {how} (as asked)"),
        }
    }
    if r.device_bound_fps > 0.0 {
        println!(
            "device bound: {:.1} frames/s by the formula, {:.1} by what the device charged; the pipeline reaches {:.1} % of the latter",
            r.device_bound_fps,
            r.modelled_bound_fps,
            100.0 * r.paths[0].frames_per_sec / r.modelled_bound_fps.max(1e-9)
        );
    }
    if let [p, n] = &r.paths[..] {
        println!(
            "pipeline / naive: {:.2}x the frames/s, {:.2}x the p50 latency",
            p.frames_per_sec / n.frames_per_sec.max(1e-9),
            p.stats.end_to_end.p50_ns as f64 / (n.stats.end_to_end.p50_ns as f64).max(1e-9)
        );
    }
    if let Some(d) = &r.device {
        println!(
            "device: {} descriptors, {} bytes, {} interrupts, {} errors, busy {:.1} ms",
            d.descriptors,
            d.bytes,
            d.interrupts,
            d.errors,
            d.busy_ns as f64 / 1e6
        );
        let u = &d.units[loopback::Unit::Compute as usize];
        if u.modelled_ns > 0 {
            println!(
                "compute unit: modelled {:.1} ms, measured busy {:.1} ms ({:.3}x)",
                u.modelled_ns as f64 / 1e6,
                u.busy_ns as f64 / 1e6,
                u.busy_ns as f64 / u.modelled_ns as f64
            );
        }
        for (q, c) in d.queues.iter().enumerate() {
            if let Some(rate) = c.sram_hit_rate() {
                println!("queue {q}: SRAM hit rate {:.1} %", 100.0 * rate);
            }
        }
    }
}
