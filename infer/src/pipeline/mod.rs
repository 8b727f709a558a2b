//! The inference pipeline: frames through preprocess → H2D → the model's device steps → D2H
//! of the result → postprocess, over a ring of `depth` preallocated slots.
//!
//! Everything a frame needs is taken once, when the [`Pipeline`] is built: per slot a host
//! input buffer and a host result buffer from a pool mapped into the device once, and the
//! model's planned arena in device memory. A frame then costs no allocation and no DMA
//! mapping: preprocessing writes straight into the slot's DMA buffer (no intermediate host
//! copy), intermediate tensors never leave the device, and only the result comes back.
//!
//! **Ownership.** A slot's buffers travel as the payload of its frame's last descriptor: while
//! the frame is in flight the slot is in the queue's hands, not the pipeline's, so nothing on
//! the host can touch memory the device may still read or write; the slot comes back with the
//! last completion (descriptors complete in order on a queue) and only then is it reused.
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

mod error;
pub mod model;
pub mod naive;
pub mod zoo;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use self::error::Error;
pub use model::{Filter, Model, ModelError, Span, Step};

use userdma::device::{Device, Range, Wait};
use userdma::dma::{DeviceOffset, Iova};
use userdma::memory::PageSize;
use userdma::pool::{OwnedBuffer, Pool};
use userdma::ring::{self, Command};
use userdma::Runtime;
use userdma_loopback::LoopbackRuntime as _;
use userdma_loopback::LoopbackStatus as _;
use userdma_loopback::{self as loopback, Descriptor, Loopback, StatusCode};

/// The most slots a pipeline takes ([`Config::depth`]).
const MAX_DEPTH: usize = 1024;

/// How a pipeline is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Slots in the ring: frames in flight at most (1 = synchronous, 2 = double buffering;
    /// at most 1024).
    pub depth: usize,
    /// Frames per doorbell: the descriptors of this many frames are announced together.
    pub batch: usize,
    /// The hardware queue to use.
    pub queue: u16,
    /// Completions by interrupt or by polling.
    pub wait: Wait,
    /// How long a frame may take before [`Pipeline::run`] gives up with an error.
    pub timeout: Duration,
    /// Three queues on the loopback device's two units (H2D and D2H on the copy engine, the
    /// model's steps on the compute unit, ordered by `Wait` descriptors), so copying and
    /// computing overlap on the device; `false`: every descriptor on one queue, in order.
    pub split: bool,
    /// How results come back: a D2H copy, read in place through the device-memory BAR, or
    /// whichever measured faster for the model's result size when the pipeline was built.
    pub results: Results,
    /// The device context of its queues (two pipelines in different contexts make the
    /// device switch between them; the cost model charges it).
    pub context: u32,
    /// The working set its context keeps in device SRAM (see
    /// [`Loopback::set_working_set`]), declared on the queue that runs the model's steps;
    /// `None` declares nothing.
    pub working_set: Option<WorkingSet>,
}

/// A context's working set in device SRAM: see [`Loopback::set_working_set`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct WorkingSet {
    /// Bytes of its own (hot activations).
    pub private: u64,
    /// Bytes shared with the contexts of the same `key` (the weights of one model).
    pub shared: u64,
    /// The share key (0: nothing shared).
    pub key: u32,
}

/// How a frame's result reaches the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum Results {
    /// A D2H copy into the slot's host result buffer, read there.
    Copy,
    /// Read in place from device memory through the mapped BAR: no D2H descriptor, but every
    /// 8 bytes is a PCIe round trip for the reading CPU. Pays for small results (a class, a
    /// score, a count).
    InPlace,
    /// Measure both for the model's result size when the pipeline is built (a D2H round trip
    /// and an in-place read, the best of a few of each) and use the faster.
    #[default]
    Auto,
}

/// How results come back in a built pipeline, and what was measured to choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ResultPath {
    /// Read in place through the BAR (`false`: D2H copies).
    pub in_place: bool,
    /// With [`Results::Auto`]: the best measured D2H round trip of the result, in ns.
    pub copy_ns: Option<u64>,
    /// With [`Results::Auto`]: the best measured in-place read of the result, in ns.
    pub in_place_ns: Option<u64>,
}

