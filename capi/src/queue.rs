//! Queues: descriptors with the buffers they name go in, completions with those buffers come
//! out. Submitting moves a buffer into the queue (its handle then says `UDMA_BUFFER_IN_QUEUE`
//! and it cannot be freed, read or written through the library); its completion moves it
//! back, under the same handle.
//!
//! Each queue is behind a mutex: calls on one queue from several threads are serialized (a
//! queue is best used by one thread). Locks are always taken queue first, then the buffer
//! table, never the other way round.

use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use udma::device::Wait;
use udma::dma::{DeviceOffset, Iova};
use udma::{irq, ring};
use userdma_loopback::{self as loopback, Descriptor};

use crate::abi;
use crate::device::{device, timeout, udma_device, Device};
use crate::error::{call, cstr, lib, udma_status, Fail};
use crate::handle::{Key, Kind, Registry};
use crate::memory::{self, udma_buffer, HostBuffer};
use userdma_loopback::LoopbackRuntime as _;

/// A hardware queue of a device, made by `udma_queue_create`, destroyed by
/// `udma_queue_destroy`.
#[derive(Debug)]
pub struct udma_queue {
    _opaque: [u8; 0],
}

/// What travels with a command: the buffer it names (with its handle) and the caller's tag.
struct Flight {
    buffer: Option<(Key, HostBuffer)>,
    user_data: u64,
}

struct QueueEntry {
    /// `None` once destroyed (a call holding a clone of the entry then finds nothing).
    queue: Mutex<Option<loopback::Queue<Flight>>>,
    /// The handle value, which buffers in the queue name.
    handle: u64,
    /// `loopback0 queue 1`, for messages.
    name: String,
    /// Keeps the device open for as long as the queue.
    _device: Arc<Device>,
}

impl QueueEntry {
    fn lock(&self) -> MutexGuard<'_, Option<loopback::Queue<Flight>>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

static QUEUES: Registry<Arc<QueueEntry>> = Registry::new(Kind::Queue);

/// Runs `f` on the live queue `ptr` names, with the queue locked.
fn with_queue<R>(
    ptr: *const udma_queue,
    f: impl FnOnce(&QueueEntry, &mut loopback::Queue<Flight>) -> Result<R, Fail>,
) -> Result<R, Fail> {
    let entry = QUEUES.with(ptr, |_, q| Ok(Arc::clone(q)))?;
    let mut guard = entry.lock();
    let queue = guard.as_mut().ok_or_else(|| {
        Fail::handle(format!(
            "{} was destroyed (by another thread, during this call)",
            entry.name
        ))
    })?;
    f(&entry, queue).map_err(|fail| fail.context(&entry.name))
}

/// `udma_queue_options.unit`: which unit of the loopback device serves the queue.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_unit {
    /// The copy (DMA) engine (the default).
    UDMA_UNIT_COPY = 0,
    /// The compute unit, which runs concurrently with the copy engine.
    UDMA_UNIT_COMPUTE = 1,
}

/// `udma_queue_options.flags`: no interrupt; waits poll (and `udma_queue_wait_any` refuses
/// the queue).
pub const UDMA_QUEUE_POLL: u32 = 1;

/// How to open a queue. Zero is the default for every field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct udma_queue_options {
    /// `sizeof(udma_queue_options)`.
    pub size: usize,
    /// Entries per ring, a power of two from 2 to the device's largest; 0: 64.
    pub depth: u32,
    /// Which of the device's queues (0 to its queue count - 1).
    pub index: u32,
    /// The device context descriptors run in (each op's `context` must be this).
    pub context: u32,
    /// A `udma_unit`; 0: the copy engine.
    pub unit: u32,
    /// `UDMA_QUEUE_POLL` or 0.
    pub flags: u32,
    /// Zero.
    pub reserved: u32,
}

// SAFETY: `repr(C)`, integers only, 8 + 6 * 4 = 32 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_queue_options {
    const NAME: &'static str = "udma_queue_options";
}

