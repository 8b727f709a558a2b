//! Engines written in C (`udma_engine`): a table of functions (`udma_engine_ops`) through which
//! a C SDK brings its own device's operations, and gets the library's pipelines and streams on
//! it (`udma_pipeline_create_on_engine`, `udma_streams_create`).
//!
//! The library calls the table's functions one at a time per engine (never two at once, from
//! whichever thread drives the pipeline or resets its device), each with the `user` pointer
//! given at creation. An engine's function may call the library's device, register, memory,
//! pool and buffer functions (the library holds none of their locks while it calls the engine),
//! but not the pipeline and streams functions of a pipeline on that engine. A function returns
//! 0 or an error: a `udma_status` value (or, from `poll`, its negative) keeps its meaning,
//! anything else is `UDMA_ERR_DEVICE`. A queue's ops run in order and complete in order; the library checks it
//! (a completion out of order, or of a tag it did not give, breaks the queue with
//! `UDMA_ERR_DEVICE`, never a crash), and keeps every buffer an op names untouched by the host
//! until the op's completion came back or `stop_queue` returned.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex};

use udma::dma::SoftIommu;

use crate::abi;
use crate::device::{device, udma_device, Device};
use crate::error::{call, udma_status, Fail};
use crate::handle::{Kind, Registry};

#[path = "engine/adapter.rs"]
mod adapter;

pub(crate) use adapter::CEngine;
use adapter::{Calls, Functions, Host};

/// An engine: a device's operations given by a C table. Made by `udma_engine_create`,
/// released by `udma_engine_destroy` (pipelines made on it keep it until they are destroyed).
#[derive(Debug)]
pub struct udma_engine {
    _opaque: [u8; 0],
}

/// The engine runs the model's `COMPUTE` and `LAYER` steps (without it they run on the host).
pub const UDMA_ENGINE_COMPUTE: u32 = 1;
/// The engine runs `COMPACT` steps (on-device filtering).
pub const UDMA_ENGINE_FILTER: u32 = 2;
/// Copy and compute are separate units that run at once (queues opened with unit 1 compute).
pub const UDMA_ENGINE_SEPARATE_UNITS: u32 = 4;
/// A queue's op can wait for another queue's (`UDMA_ENGINE_OP_AFTER`).
pub const UDMA_ENGINE_CROSS_QUEUE_ORDER: u32 = 8;
/// Arenas are in device memory.
pub const UDMA_ENGINE_DEVICE_MEMORY: u32 = 16;
/// `read_arena` is cheap enough to read results in place.
pub const UDMA_ENGINE_READ_IN_PLACE: u32 = 32;
/// Queues run in contexts and the device charges switches between them.
pub const UDMA_ENGINE_CONTEXTS: u32 = 64;
const FLAGS: u32 = 127;

/// `udma_engine_op::kind`: copy `len` bytes from the host buffer to arena address `arena_at`.
pub const UDMA_ENGINE_OP_TO_DEVICE: u32 = 1;
/// `udma_engine_op::kind`: copy `len` bytes at arena address `arena_at` to the host buffer.
pub const UDMA_ENGINE_OP_TO_HOST: u32 = 2;
/// `udma_engine_op::kind`: run step `step` over the arena at `arena_at` (offsets from there).
pub const UDMA_ENGINE_OP_STEP: u32 = 3;
/// `udma_engine_op::kind`: wait until the first `after_count` ops pushed to queue
/// `after_queue` (since it was opened) completed.
pub const UDMA_ENGINE_OP_AFTER: u32 = 4;

/// `udma_engine_op::step`: each little-endian 32-bit word `w` of `len` bytes at `src` becomes
/// `(w ^ xor_mask) + add` at `dst`.
pub const UDMA_ENGINE_STEP_COMPUTE: u32 = 1;
/// `udma_engine_op::step`: a model layer, the loopback NPU's `Layer` (inputs, `seed`).
pub const UDMA_ENGINE_STEP_LAYER: u32 = 2;
/// `udma_engine_op::step`: on-device filtering, the loopback NPU's `Compact`.
pub const UDMA_ENGINE_STEP_COMPACT: u32 = 3;

