//! Opening a hardware queue on any device: [`QueueFormat`], what a driver says about its queue
//! format, and [`open_queue`], the steps every queue takes, in one place.
//!
//! A queue pair needs the same six steps on every device: size the ring memory for the entry
//! types and depth ([`ring::Layout`]), allocate it and map it into the device's DMA space,
//! view it as [`ring::Memory`], find the two doorbell registers in a BAR, take the queue's
//! interrupt vector, build the [`ring::Queue`]; then the device-specific part, programming the
//! ring's IOVA into the device and enabling it, and a way to stop it again. The device-specific
//! part is the driver's [`QueueFormat`]; [`open_queue`] does the rest. The loopback device's format
//! is [`loopback::NpuFormat`](super::loopback::NpuFormat); a driver for a real device (the NVMe
//! example) brings its own.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use super::{Device, Error};
use crate::memory::{PageSize, Region};
use crate::ring::{self, Doorbells, Layout, Memory, Queue};

/// How a queue learns of completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wait {
    /// The queue's waits sleep on the interrupt vector numbered like the queue.
    #[default]
    Interrupt,
    /// The queue's waits sleep on this interrupt vector (a device that lets the driver pick a
    /// completion queue's vector, as NVMe does).
    Vector(u32),
    /// No interrupt: the queue's waits poll.
    Poll,
}

/// Where a queue's doorbell registers are: BAR `bar`, at these byte offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoorbellRegs {
    /// The BAR that holds them.
    pub bar: usize,
    /// The SQ tail doorbell's offset in the BAR.
    pub sq_tail: usize,
    /// The CQ head doorbell's offset in the BAR.
    pub cq_head: usize,
}

/// A device's queue format, supplied by its driver: the entry types, where the doorbells
/// are, and how a ring is programmed into the device and stopped.
pub trait QueueFormat: Send + Sync + 'static {
    /// The submission entry.
    type Submission: ring::Submission;
    /// The completion entry.
    type Completion: ring::Completion;

    /// The ring configuration the device needs, from the caller's (doorbell value kind,
    /// part alignment). The default keeps it.
    fn ring_config(&self, config: ring::Config) -> ring::Config {
        config
    }

    /// Whether the device completes each queue's commands in the order they were submitted
    /// (the loopback device does; NVMe does not promise it): the queue then checks that every
    /// completion names the oldest command in flight ([`ring::Config::with_in_order`]), so a
    /// lost, doubled or misnamed completion is an error, never a buffer handed back early.
    /// The default: `false`.
    fn in_order(&self) -> bool {
        false
    }

    /// Checks that queue `queue` can be opened (exists, is not in use) before anything is
    /// allocated. The default accepts it.
    fn check(&self, device: &dyn Device, queue: u16) -> Result<(), Error> {
        let _ = (device, queue);
        Ok(())
    }

    /// The deepest ring queue `queue` of the device takes, if it says (the loopback device's `max_depth`
    /// register, NVMe's `CAP.MQES + 1`): [`open_queue`] refuses a deeper one with
    /// [`Error::QueueDepth`] before anything is allocated or written to the device. The
    /// default: `None` (only the ring's own limit, [`ring::MAX_DEPTH`], applies).
    fn max_depth(&self, device: &dyn Device, queue: u16) -> Result<Option<u32>, Error> {
        let _ = (device, queue);
        Ok(None)
    }

    /// Where queue `queue`'s doorbells are.
    fn doorbells(&self, device: &dyn Device, queue: u16) -> Result<DoorbellRegs, Error>;

    /// Programs the ring (`memory`, laid out as `layout`) into the device as queue
    /// `config.id()` and enables it, waiting for the device to acknowledge.
    fn enable(
        &self,
        device: &dyn Device,
        config: &ring::Config,
        layout: &Layout,
        memory: &Memory,
    ) -> Result<(), Error>;

    /// Makes the device stop touching queue `queue`'s ring and buffers, waiting up to
    /// `timeout`: what a queue dropped or shut down with work in flight asks for before it
    /// frees the buffers it holds. The default is [`Device::stop_queue`].
    fn disable(&self, device: &dyn Device, queue: u16, timeout: Duration) -> Result<(), Error> {
        device.stop_queue(queue, timeout)
    }

    /// The queue is gone (dropped, with nothing of it in flight any more): turn the device
    /// queue off so it serves no ring nobody owns and can be opened again. The default is
    /// [`QueueFormat::disable`]; a device where stopping one queue stops them all (a controller
    /// reset) overrides it to do only what the queue itself needs.
    fn release(&self, device: &dyn Device, queue: u16) -> Result<(), Error> {
        self.disable(device, queue, ring::DROP_QUIESCE_TIMEOUT)
    }
}

