//! A frame as preprocessing and postprocessing see it: the slot's [`Input`] to write, the
//! [`Output`] to read (a host buffer, or device memory read in place), when its parts
//! happened ([`Times`]), and the [`Finished`] frame handed over, or its [`FrameError`].

use std::time::Instant;

use super::Error;
use crate::accel::Accelerator;
use userdma::pool::OwnedBuffer;

/// Why a frame failed on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "frame {frame}: step {step} ({what}), command id {command} on queue {queue}, failed on the device with status {code} ({status}, result {result:#x})"
)]
pub struct FrameError {
    /// The frame.
    pub frame: u64,
    /// The queue the failing descriptor went to.
    pub queue: u16,
    /// The failing descriptor's command id.
    pub command: u16,
    /// Which descriptor of the frame: 0 is the H2D copy, then the model's steps, then D2H.
    pub step: u16,
    /// What that descriptor was.
    pub what: &'static str,
    /// The device's completion code (the engine's own numbers; the loopback NPU's are its
    /// `StatusCode`s).
    pub code: u32,
    /// The engine's name for it.
    pub status: &'static str,
    /// The completion's result field (an address or offset for range errors).
    pub result: u64,
}

/// The slot's host input buffer, for preprocessing to write the frame into.
#[derive(Debug)]
pub struct Input<'a> {
    pub(super) buffer: &'a OwnedBuffer,
}

impl Input<'_> {
    /// The input's length in bytes.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether the input is empty (never: a model's input is at least a word).
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// Writes `bytes` at `offset` of the input, straight into DMA memory.
    ///
    /// # Errors
    /// [`userdma::Error::Pool`] if the range leaves the input.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> Result<(), crate::Error> {
        Ok(self.buffer.write(offset, bytes)?)
    }

    /// The slot's input buffer (for a [`FrameSource`](crate::stage::FrameSource) to read
    /// into).
    pub(crate) fn buffer(&self) -> &OwnedBuffer {
        self.buffer
    }
}

/// A finished frame's result: the slot's host result buffer after its D2H copy, or the
/// slot's result tensor in device memory, read in place.
#[derive(Debug)]
pub struct Output<'a> {
    pub(super) source: Source<'a>,
}

#[derive(Debug)]
pub(super) enum Source<'a> {
    Host(&'a OwnedBuffer),
    Device {
        device: &'a dyn Accelerator,
        at: u64,
        len: usize,
    },
    /// The caller's own memory ([`Pipeline::try_submit_spans`](super::Pipeline::try_submit_spans)).
    Caller {
        frame: u64,
        len: usize,
    },
}

impl Output<'_> {
    /// The result's length in bytes.
    pub fn len(&self) -> usize {
        match self.source {
            Source::Host(buffer) => buffer.len(),
            Source::Device { len, .. } | Source::Caller { len, .. } => len,
        }
    }

    /// Whether the result is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the result is read in place from device memory (each read pays the BAR's
    /// round trips) rather than from a host buffer.
    pub fn in_place(&self) -> bool {
        matches!(self.source, Source::Device { .. })
    }

    /// Whether the result went to the caller's own memory
    /// ([`Pipeline::try_submit_spans`](super::Pipeline::try_submit_spans)): read it there.
    pub fn in_caller_memory(&self) -> bool {
        matches!(self.source, Source::Caller { .. })
    }

    /// The slot's host result buffer (`None` for a result read in place or in the caller's
    /// memory), for a [`FrameSink`](crate::stage::FrameSink) to write from.
    pub(crate) fn host_buffer(&self) -> Option<&OwnedBuffer> {
        match self.source {
            Source::Host(buffer) => Some(buffer),
            Source::Device { .. } | Source::Caller { .. } => None,
        }
    }

    /// Reads `dst.len()` bytes at `offset` of the result.
    ///
    /// # Errors
    /// [`userdma::Error::Pool`] (a host result) or [`Error::OutsideResult`] (in place) if the
    /// range leaves the result; [`Error::CallerResult`] for a result in the caller's memory.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), crate::Error> {
        match self.source {
            Source::Host(buffer) => Ok(buffer.read(offset, dst)?),
            Source::Device { device, at, len } => {
                if offset.checked_add(dst.len()).is_none_or(|end| end > len) {
                    return Err(Error::OutsideResult {
                        offset,
                        len: dst.len(),
                        size: len,
                    }
                    .into());
                }
                device.read_arena(at + offset as u64, dst)
            }
            Source::Caller { frame, .. } => Err(Error::CallerResult { frame }.into()),
        }
    }
}

/// When each part of a frame happened, as the host saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Times {
    /// Preprocessing began.
    pub preprocess: Instant,
    /// The frame's descriptors were announced: read just before its doorbell (or its
    /// batch's) rang.
    pub submitted: Instant,
    /// The H2D copy's completion was seen.
    pub to_device: Instant,
    /// The last device step's completion was seen.
    pub computed: Instant,
    /// The D2H copy's completion was seen.
    pub to_host: Instant,
}

/// One finished frame, handed to postprocessing.
#[derive(Debug)]
pub struct Finished<'a> {
    /// The frame number (from 0, in submission order).
    pub frame: u64,
    /// The result, or why the device failed the frame.
    pub result: Result<Output<'a>, FrameError>,
    /// When its parts happened.
    pub times: Times,
}