/// What an op does (`udma_op.opcode`): the loopback device's opcodes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_opcode {
    /// Nothing (a marker in the queue's order).
    UDMA_OP_NOP = 0,
    /// Host to device: `len` bytes of `buffer` at `buffer_offset` to device memory at
    /// `device_offset`.
    UDMA_OP_TO_DEVICE = 1,
    /// Device to host: `len` bytes of device memory at `device_offset` into `buffer` at
    /// `buffer_offset`.
    UDMA_OP_TO_HOST = 2,
    /// `len` bytes within device memory, from `device_src` to `device_offset`.
    UDMA_OP_DEVICE_COPY = 3,
    /// `len` bytes of device memory at `device_offset` set to the byte `arg0`.
    UDMA_OP_FILL = 4,
    /// Each 32-bit word `w` of the `len` bytes at `device_src` becomes `(w ^ arg0) + arg1` at
    /// `device_offset` (all multiples of 4); the completion's result is the sum of the words
    /// written.
    UDMA_OP_COMPUTE = 5,
    /// Waits until queue `arg0` of the device has completed `arg1` descriptors.
    UDMA_OP_WAIT = 6,
    /// A model layer: `len` bytes of output at `device_offset` from up to three input tensors
    /// in device memory: input 0 at `device_src`, `arg0` bytes (required); input 1 at `arg1`,
    /// `arg2` bytes; input 2 at `arg3`, `arg4` bytes (a length of 0: the input is absent, and
    /// its offset must be 0; input 2 only with input 1); the layer's seed in `arg5` (32 bits).
    /// Output word `j` (little-endian `u32`) is `mix(seed, j, w_0, w_1, ...)` of word
    /// `j mod words_k` of each present input `k` (a shorter input repeats), where `mix` starts
    /// from `h = seed ^ (j * 0x9e3779b9)` and takes each word `w` as
    /// `h = rotl32((h ^ w) * 0x85ebca6b, 13)` (all 32-bit). Every offset and length a multiple
    /// of 4 (else the completion says `misaligned`), the output overlapping no input (else
    /// `overlap`). The completion's result is the wrapping 64-bit sum of the output words.
    UDMA_OP_LAYER = 7,
    /// Result filtering: of the `len` bytes at `device_src`, read as records of `arg0` bytes
    /// (4 to 4096, a multiple of 4; `len` a multiple of it), keeps those whose little-endian
    /// `u32` score at byte `arg1` of the record (a multiple of 4, inside it) is at least `arg2`;
    /// writes at `device_offset` (`8 + arg3 * arg0` bytes, overlapping no input) the `u32`
    /// count of survivors written (at most the capacity `arg3`), the `u32` count found
    /// (saturating), then the first survivors in input order, packed, and zeros in the slots
    /// left over. The completion's result is the count found. `arg0` to `arg3` are 32-bit.
    UDMA_OP_COMPACT = 8,
}

/// One descriptor to submit. Zero is the default for every field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_op {
    /// `sizeof(udma_op)`.
    pub size: usize,
    /// A `udma_opcode`.
    pub opcode: u32,
    /// The device context (the queue's).
    pub context: u32,
    /// The host buffer of `UDMA_OP_TO_DEVICE` / `UDMA_OP_TO_HOST` (NULL for the others). It
    /// moves into the queue, and comes back with the completion.
    pub buffer: *mut udma_buffer,
    /// Where in `buffer` the bytes start.
    pub buffer_offset: u64,
    /// The device-memory offset the op writes (reads, for `UDMA_OP_TO_HOST`).
    pub device_offset: u64,
    /// The device-memory offset `UDMA_OP_DEVICE_COPY` and `UDMA_OP_COMPUTE` read.
    pub device_src: u64,
    /// Bytes.
    pub len: u64,
    /// The op's first argument (see `udma_opcode`).
    pub arg0: u64,
    /// The op's second argument.
    pub arg1: u64,
    /// The caller's tag, handed back in the completion.
    pub user_data: u64,
    /// The op's third argument (`UDMA_OP_LAYER`, `UDMA_OP_COMPACT`; a program
    /// built with an older, smaller `udma_op` gets 0 here and below).
    pub arg2: u64,
    /// The op's fourth argument.
    pub arg3: u64,
    /// The op's fifth argument.
    pub arg4: u64,
    /// The op's sixth argument.
    pub arg5: u64,
}

