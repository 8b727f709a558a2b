//! `userdma pipeline [--depth N] [--frames N] [--layers L] [--size BYTES] [--batch B]
//! [--naive] [--cost npu|zero] [--poll] [--json]`: frames through the N-deep pipeline on the
//! loopback device, a chain model of `--layers` compute steps over `--size`-byte tensors
//! planned into one arena; every frame's result checked against the model run on the host
//! (exit code 1 on any mismatch). Prints frames/s, end-to-end latency percentiles, the time
//! split per frame, heap allocations and DMA maps per frame (measured: the binary counts its
//! allocations) and the device counters. `--naive` also runs the per-frame allocate, map and
//! copy path on the same model in the same run, for comparison.

mod error;
mod frames;
mod paths;
mod report;
mod tally;

use serde::Serialize;
use userdma::Runtime;
use userdma_infer::pipeline::{self, Model};
use userdma_infer::stats;
use userdma_infer::trace::Trace;
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};

use crate::demo::CostModel;
pub(crate) use error::Error;
pub(crate) use paths::allocations;
use paths::{naive_path, pipelined};
use report::{device_ns, print_text, Report};

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
    /// Write a trace of the pipeline's counted frames to this file (Chrome trace-event JSON:
    /// open it in Perfetto's UI, ui.perfetto.dev, or chrome://tracing): every op on the
    /// device's units and queues, each frame, counters.
    #[arg(long, value_name = "FILE")]
    trace: Option<std::path::PathBuf>,
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

/// Events a trace of `frames` frames of `model` holds without dropping any: an op and an
/// activity record per op, the frame, the pool's samples.
fn trace_capacity(frames: u64, model: &Model) -> usize {
    let per_frame = 2 * (model.steps().len() as u64 + 4) + 2;
    usize::try_from(frames.saturating_mul(per_frame).saturating_add(1 << 16)).unwrap_or(usize::MAX)
}

/// Says where a run's trace went and what it holds (one line, with its newline).
pub(crate) fn trace_line(path: &std::path::Path, t: &userdma_infer::trace::Summary) -> String {
    let mut line = format!(
        "trace: {} ({} events, {} dropped",
        path.display(),
        t.events,
        t.dropped
    );
    if t.ops > 0 {
        line.push_str(&format!(
            "; {} of {} ops timed by the device",
            t.ops_matched, t.ops
        ));
    }
    if t.activity_lost > 0 {
        line.push_str(&format!(", {} device records lost", t.activity_lost));
    }
    for reason in t.no_activity.iter().flatten() {
        line.push_str(&format!("; no device timing: {reason}"));
    }
    line.push_str("): open it in ui.perfetto.dev or chrome://tracing\n");
    line
}

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
    let trace = args
        .trace
        .as_ref()
        .map(|_| Trace::new(trace_capacity(args.frames, &model)));
    let (report, recorder) = pipelined(
        &rt,
        &model,
        args,
        &mut result_path,
        &mut first_wrong,
        trace.as_ref(),
    )?;
    let trace = match (&trace, &args.trace) {
        (Some(t), Some(path)) => Some(t.save(path)?),
        _ => None,
    };
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
        std::fs::write(file, text).map_err(|error| Error::WriteFile {
            option: "--metrics",
            path: file.clone(),
            error,
        })?;
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
        trace,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
        if let (Some(t), Some(path)) = (&report.trace, &args.trace) {
            print!("{}", trace_line(path, t));
        }
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