impl Default for Config {
    /// Depth 2, one doorbell per queue per frame, queues 0 to 2 split across the units,
    /// interrupts, 10 s, results by measurement.
    fn default() -> Self {
        Config {
            depth: 2,
            batch: 1,
            queue: 0,
            wait: Wait::Interrupt,
            timeout: Duration::from_secs(10),
            split: true,
            results: Results::Auto,
            context: 0,
            working_set: None,
        }
    }
}

/// Why a frame failed on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "frame {frame}: step {step} ({what}), command id {command} on queue {queue}, failed on the device with {code:?} (result {result:#x})"
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
    /// The device's completion code.
    pub code: StatusCode,
    /// The completion's result field (an address or offset for range errors).
    pub result: u64,
}

/// The slot's host input buffer, for preprocessing to write the frame into.
#[derive(Debug)]
pub struct Input<'a> {
    buffer: &'a OwnedBuffer,
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
    source: Source<'a>,
}

#[derive(Debug)]
enum Source<'a> {
    Host(&'a OwnedBuffer),
    Device {
        device: &'a Loopback,
        offset: usize,
        len: usize,
    },
}

impl Output<'_> {
    /// The result's length in bytes.
    pub fn len(&self) -> usize {
        match self.source {
            Source::Host(buffer) => buffer.len(),
            Source::Device { len, .. } => len,
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

    /// The slot's host result buffer (`None` for a result read in place), for a
    /// [`FrameSink`](crate::stage::FrameSink) to write from.
    pub(crate) fn host_buffer(&self) -> Option<&OwnedBuffer> {
        match self.source {
            Source::Host(buffer) => Some(buffer),
            Source::Device { .. } => None,
        }
    }

    /// Reads `dst.len()` bytes at `offset` of the result.
    ///
    /// # Errors
    /// [`userdma::Error::Pool`] (a host result) or [`Error::OutsideResult`] (in place) if the
    /// range leaves the result.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), crate::Error> {
        match self.source {
            Source::Host(buffer) => Ok(buffer.read(offset, dst)?),
            Source::Device {
                device,
                offset: base,
                len,
            } => {
                if offset.checked_add(dst.len()).is_none_or(|end| end > len) {
                    return Err(Error::OutsideResult {
                        offset,
                        len: dst.len(),
                        size: len,
                    }
                    .into());
                }
                Ok(device.read_device_memory(base + offset, dst)?)
            }
        }
    }
}

/// When each part of a frame happened, as the host saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Times {
    /// Preprocessing began.
    pub preprocess: Instant,
    /// The frame's descriptors were announced (its doorbell, or its batch's).
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

/// A slot: the frame's host buffers and its device arena.
#[derive(Debug)]
struct Slot {
    index: usize,
    input: OwnedBuffer,
    result: OwnedBuffer,
    arena: DeviceOffset,
}

/// A descriptor's payload: the frame's earlier descriptors carry its slot and step, the
/// D2H copy the slot itself.
#[derive(Debug)]
enum Payload {
    Step { slot: usize, step: u16 },
    Last { slot: Slot, step: u16 },
}

/// One entry of a frame's descriptor plan in [`Pipeline::try_submit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Descriptor `k` of the frame (0 the H2D copy, `steps + 1` the D2H copy).
    Step(usize),
    /// Every model step, 1 to `steps`.
    Steps,
    /// A `Wait` until everything pushed to that queue so far has completed.
    WaitOn(usize),
}

/// The step number of a `Wait` descriptor (for error messages).
const WAIT_STEP: u16 = u16::MAX;

/// Per slot, what the frame in it has done so far.
#[derive(Debug, Clone, Copy)]
struct Progress {
    frame: u64,
    error: Option<FrameError>,
    times: Times,
    /// Completions of the frame not yet seen.
    outstanding: u32,
}

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
}

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

/// A queue of the pipeline, as opened (to open it again after a reset).
#[derive(Debug, Clone, Copy)]
struct QueueSpec {
    config: ring::Config,
    unit: loopback::Unit,
    /// The compute queue gets the model's working set declared.
    steps_here: bool,
}

/// Which queue of a split pipeline a descriptor goes to.
const H2D: usize = 0;
const COMPUTE: usize = 1;
const D2H: usize = 2;

