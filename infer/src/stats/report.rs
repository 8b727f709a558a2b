//! The [`Report`]: what a [`Recorder`] saw, summarised, with JSON and Prometheus export.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::{sweep, Counters, Recorder, Stage};

/// The practitioners' rule for data movement: when less than about 15 % of a frame's
/// end-to-end time is spent moving data, further zero-copy work stops paying, and the time
/// is better spent on compute or scheduling.
pub const DATA_MOVEMENT_RULE: f64 = 0.15;

/// Which side of the [15 % rule](DATA_MOVEMENT_RULE) the data-movement share is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// No timeline frame had any end-to-end time.
    NoData,
    /// Data movement is below 15 % of end-to-end time: further zero-copy work stops paying.
    BelowRule,
    /// Data movement is 15 % of end-to-end time or more: cutting copies and DMA still pays.
    AtOrAboveRule,
}

/// Latency summary of one stage or of the whole frame, in nanoseconds.
///
/// Quantiles come from the histogram (within 0.1 %, values past one hour clamped, never above
/// the maximum); `sum_ns`, `mean_ns` and `max_ns` are exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    /// Values recorded.
    pub count: u64,
    /// Their exact sum (saturating).
    pub sum_ns: u64,
    /// `sum_ns / count`, 0 when empty.
    pub mean_ns: f64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest value.
    pub max_ns: u64,
}

impl Latency {
    fn new(h: &Histogram<u64>, sum_ns: u64, max_ns: u64) -> Latency {
        let count = h.len();
        if count == 0 {
            return Latency::default();
        }
        // The histogram answers with the highest value equivalent to the bucket's, which can
        // be a little above the largest value recorded.
        let q = |q: f64| h.value_at_quantile(q).min(max_ns);
        Latency {
            count,
            sum_ns,
            mean_ns: ratio(sum_ns as f64, count as f64),
            p50_ns: q(0.5),
            p90_ns: q(0.9),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            max_ns,
        }
    }

    /// The quantiles as `(quantile, value_ns)`, for exporters.
    #[must_use]
    pub fn quantiles(&self) -> [(f64, u64); 4] {
        [
            (0.5, self.p50_ns),
            (0.9, self.p90_ns),
            (0.99, self.p99_ns),
            (0.999, self.p999_ns),
        ]
    }
}

/// One stage's latency summary, named.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StageLatency {
    /// The stage.
    pub stage: Stage,
    /// Its summary.
    #[serde(flatten)]
    pub latency: Latency,
}

/// The mean time per recorded frame in each kind of work, in nanoseconds; a frame that skipped
/// a stage adds 0 to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Split {
    /// Waiting in device queues ([`Stage::QueueWait`]).
    pub queue_wait_ns: f64,
    /// Moving data ([`Stage::ToDevice`] plus [`Stage::ToHost`]).
    pub dma_ns: f64,
    /// Computing ([`Stage::Compute`]).
    pub compute_ns: f64,
    /// Host work ([`Stage::Preprocess`] plus [`Stage::Postprocess`]).
    pub host_ns: f64,
    /// End-to-end mean less the four above, 0 if they add up to more (stages of one frame
    /// that overlap); the gaps between a frame's stages.
    pub gaps_ns: f64,
}

/// What the timeline (the last frames kept by the recorder) shows about concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Timeline {
    /// Frames in the timeline.
    pub frames: u64,
    /// Time during which some DMA span and some compute span (of any frames) are both active,
    /// divided by the time during which either is active; 0 when neither ever is.
    pub dma_compute_overlap: f64,
    /// Time-weighted mean number of frames in flight (first span start to last span end),
    /// over the window from the first frame's start to the last frame's end.
    pub occupancy_mean: f64,
    /// Most frames in flight at once.
    pub occupancy_max: u64,
    /// Total DMA span time divided by total end-to-end time.
    pub data_movement_share: f64,
    /// Which side of the [15 % rule](DATA_MOVEMENT_RULE) the share is on.
    pub verdict: Verdict,
}

/// The counters divided by the frames recorded (0 when none were).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CountersPerFrame {
    /// Completed frames per recorded frame (1.0 when every completed frame was recorded).
    pub frames: f64,
    /// Bytes to the device per frame.
    pub bytes_to_device: f64,
    /// Bytes to the host per frame.
    pub bytes_to_host: f64,
    /// Allocations per frame.
    pub allocations: f64,
    /// DMA mappings per frame.
    pub dma_maps: f64,
    /// Doorbells per frame.
    pub doorbells: f64,
    /// Interrupts per frame.
    pub interrupts: f64,
    /// Context switches per frame.
    pub context_switches: f64,
    /// Errors per frame.
    pub errors: f64,
}

