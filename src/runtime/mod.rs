//! The runtime: one owner of a device and everything made for it — the DMA space, pinned
//! memory mapped into it, buffer pools, the device's memory and its queues — handing out
//! `'static`, `Send` handles the layers above (a pipeline, a scheduler, a C handle) can hold.
//!
//! ```text
//!   Runtime::loopback(config) | Runtime::open(bdf)     device + its DMA space (+ NUMA node)
//!     .pool(bytes, page size)   -> Arc<Pool>          memory allocated on the device's node,
//!                                                     mapped once, carved
//!     .queue(ring config)       -> loopback::Queue    ring memory, doorbells, vector, enabled
//!     .device_memory()          -> DeviceMemory       ranges of the device's own memory
//!   pool.alloc_owned(len)       -> OwnedBuffer        no lifetime: keeps its pool alive
//!   queue.submit(Descriptor::to_device(buf.iova(), range.offset(), len), buf)
//! ```
//!
//! **What outlives what.** Nothing here depends on the order in which handles are dropped:
//! a queue holds its device (so the device's engine, its BARs and its DMA space outlive it),
//! an in-flight buffer belongs to its queue and holds its pool, and a pool holds its mapping.
//! Dropping a queue with work in flight first stops the device queue and waits for the device
//! to acknowledge ([`ring::Queue`]'s drop), only then drops the buffers it held; the last
//! buffer of a pool going away drops the pool, which unmaps the memory from the device's DMA
//! space. So "quiesce before unmap" holds whether the runtime, a queue or a pool goes first.
//!
//! ```
//! use std::time::Duration;
//! use userdma::device::loopback::{self, Descriptor};
//! use userdma::dma::DeviceOffset;
//! use userdma::memory::PageSize;
//! use userdma::{ring, Runtime};
//!
//! # fn main() -> Result<(), userdma::Error> {
//! let runtime = Runtime::loopback(loopback::Config::default())?;
//! let pool = runtime.pool(4 << 20, PageSize::Base)?;
//! let mut queue = runtime.queue(ring::Config::new(64))?;
//!
//! let buffer = pool.alloc_owned(4096)?;
//! buffer.write(0, b"hello, device")?;
//! let to_device = Descriptor::to_device(buffer.iova(), DeviceOffset(0), 13);
//! queue.submit(to_device.build(), buffer)?;
//! let done = queue.wait(Some(Duration::from_secs(5)))?;
//! assert!(done.entry.is_success());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::device::loopback::{self, Loopback};
use crate::device::{self, Device, DeviceMemory, QueueFormat, Wait};
use crate::memory::{PageSize, Region};
use crate::pool::{self, Pool};
use crate::{dma, pci, ring, Error};

/// The pool chunk [`Runtime::pool`] uses on base pages.
const BASE_PAGE_CHUNK: usize = 64 << 10;

