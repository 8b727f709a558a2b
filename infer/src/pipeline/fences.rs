//! A pipeline's frames as fences another process can wait for, and submissions that wait for
//! another driver's fence.

use std::time::Duration;

use userdma::fence::{Fence, Timeline};

use super::{Input, Pipeline};

impl Pipeline {
    /// A fence that signals when frame `frame` is done: handed to postprocessing, or given up
    /// as lost by a recovery ([`Pipeline::recover`]); signalled at once for a frame already
    /// done. Its descriptor ([`Fence::fd`]) can be polled here or in another process (pass it
    /// with [`userdma::share`]). Frames finish in order, so the fence of frame `n` also says
    /// every frame before `n` is done. The first call makes the pipeline's timeline; a
    /// pipeline no one asks for fences keeps none (no cost per frame).
    ///
    /// # Errors
    /// [`userdma::fence::Error`] when no eventfd can be made.
    pub fn fence(&mut self, frame: u64) -> Result<Fence, crate::Error> {
        let done = self.next_out.checked_sub(1);
        let timeline = self.fences.get_or_insert_with(|| {
            let mut timeline = Timeline::new();
            if let Some(done) = done {
                // Signalling no fence: none was handed out yet.
                let _ = timeline.reached(done);
            }
            timeline
        });
        Ok(timeline.fence(frame)?)
    }

    /// Waits for `dependency` (another driver's `sync_file`, another process's fence: say, the
    /// decoder's fence for the frame's input buffer), at most `timeout`, then submits as
    /// [`Pipeline::try_submit`] does.
    ///
    /// # Errors
    /// [`userdma::fence::Error::Timeout`] when the dependency does not signal in time (nothing
    /// is submitted); as [`Pipeline::try_submit`].
    pub fn try_submit_after(
        &mut self,
        dependency: &Fence,
        timeout: Option<Duration>,
        preprocess: impl FnOnce(u64, &Input<'_>) -> Result<(), crate::Error>,
    ) -> Result<Option<u64>, crate::Error> {
        dependency.wait(timeout)?;
        self.try_submit(preprocess)
    }

    /// Signals the fences of every frame before `next_out`.
    pub(super) fn signal_fences(&mut self) {
        if let (Some(timeline), Some(done)) = (self.fences.as_mut(), self.next_out.checked_sub(1)) {
            // Writing 1 to an eventfd this timeline made cannot fail (EAGAIN, a full counter,
            // is already taken as signalled by `Fence::signal`).
            let _ = timeline.reached(done);
        }
    }
}
