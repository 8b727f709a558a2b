//! What goes wrong with devices: [`Error`], with its stable [`Code`](crate::Code)s and the
//! hints its messages give, and [`Backend`], the error of a backend outside this package.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use super::{uio, vfio};
use crate::{dma, irq, memory, mmio, pci, ring};

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

    /// A driver's queue format ([`QueueFormat`](super::QueueFormat)) failed, for a reason of
    /// its own.
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
