//! [`Vfio`]: a PCI function bound to `vfio-pci`, driven through VFIO.
//!
//! Opening ([`Vfio::open`], [`Vfio::open_with`]) does, in order:
//!
//! 1. checks in sysfs that the function is bound to `vfio-pci`, finds its IOMMU group and checks
//!    that every other member is bound to `vfio-pci` (or a driver VFIO tolerates) or to none,
//!    naming the members in the way otherwise;
//! 2. gets a device fd and a DMA space, one of three ways:
//!    * **iommufd** where `/dev/iommu` and the device's cdev (`/dev/vfio/devices/vfioN`) exist
//!      (Linux 6.6 with `CONFIG_IOMMUFD` and `CONFIG_VFIO_DEVICE_CDEV`): a new IO address space
//!      ([`dma::Iommufd`]), the device bound (`VFIO_DEVICE_BIND_IOMMUFD`) and attached to it;
//!    * **container and group** otherwise: the group attached to a [`Container`] (a new one, or
//!      the one in [`Options::container`]) set to type1v2, and the space its [`dma::Type1`];
//!    * **no-IOMMU**, only with [`Options::allow_noiommu`] and a warning on stderr: the
//!      `noiommu-N` group in a container set to `VFIO_NOIOMMU_IOMMU`, and [`dma::Physical`];
//! 3. reads the device, region ([`RegionInfo`], with sparse-mmap areas) and interrupt
//!    ([`IrqInfo`]) info, turns bus mastering on, and enables the interrupts of
//!    [`Options::interrupts`].
//!
//! BARs ([`Device::bar`]) are mapped where the kernel allows it and served through
//! `pread`/`pwrite` elsewhere. Interrupts are eventfds given to `VFIO_DEVICE_SET_IRQS`, one per
//! vector ([`Vfio::enable_interrupts`], [`Device::interrupt`]); they can go straight to a
//! [`crate::ring::Queue`] or an [`irq::Waiter`].
//!
//! Dropping a `Vfio` disables its interrupts, unmaps the BARs no [`mmio::DynBlock`] still uses,
//! closes the device fd, detaches the group from the container, and closes the container when no
//! other device or caller holds it. Drop [`dma::Mapping`]s (and pools) before the device. A
//! mapping dropped after the container lost its IOMMU (the device's group was its last, and left
//! it: the device was dropped, unbound or hot-unplugged) was unmapped by the kernel with the
//! IOMMU; its unmap counts as done, in [`dma::Stats::unmaps_after_removal`].
//!
//! The raw calls sit behind a crate-private system-call trait, so the whole open sequence,
//! including the iommufd path, is tested against a double of the kernel.

use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use std::time::Duration;

use userdma_sys::vfio::{
    vfio_pci_hot_reset, vfio_pci_hot_reset_info, VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_SET_ACTION_MASK,
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_EVENTFD,
    VFIO_IRQ_SET_DATA_NONE, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_ERR_IRQ_INDEX,
    VFIO_PCI_HOT_RESET_FLAG_DEV_ID, VFIO_PCI_HOT_RESET_FLAG_DEV_ID_OWNED, VFIO_PCI_REQ_IRQ_INDEX,
};

use super::{config, Device, Error as DeviceError, Identity, Kind, Source};
use crate::mmio::{self, Block, FileBacked};
use crate::sync::Mutex;
use crate::{dma, irq, pci};

mod bar;
mod container;
mod error;
mod info;
mod irqs;
mod kernel;
mod open;
mod removal;
#[cfg(test)]
mod tests;

pub use self::container::Container;
pub use self::error::Error;
pub use self::info::{IrqInfo, RegionDefect, RegionInfo, SparseArea, MAX_SPARSE_AREAS};
pub use self::irqs::IrqKind;

use self::bar::Bar;
use self::container::{Group, Model};
use self::error::Error as VfioError;
use self::info::{put, read_u32};
use self::irqs::Interrupts;
use self::kernel::Kernel;
pub(crate) use self::kernel::Mmap;
pub(crate) use self::open::Host;
use self::open::{cdev_path, open_iommufd, region_info, IOMMUFD_PATH};

