//! Devices that fail mid-run: the [`Recovery`] policy, and how a run answers a fault (see
//! [`Streams::run`](super::Streams::run)): a reset on a thread of its own, tried again after
//! a back-off when it fails, every pipeline on the device taking its slots back, frames held
//! back after faults in a row, and a device that keeps failing quarantined.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{nanos, Down, FaultReport, Streams};
use crate::accel::Accelerator;
use crate::pipeline::Finished;
use crate::sched::{Nanos, StreamId};

/// How a run treats a device that keeps failing ([`Streams::with_recovery`]). Each fault is
/// answered with a reset; a reset that fails is tried again after a back-off, and faults in
/// a row (no frame finished by the device between them) hold the device's frames back for a
/// growing back-off; a device past either limit is quarantined: its streams get no more
/// frames in this run or the next, the others go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Recovery {
    /// Faults in a row after which the device is quarantined (at least 1; 5 by default).
    pub max_faults: u32,
    /// Resets tried for one fault before the device is quarantined (at least 1; 6 by
    /// default).
    pub max_resets: u32,
    /// The first back-off (10 ms by default): a failed reset's k-th try waits
    /// `backoff * 2^(k-1)`; after the n-th fault in a row (n >= 2) the device gets no frames
    /// for `backoff * 2^(n-2)`.
    pub backoff: Duration,
    /// The longest back-off (1 s by default).
    pub max_backoff: Duration,
}

impl Default for Recovery {
    fn default() -> Recovery {
        Recovery {
            max_faults: 5,
            max_resets: 6,
            backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(1),
        }
    }
}

