//! Models and pipelines: `udma_model` (a chain of compute steps, or the YOLOv5s-like graph
//! of the model zoo, with its expected output computed on the host), `udma_pipeline` (frames
//! through H2D, the model's device steps and D2H over preallocated slots on a loopback
//! device), and the frame views callbacks get (`udma_frame_input`, `udma_frame_output`).
//!
//! **Callbacks.** A frame's input is written, and its result read, inside a callback the
//! library calls (`udma_pipeline_fill_fn`, `udma_pipeline_result_fn`, the streams' ones):
//! the view it gets is valid for that call only, checked by a token the library keeps for
//! the running callback, so a view kept past its callback is refused, never dereferenced. A
//! callback must return normally: no `longjmp` out of it and no C++ exception through it
//! (either would skip the library's frames, which is undefined behaviour; an exception aborts
//! the process). Inside a callback, the pipeline and streams calls are refused
//! (`UDMA_ERR_BUSY`): they would re-enter the pipeline that is calling.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use udma::device::Wait;
use userdma_infer::pipeline::{
    self, zoo, Finished, Input, Model, Output, Pipeline, Results, WorkingSet,
};

use crate::abi;
use crate::device::{device, udma_device, Device};
use crate::error::{call, lib, udma_status, Fail};
use crate::handle::{Kind, Registry};

// ---- models ------------------------------------------------------------------------------

/// A model a pipeline runs: an arena of device memory, the input tensor, the result tensor
/// and the device steps between. Made by `udma_model_create_chain` or
/// `udma_model_create_yolov5s`, destroyed by `udma_model_destroy` (a pipeline keeps its own
/// copy).
#[derive(Debug)]
pub struct udma_model {
    _opaque: [u8; 0],
}

static MODELS: Registry<Arc<Model>> = Registry::new(Kind::Model);

fn model(ptr: *const udma_model) -> Result<Arc<Model>, Fail> {
    MODELS.with(ptr, |_, m| Ok(Arc::clone(m)))
}

fn register_model(made: Model, out: *mut *mut udma_model) -> Result<(), Fail> {
    let key = MODELS.insert(Arc::new(made))?;
    // SAFETY: checked non-null by the caller; writable per its contract.
    unsafe { out.write(key.to_ptr(Kind::Model)) };
    Ok(())
}

/// What a model is (`udma_model_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct udma_model_info {
    /// `sizeof(udma_model_info)`.
    pub size: usize,
    /// Bytes of a frame's input.
    pub input_bytes: u64,
    /// Bytes of a frame's result.
    pub result_bytes: u64,
    /// Bytes of device memory one frame's arena takes (a pipeline takes one per slot).
    pub arena_bytes: u64,
    /// Bytes the device computes over per frame (read plus written).
    pub compute_bytes: u64,
    /// Device steps per frame.
    pub steps: u32,
    /// Zero.
    pub reserved: u32,
}

// SAFETY: `repr(C)`, integers only, 8 * 5 + 4 + 4 = 48 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_model_info {
    const NAME: &'static str = "udma_model_info";
}

/// A chain of `layers` compute steps over tensors of `bytes` each (rounded up to 4-byte
/// words), planned into one arena: the synthetic model of `userdma pipeline`.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for 0 layers or 0 bytes, more than 4096 layers (what
/// one ring can carry for a pipeline) or tensors of more than 1 TiB; nothing is allocated
/// before these checks.
///
/// # Safety
/// `model` points to a writable `udma_model *`.
#[no_mangle]
pub unsafe extern "C" fn udma_model_create_chain(
    layers: u32,
    bytes: u64,
    model: *mut *mut udma_model,
) -> udma_status {
    call("udma_model_create_chain", || {
        let out = abi::out(model, "model")?;
        if layers == 0 || bytes == 0 {
            return Err(Fail::invalid(format!(
                "a chain of {layers} layers of {bytes} bytes: give at least 1 layer of 1 byte"
            )));
        }
        let made = Model::chain(layers, bytes).map_err(|e| {
            Fail::invalid(format!("a chain of {layers} layers of {bytes} bytes: {e}"))
        })?;
        register_model(made, out)
    })
}

