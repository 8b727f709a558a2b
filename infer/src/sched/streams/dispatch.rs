//! Frames to the devices ([`Streams::run`](super::Streams::run)): each device with room gets
//! the frame its scheduler picks, filled by `preprocess` and submitted to its stream's
//! pipeline, with the waits the bounds are checked against and the device's progress
//! counted.

use std::time::Instant;

use super::recovery::is_device_fault;
use super::{nanos, Streams};
use crate::pipeline::Input;
use crate::sched::{Nanos, StreamId};

impl Streams {
    /// Gives each device with room a frame, if its scheduler picks one. Returns whether any
    /// was dispatched.
    pub(super) fn dispatch(
        &mut self,
        now: Nanos,
        start: Instant,
        preprocess: &mut impl FnMut(StreamId, u64, &Input<'_>) -> Result<(), crate::Error>,
    ) -> Result<bool, crate::Error> {
        let mut any = false;
        let clock = Instant::now();
        for g in 0..self.groups.len() {
            if !self.groups[g].takes_frames(clock) || self.busy(g) >= self.in_flight {
                continue;
            }
            let idle = self.busy(g) == 0;
            let group = &mut self.groups[g];
            for (o, &i) in group.oldest.iter_mut().zip(&group.members) {
                *o = self.states[i].queue.oldest();
            }
            let Some(d) = group.scheduler.decide(now, &group.oldest) else {
                continue;
            };
            let i = group.members[d.stream.0];
            if let Some(t) = &self.trace {
                t.trace.record(crate::trace::Event::Decision {
                    device: t.devices[g],
                    stream: t.streams[i],
                    at_ns: t.trace.ns(clock),
                    forced: d.forced,
                    switch: d.switch,
                });
            }
            // The device's progress, if it was idle: from here (an earlier device's
            // `preprocess` in this pass is behind), with this frame's `preprocess` away.
            let (at, host_before) = (nanos(start.elapsed()), self.host_ns);
            let host = &mut self.host_ns;
            let s = &mut self.states[i];
            let arrival = s.queue.take().unwrap_or(now);
            let submitted = match s.stream.pipeline.try_submit(|n, input| {
                let began = Instant::now();
                let filled = preprocess(StreamId(i), n, input);
                *host += nanos(began.elapsed());
                filled
            }) {
                Err(err) if is_device_fault(&err) => {
                    s.queue.put_back(arrival);
                    self.pending_fault = Some((g, err));
                    return Ok(any);
                }
                other => other?,
            };
            if submitted.is_some() {
                if let Err(err) = s.stream.pipeline.flush() {
                    if !is_device_fault(&err) {
                        return Err(err);
                    }
                    // The frame went into the queue: it is in flight (and lost with the rest).
                    s.dispatched.push_back((arrival, now));
                    self.pending_fault = Some((g, err));
                    return Ok(true);
                }
                s.max_wait = s.max_wait.max(now.saturating_sub(arrival));
                // As the bounds count it: from when it became its stream's oldest waiting
                // frame (its arrival, or its stream's previous dispatch if that is later).
                let head = arrival.max(s.last_dispatch);
                s.max_head_wait = s.max_head_wait.max(now.saturating_sub(head));
                s.last_dispatch = now;
                // The device's previous frame held it until this one could go, if this one was
                // waiting when that one finished: from that dispatch to this one, its
                // postprocess and the loop's own turn included, as this frame's wait saw it.
                let group = &mut self.groups[g];
                if let Some(prev) = group.last_dispatch {
                    if head <= group.last_done && group.last_done >= prev {
                        group.longest_frame = group.longest_frame.max(now.saturating_sub(prev));
                    }
                }
                group.last_dispatch = Some(now);
                s.dispatched.push_back((arrival, now));
                if idle {
                    self.groups[g].progress = at;
                    self.groups[g].host_at_progress = host_before;
                }
                any = true;
            } else {
                // Its pipeline is full (depth below in_flight): the frame waits again.
                s.queue.put_back(arrival);
            }
        }
        Ok(any)
    }
}