/// Opens queue `config.id()` of `device` in `format`: ring memory for `config.depth()` entries
/// (a memfd of base pages, so an out-of-process device can share it; locked on a
/// physical-address space, where nothing else pins it; on the device's NUMA node,
/// [`Device::numa_node`], when it has one) mapped into the device's DMA space, the
/// doorbells, the interrupt vector `wait` names, and the format's enable. The queue holds the device: dropping it with work
/// in flight asks the format to stop the device queue before any buffer it names is freed,
/// and dropping it in any case turns the device queue off.
///
/// # Errors
/// [`Error::QueueDepth`] for a depth above the device's largest, [`Error::Ring`] for a
/// configuration the ring refuses (both before anything is written to the device),
/// [`Error::Memory`] / [`Error::Map`] if the ring memory cannot be had, and whatever the
/// format's steps return.
pub fn open_queue<F: QueueFormat, T: Send>(
    device: &Arc<dyn Device>,
    format: F,
    config: ring::Config,
    wait: Wait,
) -> Result<Queue<F::Submission, F::Completion, T>, Error> {
    let mut config = format.ring_config(config);
    if format.in_order() {
        config = config.with_in_order(true);
    }
    let q = config.id();
    #[cfg(feature = "tracing")]
    let _span = tracing::info_span!(
        "queue.open",
        device = %device.identity(),
        queue = q,
        depth = config.depth(),
        context = config.context(),
        wait = ?wait
    )
    .entered();
    if device.is_removed() {
        return Err(Error::Removed {
            device: device.identity().to_string(),
        });
    }
    format.check(device.as_ref(), q)?;
    if let Some(max) = format.max_depth(device.as_ref(), q)? {
        if config.depth() > max {
            return Err(Error::QueueDepth {
                device: device.identity().to_string(),
                queue: q,
                depth: config.depth(),
                max,
            });
        }
    }
    let ring_error = |source| Error::Ring { queue: q, source };
    let layout = config
        .layout::<F::Submission, F::Completion>()
        .map_err(ring_error)?;
    let lock = device.dma_space().kind() == crate::dma::Kind::Physical;
    let region = ring_region(layout.size(), lock, device.numa_node())?;
    let mapping = device
        .dma_space()
        .map(Arc::new(region))
        .map_err(|source| Error::Map {
            what: "ring memory",
            source,
        })?;
    let memory = Memory::from_mapping(Arc::new(mapping), 0, layout.size()).map_err(ring_error)?;
    let regs = format.doorbells(device.as_ref(), q)?;
    let doorbells =
        Doorbells::new(device.bar(regs.bar)?, regs.sq_tail, regs.cq_head).map_err(ring_error)?;
    let interrupt = match wait {
        Wait::Interrupt => Some(device.interrupt(u32::from(q))?),
        Wait::Vector(vector) => Some(device.interrupt(vector)?),
        Wait::Poll => None,
    };
    let mut queue = Queue::new(config, memory.clone(), doorbells, interrupt).map_err(ring_error)?;
    format.enable(device.as_ref(), &config, &layout, &memory)?;
    queue.set_quiesce(Stop {
        device: Arc::clone(device),
        format,
        queue: q,
    });
    if let Some(source) = device.event_source() {
        queue.set_presence(source.presence());
    }
    Ok(queue)
}

/// Ring memory: `len` bytes rounded up to base pages, a memfd (shareable with a device
/// process), locked when `lock` (an IOMMU or the loopback table pins or holds what it maps;
/// a physical-address space does not), on NUMA node `node` when there is one (the device's).
fn ring_region(len: usize, lock: bool, node: Option<u32>) -> Result<Region, Error> {
    let page = PageSize::Base.bytes();
    let rounded = len.checked_next_multiple_of(page).ok_or(Error::Memory {
        what: "ring memory",
        len,
        source: crate::memory::Error::InvalidLength {
            len,
            page_size: PageSize::Base,
            suggested: usize::MAX / page * page,
        },
    })?;
    Region::builder(rounded)
        .page_size(PageSize::Base)
        .memfd()
        .lock(lock)
        .node(node)
        .build()
        .map_err(|source| Error::Memory {
            what: "ring memory",
            len: rounded,
            source,
        })
}

/// The [`ring::Quiesce`] of a queue from [`open_queue`]: the format's stop when the queue is
/// dropped or shut down with work in flight, and once more when the queue is gone (it drops
/// with it), so the device stops serving a ring nobody owns and the queue can be opened again.
/// Holds the device: it outlives its queues.
struct Stop<F: QueueFormat> {
    device: Arc<dyn Device>,
    format: F,
    queue: u16,
}

impl<F: QueueFormat> std::fmt::Debug for Stop<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stop")
            .field("device", self.device.identity())
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl<F: QueueFormat> ring::Quiesce for Stop<F> {
    fn quiesce(&mut self, queue: u16, timeout: Duration) -> io::Result<()> {
        // A removed device was cut off from memory before the removal was reported.
        if self.device.is_removed() {
            return Ok(());
        }
        self.format
            .disable(self.device.as_ref(), queue, timeout)
            .map_err(|err| match err {
                Error::Timeout { .. } => io::Error::new(io::ErrorKind::TimedOut, err),
                other => io::Error::other(other),
            })
    }
}

impl<F: QueueFormat> Drop for Stop<F> {
    fn drop(&mut self) {
        // The ring queue is gone: nothing of it may be in flight any more (it quiesced or
        // leaked), so this only turns the device queue off. A device that does not answer
        // keeps its own mapping of the ring, so nothing is freed under it. A removed device
        // has no queues to turn off.
        if !self.device.is_removed() {
            let _ = self.format.release(self.device.as_ref(), self.queue);
        }
    }
}
