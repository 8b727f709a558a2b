//! The naive path, to compare the pipeline against in the same run: what a driver does when
//! nothing is kept between frames. Per frame it allocates the host input and result on the
//! heap, maps fresh memory into the device's DMA space for each (the mapping a driver must
//! make before the device may touch new memory), copies the input through the heap buffer into
//! the mapping, runs the frame synchronously (depth 1) in a fresh device arena, copies the
//! result out through another heap buffer, and unmaps and frees everything.
//!
//! Same model, same descriptors, same checks as [`Pipeline`](super::Pipeline).

use std::time::{Duration, Instant};

use super::descriptor::{self, step_name};
use super::{Error, FrameError, Model, Summary, Times};
use crate::accel::{self, HostSpan};
use userdma::device::Wait;
use userdma::dma::{Iova, Mapping};
use userdma::memory::PageSize;
use userdma::ring;
use userdma::Runtime;
use userdma_loopback::{LoopbackRuntime, StatusCode};

/// Runs `frames` frames of `model` the naive way on `runtime`'s device (queue `queue`),
/// calling `preprocess` to fill each frame's heap input and `postprocess` with each frame's
/// heap result (or its [`FrameError`]) and times.
///
/// # Errors
/// Mapping, device-memory and ring errors; a frame that does not complete within `timeout`.
pub fn run(
    runtime: &Runtime,
    model: &Model,
    queue: u16,
    frames: u64,
    timeout: Duration,
    mut preprocess: impl FnMut(u64, &mut [u8]),
    mut postprocess: impl FnMut(u64, Result<&[u8], FrameError>, Times),
) -> Result<Summary, crate::Error> {
    let mut naive = Naive::new(runtime, model.clone(), queue, 0, timeout)?;
    for frame in 0..frames {
        naive.frame(frame, &mut preprocess, &mut postprocess)?;
    }
    naive.shutdown()
}

/// The naive path one frame at a time, on one queue in one device context: what a scheduler
/// of several naive streams drives.
pub struct Naive {
    runtime: Runtime,
    model: Model,
    queue: ring::Queue<ring::Command, ring::Status, u16>,
    context: u32,
    timeout: Duration,
    summary: Summary,
}

impl std::fmt::Debug for Naive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Naive")
            .field("model", &self.model)
            .field("context", &self.context)
            .field("summary", &self.summary)
            .finish()
    }
}

impl Naive {
    /// Opens queue `queue` of `runtime`'s device in device context `context` for `model`'s
    /// frames.
    ///
    /// # Errors
    /// Ring and device errors (the queue does not exist or is taken).
    pub fn new(
        runtime: &Runtime,
        model: Model,
        queue: u16,
        context: u32,
        timeout: Duration,
    ) -> Result<Naive, crate::Error> {
        let per_frame = model.steps().len() + 2;
        let depth = u32::try_from((2 * per_frame).next_power_of_two()).unwrap_or(u32::MAX);
        let queue = runtime.queue_with::<u16>(
            ring::Config::new(depth)
                .with_id(queue)
                .with_context(context),
            Wait::Interrupt,
        )?;
        Ok(Naive {
            runtime: runtime.clone(),
            model,
            queue,
            context,
            timeout,
            summary: Summary::default(),
        })
    }

    /// What it has done so far.
    pub fn summary(&self) -> Summary {
        self.summary
    }