/// One op of a frame, as the engine's `submit` gets it (152 bytes). Which fields mean something depends on
/// `kind` (and `step`); the others are zero.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct udma_engine_op {
    /// `UDMA_ENGINE_OP_*`.
    pub kind: u32,
    /// `UDMA_ENGINE_STEP_*` for `UDMA_ENGINE_OP_STEP`.
    pub step: u32,
    /// Transfers: the host buffer's IOVA in the device's DMA space.
    pub host_iova: u64,
    /// Transfers: the host buffer's address in this process.
    pub host: *mut c_void,
    /// Transfers: bytes; steps: the bytes the step reads (`COMPUTE`, `COMPACT`) or writes
    /// (`LAYER`).
    pub len: u64,
    /// Transfers: the arena address; steps: the arena's base.
    pub arena_at: u64,
    /// Steps: where it reads (`COMPUTE`, `COMPACT`), from `arena_at`.
    pub src: u64,
    /// Steps: where it writes, from `arena_at`.
    pub dst: u64,
    /// `COMPUTE`: the word mask and addend.
    pub xor_mask: u32,
    /// `COMPUTE`: the addend.
    pub add: u32,
    /// `LAYER`: the inputs' offsets from `arena_at` (the first `inputs` are present).
    pub input_offset: [u64; 3],
    /// `LAYER`: the inputs' lengths.
    pub input_len: [u64; 3],
    /// `LAYER`: how many inputs (1 to 3).
    pub inputs: u32,
    /// `LAYER`: the layer's seed.
    pub seed: u32,
    /// `COMPACT`: record size, score offset, threshold and capacity (records kept at most).
    pub record: u32,
    /// `COMPACT`: the score's byte offset in a record.
    pub score_at: u32,
    /// `COMPACT`: a record survives if its score is at least this.
    pub threshold: u32,
    /// `COMPACT`: records kept at most.
    pub capacity: u32,
    /// `UDMA_ENGINE_OP_AFTER`: the queue waited for.
    pub after_queue: u32,
    /// Zero.
    pub reserved: u32,
    /// `UDMA_ENGINE_OP_AFTER`: how many of its ops.
    pub after_count: u64,
}

/// A completion, as the engine's `poll` writes it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct udma_engine_completion {
    /// The tag the op was submitted with.
    pub tag: u64,
    /// 0: done; otherwise the engine's status code (named by `status_name`).
    pub status: u32,
    /// The engine's id of the op, for messages.
    pub command: u32,
    /// A result word (an address or offset for range errors).
    pub result: u64,
}

/// Opens queue `queue` of `depth` ops (a power of two) in context `context`, served by `unit`
/// (0 copy, 1 compute), and sets `*q` to the engine's queue. Returns 0, or an error.
pub type udma_engine_open_queue_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        queue: u32,
        depth: u32,
        context: u32,
        unit: u32,
        q: *mut *mut c_void,
    ) -> c_int,
>;
/// Queues `op` with `tag` on `q`; it may run at once or at the next `flush`. `op` is valid
/// during the call. Returns 0, or an error (a full queue: `UDMA_ERR_EXHAUSTED`).
pub type udma_engine_submit_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        q: *mut c_void,
        op: *const udma_engine_op,
        tag: u64,
    ) -> c_int,
>;
/// Starts every op submitted to `q` (a doorbell). Returns 0, or an error.
pub type udma_engine_flush_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, q: *mut c_void) -> c_int>;
/// Writes `q`'s next completion (in submission order) to `*out` and returns 1; returns 0 when
/// none is in, or a negative error.
pub type udma_engine_poll_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        q: *mut c_void,
        out: *mut udma_engine_completion,
    ) -> c_int,
>;
/// Stops `q` and frees it: when it returns 0 the engine touches no buffer of `q`'s ops any
/// more (the library takes every op that did not complete as aborted). Returns 0, or an
/// error (the buffers are then leaked, never reused).
pub type udma_engine_stop_queue_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, q: *mut c_void) -> c_int>;
/// Allocates an arena of `bytes` aligned to `align` and sets `*at` to its address as ops name
/// it. Returns 0, or an error (out of memory: `UDMA_ERR_EXHAUSTED`).
pub type udma_engine_alloc_arena_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, bytes: u64, align: u64, at: *mut u64) -> c_int>;
/// Frees the arena at `at`.
pub type udma_engine_free_arena_fn = Option<unsafe extern "C" fn(user: *mut c_void, at: u64)>;
/// Reads `len` bytes at arena address `at` into `dst`. Returns 0, or an error.
pub type udma_engine_read_arena_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, at: u64, dst: *mut c_void, len: usize) -> c_int>;
/// Writes `len` bytes from `src` at arena address `at`. Returns 0, or an error.
pub type udma_engine_write_arena_fn = Option<
    unsafe extern "C" fn(user: *mut c_void, at: u64, src: *const c_void, len: usize) -> c_int,
