//! The two paths frames take, each run and measured: the N-deep pipeline, and the naive
//! per-frame allocate, map and copy path; the counts both take (allocations, DMA maps,
//! modelled device time).

use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::Wait;
use userdma::Runtime;
use userdma_infer::pipeline::{
    self, naive, Config, Finished, Model, Pipeline, ResultPath, Summary,
};
use userdma_infer::stats::{self, Recorder};
use userdma_infer::trace::Trace;

use userdma_loopback::LoopbackRuntime as _;

use super::frames::{fill, write_input, Checker};
use super::tally::{PathReport, Tally};
use super::{Error, ModelArg, PipelineArgs};

pub(super) fn pipelined(
    rt: &Runtime,
    model: &Model,
    args: &PipelineArgs,
    path: &mut Option<ResultPath>,
    first_wrong: &mut Option<u64>,
    trace: Option<&Arc<Trace>>,
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
    // The counted frames are traced (registering the device and naming the stream
    // allocate, before the counts start).
    if let Some(trace) = trace {
        let stream = trace.stream("pipeline");
        p.set_trace(Arc::clone(trace), stream);
    }
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
        host_steps: summary.host_steps - before.host_steps,
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

pub(super) fn naive_path(
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

/// What a YOLOv5s context keeps in device SRAM: its weights and about 2.4 MB of hot
/// activations, about 9.6 MB on the default 8 MiB: at most 87 % of its traffic hits.
const YOLOV5S_WORKING_SET: pipeline::WorkingSet = pipeline::WorkingSet {
    private: 2_400_000,
    shared: pipeline::zoo::YOLOV5S_WEIGHTS,
    key: 1,
};