/// The YOLOv5s-like model of the zoo: YOLOv5s's tensor graph (640x640x3 input, one byte
/// per activation) planned into one arena, each op one layer step, the detections filtered
/// on the device so that only a count and at most `max_detections` 32-byte records come back.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for `max_detections` 0 or above 25,200 (the records
/// the graph's result holds).
///
/// # Safety
/// `model` points to a writable `udma_model *`.
#[no_mangle]
pub unsafe extern "C" fn udma_model_create_yolov5s(
    max_detections: u32,
    model: *mut *mut udma_model,
) -> udma_status {
    call("udma_model_create_yolov5s", || {
        let out = abi::out(model, "model")?;
        if max_detections == 0 {
            return Err(Fail::invalid(
                "max_detections is 0: keep at least 1 detection (300 is YOLOv5's default)",
            ));
        }
        let made = zoo::yolov5s_like(max_detections)
            .map_err(|e| Fail::invalid(format!("the YOLOv5s-like model: {e}")))?;
        register_model(made, out)
    })
}

/// The model's sizes.
///
/// # Safety
/// `info` points to `info->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_model_get_info(
    model: *const udma_model,
    info: *mut udma_model_info,
) -> udma_status {
    call("udma_model_get_info", || {
        let m = self::model(model)?;
        let value = udma_model_info {
            size: 0,
            input_bytes: m.input().bytes,
            result_bytes: m.result().bytes,
            arena_bytes: m.arena_bytes(),
            compute_bytes: m.compute_bytes(),
            steps: m.steps().len() as u32,
            reserved: 0,
        };
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", value) }
    })
}

/// The result the device must produce for `input`, computed on the host (as a fresh arena
/// would hold it): `result_len` must be at least the model's `result_bytes`, `input_len` at
/// least its `input_bytes` (extra input bytes are ignored). Allocates an arena on the host,
/// for setting up checks rather than per frame.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a NULL pointer or a length too short;
/// `UDMA_ERR_EXHAUSTED` when the host has no room for the model's arena.
///
/// # Safety
/// `input` points to `input_len` readable bytes, `result` to `result_len` writable ones.
#[no_mangle]
pub unsafe extern "C" fn udma_model_expected(
    model: *const udma_model,
    input: *const c_void,
    input_len: usize,
    result: *mut c_void,
    result_len: usize,
) -> udma_status {
    call("udma_model_expected", || {
        let m = self::model(model)?;
        if input.is_null() {
            return Err(Fail::null("input"));
        }
        if result.is_null() {
            return Err(Fail::null("result"));
        }
        let (need_in, need_out) = (m.input().bytes, m.result().bytes);
        if (input_len as u64) < need_in {
            return Err(Fail::invalid(format!(
                "input_len {input_len} is shorter than the model's {need_in}-byte input"
            )));
        }
        if (result_len as u64) < need_out {
            return Err(Fail::invalid(format!(
                "result_len {result_len} is shorter than the model's {need_out}-byte result"
            )));
        }
        // SAFETY: non-null and `input_len` readable bytes per this function's contract.
        let input = unsafe { std::slice::from_raw_parts(input.cast::<u8>(), input_len) };
        // SAFETY: non-null and `result_len` writable bytes per this function's contract, and
        // not the library's memory (so not aliased by `input`'s slice of the caller's either:
        // the contract gives two buffers).
        let result = unsafe { std::slice::from_raw_parts_mut(result.cast::<u8>(), result_len) };
        // The model error's own code: no host memory is `UDMA_ERR_EXHAUSTED`, the rest a bad
        // argument.
        m.expected_into(input, result).map_err(lib)?;
        Ok(())
    })
}

/// Destroys a model handle (pipelines made from it keep their own copy).
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_model_destroy(model: *mut udma_model) -> udma_status {
    call("udma_model_destroy", || {
        drop(MODELS.remove_if(model, |_| Ok(()))?);
        Ok(())
    })
}

// ---- frame views in callbacks ------------------------------------------------------------

/// A frame's input, inside a fill or preprocess callback: write it with
/// `udma_frame_input_write`. Valid for that callback only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_frame_input {
    /// `sizeof(udma_frame_input)` of the library.
    pub size: usize,
    /// The frame's number in its pipeline (from 0).
    pub frame: u64,
    /// Bytes of the input: write all of them (what is not written keeps an earlier frame's
    /// bytes).
    pub len: u64,
    /// The library's check that the view belongs to the running callback.
    pub token: u64,
}

