//! The [`Recorder`]: one histogram per stage and end to end, exact sums, and a preallocated
//! ring of the most recent frames.

use std::time::Instant;

use hdrhistogram::Histogram;

use super::{Counters, Frame, Stage};

/// The lowest value the histograms tell apart, in nanoseconds.
const LOWEST_NS: u64 = 1;
/// The highest value the histograms track, in nanoseconds (one hour); longer values are
/// clamped to it.
const HIGHEST_NS: u64 = 3_600 * 1_000_000_000;
/// Significant decimal digits kept by the histograms (quantiles within 0.1 %).
const SIGFIG: u8 = 3;

fn histogram() -> Histogram<u64> {
    // The bounds are constants that satisfy hdrhistogram's conditions (low >= 1,
    // high >= 2 * low, sigfig <= 5), so creation cannot fail; auto-resize stays off, which
    // is what keeps `record` from allocating.
    Histogram::new_with_bounds(LOWEST_NS, HIGHEST_NS, SIGFIG)
        .expect("constant histogram bounds are valid")
}

/// Collects every frame's stage latencies, the pipeline's counters and the recent timeline.
///
/// Build one with [`Recorder::new`] before the pipeline starts; [`Recorder::record`] then does
/// not allocate. [`Recorder::report`] summarises what was recorded.
#[derive(Debug, Clone)]
pub struct Recorder {
    epoch: Instant,
    /// The pipeline's event counts; the layers add to these fields directly.
    pub counters: Counters,
    stages: [Histogram<u64>; 6],
    end_to_end: Histogram<u64>,
    /// Exact sums of the recorded durations per stage, saturating.
    stage_sums: [u64; 6],
    end_to_end_sum: u64,
    /// Exact maxima of the recorded durations per stage.
    stage_max: [u64; 6],
    end_to_end_max: u64,
    frames: u64,
    failed: u64,
    first_start_ns: u64,
    last_end_ns: u64,
    timeline: Vec<Frame>,
    capacity: usize,
    /// Where the next frame goes once the ring is full (the oldest frame).
    next: usize,
}

/// The most frames a recorder's timeline keeps; a larger capacity is taken as this.
pub(crate) const MAX_TIMELINE: usize = 1 << 20;

impl Recorder {
    /// A recorder whose spans are nanoseconds since `epoch`, keeping the last
    /// `timeline_capacity` frames for the timeline (0 keeps none; at most 1,048,576).
    ///
    /// Allocates everything it will need: seven histograms of about 270 kB each and
    /// `timeline_capacity` frames.
    #[must_use]
    pub fn new(epoch: Instant, timeline_capacity: usize) -> Recorder {
        Recorder {
            epoch,
            counters: Counters::default(),
            stages: std::array::from_fn(|_| histogram()),
            end_to_end: histogram(),
            stage_sums: [0; 6],
            end_to_end_sum: 0,
            stage_max: [0; 6],
            end_to_end_max: 0,
            frames: 0,
            failed: 0,
            first_start_ns: u64::MAX,
            last_end_ns: 0,
            timeline: Vec::with_capacity(timeline_capacity.min(MAX_TIMELINE)),
            capacity: timeline_capacity.min(MAX_TIMELINE),
            next: 0,
        }
    }

    /// The instant that span times count from.
    #[must_use]
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Nanoseconds from the epoch to `at` (see [`nanos_since`](super::nanos_since)).
    #[must_use]
    pub fn nanos(&self, at: Instant) -> u64 {
        super::nanos_since(self.epoch, at)
    }

    /// Adds one frame: each span's duration to its stage's histogram, the frame's end-to-end
    /// latency (first span start to last span end) to the end-to-end histogram, and the frame
    /// to the timeline ring (replacing the oldest once the ring is full).
    ///
    /// A failed frame (`ok == false`) is counted in [`failed`](Recorder::failed) and its spans
    /// are recorded like any other's; a frame with no spans counts as a frame but adds no
    /// latency. Does not allocate.
    pub fn record(&mut self, frame: &Frame) {
        self.frames += 1;
        if !frame.ok {
            self.failed += 1;
        }
        for (i, span) in frame.spans.iter().enumerate() {
            if let Some(span) = span {
                let ns = span.duration_ns();
                self.stages[i].saturating_record(ns);
                self.stage_sums[i] = self.stage_sums[i].saturating_add(ns);
                self.stage_max[i] = self.stage_max[i].max(ns);
            }
        }
        if let Some(all) = frame.end_to_end() {
            let ns = all.duration_ns();
            self.end_to_end.saturating_record(ns);
            self.end_to_end_sum = self.end_to_end_sum.saturating_add(ns);
            self.end_to_end_max = self.end_to_end_max.max(ns);
            self.first_start_ns = self.first_start_ns.min(all.start_ns);
            self.last_end_ns = self.last_end_ns.max(all.end_ns);
        }
        if self.capacity == 0 {
            return;
        }
        if self.timeline.len() < self.capacity {
            // Within the capacity reserved in `new`: no allocation.
            self.timeline.push(*frame);
        } else {
            self.timeline[self.next] = *frame;
            self.next = (self.next + 1) % self.capacity;
        }
    }