impl Default for udma_op {
    fn default() -> udma_op {
        udma_op {
            size: 0,
            opcode: 0,
            context: 0,
            buffer: std::ptr::null_mut(),
            buffer_offset: 0,
            device_offset: 0,
            device_src: 0,
            len: 0,
            arg0: 0,
            arg1: 0,
            user_data: 0,
            arg2: 0,
            arg3: 0,
            arg4: 0,
            arg5: 0,
        }
    }
}

// SAFETY: `repr(C)`, integers and a raw pointer (never dereferenced: a handle), 8 + 4 + 4 +
// 12 * 8 = 112 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_op {
    const NAME: &'static str = "udma_op";
}

/// A finished op (`udma_queue_poll`, `udma_queue_wait`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_completion {
    /// `sizeof(udma_completion)`.
    pub size: usize,
    /// The op's `user_data`.
    pub user_data: u64,
    /// The op's buffer, on the host again (NULL if it had none).
    pub buffer: *mut udma_buffer,
    /// The op's result (`UDMA_OP_COMPUTE`: the sum; an error: the address at fault).
    pub result: u64,
    /// The device's status: 0 success; otherwise the loopback device's code
    /// (`udma_op_status_name` names it).
    pub status: u32,
    /// The command id the queue gave the op.
    pub command_id: u32,
}

// SAFETY: `repr(C)`, integers and a raw pointer, 8 * 4 + 4 + 4 = 40 bytes with no padding,
// `size` first.
unsafe impl abi::Sized for udma_completion {
    const NAME: &'static str = "udma_completion";
}

/// A queue's state (`udma_queue_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_queue_info {
    /// `sizeof(udma_queue_info)`.
    pub size: usize,
    /// Ops submitted.
    pub submitted: u64,
    /// Completions taken.
    pub completed: u64,
    /// Ops in flight (submitted, completion not taken).
    pub in_flight: u32,
    /// Entries per ring.
    pub depth: u32,
    /// The device's queue index.
    pub index: u32,
    /// Zero.
    pub reserved: u32,
}

// SAFETY: `repr(C)`, integers only, 8 * 3 + 4 * 4 = 40 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_queue_info {
    const NAME: &'static str = "udma_queue_info";
}