/// One owner of a device's resources (see the [module docs](self)). Cheap to clone (clones
/// share everything), `Send` and `Sync`.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    device: Arc<dyn Device>,
    /// The same device, when it is the loopback device (its queue format is built in).
    loopback: Option<Arc<Loopback>>,
    space: Arc<dyn dma::Space>,
    /// The NUMA node the runtime's memory goes on (the device's).
    numa_node: Option<u32>,
    /// The device's memory, made on first use.
    device_memory: OnceLock<DeviceMemory>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("device", self.inner.device.identity())
            .field("dma_space", &self.inner.space.kind())
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Starts a loopback device (in a thread or a child process, as `config` says) and owns it.
    ///
    /// # Errors
    /// [`Error::Device`] if the device does not start (a bad configuration, the engine CPU).
    pub fn loopback(config: loopback::Config) -> Result<Runtime, Error> {
        let device = Arc::new(Loopback::new(config)?);
        let dynamic: Arc<dyn Device> = Arc::clone(&device) as Arc<dyn Device>;
        Ok(Runtime::build(dynamic, Some(device)))
    }

    /// Opens the PCI function `bdf` with the backend its driver calls for (vfio-pci or
    /// uio_pci_generic, [`device::open`]).
    ///
    /// # Errors
    /// [`Error::Device`]: unbound, another driver (the message names the `userdma bind`
    /// command), or the open failing.
    pub fn open(bdf: pci::Bdf) -> Result<Runtime, Error> {
        Ok(Runtime::from_device(device::open(bdf)?))
    }

    /// Opens the PCI function `bdf` bound to vfio-pci with `options` (interrupt vectors, DMA
    /// mask, no-IOMMU), e.g. the MSI-X vectors a driver's queues need.
    ///
    /// # Errors
    /// As [`device::Vfio::open_with`].
    pub fn open_vfio(bdf: pci::Bdf, options: &device::vfio::Options) -> Result<Runtime, Error> {
        let device = device::Vfio::open_with(bdf, options)?;
        Ok(Runtime::from_device(Arc::new(device)))
    }

    /// Owns an already open device.
    pub fn from_device(device: Arc<dyn Device>) -> Runtime {
        Runtime::build(device, None)
    }

    fn build(device: Arc<dyn Device>, loopback: Option<Arc<Loopback>>) -> Runtime {
        let space = device.dma_space();
        let numa_node = device.numa_node();
        Runtime {
            inner: Arc::new(Inner {
                device,
                loopback,
                space,
                numa_node,
                device_memory: OnceLock::new(),
            }),
        }
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.inner.device
    }

    /// The device as the loopback device, when it is one (its counters, device memory).
    pub fn loopback_device(&self) -> Option<&Arc<Loopback>> {
        self.inner.loopback.as_ref()
    }

    /// The device's DMA address space.
    pub fn dma_space(&self) -> &Arc<dyn dma::Space> {
        &self.inner.space
    }

    /// The NUMA node the runtime places the memory it maps for the device on
    /// ([`Device::numa_node`]: a PCI function's node when that node has memory, the loopback
    /// device's configured node), or `None` for no placement.
    pub fn numa_node(&self) -> Option<u32> {
        self.inner.numa_node
    }

    /// `bytes` of pinned host memory (rounded up to whole `page_size` pages) mapped once into
    /// the device's DMA space, on the device's NUMA node when it has one
    /// ([`Runtime::numa_node`]; the pages must come from that node). A memfd, so an
    /// out-of-process device can share it; locked only where nothing else pins it (a
    /// physical-address space: UIO, no-IOMMU VFIO), since an IOMMU mapping pins the pages
    /// itself. Pools ([`Runtime::pool`]) and mapped memory ([`Runtime::map_memory`]) are made of
    /// this memory.
    ///
    /// # Errors
    /// [`Error::Memory`] (no such hugepages, on the device's node when it has one; the lock
    /// limit), [`Error::Dma`] (no IOVA space).
    pub fn map_memory(&self, bytes: usize, page_size: PageSize) -> Result<dma::Mapping, Error> {
        self.map_memory_on(bytes, page_size, self.inner.numa_node)
    }

    /// [`Runtime::map_memory`] on NUMA node `node` instead of the device's (`None`: no
    /// placement), for memory another node's CPUs work on.
    ///
    /// # Errors
    /// As [`Runtime::map_memory`]; [`memory::Error::NoSuchNode`](crate::memory::Error::NoSuchNode)
    /// for a node that does not exist.
    pub fn map_memory_on(
        &self,
        bytes: usize,
        page_size: PageSize,
        node: Option<u32>,
    ) -> Result<dma::Mapping, Error> {
        map_memory_on(self.inner.space.as_ref(), bytes, page_size, node)
    }

    /// A buffer pool over `bytes` of fresh memory ([`Runtime::map_memory`]) with the default
    /// [`pool::Config`], except that on base pages the pool's chunk (the unit slabs of every
    /// size class are cut from) is 64 KiB instead of a hugepage, so that a few MiB hold every
    /// size class, and that on memory the device sees contiguous only per page (base pages in
    /// a physical-address space: UIO, no-IOMMU VFIO) the chunk and the largest class are a page
    /// ([`pool::Config::fit_to`]). Allocate from it with [`Pool::alloc_owned`] (or, inside a borrow,
    /// [`Pool::alloc`]).
    ///
    /// # Errors
    /// As [`Runtime::map_memory`], and [`Error::Pool`] for memory too small for the pool.
    pub fn pool(&self, bytes: usize, page_size: PageSize) -> Result<Arc<Pool>, Error> {
        let mapping = self.map_memory(bytes, page_size)?;
        let config = Self::pool_config(page_size).fit_to(&mapping);
        Ok(Arc::new(Pool::new(mapping, config)?))
    }

    /// The configuration [`Runtime::pool`] uses for memory of `page_size`: the default, with
    /// 64 KiB chunks on base pages. A start for [`Runtime::pool_with`].
    pub fn pool_config(page_size: PageSize) -> pool::Config {
        match page_size {
            PageSize::Base => pool::Config::default().chunk_size(BASE_PAGE_CHUNK),
            _ => pool::Config::default(),
        }
    }

    /// [`Runtime::pool`] with a pool configuration.
    ///
    /// # Errors
    /// As [`Runtime::pool`].
    pub fn pool_with(
        &self,
        bytes: usize,
        page_size: PageSize,
        config: pool::Config,
    ) -> Result<Arc<Pool>, Error> {
        let mapping = self.map_memory(bytes, page_size)?;
        Ok(Arc::new(Pool::new(mapping, config)?))
    }

    /// Opens queue `config.id()` in the device's built-in queue format (the loopback
    /// device's [`Command`](ring::Command) / [`Status`](ring::Status)), waiting on its
    /// interrupt. Payloads are [`OwnedBuffer`](pool::OwnedBuffer)s; for other payloads or for
    /// polling use [`Runtime::queue_with`].
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a device whose driver supplies its own format (use
    /// [`Runtime::open_queue`]); otherwise as [`device::open_queue`].
    pub fn queue(&self, config: ring::Config) -> Result<loopback::Queue, Error> {
        self.queue_with(config, Wait::Interrupt)
    }

    /// [`Runtime::queue`] with any payload type and either way of waiting.
    ///
    /// # Errors
    /// As [`Runtime::queue`].
    pub fn queue_with<T: Send>(
        &self,
        config: ring::Config,
        wait: Wait,
    ) -> Result<loopback::Queue<T>, Error> {
        self.queue_on(config, wait, loopback::Unit::Copy)
    }

    /// [`Runtime::queue_with`] on a queue served by `unit` of the loopback device (its copy
    /// engine or its compute unit, which run concurrently).
    ///
    /// # Errors
    /// As [`Runtime::queue`].
    pub fn queue_on<T: Send>(
        &self,
        config: ring::Config,
        wait: Wait,
        unit: loopback::Unit,
    ) -> Result<loopback::Queue<T>, Error> {
        let device = self.built_in(
            "built-in queue format",
            "open its queues with Runtime::open_queue and the device::QueueFormat of its driver",
        )?;
        self.open_queue(
            loopback::NpuFormat::new(Arc::clone(device)).unit(unit),
            config,
            wait,
        )
    }

    /// Opens queue `config.id()` in a driver-supplied `format` ([`device::open_queue`]).
    ///
    /// # Errors
    /// As [`device::open_queue`].
    pub fn open_queue<F: QueueFormat, T: Send>(
        &self,
        format: F,
        config: ring::Config,
        wait: Wait,
    ) -> Result<ring::Queue<F::Submission, F::Completion, T>, Error> {
        Ok(device::open_queue(
            &self.inner.device,
            format,
            config,
            wait,
        )?)
    }

    /// The loopback device behind this runtime, for what only it has built in; otherwise
    /// [`Error::Unsupported`] naming `what` the device lacks and the `hint`.
    fn built_in(&self, what: &'static str, hint: &'static str) -> Result<&Arc<Loopback>, Error> {
        self.inner
            .loopback
            .as_ref()
            .ok_or_else(|| Error::Unsupported {
                device: self.inner.device.identity().to_string(),
                what,
                hint,
            })
    }

    /// The device's own memory as a range allocator: the loopback device's BAR 2 (all of it).
    /// Every call returns the same allocator.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a device whose memory BAR this runtime does not know (make a
    /// [`DeviceMemory::of_bar`] for it).
    pub fn device_memory(&self) -> Result<&DeviceMemory, Error> {
        if let Some(memory) = self.inner.device_memory.get() {
            return Ok(memory);
        }
        let device = self.built_in(
            "known device-memory BAR",
            "make a device::DeviceMemory::of_bar for the BAR that holds its memory",
        )?;
        let memory = DeviceMemory::new(
            loopback::regs::MEMORY_BAR,
            device.config().memory_bytes() as u64,
        );
        Ok(self.inner.device_memory.get_or_init(|| memory))
    }
}

