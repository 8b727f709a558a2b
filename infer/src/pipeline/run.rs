//! The frame loop: a frame's descriptors queued from a free slot
//! ([`Pipeline::try_submit`]) and announced ([`Pipeline::flush`]), its completions counted
//! until it is finished, and finished frames handed to postprocessing in frame order
//! ([`Pipeline::poll`], [`Pipeline::wait`]); [`Pipeline::run`] and [`Pipeline::shutdown`]
//! on top.

use std::time::Instant;

use super::descriptor::{op_at, op_of, step_name, tag, untag, Next, WAIT_STEP};
use super::frame::Source;
use super::{Finished, FrameError, Input, Output, Pipeline, Summary, COMPUTE, D2H, H2D};
use crate::accel::{Completion, HostSpan, Op};

impl Pipeline {
    /// Pushes `op` with `tag` to queue `q`. The ring holds every slot's ops, and a slot of
    /// the ring is free once the completion that frees it was taken, so a refusal here is an
    /// error, never a moment to wait out.
    #[inline]
    fn push_to(&mut self, q: usize, op: Op, tag: u64) -> Result<(), crate::Error> {
        self.queues[q].push(op, tag)?;
        self.pushed[q] += 1;
        Ok(())
    }

    /// A wait on queue `on` until every op pushed to it so far has completed.
    fn wait_for(&self, on: usize) -> Op {
        Op::After {
            queue: self.queues[on].id(),
            count: self.pushed[on],
        }
    }