/// Opens queue `options->index` of the device (`options` may be NULL: queue 0, depth 64, the
/// copy engine, interrupts).
///
/// Errors: `UDMA_ERR_BUSY` for a queue open already; `UDMA_ERR_NOT_FOUND` for an index past
/// the device's queues; `UDMA_ERR_INVALID_ARGUMENT` for a depth that is not a power of two in
/// range; `UDMA_ERR_UNSUPPORTED` for a PCI device: its driver brings its own queue format
/// (drive its registers with `udma_device_read32` / `udma_device_write32` and the other BAR
/// calls, and its DMA with buffers from a pool, as `examples/c/edu_dma.c` does).
///
/// # Safety
/// `options` is NULL or points to `options->size` readable bytes; `queue` to a writable
/// `udma_queue *`.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_create(
    device: *const udma_device,
    options: *const udma_queue_options,
    queue: *mut *mut udma_queue,
) -> udma_status {
    call("udma_queue_create", || {
        let out = abi::out(queue, "queue")?;
        let o = if options.is_null() {
            udma_queue_options::default()
        } else {
            // SAFETY: non-null; readable per this function's contract.
            unsafe { abi::read(options, "options", udma_queue_options::default())? }
        };
        let d = self::device(device)?;
        let index = u16::try_from(o.index)
            .map_err(|_| Fail::invalid(format!("queue index {} is out of range", o.index)))?;
        let unit = match o.unit {
            0 => loopback::Unit::Copy,
            1 => loopback::Unit::Compute,
            other => {
                return Err(Fail::invalid(format!(
                    "unit {other} is not a udma_unit (UDMA_UNIT_COPY 0, UDMA_UNIT_COMPUTE 1)"
                )))
            }
        };
        if o.flags & !UDMA_QUEUE_POLL != 0 {
            return Err(Fail::invalid(format!(
                "flags {:#x} has bits that are not UDMA_QUEUE_* flags",
                o.flags
            )));
        }
        let wait = if o.flags & UDMA_QUEUE_POLL != 0 {
            Wait::Poll
        } else {
            Wait::Interrupt
        };
        let depth = if o.depth == 0 { 64 } else { o.depth };
        let config = ring::Config::new(depth)
            .with_id(index)
            .with_context(o.context);
        let name = format!("{} queue {index}", d.name);
        let q = d
            .runtime
            .queue_on::<Flight>(config, wait, unit)
            .map_err(|e| Fail::from(e).context(&name))?;
        let registered = QUEUES.with_all(|table| {
            // The handle is known only once inserted; the entry records it, so insert a
            // placeholder-free entry in two steps under one lock.
            let key = table.insert(Arc::new(QueueEntry {
                queue: Mutex::new(None),
                handle: 0,
                name: name.clone(),
                _device: Arc::clone(&d),
            }))?;
            let entry = Arc::new(QueueEntry {
                queue: Mutex::new(Some(q)),
                handle: key.value(Kind::Queue),
                name,
                _device: Arc::clone(&d),
            });
            *table.get(key, key.value(Kind::Queue))? = entry;
            Ok::<_, Fail>(key)
        })?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(registered.to_ptr(Kind::Queue)) };
        Ok(())
    })
}

/// Stops the queue and destroys it. Commands still in flight are waited for (up to a second)
/// or stopped; their buffers come back to the host under their handles (free them). If the
/// device cannot be stopped, their buffers stay with it (leaked on purpose, never freed
/// while it may write them), their handles become invalid, and the call returns
/// `UDMA_ERR_DEVICE`; the queue handle is destroyed either way.
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_queue_destroy(queue: *mut udma_queue) -> udma_status {
    call("udma_queue_destroy", || {
        let entry = QUEUES.remove_if(queue, |_| Ok(()))?;
        let Some(q) = entry.lock().take() else {
            return Ok(());
        };
        match q.shutdown(Duration::from_secs(1)) {
            Ok(shutdown) => {
                let payloads = shutdown
                    .completed
                    .into_iter()
                    .map(|done| done.payload)
                    .chain(shutdown.aborted.into_iter().map(|(_, p)| p));
                for flight in payloads {
                    if let Some((key, buffer)) = flight.buffer {
                        memory::give_back(key, buffer);
                    }
                }
                Ok(())
            }
            Err(e) => {
                memory::forget_queued(entry.handle);
                Err(lib(e).context(&entry.name))
            }
        }
    })
}