/// A finished frame, inside a result or postprocess callback: read its result with
/// `udma_frame_output_read`. Valid for that callback only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_frame_output {
    /// `sizeof(udma_frame_output)` of the library.
    pub size: usize,
    /// The frame's number in its pipeline (from 0, in order).
    pub frame: u64,
    /// Bytes of the result (0 for a failed frame).
    pub len: u64,
    /// Nanoseconds from the start of its preprocessing to its result.
    pub latency_ns: u64,
    /// The completion's result field of the failed step (an address or offset), or 0.
    pub fault: u64,
    /// 0: the device ran the frame; otherwise the loopback device's code of the step that
    /// failed (`udma_op_status_name` names it), and the frame has no result.
    pub status: u32,
    /// The step that failed: 0 the H2D copy, then the model's steps, then the D2H copy.
    pub step: u32,
    /// The library's check that the view belongs to the running callback.
    pub token: u64,
}

/// What the running callback on this thread may touch: its frame's input or output, under a
/// token; plus how deep in callbacks the thread is.
#[derive(Clone, Copy)]
struct Current {
    token: u64,
    input: *const (),
    output: *const (),
    depth: u32,
}

thread_local! {
    static CURRENT: Cell<Current> = const {
        Cell::new(Current {
            token: 0,
            input: std::ptr::null(),
            output: std::ptr::null(),
            depth: 0,
        })
    };
    static TOKENS: Cell<u64> = const { Cell::new(0) };
}

/// Restores the thread's previous callback state when the callback returns (or unwinds).
struct InCallback(Current);

impl Drop for InCallback {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

/// Marks the thread as inside a callback with `input` or `output` as its frame; returns the
/// view's token and the guard that ends it.
fn enter(input: Option<&Input<'_>>, output: Option<&Output<'_>>) -> (u64, InCallback) {
    let token = TOKENS.with(|t| {
        let next = t.get().wrapping_add(1).max(1);
        t.set(next);
        next
    });
    let previous = CURRENT.with(|c| {
        let previous = c.get();
        c.set(Current {
            token,
            input: input.map_or(std::ptr::null(), |i| std::ptr::from_ref(i).cast()),
            output: output.map_or(std::ptr::null(), |o| std::ptr::from_ref(o).cast()),
            depth: previous.depth + 1,
        });
        previous
    });
    (token, InCallback(previous))
}

/// Refuses a call that would re-enter a pipeline from one of its callbacks.
pub(crate) fn not_in_callback() -> Result<(), Fail> {
    if CURRENT.with(|c| c.get().depth) > 0 {
        return Err(Fail::new(
            udma_status::UDMA_ERR_BUSY,
            "called from inside a fill, result, preprocess or postprocess callback: the \
             pipeline is running it; return from the callback first (only the udma_frame_*, \
             udma_model_* and buffer calls are allowed inside)",
        ));
    }
    Ok(())
}

/// Runs the C fill or preprocess callback `f` on `input` (frame `frame`).
pub(crate) fn fill(input: &Input<'_>, frame: u64, f: impl FnOnce(*mut udma_frame_input)) {
    let (token, _guard) = enter(Some(input), None);
    let mut view = udma_frame_input {
        size: std::mem::size_of::<udma_frame_input>(),
        frame,
        len: input.len() as u64,
        token,
    };
    f(&mut view);
}

/// Runs the C result or postprocess callback `f` on `done`.
pub(crate) fn finish(done: &Finished<'_>, f: impl FnOnce(*const udma_frame_output)) {
    let t = &done.times;
    let latency = t.to_host.saturating_duration_since(t.preprocess);
    let (output, status, step, fault) = match &done.result {
        Ok(out) => (Some(out), 0, 0, 0),
        Err(e) => (None, u32::from(e.code as u16), u32::from(e.step), e.result),
    };
    let (token, _guard) = enter(None, output);
    let view = udma_frame_output {
        size: std::mem::size_of::<udma_frame_output>(),
        frame: done.frame,
        len: output.map_or(0, |o| o.len() as u64),
        latency_ns: u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX),
        fault,
        status,
        step,
        token,
    };
    f(&view);
}

