//! [`FrameSource`] and [`FrameSink`]: a file of fixed-size frames read straight into a
//! [`Pipeline`]'s input slots, and its results written straight out of the slots' result
//! buffers, with no copy in user space.
//!
//! Frame `i` is at `i × frame_bytes` of the file. The read goes into the slot's own input
//! buffer (`READ_FIXED`, the stager made over [`Pipeline::pool`]) while the pipeline's
//! preprocess callback runs, and the write comes from the slot's host result buffer
//! (`WRITE_FIXED`) while postprocessing runs: each waits for its completion before the
//! callback returns, so the slot is back in the pipeline's hands, untouched by the kernel,
//! when the frame is submitted or the slot reused. The pipeline still overlaps the device's
//! work on earlier frames with the read of the next.

use super::{Error, File, Mode, Stager};
use crate::pipeline::{Finished, Input, Output, Pipeline, Summary};

/// What [`FrameSource::submit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pull {
    /// The next frame was read and submitted as this pipeline frame number.
    Frame(u64),
    /// Every slot is in flight: wait for a result first (nothing was read).
    Full,
    /// The file has no more frames (it ended at a frame boundary).
    End,
}

/// Frames of a file, read into pipeline input slots (see the [module docs](super)).
#[derive(Debug)]
pub struct FrameSource {
    stager: Stager,
    file: File,
    frame_bytes: usize,
    next: u64,
    ended: bool,
}

impl FrameSource {
    /// Frames of `frame_bytes` each from `file`, read with `stager`, which must be made over
    /// the pipeline's pool ([`Pipeline::pool`]): the slots' buffers are registered there.
    ///
    /// # Errors
    /// [`Error::Empty`] for frames of no bytes; [`Error::Misaligned`] when the file is read
    /// with direct I/O and `frame_bytes` (so the frames' offsets) is not a multiple of its
    /// alignment.
    pub fn new(stager: Stager, file: File, frame_bytes: usize) -> Result<FrameSource, Error> {
        check_frame(&file, frame_bytes)?;
        Ok(FrameSource {
            stager,
            file,
            frame_bytes,
            next: 0,
            ended: false,
        })
    }

    /// Bytes per frame.
    pub fn frame_bytes(&self) -> usize {
        self.frame_bytes
    }

    /// Frames read so far (the next frame's index in the file).
    pub fn frames_read(&self) -> u64 {
        self.next
    }

    /// Whether the end of the file was reached.
    pub fn is_done(&self) -> bool {
        self.ended
    }

    /// The file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The stager.
    pub fn stager(&self) -> &Stager {
        &self.stager
    }

    /// Reads the next frame into the first `frame_bytes` of `input` (a pipeline slot's input
    /// buffer, from preprocess). Returns `false`, with nothing read, at the end of the file.
    ///
    /// # Errors
    /// [`Error::ShortFrame`] when the file ends inside the frame; [`Error::Length`] when the
    /// frame is bigger than the slot's input; [`Error::NotRegistered`] when the stager is not
    /// over the pipeline's pool; [`Error::Misaligned`] for direct I/O; [`Error::Io`].
    pub fn fill(&mut self, input: &Input<'_>) -> Result<bool, Error> {
        if self.ended {
            return Ok(false);
        }
        let offset = frame_offset(self.next, self.frame_bytes)?;
        let transfer =
            self.stager
                .read_lent(&self.file, offset, input.buffer(), self.frame_bytes)?;
        if transfer.bytes == 0 {
            self.ended = true;
            return Ok(false);
        }
        if transfer.bytes < self.frame_bytes {
            return Err(Error::ShortFrame {
                path: self.file.path().to_owned(),
                frame: self.next,
                got: transfer.bytes,
                frame_bytes: self.frame_bytes,
            });
        }
        self.next += 1;
        Ok(true)
    }

    /// Reads the next frame into a free slot of `pipeline` and submits it.
    ///
    /// # Errors
    /// As [`FrameSource::fill`] and [`Pipeline::try_submit`].
    pub fn submit(&mut self, pipeline: &mut Pipeline) -> Result<Pull, crate::Error> {
        if self.ended {
            return Ok(Pull::End);
        }
        let mut end = false;
        let submitted = pipeline.try_submit(|_, input| match self.fill(input) {
            Ok(true) => Ok(()),
            Ok(false) => {
                end = true;
                Err(Error::Eof {
                    path: self.file.path().to_owned(),
                    offset: 0,
                }
                .into())
            }
            Err(e) => Err(e.into()),
        });
        match submitted {
            Ok(Some(frame)) => Ok(Pull::Frame(frame)),
            Ok(None) => Ok(Pull::Full),
            // The slot went back to the pipeline unused.
            Err(_) if end => Ok(Pull::End),
            Err(e) => Err(e),
        }
    }