/// The six BARs are regions 0..=5.
const BAR_COUNT: usize = 6;

/// How to open a device. Builder-style:
/// `Options::new().dma_mask_bits(28).interrupts(IrqKind::Msi, 1)`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    dma_mask_bits: u32,
    interrupts: Option<(IrqKind, u32)>,
    allow_noiommu: bool,
    container: Option<Arc<Container>>,
    iommufd: bool,
    bus_master: bool,
    sysfs: Option<pci::Sysfs>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            dma_mask_bits: 64,
            interrupts: None,
            allow_noiommu: false,
            container: None,
            iommufd: true,
            bus_master: true,
            sysfs: None,
        }
    }
}

impl Options {
    /// The defaults: 64-bit DMA mask, no interrupts, no no-IOMMU, a container of its own,
    /// iommufd where available.
    pub fn new() -> Options {
        Options::default()
    }

    /// The device's DMA mask width (64 by default; QEMU's edu needs 28): the IOVA allocator
    /// places every mapping below it.
    pub fn dma_mask_bits(mut self, bits: u32) -> Options {
        self.dma_mask_bits = bits;
        self
    }

    /// Enables `count` vectors of `kind` at open (none by default).
    pub fn interrupts(mut self, kind: IrqKind, count: u32) -> Options {
        self.interrupts = Some((kind, count));
        self
    }

    /// Allows VFIO's no-IOMMU mode (no isolation, physical addresses); a warning is printed
    /// when it is used. Off by default.
    pub fn allow_noiommu(mut self, yes: bool) -> Options {
        self.allow_noiommu = yes;
        self
    }

    /// Attaches the device's group to `container`, shared with other devices (and their DMA
    /// space with it). Implies the container path, not iommufd.
    pub fn container(mut self, container: Arc<Container>) -> Options {
        self.container = Some(container);
        self
    }

    /// Whether to use iommufd and the device cdev when the kernel offers them (default `true`);
    /// `false` forces the container path.
    pub fn iommufd(mut self, yes: bool) -> Options {
        self.iommufd = yes;
        self
    }

    /// Whether open turns bus mastering on (default `true`; `false` for a look at the device
    /// that changes nothing, as `userdma info` does).
    pub fn bus_master(mut self, yes: bool) -> Options {
        self.bus_master = yes;
        self
    }

    /// The sysfs tree the device is looked up in (default `/sys`).
    pub fn sysfs(mut self, sysfs: pci::Sysfs) -> Options {
        self.sysfs = Some(sysfs);
        self
    }
}

/// How the device reaches its IOMMU; dropped after the device fd.
#[derive(Debug)]
enum Attachment {
    /// A group in a container.
    Group(Arc<Group>),
    /// Bound to an iommufd (the fd is kept open while the device is).
    Iommufd {
        /// Kept open while the device is bound to it.
        _iommufd: OwnedFd,
    },
}

/// A PCI function opened through VFIO. Implements [`Device`]; `Send + Sync`.
pub struct Vfio {
    bdf: pci::Bdf,
    identity: Identity,
    kernel: Arc<dyn Kernel>,
    device_flags: u32,
    regions: Vec<RegionInfo>,
    irqs: Vec<IrqInfo>,
    mode: Mode,
    interrupts: Mutex<Interrupts>,
    bars: removal::Bars,
    config: Block<FileBacked<Arc<OwnedFd>>>,
    /// Removals and error interrupts are reported through it ([`Device::events`]).
    events: Source,
    /// Watches the request and error interrupts (`removal.rs`); stopped first on drop.
    monitor: Option<removal::Monitor>,
    device: Arc<OwnedFd>,
    space: Arc<dyn dma::Space>,
    attachment: Attachment,
    /// Where host memory for the device goes ([`Device::numa_node`]).
    numa_node: Option<u32>,
}

/// How the device reaches its IOMMU ([`Vfio::mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Mode {
    /// A group in a container, with the type1 IOMMU.
    Type1,
    /// The device cdev bound to iommufd.
    Iommufd,
    /// A no-IOMMU group (no isolation, physical addresses).
    NoIommu,
}