impl Recovery {
    /// `backoff * 2^k`, at most `max_backoff`.
    fn backoff(&self, k: u32) -> Duration {
        self.backoff
            .checked_mul(1u32.checked_shl(k).unwrap_or(u32::MAX))
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

/// A device's reset running on a thread of its own ([`Down`]).
///
/// Its outcome comes back through a channel, not by joining the thread, so the loop takes it
/// the moment the reset returns. A thread that has returned may still wait for a core before
/// it is gone (its thread-local destructors, a sanitizer's bookkeeping of its stack): on a
/// busy machine with two cores that wait was measured at 15–190 ms, and joining the thread
/// held every other device's streams as long. The thread lets go of the device before it
/// sends the outcome, so once the loop has the outcome the device is the streams' alone; the
/// thread itself is detached and ends on its own.
#[derive(Debug)]
pub(super) struct Resetting {
    outcome: mpsc::Receiver<Result<(), crate::Error>>,
}

impl Resetting {
    /// Starts resetting `device` on a thread of its own; `None` when no thread can be
    /// started (the caller resets it on its own thread).
    fn start(device: Arc<dyn Accelerator>) -> Option<Resetting> {
        let (send, outcome) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("userdma-reset".into())
            .spawn(move || {
                let done = device.reset();
                drop(device);
                // A loop that is gone (its run ended in an error) has no use for the
                // outcome: nothing to do then.
                let _ = send.send(done);
            })
            .ok()?;
        Some(Resetting { outcome })
    }

    /// The reset's outcome once it returned, `None` while it runs.
    fn outcome(&self) -> Option<Result<(), String>> {
        match self.outcome.try_recv() {
            Err(mpsc::TryRecvError::Empty) => None,
            received => Some(told(received.ok())),
        }
    }

    /// Waits for the reset's outcome.
    fn wait(self) -> Result<(), String> {
        told(self.outcome.recv().ok())
    }
}

/// What a reset's thread sent (`None`: it ended without sending, so it panicked), as
/// [`Streams::reset_done`] takes it.
fn told(sent: Option<Result<(), crate::Error>>) -> Result<(), String> {
    match sent {
        Some(done) => done.map_err(|err| err.to_string()),
        None => Err("the reset panicked".to_string()),
    }
}

impl Streams {
    /// Answers device group `g`'s fault `err` (see [`Streams::run`] and [`Recovery`]): a
    /// removed device's pipelines take their slots back and its streams stop; any other is
    /// reset ([`Streams::start_reset`]).
    pub(super) fn recover(
        &mut self,
        g: usize,
        err: crate::Error,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        #[cfg(feature = "tracing")]
        let _span = tracing::info_span!("streams.recover", group = g, code = ?err.code()).entered();
        self.away(|this| this.recover_from(g, err, start, postprocess))
    }

    /// Runs `work` (recovering a device) and counts its time as time away from the devices
    /// (`host_ns`; `postprocess` inside it is counted once).
    pub(super) fn away<R>(&mut self, work: impl FnOnce(&mut Self) -> R) -> R {
        let began = Instant::now();
        let before = self.host_ns;
        let result = work(self);
        let inside = self.host_ns - before;
        self.host_ns += nanos(began.elapsed()).saturating_sub(inside);
        result
    }

    /// [`Streams::recover`]'s work.
    fn recover_from(
        &mut self,
        g: usize,
        err: crate::Error,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        let at_ns = nanos(start.elapsed());
        let Some(&first) = self.groups[g].members.first() else {
            return Err(err);
        };
        let device = Arc::clone(self.states[first].stream.pipeline.device());
        let removed = device.is_removed();
        let group = &mut self.groups[g];
        group.streak = group.streak.saturating_add(1);
        group.hold_until = None;
        self.faults.push(FaultReport {
            device: g,
            at_ns,
            error: err.to_string(),
            code: err.code(),
            removed,
            finished: 0,
            lost: 0,
            recovery_ns: 0,
            resets: 0,
            reset_error: None,
            in_a_row: group.streak,
            held_ns: 0,
            quarantined: false,
        });
        let f = self.faults.len() - 1;
        #[cfg(feature = "tracing")]
        tracing::warn!(
            device = %device.identity(),
            group = g,
            error = %self.faults[f].error,
            removed,
            in_a_row = self.faults[f].in_a_row,
            "device fault"
        );
        self.trace_fault(
            g,
            crate::trace::FaultKind::Detected {
                code: self.faults[f].code as u32,
            },
        );
        if removed {
            self.trace_fault(g, crate::trace::FaultKind::Removed);
            self.groups[g].retired = true;
            self.reclaim(g, f, start, postprocess)?;
            self.trace_recovered(g, f);
            self.faults[f].recovery_ns = nanos(start.elapsed()).saturating_sub(at_ns);
            return Ok(());
        }
        self.start_reset(g, f, start, postprocess)
    }

    /// Takes the resets that are done, starts those whose back-off is over.
    pub(super) fn poll_resets(
        &mut self,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        let now = Instant::now();
        for g in 0..self.groups.len() {
            let Some(down) = &self.groups[g].down else {
                continue;
            };
            match &down.reset {
                Some(reset) => {
                    if let Some(result) = reset.outcome() {
                        let f = down.fault;
                        self.reset_done(g, f, result, start, postprocess)?;
                    }
                }
                None if now >= down.retry_at => {
                    self.start_reset(g, down.fault, start, postprocess)?
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Resets device group `g` for fault `f` on a thread of its own ([`Down`]); the loop
    /// takes the outcome ([`Streams::finish_reset`]) when it is done. Where no thread can be
    /// started, the reset runs here.
    fn start_reset(
        &mut self,
        g: usize,
        f: usize,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        let first = self.groups[g].members[0];
        let device = Arc::clone(self.states[first].stream.pipeline.device());
        self.faults[f].resets += 1;
        #[cfg(feature = "tracing")]
        tracing::info!(
            device = %device.identity(),
            group = g,
            attempt = self.faults[f].resets,
            "accelerator reset started"
        );
        let reset = Resetting::start(Arc::clone(&device));
        let inline = reset.is_none();
        self.groups[g].down = Some(Down {
            fault: f,
            reset,
            retry_at: Instant::now(),
        });
        if inline {
            let result = device.reset().map_err(|e| e.to_string());
            self.reset_done(g, f, result, start, postprocess)?;
        }
        Ok(())
    }

    /// Waits for device group `g`'s reset under way, if any, and acts on its outcome.
    pub(super) fn finish_reset(
        &mut self,
        g: usize,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        let Some(down) = self.groups[g].down.as_mut() else {
            return Ok(());
        };
        let Some(reset) = down.reset.take() else {
            return Ok(());
        };
        let f = down.fault;
        let result = reset.wait();
        self.reset_done(g, f, result, start, postprocess)
    }

    /// Acts on the outcome of device group `g`'s reset for fault `f`: every pipeline on it
    /// takes its slots back, delivering what finished and counting what was lost. A reset
    /// that failed leaves the frames in flight with their pipelines (the device may still
    /// write them) and is tried again after a back-off, up to [`Recovery::max_resets`] times;
    /// a device that comes back after its n-th fault in a row gets no frames for a back-off,
    /// and one at [`Recovery::max_faults`] (or that cannot be made to stop its queues or
    /// reopen them) is quarantined.
    fn reset_done(
        &mut self,
        g: usize,
        f: usize,
        result: Result<(), String>,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        if let Err(err) = result {
            #[cfg(feature = "tracing")]
            tracing::warn!(group = g, attempt = self.faults[f].resets, error = %err, "accelerator reset failed");
            self.faults[f].reset_error = Some(err);
            let tries = self.faults[f].resets;
            if tries >= self.recovery.max_resets {
                self.quarantine(g, f, start);
            } else {
                self.groups[g].down = Some(Down {
                    fault: f,
                    reset: None,
                    retry_at: Instant::now() + self.recovery.backoff(tries - 1),
                });
            }
            return Ok(());
        }
        #[cfg(feature = "tracing")]
        tracing::info!(
            group = g,
            attempt = self.faults[f].resets,
            "accelerator reset"
        );
        self.groups[g].down = None;
        self.trace_fault(g, crate::trace::FaultKind::Reset);
        let reclaimed = self.reclaim(g, f, start, postprocess);
        self.trace_recovered(g, f);
        if let Err(err) = reclaimed {
            // A queue the device would not stop (its slots are leaked, never freed under it)
            // or queues that would not open again: nothing more to try.
            self.faults[f].reset_error = Some(format!("after the reset: {err}"));
            self.quarantine(g, f, start);
            return Ok(());
        }
        let streak = self.groups[g].streak;
        if streak >= self.recovery.max_faults {
            self.quarantine(g, f, start);
            return Ok(());
        }
        if streak >= 2 {
            let hold = self.recovery.backoff(streak - 2);
            self.groups[g].hold_until = Some(Instant::now() + hold);
            self.faults[f].held_ns = nanos(hold);
        }
        self.faults[f].recovery_ns = nanos(start.elapsed()).saturating_sub(self.faults[f].at_ns);
        Ok(())
    }

    /// Records fault `f`'s recovery of group `g`'s device in the trace, if there is one.
    fn trace_recovered(&self, g: usize, f: usize) {
        let fault = &self.faults[f];
        self.trace_fault(
            g,
            crate::trace::FaultKind::Recovered {
                lost: u32::try_from(fault.lost).unwrap_or(u32::MAX),
                finished: u32::try_from(fault.finished).unwrap_or(u32::MAX),
            },
        );
    }

    /// Every pipeline on device group `g` (reset or removed) takes its slots back: what
    /// finished is delivered, what was in flight counted lost, both in fault `f`.
    fn reclaim(
        &mut self,
        g: usize,
        f: usize,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        for k in 0..self.groups[g].members.len() {
            let i = self.groups[g].members[k];
            let before = self.states[i].frames;
            let took = self.take_finished(i, start, postprocess, false, |pipeline, each| {
                pipeline.reclaim(each)
            });
            self.faults[f].finished += self.states[i].frames - before;
            took?;
            // What is still listed as dispatched never finished.
            let s = &mut self.states[i];
            let gone = s.dispatched.len() as u64;
            s.dispatched.clear();
            s.lost += gone;
            self.faults[f].lost += gone;
        }
        Ok(())
    }

    /// Takes device group `g` out of the run (fault `f`): its streams get no more frames, the
    /// frames still in flight on it are lost. Their slots stay with the pipelines, which
    /// free them only once the device is stopped (or leak them: [`userdma::ring::leaks`]).
    pub(super) fn quarantine(&mut self, g: usize, f: usize, start: Instant) {
        let group = &mut self.groups[g];
        group.retired = true;
        group.down = None;
        group.hold_until = None;
        for k in 0..self.groups[g].members.len() {
            let s = &mut self.states[self.groups[g].members[k]];
            let gone = s.dispatched.len() as u64;
            s.dispatched.clear();
            s.lost += gone;
            self.faults[f].lost += gone;
        }
        let fault = &mut self.faults[f];
        fault.quarantined = true;
        fault.recovery_ns = nanos(start.elapsed()).saturating_sub(fault.at_ns);
        #[cfg(feature = "tracing")]
        tracing::error!(
            group = g,
            lost = fault.lost,
            error = fault.reset_error.as_deref(),
            "device quarantined: its streams get no more frames"
        );
    }

    /// When each busy device that answers is overdue (its last progress plus its timeout), in
    /// ns from the run's start.
    pub(super) fn deadlines(&self) -> impl Iterator<Item = Nanos> + '_ {
        (0..self.groups.len())
            .filter(|&g| self.groups[g].down.is_none() && self.busy(g) > 0)
            .map(|g| {
                let group = &self.groups[g];
                let away = self.host_ns - group.host_at_progress;
                group
                    .progress
                    .saturating_add(nanos(group.timeout))
                    .saturating_add(away)
            })
    }

    /// Treats each busy device that showed no progress for its timeout as stuck (what a
    /// pipeline's own wait reports on one device: [`Pipeline::overdue`]), with several devices,
    /// where the loop sleeps on all of them instead of waiting on one.
    ///
    /// [`Pipeline::overdue`]: crate::pipeline::Pipeline::overdue
    pub(super) fn recover_overdue(
        &mut self,
        start: Instant,
        postprocess: &mut impl FnMut(StreamId, Finished<'_>),
    ) -> Result<(), crate::Error> {
        for g in 0..self.groups.len() {
            let now = nanos(start.elapsed());
            let group = &self.groups[g];
            let away = self.host_ns - group.host_at_progress;
            let silent = now.saturating_sub(group.progress).saturating_sub(away);
            if group.down.is_some() || self.busy(g) == 0 || silent < nanos(group.timeout) {
                continue;
            }
            // The member whose frame went first.
            let Some(i) = group
                .members
                .iter()
                .copied()
                .filter(|&i| !self.states[i].dispatched.is_empty())
                .min_by_key(|&i| self.states[i].dispatched[0].1)
            else {
                continue;
            };
            let err = self.states[i]
                .stream
                .pipeline
                .overdue(Duration::from_nanos(silent));
            self.recover(g, err, start, postprocess)?;
        }
        Ok(())
    }
}

/// Whether `err` is a device fault a run recovers from: a wait that timed out (the device
/// stopped answering), the device breaking its protocol, or its removal.
#[inline]
pub(super) fn is_device_fault(err: &crate::Error) -> bool {
    matches!(
        err.code(),
        userdma::Code::Timeout | userdma::Code::Device | userdma::Code::Removed
    )
}