impl CountersPerFrame {
    fn new(c: &Counters, frames: u64) -> CountersPerFrame {
        let per = |v: u64| ratio(v as f64, frames as f64);
        CountersPerFrame {
            frames: per(c.frames),
            bytes_to_device: per(c.bytes_to_device),
            bytes_to_host: per(c.bytes_to_host),
            allocations: per(c.allocations),
            dma_maps: per(c.dma_maps),
            doorbells: per(c.doorbells),
            interrupts: per(c.interrupts),
            context_switches: per(c.context_switches),
            errors: per(c.errors),
        }
    }
}

/// Everything a [`Recorder`] saw, summarised ([`Recorder::report`]). No field is NaN: every
/// ratio over nothing is 0.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Frames recorded.
    pub frames: u64,
    /// Frames recorded that were not `ok`.
    pub failed_frames: u64,
    /// First span start to last span end over all recorded frames, in nanoseconds.
    pub wall_ns: u64,
    /// `frames` over the wall time in seconds; 0 when the wall time is 0.
    pub frames_per_second: f64,
    /// End-to-end latency (first span start to last span end of each frame).
    pub end_to_end: Latency,
    /// Each stage's latency, in [`Stage::ALL`] order.
    pub stages: Vec<StageLatency>,
    /// The mean time per frame in each kind of work.
    pub split: Split,
    /// Overlap, occupancy and data-movement share over the timeline frames.
    pub timeline: Timeline,
    /// The pipeline's counters.
    pub counters: Counters,
    /// The counters per recorded frame.
    pub counters_per_frame: CountersPerFrame,
}

