//! Queues (`udma_queue`): the table of open queues and what travels with a command, how to
//! open one (`udma_queue_options`, `udma_unit`), opening it on a device and destroying it.

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use udma::device::Wait;
use udma::ring;
use userdma_loopback::{self as loopback, LoopbackRuntime};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::interrupt::Lent;
use crate::abi;
use crate::device::{device, udma_device, Device};
use crate::error::{call, lib, udma_status, Fail};
use crate::handle::{Key, Kind, Registry};
use crate::memory::{self, HostBuffer};

/// A hardware queue of a device, made by `udma_queue_create`, destroyed by
/// `udma_queue_destroy`.
#[derive(Debug)]
pub struct udma_queue {
    _opaque: [u8; 0],
}

/// What travels with a command: the buffer it names (with its handle) and the caller's tag.
pub(super) struct Flight {
    pub(super) buffer: Option<(Key, HostBuffer)>,
    pub(super) user_data: u64,
}

pub(super) struct QueueEntry {
    /// `None` once destroyed (a call holding a clone of the entry then finds nothing).
    queue: Mutex<Option<loopback::Queue<Flight>>>,
    /// The handle value, which buffers in the queue name.
    pub(super) handle: u64,
    /// `loopback0 queue 1`, for messages.
    pub(super) name: String,
    /// Keeps the device open for as long as the queue (and names its DMA space, which the
    /// buffers it takes must be mapped into).
    pub(super) device: Arc<Device>,
    /// The descriptor `udma_queue_interrupt_fd` lent, if any; locked after `queue`, and
    /// only while holding it.
    lent: Mutex<Option<Lent>>,
}

impl QueueEntry {
    pub(super) fn lock(&self) -> MutexGuard<'_, Option<loopback::Queue<Flight>>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lent interrupt descriptor (take the queue's lock first).
    pub(super) fn lent(&self) -> MutexGuard<'_, Option<Lent>> {
        self.lent.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(super) static QUEUES: Registry<Arc<QueueEntry>> = Registry::new(Kind::Queue);

/// Runs `f` on the live queue `ptr` names, with the queue locked.
pub(super) fn with_queue<R>(
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
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
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

abi::sized!(udma_queue_options);

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
        if o.reserved != 0 {
            return Err(Fail::invalid(format!(
                "options->reserved is {:#x}: set it to 0",
                o.reserved
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
                device: Arc::clone(&d),
                lent: Mutex::new(None),
            }))?;
            let entry = Arc::new(QueueEntry {
                queue: Mutex::new(Some(q)),
                handle: key.value(Kind::Queue),
                name,
                device: Arc::clone(&d),
                lent: Mutex::new(None),
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
/// `UDMA_ERR_DEVICE`; the queue handle is destroyed either way. The descriptor
/// `udma_queue_interrupt_fd` lent is closed too, if it still names the queue's eventfd (see
/// there).
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_queue_destroy(queue: *mut udma_queue) -> udma_status {
    call("udma_queue_destroy", || {
        let entry = QUEUES.remove_if(queue, |_| Ok(()))?;
        let mut guard = entry.lock();
        let Some(q) = guard.take() else {
            return Ok(());
        };
        // Taken under the queue's lock, which `udma_queue_interrupt_fd` lends under: no fd is
        // lent after this. Given back while the queue (and so its eventfd) is still open,
        // for the comparison.
        let lent = entry.lent().take();
        drop(guard);
        if let (Some(lent), Some(own)) = (lent, q.interrupt()) {
            lent.give_back(own.as_fd());
        }
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
