//! Devices: the [`Device`] trait every backend implements, its backends ([`Vfio`], [`Uio`],
//! the software [`Loopback`]), and [`open`], which picks the backend from the driver a PCI
//! function is bound to.
//!
//! A device is what an SDK drives: BARs reached as [`mmio`] register blocks, a DMA address space
//! its buffers are mapped into, one interrupt vector (an eventfd) per queue, a reset, and an
//! identity. The [`loopback`] backend is a software device with the same contract as hardware
//! (its register map is documented there); [`vfio`] and [`uio`] fill the same trait from the
//! kernel:
//!
//! | method | loopback | [`Vfio`] | [`Uio`] |
//! |---|---|---|---|
//! | [`Device::bar`] | shared-memory register file, memfd device memory | `VFIO_DEVICE_GET_REGION_INFO` + `mmap` of what the kernel allows (sparse areas, [`mmio::Direct`]), `pread`/`pwrite` on the device fd elsewhere ([`mmio::FileBacked`]) | `mmap` of sysfs `resourceN` |
//! | [`Device::dma_space`] | [`dma::Loopback`] (or its out-of-process twin) | [`dma::Type1`] / [`dma::Iommufd`] / [`dma::Physical`] (no-IOMMU, opt-in) | [`dma::Physical`], refused behind a translating IOMMU |
//! | [`Device::interrupt`] | an eventfd the engine signals | the eventfds given to `VFIO_DEVICE_SET_IRQS` (INTx, MSI, MSI-X) | an eventfd a relay thread signals on each `/dev/uioN` interrupt |
//! | [`Device::set_masked`] | the mask registers | `VFIO_IRQ_SET_ACTION_MASK` / `UNMASK` (INTx; MSI/MSI-X where VFIO allows) | `INTX_DISABLE` in the command register |
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

use serde::Serialize;

use crate::{dma, irq, memory, mmio, pci, ring};

mod config;
mod dram;
pub mod loopback;
mod queue;
pub mod uio;
pub mod vfio;