fn descriptor(op: &udma_op, iova: Option<u64>) -> Result<Descriptor, Fail> {
    let host = || Iova(iova.unwrap_or(0));
    let dev = DeviceOffset;
    let arg32 = |v: u64, what: &str| {
        u32::try_from(v).map_err(|_| Fail::invalid(format!("{what} {v:#x} does not fit 32 bits")))
    };
    let d = match op.opcode {
        0 => Descriptor::nop(),
        1 => Descriptor::to_device(host(), dev(op.device_offset), op.len),
        2 => Descriptor::to_host(dev(op.device_offset), host(), op.len),
        3 => Descriptor::device_copy(dev(op.device_src), dev(op.device_offset), op.len),
        4 => {
            let byte = u8::try_from(op.arg0).map_err(|_| {
                Fail::invalid(format!("fill byte (arg0) {:#x} is above 0xff", op.arg0))
            })?;
            Descriptor::fill(dev(op.device_offset), op.len, byte)
        }
        5 => Descriptor::compute(
            dev(op.device_src),
            dev(op.device_offset),
            op.len,
            arg32(op.arg0, "xor (arg0)")?,
            arg32(op.arg1, "add (arg1)")?,
        ),
        6 => {
            let q = u16::try_from(op.arg0)
                .map_err(|_| Fail::invalid(format!("queue (arg0) {} is out of range", op.arg0)))?;
            Descriptor::wait(q, op.arg1)
        }
        7 => layer(op)?,
        8 => Descriptor::compact(
            dev(op.device_src),
            op.len,
            arg32(op.arg0, "record size (arg0)")?,
            arg32(op.arg1, "score offset (arg1)")?,
            arg32(op.arg2, "threshold (arg2)")?,
            dev(op.device_offset),
            arg32(op.arg3, "capacity (arg3)")?,
        ),
        other => {
            return Err(Fail::invalid(format!(
                "opcode {other} is not a udma_opcode (0 to 8)"
            )))
        }
    };
    Ok(d.context(op.context))
}

/// The `UDMA_OP_LAYER` descriptor of `op`: inputs `(device_src, arg0)`, `(arg1, arg2)`,
/// `(arg3, arg4)`, seed `arg5`. What the format cannot say is refused here; alignment, bounds
/// and overlap are the device's checks (an error completion).
fn layer(op: &udma_op) -> Result<Descriptor, Fail> {
    let given = [
        (op.device_src, op.arg0, "input 0 (device_src, arg0)"),
        (op.arg1, op.arg2, "input 1 (arg1, arg2)"),
        (op.arg3, op.arg4, "input 2 (arg3, arg4)"),
    ];
    let mut inputs = Vec::with_capacity(3);
    for (index, &(offset, len, what)) in given.iter().enumerate() {
        if len == 0 {
            if index == 0 {
                return Err(Fail::invalid(format!(
                    "{what} has length 0: a layer needs input 0"
                )));
            }
            if offset != 0 {
                return Err(Fail::invalid(format!(
                    "{what} has length 0 (absent) but offset {offset:#x}: an absent input's \
                     offset is 0"
                )));
            }
            continue;
        }
        if inputs.len() != index {
            return Err(Fail::invalid(format!(
                "{what} is given without input {}: inputs are filled in order",
                index - 1
            )));
        }
        inputs.push((DeviceOffset(offset), len));
    }
    let seed = u32::try_from(op.arg5)
        .map_err(|_| Fail::invalid(format!("seed (arg5) {:#x} does not fit 32 bits", op.arg5)))?;
    Descriptor::layer(&inputs, DeviceOffset(op.device_offset), op.len, seed)
        .map_err(|e| Fail::invalid(format!("{e}")))
}

/// Checks and queues one op; `ring` also rings the doorbell.
///
/// # Safety
/// `op` is NULL or points to `op->size` readable bytes.
unsafe fn submit(queue: *mut udma_queue, op: *const udma_op, ring: bool) -> Result<(), Fail> {
    // SAFETY: per the caller's contract.
    let op = unsafe { abi::read(op, "op", udma_op::default())? };
    with_queue(queue, |entry, q| {
        let wants_buffer = matches!(op.opcode, 1 | 2);
        let taken = match (wants_buffer, op.buffer.is_null()) {
            (true, true) => {
                return Err(Fail::invalid("op->buffer is NULL: the op moves host bytes"))
            }
            (false, false) => {
                return Err(Fail::invalid(
                    "op->buffer is set for an op that names no host memory: leave it NULL",
                ))
            }
            (true, false) => Some(memory::take_for_queue(
                op.buffer,
                op.buffer_offset,
                op.len,
                entry.handle,
                &entry.name,
            )?),
            (false, true) => None,
        };
        let built = descriptor(&op, taken.as_ref().map(|t| t.2));
        let (desc, flight) = match built {
            Ok(desc) => (
                desc,
                Flight {
                    buffer: taken.map(|(k, b, _)| (k, b)),
                    user_data: op.user_data,
                },
            ),
            Err(fail) => {
                if let Some((key, buffer, _)) = taken {
                    memory::give_back(key, buffer);
                }
                return Err(fail);
            }
        };
        match q.push(desc.build(), flight) {
            Ok(_) => {}
            Err(rejected) => {
                if let Some((key, buffer)) = rejected.payload.buffer {
                    memory::give_back(key, buffer);
                }
                return Err(lib(rejected.error));
            }
        }
        if ring {
            q.flush().map_err(lib)?;
        }
        Ok(())
    })
}