>;
/// Resets the device: every queue stops at once. Returns 0, or an error.
pub type udma_engine_reset_fn = Option<unsafe extern "C" fn(user: *mut c_void) -> c_int>;
/// The name of status code `status` (a static string), or NULL.
pub type udma_engine_status_name_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, status: u32) -> *const c_char>;
/// Called once, when the last pipeline on the engine and the engine handle are gone.
pub type udma_engine_destroy_fn = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// An engine's functions and capabilities (`udma_engine_create`). Every function but
/// `status_name` and `destroy` is required. The library calls them one at a time per engine
/// (never two at once), from whichever thread drives a pipeline or resets the device. They may
/// call the library's device, register, memory, pool and buffer functions, not the pipeline and
/// streams functions of a pipeline on the engine. Each returns 0 or an error: a `udma_status`
/// value (from `poll`, its negative) keeps its meaning, anything else is `UDMA_ERR_DEVICE`. A
/// queue's ops complete in submission order; the library polls (a C engine raises no
/// interrupt the library sleeps on), so `poll` should be cheap when nothing is in.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_engine_ops {
    /// `sizeof(udma_engine_ops)`.
    pub size: usize,
    /// The device's name for messages (copied; NULL: "C engine").
    pub name: *const c_char,
    /// `UDMA_ENGINE_*` capabilities.
    pub flags: u32,
    /// Queues, ids 0 to `queues - 1` (at least 1).
    pub queues: u32,
    /// Opens a queue.
    pub open_queue: udma_engine_open_queue_fn,
    /// Queues an op.
    pub submit: udma_engine_submit_fn,
    /// Starts the queued ops.
    pub flush: udma_engine_flush_fn,
    /// Takes a completion.
    pub poll: udma_engine_poll_fn,
    /// Stops and frees a queue.
    pub stop_queue: udma_engine_stop_queue_fn,
    /// Allocates an arena.
    pub alloc_arena: udma_engine_alloc_arena_fn,
    /// Frees an arena.
    pub free_arena: udma_engine_free_arena_fn,
    /// Reads an arena.
    pub read_arena: udma_engine_read_arena_fn,
    /// Writes an arena.
    pub write_arena: udma_engine_write_arena_fn,
    /// Resets the device.
    pub reset: udma_engine_reset_fn,
    /// Names a status code (optional).
    pub status_name: udma_engine_status_name_fn,
    /// Releases `user` (optional).
    pub destroy: udma_engine_destroy_fn,
}

impl Default for udma_engine_ops {
    fn default() -> Self {
        udma_engine_ops {
            size: size_of::<udma_engine_ops>(),
            name: std::ptr::null(),
            flags: 0,
            queues: 0,
            open_queue: None,
            submit: None,
            flush: None,
            poll: None,
            stop_queue: None,
            alloc_arena: None,
            free_arena: None,
            read_arena: None,
            write_arena: None,
            reset: None,
            status_name: None,
            destroy: None,
        }
    }
}

// SAFETY: `repr(C)`; integers, a raw pointer (any bit pattern is a valid raw pointer value)
// and `Option`s of `extern "C"` function pointers (zero is `None`, any other bit pattern a
// valid `Some`: a function pointer's only invalid value is null), 8 + 8 + 4 + 4 + 12 * 8 = 120
// bytes with no padding (the two `u32`s fill one word).
unsafe impl abi::Bytes for udma_engine_ops {}
abi::sized!(udma_engine_ops);

const _: () = assert!(
    size_of::<udma_engine_ops>() == 120,
    "the size of udma_engine_ops is not 120"
);
// 8 + 8 * 6 + 8 + 24 + 24 + 8 + 16 + 8 + 8: no padding.
const _: () = assert!(
    size_of::<udma_engine_op>() == 152,
    "the size of udma_engine_op is not 152"
);
const _: () = assert!(
    size_of::<udma_engine_completion>() == 24,
    "the size of udma_engine_completion is not 24"
);

pub(crate) struct EngineEntry {
    pub(crate) engine: Arc<CEngine>,
    /// Keeps the device open for as long as the engine.
    pub(crate) device: Option<Arc<Device>>,
}

pub(crate) static ENGINES: Registry<EngineEntry> = Registry::new(Kind::Engine);

