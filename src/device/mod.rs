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
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::{dma, irq, memory, mmio, pci, ring};

mod config;
mod dram;
mod events;
mod queue;
pub mod uio;
pub mod vfio;

pub use self::dram::{DeviceMemory, Range};
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

/// The failure of a backend outside this package ([`Error::Backend`]): the backend's own
/// error, boxed, with the [`Code`](crate::Code) it gives it. Displays as that error, and its
/// [`source`](std::error::Error::source) is that error's, so the cause chain reads as if the
/// backend's error were here itself.
#[derive(Debug)]
pub struct Backend {
    code: crate::Code,
    error: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl Backend {
    /// Wraps a backend's `error` with its `code`.
    pub fn new(
        code: crate::Code,
        error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Backend {
        Backend {
            code,
            error: error.into(),
        }
    }

    /// The code the backend gave.
    pub fn code(&self) -> crate::Code {
        self.code
    }

    /// The backend's error as its own type, when it is a `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.error.downcast_ref::<T>()
    }

    /// The backend's error as its own type, by value, when it is a `T`; the backend error
    /// back otherwise.
    ///
    /// # Errors
    /// `self` when the error is not a `T`.
    pub fn downcast<T: std::error::Error + 'static>(self) -> Result<T, Backend> {
        let code = self.code;
        self.error
            .downcast::<T>()
            .map(|error| *error)
            .map_err(|error| Backend { code, error })
    }

