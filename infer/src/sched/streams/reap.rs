//! Finished frames ([`Streams::run`](super::Streams::run)): taken from their pipelines,
//! counted (latency from arrival, failures, the device's progress and longest frame), kept
//! in the timeline and handed to `postprocess`; a device fault seen there is recovered from.

use std::time::Instant;

use super::recovery::is_device_fault;
use super::{nanos, FrameSpan, Streams};
use crate::pipeline::{Finished, Pipeline};
use crate::sched::StreamId;

impl Streams {
    /// [`Streams::reap`], recovering stream `i`'s device if it failed.
    pub(super) fn reap_or_recover(
        &mut self,
        i: usize,
        start: Instant,
        block: bool,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        match self.reap(i, start, block, postprocess) {
            Err(err) if is_device_fault(&err) => {
                let g = self.states[i].group;
                self.recover(g, err, start, postprocess)
            }
            other => other,
        }
    }

    /// Hands stream `i`'s finished frames to `postprocess` (waiting for one if `block`).
    fn reap(
        &mut self,
        i: usize,
        start: Instant,
        block: bool,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        if self.states[i].dispatched.is_empty() {
            return Ok(());
        }
        self.take_finished(i, start, postprocess, true, |pipeline, each| {
            if block {
                pipeline.wait(each).map(|_| ())
            } else {
                pipeline.poll(each).map(|_| ())
            }
        })
    }

    /// Runs `take` on stream `i`'s pipeline with a callback that records each finished frame
    /// (latency, counts, timeline) and hands it to `postprocess`. `answered`: the frames were
    /// finished by the device by itself (not handed back by a recovery), which ends its run
    /// of faults.
    pub(super) fn take_finished<R>(
        &mut self,
        i: usize,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
        answered: bool,
        take: impl FnOnce(&mut Pipeline, &mut dyn FnMut(Finished<'_>)) -> Result<R, crate::Error>,
    ) -> Result<R, crate::Error> {
        let s = &mut self.states[i];
        let group = &mut self.groups[s.group];
        let dispatched = &mut s.dispatched;
        let latency = &mut s.latency;
        let (frames, failed) = (&mut s.frames, &mut s.failed);
        let timeline = &mut self.timeline;
        let capacity = self.timeline_capacity;
        let host = &mut self.host_ns;
        let device = s.group;
        let trace = self.trace.as_ref().map(|t| {
            let at = t.trace.ns(start);
            (&t.trace, t.devices[device], t.streams[i], at)
        });
        let mut each = |done: Finished<'_>| {
            let (arrival, dispatch) = dispatched.pop_front().unwrap_or((0, 0));
            if let Some((trace, device, stream, at)) = trace {
                trace.record(crate::trace::Event::Waited {
                    device,
                    stream,
                    frame: done.frame,
                    arrived_ns: at + arrival,
                    dispatched_ns: at + dispatch,
                });
            }
            let now = nanos(start.elapsed());
            let _ = latency.record(now.saturating_sub(arrival).max(1));
            *frames += 1;
            let ok = done.result.is_ok();
            if !ok {
                *failed += 1;
            }
            if answered {
                group.streak = 0;
                group.progress = now;
                group.host_at_progress = *host;
                let held = now.saturating_sub(dispatch.max(group.last_done));
                group.longest_frame = group.longest_frame.max(held);
                group.last_done = now;
            }
            if capacity > 0 {
                if timeline.len() == capacity {
                    timeline.pop_front();
                }
                timeline.push_back(FrameSpan {
                    stream: StreamId(i),
                    device,
                    frame: done.frame,
                    arrival_ns: arrival,
                    dispatch_ns: dispatch,
                    done_ns: now,
                    ok,
                });
            }
            let began = Instant::now();
            postprocess(StreamId(i), done);
            *host += nanos(began.elapsed());
        };
        take(&mut s.stream.pipeline, &mut each)
    }
}
