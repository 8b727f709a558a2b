//! Engines written in C (`udma_engine`): a table of functions (`udma_engine_ops`) through which
//! a C SDK brings its own device's operations, and gets the library's pipelines and streams on
//! it (`udma_pipeline_create_on_engine`, `udma_streams_create`).
//!
//! The library calls the table's functions one at a time per engine (never two at once, from
//! whichever thread drives the pipeline or resets its device), each with the `user` pointer
//! given at creation. A queue's ops run in order and complete in order; the library checks it
//! (a completion out of order, or of a tag it did not give, breaks the queue with
//! `UDMA_ERR_DEVICE`, never a crash), and keeps every buffer an op names untouched by the host
//! until the op's completion came back or `stop_queue` returned.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use udma::dma::SoftIommu;
use udma::memory::PageSize;
use udma::pool::{Config as PoolConfig, Pool};
use userdma_infer::accel::{
    self, Accelerator, Arena, Capabilities, Completion, Op, QueueSpec, Stopped, Unit,
};
use userdma_infer::pipeline::Step;

use crate::abi;
use crate::device::{device, udma_device, Device};
use crate::error::{call, udma_status, Fail};
use crate::handle::{Kind, Registry};

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
    /// `UDMA_OP_*`.
    pub kind: u32,
    /// `UDMA_STEP_*` for `UDMA_ENGINE_OP_STEP`.
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
/// `status_name` and `destroy` is required.
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

// SAFETY: `repr(C)`, `size` first; pointers and integers only, 8 + 8 + 4 + 4 + 12 * 8 = 120
// bytes with no padding (the two `u32`s fill one word).
unsafe impl abi::Sized for udma_engine_ops {
    const NAME: &'static str = "udma_engine_ops";
}

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

/// The functions every engine has (checked non-null at creation).
#[derive(Clone, Copy)]
struct Functions {
    open_queue: unsafe extern "C" fn(*mut c_void, u32, u32, u32, u32, *mut *mut c_void) -> c_int,
    submit: unsafe extern "C" fn(*mut c_void, *mut c_void, *const udma_engine_op, u64) -> c_int,
    flush: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    poll: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut udma_engine_completion) -> c_int,
    stop_queue: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    alloc_arena: unsafe extern "C" fn(*mut c_void, u64, u64, *mut u64) -> c_int,
    free_arena: unsafe extern "C" fn(*mut c_void, u64),
    read_arena: unsafe extern "C" fn(*mut c_void, u64, *mut c_void, usize) -> c_int,
    write_arena: unsafe extern "C" fn(*mut c_void, u64, *const c_void, usize) -> c_int,
    reset: unsafe extern "C" fn(*mut c_void) -> c_int,
    status_name: udma_engine_status_name_fn,
    destroy: udma_engine_destroy_fn,
}

/// The C side: its functions and `user`, called one at a time (the lock).
struct Calls {
    f: Functions,
    user: *mut c_void,
}

/// An engine given by C, as the inference layer's [`Accelerator`].
pub(crate) struct CEngine {
    name: String,
    flags: u32,
    queues: u16,
    calls: Mutex<Calls>,
    /// Host buffers: the device's DMA space, or a host-memory space of the engine's own.
    host: Host,
    /// This engine (it always lives in an `Arc`): what its arenas and queues hold.
    me: std::sync::Weak<CEngine>,
}

enum Host {
    Device(Arc<Device>),
    Memory(Arc<SoftIommu>),
}

// SAFETY: the C side is only reached through `calls`, one call at a time, which is what the
// engine's contract (the module docs, the header) lets C rely on; `user` is handed back to C
// only inside those calls. Everything else in a `CEngine` is Send and Sync by itself.
unsafe impl Send for CEngine {}
// SAFETY: as for `Send`: shared access reaches C only through the lock.
unsafe impl Sync for CEngine {}

impl Drop for Calls {
    fn drop(&mut self) {
        if let Some(destroy) = self.f.destroy {
            // SAFETY: the engine's contract: `destroy` is called once, last, with its `user`.
            unsafe { destroy(self.user) };
        }
    }
}

impl std::fmt::Debug for CEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CEngine")
            .field("name", &self.name)
            .field("flags", &self.flags)
            .field("queues", &self.queues)
            .finish()
    }
}

