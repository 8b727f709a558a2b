//! Pipeline statistics: counters, per-stage latency histograms, the timeline of recent frames,
//! and what they say about where a frame's time goes.
//!
//! Every layer of an inference pipeline reports into one [`Recorder`]. A frame passes through
//! six [`Stage`]s — preprocessing on the host, waiting in a device queue, the DMA to the device,
//! the device's compute, the DMA back, postprocessing — and the pipeline fills one [`Frame`]
//! per frame with a [`Span`] (start and end in nanoseconds since the recorder's epoch) for
//! each stage it went through, then hands it to [`Recorder::record`]. The layers add their
//! event counts (bytes moved, allocations, DMA maps, doorbells, interrupts, …) to the
//! recorder's [`Counters`] directly.
//!
//! What is measured, and how:
//!
//! - **Latency per stage and end to end**: one `hdrhistogram` histogram per stage and one for
//!   the end-to-end latency (first span start to last span end of the frame), in nanoseconds,
//!   3 significant digits, from 1 ns to 1 hour; longer values are clamped to the top. Sums are
//!   kept exactly beside the histograms, so means and Prometheus `_sum`s are exact; quantiles
//!   are within 0.1 %. [`Recorder::record`] does not allocate (the histograms have fixed
//!   bounds and the timeline is a preallocated ring), so it can sit on the hot path.
//! - **Split**: the mean time per frame spent waiting in queues, moving data (to device plus
//!   to host), computing, and in pre- and postprocessing ([`Split`]).
//! - **Timeline** (the last `timeline_capacity` frames): the DMA/compute overlap ratio (how
//!   much of the time during which data moves or the device computes has both happening,
//!   found with an exact interval sweep), the slot occupancy (time-weighted mean and maximum
//!   number of frames in flight), and the data-movement share (DMA span time over end-to-end
//!   time) with its [`Verdict`] against the [15 % rule](DATA_MOVEMENT_RULE).
//!
//! [`Recorder::report`] turns all of it into a [`Report`], which exports as JSON
//! ([`Report::to_json_string`]) or the Prometheus text format ([`Report::prometheus`]); the
//! [`svg`] module draws the latency CDF and the timeline. Pure logic: no unsafe, and no I/O
//! except the SVG files the caller names.
//!
//! ```
//! use std::time::Instant;
//! use userdma_infer::stats::{Frame, Recorder, Stage};
//!
//! let mut recorder = Recorder::new(Instant::now(), 1024);
//! let mut frame = Frame::new(0, 0);
//! frame.set(Stage::ToDevice, 0, 10_000);
//! frame.set(Stage::Compute, 10_000, 50_000);
//! frame.set(Stage::ToHost, 50_000, 60_000);
//! recorder.record(&frame);
//! recorder.counters.frames += 1;
//!
//! let report = recorder.report();
//! assert_eq!(report.end_to_end.max_ns, 60_000);
//! assert!((report.timeline.data_movement_share - 20_000.0 / 60_000.0).abs() < 1e-12);
//! ```
//!
//! | module | owns |
//! |---|---|
//! | this file | [`Counters`], [`Stage`], [`Span`], [`Frame`] |
//! | `recorder` | [`Recorder`]: histograms, exact sums, the timeline ring |
//! | `report` | [`Report`], [`Latency`], [`Split`], [`Timeline`], [`Verdict`]; JSON and Prometheus export |
//! | `sweep` | the interval sweeps behind overlap and occupancy |
//! | [`svg`] | the latency CDF and timeline plots |
//! | `error` | [`Error`]: which plot could not be drawn or written, and where |

mod alloc;
mod error;
mod recorder;
mod report;
pub mod svg;
mod sweep;

use std::time::Instant;

pub use alloc::{allocations, thread_allocations, CountingAllocator};
pub use error::Error;
pub use recorder::Recorder;
pub use report::{
    CountersPerFrame, Latency, Report, Split, StageLatency, Timeline, Verdict, DATA_MOVEMENT_RULE,
};

/// Event counts that the pipeline's layers add to ([`Recorder::counters`]).
///
/// Plain counters: each layer adds to its own fields (`counters.doorbells += 1`). Two
/// snapshots give the counts in between with [`Counters::delta`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Frames the pipeline completed.
    pub frames: u64,
    /// Bytes moved from host memory to the device.
    pub bytes_to_device: u64,
    /// Bytes moved from the device to host memory.
    pub bytes_to_host: u64,
    /// Buffer allocations.
    pub allocations: u64,
    /// DMA mappings made.
    pub dma_maps: u64,
    /// Doorbell writes.
    pub doorbells: u64,
    /// Interrupts taken.
    pub interrupts: u64,
    /// Context switches (voluntary and involuntary) of the pipeline's threads.
    pub context_switches: u64,
    /// Errors of any layer.
    pub errors: u64,
}