impl fmt::Debug for Vfio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vfio")
            .field("bdf", &self.bdf)
            .field("mode", &self.mode)
            .field("device", &self.device)
            .field("regions", &self.regions.len())
            .field("irqs", &self.irqs.len())
            .field("attachment", &self.attachment)
            .finish_non_exhaustive()
    }
}

impl Vfio {
    /// Opens `bdf` (bound to `vfio-pci`) with [`Options::new`].
    pub fn open(bdf: pci::Bdf) -> Result<Vfio, DeviceError> {
        Vfio::open_with(bdf, &Options::new())
    }

    /// Opens `bdf` (bound to `vfio-pci`) with `options`.
    pub fn open_with(bdf: pci::Bdf, options: &Options) -> Result<Vfio, DeviceError> {
        let mut host = Host::system();
        if let Some(sysfs) = &options.sysfs {
            host.sysfs = sysfs.clone();
        }
        Vfio::open_in(&host, bdf, options)
    }

    /// The open sequence, against `host`.
    pub(crate) fn open_in(
        host: &Host,
        bdf: pci::Bdf,
        options: &Options,
    ) -> Result<Vfio, DeviceError> {
        let sysfs_err = |source| DeviceError::Sysfs { bdf, source };
        let info = host.sysfs.device(bdf).map_err(sysfs_err)?;
        match info.driver.as_deref() {
            None => return Err(DeviceError::NotBound { bdf }),
            Some(d) if d == pci::Driver::VfioPci.name() || d.ends_with("vfio_pci") => {}
            Some(d) => {
                return Err(DeviceError::WrongDriver {
                    bdf,
                    driver: d.to_owned(),
                })
            }
        }
        let group = info.iommu_group.clone().ok_or(VfioError::NoGroup { bdf })?;
        if group.noiommu && !options.allow_noiommu {
            return Err(VfioError::NoIommuRefused {
                bdf,
                group: group.number,
            }
            .into());
        }
        let mut culprits = Vec::new();
        for member in group.others(bdf) {
            if let Some(driver) = host.sysfs.driver(member).map_err(sysfs_err)? {
                if !pci::vfio_compatible(&driver) {
                    culprits.push((member, driver));
                }
            }
        }
        if !culprits.is_empty() {
            return Err(VfioError::GroupNotViable {
                bdf,
                group: group.number,
                culprits,
            }
            .into());
        }
        let identity = Identity {
            name: format!("{:04x}:{:04x}", info.vendor, info.device),
            kind: Kind::Vfio,
            bdf: Some(bdf),
        };
        let cdev = if options.iommufd && options.container.is_none() && !group.noiommu {
            cdev_path(host, bdf).filter(|_| host.kernel.exists(Path::new(IOMMUFD_PATH)))
        } else {
            None
        };
        let (device, space, attachment, path) = match cdev {
            Some(cdev) => open_iommufd(host, bdf, &cdev, options.dma_mask_bits)?,
            None => {
                let model = if group.noiommu {
                    eprintln!(
                        "warning: {bdf}: VFIO no-IOMMU mode: the device's DMA is neither translated nor isolated; it can reach all of memory"
                    );
                    Model::NoIommu
                } else {
                    Model::Type1v2
                };
                let container = match &options.container {
                    Some(c) => Arc::clone(c),
                    None => Container::open_in(Arc::clone(&host.kernel))?,
                };
                let (group, space) =
                    container.attach(bdf, group.number, model, options.dma_mask_bits)?;
                let device = group.device_fd(bdf)?;
                let path = match model {
                    Model::Type1v2 => Mode::Type1,
                    Model::NoIommu => Mode::NoIommu,
                };
                (device, space, Attachment::Group(group), path)
            }
        };
        let mut vfio = Vfio::from_fd(host, bdf, identity, device, space, attachment, path)?;
        vfio.numa_node = crate::memory::numa::placement(host.sysfs.root(), info.numa_node);
        vfio.start_monitor()?;
        if options.bus_master {
            vfio.set_bus_master(true)?;
        }
        if let Some((kind, count)) = options.interrupts {
            vfio.enable_interrupts(kind, count)?;
        }
        Ok(vfio)
    }