/// A C function's failure as an error of the inference layer: a `udma_status` value keeps its
/// meaning, anything else is the device's.
fn failed(engine: &str, function: &str, rc: c_int) -> userdma_infer::Error {
    let code = match rc {
        1 | 12 => udma::Code::InvalidArgument,
        2 => udma::Code::NotFound,
        4 => udma::Code::Busy,
        5 => udma::Code::Exhausted,
        6 => udma::Code::Timeout,
        8 => udma::Code::Unsupported,
        10 => udma::Code::Removed,
        _ => udma::Code::Device,
    };
    udma::device::Error::Backend(udma::device::Backend::new(
        code,
        format!("{engine}: the engine's {function} returned {rc}"),
    ))
    .into()
}

impl CEngine {
    fn lock(&self) -> MutexGuard<'_, Calls> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check(&self, function: &str, rc: c_int) -> Result<(), userdma_infer::Error> {
        if rc == 0 {
            Ok(())
        } else {
            Err(failed(&self.name, function, rc))
        }
    }
}

/// The C op of `op`.
fn c_op(op: &Op) -> udma_engine_op {
    let mut c = udma_engine_op::default();
    match *op {
        Op::ToDevice { from, to } => {
            c.kind = UDMA_ENGINE_OP_TO_DEVICE;
            c.host_iova = from.iova.raw();
            c.host = from.ptr.as_ptr().cast();
            c.len = from.len;
            c.arena_at = to;
        }
        Op::ToHost { from, to } => {
            c.kind = UDMA_ENGINE_OP_TO_HOST;
            c.host_iova = to.iova.raw();
            c.host = to.ptr.as_ptr().cast();
            c.len = to.len;
            c.arena_at = from;
        }
        Op::After { queue, count } => {
            c.kind = UDMA_ENGINE_OP_AFTER;
            c.after_queue = u32::from(queue);
            c.after_count = count;
        }
        Op::Step { arena, step } => {
            c.kind = UDMA_ENGINE_OP_STEP;
            c.arena_at = arena;
            match step {
                Step::Compute {
                    src,
                    dst,
                    len,
                    xor,
                    add,
                } => {
                    c.step = UDMA_ENGINE_STEP_COMPUTE;
                    (c.src, c.dst, c.len, c.xor_mask, c.add) = (src, dst, len, xor, add);
                }
                Step::Layer {
                    inputs,
                    count,
                    dst,
                    len,
                    seed,
                } => {
                    c.step = UDMA_ENGINE_STEP_LAYER;
                    for (k, &(offset, bytes)) in inputs.iter().enumerate() {
                        c.input_offset[k] = offset;
                        c.input_len[k] = bytes;
                    }
                    (c.inputs, c.dst, c.len, c.seed) = (u32::from(count), dst, len, seed);
                }
                Step::Compact {
                    src,
                    len,
                    dst,
                    params,
                } => {
                    c.step = UDMA_ENGINE_STEP_COMPACT;
                    (c.src, c.len, c.dst) = (src, len, dst);
                    c.record = params.record;
                    c.score_at = params.score_at;
                    c.threshold = params.threshold;
                    c.capacity = params.capacity;
                }
            }
        }
    }
    c
}

impl Accelerator for CEngine {
    fn identity(&self) -> String {
        self.name.clone()
    }

    fn capabilities(&self) -> Capabilities {
        let has = |flag| self.flags & flag != 0;
        Capabilities {
            kind: "C engine",
            compute: has(UDMA_ENGINE_COMPUTE),
            filter: has(UDMA_ENGINE_FILTER),
            separate_units: has(UDMA_ENGINE_SEPARATE_UNITS),
            cross_queue_order: has(UDMA_ENGINE_CROSS_QUEUE_ORDER),
            device_memory: has(UDMA_ENGINE_DEVICE_MEMORY),
            read_in_place: has(UDMA_ENGINE_READ_IN_PLACE),
            contexts: has(UDMA_ENGINE_CONTEXTS),
            interrupts: false,
            queues: self.queues,
        }
    }

    fn host_pool(&self, bytes: usize) -> Result<Arc<udma::pool::Pool>, userdma_infer::Error> {
        match &self.host {
            Host::Device(d) => Ok(d.runtime.pool(bytes, PageSize::Base)?),
            Host::Memory(space) => {
                let mapping = udma::runtime::map_memory(space.as_ref(), bytes, PageSize::Base)?;
                Ok(Arc::new(Pool::new(
                    mapping,
                    PoolConfig::default().chunk_size(64 << 10),
                )?))
            }
        }
    }

