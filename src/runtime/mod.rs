//! The runtime: one owner of a device and everything made for it — the DMA space, pinned
//! memory mapped into it, buffer pools, the device's memory and its queues — handing out
//! `'static`, `Send` handles the layers above (a pipeline, a scheduler, a C handle) can hold.
//!
//! ```text
//!   Runtime::open(bdf) | Runtime::from_device(device)   device + its DMA space (+ NUMA node)
//!     .pool(bytes, page size)   -> Arc<Pool>          memory allocated on the device's node,
//!                                                     mapped once, carved
//!     .open_queue(format, ring config, wait)          ring memory, doorbells, vector, enabled
//!                               -> ring::Queue        in the driver's queue format
//!     .device_memory()          -> DeviceMemory       ranges of the device's own memory
//!   pool.alloc_owned(len)       -> OwnedBuffer        no lifetime: keeps its pool alive
//!   queue.submit(command, buf)
//! ```
//!
//! A simulated device's package adds its own constructor and queue format on top (the loopback
//! NPU's `Runtime::loopback(config)` and `runtime.queue(config)`, from `userdma-loopback`'s
//! `LoopbackRuntime`), through [`Runtime::from_concrete`] and [`Runtime::device_as`].
//!
//! **What outlives what.** Nothing here depends on the order in which handles are dropped:
//! a queue holds its device (so the device's engine, its BARs and its DMA space outlive it),
//! an in-flight buffer belongs to its queue and holds its pool, and a pool holds its mapping.
//! Dropping a queue with work in flight first stops the device queue and waits for the device
//! to acknowledge ([`ring::Queue`]'s drop), only then drops the buffers it held; the last
//! buffer of a pool going away drops the pool, which unmaps the memory from the device's DMA
//! space. So "quiesce before unmap" holds whether the runtime, a queue or a pool goes first.
//!
use std::fmt;
use std::sync::{Arc, OnceLock};

