//! Devices: the [`Device`] trait every backend implements, its backends ([`Vfio`], [`Uio`]),
//! and [`open`], which picks the backend from the driver a PCI function is bound to. A device
//! simulated in software implements the same trait from its own package (the loopback NPU:
//! `userdma-loopback`).
//!
//! A device is what an SDK drives: BARs reached as [`mmio`] register blocks, a DMA address space
//! its buffers are mapped into, one interrupt vector (an eventfd) per queue, a reset, and an
//! identity. The loopback NPU (the `userdma-loopback` package) is a software device with the
//! same contract as hardware (its register map is documented there); [`vfio`] and [`uio`] fill
//! the same trait from the kernel:
//!
//! | method | loopback | [`Vfio`] | [`Uio`] |
//! |---|---|---|---|
//! | [`Device::bar`] | shared-memory register file, memfd device memory | `VFIO_DEVICE_GET_REGION_INFO` + `mmap` of what the kernel allows (sparse areas, [`mmio::Direct`]), `pread`/`pwrite` on the device fd elsewhere ([`mmio::FileBacked`]) | `mmap` of sysfs `resourceN` |
//! | [`Device::dma_space`] | [`dma::SoftIommu`] (or its out-of-process twin) | [`dma::Type1`] / [`dma::Iommufd`] / [`dma::Physical`] (no-IOMMU, opt-in) | [`dma::Physical`], refused behind a translating IOMMU |
//! | [`Device::interrupt`] | an eventfd the engine signals | the eventfds given to `VFIO_DEVICE_SET_IRQS` (INTx, MSI, MSI-X) | an eventfd a relay thread signals on each `/dev/uioN` interrupt |
//! | [`Device::set_masked`] | the mask registers | `VFIO_IRQ_SET_ACTION_MASK` / `UNMASK` (INTx; MSI/MSI-X where VFIO allows) | `INTX_DISABLE` in the command register |
//! | [`Device::numa_node`] | its configured node | sysfs `numa_node`, when that node has memory | as VFIO |
//! | [`Device::reset`] | the reset register | `VFIO_DEVICE_RESET` (the hot-reset info names what a bus reset would touch when there is none) | sysfs `reset`, when the kernel offers one |
//! | [`Device::stop_queue`] | clears the queue's enable bit and waits for the acknowledgement | the default: resets the function | as VFIO |
//!
//! A queue that is dropped with work in flight asks its device to stop it through
//! [`Quiescer`] (a [`ring::Quiesce`] over [`Device::stop_queue`]) and waits for the device to
//! acknowledge before the buffers it names are freed.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::{dma, irq, mmio, pci, ring};

mod config;
mod dram;
mod error;
mod events;
mod queue;
pub mod uio;
pub mod vfio;

pub use self::dram::{DeviceMemory, Range};
pub use self::error::{Backend, Error};
pub use self::events::{Event, Events, Source};
pub use self::queue::{open_queue, DoorbellRegs, QueueFormat, Wait};
pub use self::uio::Uio;
pub use self::vfio::Vfio;

/// The kinds of device backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Kind {
    /// A PCI function bound to vfio-pci.
    Vfio,
    /// A PCI function bound to uio_pci_generic.
    Uio,
    /// A device simulated in software (the loopback NPU, a test's device).
    Simulated,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Vfio => "vfio",
            Kind::Uio => "uio",
            Kind::Simulated => "simulated",
        })
    }
}

/// Who a device is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Identity {
    /// A name for messages (`loopback0`, or the PCI device's name).
    pub name: String,
    /// The backend.
    pub kind: Kind,
    /// The PCI address, for PCI devices.
    pub bdf: Option<pci::Bdf>,
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.bdf {
            Some(bdf) => write!(f, "{} ({}, {bdf})", self.name, self.kind),
            None => write!(f, "{} ({})", self.name, self.kind),
        }
    }
}

/// A device an SDK drives. Object-safe: hold it as `Arc<dyn Device>`.
pub trait Device: Send + Sync + fmt::Debug {
    /// Who the device is.
    fn identity(&self) -> &Identity;

    /// BAR `index` as a register block (`Err` for a BAR the device does not have).
    fn bar(&self, index: usize) -> Result<mmio::DynBlock, Error>;

    /// The DMA address space buffers must be mapped into before the device can reach them.
    fn dma_space(&self) -> Arc<dyn dma::Space>;

    /// Number of interrupt vectors (one per queue).
    fn vectors(&self) -> u32;

    /// A handle to vector `vector`'s eventfd, to wait on (give it to a
    /// [`ring::Queue`] or an [`irq::Waiter`]).
    fn interrupt(&self, vector: u32) -> Result<irq::EventFd, Error>;

    /// Masks or unmasks vector `vector`. A masked vector raised is remembered and fires when
    /// unmasked.
    fn set_masked(&self, vector: u32, masked: bool) -> Result<(), Error>;

    /// Resets the device and waits for it to come back: every queue stopped, interrupts
    /// unmasked.
    fn reset(&self) -> Result<(), Error>;

    /// The NUMA node host memory for this device goes on: the node a PCI function sits on
    /// (sysfs `numa_node`) when that node has memory, a simulated device's configured node.
    /// [`Runtime`](crate::Runtime) places
    /// the memory it maps for the device (pools, mappings, host arenas) and its queues' rings
    /// there. The default, for devices that do not say: `None`, no placement.
    fn numa_node(&self) -> Option<u32> {
        None
    }