fn stale_view(what: &str) -> Fail {
    Fail::invalid(format!(
        "{what} is not the view of the running callback on this thread (a view is valid inside \
         its callback only): write or read the frame before the callback returns"
    ))
}

/// Copies `len` bytes from `src` into the frame's input at `offset` (into the slot's DMA
/// buffer). Inside a fill or preprocess callback only.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a view outside its callback, a NULL pointer, or a
/// range past the input's `len`.
///
/// # Safety
/// `input` is NULL or points to a readable `udma_frame_input`; `src` to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_frame_input_write(
    input: *const udma_frame_input,
    offset: u64,
    src: *const c_void,
    len: usize,
) -> udma_status {
    call("udma_frame_input_write", || {
        if input.is_null() {
            return Err(Fail::null("input"));
        }
        if src.is_null() && len > 0 {
            return Err(Fail::null("src"));
        }
        // SAFETY: non-null and readable per this function's contract; unaligned for safety.
        let token = unsafe { std::ptr::addr_of!((*input).token).read_unaligned() };
        let current = CURRENT.with(Cell::get);
        if current.token != token || current.input.is_null() {
            return Err(stale_view("input"));
        }
        // SAFETY: `current.input` was set by `enter` from a live `&Input` for the callback
        // running now on this thread (the token matches), which outlives this call; the guard
        // clears it when the callback returns.
        let frame = unsafe { &*current.input.cast::<Input<'_>>() };
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        if at.checked_add(len).is_none_or(|end| end > frame.len()) {
            return Err(Fail::invalid(format!(
                "{len} bytes at offset {offset} run past the frame's {}-byte input",
                frame.len()
            )));
        }
        if len == 0 {
            return Ok(());
        }
        // SAFETY: non-null and `len` readable bytes per this function's contract.
        let bytes = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) };
        frame.write(at, bytes).map_err(Fail::from)
    })
}