use std::any::Any;

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
    /// The same device as its concrete type (an `Arc<D>`), when the runtime was made with
    /// [`Runtime::from_concrete`]: for what only that backend has ([`Runtime::device_as`]).
    concrete: Option<Box<dyn Any + Send + Sync>>,
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
    /// Opens the PCI function `bdf` with the backend its driver calls for (vfio-pci or
    /// uio_pci_generic, [`device::open`]).
    ///
    /// # Errors
    /// [`Error::Device`]: unbound, another driver (the message names the `userdma bind`
    /// command), or the open failing.
    pub fn open(bdf: pci::Bdf) -> Result<Runtime, Error> {
        #[cfg(feature = "tracing")]
        let _span = tracing::info_span!("runtime.open", %bdf).entered();
        Ok(Runtime::from_device(device::open(bdf)?))
    }

    /// Opens the PCI function `bdf` bound to vfio-pci with `options` (interrupt vectors, DMA
    /// mask, no-IOMMU), e.g. the MSI-X vectors a driver's queues need.
    ///
    /// # Errors
    /// As [`device::Vfio::open_with`].
    pub fn open_vfio(bdf: pci::Bdf, options: &device::vfio::Options) -> Result<Runtime, Error> {
        #[cfg(feature = "tracing")]
        let _span = tracing::info_span!("runtime.open", %bdf).entered();
        let device = device::Vfio::open_with(bdf, options)?;
        Ok(Runtime::from_device(Arc::new(device)))
    }

    /// Owns an already open device.
    pub fn from_device(device: Arc<dyn Device>) -> Runtime {
        Runtime::build(device, None)
    }

    /// Owns an open device and keeps its concrete type, so that [`Runtime::device_as`] gives
    /// it back: how a backend's own package builds on the runtime (the loopback NPU's counters,
    /// faults and queue format).
    pub fn from_concrete<D: Device + 'static>(device: Arc<D>) -> Runtime {
        let concrete: Box<dyn Any + Send + Sync> = Box::new(Arc::clone(&device));
        Runtime::build(device, Some(concrete))
    }

    fn build(device: Arc<dyn Device>, concrete: Option<Box<dyn Any + Send + Sync>>) -> Runtime {
        let space = device.dma_space();
        let numa_node = device.numa_node();
        #[cfg(feature = "tracing")]
        tracing::info!(
            device = %device.identity(),
            dma_space = %space.kind(),
            dma_mask_bits = space.dma_mask_bits(),
            numa_node,
            "runtime ready"
        );
        Runtime {
            inner: Arc::new(Inner {
                device,
                concrete,
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

    /// The device as its concrete type `D`, when the runtime was made with
    /// [`Runtime::from_concrete`] from a `D`; `None` otherwise.
    pub fn device_as<D: Device + 'static>(&self) -> Option<&Arc<D>> {
        self.inner.concrete.as_ref()?.downcast_ref::<Arc<D>>()
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
    /// ([`pool::Config::fit_to`]). Its layout follows the device's DMA alignment
    /// ([`Device::dma_alignment`], [`pool::Config::dma_alignment`]): cache-coloured classes for
    /// a device that takes 256-byte aligned buffers (the loopback NPU), size-aligned ones (page
    /// aligned from 4 KiB up) for one that needs more (any VFIO or UIO device that does not say
    /// otherwise). Allocate from it with [`Pool::alloc_owned`] (or, inside a borrow,
    /// [`Pool::alloc`]).
    ///
    /// # Errors
    /// As [`Runtime::map_memory`], and [`Error::Pool`] for memory too small for the pool.
    pub fn pool(&self, bytes: usize, page_size: PageSize) -> Result<Arc<Pool>, Error> {
        let config = Runtime::pool_config(page_size).dma_alignment(self.dma_alignment());
        pool_of(self.map_memory(bytes, page_size)?, config)
    }

    /// The alignment, in bytes, the device needs of a DMA buffer's start
    /// ([`Device::dma_alignment`]): what [`Runtime::pool`] lays its pools out by.
    pub fn dma_alignment(&self) -> usize {
        self.inner.device.dma_alignment()
    }

    /// The configuration [`Runtime::pool`] uses for memory of `page_size`: the default, with
    /// 64 KiB chunks on base pages (its layout is set by [`Runtime::pool_with`] from the
    /// device's alignment unless stated). A start for [`Runtime::pool_with`].
    pub fn pool_config(page_size: PageSize) -> pool::Config {
        match page_size {
            PageSize::Base => pool::Config::default().chunk_size(BASE_PAGE_CHUNK),
            _ => pool::Config::default(),
        }
    }

    /// [`Runtime::pool`] with a pool configuration. A configuration that states no DMA
    /// alignment gets the device's ([`Runtime::dma_alignment`]), and with it the device's
    /// layout unless it sets [`pool::Config::colouring`] itself.
    ///
    /// # Errors
    /// As [`Runtime::pool`]; [`Error::Pool`] ([`pool::Error::Config`], field `dma_alignment`)
    /// for an alignment below the device's, or colouring asked for on a device that needs
    /// more than 256-byte alignment.
    pub fn pool_with(
        &self,
        bytes: usize,
        page_size: PageSize,
        config: pool::Config,
    ) -> Result<Arc<Pool>, Error> {
        let device = self.dma_alignment();
        let config = match config.dma_alignment_set() {
            None => config.dma_alignment(device),
            // (One that is not a power of two is refused by the pool, saying so.)
            Some(stated) if stated.is_power_of_two() && stated < device => {
                return Err(Error::Pool(pool::Error::Config {
                    field: "dma_alignment",
                    value: stated as u64,
                    expected: "at least the device's (Runtime::dma_alignment): buffers less \
                               aligned than it needs would be refused or misread",
                }));
            }
            Some(_) => config,
        };
        let mapping = self.map_memory(bytes, page_size)?;
        Ok(Arc::new(Pool::new(mapping, config)?))
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

    /// The device's own memory as a range allocator, where the device says where it is
    /// ([`Device::memory_bar`]: the loopback NPU's BAR 2, an NPU's DRAM window). Every call
    /// returns the same allocator.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a device that does not say (make a
    /// [`DeviceMemory::of_bar`] for the BAR that holds its memory).
    pub fn device_memory(&self) -> Result<&DeviceMemory, Error> {
        if let Some(memory) = self.inner.device_memory.get() {
            return Ok(memory);
        }
        let bar = self
            .inner
            .device
            .memory_bar()
            .ok_or_else(|| Error::Unsupported {
                device: self.inner.device.identity().to_string(),
                what: "known device-memory BAR",
                hint: "make a device::DeviceMemory::of_bar for the BAR that holds its memory",
            })?;
        let memory = DeviceMemory::new(bar.index, bar.bytes);
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

/// A pool over `bytes` of fresh host memory mapped into `space`: what [`Runtime::pool`] makes,
/// for code that holds a DMA space without a runtime (an engine over its own software IOMMU).
///
/// # Errors
/// As [`map_memory`], and [`Error::Pool`] for memory too small for the pool.
pub fn pool(space: &dyn dma::Space, bytes: usize, page_size: PageSize) -> Result<Arc<Pool>, Error> {
    pool_of(
        map_memory(space, bytes, page_size)?,
        Runtime::pool_config(page_size),
    )
}

/// The pool [`Runtime::pool`] cuts from `mapping` with `config` fitted to it.
fn pool_of(mapping: dma::Mapping, config: pool::Config) -> Result<Arc<Pool>, Error> {
    let config = config.fit_to(&mapping);
    Ok(Arc::new(Pool::new(mapping, config)?))
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
    #[cfg(feature = "tracing")]
    let _span = tracing::debug_span!(
        "runtime.map_memory",
        bytes,
        page_size = %page_size,
        numa_node = node
    )
    .entered();
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