impl Counters {
    /// The counts since `earlier`, field by field; a field that went down (a reset) gives 0.
    #[must_use]
    pub fn delta(&self, earlier: &Counters) -> Counters {
        Counters {
            frames: self.frames.saturating_sub(earlier.frames),
            bytes_to_device: self.bytes_to_device.saturating_sub(earlier.bytes_to_device),
            bytes_to_host: self.bytes_to_host.saturating_sub(earlier.bytes_to_host),
            allocations: self.allocations.saturating_sub(earlier.allocations),
            dma_maps: self.dma_maps.saturating_sub(earlier.dma_maps),
            doorbells: self.doorbells.saturating_sub(earlier.doorbells),
            interrupts: self.interrupts.saturating_sub(earlier.interrupts),
            context_switches: self
                .context_switches
                .saturating_sub(earlier.context_switches),
            errors: self.errors.saturating_sub(earlier.errors),
        }
    }

    /// Each field with its name, in declaration order (for exporters).
    #[must_use]
    pub fn fields(&self) -> [(&'static str, u64); 9] {
        [
            ("frames", self.frames),
            ("bytes_to_device", self.bytes_to_device),
            ("bytes_to_host", self.bytes_to_host),
            ("allocations", self.allocations),
            ("dma_maps", self.dma_maps),
            ("doorbells", self.doorbells),
            ("interrupts", self.interrupts),
            ("context_switches", self.context_switches),
            ("errors", self.errors),
        ]
    }
}

/// A stage of a frame's trip through the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Host work before the device sees the frame (decode, resize, quantise).
    Preprocess,
    /// Time the frame's work sat in a device queue before the device started it.
    QueueWait,
    /// DMA of the inputs from host memory to the device.
    ToDevice,
    /// The device computing.
    Compute,
    /// DMA of the outputs from the device to host memory.
    ToHost,
    /// Host work after the device is done (decode outputs, NMS, …).
    Postprocess,
}

impl Stage {
    /// Every stage, in pipeline order; `Stage::ALL[s.index()] == s`.
    pub const ALL: [Stage; 6] = [
        Stage::Preprocess,
        Stage::QueueWait,
        Stage::ToDevice,
        Stage::Compute,
        Stage::ToHost,
        Stage::Postprocess,
    ];

    /// The stage's name in exports: `"preprocess"`, `"queue_wait"`, `"to_device"`,
    /// `"compute"`, `"to_host"`, `"postprocess"`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Preprocess => "preprocess",
            Stage::QueueWait => "queue_wait",
            Stage::ToDevice => "to_device",
            Stage::Compute => "compute",
            Stage::ToHost => "to_host",
            Stage::Postprocess => "postprocess",
        }
    }

    /// The stage's position in [`Stage::ALL`] and in [`Frame::spans`].
    #[must_use]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Whether the stage moves data between host and device (to device, to host).
    #[must_use]
    pub const fn is_dma(self) -> bool {
        matches!(self, Stage::ToDevice | Stage::ToHost)
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A half-open time interval `[start_ns, end_ns)` in nanoseconds since the recorder's epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    /// When the stage started.
    pub start_ns: u64,
    /// When the stage ended; never before `start_ns` when built through [`Span::new`].
    pub end_ns: u64,
}

impl Span {
    /// The span from `start_ns` to `end_ns`; an end before the start gives an empty span at
    /// `start_ns` (clocks read on different threads can disagree by a little).
    #[must_use]
    pub const fn new(start_ns: u64, end_ns: u64) -> Span {
        let end_ns = if end_ns < start_ns { start_ns } else { end_ns };
        Span { start_ns, end_ns }
    }

    /// The span's length in nanoseconds.
    #[must_use]
    pub const fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// Nanoseconds from `epoch` to `at`; 0 for an instant before the epoch, `u64::MAX` past
/// 584 years.
#[must_use]
pub fn nanos_since(epoch: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

/// One frame's record: which frame, which stream, and the span of every stage it went through.
///
/// Times are nanoseconds since the recorder's epoch ([`Recorder::epoch`]): set them directly
/// with [`Frame::set`], or from [`Instant`]s with [`Frame::set_instants`]. A stage the frame
/// skipped stays `None` and counts for nothing in that stage's histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// The frame's number.
    pub frame: u64,
    /// The stream (camera, request source) the frame belongs to.
    pub stream: u32,
    /// The span of each stage, indexed by [`Stage::index`].
    pub spans: [Option<Span>; 6],
    /// Whether the frame completed without error.
    pub ok: bool,
}

impl Frame {
    /// A frame with no spans yet, `ok`.
    #[must_use]
    pub const fn new(frame: u64, stream: u32) -> Frame {
        Frame {
            frame,
            stream,
            spans: [None; 6],
            ok: true,
        }
    }