/// Copies `len` bytes of the frame's result at `offset` into `dst`. Inside a result or
/// postprocess callback only.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a view outside its callback, a failed frame (no
/// result), a NULL pointer, or a range past the result's `len`.
///
/// # Safety
/// `output` is NULL or points to a readable `udma_frame_output`; `dst` to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_frame_output_read(
    output: *const udma_frame_output,
    offset: u64,
    dst: *mut c_void,
    len: usize,
) -> udma_status {
    call("udma_frame_output_read", || {
        if output.is_null() {
            return Err(Fail::null("output"));
        }
        if dst.is_null() && len > 0 {
            return Err(Fail::null("dst"));
        }
        // SAFETY: non-null and readable per this function's contract; unaligned for safety.
        let (token, frame, status) = unsafe {
            (
                std::ptr::addr_of!((*output).token).read_unaligned(),
                std::ptr::addr_of!((*output).frame).read_unaligned(),
                std::ptr::addr_of!((*output).status).read_unaligned(),
            )
        };
        let current = CURRENT.with(Cell::get);
        if current.token != token {
            return Err(stale_view("output"));
        }
        if current.output.is_null() {
            return Err(Fail::invalid(format!(
                "frame {frame} failed on the device ({}) and has no result: check \
                 output->status first",
                crate::queue::op_status(status).to_string_lossy()
            )));
        }
        // SAFETY: as in `udma_frame_input_write`: set from a live `&Output` for the running
        // callback, cleared when it returns.
        let result = unsafe { &*current.output.cast::<Output<'_>>() };
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        if at.checked_add(len).is_none_or(|end| end > result.len()) {
            return Err(Fail::invalid(format!(
                "{len} bytes at offset {offset} run past the frame's {}-byte result",
                result.len()
            )));
        }
        if len == 0 {
            return Ok(());
        }
        // SAFETY: non-null and `len` writable bytes per this function's contract.
        let bytes = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
        result.read(at, bytes).map_err(Fail::from)
    })
}

// ---- pipelines ---------------------------------------------------------------------------

/// A pipeline: a model's frames through preallocated slots on a loopback device. Made by
/// `udma_pipeline_create`, destroyed by `udma_pipeline_destroy` or moved into a
/// `udma_streams` by `udma_streams_create`.
#[derive(Debug)]
pub struct udma_pipeline {
    _opaque: [u8; 0],
}

pub(crate) struct PipelineEntry {
    /// `None` once destroyed or moved into streams (a call holding a clone finds nothing).
    pub(crate) pipeline: Mutex<Option<Pipeline>>,
    /// `pipeline on loopback0 queue 0`, for messages.
    pub(crate) name: String,
    /// Keeps the device open for as long as the pipeline.
    pub(crate) device: Arc<Device>,
}

impl PipelineEntry {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Pipeline>> {
        self.pipeline.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) static PIPELINES: Registry<Arc<PipelineEntry>> = Registry::new(Kind::Pipeline);

/// `udma_pipeline_options.flags`: every descriptor on one queue, in order (by default three
/// queues on the device's two units, so copying and computing overlap).
pub const UDMA_PIPELINE_ONE_QUEUE: u32 = 1;
/// `udma_pipeline_options.flags`: poll for completions instead of sleeping on interrupts.
pub const UDMA_PIPELINE_POLL: u32 = 2;

/// `udma_pipeline_options.results`: how results reach the host.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_results {
    /// Measure both ways for the model's result size when the pipeline is made, use the
    /// faster (the default).
    UDMA_RESULTS_AUTO = 0,
    /// A D2H copy into a host buffer.
    UDMA_RESULTS_COPY = 1,
    /// Read in place from device memory through the BAR (no D2H descriptor).
    UDMA_RESULTS_IN_PLACE = 2,
}

/// How to make a pipeline. Zero is the default for every field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct udma_pipeline_options {
    /// `sizeof(udma_pipeline_options)`.
    pub size: usize,
    /// Slots (frames in flight at most), 1 to 1024; 0: 2 (double buffering).
    pub depth: u32,
    /// Frames per doorbell; 0: 1.
    pub batch: u32,
    /// The first of its queues (it takes three, or one with `UDMA_PIPELINE_ONE_QUEUE`).
    pub queue: u32,
    /// The device context its queues run in (streams on different contexts make the device
    /// switch between them).
    pub context: u32,
    /// `UDMA_PIPELINE_ONE_QUEUE`, `UDMA_PIPELINE_POLL`, or 0.
    pub flags: u32,
    /// A `udma_results`; 0: `UDMA_RESULTS_AUTO`.
    pub results: u32,
    /// How long a wait for a frame may take before it fails; 0: 10 s.
    pub timeout_ns: u64,
    /// The context's working set in device SRAM: bytes of its own (0 with `shared` 0:
    /// nothing declared).
    pub working_set_private: u64,
    /// Bytes shared with contexts of the same `working_set_key` (one model's weights).
    pub working_set_shared: u64,
    /// The share key (0: nothing shared).
    pub working_set_key: u32,
    /// Zero.
    pub reserved: u32,
}

// SAFETY: `repr(C)`, integers only, 8 + 6 * 4 + 8 * 3 + 4 + 4 = 64 bytes with no padding,
// `size` first.
unsafe impl abi::Sized for udma_pipeline_options {
    const NAME: &'static str = "udma_pipeline_options";
}

/// A pipeline's state (`udma_pipeline_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct udma_pipeline_info {
    /// `sizeof(udma_pipeline_info)`.
    pub size: usize,
    /// Frames finished (handed to a result callback, or discarded by destroy).
    pub frames: u64,
    /// Frames the device failed.
    pub failed: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// Bytes copied to the device.
    pub bytes_to_device: u64,
    /// Bytes of results brought back.
    pub bytes_to_host: u64,
    /// Frames in flight now.
    pub in_flight: u32,
    /// Slots.
    pub depth: u32,
    /// 1 if results are read in place from device memory, 0 if copied back.
    pub in_place: u32,
    /// Zero.
    pub reserved: u32,
}

// SAFETY: `repr(C)`, integers only, 8 * 6 + 4 * 4 = 64 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_pipeline_info {
    const NAME: &'static str = "udma_pipeline_info";
}

/// Writes a frame's input (`udma_pipeline_submit_with`): `input` is valid during the call.
pub type udma_pipeline_fill_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, frame: u64, input: *mut udma_frame_input)>;

