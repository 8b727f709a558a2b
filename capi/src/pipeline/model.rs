//! Models (`udma_model`): a chain of compute steps, or the YOLOv5s-like graph of the model
//! zoo; their sizes, and their expected output computed on the host.

use std::ffi::c_void;
use std::sync::Arc;

use userdma_infer::pipeline::{zoo, Model};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi;
use crate::error::{call, lib, udma_status, Fail};
use crate::handle::{Kind, Registry};

/// A model a pipeline runs: an arena of device memory, the input tensor, the result tensor
/// and the device steps between. Made by `udma_model_create_chain` or
/// `udma_model_create_yolov5s`, destroyed by `udma_model_destroy` (a pipeline keeps its own
/// copy).
#[derive(Debug)]
pub struct udma_model {
    _opaque: [u8; 0],
}

static MODELS: Registry<Arc<Model>> = Registry::new(Kind::Model);

pub(super) fn model(ptr: *const udma_model) -> Result<Arc<Model>, Fail> {
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
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
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

abi::sized!(udma_model_info);

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
        // Only the model's sizes are read and written: the slices are made that long, so a
        // length no memory has (SIZE_MAX, say) never becomes a slice. Both fit in `usize`
        // (each is at most the length given, checked above).
        let (need_in, need_out) = (need_in as usize, need_out as usize);
        // SAFETY: non-null and `need_in <= input_len` readable bytes per this function's
        // contract.
        let input = unsafe { std::slice::from_raw_parts(input.cast::<u8>(), need_in) };
        // SAFETY: non-null and `need_out <= result_len` writable bytes per this function's
        // contract, and not the library's memory (so not aliased by `input`'s slice of the
        // caller's either: the contract gives two buffers).
        let result = unsafe { std::slice::from_raw_parts_mut(result.cast::<u8>(), need_out) };
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