/// The engine `ptr` names.
pub(crate) fn engine(ptr: *const udma_engine) -> Result<(Arc<CEngine>, Option<Arc<Device>>), Fail> {
    ENGINES.with(ptr, |_, e| Ok((Arc::clone(&e.engine), e.device.clone())))
}

/// Makes an engine from `ops` and `user`: over `device` (its DMA space holds the pipelines'
/// host buffers; keeps it open) or, with `device` NULL, over host memory of its own (for an
/// engine that reaches host buffers by their addresses).
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a NULL required function (named), flags that are
/// not `UDMA_ENGINE_*`, no queues, or a name that is not UTF-8.
///
/// # Safety
/// `ops` points to `ops->size` readable bytes; its `name` is NULL or a NUL-terminated string;
/// its functions keep the contract the header states; `engine` points to a writable
/// `udma_engine *`.
#[no_mangle]
pub unsafe extern "C" fn udma_engine_create(
    device: *const udma_device,
    ops: *const udma_engine_ops,
    user: *mut c_void,
    engine: *mut *mut udma_engine,
) -> udma_status {
    call("udma_engine_create", || {
        let out = abi::out(engine, "engine")?;
        // SAFETY: readable per this function's contract.
        let o = unsafe { abi::read(ops, "ops", udma_engine_ops::default())? };
        let missing = |what: &str| {
            Fail::invalid(format!(
                "ops->{what} is NULL: every function of udma_engine_ops but status_name and \
                 destroy is required"
            ))
        };
        let f = Functions {
            open_queue: o.open_queue.ok_or_else(|| missing("open_queue"))?,
            submit: o.submit.ok_or_else(|| missing("submit"))?,
            flush: o.flush.ok_or_else(|| missing("flush"))?,
            poll: o.poll.ok_or_else(|| missing("poll"))?,
            stop_queue: o.stop_queue.ok_or_else(|| missing("stop_queue"))?,
            alloc_arena: o.alloc_arena.ok_or_else(|| missing("alloc_arena"))?,
            free_arena: o.free_arena.ok_or_else(|| missing("free_arena"))?,
            read_arena: o.read_arena.ok_or_else(|| missing("read_arena"))?,
            write_arena: o.write_arena.ok_or_else(|| missing("write_arena"))?,
            reset: o.reset.ok_or_else(|| missing("reset"))?,
            status_name: o.status_name,
            destroy: o.destroy,
        };
        if o.flags & !FLAGS != 0 {
            return Err(Fail::invalid(format!(
                "ops->flags {:#x} has bits that are not UDMA_ENGINE_* flags",
                o.flags
            )));
        }
        let queues = u16::try_from(o.queues)
            .ok()
            .filter(|&q| q > 0)
            .ok_or_else(|| {
                Fail::invalid(format!("ops->queues is {}: give 1 to 65535", o.queues))
            })?;
        let name = if o.name.is_null() {
            "C engine".to_owned()
        } else {
            // SAFETY: non-null, NUL-terminated per this function's contract.
            let name = unsafe { CStr::from_ptr(o.name) };
            name.to_str()
                .map_err(|_| Fail::invalid("ops->name is not UTF-8"))?
                .chars()
                .take(64)
                .collect()
        };
        let device = if device.is_null() {
            None
        } else {
            Some(self::device(device)?)
        };
        let host = match &device {
            Some(d) => Host::Device(Arc::clone(d)),
            None => Host::Memory(Arc::new(
                SoftIommu::new(48).map_err(|e| crate::error::lib(e).context(&name))?,
            )),
        };
        let made = Arc::new_cyclic(|me| CEngine {
            name,
            flags: o.flags,
            queues,
            calls: Mutex::new(Calls { f, user }),
            host,
            me: me.clone(),
        });
        let key = ENGINES.insert(EngineEntry {
            engine: made,
            device,
        })?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(key.to_ptr(Kind::Engine)) };
        Ok(())
    })
}

/// Releases the engine handle. Pipelines made on it keep the engine until they are destroyed;
/// its `destroy` function is called when the last of them is gone.
///
/// # Safety
/// `engine` is a handle from `udma_engine_create` (checked).
#[no_mangle]
pub unsafe extern "C" fn udma_engine_destroy(engine: *mut udma_engine) -> udma_status {
    call("udma_engine_destroy", || {
        ENGINES.remove_if(engine, |_| Ok(())).map(drop)
    })
}