/// Takes a finished frame (`udma_pipeline_poll`, `udma_pipeline_wait`): `output` is valid
/// during the call.
pub type udma_pipeline_result_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, output: *const udma_frame_output)>;

fn config(o: &udma_pipeline_options) -> Result<pipeline::Config, Fail> {
    if o.flags & !(UDMA_PIPELINE_ONE_QUEUE | UDMA_PIPELINE_POLL) != 0 {
        return Err(Fail::invalid(format!(
            "flags {:#x} has bits that are not UDMA_PIPELINE_* flags",
            o.flags
        )));
    }
    let results = match o.results {
        0 => Results::Auto,
        1 => Results::Copy,
        2 => Results::InPlace,
        other => {
            return Err(Fail::invalid(format!(
                "results {other} is not a udma_results (UDMA_RESULTS_AUTO 0, \
                 UDMA_RESULTS_COPY 1, UDMA_RESULTS_IN_PLACE 2)"
            )))
        }
    };
    let queue = u16::try_from(o.queue)
        .map_err(|_| Fail::invalid(format!("queue {} is out of range", o.queue)))?;
    let working_set =
        (o.working_set_private != 0 || o.working_set_shared != 0).then_some(WorkingSet {
            private: o.working_set_private,
            shared: o.working_set_shared,
            key: o.working_set_key,
        });
    Ok(pipeline::Config {
        depth: if o.depth == 0 { 2 } else { o.depth as usize },
        batch: if o.batch == 0 { 1 } else { o.batch as usize },
        queue,
        wait: if o.flags & UDMA_PIPELINE_POLL != 0 {
            Wait::Poll
        } else {
            Wait::Interrupt
        },
        timeout: if o.timeout_ns == 0 {
            Duration::from_secs(10)
        } else {
            Duration::from_nanos(o.timeout_ns)
        },
        split: o.flags & UDMA_PIPELINE_ONE_QUEUE == 0,
        results,
        context: o.context,
        working_set,
    })
}

/// Makes a pipeline on a loopback device for `model` (`options` may be NULL: the defaults):
/// its slots (host buffers from one pool mapped once, one device arena each) and its queues.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an option out of range; `UDMA_ERR_UNSUPPORTED`
/// for a PCI device (the pipeline runs the loopback device's layer ops); `UDMA_ERR_BUSY`
/// for a queue open already; `UDMA_ERR_DEVICE` or `UDMA_ERR_EXHAUSTED` when device memory
/// cannot hold `depth` arenas (lower the depth).
///
/// # Safety
/// `options` is NULL or points to `options->size` readable bytes; `pipeline` to a writable
/// `udma_pipeline *`.
#[no_mangle]
pub unsafe extern "C" fn udma_pipeline_create(
    device: *const udma_device,
    model: *const udma_model,
    options: *const udma_pipeline_options,
    pipeline: *mut *mut udma_pipeline,
) -> udma_status {
    call("udma_pipeline_create", || {
        let out = abi::out(pipeline, "pipeline")?;
        let o = if options.is_null() {
            udma_pipeline_options::default()
        } else {
            // SAFETY: non-null; readable per this function's contract.
            unsafe { abi::read(options, "options", udma_pipeline_options::default())? }
        };
        let d = self::device(device)?;
        let m = self::model(model)?;
        let config = config(&o)?;
        let name = format!("the pipeline on {} queue {}", d.name, config.queue);
        let made = Pipeline::new(&d.runtime, Model::clone(&m), config)
            .map_err(|e| Fail::from(e).context(&name))?;
        let key = PIPELINES.insert(Arc::new(PipelineEntry {
            pipeline: Mutex::new(Some(made)),
            name,
            device: d,
        }))?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(key.to_ptr(Kind::Pipeline)) };
        Ok(())
    })
}

/// Runs `f` on the live pipeline `ptr` names, locked.
fn with_pipeline<R>(
    ptr: *const udma_pipeline,
    f: impl FnOnce(&mut Pipeline) -> Result<R, Fail>,
) -> Result<R, Fail> {
    not_in_callback()?;
    let entry = PIPELINES.with(ptr, |_, p| Ok(Arc::clone(p)))?;
    let mut guard = entry.lock();
    let p = guard.as_mut().ok_or_else(|| {
        Fail::handle(format!(
            "{} was destroyed or moved into streams (by another thread, during this call)",
            entry.name
        ))
    })?;
    f(p).map_err(|fail| fail.context(&entry.name))
}