/// `num / den`, 0 when `den` is 0 (so that no report field is NaN).
fn ratio(num: f64, den: f64) -> f64 {
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

impl Recorder {
    /// Summarises everything recorded so far. Allocates; not for the hot path.
    #[must_use]
    pub fn report(&self) -> Report {
        let frames = self.frames();
        let wall_ns = self.wall().map_or(0, |w| w.duration_ns());
        let end_to_end = Latency::new(
            self.end_to_end_histogram(),
            self.end_to_end_sum_ns(),
            self.end_to_end_max_ns(),
        );
        let stages: Vec<StageLatency> = Stage::ALL
            .iter()
            .map(|&stage| StageLatency {
                stage,
                latency: Latency::new(
                    self.histogram(stage),
                    self.sum_ns(stage),
                    self.max_ns(stage),
                ),
            })
            .collect();
        let per_frame = |stages: &[Stage]| {
            let sum: f64 = stages.iter().map(|&s| self.sum_ns(s) as f64).sum();
            ratio(sum, frames as f64)
        };
        let mut split = Split {
            queue_wait_ns: per_frame(&[Stage::QueueWait]),
            dma_ns: per_frame(&[Stage::ToDevice, Stage::ToHost]),
            compute_ns: per_frame(&[Stage::Compute]),
            host_ns: per_frame(&[Stage::Preprocess, Stage::Postprocess]),
            gaps_ns: 0.0,
        };
        let accounted = split.queue_wait_ns + split.dma_ns + split.compute_ns + split.host_ns;
        split.gaps_ns =
            (ratio(self.end_to_end_sum_ns() as f64, frames as f64) - accounted).max(0.0);
        Report {
            frames,
            failed_frames: self.failed(),
            wall_ns,
            frames_per_second: ratio(frames as f64, wall_ns as f64 / 1e9),
            end_to_end,
            stages,
            split,
            timeline: self.timeline_stats(),
            counters: self.counters,
            counters_per_frame: CountersPerFrame::new(&self.counters, frames),
        }
    }

    fn timeline_stats(&self) -> Timeline {
        let mut dma = Vec::new();
        let mut compute = Vec::new();
        let mut in_flight = Vec::new();
        let (mut dma_total, mut end_to_end_total) = (0u128, 0u128);
        let mut frames = 0;
        for frame in self.timeline() {
            frames += 1;
            dma.extend(
                Stage::ALL
                    .iter()
                    .filter(|s| s.is_dma())
                    .filter_map(|&s| frame.span(s)),
            );
            compute.extend(frame.span(Stage::Compute));
            dma_total += u128::from(frame.dma_ns());
            if let Some(all) = frame.end_to_end() {
                end_to_end_total += u128::from(all.duration_ns());
                in_flight.push(all);
            }
        }
        let (both, either) = sweep::overlap(&dma, &compute);
        let (integral, window, max) = sweep::occupancy(&in_flight);
        let share = ratio(dma_total as f64, end_to_end_total as f64);
        let verdict = if end_to_end_total == 0 {
            Verdict::NoData
        } else if share < DATA_MOVEMENT_RULE {
            Verdict::BelowRule
        } else {
            Verdict::AtOrAboveRule
        };
        Timeline {
            frames,
            dma_compute_overlap: ratio(both as f64, either as f64),
            occupancy_mean: ratio(integral as f64, window as f64),
            occupancy_max: max,
            data_movement_share: share,
            verdict,
        }
    }
}

impl Report {
    /// `stage`'s latency summary.
    #[must_use]
    pub fn stage(&self, stage: Stage) -> &Latency {
        &self.stages[stage.index()].latency
    }

    /// The report as pretty-printed JSON.
    #[must_use]
    pub fn to_json_string(&self) -> String {
        // Serialising plain structs of numbers, strings and no maps cannot fail.
        serde_json::to_string_pretty(self).expect("a report always serialises")
    }

    /// The report in the Prometheus text exposition format 0.0.4.
    ///
    /// Every metric name starts with `prefix` and `_` (no prefix when it is empty); characters
    /// a metric name cannot hold become `_`, and a leading digit gets a `_` before it. Counters
    /// end in `_total`; latencies are summaries in seconds (`quantile` label; stages carry a
    /// `stage` label); fps, overlap, occupancy and the data-movement share are gauges.
    #[must_use]
    pub fn prometheus(&self, prefix: &str) -> String {
        let prefix = sanitise(prefix);
        let name = |n: &str| {
            if prefix.is_empty() {
                n.to_owned()
            } else {
                format!("{prefix}_{n}")
            }
        };
        let mut out = String::new();
        let family = |out: &mut String, n: &str, kind: &str, help: &str| {
            // Writing to a String cannot fail.
            let _ = writeln!(out, "# HELP {} {help}", name(n));
            let _ = writeln!(out, "# TYPE {} {kind}", name(n));
            name(n)
        };

        let n = family(
            &mut out,
            "recorded_frames_total",
            "counter",
            "Frames recorded.",
        );
        let _ = writeln!(out, "{n} {}", self.frames);
        let n = family(
            &mut out,
            "failed_frames_total",
            "counter",
            "Frames recorded that failed.",
        );
        let _ = writeln!(out, "{n} {}", self.failed_frames);
        for (field, value) in self.counters.fields() {
            let help = format!("Pipeline counter {field}.");
            let n = family(&mut out, &format!("{field}_total"), "counter", &help);
            let _ = writeln!(out, "{n} {value}");
        }

        let n = family(
            &mut out,
            "end_to_end_latency_seconds",
            "summary",
            "End-to-end frame latency.",
        );
        summary(&mut out, &n, "", &self.end_to_end);
        let n = family(
            &mut out,
            "stage_latency_seconds",
            "summary",
            "Latency of each pipeline stage.",
        );
        for s in &self.stages {
            summary(
                &mut out,
                &n,
                &format!("stage=\"{}\"", s.stage.name()),
                &s.latency,
            );
        }

        let gauges = [
            (
                "wall_seconds",
                "First span start to last span end.",
                self.wall_ns as f64 / 1e9,
            ),
            (
                "frames_per_second",
                "Frames recorded per second of wall time.",
                self.frames_per_second,
            ),
            (
                "dma_compute_overlap_ratio",
                "Time DMA and compute are both active over time either is, timeline frames.",
                self.timeline.dma_compute_overlap,
            ),
            (
                "occupancy_mean",
                "Time-weighted mean frames in flight, timeline frames.",
                self.timeline.occupancy_mean,
            ),
            (
                "occupancy_max",
                "Most frames in flight at once, timeline frames.",
                self.timeline.occupancy_max as f64,
            ),
            (
                "data_movement_share",
                "DMA span time over end-to-end time, timeline frames.",
                self.timeline.data_movement_share,
            ),
        ];
        for (g, help, value) in gauges {
            let n = family(&mut out, g, "gauge", help);
            let _ = writeln!(out, "{n} {value}");
        }
        out
    }
}

/// One summary's samples: a line per quantile, `_sum` and `_count`, in seconds.
fn summary(out: &mut String, name: &str, labels: &str, l: &Latency) {
    let sep = if labels.is_empty() { "" } else { "," };
    for (q, ns) in l.quantiles() {
        let _ = writeln!(
            out,
            "{name}{{{labels}{sep}quantile=\"{q}\"}} {}",
            ns as f64 / 1e9
        );
    }
    let braces = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(out, "{name}_sum{braces} {}", l.sum_ns as f64 / 1e9);
    let _ = writeln!(out, "{name}_count{braces} {}", l.count);
}

/// `prefix` made a valid metric-name start: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn sanitise(prefix: &str) -> String {
    let mut s: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

#[cfg(test)]
mod tests;
