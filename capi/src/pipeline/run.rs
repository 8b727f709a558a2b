//! Pipelines (`udma_pipeline`): making one for a model on a loopback device, submitting
//! frames, taking finished ones through a result callback, its counters, and destroying it.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use userdma_infer::accel::{Accelerator, ComputeAt};
use userdma_infer::pipeline::{Config, Finished, Model, Pipeline};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::callback::{fill, finish, not_in_callback, udma_frame_input, udma_frame_output};
use super::model::{model, udma_model};
use super::options::{config, udma_pipeline_options};
use crate::abi;
use crate::device::{device, udma_device, Device};
use crate::engine::udma_engine;
use crate::error::{call, lib, udma_status, Fail};
use crate::handle::{Kind, Registry};

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
    /// Keeps the device open for as long as the pipeline (an engine's pipeline keeps its
    /// engine, and the engine its device).
    pub(crate) device: Option<Arc<Device>>,
}

impl PipelineEntry {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Pipeline>> {
        self.pipeline.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(crate) static PIPELINES: Registry<Arc<PipelineEntry>> = Registry::new(Kind::Pipeline);

/// A pipeline's state (`udma_pipeline_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
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
    /// Where the model's steps run: `UDMA_COMPUTE_DEVICE` (0), `UDMA_COMPUTE_HOST` (1: an
    /// engine without compute), `UDMA_COMPUTE_MIXED` (2).
    pub compute: u32,
    /// Model steps run on the host so far.
    pub host_steps: u64,
}

/// `udma_pipeline_info::compute`: every step on the device.
pub const UDMA_COMPUTE_DEVICE: u32 = 0;
/// `udma_pipeline_info::compute`: every step on the host, between the device's transfers.
pub const UDMA_COMPUTE_HOST: u32 = 1;
/// `udma_pipeline_info::compute`: some steps on the device, the others on the host.
pub const UDMA_COMPUTE_MIXED: u32 = 2;

abi::sized!(udma_pipeline_info);

/// Writes a frame's input (`udma_pipeline_submit_with`): `input` is valid during the call.
pub type udma_pipeline_fill_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, frame: u64, input: *mut udma_frame_input)>;

/// Takes a finished frame (`udma_pipeline_poll`, `udma_pipeline_wait`): `output` is valid
/// during the call.
pub type udma_pipeline_result_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, output: *const udma_frame_output)>;

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
            device: Some(d),
        }))?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(key.to_ptr(Kind::Pipeline)) };
        Ok(())
    })
}

/// Makes a pipeline on an engine (`udma_engine_create`) for `model`, as
/// `udma_pipeline_create` does on a device. The engine's capabilities decide what runs where:
/// steps it cannot run run on the host (between its transfers, in order), and the queues are
/// split across units only where it has separate units and orders queues (otherwise one
/// queue, as with `UDMA_PIPELINE_ONE_QUEUE`). The engine is polled.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an option out of range or one the engine cannot
/// carry out (results in place without `UDMA_ENGINE_READ_IN_PLACE`: the message names the
/// capability); what the engine's functions return, as their statuses.
///
/// # Safety
/// As `udma_pipeline_create`.
#[no_mangle]
pub unsafe extern "C" fn udma_pipeline_create_on_engine(
    engine: *const udma_engine,
    model: *const udma_model,
    options: *const udma_pipeline_options,
    pipeline: *mut *mut udma_pipeline,
) -> udma_status {
    call("udma_pipeline_create_on_engine", || {
        let out = abi::out(pipeline, "pipeline")?;
        let o = if options.is_null() {
            udma_pipeline_options::default()
        } else {
            // SAFETY: non-null; readable per this function's contract.
            unsafe { abi::read(options, "options", udma_pipeline_options::default())? }
        };
        let (e, device) = crate::engine::engine(engine)?;
        let m = self::model(model)?;
        let mut config = config(&o)?;
        let fits = Config::for_device(e.as_ref(), &m);
        config.split &= fits.split;
        config.wait = fits.wait;
        let name = format!("the pipeline on {} queue {}", e.identity(), config.queue);
        let engine: Arc<dyn Accelerator> = e;
        let made = Pipeline::on(engine, Model::clone(&m), config)
            .map_err(|e| Fail::from(e).context(&name))?;
        let key = PIPELINES.insert(Arc::new(PipelineEntry {
            pipeline: Mutex::new(Some(made)),
            name,
            device,
        }))?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(key.to_ptr(Kind::Pipeline)) };
        Ok(())
    })
}

/// Runs `f` on the live pipeline `ptr` names, locked.
pub(crate) fn with_pipeline<R>(
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
            // Checked before any slice is made of it: a `len` no memory has (SIZE_MAX, say)
            // is an error, not a slice.
            let want = p.model().input().bytes;
            if len as u64 > want {
                return Err(Fail::invalid(format!(
                    "len {len} is longer than the model's {want}-byte input"
                )));
            }
            let bytes: &[u8] = if len == 0 {
                &[]
            } else {
                // SAFETY: non-null, `len` readable bytes per this function's contract, and
                // `len` is at most the model's input size (a slot's length, so a real size).
                unsafe { std::slice::from_raw_parts(input.cast::<u8>(), len) }
            };
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
                compute: match p.compute() {
                    ComputeAt::Device => UDMA_COMPUTE_DEVICE,
                    ComputeAt::Host => UDMA_COMPUTE_HOST,
                    ComputeAt::Mixed => UDMA_COMPUTE_MIXED,
                },
                host_steps: s.host_steps,
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