/// An N-deep inference pipeline over one hardware queue, or three on the loopback device's
/// two units (H2D and D2H on the copy engine, the model's steps on the compute unit, ordered
/// by `Wait` descriptors) so the device copies one frame while it computes another.
pub struct Pipeline {
    model: Model,
    config: Config,
    /// One queue, or [`H2D`], [`COMPUTE`], [`D2H`]; none once the device was removed.
    queues: Vec<loopback::Queue<Payload>>,
    /// How each queue was opened, for [`Pipeline::recover`].
    specs: Vec<QueueSpec>,
    /// Per queue: its completed counter when the pipeline began, and descriptors pushed since.
    base: Vec<u64>,
    pushed: Vec<u64>,
    free: VecDeque<Slot>,
    /// Per slot: a slot whose D2H came back while other completions of its frame were still
    /// unseen, or whose frame is not the next to deliver.
    held: Vec<Option<Slot>>,
    progress: Vec<Progress>,
    next_frame: u64,
    /// The next frame to hand to postprocessing.
    next_out: u64,
    /// Frames pushed but not yet announced.
    unannounced: usize,
    /// Slots of frames pushed since the last doorbell.
    pending: Vec<usize>,
    summary: Summary,
    in_flight: usize,
    /// How results come back.
    path: ResultPath,
    /// The device, for reading results in place.
    device: Arc<Loopback>,
    // Held for the pipeline's life: the pool the slots' buffers come from and the device
    // ranges of the arenas (dropped after the queues, which may hold slots).
    pool: Arc<Pool>,
    _arenas: Vec<Range>,
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

/// What descriptor `step` of a frame is, for error messages.
fn step_name(step: u16, steps: usize) -> &'static str {
    match usize::from(step) {
        0 => "H2D copy of the input",
        _ if step == WAIT_STEP => "wait for the other unit",
        s if s <= steps => "model step",
        _ => "D2H copy of the result",
    }
}