/// `bytes` of fresh host memory (rounded up to whole `page_size` pages) mapped into `space`:
/// what [`Runtime::map_memory`] does, for code that holds a DMA space without a runtime (a
/// test of one layer, a device's own rings). A memfd, locked only for a physical-address space.
///
/// # Errors
/// [`Error::Memory`] (no such hugepages, the lock limit), [`Error::Dma`] (no IOVA space).
pub fn map_memory(
    space: &dyn dma::Space,
    bytes: usize,
    page_size: PageSize,
) -> Result<dma::Mapping, Error> {
    map_memory_on(space, bytes, page_size, None)
}

/// [`map_memory`] with the pages bound to NUMA node `node` (`None`: no placement), as
/// [`Runtime::map_memory_on`] does.
///
/// # Errors
/// As [`map_memory`]; [`memory::Error::NoSuchNode`](crate::memory::Error::NoSuchNode) for a
/// node that does not exist, and a hugepage shortage is one on that node.
pub fn map_memory_on(
    space: &dyn dma::Space,
    bytes: usize,
    page_size: PageSize,
    node: Option<u32>,
) -> Result<dma::Mapping, Error> {
    let page = page_size.bytes();
    let len =
        bytes
            .max(1)
            .checked_next_multiple_of(page)
            .ok_or(crate::memory::Error::InvalidLength {
                len: bytes,
                page_size,
                suggested: usize::MAX / page * page,
            })?;
    let lock = space.kind() == dma::Kind::Physical;
    let region = Region::builder(len)
        .page_size(page_size)
        .memfd()
        .lock(lock)
        .node(node)
        .build()?;
    Ok(space.map(Arc::new(region))?)
}

#[cfg(test)]
mod tests;