    fn alloc_arena(&self, bytes: u64, align: u64) -> Result<Arena, userdma_infer::Error> {
        let mut at = 0u64;
        let rc = {
            let c = self.lock();
            // SAFETY: the engine's contract; `at` is a valid `uint64_t *` for the call.
            unsafe { (c.f.alloc_arena)(c.user, bytes, align, &mut at) }
        };
        self.check("alloc_arena", rc)?;
        Ok(Arena {
            at,
            bytes,
            keep: Box::new(ArenaGuard {
                engine: self.myself(),
                at,
            }),
        })
    }

    fn read_arena(&self, at: u64, dst: &mut [u8]) -> Result<(), userdma_infer::Error> {
        let rc = {
            let c = self.lock();
            // SAFETY: `dst` is valid for writes of its length during the call.
            unsafe { (c.f.read_arena)(c.user, at, dst.as_mut_ptr().cast(), dst.len()) }
        };
        self.check("read_arena", rc)
    }

    fn write_arena(&self, at: u64, src: &[u8]) -> Result<(), userdma_infer::Error> {
        let rc = {
            let c = self.lock();
            // SAFETY: `src` is valid for reads of its length during the call.
            unsafe { (c.f.write_arena)(c.user, at, src.as_ptr().cast(), src.len()) }
        };
        self.check("write_arena", rc)
    }

    fn open_queue(&self, spec: QueueSpec) -> Result<Box<dyn accel::Queue>, userdma_infer::Error> {
        if spec.id >= self.queues {
            return Err(udma::device::Error::NoSuchQueue {
                index: u32::from(spec.id),
                count: u32::from(self.queues),
            }
            .into());
        }
        let unit = match spec.unit {
            Unit::Copy => 0,
            Unit::Compute => 1,
        };
        let mut q = std::ptr::null_mut();
        let rc = {
            let c = self.lock();
            // SAFETY: the engine's contract; `q` is a valid `void **` for the call.
            unsafe {
                (c.f.open_queue)(
                    c.user,
                    u32::from(spec.id),
                    spec.depth,
                    spec.context,
                    unit,
                    &mut q,
                )
            }
        };
        self.check("open_queue", rc)?;
        Ok(Box::new(CQueue {
            engine: self.myself(),
            q,
            id: spec.id,
            depth: spec.depth as usize,
            outstanding: VecDeque::with_capacity(spec.depth as usize),
            broken: None,
            stopped: false,
        }))
    }

    fn reset(&self) -> Result<(), userdma_infer::Error> {
        let rc = {
            let c = self.lock();
            // SAFETY: the engine's contract.
            unsafe { (c.f.reset)(c.user) }
        };
        self.check("reset", rc)
    }

    fn is_removed(&self) -> bool {
        match &self.host {
            Host::Device(d) => d.runtime.device().is_removed(),
            Host::Memory(_) => false,
        }
    }

    fn status_name(&self, status: u32) -> &'static str {
        let Some(name) = self.lock().f.status_name else {
            return accel::default_status_name(status);
        };
        let c = self.lock();
        // SAFETY: the engine's contract: a static string or NULL.
        let text = unsafe { name(c.user, status) };
        if text.is_null() {
            return accel::default_status_name(status);
        }
        // SAFETY: non-null, and static per the contract.
        let text: &'static CStr = unsafe { CStr::from_ptr(text) };
        text.to_str().unwrap_or("(a status name that is not UTF-8)")
    }
}

/// Frees an arena when the pipeline is done with it.
struct ArenaGuard {
    engine: Arc<CEngine>,
    at: u64,
}

impl Drop for ArenaGuard {
    fn drop(&mut self) {
        let c = self.engine.lock();
        // SAFETY: the engine's contract; `at` came from its `alloc_arena`, freed once.
        unsafe { (c.f.free_arena)(c.user, self.at) };
    }
}

/// A queue of a C engine.
struct CQueue {
    engine: Arc<CEngine>,
    q: *mut c_void,
    id: u16,
    depth: usize,
    /// Tags of the ops submitted and not completed, in order.
    outstanding: VecDeque<u64>,
    /// The engine broke the queue's contract: why (every later call fails with it).
    broken: Option<String>,
    stopped: bool,
}