fn full(p: &Pipeline) -> Fail {
    Fail::new(
        udma_status::UDMA_ERR_BUSY,
        format!(
            "all {} slots are in flight: take finished frames first (udma_pipeline_poll, \
             udma_pipeline_wait)",
            p.config().depth
        ),
    )
}

/// Submits a frame whose input is `len` bytes copied from `input` (at most the model's
/// `input_bytes`; the rest of the slot's input keeps an earlier frame's bytes), and sets
/// `*frame` (may be NULL) to its number. Its descriptors are announced once `batch` frames
/// are queued (or by `udma_pipeline_flush`, `udma_pipeline_wait`).
///
/// Errors: `UDMA_ERR_BUSY` when every slot is in flight (take finished frames first) or
/// inside a callback; `UDMA_ERR_INVALID_ARGUMENT` for an input longer than the model's.
///
/// # Safety
/// `input` points to `len` readable bytes; `frame` is NULL or points to a writable
/// `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_pipeline_submit(
    pipeline: *mut udma_pipeline,
    input: *const c_void,
    len: usize,
    frame: *mut u64,
) -> udma_status {
    call("udma_pipeline_submit", || {
        if input.is_null() && len > 0 {
            return Err(Fail::null("input"));
        }
        let n = with_pipeline(pipeline, |p| {
            let bytes: &[u8] = if len == 0 {
                &[]
            } else {
                // SAFETY: non-null, `len` readable bytes per this function's contract.
                unsafe { std::slice::from_raw_parts(input.cast::<u8>(), len) }
            };
            let want = p.model().input().bytes;
            if len as u64 > want {
                return Err(Fail::invalid(format!(
                    "len {len} is longer than the model's {want}-byte input"
                )));
            }
            p.try_submit(|_, slot| slot.write(0, bytes))
                .map_err(Fail::from)?
                .ok_or_else(|| full(p))
        })?;
        if !frame.is_null() {
            // SAFETY: non-null; writable per this function's contract.
            unsafe { frame.write(n) };
        }
        Ok(())
    })
}

/// Submits a frame whose input `fill(user, frame, input)` writes (with
/// `udma_frame_input_write`, straight into the slot's DMA buffer), and sets `*frame` (may be
/// NULL) to its number. `fill` must return normally (see the callbacks note in the header).
///
/// Errors: as `udma_pipeline_submit`; `UDMA_ERR_INVALID_ARGUMENT` for a NULL `fill`.
///
/// # Safety
/// `fill` is safe to call with `user`; `frame` is NULL or points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_pipeline_submit_with(
    pipeline: *mut udma_pipeline,
    fill: udma_pipeline_fill_fn,
    user: *mut c_void,
    frame: *mut u64,
) -> udma_status {
    call("udma_pipeline_submit_with", || {
        let f = fill.ok_or_else(|| Fail::null("fill"))?;
        let n = with_pipeline(pipeline, |p| {
            p.try_submit(|n, input| {
                // SAFETY: the caller's promise: `fill` may be called with `user`; the view
                // lives for the call.
                self::fill(input, n, |view| unsafe { f(user, n, view) });
                Ok(())
            })
            .map_err(Fail::from)?
            .ok_or_else(|| full(p))
        })?;
        if !frame.is_null() {
            // SAFETY: non-null; writable per this function's contract.
            unsafe { frame.write(n) };
        }
        Ok(())
    })
}

/// Announces every queued frame (one doorbell per queue).
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_pipeline_flush(pipeline: *mut udma_pipeline) -> udma_status {
    call("udma_pipeline_flush", || {
        with_pipeline(pipeline, |p| p.flush().map_err(lib))
    })
}

/// A `udma_pipeline_result_fn` as the closure the pipeline calls.
fn taker(
    result: udma_pipeline_result_fn,
    user: *mut c_void,
) -> Result<impl FnMut(Finished<'_>), Fail> {
    let f = result.ok_or_else(|| Fail::null("result"))?;
    Ok(move |done: Finished<'_>| {
        // SAFETY: the caller's promise: `result` may be called with `user`; the view lives
        // for the call.
        finish(&done, |view| unsafe { f(user, view) });
    })
}

