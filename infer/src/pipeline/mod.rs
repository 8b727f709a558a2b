//! The inference pipeline: frames through preprocess → H2D → the model's device steps → D2H
//! of the result → postprocess, over a ring of `depth` preallocated slots, on any device that
//! implements [`Accelerator`] (the loopback NPU, a host-memory engine, a PCI device's engine,
//! an engine written in C); steps the device cannot run run on the host ([`Pipeline::compute`]).
//!
//! Everything a frame needs is taken once, when the [`Pipeline`] is built: per slot a host
//! input buffer and a host result buffer from a pool mapped into the device once, and the
//! model's planned arena (in device memory, or host memory where the device has none). A frame then costs no allocation and no DMA
//! mapping: preprocessing writes straight into the slot's DMA buffer (no intermediate host
//! copy), intermediate tensors never leave the device, and only the result comes back.
//!
//! **Ownership.** A slot is the device's from its frame's first op until the frame's last
//! completion came back (ops complete in order on a queue): the pipeline hands only free slots
//! to preprocessing and postprocessing reads a slot only once its frame is done, so nothing on
//! the host touches memory the device may still read or write. After a fault a slot is free
//! again only once every queue was shut down (the device touches none of them); a queue that
//! cannot be stopped leaves its slots leaked with the pipeline, never reused.
//!
//! **Back-pressure.** With all `depth` slots in flight, [`Pipeline::try_submit`] returns
//! `Ok(None)` (the caller's choice what to do); [`Pipeline::run`] waits for the oldest frame.
//! Results come out in frame order. A frame whose descriptor fails is reported with its frame
//! number, the step and the device's code, and the frames after it go on. [`Pipeline::shutdown`]
//! drains what is in flight and returns every buffer to the pool.
//!
//! **Faults.** A device that stops answering makes [`Pipeline::wait`] fail with a timeout
//! (naming the queue and the oldest command in flight); a device that breaks the queue
//! protocol makes it fail with a ring error; a removed device with
//! [`ring::Error::Removed`]. [`Pipeline::recover`] then resets the device (which stops every
//! queue: from then on the device touches none of the slots), takes every slot back from the
//! queues, hands the frames that did finish to postprocessing, reports the frames that were
//! lost ([`Recovery::lost`]: run them again), and opens the queues again, so the next frame
//! goes through as the first did. On a removed device it only takes the slots back: the
//! pipeline then refuses new frames with [`Code::Removed`](userdma::Code::Removed).
//!
//! Depth 1 is synchronous; depth 2 double buffering (the host prepares frame i+1 while the
//! device runs frame i); deeper rings absorb jitter. [`naive`] is the per-frame-allocation
//! path to compare against, in the same run.
//!
//! | module | owns |
//! |---|---|
//! | this one | [`Pipeline`] (its state and what it tells), [`Summary`] |
//! | `config` | how a pipeline is built: [`Config`], [`WorkingSet`], [`Results`], [`ResultPath`] |
//! | `frame` | a frame as pre- and postprocessing see it: [`Input`], [`Output`], [`Times`], [`Finished`], [`FrameError`] |
//! | `setup` | [`Pipeline::new`]: queues, slots, arenas, the result path measured |
//! | `run` | the frame loop: [`Pipeline::try_submit`], [`Pipeline::flush`], [`Pipeline::poll`], [`Pipeline::wait`], [`Pipeline::run`], [`Pipeline::shutdown`] |
//! | `recovery` | after a fault: [`Pipeline::recover`], [`Pipeline::reclaim`], [`Recovery`] |
//! | `descriptor` | a frame's ops, built from the model and a slot, and their tags |
//! | `error` | [`Error`] |
//! | [`model`] | [`Model`]: the arena, the input, the result and the device steps |
//! | [`naive`] | the per-frame-allocation path to compare against |
//! | [`zoo`] | model graphs with real shapes, for the demo and the benchmarks |

mod config;
mod descriptor;
mod error;
mod fences;
mod frame;
pub mod model;
pub mod naive;
mod recovery;
mod run;
mod setup;
pub mod zoo;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

pub use self::config::{Config, ResultPath, Results, WorkingSet};
pub use self::error::Error;
pub use self::frame::{Finished, FrameError, Input, Output, Times};
pub use self::recovery::Recovery;
pub use model::{Filter, Model, ModelError, Span, Step};

