//! The run loop ([`Streams::run`](super::Streams::run)): frames arrive, each device with
//! room gets one, finished frames are reaped, faults are recovered from; with nothing to do
//! the loop sleeps until the next arrival, back-off or retry, on the oldest frame's device,
//! or, with several devices, on every busy pipeline's interrupt at once.

use std::time::{Duration, Instant};

use super::{nanos, DeviceReport, Down, RunReport, State, StreamReport, Streams};
use crate::pipeline::{Finished, Input};
use crate::sched::{Nanos, StreamId};

/// How often the loop looks at a reset running on its own thread.
const RESET_POLL: Duration = Duration::from_millis(1);

/// How long a wait on several devices sleeps at most before it looks again (the pipelines'
/// own timeout still decides when a device is declared stuck).
const MAX_SLEEP: Duration = Duration::from_millis(100);
/// The longest the loop sleeps while a busy pipeline has no interrupt (a polled engine):
/// how late it can notice that engine's completions.
const POLL_INTERVAL: Duration = Duration::from_micros(50);

impl Streams {
    /// Runs for `duration`: frames arrive, each device's scheduler picks whenever the device
    /// can take a frame, `preprocess(stream, frame, input)` fills each dispatched frame's
    /// input, `postprocess(stream, finished)` gets each result; then the frames in flight
    /// are drained. Returns what each stream and each device did in this run (the counts
    /// start again at every run).
    ///
    /// A device that fails mid-run (its pipeline's wait times out, its queue protocol breaks,
    /// it is removed) does not end the run: it is reset (unless removed), every pipeline on it
    /// takes its slots back and reopens its queues ([`Pipeline::reclaim`]), the frames that
    /// were in flight there are counted as lost, and the run goes on; a removed device's
    /// streams get no more frames while the other devices' go on. A device that keeps
    /// failing is treated by the [`Recovery`] policy ([`Streams::with_recovery`]): a reset
    /// that fails is tried again after a back-off (the device gets no frames meanwhile),
    /// faults in a row hold its frames back for a growing back-off, and past the policy's
    /// limits the device is quarantined: its streams get no more frames, the others go on.
    /// Each fault is in [`RunReport::faults`].
    ///
    /// # Errors
    /// What the pipelines return that is not a device fault, and what `preprocess` returns.
    ///
    /// [`Pipeline::reclaim`]: crate::pipeline::Pipeline::reclaim
    /// [`Recovery`]: super::Recovery
    pub fn run(
        &mut self,
        duration: Duration,
        mut preprocess: impl FnMut(StreamId, u64, &Input<'_>) -> Result<(), crate::Error>,
        mut postprocess: impl FnMut(StreamId, Finished<'_>),
    ) -> Result<RunReport, crate::Error> {
        let start = Instant::now();
        let end = nanos(duration);
        // Nothing here allocates: a run's steady state allocates nothing.
        for g in &mut self.groups {
            g.at_start = (g.scheduler.switches(), g.scheduler.decisions());
            (g.last_done, g.longest_frame, g.last_dispatch) = (0, 0, None);
        }
        for s in &mut self.states {
            s.queue.restart();
            s.latency.reset();
            (s.frames, s.failed, s.lost, s.max_wait) = (0, 0, 0, 0);
            (s.max_head_wait, s.last_dispatch) = (0, 0);
        }
        self.timeline.clear();
        self.faults.clear();
        let mut closed = false;
        loop {
            let now = nanos(start.elapsed());
            let open = now < end;
            if !open && !closed {
                // Periodic frames due before the window closed count as arrived even when the
                // loop was waiting on a device then: they are left waiting (busy: an
                // as-fast-as-possible stream gets no frame after the close).
                closed = true;
                for s in &mut self.states {
                    s.queue.arrive(end.saturating_sub(1), true);
                }
                self.settle_downed(start, &mut postprocess)?;
            }
            if open {
                self.away(|this| this.poll_resets(start, &mut postprocess))?;
                self.arrive(now);
                let dispatched = self.dispatch(now, start, &mut preprocess)?;
                if let Some((g, err)) = self.pending_fault.take() {
                    self.recover(g, err, start, &mut postprocess)?;
                    continue;
                }
                if dispatched {
                    continue;
                }
            }
            // Frames on devices that answer (a device whose reset failed keeps its frames
            // until it is reset or quarantined).
            let busy: usize = (0..self.states.len())
                .filter(|&i| self.reapable(i))
                .map(|i| self.states[i].dispatched.len())
                .sum();
            if busy == 0 {
                if !open {
                    if self.groups.iter().any(|g| g.down.is_some()) {
                        // A device that faulted while the frames in flight were drained:
                        // its reset is waited for (or it is quarantined), so its frames are
                        // finished or counted lost before the run ends.
                        self.settle_downed(start, &mut postprocess)?;
                        continue;
                    }
                    break;
                }
                // Nothing on any device: sleep until the next arrival, back-off's end or
                // reset's retry (or a little).
                let next = self.next_wake(start).unwrap_or(now + 100_000).min(end);
                if next > now {
                    std::thread::sleep(Duration::from_nanos(next - now));
                }
                continue;
            }
            if self.waiter.is_none() {
                // One device (or pipelines without an interrupt to sleep on together): wait
                // for the oldest frame on the devices (its device can take nothing more until
                // one finishes, or it would have been given it above).
                let oldest = (0..self.states.len())
                    .filter(|&i| self.reapable(i))
                    .min_by_key(|&i| self.states[i].dispatched[0].1)
                    .expect("busy > 0");
                self.reap_or_recover(oldest, start, true, &mut postprocess)?;
            } else {
                // Several devices: sleep on every busy pipeline until one finishes or a frame
                // arrives for a device that could take it.
                // Or until a device is overdue.
                let wake = if open { self.next_wake(start) } else { None };
                let wake = wake.into_iter().chain(self.deadlines()).min();
                let left = wake.map_or(MAX_SLEEP, |w| {
                    Duration::from_nanos(w.saturating_sub(nanos(start.elapsed())))
                });
                self.sleep_any(left.min(MAX_SLEEP))?;
            }
            for i in 0..self.states.len() {
                if self.reapable(i) {
                    self.reap_or_recover(i, start, false, &mut postprocess)?;
                }
            }
            if self.waiter.is_some() {
                self.recover_overdue(start, &mut postprocess)?;
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        let devices: Vec<DeviceReport> = self
            .groups
            .iter()
            .map(|g| (g, g.at_start))
            .map(|(g, (s0, d0))| DeviceReport {
                streams: g
                    .members
                    .iter()
                    .map(|&i| self.states[i].stream.spec.name.clone())
                    .collect(),
                switches: g.scheduler.switches() - s0,
                decisions: g.scheduler.decisions() - d0,
                longest_frame_ns: g.longest_frame,
            })
            .collect();
        Ok(RunReport {
            policy: *self.groups[0].scheduler.policy(),
            seconds,
            streams: self
                .states
                .iter()
                .map(|s| StreamReport {
                    name: s.stream.spec.name.clone(),
                    device: s.group,
                    arrived: s.queue.arrived(),
                    frames: s.frames,
                    failed: s.failed,
                    dropped: s.queue.dropped(),
                    fps: s.frames as f64 / seconds.max(1e-9),
                    latency_mean_ns: s.latency.mean(),
                    latency_p50_ns: s.latency.value_at_quantile(0.5),
                    latency_p99_ns: s.latency.value_at_quantile(0.99),
                    latency_max_ns: s.latency.max(),
                    max_wait_ns: s.max_wait,
                    max_head_wait_ns: s.max_head_wait,
                    left_waiting: s.queue.len() as u64,
                    lost: s.lost,
                })
                .collect(),
            switches: devices.iter().map(|d| d.switches).sum(),
            decisions: devices.iter().map(|d| d.decisions).sum(),
            devices,
            faults: std::mem::take(&mut self.faults),
        })
    }

    /// No more tries, once the window has closed: a reset under way is waited for, and a
    /// device whose reset failed is quarantined, its frames in flight lost. Afterwards no
    /// device is down.
    fn settle_downed(
        &mut self,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        for g in 0..self.groups.len() {
            self.away(|this| this.finish_reset(g, start, &mut *postprocess))?;
            if let Some(fault) = self.groups[g].down.as_ref().map(|d| d.fault) {
                self.quarantine(g, fault, start);
            }
        }
        Ok(())
    }

    /// Whether stream `i` has frames in flight on a device that answers (not one whose reset
    /// failed and waits to be tried again).
    fn reapable(&self, i: usize) -> bool {
        let s = &self.states[i];
        !s.dispatched.is_empty() && self.groups[s.group].down.is_none()
    }

    /// Frames arriving up to `now`.
    fn arrive(&mut self, now: Nanos) {
        for s in &mut self.states {
            s.queue.arrive(now, !s.dispatched.is_empty());
        }
    }

    /// When the loop has something to do next without a completion: a periodic frame
    /// arriving for a device with room for it, a device's back-off ending, a failed reset's
    /// next try; in ns from `start`.
    fn next_wake(&self, start: Instant) -> Option<Nanos> {
        let now = Instant::now();
        let at = |t: Instant| nanos(t.saturating_duration_since(start));
        let arrival = self
            .states
            .iter()
            .filter(|s| self.groups[s.group].takes_frames(now))
            .filter(|s| self.busy(s.group) < self.in_flight)
            .filter_map(|s| s.queue.next_arrival());
        let device = self.groups.iter().filter(|g| !g.retired).filter_map(|g| {
            match &g.down {
                Some(Down { reset: Some(_), .. }) => Some(now + RESET_POLL),
                Some(down) => Some(down.retry_at),
                None => g.hold_until.filter(|&t| t > now),
            }
            .map(at)
        });
        arrival.chain(device).min()
    }

    /// Frames in flight on device group `g`.
    #[inline]
    pub(super) fn busy(&self, g: usize) -> usize {
        self.groups[g]
            .members
            .iter()
            .map(|&i| self.states[i].dispatched.len())
            .sum()
    }

    /// Sleeps until a busy pipeline has a completion, or `timeout` passes.
    fn sleep_any(&mut self, timeout: Duration) -> Result<(), crate::Error> {
        let groups = &self.groups;
        let busy = |s: &State| !s.dispatched.is_empty() && groups[s.group].down.is_none();
        if self
            .states
            .iter()
            .any(|s| busy(s) && s.stream.pipeline.finishing())
        {
            std::thread::yield_now();
            return Ok(());
        }
        let mut ready = false;
        let mut polled = false;
        for s in self.states.iter_mut().filter(|s| busy(s)) {
            if s.stream.pipeline.interrupt().is_none() {
                // Nothing to sleep on (a polled engine, or no queues): look again soon.
                polled = true;
                continue;
            }
            // A completion that came in while arming: no need to sleep.
            let Some(queue) = s.stream.pipeline.waitable() else {
                // Work for the host right now (a step it runs for the device).
                ready = true;
                break;
            };
            if queue.arm_interrupt()? {
                ready = true;
                break;
            }
        }
        let timeout = if polled {
            timeout.min(POLL_INTERVAL)
        } else {
            timeout
        };
        let slept = match (&mut self.waiter, ready) {
            (Some(waiter), false) => waiter.wait(Some(timeout)).map(|_| ()),
            _ => Ok(()),
        };
        for s in self.states.iter_mut().filter(|s| busy(s)) {
            if let Some(queue) = s.stream.pipeline.waitable() {
                queue.disarm_interrupt();
            }
        }
        slept.map_err(crate::Error::from)
    }
}
