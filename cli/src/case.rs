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

mod after;
mod before;
mod figures;
mod mix;
mod owner;
mod plots;
mod targets;
mod text;

use std::path::PathBuf;

use serde::Serialize;
use userdma_infer::pipeline::zoo;
use userdma_infer::sched::Policy;

use crate::pipeline::Error;
use after::after;
use before::before;
use figures::{Report, PUBLISHED};
use mix::{Frames, Mix};
pub(crate) use owner::{owner_client, OwnerClientArgs};
use plots::plots;
use targets::{run_targets, targets};
use text::print_text;

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
    /// Skip the fourth run: "after" with every stream a process of its own, through the
    /// device owner (`userdma serve`'s), beside the in-process one.
    #[arg(long)]
    no_owner: bool,
    /// Write a trace of the "after" run to this file (Chrome trace-event JSON: open it in
    /// Perfetto's UI, ui.perfetto.dev, or chrome://tracing): every op on the device's units
    /// and queues, scheduler decisions, context switches with their SRAM refill, counters.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
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
    let through_owner = if args.no_owner || args.devices != 1 {
        None
    } else {
        if !json {
            eprintln!("  after, each stream a process through the device owner ...");
        }
        Some(owner::through_owner(
            args,
            &mix,
            &model,
            &frames,
            after.figures.total_fps,
        )?)
    };
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
        through_owner,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
        if let (Some(t), Some(path)) = (&report.after.trace, &args.trace) {
            print!("{}", crate::pipeline::trace_line(path, t));
        }
        if let Some(run) = &report.through_owner {
            owner::print_owner(run, &report.after);
        }
    }
    let runs = [&report.before, &report.after, &report.strict];
    let wrong: u64 = runs.iter().map(|r| r.wrong).sum::<u64>()
        + report
            .through_owner
            .iter()
            .flat_map(|r| &r.streams)
            .map(|s| s.wrong)
            .sum::<u64>();
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