// SAFETY: `q` is the engine's, passed back to it only through the engine's lock (see
// `CEngine`); a queue is used by one thread at a time (it is `&mut` for every call).
unsafe impl Send for CQueue {}

impl CQueue {
    fn broken(&self) -> Result<(), userdma_infer::Error> {
        match &self.broken {
            Some(why) => Err(failed(&self.engine.name, why, -1)),
            None => Ok(()),
        }
    }

    /// Stops the queue on the engine (once).
    fn stop(&mut self) -> c_int {
        if self.stopped {
            return 0;
        }
        self.stopped = true;
        let c = self.engine.lock();
        // SAFETY: the engine's contract; `q` came from its `open_queue`, stopped once.
        unsafe { (c.f.stop_queue)(c.user, self.q) }
    }
}

impl Drop for CQueue {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

impl accel::Queue for CQueue {
    fn id(&self) -> u16 {
        self.id
    }

    fn push(&mut self, op: Op, tag: u64) -> Result<(), userdma_infer::Error> {
        self.broken()?;
        if self.outstanding.len() >= self.depth {
            return Err(udma::ring::Error::Full {
                queue: self.id,
                depth: self.depth as u32,
            }
            .into());
        }
        let op = c_op(&op);
        let rc = {
            let c = self.engine.lock();
            // SAFETY: the engine's contract; `op` is valid during the call.
            unsafe { (c.f.submit)(c.user, self.q, &op, tag) }
        };
        self.engine.check("submit", rc)?;
        self.outstanding.push_back(tag);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), userdma_infer::Error> {
        self.broken()?;
        let rc = {
            let c = self.engine.lock();
            // SAFETY: the engine's contract.
            unsafe { (c.f.flush)(c.user, self.q) }
        };
        self.engine.check("flush", rc)
    }

    fn poll(&mut self) -> Result<Option<Completion>, userdma_infer::Error> {
        self.broken()?;
        let mut out = udma_engine_completion::default();
        let rc = {
            let c = self.engine.lock();
            // SAFETY: the engine's contract; `out` is valid for writes during the call.
            unsafe { (c.f.poll)(c.user, self.q, &mut out) }
        };
        match rc {
            0 => Ok(None),
            1 => {
                let expected = self.outstanding.front().copied();
                if expected != Some(out.tag) {
                    let why = match expected {
                        Some(tag) => format!(
                            "poll (a completion of tag {:#x} where the oldest op in flight has tag {tag:#x}: \
                             a queue completes in order)",
                            out.tag
                        ),
                        None => format!(
                            "poll (a completion of tag {:#x} with no op in flight)",
                            out.tag
                        ),
                    };
                    self.broken = Some(why);
                    return self.broken().map(|()| None);
                }
                self.outstanding.pop_front();
                Ok(Some(Completion {
                    tag: out.tag,
                    status: out.status,
                    result: out.result,
                    queue: self.id,
                    command: out.command as u16,
                }))
            }
            rc => Err(failed(&self.engine.name, "poll", rc)),
        }
    }

    fn overdue(&self, waited: Duration) -> userdma_infer::Error {
        udma::ring::Error::Timeout {
            queue: self.id,
            waited,
            in_flight: self.outstanding.len(),
            oldest: None,
        }
        .into()
    }

    fn shutdown(mut self: Box<Self>) -> Result<Stopped, userdma_infer::Error> {
        // What completed before the stop is handed back as completed; everything else is
        // aborted once the engine has stopped touching it.
        let mut completed = Vec::new();
        while self.broken.is_none() {
            match accel::Queue::poll(self.as_mut()) {
                Ok(Some(done)) => completed.push(done),
                Ok(None) | Err(_) => break,
            }
        }
        let rc = self.stop();
        self.engine.check("stop_queue", rc)?;
        Ok(Stopped {
            completed,
            aborted: self.outstanding.drain(..).collect(),
        })
    }
}

impl CEngine {
    /// This engine, shared (every engine lives in an `Arc`, made by `udma_engine_create`).
    fn myself(&self) -> Arc<CEngine> {
        self.me
            .upgrade()
            .expect("an engine is reached only through its Arc")
    }
}

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