/// Submits one op and rings the doorbell. Its buffer (if any) moves into the queue.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a bad opcode or argument, a buffer range past its
/// end, or a buffer missing or superfluous; `UDMA_ERR_BUSY` for a buffer in a queue already;
/// `UDMA_ERR_EXHAUSTED` when the ring is full (take completions first). On an error nothing
/// was queued and the buffer stays the caller's.
///
/// # Safety
/// `op` points to `op->size` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_submit(
    queue: *mut udma_queue,
    op: *const udma_op,
) -> udma_status {
    // SAFETY: per this function's contract.
    call("udma_queue_submit", || unsafe { submit(queue, op, true) })
}

/// Queues one op without ringing the doorbell (`udma_queue_flush` rings it once for a batch).
///
/// # Safety
/// `op` points to `op->size` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_push(
    queue: *mut udma_queue,
    op: *const udma_op,
) -> udma_status {
    // SAFETY: per this function's contract.
    call("udma_queue_push", || unsafe { submit(queue, op, false) })
}

/// Rings the doorbell once for everything pushed since the last flush.
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_queue_flush(queue: *mut udma_queue) -> udma_status {
    call("udma_queue_flush", || {
        with_queue(queue, |_, q| q.flush().map_err(lib))
    })
}

fn complete(done: ring::Done<ring::Status, Flight>) -> udma_completion {
    let buffer = done.payload.buffer.map(|(key, owned)| {
        memory::give_back(key, owned);
        key.to_ptr(Kind::Buffer)
    });
    udma_completion {
        size: 0,
        user_data: done.payload.user_data,
        buffer: buffer.unwrap_or(std::ptr::null_mut()),
        result: done.entry.result,
        status: u32::from(done.entry.code()),
        command_id: u32::from(done.id),
    }
}

/// Takes one completion if there is one, without waiting: `*ready` says whether
/// `*completion` was filled. Its buffer is back on the host.
///
/// # Safety
/// `completion` points to `completion->size` writable bytes; `ready` to a writable `bool`.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_poll(
    queue: *mut udma_queue,
    completion: *mut udma_completion,
    ready: *mut bool,
) -> udma_status {
    call("udma_queue_poll", || {
        let ready = abi::out(ready, "ready")?;
        abi::out(completion, "completion")?;
        // Checked before taking anything, so a bad struct loses no completion.
        // SAFETY: per this function's contract.
        unsafe { abi::write(completion, "completion", empty())? };
        let done = with_queue(queue, |_, q| q.poll_one().map_err(lib))?;
        let got = done.is_some();
        if let Some(done) = done {
            // SAFETY: per this function's contract (checked above).
            unsafe { abi::write(completion, "completion", complete(done))? };
        }
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { ready.write(got) };
        Ok(())
    })
}

fn empty() -> udma_completion {
    udma_completion {
        size: 0,
        user_data: 0,
        buffer: std::ptr::null_mut(),
        result: 0,
        status: 0,
        command_id: 0,
    }
}