    /// Runs frame `frame` synchronously: a heap input filled by `preprocess`, fresh mappings,
    /// a fresh device arena, the result copied out to the heap for `postprocess`, everything
    /// unmapped and freed again.
    ///
    /// # Errors
    /// Mapping, device-memory and ring errors; a frame that does not complete in time.
    pub fn frame(
        &mut self,
        frame: u64,
        preprocess: &mut impl FnMut(u64, &mut [u8]),
        postprocess: &mut impl FnMut(u64, Result<&[u8], FrameError>, Times),
    ) -> Result<(), crate::Error> {
        let (model, runtime, timeout) = (&self.model, &self.runtime, self.timeout);
        let per_frame = model.steps().len() + 2;
        let memory = runtime.device_memory()?;
        let (input, result) = (model.input(), model.result());
        let summary = &mut self.summary;
        let q = &mut self.queue;
        let began = Instant::now();
        // Fresh DMA-able memory: mapped now, unmapped when dropped at the end of the frame
        // (refused, before anything else, if the host has not that much available).
        let in_map = runtime.map_memory(input.bytes as usize, PageSize::Base)?;
        let out_map = runtime.map_memory(result.bytes as usize, PageSize::Base)?;
        // A fresh heap buffer for the frame, filled by preprocessing.
        let mut host_input = userdma::memory::zeroed(input.bytes, "a frame's input")?;
        preprocess(frame, &mut host_input);
        in_map.slice().write_from(0, &host_input)?;
        let arena = memory.alloc(model.arena_bytes(), 256)?;
        let base = arena.offset();
        let (in_iova, out_iova) = (
            first_iova(&in_map, "input")?,
            first_iova(&out_map, "result")?,
        );
        let spans = (
            HostSpan {
                iova: in_iova,
                ptr: in_map.slice().as_ptr(),
                len: input.bytes,
            },
            HostSpan {
                iova: out_iova,
                ptr: out_map.slice().as_ptr(),
                len: result.bytes,
            },
        );
        for k in 0..per_frame {
            let op = descriptor::op_at(model, base.raw(), spans.0, spans.1, k);
            let command = ring::Command {
                context: self.context,
                ..accel::loopback::descriptor(&op, &[]).build()
            };
            q.push(command, k as u16)?;
        }
        q.flush()?;
        let submitted = Instant::now();
        summary.doorbells += 1;
        summary.bytes_to_device += input.bytes;
        let mut error = None;
        let mut times = Times {
            preprocess: began,
            submitted,
            to_device: submitted,
            computed: submitted,
            to_host: submitted,
        };
        for _ in 0..per_frame {
            let done = q.wait(Some(timeout))?;
            let now = Instant::now();
            let step = done.payload;
            match usize::from(step) {
                0 => times.to_device = now,
                s if s == model.steps().len() => times.computed = now,
                _ => {}
            }
            let code = done.entry.code();
            if code != StatusCode::Success as u16 && error.is_none() {
                error = Some(FrameError {
                    frame,
                    queue: q.id(),
                    command: done.id,
                    step,
                    what: step_name(step, model.steps().len()),
                    code: u32::from(code),
                    status: StatusCode::from_raw(code).map_or("unknown", StatusCode::name),
                    result: done.entry.result,
                });
            }
        }
        times.to_host = Instant::now();
        // Copied out through a heap buffer, as a driver returning results by value does.
        let mut host_result = userdma::memory::zeroed(result.bytes, "a frame's result")?;
        out_map.slice().read_into(0, &mut host_result)?;
        summary.frames += 1;
        match error {
            Some(e) => {
                summary.failed += 1;
                postprocess(frame, Err(e), times);
            }
            None => {
                summary.bytes_to_host += result.bytes;
                postprocess(frame, Ok(&host_result), times);
            }
        }
        drop(arena);
        drop(in_map);
        drop(out_map);
        Ok(())
    }

    /// Stops the queue.
    ///
    /// # Errors
    /// Ring errors.
    pub fn shutdown(self) -> Result<Summary, crate::Error> {
        let Naive {
            queue,
            timeout,
            summary,
            ..
        } = self;
        queue.shutdown(timeout)?;
        Ok(summary)
    }
}

/// The IOVA of the first byte of the mapping of a frame's `what` (input or result).
fn first_iova(mapping: &Mapping, what: &'static str) -> Result<Iova, Error> {
    mapping.iova(0).ok_or(Error::EmptyMapping { what })
}