/// What `udma_pipeline_poll` (`wait` false) and `udma_pipeline_wait` (`wait` true) share:
/// hands finished frames to `result`, sets `*finished` (when not NULL) to how many.
///
/// # Safety
/// `result` is safe to call with `user`; `finished` is NULL or points to a writable `size_t`.
unsafe fn take_finished(
    pipeline: *mut udma_pipeline,
    result: udma_pipeline_result_fn,
    user: *mut c_void,
    finished: *mut usize,
    wait: bool,
) -> Result<(), Fail> {
    let take = taker(result, user)?;
    let n = with_pipeline(pipeline, |p| {
        if wait { p.wait(take) } else { p.poll(take) }.map_err(lib)
    })?;
    if !finished.is_null() {
        // SAFETY: non-null; writable per the caller's contract.
        unsafe { finished.write(n) };
    }
    Ok(())
}

/// Hands every finished frame, in frame order, to `result(user, output)` without waiting,
/// and sets `*finished` (may be NULL) to how many.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a NULL `result`; `UDMA_ERR_DEVICE` for a broken
/// queue. A frame the device failed is no error: it reaches `result` with its status.
///
/// # Safety
/// `result` is safe to call with `user`; `finished` is NULL or points to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_pipeline_poll(
    pipeline: *mut udma_pipeline,
    result: udma_pipeline_result_fn,
    user: *mut c_void,
    finished: *mut usize,
) -> udma_status {
    call("udma_pipeline_poll", || {
        // SAFETY: this function's contract is `take_finished`'s.
        unsafe { take_finished(pipeline, result, user, finished, false) }
    })
}

/// Announces queued frames, waits until at least one frame finishes (up to the pipeline's
/// `timeout_ns`), and hands it and any others done to `result(user, output)`, in frame
/// order; sets `*finished` (may be NULL) to how many (0 when nothing is in flight).
///
/// Errors: as `udma_pipeline_poll`; `UDMA_ERR_TIMEOUT` when nothing finishes in time.
///
/// # Safety
/// As `udma_pipeline_poll`.
#[no_mangle]
pub unsafe extern "C" fn udma_pipeline_wait(
    pipeline: *mut udma_pipeline,
    result: udma_pipeline_result_fn,
    user: *mut c_void,
    finished: *mut usize,
) -> udma_status {
    call("udma_pipeline_wait", || {
        // SAFETY: this function's contract is `take_finished`'s.
        unsafe { take_finished(pipeline, result, user, finished, true) }
    })
}

/// The pipeline's counters.
///
/// # Safety
/// `info` points to `info->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_pipeline_get_info(
    pipeline: *const udma_pipeline,
    info: *mut udma_pipeline_info,
) -> udma_status {
    call("udma_pipeline_get_info", || {
        let value = with_pipeline(pipeline, |p| {
            let s = p.summary();
            Ok(udma_pipeline_info {
                size: 0,
                frames: s.frames,
                failed: s.failed,
                doorbells: s.doorbells,
                bytes_to_device: s.bytes_to_device,
                bytes_to_host: s.bytes_to_host,
                in_flight: p.in_flight() as u32,
                depth: p.config().depth as u32,
                in_place: u32::from(p.result_path().in_place),
                reserved: 0,
            })
        })?;
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", value) }
    })
}

/// Drains the frames in flight (their results discarded), gives every buffer back and
/// destroys the pipeline. The handle is invalid from then on, even when the drain fails
/// (`UDMA_ERR_TIMEOUT`: the device stopped answering; its memory stays with it).
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_pipeline_destroy(pipeline: *mut udma_pipeline) -> udma_status {
    call("udma_pipeline_destroy", || {
        not_in_callback()?;
        let entry = PIPELINES.remove_if(pipeline, |_| Ok(()))?;
        let Some(p) = entry.lock().take() else {
            return Ok(());
        };
        p.shutdown(|_| {})
            .map(drop)
            .map_err(|e| lib(e).context(&entry.name))
    })
}