/// Waits up to `timeout_ns` nanoseconds (`UDMA_TIMEOUT_INFINITE`: forever) for a completion
/// and takes it.
///
/// Errors: `UDMA_ERR_TIMEOUT` when the time is up (the message says how many ops are in
/// flight).
///
/// # Safety
/// `completion` points to `completion->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_wait(
    queue: *mut udma_queue,
    timeout_ns: u64,
    completion: *mut udma_completion,
) -> udma_status {
    call("udma_queue_wait", || {
        // SAFETY: per this function's contract.
        unsafe { abi::write(completion, "completion", empty())? };
        let done = with_queue(queue, |_, q| q.wait(timeout(timeout_ns)).map_err(lib))?;
        // SAFETY: per this function's contract (checked above).
        unsafe { abi::write(completion, "completion", complete(done)) }
    })
}

/// The most queues `udma_queue_wait_any` takes.
const MAX_WAIT_ANY: usize = 4096;

/// Sleeps until one of `queues[0..count]` has a completion, or `timeout_ns` passes, and sets
/// `*ready` to the index of one that has (take it with `udma_queue_poll`).
///
/// Errors: `UDMA_ERR_TIMEOUT` when none has one in time; `UDMA_ERR_INVALID_ARGUMENT` for a
/// queue listed twice, `count` 0 or above 4096; `UDMA_ERR_UNSUPPORTED` for a queue made with
/// `UDMA_QUEUE_POLL` (no interrupt to sleep on).
///
/// # Safety
/// `queues` points to `count` readable `udma_queue *`; `ready` to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_wait_any(
    queues: *const *mut udma_queue,
    count: usize,
    timeout_ns: u64,
    ready: *mut usize,
) -> udma_status {
    call("udma_queue_wait_any", || {
        let out = abi::out(ready, "ready")?;
        if queues.is_null() {
            return Err(Fail::null("queues"));
        }
        if count == 0 {
            return Err(Fail::invalid("count is 0: pass at least one queue"));
        }
        if count > MAX_WAIT_ANY {
            return Err(Fail::invalid(format!(
                "count is {count}: wait on at most {MAX_WAIT_ANY} queues at once"
            )));
        }
        // SAFETY: non-null, `count` readable entries per this function's contract.
        let list = unsafe { std::slice::from_raw_parts(queues, count) };
        let mut entries = Vec::with_capacity(count);
        for (i, &ptr) in list.iter().enumerate() {
            let e = QUEUES
                .with(ptr, |_, q| Ok(Arc::clone(q)))
                .map_err(|f| f.context(format!("queues[{i}]")))?;
            entries.push((i, e));
        }
        // Lock in one global order (by address), whatever the caller's order; a queue listed
        // twice is next to itself in that order.
        let mut order: Vec<usize> = (0..count).collect();
        order.sort_by_key(|&i| (Arc::as_ptr(&entries[i].1).addr(), i));
        if let Some(pair) = order
            .windows(2)
            .find(|w| Arc::ptr_eq(&entries[w[0]].1, &entries[w[1]].1))
        {
            return Err(Fail::invalid(format!(
                "queues[{}] is listed twice (also queues[{}])",
                pair[1], pair[0]
            )));
        }
        let mut guards: Vec<Option<MutexGuard<'_, _>>> = (0..count).map(|_| None).collect();
        for &i in &order {
            guards[i] = Some(entries[i].1.lock());
        }
        let mut waiter = irq::Waiter::with_epoll().map_err(lib)?;
        let mut waitables: Vec<&mut dyn ring::Waitable> = Vec::with_capacity(count);
        for (i, guard) in guards.iter_mut().enumerate() {
            let name = &entries[i].1.name;
            let q = guard
                .as_mut()
                .and_then(|g| g.as_mut())
                .ok_or_else(|| Fail::handle(format!("queues[{i}] ({name}) was destroyed")))?;
            let irq = q.interrupt().ok_or_else(|| {
                Fail::new(
                    udma_status::UDMA_ERR_UNSUPPORTED,
                    format!(
                        "queues[{i}] ({name}) was made with UDMA_QUEUE_POLL: it has no \
                         interrupt to sleep on (poll it instead)"
                    ),
                )
            })?;
            waiter.add(irq, i as u64).map_err(lib)?;
            waitables.push(q);
        }
        let mut found = Vec::with_capacity(count);
        ring::wait_any(&mut waiter, &mut waitables, timeout(timeout_ns), &mut found)
            .map_err(lib)?;
        let Some(&first) = found.first() else {
            return Err(Fail::new(
                udma_status::UDMA_ERR_TIMEOUT,
                format!(
                    "none of the {count} queues completed anything within {:?}: check that \
                     ops were submitted (and flushed) to them",
                    Duration::from_nanos(timeout_ns)
                ),
            ));
        };
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(first) };
        Ok(())
    })
}