    /// Reads the device's info and builds the value.
    fn from_fd(
        host: &Host,
        bdf: pci::Bdf,
        identity: Identity,
        device: OwnedFd,
        space: Arc<dyn dma::Space>,
        attachment: Attachment,
        mode: Mode,
    ) -> Result<Vfio, DeviceError> {
        let kernel = Arc::clone(&host.kernel);
        let ioctl = |ioctl: &'static str| move |source| VfioError::Ioctl { bdf, ioctl, source };
        let info = kernel
            .device_info(device.as_fd())
            .map_err(ioctl("VFIO_DEVICE_GET_INFO"))?;
        let mut regions = Vec::new();
        for index in 0..info.num_regions.min(64) {
            regions.push(region_info(kernel.as_ref(), bdf, device.as_fd(), index)?);
        }
        let mut irqs = Vec::new();
        for index in 0..info.num_irqs.min(64) {
            match kernel.irq_info(device.as_fd(), index) {
                Ok(raw) => irqs.push(IrqInfo::from_raw(&raw)),
                // vfio-pci answers EINVAL for an index the function lacks (the error IRQ of a
                // conventional PCI function): none of it.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => irqs.push(IrqInfo {
                    index,
                    flags: 0,
                    count: 0,
                }),
                Err(source) => return Err(ioctl("VFIO_DEVICE_GET_IRQ_INFO")(source).into()),
            }
        }
        let config_region = regions
            .iter()
            .find(|r| r.index == VFIO_PCI_CONFIG_REGION_INDEX)
            .cloned()
            .ok_or(VfioError::Ioctl {
                bdf,
                ioctl: "VFIO_DEVICE_GET_REGION_INFO",
                source: std::io::Error::other("the device has no PCI config region"),
            })?;
        let config_len = usize::try_from(config_region.size).unwrap_or(0);
        let device = Arc::new(device);
        let events = Source::new(identity.to_string());
        Ok(Vfio {
            bdf,
            identity,
            kernel,
            device_flags: info.flags,
            regions,
            irqs,
            mode,
            interrupts: Mutex::new(Interrupts::default()),
            bars: Arc::new(Mutex::new((0..BAR_COUNT).map(|_| None).collect())),
            config: Block::new(FileBacked::new(
                Arc::clone(&device),
                config_region.offset,
                config_len,
            )),
            events,
            monitor: None,
            device,
            space,
            attachment,
            numa_node: None,
        })
    }

    /// Registers eventfds for the request and error interrupts the device has and starts the
    /// monitor thread over them (`removal.rs`).
    fn start_monitor(&mut self) -> Result<(), DeviceError> {
        let mut watched = [None, None];
        for (slot, index) in watched
            .iter_mut()
            .zip([VFIO_PCI_REQ_IRQ_INDEX, VFIO_PCI_ERR_IRQ_INDEX])
        {
            if !self.has_eventfd_irq(index) {
                continue;
            }
            let fd = irq::EventFd::new().map_err(|source| DeviceError::Events { source })?;
            let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
            self.set_irqs(
                VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                index,
                0,
                1,
                &raw.to_ne_bytes(),
            )?;
            *slot = Some(fd);
        }
        let [request, error] = watched;
        if request.is_none() && error.is_none() {
            return Ok(());
        }
        let cutoff = removal::Cutoff {
            bdf: self.bdf,
            device: Arc::clone(&self.device),
            config: self.config.clone(),
            bars: Arc::clone(&self.bars),
            events: self.events.clone(),
        };
        self.monitor = Some(
            removal::Monitor::start(cutoff, request, error)
                .map_err(|source| DeviceError::Events { source })?,
        );
        Ok(())
    }

    /// Whether the device watches the kernel's request interrupt: a removal is then reported
    /// ([`Device::events`]) and the device released so the kernel can finish it. Without it
    /// (a kernel or device without `VFIO_PCI_REQ_IRQ_INDEX`) the kernel waits for the process
    /// to close the device.
    pub fn watches_removal(&self) -> bool {
        self.monitor.is_some() && self.has_eventfd_irq(VFIO_PCI_REQ_IRQ_INDEX)
    }

    /// Whether the device has irq `index` with a vector that signals an eventfd.
    fn has_eventfd_irq(&self, index: u32) -> bool {
        self.irqs
            .iter()
            .any(|i| i.index == index && i.eventfd() && i.count >= 1)
    }

    /// The error of an operation on a removed device.
    fn check_present(&self) -> Result<(), DeviceError> {
        if self.events.is_removed() {
            return Err(DeviceError::Removed {
                device: self.identity.to_string(),
            });
        }
        Ok(())
    }

    /// The PCI address.
    pub fn bdf(&self) -> pci::Bdf {
        self.bdf
    }

    /// How the device reaches its IOMMU (or not).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Every region the device has, by index (`VFIO_PCI_BAR0_REGION_INDEX` ..).
    pub fn regions(&self) -> &[RegionInfo] {
        &self.regions
    }

    /// Every interrupt index the device has (`VFIO_PCI_INTX_IRQ_INDEX` ..).
    pub fn irqs(&self) -> &[IrqInfo] {
        &self.irqs
    }

    /// The IOMMU group number, on the container path.
    pub fn group(&self) -> Option<u32> {
        match &self.attachment {
            Attachment::Group(group) => Some(group.number()),
            Attachment::Iommufd { .. } => None,
        }
    }

    /// The container the device's group is attached to (to share with another device through
    /// [`Options::container`]), on the container path.
    pub fn container(&self) -> Option<Arc<Container>> {
        match &self.attachment {
            Attachment::Group(group) => Some(Arc::clone(group.container())),
            Attachment::Iommufd { .. } => None,
        }
    }

    /// `VFIO_DEVICE_FLAGS_*` of the device.
    pub fn device_flags(&self) -> u32 {
        self.device_flags
    }

    config::config_methods! {
        /// Reads a `u8`/`u16`/`u32` of configuration space at `offset`.
        fn config_read;
        /// Writes a `u8`/`u16`/`u32` of configuration space at `offset` (VFIO virtualises some
        /// fields, and drops writes it does not allow).
        fn config_write;
        /// Turns bus mastering (the device's DMA) on or off; on also turns memory decoding on.
        /// [`Vfio::open`] turns it on.
        fn set_bus_master;
    }

    /// The devices a bus reset would reset, as the kernel says (`BDF (group N)`).
    pub fn hot_reset_devices(&self) -> Result<Vec<String>, DeviceError> {
        let (_, buf, count) = self.hot_reset_info_raw()?;
        Ok(parse_hot_reset(&buf, count))
    }

    /// `VFIO_DEVICE_GET_PCI_HOT_RESET_INFO`: its flags, the reply and how many devices it
    /// lists.
    fn hot_reset_info_raw(&self) -> Result<(u32, Vec<u8>, usize), DeviceError> {
        let header = std::mem::size_of::<vfio_pci_hot_reset_info>();
        let mut room = 8usize;
        for _ in 0..4 {
            let len = header + room * 8;
            let mut buf = vec![0u8; len];
            put(
                &mut buf,
                0,
                &u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes(),
            );
            let result = self.kernel.hot_reset_info(self.device.as_fd(), &mut buf);
            let count = read_u32(&buf, 8).and_then(|c| usize::try_from(c).ok());
            match result {
                Ok(()) => {
                    let flags = read_u32(&buf, 4).unwrap_or(0);
                    let count = count.unwrap_or(0).min(room);
                    return Ok((flags, buf, count));
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                    room = count
                        .filter(|&c| c > room && c < 4096)
                        .ok_or(VfioError::Ioctl {
                            bdf: self.bdf,
                            ioctl: "VFIO_DEVICE_GET_PCI_HOT_RESET_INFO",
                            source: e,
                        })?;
                }
                Err(source) => {
                    return Err(VfioError::Ioctl {
                        bdf: self.bdf,
                        ioctl: "VFIO_DEVICE_GET_PCI_HOT_RESET_INFO",
                        source,
                    }
                    .into())
                }
            }
        }
        Ok((0, Vec::new(), 0))
    }

    /// Resets the bus the device is on (`VFIO_DEVICE_PCI_HOT_RESET`, a secondary bus reset),
    /// when this process owns every device it touches: on the container path, when they are
    /// all in this device's group (its fd proves the ownership); on the device cdev path, when
    /// the kernel says they are all owned through this iommufd. `Ok(false)` when it cannot:
    /// another group's device is on the bus, or the kernel offers no bus reset.
    pub fn hot_reset(&self) -> Result<bool, DeviceError> {
        self.check_present()?;
        let Ok((flags, buf, count)) = self.hot_reset_info_raw() else {
            return Ok(false);
        };
        if count == 0 {
            return Ok(false);
        }
        let header = std::mem::size_of::<vfio_pci_hot_reset_info>();
        let group_fds: Vec<i32> = match &self.attachment {
            Attachment::Group(group) => {
                if flags & VFIO_PCI_HOT_RESET_FLAG_DEV_ID != 0 {
                    return Ok(false);
                }
                let all_ours =
                    (0..count).all(|i| read_u32(&buf, header + i * 8) == Some(group.number()));
                if !all_ours {
                    return Ok(false);
                }
                vec![group.as_raw_fd()]
            }
            Attachment::Iommufd { .. } => {
                if flags & VFIO_PCI_HOT_RESET_FLAG_DEV_ID_OWNED == 0 {
                    return Ok(false);
                }
                Vec::new()
            }
        };
        let len = std::mem::size_of::<vfio_pci_hot_reset>() + 4 * group_fds.len();
        let mut arg = vec![0u8; len];
        put(
            &mut arg,
            0,
            &u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes(),
        );
        put(
            &mut arg,
            8,
            &u32::try_from(group_fds.len()).unwrap_or(0).to_ne_bytes(),
        );
        for (i, fd) in group_fds.iter().enumerate() {
            put(&mut arg, 12 + 4 * i, &fd.to_ne_bytes());
        }
        self.kernel
            .hot_reset(self.device.as_fd(), &arg)
            .map_err(|source| VfioError::Ioctl {
                bdf: self.bdf,
                ioctl: "VFIO_DEVICE_PCI_HOT_RESET",
                source,
            })?;
        Ok(true)
    }

    fn bar_of(&self, index: usize) -> Result<Arc<Bar>, DeviceError> {
        self.check_present()?;
        let region = (index < BAR_COUNT)
            .then(|| {
                self.regions
                    .iter()
                    .find(|r| usize::try_from(r.index).ok() == Some(index))
            })
            .flatten()
            .filter(|r| r.size > 0)
            .ok_or(DeviceError::NoBar {
                bdf: self.bdf,
                index,
            })?;
        let mut bars = self
            .bars
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(Some(bar)) = bars.get(index) {
            return Ok(Arc::clone(bar));
        }
        // Under the lock the monitor cuts the BARs off under: a BAR mapped now is cut off too.
        self.check_present()?;
        let bar = Arc::new(Bar::new(self.bdf, &self.device, region)?);
        if let Some(slot) = bars.get_mut(index) {
            *slot = Some(Arc::clone(&bar));
        }
        Ok(bar)
    }

    /// How many bytes of BAR `index` are mapped (the rest is served by `pread`/`pwrite`).
    pub fn bar_mapped_len(&self, index: usize) -> Result<usize, DeviceError> {
        Ok(self.bar_of(index)?.mapped_len())
    }
}