    /// Frames recorded so far.
    #[must_use]
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Frames recorded with `ok == false`.
    #[must_use]
    pub fn failed(&self) -> u64 {
        self.failed
    }

    /// The histogram of `stage`'s durations, in nanoseconds.
    #[must_use]
    pub fn histogram(&self, stage: Stage) -> &Histogram<u64> {
        &self.stages[stage.index()]
    }

    /// The histogram of end-to-end latencies, in nanoseconds.
    #[must_use]
    pub fn end_to_end_histogram(&self) -> &Histogram<u64> {
        &self.end_to_end
    }

    /// The exact sum of `stage`'s recorded durations, in nanoseconds (saturating).
    #[must_use]
    pub fn sum_ns(&self, stage: Stage) -> u64 {
        self.stage_sums[stage.index()]
    }

    /// The exact sum of the recorded end-to-end latencies, in nanoseconds (saturating).
    #[must_use]
    pub fn end_to_end_sum_ns(&self) -> u64 {
        self.end_to_end_sum
    }

    /// The exact largest recorded duration of `stage`, in nanoseconds (0 when none).
    #[must_use]
    pub fn max_ns(&self, stage: Stage) -> u64 {
        self.stage_max[stage.index()]
    }

    /// The exact largest recorded end-to-end latency, in nanoseconds (0 when none).
    #[must_use]
    pub fn end_to_end_max_ns(&self) -> u64 {
        self.end_to_end_max
    }

    /// From the first span start to the last span end over all recorded frames, if any frame
    /// had a span.
    #[must_use]
    pub fn wall(&self) -> Option<super::Span> {
        (self.first_start_ns <= self.last_end_ns)
            .then(|| super::Span::new(self.first_start_ns, self.last_end_ns))
    }

    /// How many frames the timeline keeps.
    #[must_use]
    pub fn timeline_capacity(&self) -> usize {
        self.capacity
    }

    /// The frames in the timeline, oldest first.
    pub fn timeline(&self) -> impl Iterator<Item = &Frame> + '_ {
        let (newer, older) = self.timeline.split_at(self.next);
        older.iter().chain(newer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_last_frames_oldest_first() {
        let mut r = Recorder::new(Instant::now(), 3);
        for n in 0..7 {
            let mut f = Frame::new(n, 0);
            f.set(Stage::Compute, n * 10, n * 10 + 5);
            r.record(&f);
        }
        let kept: Vec<u64> = r.timeline().map(|f| f.frame).collect();
        assert_eq!(kept, [4, 5, 6]);
        assert_eq!(r.frames(), 7);
        assert_eq!(r.histogram(Stage::Compute).len(), 7);
        assert_eq!(r.sum_ns(Stage::Compute), 35);
        assert_eq!(r.wall(), Some(super::super::Span::new(0, 65)));

        let mut none = Recorder::new(Instant::now(), 0);
        none.record(&Frame::new(0, 0));
        assert_eq!(none.timeline().count(), 0);
        assert_eq!(none.wall(), None);
    }

    #[test]
    fn values_past_an_hour_are_clamped() {
        let mut r = Recorder::new(Instant::now(), 1);
        let mut f = Frame::new(0, 0);
        f.set(Stage::Compute, 0, u64::MAX);
        r.record(&f);
        let max = r.histogram(Stage::Compute).max();
        assert!(
            (HIGHEST_NS..HIGHEST_NS + HIGHEST_NS / 100).contains(&max),
            "{max}"
        );
        assert_eq!(r.sum_ns(Stage::Compute), u64::MAX);
    }
}