pub use self::dram::{DeviceMemory, Range};
pub use self::loopback::Loopback;
pub use self::queue::{open_queue, DoorbellRegs, Format, Wait};
pub use self::uio::Uio;
pub use self::vfio::Vfio;

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
    #[error("the device did not {operation} within {waited:?}: is it alive (for the loopback device: is its engine running, Loopback::is_running)?")]
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

    /// Opening or querying the VFIO container failed.
    #[error("{operation} on the VFIO container {} failed: is the vfio module loaded, and may this user open it (root, or the udev rules)?", path.display())]
    Container {
        /// The container node.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// The device is in no IOMMU group and no no-IOMMU group either.
    #[error("{bdf} is in no IOMMU group: boot with the IOMMU on (intel_iommu=on / amd_iommu=on), or load vfio with enable_unsafe_noiommu_mode=1 and open with Options::allow_noiommu(true); then bind it to vfio-pci again")]
    NoGroup {
        /// The device.
        bdf: pci::Bdf,
    },

    /// The device is in a no-IOMMU group and the caller did not opt in.
    #[error("{bdf} is in VFIO no-IOMMU group {group}: its DMA is neither translated nor isolated; opt in with vfio::Options::allow_noiommu(true) (CLI: --allow-noiommu) if that is what you want")]
    NoIommuRefused {
        /// The device.
        bdf: pci::Bdf,
        /// The group number.
        group: u32,
    },

    /// Another member of the device's IOMMU group is bound to a host driver.
    #[error("IOMMU group {group} of {bdf} is not viable: {} bound to a host driver; {}", culprit_list(.culprits), bind_hint(.culprits))]
    GroupNotViable {
        /// The device.
        bdf: pci::Bdf,
        /// The group number.
        group: u32,
        /// The members in the way and their drivers (empty when only the kernel said so).
        culprits: Vec<(pci::Bdf, String)>,
    },

    /// The VFIO container does not speak the API version or IOMMU model needed.
    #[error("the VFIO container {} {what}: is the vfio module (and vfio_iommu_type1) loaded and current?", path.display())]
    Unsupported {
        /// The container node.
        path: PathBuf,
        /// What it lacks.
        what: String,
    },

    /// A VFIO ioctl failed.
    #[error("{ioctl} for {bdf} failed: {}", ioctl_hint(.ioctl))]
    Ioctl {
        /// The device.
        bdf: pci::Bdf,
        /// The ioctl.
        ioctl: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// The kernel's description of a region could not be parsed.
    #[error("VFIO region {index} of {bdf}: malformed VFIO_DEVICE_GET_REGION_INFO reply: {defect}")]
    MalformedRegion {
        /// The device.
        bdf: pci::Bdf,
        /// The region index.
        index: u32,
        /// What is wrong.
        defect: vfio::RegionDefect,
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

    /// A device shares a container whose DMA space was made for a wider DMA mask.
    #[error("{bdf} needs a {wanted}-bit DMA mask but its shared container's DMA space was made for {space} bits: open the device with the narrowest mask first, or give it its own container")]
    ContainerMask {
        /// The device.
        bdf: pci::Bdf,
        /// The device's mask width.
        wanted: u32,
        /// The space's mask width.
        space: u32,
    },

    /// A shared container is already set to the other IOMMU model (type1 vs no-IOMMU).
    #[error("{bdf} cannot join a container set to {model}: give it its own container")]
    ContainerModel {
        /// The device.
        bdf: pci::Bdf,
        /// The container's model.
        model: &'static str,
    },

    /// Mapping part of a BAR failed.
    #[error("mapping {len:#x} bytes at {offset:#x} of region {index} of {bdf} failed: is the BAR memory (not I/O ports) and enabled?")]
    MapBar {
        /// The device.
        bdf: pci::Bdf,
        /// The region index.
        index: u32,
        /// The offset in the region.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The cause.
        #[source]
        source: io::Error,
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

    /// More interrupt vectors than the device offers, or a kind it lacks.
    #[error("{bdf} offers {available} {kind} vectors, {requested} asked for: ask for at most {available} (or another kind; `userdma info {bdf}` lists them)")]
    NoSuchIrq {
        /// The device.
        bdf: pci::Bdf,
        /// The kind.
        kind: vfio::IrqKind,
        /// How many were asked for.
        requested: u32,
        /// How many the device has.
        available: u32,
    },

    /// Masking asked of vectors that cannot be masked.
    #[error("{bdf}: {kind} vectors cannot be masked through VFIO (its flags say so); mask in the device instead")]
    NotMaskable {
        /// The device.
        bdf: pci::Bdf,
        /// The kind.
        kind: vfio::IrqKind,
    },

    /// The device has no function-level reset.
    #[error("{bdf} has no function reset (VFIO_DEVICE_FLAGS_RESET is clear); {}", hot_reset_hint(.affected))]
    NoReset {
        /// The device.
        bdf: pci::Bdf,
        /// The devices a bus reset would affect, when the kernel said.
        affected: Vec<String>,
    },

    /// A UIO operation failed.
    #[error("{operation} on {} ({bdf}) failed", path.display())]
    Uio {
        /// The device.
        bdf: pci::Bdf,
        /// The file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// A device bound to uio_pci_generic has no UIO node.
    #[error("{bdf} has no UIO node under {}: is it bound to uio_pci_generic (`userdma bind {bdf} --driver uio_pci_generic`)?", dir.display())]
    NoUioNode {
        /// The device.
        bdf: pci::Bdf,
        /// Where the node's name was looked for.
        dir: PathBuf,
    },

    /// Physical-address DMA refused because the IOMMU translates the device.
    #[error("{bdf} is in IOMMU group {group} with a translating {domain} domain: physical addresses would fault; boot with iommu=pt (passthrough) for UIO, or bind to vfio-pci (`userdma bind {bdf} --driver vfio-pci`)")]
    IommuTranslates {
        /// The device.
        bdf: pci::Bdf,
        /// The group.
        group: u32,
        /// The domain type (`DMA`, `DMA-FQ`).
        domain: String,
    },

    /// A driver's queue format ([`Format`]) failed, for a reason of its own.
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

    /// This process was started as a device process without the control socket.
    #[error("this process was not started as a loopback device process: {variable} is {defect} (it is set by loopback::Mode::Process)")]
    NotDeviceProcess {
        /// The environment variable.
        variable: &'static str,
        /// What is wrong with it.
        defect: &'static str,
    },
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

/// What to do about a failed VFIO ioctl.
fn ioctl_hint(ioctl: &str) -> &'static str {
    match ioctl {
        "VFIO_GROUP_SET_CONTAINER" => "is the group held by another process or container?",
        "VFIO_SET_IOMMU" => "is vfio_iommu_type1 loaded (or no-IOMMU mode enabled)?",
        "VFIO_GROUP_GET_DEVICE_FD" => "is the device open elsewhere, or bound to another driver?",
        "VFIO_DEVICE_BIND_IOMMUFD" | "VFIO_DEVICE_ATTACH_IOMMUFD_PT" => {
            "is the kernel built with CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV?"
        }
        "VFIO_DEVICE_SET_IRQS" => {
            "are the vectors enabled, and is the kind supported (`userdma info`)?"
        }
        "VFIO_DEVICE_RESET" => "the device may not support function reset",
        _ => "see the cause",
    }
}

/// `0000:00:03.0 (nvme), ...`.
fn culprit_list(culprits: &[(pci::Bdf, String)]) -> String {
    if culprits.is_empty() {
        return "a member is".to_owned();
    }
    let names: Vec<String> = culprits.iter().map(|(b, d)| format!("{b} ({d})")).collect();
    format!(
        "{} {}",
        names.join(", "),
        if names.len() == 1 { "is" } else { "are" }
    )
}

/// The bind command for the culprits.
fn bind_hint(culprits: &[(pci::Bdf, String)]) -> String {
    match culprits.first() {
        None => "bind every member of the group to vfio-pci (`userdma bind BDF --driver vfio-pci`)"
            .to_owned(),
        Some((bdf, _)) => format!(
            "bind every member to vfio-pci (`userdma bind {bdf} --driver vfio-pci`) or unbind it"
        ),
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

/// ` (its process exited ...)` when known.
fn exit_detail(exit: &Option<std::process::ExitStatus>) -> String {
    exit.as_ref()
        .map_or_else(String::new, |exit| format!(" (its process ended: {exit})"))
}