impl Device for Vfio {
    fn identity(&self) -> &Identity {
        &self.identity
    }

    fn numa_node(&self) -> Option<u32> {
        self.numa_node
    }

    fn bar(&self, index: usize) -> Result<mmio::DynBlock, DeviceError> {
        let bar: Arc<dyn mmio::Backend> = self.bar_of(index)?;
        Ok(Block::new(bar))
    }

    fn dma_space(&self) -> Arc<dyn dma::Space> {
        Arc::clone(&self.space)
    }

    fn vectors(&self) -> u32 {
        u32::try_from(self.lock_interrupts().vectors.len()).unwrap_or(u32::MAX)
    }

    fn interrupt(&self, vector: u32) -> Result<irq::EventFd, DeviceError> {
        let state = self.lock_interrupts();
        let count = u32::try_from(state.vectors.len()).unwrap_or(u32::MAX);
        let fd = usize::try_from(vector)
            .ok()
            .and_then(|v| state.vectors.get(v))
            .ok_or(DeviceError::NoSuchVector {
                bdf: self.bdf,
                vector,
                count,
            })?;
        fd.try_clone()
            .map_err(|source| DeviceError::Interrupt { vector, source })
    }

    fn set_masked(&self, vector: u32, masked: bool) -> Result<(), DeviceError> {
        let state = self.lock_interrupts();
        let count = u32::try_from(state.vectors.len()).unwrap_or(u32::MAX);
        let kind = state
            .kind
            .filter(|_| vector < count)
            .ok_or(DeviceError::NoSuchVector {
                bdf: self.bdf,
                vector,
                count,
            })?;
        let maskable = self
            .irqs
            .iter()
            .find(|i| i.index == kind.index())
            .is_some_and(IrqInfo::maskable);
        if !maskable {
            return Err(VfioError::NotMaskable {
                bdf: self.bdf,
                kind,
            }
            .into());
        }
        let action = if masked {
            VFIO_IRQ_SET_ACTION_MASK
        } else {
            VFIO_IRQ_SET_ACTION_UNMASK
        };
        self.set_irqs(
            VFIO_IRQ_SET_DATA_NONE | action,
            kind.index(),
            vector,
            1,
            &[],
        )
    }