    /// Makes the device stop touching queue `queue`'s ring and buffers, waiting up to `timeout`
    /// for it to acknowledge. The default resets the whole device (a device that cannot stop
    /// one queue stops them all).
    fn stop_queue(&self, queue: u16, timeout: Duration) -> Result<(), Error> {
        let _ = (queue, timeout);
        self.reset()
    }

    /// The device's event source ([`Source`]): what it reports removals and errors through.
    /// The default, for devices that report nothing: `None`.
    fn event_source(&self) -> Option<&Source> {
        None
    }

    /// A new subscriber to the device's events ([`Events`]: a removal, error interrupts), to
    /// poll, wait on or put into an epoll loop. A device without an [`event_source`] gives one
    /// that never fires.
    ///
    /// [`event_source`]: Device::event_source
    fn events(&self) -> Result<Events, Error> {
        let subscribed = match self.event_source() {
            Some(source) => source.subscribe(),
            None => Source::new(self.identity().name.clone()).subscribe(),
        };
        subscribed.map_err(|source| Error::Events { source })
    }

    /// Whether the device was removed (see [`Events`]).
    fn is_removed(&self) -> bool {
        self.event_source().is_some_and(Source::is_removed)
    }

    /// The alignment, in bytes, the device needs of the start of a DMA buffer it is given (a
    /// power of two). [`Runtime::pool`](crate::Runtime::pool) lays its pools out by it
    /// ([`pool::Config::dma_alignment`](crate::pool::Config::dma_alignment)): at most 256
    /// bytes, the classes from 4 KiB up are cache-coloured (buffers 256-byte aligned, faster
    /// to touch many in a row); more, every class is aligned to its size. The default, for
    /// devices that do not say: a base page (4096), what a device that takes page lists (NVMe
    /// PRPs) or a file opened for direct I/O needs. A VFIO or UIO device is a PCI function
    /// the library knows nothing about, so it says 4096 unless its opener states its own
    /// ([`vfio::Options::dma_alignment`], [`Uio::with_dma_alignment`]).
    fn dma_alignment(&self) -> usize {
        crate::pool::DEFAULT_DMA_ALIGNMENT
    }

    /// The device's own memory, when the device says where it is: the BAR that holds it and
    /// its size in bytes (an NPU's DRAM window; the loopback NPU's BAR 2).
    /// [`Runtime::device_memory`](crate::Runtime::device_memory) hands out ranges of it. The
    /// default, for devices that do not say: `None`.
    fn memory_bar(&self) -> Option<MemoryBar> {
        None
    }
}

/// Where a device's own memory is ([`Device::memory_bar`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBar {
    /// The BAR that holds it.
    pub index: usize,
    /// Its size in bytes (at most the BAR's).
    pub bytes: u64,
}

/// Opens `bdf` with the backend its driver calls for: [`Vfio`] for `vfio-pci` (with
/// [`vfio::Options::new`]), [`Uio`] for `uio_pci_generic`. An unbound device, or one bound to
/// any other driver, is an error that names the `userdma bind` command to run.
pub fn open(bdf: pci::Bdf) -> Result<Arc<dyn Device>, Error> {
    open_in(&pci::Sysfs::system(), bdf)
}

/// [`open`], against a sysfs tree.
fn open_in(sysfs: &pci::Sysfs, bdf: pci::Bdf) -> Result<Arc<dyn Device>, Error> {
    let driver = sysfs
        .driver(bdf)
        .map_err(|source| Error::Sysfs { bdf, source })?;
    match driver.as_deref() {
        None if !sysfs.exists(bdf) => Err(Error::Sysfs {
            bdf,
            source: pci::Error::NotFound {
                bdf,
                dir: sysfs.devices_dir(),
            },
        }),
        None => Err(Error::NotBound { bdf }),
        Some(d) if d == pci::Driver::VfioPci.name() || d.ends_with("vfio_pci") => {
            Ok(Arc::new(Vfio::open(bdf)?))
        }
        Some(d) if d == pci::Driver::UioPciGeneric.name() => Ok(Arc::new(Uio::open(bdf)?)),
        Some(d) => Err(Error::WrongDriver {
            bdf,
            driver: d.to_owned(),
        }),
    }
}

/// The [`ring::Quiesce`] of a queue of `device`: asks the device to stop the queue
/// ([`Device::stop_queue`]) when the queue is dropped or shut down with work in flight. Holds the
/// device, so the device outlives its queues.
#[derive(Debug, Clone)]
pub struct Quiescer {
    device: Arc<dyn Device>,
}

impl Quiescer {
    /// The quiesce hook of `device`'s queues.
    pub fn new(device: Arc<dyn Device>) -> Quiescer {
        Quiescer { device }
    }
}

impl ring::Quiesce for Quiescer {
    fn quiesce(&mut self, queue: u16, timeout: Duration) -> io::Result<()> {
        // A removed device was cut off from memory before the removal was reported.
        if self.device.is_removed() {
            return Ok(());
        }
        self.device
            .stop_queue(queue, timeout)
            .map_err(|err| match err {
                Error::Timeout { .. } => io::Error::new(io::ErrorKind::TimedOut, err),
                other => io::Error::other(other),
            })
    }
}
