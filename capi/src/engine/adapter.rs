//! A C engine as the inference layer's [`Accelerator`]: its functions called one at a time
//! (a lock), ops turned into `udma_engine_op`s, completions checked against the tags in
//! flight, arenas freed and queues stopped when the pipeline is done with them.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use udma::dma::SoftIommu;
use udma::memory::PageSize;
use userdma_infer::accel::{
    self, Accelerator, Arena, Capabilities, Completion, Op, QueueSpec, Stopped, Unit,
};
use userdma_infer::pipeline::Step;

use super::*;
use crate::device::Device;

/// The functions every engine has (checked non-null at creation).
#[derive(Clone, Copy)]
pub(super) struct Functions {
    pub(super) open_queue:
        unsafe extern "C" fn(*mut c_void, u32, u32, u32, u32, *mut *mut c_void) -> c_int,
    pub(super) submit:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *const udma_engine_op, u64) -> c_int,
    pub(super) flush: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    pub(super) poll:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut udma_engine_completion) -> c_int,
    pub(super) stop_queue: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    pub(super) alloc_arena: unsafe extern "C" fn(*mut c_void, u64, u64, *mut u64) -> c_int,
    pub(super) free_arena: unsafe extern "C" fn(*mut c_void, u64),
    pub(super) read_arena: unsafe extern "C" fn(*mut c_void, u64, *mut c_void, usize) -> c_int,
    pub(super) write_arena: unsafe extern "C" fn(*mut c_void, u64, *const c_void, usize) -> c_int,
    pub(super) reset: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub(super) status_name: udma_engine_status_name_fn,
    pub(super) destroy: udma_engine_destroy_fn,
}

/// The C side: its functions and `user`, called one at a time (the lock).
pub(super) struct Calls {
    pub(super) f: Functions,
    pub(super) user: *mut c_void,
}

/// An engine given by C, as the inference layer's [`Accelerator`].
pub(crate) struct CEngine {
    pub(super) name: String,
    pub(super) flags: u32,
    pub(super) queues: u16,
    pub(super) calls: Mutex<Calls>,
    /// Host buffers: the device's DMA space, or a host-memory space of the engine's own.
    pub(super) host: Host,
    /// This engine (it always lives in an `Arc`): what its arenas and queues hold.
    pub(super) me: std::sync::Weak<CEngine>,
}

pub(super) enum Host {
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
    // A `udma_status` value, or its negative (what `poll` returns), keeps its meaning.
    let code = match rc.unsigned_abs() {
        1 => udma::Code::InvalidArgument,
        2 => udma::Code::NotFound,
        3 => udma::Code::Refused,
        4 => udma::Code::Busy,
        5 => udma::Code::Exhausted,
        6 => udma::Code::Timeout,
        8 => udma::Code::Unsupported,
        9 => udma::Code::System,
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
            Host::Memory(space) => Ok(udma::runtime::pool(space.as_ref(), bytes, PageSize::Base)?),
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
        // The pipeline checks the arena is what was asked for (`Arena::fault`), for every
        // accelerator: its error names this engine and `alloc_arena`.
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
        let c = self.lock();
        let Some(name) = c.f.status_name else {
            return accel::default_status_name(status);
        };
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
            Some(why) => Err(udma::device::Error::Backend(udma::device::Backend::new(
                udma::Code::Device,
                format!(
                    "{}: the engine broke queue {}'s contract: {why}; destroy the pipeline",
                    self.engine.name, self.id
                ),
            ))
            .into()),
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
                            "its poll gave a completion of tag {:#x} where the oldest op in flight \
                             has tag {tag:#x} (a queue completes in order)",
                            out.tag
                        ),
                        None => format!(
                            "its poll gave a completion of tag {:#x} with no op in flight",
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