    /// Sets `stage`'s span from nanoseconds since the recorder's epoch (see [`Span::new`] for
    /// an end before the start).
    pub fn set(&mut self, stage: Stage, start_ns: u64, end_ns: u64) -> &mut Frame {
        self.spans[stage.index()] = Some(Span::new(start_ns, end_ns));
        self
    }

    /// Sets `stage`'s span from two instants, measured from `epoch` (the recorder's
    /// [`Recorder::epoch`]) with [`nanos_since`].
    pub fn set_instants(
        &mut self,
        stage: Stage,
        epoch: Instant,
        start: Instant,
        end: Instant,
    ) -> &mut Frame {
        self.set(stage, nanos_since(epoch, start), nanos_since(epoch, end))
    }

    /// `stage`'s span, if the frame went through it.
    #[must_use]
    pub const fn span(&self, stage: Stage) -> Option<Span> {
        self.spans[stage.index()]
    }

    /// From the earliest span start to the latest span end: the time the frame was in flight;
    /// `None` for a frame with no spans.
    #[must_use]
    pub fn end_to_end(&self) -> Option<Span> {
        let mut spans = self.spans.iter().flatten();
        let first = *spans.next()?;
        Some(spans.fold(first, |all, s| Span {
            start_ns: all.start_ns.min(s.start_ns),
            end_ns: all.end_ns.max(s.end_ns),
        }))
    }

    /// Total time of the frame's DMA spans (to device plus to host), in nanoseconds.
    #[must_use]
    pub fn dma_ns(&self) -> u64 {
        Stage::ALL
            .iter()
            .filter(|s| s.is_dma())
            .filter_map(|&s| self.span(s))
            .map(|s| s.duration_ns())
            .fold(0, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stage_names_and_indices() {
        let names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            [
                "preprocess",
                "queue_wait",
                "to_device",
                "compute",
                "to_host",
                "postprocess"
            ]
        );
        for (i, s) in Stage::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
        let dma: Vec<Stage> = Stage::ALL.into_iter().filter(|s| s.is_dma()).collect();
        assert_eq!(dma, [Stage::ToDevice, Stage::ToHost]);
        assert_eq!(
            serde_json::to_string(&Stage::QueueWait).unwrap(),
            "\"queue_wait\""
        );
    }

    #[test]
    fn delta_saturates() {
        let earlier = Counters {
            frames: 10,
            doorbells: 5,
            errors: 3,
            ..Counters::default()
        };
        let now = Counters {
            frames: 15,
            doorbells: 9,
            errors: 1,
            dma_maps: 2,
            ..earlier
        };
        let d = now.delta(&earlier);
        assert_eq!(
            d,
            Counters {
                frames: 5,
                doorbells: 4,
                errors: 0,
                dma_maps: 2,
                ..Counters::default()
            }
        );
    }

    #[test]
    fn frame_end_to_end_with_missing_stages() {
        let mut f = Frame::new(7, 2);
        assert_eq!(f.end_to_end(), None);
        assert_eq!(f.dma_ns(), 0);
        f.set(Stage::Compute, 100, 300).set(Stage::ToHost, 300, 350);
        f.set(Stage::Preprocess, 20, 40);
        assert_eq!(
            f.end_to_end(),
            Some(Span {
                start_ns: 20,
                end_ns: 350
            })
        );
        assert_eq!(f.dma_ns(), 50);
        assert_eq!(f.span(Stage::QueueWait), None);
    }

    #[test]
    fn backwards_span_is_empty_and_instants_convert() {
        assert_eq!(
            Span::new(50, 40),
            Span {
                start_ns: 50,
                end_ns: 50
            }
        );
        let epoch = Instant::now();
        let mut f = Frame::new(0, 0);
        f.set_instants(
            Stage::Compute,
            epoch,
            epoch + Duration::from_micros(3),
            epoch + Duration::from_micros(5),
        );
        assert_eq!(
            f.span(Stage::Compute),
            Some(Span {
                start_ns: 3_000,
                end_ns: 5_000
            })
        );
        // An instant before the epoch counts as the epoch.
        let later = epoch + Duration::from_millis(1);
        assert_eq!(nanos_since(later, epoch), 0);
    }
}
