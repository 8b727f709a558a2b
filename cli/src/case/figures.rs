//! What a run of the case reports: each stream's figures and the run's, the targets, the
//! whole report with the case's published figures, and what the devices counted in a run.

use std::path::PathBuf;

use serde::Serialize;
use userdma::Runtime;
use userdma_infer::sched::streams::FrameSpan;
use userdma_infer::sched::Policy;
use userdma_loopback::{LoopbackRuntime, Unit};

use super::mix::Mix;
use super::{CaseArgs, StreamArg};
use crate::pipeline::Error;

/// One stream's figures in one run.
#[derive(Debug, Clone, Serialize)]
pub(super) struct StreamFigures {
    pub(super) name: String,
    pub(super) device: usize,
    /// Its device's NUMA node, where its memory is.
    pub(super) numa_node: Option<u32>,
    pub(super) priority: u8,
    /// Its arrival rate; `None`: as fast as the device allows.
    pub(super) target_fps: Option<u32>,
    /// Frames that arrived in the run; every one is accounted for below:
    /// `arrived = frames + failed + lost + dropped + left_waiting`.
    pub(super) arrived: u64,
    /// Frames finished (checked against the host's result).
    pub(super) frames: u64,
    /// Frames the device completed with an error.
    pub(super) failed: u64,
    /// Frames in flight when a device fault was recovered.
    pub(super) lost: u64,
    /// Frames that arrived while 256 of the stream's were waiting (never run).
    pub(super) dropped: u64,
    /// Frames that had arrived but still waited when the run ended.
    pub(super) left_waiting: u64,
    pub(super) fps: f64,
    pub(super) latency_mean_ms: f64,
    pub(super) latency_p99_ms: f64,
    pub(super) longest_wait_ms: f64,
    /// The longest wait as the stated bound counts it: from when the frame became its
    /// stream's oldest waiting frame (its arrival, or its stream's previous dispatch if
    /// later); `longest_wait_ms` counts from arrival, which grows without bound for a stream
    /// whose frames arrive faster than it is served.
    pub(super) longest_head_wait_ms: f64,
    /// The longest any of its frames may wait for dispatch, as the run's scheduler states it
    /// (`Scheduler::wait_bound`, with each frame's service `frame_service_ms`); `None` where the policy states none (strict priority below a
    /// stream with no maximum wait) or the run's frames were not scheduled on a device
    /// ("before" runs them synchronously on the host).
    pub(super) stated_wait_bound_ms: Option<f64>,
    /// The bound at the model's pace (`modelled_frame_ms` a frame): where it is stated but
    /// `stated_wait_bound_ms` is not, the device was too slow for any bound to exist.
    pub(super) bound_at_model_ms: Option<f64>,
    /// The service time per frame the bound takes for its device: the longer of the worst
    /// its model can take (`Model::worst_frame_ns`, `modelled_frame_ms`) and the longest a
    /// frame held the device in this run (`DeviceReport::longest_frame_ns`: a device or host
    /// slower than the model shows here); `None` for a run no scheduler dispatches.
    pub(super) frame_service_ms: Option<f64>,
    /// The worst one frame can take on its device under the cost model.
    pub(super) modelled_frame_ms: Option<f64>,
    /// Its maximum wait W in this run.
    pub(super) max_wait_ms: Option<u64>,
    pub(super) sram_hit_rate: Option<f64>,
}

impl StreamFigures {
    /// Whether every frame that arrived is accounted for.
    pub(super) fn accounted(&self) -> bool {
        self.arrived == self.frames + self.failed + self.lost + self.dropped + self.left_waiting
    }
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub(super) struct RunFigures {
    pub(super) name: &'static str,
    pub(super) policy: Policy,
    pub(super) seconds: f64,
    pub(super) streams: Vec<StreamFigures>,
    pub(super) total_fps: f64,
    pub(super) allocations_per_sec: f64,
    pub(super) dma_maps_per_sec: f64,
    pub(super) switches_per_sec: f64,
    pub(super) device_switches: u64,
    pub(super) scheduler_switches: u64,
    /// Total frames/s the devices allow from what they charged in this run.
    pub(super) device_bound_fps: f64,
    pub(super) wrong: u64,
    /// The run's trace (`--trace`), written where it was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) trace: Option<userdma_infer::trace::Summary>,
}

/// A run's figures and what its plots need.
pub(super) struct Run {
    pub(super) figures: RunFigures,
    pub(super) latency: Vec<hdrhistogram::Histogram<u64>>,
    pub(super) timeline: Vec<FrameSpan>,
}

/// One of the case's targets, for one run.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Target {
    pub(super) target: String,
    pub(super) run: &'static str,
    pub(super) measured: String,
    pub(super) met: bool,
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) config: CaseArgs,
    pub(super) streams: Vec<StreamArg>,
    pub(super) model_arena_bytes: u64,
    pub(super) before: RunFigures,
    pub(super) after: RunFigures,
    /// "after" under strict priority (the lower streams' maximum wait kept).
    pub(super) strict: RunFigures,
    pub(super) targets: Vec<Target>,
    /// The plots written (`--svg`).
    pub(super) svg: Vec<PathBuf>,
    /// The case's published figures (not measured here).
    pub(super) published: Published,
    /// "after" with each stream a process through the device owner (none with
    /// `--no-owner` or several devices).
    pub(super) through_owner: Option<super::owner::OwnerRun>,
}

#[derive(Debug, Serialize)]
pub(super) struct Published {
    pub(super) fps_before: f64,
    pub(super) fps_after: f64,
    pub(super) latency_mean_ms_before: f64,
    pub(super) latency_mean_ms_after: f64,
    pub(super) allocations_per_sec_before: f64,
    pub(super) allocations_per_sec_after: f64,
    pub(super) switches_per_sec_before: f64,
    pub(super) switches_per_sec_after: f64,
}

pub(super) const PUBLISHED: Published = Published {
    fps_before: 12.0,
    fps_after: 27.0,
    latency_mean_ms_before: 83.0,
    latency_mean_ms_after: 37.0,
    allocations_per_sec_before: 200.0,
    allocations_per_sec_after: 0.0,
    switches_per_sec_before: 50.0,
    switches_per_sec_after: 12.0,
};

/// What the devices counted in a run: context switches of `unit` summed over devices, the
/// bound on total frames/s from each device's busiest unit's modelled time and the frames it
/// ran, and per stream the SRAM hit rate of its queue `queue + offset`.
pub(super) fn device_figures(
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
