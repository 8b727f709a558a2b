//! Devices: the [`Device`] trait every backend implements, and the software [`Loopback`]
//! device.
//!
//! A device is what an SDK drives: BARs reached as [`mmio`] register blocks, a DMA address space
//! its buffers are mapped into, one interrupt vector (an eventfd) per queue, a reset, and an
//! identity. The [`loopback`] backend is a software device with the same contract as hardware
//! (its register map is documented there); the VFIO and UIO backends will fill the same trait
//! from the kernel:
//!
//! | method | loopback | VFIO (to come) | UIO (to come) |
//! |---|---|---|---|
//! | [`Device::bar`] | shared-memory register file, memfd device memory | `VFIO_DEVICE_GET_REGION_INFO` + `mmap` ([`mmio::Direct`]), or `pread`/`pwrite` on the device fd ([`mmio::FileBacked`]) | `mmap` of `/dev/uioN` map N |
//! | [`Device::dma_space`] | [`dma::Loopback`] (or its out-of-process twin) | [`dma::Type1`] / [`dma::Iommufd`] | [`dma::Physical`] |
//! | [`Device::interrupt`] | an eventfd the engine signals | the eventfd given to `VFIO_DEVICE_SET_IRQS` (MSI/MSI-X) | `read` on `/dev/uioN` |
//! | [`Device::set_masked`] | the mask registers | `VFIO_IRQ_SET_ACTION_MASK` / `UNMASK` | the device's own mask register |
//! | [`Device::reset`] | the reset register | `VFIO_DEVICE_RESET` (FLR) | the device's own reset, if any |
//! | [`Device::stop_queue`] | clears the queue's enable bit and waits for the acknowledgement | the device driver's queue disable; the default resets the function | as VFIO |
//!
//! A queue that is dropped with work in flight asks its device to stop it through
//! [`Quiescer`] (a [`ring::Quiesce`] over [`Device::stop_queue`]) and waits for the device to
//! acknowledge before the buffers it names are freed.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::{dma, irq, memory, mmio, pci, ring};

pub mod loopback;

pub use self::loopback::Loopback;

/// The kinds of device backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A PCI function bound to vfio-pci.
    Vfio,
    /// A PCI function bound to uio_pci_generic.
    Uio,
    /// The software loopback device.
    Loopback,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Vfio => "vfio",
            Kind::Uio => "uio",
            Kind::Loopback => "loopback",
        })
    }
}

/// Who a device is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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

    /// Makes the device stop touching queue `queue`'s ring and buffers, waiting up to `timeout`
    /// for it to acknowledge. The default resets the whole device (a device that cannot stop
    /// one queue stops them all).
    fn stop_queue(&self, queue: u16, timeout: Duration) -> Result<(), Error> {
        let _ = (queue, timeout);
        self.reset()
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
    /// A configuration value out of range.
    #[error(
        "loopback device configuration: {field} = {value} is out of range (expected {expected})"
    )]
    Config {
        /// The setting.
        field: &'static str,
        /// The value given.
        value: u64,
        /// What is accepted.
        expected: &'static str,
    },

    /// A BAR the device does not have.
    #[error("the device has no BAR {index} (the loopback device has BAR 0, registers, and BAR 2, device memory)")]
    NoSuchBar {
        /// The index asked for.
        index: usize,
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

    /// A register access failed.
    #[error("register access at offset {offset:#x} failed")]
    Register {
        /// The register's offset.
        offset: usize,
        /// The cause.
        #[source]
        source: mmio::Error,
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

    /// Setting up a queue's ring failed.
    #[error("queue {queue}: setting up the ring failed")]
    Ring {
        /// The queue.
        queue: u16,
        /// The cause.
        #[source]
        source: ring::Error,
    },

    /// A queue is enabled already.
    #[error("queue {queue} is in use (enabled, or stopped on a fault not acknowledged): drop its ring::Queue first")]
    QueueBusy {
        /// The queue.
        queue: u16,
    },

    /// The device stopped a queue on a fault.
    #[error("queue {queue} faulted: {fault}")]
    QueueFault {
        /// The queue.
        queue: u16,
        /// Why.
        fault: loopback::Fault,
    },

    /// The device did not acknowledge in time.
    #[error("the device did not {operation} within {waited:?}: is its engine running (Loopback::is_running)?")]
    Timeout {
        /// What was waited for.
        operation: &'static str,
        /// How long.
        waited: Duration,
    },

    /// The device's engine is not running (stopped, or its process exited).
    #[error("the device's engine is not running{}", exit_detail(.exit))]
    Stopped {
        /// How the device process ended (an out-of-process device whose process exited).
        exit: Option<std::process::ExitStatus>,
    },

    /// Starting the engine thread failed.
    #[error("starting the loopback engine thread failed")]
    Thread {
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// Starting the device process failed.
    #[error("starting the loopback device process {program:?} failed: pass the `userdma` binary (or any program that runs `device::loopback::serve_process`) in loopback::Mode::Process")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// Talking to the device process failed.
    #[error("{operation} over the device process's control socket failed")]
    Control {
        /// What was being done.
        operation: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// The device process answered something malformed.
    #[error("the device process's reply to {operation} is malformed: {defect}")]
    Protocol {
        /// What was being done.
        operation: &'static str,
        /// What is wrong.
        defect: &'static str,
    },

    /// This process was started as a device process without the control socket.
    #[error("this process was not started as a loopback device process: {variable} is {defect} (it is set by loopback::Mode::Process)")]
    NotDeviceProcess {
        /// The environment variable.
        variable: &'static str,
        /// What is wrong with it.
        defect: &'static str,
    },
}

/// ` (its process exited ...)` when known.
fn exit_detail(exit: &Option<std::process::ExitStatus>) -> String {
    exit.as_ref()
        .map_or_else(String::new, |exit| format!(" (its process ended: {exit})"))
}