    /// Takes a free slot, lets `preprocess` write frame `n`'s input into it, and queues the
    /// frame's descriptors (announced once `batch` frames are queued, or by
    /// [`Pipeline::flush`]). Returns the frame number, or `None` when every slot is in flight
    /// (back-pressure: reap results first).
    ///
    /// # Errors
    /// What `preprocess` returns, and ring errors (the queue broke).
    pub fn try_submit(
        &mut self,
        preprocess: impl FnOnce(u64, &Input<'_>) -> Result<(), crate::Error>,
    ) -> Result<Option<u64>, crate::Error> {
        self.submit(None, preprocess)
    }

    /// Queues a frame whose input is read from `input` and whose result is written to
    /// `result`, the caller's host memory mapped into the device's DMA space, rather than the
    /// slot's buffers: no copy into the pipeline (a device owner runs its clients' buffers
    /// this way). Returns the frame number, or `None` when every slot is in flight. The
    /// finished frame's [`Output`] says the result is in the caller's memory
    /// ([`Output::in_caller_memory`]); results read in place
    /// ([`Results::InPlace`](super::Results::InPlace)) are copied to `result` all the same.
    ///
    /// # Errors
    /// [`Error::ShortSpan`](super::Error::ShortSpan) for a span shorter than the model's input
    /// or result; as [`Pipeline::try_submit`].
    ///
    /// # Safety
    /// Both spans must be mapped into this pipeline's device's DMA space at their IOVAs and
    /// reachable by the host at their pointers, for their lengths, until the frame is handed
    /// to postprocessing or taken back by a recovery ([`Pipeline::recover`],
    /// [`Pipeline::reclaim`]), or the pipeline is dropped: the device and host steps read and
    /// write them meanwhile.
    ///
    /// [`Pipeline::recover`]: super::Pipeline::recover
    /// [`Pipeline::reclaim`]: super::Pipeline::reclaim
    pub unsafe fn try_submit_spans(
        &mut self,
        input: HostSpan,
        result: HostSpan,
    ) -> Result<Option<u64>, crate::Error> {
        let (i, r) = (self.model.input().bytes, self.model.result().bytes);
        for (what, span, needed) in [("input", input, i), ("result", result, r)] {
            if span.len < needed {
                return Err(super::Error::ShortSpan {
                    what,
                    len: span.len,
                    needed,
                }
                .into());
            }
        }
        self.submit(Some((input, result)), |_, _| Ok(()))
    }

    /// [`Pipeline::try_submit`], with the frame's input and result in the slot's buffers
    /// (`spans` `None`) or in the caller's.
    fn submit(
        &mut self,
        spans: Option<(HostSpan, HostSpan)>,
        preprocess: impl FnOnce(u64, &Input<'_>) -> Result<(), crate::Error>,
    ) -> Result<Option<u64>, crate::Error> {
        if self.queues.is_empty() {
            return Err(self.removed());
        }
        let Some(&index) = self.free.front() else {
            return Ok(None);
        };
        let frame = self.next_frame;
        let began = Instant::now();
        if spans.is_none() {
            preprocess(
                frame,
                &Input {
                    buffer: &self.slots[index].input,
                },
            )?;
        }
        self.free.pop_front();
        self.busy[index] = true;
        let steps = self.model.steps().len();
        let split = self.config.split;
        // A result in the caller's memory is always copied there.
        let in_place = self.path.in_place && spans.is_none();
        // The frame's ops in order, as (queue, op k or a wait on a queue): H2D; with `split` a
        // wait on H2D ahead of the steps; the steps; unless results are read in place, with
        // `split` a wait on the steps, and the D2H copy. The last one is tagged last.
        let (h2d, compute, d2h) = if split {
            (H2D, COMPUTE, D2H)
        } else {
            (0, 0, 0)
        };
        let mut plan = [(0usize, Next::Step(0)); 5];
        let mut n = 0;
        let mut add = |q: usize, next: Next| {
            plan[n] = (q, next);
            n += 1;
        };
        add(h2d, Next::Step(0));
        if split {
            add(compute, Next::WaitOn(H2D));
        }
        add(compute, Next::Steps);
        if !in_place {
            if split {
                add(d2h, Next::WaitOn(COMPUTE));
            }
            add(d2h, Next::Step(steps + 1));
        }
        let total = plan[..n]
            .iter()
            .map(|&(_, next)| if next == Next::Steps { steps } else { 1 })
            .sum::<usize>();
        let p = &mut self.progress[index];
        p.frame = frame;
        p.error = None;
        p.times.preprocess = began;
        p.outstanding = total as u32;
        p.spans = spans;
        let mut left = total;
        for &(q, next) in &plan[..n] {
            let (first, count) = match next {
                Next::Step(k) => (k, 1),
                Next::Steps => (1, steps),
                Next::WaitOn(_) => (0, 1),
            };
            for k in first..first + count {
                left -= 1;
                let (op, step) = match next {
                    Next::WaitOn(on) => (self.wait_for(on), WAIT_STEP),
                    _ => {
                        let op = match spans {
                            None => op_of(&self.model, &self.slots[index], k),
                            Some((input, result)) => {
                                op_at(&self.model, self.slots[index].arena, input, result, k)
                            }
                        };
                        (op, k as u16)
                    }
                };
                if let Err(err) = self.push_to(q, op, tag(index, step, left == 0)) {
                    if left + 1 == total {
                        // Nothing of the frame reached a queue: the slot is free again.
                        self.busy[index] = false;
                        self.free.push_front(index);
                    } else {
                        // Part of the frame is queued and may run: it stays in flight, and
                        // the recovery the error calls for ([`Pipeline::recover`]) takes its
                        // slot back once the device is stopped, reporting it lost.
                        self.next_frame += 1;
                        self.in_flight += 1;
                    }
                    return Err(err);
                }
            }
        }
        self.summary.bytes_to_device += self.model.input().bytes;
        self.summary.host_steps += self.host_steps;
        self.next_frame += 1;
        self.in_flight += 1;
        self.unannounced += 1;
        self.pending.push(index);
        if self.unannounced >= self.config.batch {
            self.flush()?;
        }
        Ok(Some(frame))
    }

    /// Announces every queued frame: one doorbell per queue.
    ///
    /// # Errors
    /// Ring errors.
    pub fn flush(&mut self) -> Result<(), crate::Error> {
        if self.unannounced == 0 {
            return Ok(());
        }
        // Read before the doorbells: the device may start (and finish) the ops at once.
        let now = Instant::now();
        for q in &mut self.queues {
            q.flush()?;
        }
        for &index in &self.pending {
            self.progress[index].times.submitted = now;
        }
        self.pending.clear();
        self.unannounced = 0;
        self.summary.doorbells += self.queues.len() as u64;
        Ok(())
    }

    /// Handles one completion. A frame is finished once all its completions were seen; it is
    /// handed to `postprocess` in frame order. Returns how many frames were handed over.
    pub(super) fn complete(
        &mut self,
        done: Completion,
        postprocess: &mut impl FnMut(Finished<'_>),
    ) -> usize {
        let now = Instant::now();
        let steps = self.model.steps().len();
        let (index, step, last) = untag(done.tag);
        if index >= self.progress.len() || !self.busy[index] {
            // Not a tag of a frame in flight: an engine that broke its contract. Nothing of
            // a frame is touched; the frame the completion should have been is reported
            // overdue in time.
            return 0;
        }
        let p = &mut self.progress[index];
        if done.status != 0 && p.error.is_none() {
            p.error = Some(FrameError {
                frame: p.frame,
                queue: done.queue,
                command: done.command,
                step,
                what: step_name(step, steps),
                code: done.status,
                status: self.device.status_name(done.status),
                result: done.result,
            });
        }
        match usize::from(step) {
            0 => {
                p.times.to_device = now;
                if steps == 0 {
                    p.times.computed = now;
                }
            }
            s if s == steps && step != WAIT_STEP => p.times.computed = now,
            _ => {}
        }
        if let Some(t) = &self.trace {
            let op = match usize::from(step) {
                _ if step == WAIT_STEP => crate::trace::OpStep::Wait,
                0 => crate::trace::OpStep::ToDevice,
                s if s <= steps => crate::trace::OpStep::Step(step),
                _ => crate::trace::OpStep::ToHost,
            };
            t.trace
                .record(crate::trace::Event::Op(crate::trace::OpSeen {
                    device: t.device,
                    stream: t.stream,
                    frame: p.frame,
                    queue: done.queue,
                    command: done.command,
                    step: op,
                    status: done.status,
                    announced_ns: t.trace.ns(p.times.submitted),
                    done_ns: t.trace.ns(now),
                }));
        }
        p.outstanding = p.outstanding.saturating_sub(1);
        if last {
            if self.path.in_place && p.spans.is_none() {
                p.times.computed = now;
            }
            p.times.to_host = now;
            self.held[index] = true;
        }
        self.deliver(postprocess)
    }

    /// Hands every finished frame, from the next in order, to `postprocess`.
    fn deliver(&mut self, postprocess: &mut impl FnMut(Finished<'_>)) -> usize {
        let mut delivered = 0;
        loop {
            let next = self.next_out;
            let Some(index) = (0..self.held.len()).find(|&i| {
                self.held[i] && self.progress[i].frame == next && self.progress[i].outstanding == 0
            }) else {
                return delivered;
            };
            self.held[index] = false;
            let slot = &self.slots[index];
            let progress = self.progress[index];
            self.in_flight -= 1;
            self.next_out += 1;
            self.summary.frames += 1;
            let result = match progress.error {
                Some(e) => {
                    self.summary.failed += 1;
                    Err(e)
                }
                None => {
                    let r = self.model.result();
                    self.summary.bytes_to_host += r.bytes;
                    let source = if let Some((_, result)) = progress.spans {
                        Source::Caller {
                            frame: progress.frame,
                            len: result.len as usize,
                        }
                    } else if self.path.in_place {
                        Source::Device {
                            device: self.device.as_ref(),
                            at: slot.arena + r.offset,
                            len: r.bytes as usize,
                        }
                    } else {
                        Source::Host(&slot.result)
                    };
                    Ok(Output { source })
                }
            };
            if let Some(t) = &self.trace {
                t.trace.record(crate::trace::Event::Frame {
                    device: t.device,
                    stream: t.stream,
                    frame: progress.frame,
                    preprocess_ns: t.trace.ns(progress.times.preprocess),
                    submitted_ns: t.trace.ns(progress.times.submitted),
                    done_ns: t.trace.ns(progress.times.to_host),
                    ok: result.is_ok(),
                });
                t.trace.tick();
            }
            postprocess(Finished {
                frame: progress.frame,
                result,
                times: progress.times,
            });
            self.busy[index] = false;
            self.free.push_back(index);
            delivered += 1;
            if self.fences.is_some() {
                self.signal_fences();
            }
        }
    }

    /// Hands every frame whose completions have all arrived to `postprocess`, in frame order,
    /// without waiting. Returns how many finished.
    ///
    /// # Errors
    /// Ring errors (a completion the queue does not know).
    pub fn poll(
        &mut self,
        mut postprocess: impl FnMut(Finished<'_>),
    ) -> Result<usize, crate::Error> {
        let mut finished = 0;
        for q in 0..self.queues.len() {
            while let Some(done) = self.queues[q].poll()? {
                finished += self.complete(done, &mut postprocess);
            }
        }
        Ok(finished)
    }

    /// Waits until at least one frame finishes (announcing queued frames first), then hands
    /// it and any others already done to `postprocess`. Returns how many finished (0 when
    /// nothing is in flight).
    ///
    /// # Errors
    /// [`userdma::Error::Ring`] when nothing completes within the configured timeout (the device
    /// stopped answering), and ring errors.
    pub fn wait(
        &mut self,
        mut postprocess: impl FnMut(Finished<'_>),
    ) -> Result<usize, crate::Error> {
        self.flush()?;
        let mut finished = self.poll(&mut postprocess)?;
        if self.queues.is_empty() {
            // Removed and recovered: nothing is in flight any more.
            return Ok(finished);
        }
        // A frame's last completion is on the last queue: wait there, then take the others.
        let last = self.queues.len() - 1;
        while finished == 0 && self.in_flight > 0 {
            if self.held.iter().any(|&h| h) {
                // Its D2H is back, another of its completions is not seen yet: moments away.
                std::thread::yield_now();
            } else {
                let done = self.queues[last].wait(self.config.timeout)?;
                finished += self.complete(done, &mut postprocess);
            }
            finished += self.poll(&mut postprocess)?;
        }
        Ok(finished)
    }

    /// Runs `frames` frames: each free slot is filled by `preprocess` and submitted, and each
    /// finished frame handed to `postprocess`, in frame order, until all are done.
    ///
    /// # Errors
    /// As [`Pipeline::try_submit`] and [`Pipeline::wait`]; a failed frame is not an error (it
    /// reaches `postprocess` with its [`FrameError`]).
    pub fn run(
        &mut self,
        frames: u64,
        mut preprocess: impl FnMut(u64, &Input<'_>) -> Result<(), crate::Error>,
        mut postprocess: impl FnMut(Finished<'_>),
    ) -> Result<Summary, crate::Error> {
        let start = self.next_frame;
        let end = start + frames;
        while self.next_frame < end || self.in_flight > 0 {
            while self.next_frame < end {
                if self.try_submit(|n, input| preprocess(n, input))?.is_none() {
                    break;
                }
            }
            self.flush()?;
            self.poll(&mut postprocess)?;
            if self.free.is_empty() || self.next_frame >= end {
                self.wait(&mut postprocess)?;
            }
        }
        Ok(self.summary)
    }

    /// Drains what is in flight (each frame to `postprocess`) and gives every buffer back to
    /// the pool.
    ///
    /// # Errors
    /// As [`Pipeline::wait`].
    pub fn shutdown(
        mut self,
        mut postprocess: impl FnMut(Finished<'_>),
    ) -> Result<Summary, crate::Error> {
        while self.in_flight > 0 {
            self.wait(&mut postprocess)?;
        }
        Ok(self.summary)
    }
}