    /// Runs every remaining frame of the file through `pipeline`, handing each finished frame
    /// to `postprocess` in frame order, until the file ends and nothing is in flight. Returns
    /// the pipeline's summary (counting every frame it ran, before this call too).
    ///
    /// # Errors
    /// As [`FrameSource::submit`] and [`Pipeline::wait`].
    pub fn run(
        &mut self,
        pipeline: &mut Pipeline,
        mut postprocess: impl FnMut(Finished<'_>),
    ) -> Result<Summary, crate::Error> {
        loop {
            let mut full = false;
            while !self.ended && !full {
                full = self.submit(pipeline)? == Pull::Full;
            }
            pipeline.flush()?;
            pipeline.poll(&mut postprocess)?;
            if self.ended && pipeline.in_flight() == 0 {
                return Ok(pipeline.summary());
            }
            if full || self.ended {
                pipeline.wait(&mut postprocess)?;
            }
        }
    }

    /// The stager and the file back.
    pub fn into_parts(self) -> (Stager, File) {
        (self.stager, self.file)
    }
}

/// Results written to a file from the pipeline's host result buffers: result `i` (the `i`th
/// written) at `i × result bytes` (see the [module docs](super)).
#[derive(Debug)]
pub struct FrameSink {
    stager: Stager,
    file: File,
    next: u64,
}

impl FrameSink {
    /// Writes results to `file` (made with [`File::create`]) with `stager`, made over the
    /// pipeline's pool ([`Pipeline::pool`]).
    ///
    /// # Errors
    /// [`Error::ReadOnly`].
    pub fn new(stager: Stager, file: File) -> Result<FrameSink, Error> {
        if !file.is_writable() {
            return Err(Error::ReadOnly {
                path: file.path().to_owned(),
            });
        }
        Ok(FrameSink {
            stager,
            file,
            next: 0,
        })
    }

    /// Results written so far.
    pub fn written(&self) -> u64 {
        self.next
    }

    /// The file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Writes `output` (from postprocess) as the next result, straight from the slot's host
    /// result buffer, and returns its index. Every result of a pipeline has the model's result
    /// size, so result `i` lies at `i × output.len()`.
    ///
    /// A result read in place from device memory ([`Output::in_place`]) has no host buffer to
    /// write from: it is refused ([`Error::InPlaceResult`]) rather than copied; build the
    /// pipeline with [`Results::Copy`](crate::pipeline::Results::Copy) to write results out.
    ///
    /// # Errors
    /// [`Error::InPlaceResult`]; [`Error::Misaligned`] when the file is written with direct
    /// I/O and the result size is not aligned; [`Error::NotRegistered`] when the stager is not
    /// over the pipeline's pool; [`Error::ShortWrite`]; [`Error::Io`].
    pub fn write(&mut self, output: &Output<'_>) -> Result<u64, Error> {
        let Some(buffer) = output.host_buffer() else {
            return Err(Error::InPlaceResult {
                path: self.file.path().to_owned(),
            });
        };
        let len = output.len();
        let offset = frame_offset(self.next, len)?;
        let transfer = self.stager.write_lent(&self.file, offset, buffer, len)?;
        if transfer.is_short() {
            return Err(Error::ShortWrite {
                path: self.file.path().to_owned(),
                offset,
                wanted: len,
                got: transfer.bytes,
            });
        }
        let index = self.next;
        self.next += 1;
        Ok(index)
    }

    /// The stager and the file back.
    pub fn into_parts(self) -> (Stager, File) {
        (self.stager, self.file)
    }
}

/// Refuses a frame size no frame can be read with.
fn check_frame(file: &File, frame_bytes: usize) -> Result<(), Error> {
    if frame_bytes == 0 {
        return Err(Error::Empty);
    }
    if file.mode() == Mode::Direct {
        // Frame offsets are multiples of the frame size: an aligned size aligns them all.
        // (The buffer's address is checked per read.)
        file.check(0, frame_bytes, 0)?;
    }
    Ok(())
}

/// The file offset of frame `index`.
fn frame_offset(index: u64, frame_bytes: usize) -> Result<u64, Error> {
    index
        .checked_mul(frame_bytes as u64)
        .filter(|&o| o <= i64::MAX as u64)
        .ok_or(Error::Offset {
            offset: u64::MAX,
            len: frame_bytes,
        })
}