/// The queue's interrupt eventfd (borrowed: valid until the queue is destroyed; do not close
/// it), for the caller's own epoll loop: `udma_queue_arm`, then sleep until the fd is
/// readable (unless `arm` said a completion is ready), then `udma_queue_disarm` and
/// `udma_queue_poll`.
///
/// Errors: `UDMA_ERR_UNSUPPORTED` for a queue made with `UDMA_QUEUE_POLL`.
///
/// # Safety
/// `fd` points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_interrupt_fd(
    queue: *const udma_queue,
    fd: *mut c_int,
) -> udma_status {
    call("udma_queue_interrupt_fd", || {
        let out = abi::out(fd, "fd")?;
        let raw = with_queue(queue, |_, q| {
            q.interrupt().map(|i| i.as_raw_fd()).ok_or_else(|| {
                Fail::new(
                    udma_status::UDMA_ERR_UNSUPPORTED,
                    "the queue was made with UDMA_QUEUE_POLL: it has no interrupt",
                )
            })
        })?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(raw) };
        Ok(())
    })
}

/// Asks the device to raise the queue's interrupt for its next completion (draining stale
/// signals first). `*ready` says a completion is there already: do not sleep then.
///
/// # Safety
/// `ready` points to a writable `bool`.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_arm(queue: *mut udma_queue, ready: *mut bool) -> udma_status {
    call("udma_queue_arm", || {
        let out = abi::out(ready, "ready")?;
        let got = with_queue(queue, |_, q| q.arm_interrupt().map_err(lib))?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(got) };
        Ok(())
    })
}

/// Stops the device raising the queue's interrupt (after a wake-up).
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_queue_disarm(queue: *mut udma_queue) -> udma_status {
    call("udma_queue_disarm", || {
        with_queue(queue, |_, q| {
            q.disarm_interrupt();
            Ok(())
        })
    })
}

/// The queue's counters.
///
/// # Safety
/// `info` points to `info->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_get_info(
    queue: *const udma_queue,
    info: *mut udma_queue_info,
) -> udma_status {
    call("udma_queue_get_info", || {
        let value = with_queue(queue, |_, q| {
            let s = q.stats();
            Ok(udma_queue_info {
                size: 0,
                submitted: s.submitted,
                completed: s.completed,
                in_flight: q.in_flight() as u32,
                depth: q.depth(),
                index: u32::from(q.id()),
                reserved: 0,
            })
        })?;
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", value) }
    })
}

/// The name of a completion's device status (`"host-unmapped"`), a static string.
#[no_mangle]
pub extern "C" fn udma_op_status_name(status: u32) -> *const std::ffi::c_char {
    op_status(status).as_ptr()
}

/// The name of a completion's device status.
pub(crate) fn op_status(status: u32) -> &'static std::ffi::CStr {
    match status {
        0 => cstr(b"success\0"),
        1 => cstr(b"bad-opcode\0"),
        2 => cstr(b"bad-flags\0"),
        3 => cstr(b"bad-context\0"),
        4 => cstr(b"bad-args\0"),
        5 => cstr(b"bad-length\0"),
        6 => cstr(b"address-overflow\0"),
        7 => cstr(b"misaligned\0"),
        8 => cstr(b"device-out-of-bounds\0"),
        9 => cstr(b"host-unmapped\0"),
        10 => cstr(b"overlap\0"),
        _ => cstr(b"unknown\0"),
    }
}
