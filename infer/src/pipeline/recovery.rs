//! A pipeline after a fault ([`Pipeline::recover`], [`Pipeline::reclaim`]): the device reset
//! (or found removed), every slot taken back once the device can no longer touch it, the
//! frames that finished handed over and the others reported lost ([`Recovery`]), and the
//! queues opened again.

use std::time::{Duration, Instant};

use super::setup::open;
use super::{Finished, Pipeline};

/// What [`Pipeline::recover`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Recovery {
    /// The frames that were in flight and did not finish, in frame order: their slots are
    /// free again (taken back only after the device was stopped); submit them again.
    pub lost: Vec<u64>,
    /// Frames that finished while the device was being stopped, handed to postprocessing.
    pub finished: usize,
    /// The device was removed: nothing was reset or reopened, and the pipeline takes no new
    /// frames.
    pub removed: bool,
    /// How long the recovery took (the reset, taking the slots back, reopening the queues).
    pub took: Duration,
}

impl Pipeline {
    /// The error of a pipeline whose device was removed.
    pub(super) fn removed(&self) -> crate::Error {
        userdma::device::Error::Removed {
            device: self.device.identity(),
        }
        .into()
    }

    /// Brings the pipeline back after a fault (see the module docs): resets the device, takes
    /// every slot back from the queues once the device can no longer touch them, hands frames
    /// that finished to `postprocess` (in frame order, as always), reports the others as lost,
    /// and opens the queues again. On a removed device: no reset and no queues; the slots come
    /// back and new frames are refused.
    ///
    /// # Errors
    /// The reset or reopening failing (the device is beyond recovery: drop the pipeline);
    /// a queue the device could not be made to stop (the slots in flight are then leaked,
    /// never freed under the device, and the pipeline takes no new frames into them).
    pub fn recover(
        &mut self,
        postprocess: impl FnMut(Finished<'_>),
    ) -> Result<Recovery, crate::Error> {
        let start = Instant::now();
        #[cfg(feature = "tracing")]
        let _span = tracing::info_span!(
            "pipeline.recover",
            device = %self.device.identity(),
            queues = self.queues.len(),
            in_flight = self.in_flight
        )
        .entered();
        if !self.device.is_removed() {
            self.device.reset()?;
            #[cfg(feature = "tracing")]
            tracing::info!(device = %self.device.identity(), "accelerator reset");
        }
        let mut recovery = self.reclaim(postprocess)?;
        recovery.took = start.elapsed();
        Ok(recovery)
    }

    /// [`Pipeline::recover`] without the reset: for a device someone else has just reset, or
    /// that was removed. A reset stops every queue of the device, so every pipeline on it must
    /// take its slots back and reopen its queues; [`Streams`](crate::sched::streams::Streams) resets a
    /// device once and reclaims each of its pipelines. On a device that was neither reset nor
    /// removed it is still safe: each queue is stopped through the device's queue stop (which
    /// waits for the device to acknowledge) before its slots come back.
    ///
    /// # Errors
    /// As [`Pipeline::recover`].
    pub fn reclaim(
        &mut self,
        mut postprocess: impl FnMut(Finished<'_>),
    ) -> Result<Recovery, crate::Error> {
        let start = Instant::now();
        let removed = self.device.is_removed();
        #[cfg(feature = "tracing")]
        let _span = tracing::info_span!(
            "pipeline.reclaim",
            device = %self.device.identity(),
            queues = self.queues.len(),
            in_flight = self.in_flight,
            removed
        )
        .entered();
        // The device is stopped (reset) or gone: every queue stops at once, handing back what
        // completed before and what it aborted.
        let mut completed = Vec::new();
        let mut failure = None;
        for queue in std::mem::take(&mut self.queues) {
            match queue.shutdown() {
                Ok(stopped) => completed.extend(stopped.completed),
                Err(err) => failure = failure.or(Some(err)),
            }
        }
        let before = self.summary.frames;
        for done in completed {
            self.complete(done, &mut postprocess);
        }
        let finished = (self.summary.frames - before) as usize;
        if let Some(err) = failure {
            // A queue did not stop: the device may still write the slots in flight. They
            // stay busy (no frame is put into them again) and are leaked with the pipeline.
            self.leaked = true;
            return Err(err);
        }
        // Every frame still in flight was aborted or never came back: its slot is free again
        // (the device touches none of them any more).
        let mut lost = Vec::new();
        for index in 0..self.slots.len() {
            if self.busy[index] {
                lost.push(self.progress[index].frame);
                self.busy[index] = false;
                self.held[index] = false;
                self.free.push_back(index);
            }
        }
        lost.sort_unstable();
        #[cfg(feature = "tracing")]
        if !lost.is_empty() {
            tracing::warn!(
                device = %self.device.identity(),
                lost = lost.len(),
                frames = ?lost,
                finished,
                removed,
                "frames lost"
            );
        }
        self.in_flight = 0;
        self.next_out = self.next_frame;
        self.signal_fences();
        self.unannounced = 0;
        self.pending.clear();
        if !removed {
            self.reopen()?;
        }
        Ok(Recovery {
            lost,
            finished,
            removed,
            took: start.elapsed(),
        })
    }

    /// Opens the queues again after a reset, as [`Pipeline::on`] did.
    fn reopen(&mut self) -> Result<(), crate::Error> {
        for &opened in &self.specs {
            self.queues
                .push(open(&self.device, opened, self.compute, &self.config)?);
        }
        self.pushed = vec![0; self.specs.len()];
        Ok(())
    }
}