    fn event_source(&self) -> Option<&Source> {
        Some(&self.events)
    }

    fn stop_queue(&self, _queue: u16, _timeout: Duration) -> Result<(), DeviceError> {
        if self.events.is_removed() {
            // Bus mastering went off before the removal was reported.
            return Ok(());
        }
        self.reset()
    }

    fn reset(&self) -> Result<(), DeviceError> {
        self.check_present()?;
        if self.device_flags & VFIO_DEVICE_FLAGS_RESET == 0 {
            // No function reset: a bus reset, if this process owns everything on the bus.
            if self.hot_reset()? {
                return self.set_bus_master(true);
            }
            let affected = self.hot_reset_devices().unwrap_or_default();
            return Err(DeviceError::NoReset {
                bdf: self.bdf,
                affected,
            });
        }
        self.kernel
            .reset(self.device.as_fd())
            .map_err(|source| VfioError::Ioctl {
                bdf: self.bdf,
                ioctl: "VFIO_DEVICE_RESET",
                source,
            })?;
        self.set_bus_master(true)
    }
}

impl Drop for Vfio {
    fn drop(&mut self) {
        // Interrupts first, while the device fd is open; the rest goes in field order: BAR maps
        // (those no block still holds), the config block and the device fd, the DMA space
        // reference, then the group (detached from its container) or the iommufd. The monitor
        // goes before all of it (it may be cutting the device off).
        drop(self.monitor.take());
        if !self.events.is_removed() {
            let _ = self.disable_interrupts();
        }
    }
}

/// The devices of a `VFIO_DEVICE_GET_PCI_HOT_RESET_INFO` reply, as `dddd:bb:dd.f (group N)`.
pub(crate) fn parse_hot_reset(buf: &[u8], count: usize) -> Vec<String> {
    let header = std::mem::size_of::<vfio_pci_hot_reset_info>();
    (0..count)
        .map_while(|i| {
            let at = header.checked_add(i.checked_mul(8)?)?;
            let group = read_u32(buf, at)?;
            let segment = u16::from_ne_bytes(buf.get(at + 4..at + 6)?.try_into().ok()?);
            let bus = *buf.get(at + 6)?;
            let devfn = *buf.get(at + 7)?;
            Some(format!(
                "{segment:04x}:{bus:02x}:{:02x}.{} (group {group})",
                devfn >> 3,
                devfn & 7
            ))
        })
        .collect()
}
