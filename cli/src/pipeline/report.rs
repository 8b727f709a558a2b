//! The whole run's report (`--json`), the device's bound from the cost model's formula, and
//! the report as text.

use serde::Serialize;
use userdma_infer::pipeline::{Model, ResultPath};
use userdma_infer::stats::Stage;
use userdma_loopback::{self as loopback, Cost};

use super::tally::PathReport;
use super::{ModelArg, PipelineArgs};

/// The whole run, for `--json`.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) config: PipelineArgs,
    pub(super) arena_bytes: u64,
    pub(super) steps: usize,
    /// Bytes of result per frame.
    pub(super) result_bytes: u64,
    /// How the pipeline brought results back, and what it measured to choose.
    pub(super) result_path: Option<ResultPath>,
    /// Frames per second the device itself allows with this cost model, from the formula
    /// (one frame per the busier unit's modelled time, every compute byte from SRAM), 0 for
    /// the zero-cost model.
    pub(super) device_bound_fps: f64,
    /// The same from what the device's counters charged during the run (SRAM misses and
    /// context switches included): the bound the run was up against.
    pub(super) modelled_bound_fps: f64,
    pub(super) paths: Vec<PathReport>,
    pub(super) device: Option<loopback::Counters>,
    /// The pipeline's trace (`--trace`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) trace: Option<userdma_infer::trace::Summary>,
}

/// The modelled device time of one frame in nanoseconds (the cost module's formula: a fixed
/// cost per descriptor, DMA bytes at the DMA rate, compute bytes at the compute rate): on one
/// queue the sum, split across the two units the busier unit's share (the copy engine: the
/// H2D copy, and unless results are read in place a wait and the D2H copy; the compute unit:
/// a wait and the steps).
pub(super) fn device_ns(model: &Model, cost: &Cost, split: bool, in_place: bool) -> f64 {
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

pub(super) fn print_text(r: &Report) {
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