impl Pipeline {
    /// Builds a pipeline on `runtime`'s device for `model`: `config.depth` slots (host buffers
    /// from one pool mapped once, one device arena each) and its queue(s) deep enough for
    /// every slot's descriptors: queue `config.queue`, and with `config.split` also the next
    /// two.
    ///
    /// # Errors
    /// [`userdma::Error::Unsupported`] for a device without the loopback descriptor format or
    /// device memory; [`userdma::Error::Device`] if device memory cannot hold `depth` arenas
    /// (lower the depth) or the queues do not exist; [`userdma::Error::Pool`] /
    /// [`userdma::Error::Memory`] for the host buffers; [`crate::Error::Pipeline`] for a depth
    /// or batch out of range ([`Error::Depth`]), queues past the last id ([`Error::Queues`])
    /// or host buffers too large for the address space ([`Error::HostBuffers`]).
    pub fn new(runtime: &Runtime, model: Model, config: Config) -> Result<Pipeline, crate::Error> {
        if config.depth == 0 || config.batch == 0 || config.depth > MAX_DEPTH {
            return Err(Error::Depth {
                depth: config.depth,
                batch: config.batch,
            }
            .into());
        }
        let per_frame = model.steps().len() + 4;
        // Twice what the slots need: the SQ head the device writes back lags its completions
        // by up to a burst.
        let descriptors = (2 * config.depth * per_frame).next_power_of_two().max(2);
        let ring_depth = u32::try_from(descriptors).unwrap_or(u32::MAX);
        let units: &[loopback::Unit] = if config.split {
            &[
                loopback::Unit::Copy,
                loopback::Unit::Compute,
                loopback::Unit::Copy,
            ]
        } else {
            &[loopback::Unit::Copy]
        };
        let device = runtime
            .loopback_device()
            .ok_or_else(|| userdma::Error::Unsupported {
                device: runtime.device().identity().to_string(),
                what: "loopback descriptor format",
                hint: "the pipeline runs the loopback device's layer ops; use Runtime::loopback",
            })?;
        let counters = device.counters()?;
        let mut queues = Vec::with_capacity(units.len());
        let mut specs = Vec::with_capacity(units.len());
        let mut base = Vec::with_capacity(units.len());
        for (k, &unit) in units.iter().enumerate() {
            let id = config.queue.checked_add(k as u16).ok_or(Error::Queues {
                queue: config.queue,
                after: units.len() - 1,
            })?;
            let steps_here = if config.split { k == COMPUTE } else { k == 0 };
            if let (true, Some(ws)) = (steps_here, config.working_set) {
                device.set_working_set(id, ws.private, ws.shared, ws.key)?;
            }
            let ring_config = ring::Config::new(ring_depth)
                .with_id(id)
                .with_context(config.context);
            queues.push(runtime.queue_on::<Payload>(ring_config, config.wait, unit)?);
            specs.push(QueueSpec {
                config: ring_config,
                unit,
                steps_here,
            });
            base.push(
                counters
                    .queues
                    .get(usize::from(id))
                    .map_or(0, |q| q.completed),
            );
        }
        let (input_bytes, result_bytes) = (model.input().bytes, model.result().bytes);
        let per_slot = input_bytes.div_ceil(4096) * 4096 + result_bytes.div_ceil(4096) * 4096;
        // Room for the pool's alignment of its first chunk and for blocks rounded up to
        // powers of two: twice the buffers, plus 4 MiB.
        let pool_bytes = per_slot
            .checked_mul(2 * config.depth as u64)
            .and_then(|b| b.checked_add(4 << 20))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or(Error::HostBuffers {
                depth: config.depth,
                slot_bytes: per_slot,
            })?;
        let pool = runtime.pool(pool_bytes, PageSize::Base)?;
        let memory = runtime.device_memory()?;
        let mut free = VecDeque::with_capacity(config.depth);
        let mut arenas = Vec::with_capacity(config.depth);
        for index in 0..config.depth {
            let arena = memory.alloc(model.arena_bytes(), 256)?;
            let slot = Slot {
                index,
                input: pool.alloc_owned(input_bytes as usize)?,
                result: pool.alloc_owned(result_bytes as usize)?,
                arena: arena.offset(),
            };
            arenas.push(arena);
            free.push_back(slot);
        }
        let device = Arc::clone(device);
        let mut pushed = vec![0; queues.len()];
        let path = match config.results {
            Results::Copy => ResultPath {
                in_place: false,
                copy_ns: None,
                in_place_ns: None,
            },
            Results::InPlace => ResultPath {
                in_place: true,
                copy_ns: None,
                in_place_ns: None,
            },
            Results::Auto => {
                let slot = free.front().expect("depth >= 1");
                let d2h = queues.len() - 1;
                measure_result_paths(
                    &model,
                    slot,
                    &device,
                    &mut queues[d2h],
                    &mut pushed[d2h],
                    &config,
                )?
            }
        };
        if path.in_place && config.split {
            // The D2H queue is not used: results are read where the compute unit wrote them.
            queues.truncate(2);
            specs.truncate(2);
            base.truncate(2);
            pushed.truncate(2);
        }
        let now = Instant::now();
        let times = Times {
            preprocess: now,
            submitted: now,
            to_device: now,
            computed: now,
            to_host: now,
        };
        Ok(Pipeline {
            progress: vec![
                Progress {
                    frame: 0,
                    error: None,
                    times,
                    outstanding: 0,
                };
                config.depth
            ],
            held: (0..config.depth).map(|_| None).collect(),
            pending: Vec::with_capacity(config.depth),
            model,
            config,
            queues,
            specs,
            base,
            pushed,
            free,
            next_frame: 0,
            next_out: 0,
            unannounced: 0,
            summary: Summary::default(),
            in_flight: 0,
            path,
            device,
            pool,
            _arenas: arenas,
        })
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
    /// devices groups them by it).
    pub fn device(&self) -> &Arc<Loopback> {
        &self.device
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
    /// `None` once the device was removed and the pipeline recovered (it has no queues).
    pub fn waitable(&mut self) -> Option<&mut dyn ring::Waitable> {
        self.queues.last_mut().map(|q| q as &mut dyn ring::Waitable)
    }

    /// The error [`Pipeline::wait`] ends with when nothing finished for `waited` (the device
    /// stopped answering), for a driver that sleeps on several pipelines at once and keeps the
    /// deadline ([`Config::timeout`]) itself; [`userdma::Error::Device`] (removed) for a pipeline
    /// without queues.
    pub fn overdue(&self, waited: Duration) -> crate::Error {
        match self.queues.last() {
            Some(queue) => crate::Error::from(queue.overdue(waited)),
            None => self.removed(),
        }
    }

    /// Whether a frame's last completion is in but the frame is not handed over yet (another
    /// of its completions is moments away, or an earlier frame is still out): a driver that
    /// sleeps on [`Pipeline::waitable`] polls again instead of sleeping.
    pub fn finishing(&self) -> bool {
        self.held.iter().any(Option::is_some)
    }

    /// What it has done so far.
    pub fn summary(&self) -> Summary {
        self.summary
    }

    /// Pushes `command` with `payload` to queue `q`.
    fn push_to(
        &mut self,
        q: usize,
        command: Command,
        payload: Payload,
    ) -> Result<(), crate::Error> {
        let command = Command {
            context: self.config.context,
            ..command
        };
        push(&mut self.queues[q], command, payload)?;
        self.pushed[q] += 1;
        Ok(())
    }

    /// A `Wait` on queue `on` until every descriptor pushed to it so far has completed.
    fn wait_for(&self, on: usize) -> Command {
        let id = self.queues[on].id();
        Descriptor::wait(id, self.base[on] + self.pushed[on]).build()
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
        if self.queues.is_empty() {
            return Err(self.removed());
        }
        let Some(slot) = self.free.pop_front() else {
            return Ok(None);
        };
        let frame = self.next_frame;
        let began = Instant::now();
        if let Err(e) = preprocess(
            frame,
            &Input {
                buffer: &slot.input,
            },
        ) {
            self.free.push_front(slot);
            return Err(e);
        }
        let index = slot.index;
        let steps = self.model.steps().len();
        let split = self.config.split;
        let in_place = self.path.in_place;
        // The frame's descriptors in order, as (queue, descriptor k or a Wait on a queue):
        // H2D; with `split` a Wait on H2D ahead of the steps; the steps; unless results are
        // read in place, with `split` a Wait on the steps, and the D2H copy. The last one
        // carries the slot.
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
        let mut slot = Some(slot);
        let mut left = total;
        for &(q, next) in &plan[..n] {
            let (first, count) = match next {
                Next::Step(k) => (k, 1),
                Next::Steps => (1, steps),
                Next::WaitOn(_) => (0, 1),
            };
            for k in first..first + count {
                left -= 1;
                let held = slot
                    .as_ref()
                    .expect("the slot goes with the last descriptor");
                let command = match next {
                    Next::WaitOn(on) => self.wait_for(on),
                    _ => command_of(&self.model, held, k),
                };
                let step = if matches!(next, Next::WaitOn(_)) {
                    WAIT_STEP
                } else {
                    k as u16
                };
                let payload = if left == 0 {
                    Payload::Last {
                        slot: slot.take().expect("taken once"),
                        step,
                    }
                } else {
                    Payload::Step { slot: index, step }
                };
                self.push_to(q, command, payload)?;
            }
        }
        self.summary.bytes_to_device += self.model.input().bytes;
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
        for q in &mut self.queues {
            q.flush()?;
        }
        let now = Instant::now();
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
    fn complete(
        &mut self,
        done: ring::Done<ring::Status, Payload>,
        postprocess: &mut impl FnMut(Finished<'_>),
    ) -> usize {
        let now = Instant::now();
        let steps = self.model.steps().len();
        let code = done.entry.loopback_code().ok();
        let (index, step) = match &done.payload {
            Payload::Step { slot, step } => (*slot, *step),
            Payload::Last { slot, step } => (slot.index, *step),
        };
        let p = &mut self.progress[index];
        if code != Some(StatusCode::Success) && p.error.is_none() {
            p.error = Some(FrameError {
                frame: p.frame,
                queue: done.entry.queue_id,
                command: done.id,
                step,
                what: step_name(step, steps),
                code: code.unwrap_or(StatusCode::BadOpcode),
                result: done.entry.result,
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
        p.outstanding = p.outstanding.saturating_sub(1);
        if let Payload::Last { slot, .. } = done.payload {
            if self.path.in_place {
                p.times.computed = now;
            }
            p.times.to_host = now;
            self.held[index] = Some(slot);
        }
        self.deliver(postprocess)
    }

    /// Hands every finished frame, from the next in order, to `postprocess`.
    fn deliver(&mut self, postprocess: &mut impl FnMut(Finished<'_>)) -> usize {
        let mut delivered = 0;
        loop {
            let next = self.next_out;
            let Some(index) = (0..self.held.len()).find(|&i| {
                self.held[i].is_some()
                    && self.progress[i].frame == next
                    && self.progress[i].outstanding == 0
            }) else {
                return delivered;
            };
            let slot = self.held[index].take().expect("found above");
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
                    let source = if self.path.in_place {
                        Source::Device {
                            device: &self.device,
                            offset: (slot.arena + r.offset).raw() as usize,
                            len: r.bytes as usize,
                        }
                    } else {
                        Source::Host(&slot.result)
                    };
                    Ok(Output { source })
                }
            };
            postprocess(Finished {
                frame: progress.frame,
                result,
                times: progress.times,
            });
            self.free.push_back(slot);
            delivered += 1;
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
            while let Some(done) = self.queues[q].poll_one()? {
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
            if self.held.iter().any(Option::is_some) {
                // Its D2H is back, another of its completions is not seen yet: moments away.
                std::thread::yield_now();
            } else {
                let done = self.queues[last].wait(Some(self.config.timeout))?;
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

    /// The error of a pipeline whose device was removed.
    fn removed(&self) -> crate::Error {
        userdma::device::Error::Removed {
            device: self.device.identity().to_string(),
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
    /// a queue the device could not be made to stop (its slots are then leaked, never freed
    /// under the device: [`ring::leaks`]).
    pub fn recover(
        &mut self,
        postprocess: impl FnMut(Finished<'_>),
    ) -> Result<Recovery, crate::Error> {
        let start = Instant::now();
        if !self.device.is_removed() {
            self.device.reset()?;
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
        // The device is stopped (reset) or gone: every queue stops at once, handing back what
        // completed before and what it aborted.
        let mut completed = Vec::new();
        let mut aborted = Vec::new();
        let mut failure = None;
        for queue in std::mem::take(&mut self.queues) {
            match queue.shutdown(Duration::ZERO) {
                Ok(shutdown) => {
                    completed.extend(shutdown.completed);
                    aborted.extend(shutdown.aborted.into_iter().map(|(_, p)| p));
                }
                Err(err) => failure = failure.or(Some(err)),
            }
        }
        let before = self.summary.frames;
        for done in completed {
            self.complete(done, &mut postprocess);
        }
        let finished = (self.summary.frames - before) as usize;
        let mut lost = Vec::new();
        for payload in aborted {
            if let Payload::Last { slot, .. } = payload {
                lost.push(self.progress[slot.index].frame);
                self.free.push_back(slot);
            }
        }
        for index in 0..self.held.len() {
            if let Some(slot) = self.held[index].take() {
                lost.push(self.progress[index].frame);
                self.free.push_back(slot);
            }
        }
        lost.sort_unstable();
        self.in_flight = 0;
        self.next_out = self.next_frame;
        self.unannounced = 0;
        self.pending.clear();
        if let Some(err) = failure {
            return Err(err.into());
        }
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

    /// Opens the queues again after a reset, as [`Pipeline::new`] did.
    fn reopen(&mut self) -> Result<(), crate::Error> {
        let counters = self.device.counters()?;
        for spec in &self.specs {
            let id = spec.config.id();
            if let (true, Some(ws)) = (spec.steps_here, self.config.working_set) {
                self.device
                    .set_working_set(id, ws.private, ws.shared, ws.key)?;
            }
            self.queues.push(self.device.open_queue_on(
                spec.config,
                self.config.wait,
                spec.unit,
            )?);
        }
        self.base = self
            .specs
            .iter()
            .map(|s| {
                counters
                    .queues
                    .get(usize::from(s.config.id()))
                    .map_or(0, |q| q.completed)
            })
            .collect();
        self.pushed = vec![0; self.specs.len()];
        Ok(())
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

/// Descriptor `k` of a frame in `slot`: 0 the H2D copy, then each step at the slot's arena,
/// then the D2H copy.
fn command_of(model: &Model, slot: &Slot, k: usize) -> Command {
    command(model, slot.arena, slot.input.iova(), slot.result.iova(), k)
}

/// Times of each result path [`Results::Auto`] measures: the best of this many.
const MEASURE_ROUNDS: usize = 5;

/// [`Results::Auto`]: measures a D2H round trip of the model's result (from `slot`'s arena
/// into its host result buffer, on `queue`, whose pushed count `pushed` it advances) and an
/// in-place read of the same bytes through the BAR, the best of [`MEASURE_ROUNDS`] each, and
/// picks the faster.
fn measure_result_paths(
    model: &Model,
    slot: &Slot,
    device: &Loopback,
    queue: &mut loopback::Queue<Payload>,
    pushed: &mut u64,
    config: &Config,
) -> Result<ResultPath, crate::Error> {
    let timeout = config.timeout;
    let r = model.result();
    let steps = model.steps().len();
    let copy = Command {
        context: config.context,
        ..command_of(model, slot, steps + 1)
    };
    let offset = (slot.arena + r.offset).raw() as usize;
    let mut bytes = userdma::memory::zeroed(r.bytes, "the result read back")?;
    let (mut copy_ns, mut in_place_ns) = (u64::MAX, u64::MAX);
    for _ in 0..MEASURE_ROUNDS {
        let start = Instant::now();
        push(
            queue,
            copy,
            Payload::Step {
                slot: slot.index,
                step: (steps + 1) as u16,
            },
        )?;
        *pushed += 1;
        queue.flush()?;
        let done = queue.wait(Some(timeout))?;
        if done.entry.loopback_code().ok() != Some(StatusCode::Success) {
            return Err(Error::ResultCopy {
                bytes: r.bytes,
                code: done.entry.code(),
            }
            .into());
        }
        // The host's side of a copied result: reading it out of the result buffer.
        slot.result.read(0, &mut bytes)?;
        copy_ns = copy_ns.min(nanos(start.elapsed()));
        let start = Instant::now();
        device.read_device_memory(offset, &mut bytes)?;
        in_place_ns = in_place_ns.min(nanos(start.elapsed()));
    }
    Ok(ResultPath {
        in_place: in_place_ns < copy_ns,
        copy_ns: Some(copy_ns),
        in_place_ns: Some(in_place_ns),
    })
}

/// A duration in whole nanoseconds (saturating).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Queues `command`. The ring holds every slot's descriptors, and a slot of the ring is free
/// once the completion that frees it was taken (the device writes its SQ head back before each
/// completion), so a refusal here is an error, never a moment to wait out.
fn push<T: Send>(
    queue: &mut loopback::Queue<T>,
    command: Command,
    payload: T,
) -> Result<(), crate::Error> {
    queue.push(command, payload)?;
    Ok(())
}

/// Descriptor `k` of a frame of `model` in the arena at `base`, with its input and result at
/// host IOVAs `input` and `result`: 0 the H2D copy, then each step, then the D2H copy.
fn command(model: &Model, base: DeviceOffset, input: Iova, result: Iova, k: usize) -> Command {
    let steps = model.steps();
    let d = if k == 0 {
        let i = model.input();
        Descriptor::to_device(input, base + i.offset, i.bytes)
    } else if let Some(step) = steps.get(k - 1) {
        match *step {
            Step::Compute {
                src,
                dst,
                len,
                xor,
                add,
            } => Descriptor::compute(base + src, base + dst, len, xor, add),
            Step::Layer {
                inputs,
                count,
                dst,
                len,
                seed,
            } => {
                let mut at = [(base, 0); 3];
                for (a, &(offset, bytes)) in at.iter_mut().zip(&inputs) {
                    *a = (base + offset, bytes);
                }
                // One to three inputs of at most 4 GiB each: checked when the model was built.
                Descriptor::layer(&at[..usize::from(count)], base + dst, len, seed)
                    .unwrap_or_else(|_| Descriptor::nop())
            }
            Step::Compact {
                src,
                len,
                dst,
                params,
            } => Descriptor::compact(
                base + src,
                len,
                params.record,
                params.score_at,
                params.threshold,
                base + dst,
                params.capacity,
            ),
        }
    } else {
        let r = model.result();
        Descriptor::to_host(base + r.offset, result, r.bytes)
    };
    d.build()
}