use crate::accel::{self, Accelerator, Arena, ComputeAt, QueueSpec};
use userdma::pool::{OwnedBuffer, Pool};
use userdma::ring;

/// The most slots a pipeline takes ([`Config::depth`]).
const MAX_DEPTH: usize = 1024;

/// What a run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Summary {
    /// Frames finished.
    pub frames: u64,
    /// Frames the device failed.
    pub failed: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// Bytes copied to the device.
    pub bytes_to_device: u64,
    /// Bytes of results brought back to the host (copied, or read in place).
    pub bytes_to_host: u64,
    /// Model steps run on the host, for a device that could not run them
    /// ([`Pipeline::compute`]).
    pub host_steps: u64,
}

/// A slot: the frame's host buffers and its arena (its address as the device's ops name it).
#[derive(Debug)]
struct Slot {
    input: OwnedBuffer,
    result: OwnedBuffer,
    arena: u64,
}

/// Per slot, what the frame in it has done so far.
#[derive(Debug, Clone, Copy)]
struct Progress {
    frame: u64,
    error: Option<FrameError>,
    times: Times,
    /// Completions of the frame not yet seen.
    outstanding: u32,
    /// The frame's input and result are the caller's host memory rather than the slot's
    /// buffers ([`Pipeline::try_submit_spans`]).
    spans: Option<(accel::HostSpan, accel::HostSpan)>,
}

/// A queue of the pipeline, as opened (to open it again after a reset).
#[derive(Debug, Clone, Copy)]
struct Opened {
    spec: QueueSpec,
    /// The compute queue gets the model's working set declared.
    steps_here: bool,
}

/// Which queue of a split pipeline a descriptor goes to.
const H2D: usize = 0;
const COMPUTE: usize = 1;
const D2H: usize = 2;

/// An N-deep inference pipeline on any [`Accelerator`]: over one hardware queue, or three on
/// a device with separate copy and compute units (H2D and D2H on the copy unit, the model's
/// steps on the compute unit, ordered by [`accel::Op::After`]) so the device copies one frame
/// while it computes another. Steps the device cannot run run on the host
/// ([`Pipeline::compute`]).
pub struct Pipeline {
    model: Model,
    config: Config,
    /// One queue, or [`H2D`], [`COMPUTE`], [`D2H`]; none once the device was removed.
    queues: Vec<Box<dyn accel::Queue>>,
    /// How each queue was opened, for [`Pipeline::recover`].
    specs: Vec<Opened>,
    /// Per queue: ops pushed since it was opened.
    pushed: Vec<u64>,
    /// Every slot, by index; the slots free to take, in order.
    slots: Vec<Slot>,
    free: VecDeque<usize>,
    /// Per slot: its frame is in flight (the device may touch its buffers).
    busy: Vec<bool>,
    /// Per slot: its last completion came back while other completions of its frame were
    /// still unseen, or its frame is not the next to deliver.
    held: Vec<bool>,
    progress: Vec<Progress>,
    next_frame: u64,
    /// The next frame to hand to postprocessing.
    next_out: u64,
    /// Fences handed out for frames ([`Pipeline::fence`]); none until one is asked for.
    fences: Option<userdma::fence::Timeline>,
    /// Where its ops and frames are recorded ([`Pipeline::set_trace`]); none by default.
    trace: Option<Traced>,
    /// Frames pushed but not yet announced.
    unannounced: usize,
    /// Slots of frames pushed since the last doorbell.
    pending: Vec<usize>,
    summary: Summary,
    in_flight: usize,
    /// How results come back.
    path: ResultPath,
    /// Where the model's steps run, and how many of a frame's run on the host.
    compute: ComputeAt,
    host_steps: u64,
    /// The device.
    device: Arc<dyn Accelerator>,
    /// A queue could not be stopped: the slots in flight are never freed (dropped with the
    /// pipeline by leaking them), since the device may still write them.
    leaked: bool,
    // Held for the pipeline's life: the pool the slots' buffers come from and the arenas.
    pool: Arc<Pool>,
    arenas: Vec<Arena>,
}