    /// The backend's error.
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self.error.as_ref()
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for Backend {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
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

/// What went wrong in this module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A BAR the device does not have.
    #[error("the device has no BAR {index} (the loopback device has BAR 0, registers, and BAR 2, device memory; a PCI device's BARs: `userdma info BDF`)")]
    NoSuchBar {
        /// The index asked for.
        index: usize,
    },

    /// A register access failed.
    #[error("register access at offset {offset:#x} failed")]
    Register {
        /// The register's offset.
        offset: usize,
        /// The cause.
        #[source]
        source: mmio::Error,
    },

    /// A queue or vector index past the device's.
    #[error("the device has {count} queues (and vectors), so {index} does not exist")]
    NoSuchQueue {
        /// The index asked for.
        index: u32,
        /// How many the device has.
        count: u32,
    },

    /// Allocating or mapping device-side memory failed.
    #[error("allocating the {what} ({len} bytes) failed")]
    Memory {
        /// What it was for.
        what: &'static str,
        /// Its size.
        len: usize,
        /// The cause.
        #[source]
        source: memory::Error,
    },

    /// Mapping memory into the device's DMA space failed.
    #[error("mapping the {what} into the device's DMA space failed")]
    Map {
        /// What it was for.
        what: &'static str,
        /// The cause.
        #[source]
        source: dma::Error,
    },

    /// An interrupt eventfd could not be made or duplicated.
    #[error("interrupt vector {vector}: the eventfd failed")]
    Interrupt {
        /// The vector.
        vector: u32,
        /// The cause.
        #[source]
        source: irq::Error,
    },

    /// The device was removed (hot-unplugged, unbound, asked back by the kernel, or the
    /// loopback device's `remove`).
    #[error("{device} was removed: it answers nothing any more; drop its queues (their buffers come back) and open it again once it is back (`userdma list`)")]
    Removed {
        /// The device.
        device: String,
    },

    /// An event subscriber's eventfd could not be made.
    #[error("subscribing to the device's events failed (an eventfd could not be made)")]
    Events {
        /// The cause.
        #[source]
        source: irq::Error,
    },

    /// Setting up a queue's ring failed.
    #[error("queue {queue}: setting up the ring failed")]
    Ring {
        /// The queue.
        queue: u16,
        /// The cause.
        #[source]
        source: ring::Error,
    },

    /// A queue depth above what the device takes (checked before the device is touched).
    #[error("{device} queue {queue}: depth {depth} is more than the device's largest, {max}: use a power of two from 2 to {max}")]
    QueueDepth {
        /// The device.
        device: String,
        /// The queue.
        queue: u16,
        /// The depth asked for.
        depth: u32,
        /// The device's largest.
        max: u32,
    },

    /// A queue is enabled already.
    #[error("queue {queue} is in use (enabled, or stopped on a fault not acknowledged): drop its ring::Queue first")]
    QueueBusy {
        /// The queue.
        queue: u16,
    },

    /// The device did not acknowledge in time.
    #[error("the device did not {operation} within {waited:?}: is it alive (for the loopback device: is its engine running, Loopback::is_running)?")]
    Timeout {
        /// What was waited for.
        operation: &'static str,
        /// How long.
        waited: Duration,
    },

    /// Reading the device's sysfs directory failed.
    #[error(
        "reading sysfs for {bdf} failed: is it a PCI address this machine has (`userdma list`)?"
    )]
    Sysfs {
        /// The device.
        bdf: pci::Bdf,
        /// The cause.
        #[source]
        source: pci::Error,
    },

    /// The device is bound to no driver.
    #[error("{bdf} is bound to no driver: run `userdma bind {bdf} --driver vfio-pci` (or `--driver uio_pci_generic`) first")]
    NotBound {
        /// The device.
        bdf: pci::Bdf,
    },

    /// The device is bound to a driver that does not hand it to user space.
    #[error("{bdf} is bound to {driver}, not to vfio-pci or uio_pci_generic: run `userdma bind {bdf} --driver vfio-pci`")]
    WrongDriver {
        /// The device.
        bdf: pci::Bdf,
        /// The driver it is bound to.
        driver: String,
    },

    /// A device node or sysfs file could not be opened.
    #[error("opening {} for {bdf} failed: {}", path.display(), open_hint(.source))]
    Open {
        /// The device.
        bdf: pci::Bdf,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// A PCI device has no such BAR (or the BAR is empty).
    #[error("{bdf} has no BAR {index}: `userdma info {bdf}` lists the BARs it has")]
    NoBar {
        /// The device.
        bdf: pci::Bdf,
        /// The index asked for.
        index: usize,
    },

    /// An interrupt vector that is not enabled.
    #[error("{bdf} has {count} interrupt vectors enabled, so vector {vector} does not exist: enable more (vfio::Options::interrupts, Vfio::enable_interrupts)")]
    NoSuchVector {
        /// The device.
        bdf: pci::Bdf,
        /// The vector asked for.
        vector: u32,
        /// How many are enabled.
        count: u32,
    },

    /// Making the device's DMA space failed.
    #[error("setting up the DMA space of {bdf} failed")]
    DmaSpace {
        /// The device.
        bdf: pci::Bdf,
        /// The cause.
        #[source]
        source: dma::Error,
    },

    /// A configuration-space access failed.
    #[error("configuration space access of {bdf} at {offset:#x} failed")]
    ConfigAccess {
        /// The device.
        bdf: pci::Bdf,
        /// The offset.
        offset: u16,
        /// The cause.
        #[source]
        source: mmio::Error,
    },

    /// The device has no function-level reset.
    #[error("{bdf} has no function reset (VFIO_DEVICE_FLAGS_RESET is clear); {}", hot_reset_hint(.affected))]
    NoReset {
        /// The device.
        bdf: pci::Bdf,
        /// The devices a bus reset would affect, when the kernel said.
        affected: Vec<String>,
    },

    /// A driver's queue format ([`QueueFormat`]) failed, for a reason of its own.
    #[error("queue {queue}: the driver could not {operation}")]
    Driver {
        /// The queue.
        queue: u16,
        /// What it was doing.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// No free range of device memory holds the request.
    #[error("no free range of device memory holds {len} bytes aligned to {align} ({free} of {size} bytes free, the largest free range {largest} bytes): free ranges, or plan the tensors into one arena")]
    DeviceMemoryExhausted {
        /// Bytes asked for.
        len: u64,
        /// Alignment asked for.
        align: u64,
        /// Bytes free in all.
        free: u64,
        /// The largest free range.
        largest: u64,
        /// The device memory's size.
        size: u64,
    },

    /// A device memory request that can never be met: zero bytes, an alignment that is not a
    /// power of two, or a fixed range outside the memory or over one in use.
    #[error(
        "device memory range {offset:#x}+{len:#x} (alignment {align}) cannot be allocated: {why}"
    )]
    DeviceMemoryRange {
        /// Where it was asked for (0 when anywhere).
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// Alignment asked for.
        align: u64,
        /// What is wrong with it.
        why: &'static str,
    },

    /// A backend outside this package failed for a reason of its own (the loopback NPU's
    /// errors, a vendor backend's): its error and code, as it gave them
    /// ([`Backend::downcast_ref`] for the error itself).
    #[error(transparent)]
    Backend(#[from] Backend),

    /// A VFIO device failed.
    #[error(transparent)]
    Vfio(#[from] vfio::Error),

    /// A UIO device failed.
    #[error(transparent)]
    Uio(#[from] uio::Error),
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code); a wrapped module error gives
    /// its own. Exhaustive: a new variant must be given its code here.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::DeviceMemoryRange { .. } | Error::QueueDepth { .. } => Code::InvalidArgument,
            Error::NoSuchQueue { .. }
            | Error::NoSuchBar { .. }
            | Error::NoBar { .. }
            | Error::NoSuchVector { .. }
            | Error::NotBound { .. }
            | Error::WrongDriver { .. } => Code::NotFound,
            Error::QueueBusy { .. } => Code::Busy,
            Error::Removed { .. } => Code::Removed,
            Error::Driver { .. } => Code::Device,
            Error::Timeout { .. } => Code::Timeout,
            Error::NoReset { .. } => Code::Unsupported,
            Error::DeviceMemoryExhausted { .. } => Code::Exhausted,
            // As `open_hint` reads the cause: no node, no permission, held by another process.
            Error::Open { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                Code::NotFound
            }
            Error::Open { source, .. } if source.kind() == io::ErrorKind::PermissionDenied => {
                Code::Refused
            }
            Error::Open { source, .. } if source.raw_os_error() == Some(libc::EBUSY) => Code::Busy,
            Error::Open { .. } => Code::System,
            Error::Register { source, .. } | Error::ConfigAccess { source, .. } => source.code(),
            Error::Interrupt { source, .. } | Error::Events { source } => source.code(),
            Error::Memory { source, .. } => source.code(),
            Error::Map { source, .. } | Error::DmaSpace { source, .. } => source.code(),
            Error::Ring { source, .. } => source.code(),
            Error::Sysfs { source, .. } => source.code(),
            Error::Backend(e) => e.code(),
            Error::Vfio(e) => e.code(),
            Error::Uio(e) => e.code(),
        }
    }
}

/// What to do about a failed open.
fn open_hint(source: &io::Error) -> &'static str {
    match source.kind() {
        io::ErrorKind::NotFound => "no such node: is the device bound to vfio-pci / uio_pci_generic and the module loaded?",
        io::ErrorKind::PermissionDenied => "permission denied: run as root, or install the udev rules that give the node to your group",
        _ if source.raw_os_error() == Some(libc::EBUSY) => "busy: another process (or a VM) holds the device",
        _ => "see the cause",
    }
}

/// What a bus reset would touch, or that there is none.
fn hot_reset_hint(names: &[String]) -> String {
    if names.is_empty() {
        "the kernel offers no bus reset either: reset it through its own registers, or unbind and rebind it".to_owned()
    } else {
        format!("a bus (hot) reset would also reset {}", names.join(", "))
    }
}
