//! What one path measured (`PathReport`), and the tally its postprocessing keeps: each
//! finished frame's spans recorded, the wrong frames counted.

use std::time::Instant;

use serde::Serialize;
use userdma_infer::pipeline::{Summary, Times};
use userdma_infer::stats::{self, Recorder, Stage};

/// What one path measured.
#[derive(Debug, Clone, Serialize)]
pub(super) struct PathReport {
    pub(super) path: &'static str,
    pub(super) depth: usize,
    pub(super) frames: u64,
    pub(super) wrong: u64,
    pub(super) failed: u64,
    pub(super) seconds: f64,
    pub(super) frames_per_sec: f64,
    /// Latencies per stage and end to end, the time split, the DMA/compute overlap, slot
    /// occupancy and the data-movement share (the stats module's report).
    pub(super) stats: stats::Report,
    pub(super) allocations_per_frame: f64,
    pub(super) dma_maps_per_frame: f64,
    pub(super) doorbells_per_frame: f64,
    /// Per frame, the modelled time of the busier device unit (counted by the device over
    /// the run), in ns: one frame per this is the most the modelled device allows.
    pub(super) modelled_ns_per_frame: f64,
}

/// What the paths' postprocessing keeps: the recorder, the wrong frames.
pub(super) struct Tally {
    recorder: Recorder,
    previous: Option<Instant>,
    wrong: u64,
    first_wrong: Option<u64>,
}

impl Tally {
    pub(super) fn new() -> Tally {
        Tally {
            recorder: Recorder::new(Instant::now(), TIMELINE),
            previous: None,
            wrong: 0,
            first_wrong: None,
        }
    }

    /// The report of a path that ran `run` in `seconds`, with `(allocations, DMA maps)`
    /// counted over it; the recorder; the first wrong frame.
    pub(super) fn finish(
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
    pub(super) fn frame(&mut self, n: u64, right: bool, times: &Times, post: Instant) {
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