/// A pipeline's trace, and how the trace names its device and stream.
#[derive(Debug)]
struct Traced {
    trace: Arc<crate::trace::Trace>,
    device: u16,
    stream: u32,
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // The queues stop first (a queue dropped with work in flight stops its device's side
        // of it), then the slots and arenas go back, unless a queue could not be stopped.
        self.queues.clear();
        if self.leaked {
            std::mem::forget(std::mem::take(&mut self.slots));
            std::mem::forget(std::mem::take(&mut self.arenas));
        }
    }
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("model", &self.model)
            .field("config", &self.config)
            .field("in_flight", &self.in_flight)
            .field("next_frame", &self.next_frame)
            .finish()
    }
}

impl Pipeline {
    /// Records this pipeline's ops and frames into `trace` as stream `stream` (a number from
    /// [`Trace::stream`](crate::trace::Trace::stream)): registers its device (which is asked
    /// to keep activity records), its queues and its pool. Recording allocates nothing.
    pub fn set_trace(&mut self, trace: Arc<crate::trace::Trace>, stream: u32) {
        let device = trace.device(&self.device);
        for opened in &self.specs {
            trace.queue(device, opened.spec);
        }
        trace.pool(&self.pool);
        self.trace = Some(Traced {
            trace,
            device,
            stream,
        });
    }

    /// Stops recording into a trace.
    pub fn clear_trace(&mut self) {
        self.trace = None;
    }

    /// The model it runs.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The pool the slots' host buffers come from: a [`Stager`](crate::stage::Stager) made
    /// over it reads frames into the input slots and writes results from the result buffers
    /// ([`FrameSource`](crate::stage::FrameSource), [`FrameSink`](crate::stage::FrameSink)).
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// How it was built.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// How results come back (and, with [`Results::Auto`], what was measured to choose).
    pub fn result_path(&self) -> ResultPath {
        self.path
    }

    /// Frames in flight (submitted, not yet handed to postprocessing).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The device it runs on (pipelines on one device share its engine; a driver of several
    /// devices groups them by [`Accelerator::key`]).
    pub fn device(&self) -> &Arc<dyn Accelerator> {
        &self.device
    }

    /// Where the model's steps run: on the device, on the host (a device without a compute
    /// unit: every step runs on the host between the device's transfers), or some of each.
    pub fn compute(&self) -> ComputeAt {
        self.compute
    }

    /// The interrupt of the queue a frame's last completion arrives on, to sleep on several
    /// pipelines at once with an [`userdma::irq::Waiter`] and [`ring::wait_any`] over
    /// [`Pipeline::waitable`]; `None` when the device gave the queue no interrupt.
    pub fn interrupt(&self) -> Option<&userdma::irq::EventFd> {
        self.queues.last().and_then(|q| q.interrupt())
    }

    /// The queue a frame's last completion arrives on, for [`ring::wait_any`]. Once it is
    /// ready, [`Pipeline::poll`] hands over what finished (a frame may still need a moment
    /// for its other completions: [`Pipeline::wait`] covers that).
    /// `None` once the device was removed and the pipeline recovered (it has no queues), for a
    /// queue without an interrupt, and while the host has work to do for it (a step run on
    /// the host): poll then instead of sleeping.
    pub fn waitable(&mut self) -> Option<&mut dyn ring::Waitable> {
        self.queues.last_mut().and_then(|q| q.waitable())
    }

    /// The error [`Pipeline::wait`] ends with when nothing finished for `waited` (the device
    /// stopped answering), for a driver that sleeps on several pipelines at once and keeps the
    /// deadline ([`Config::timeout`]) itself; [`userdma::Error::Device`] (removed) for a pipeline
    /// without queues.
    pub fn overdue(&self, waited: Duration) -> crate::Error {
        match self.queues.last() {
            Some(queue) => queue.overdue(waited),
            None => self.removed(),
        }
    }

    /// Whether a frame's last completion is in but the frame is not handed over yet (another
    /// of its completions is moments away, or an earlier frame is still out): a driver that
    /// sleeps on [`Pipeline::waitable`] polls again instead of sleeping.
    pub fn finishing(&self) -> bool {
        self.held.iter().any(|&h| h)
    }

    /// What it has done so far.
    pub fn summary(&self) -> Summary {
        self.summary
    }
}
