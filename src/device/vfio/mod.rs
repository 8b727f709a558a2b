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
use std::sync::Arc;

use std::time::Duration;

use userdma_sys::vfio::{
    VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
    VFIO_PCI_ERR_IRQ_INDEX, VFIO_PCI_REQ_IRQ_INDEX,
};

use super::{config, Device, Error as DeviceError, Identity, Source};
use crate::mmio::{self, Block, FileBacked};
use crate::sync::Mutex;
use crate::{dma, irq, pci};

mod bar;
mod container;
mod error;
mod hot_reset;
mod info;
mod irqs;
mod kernel;
mod open;
mod options;
mod removal;
#[cfg(test)]
mod tests;

pub use self::container::Container;
pub use self::error::Error;
pub use self::info::{IrqInfo, RegionDefect, RegionInfo, SparseArea, MAX_SPARSE_AREAS};
pub use self::irqs::IrqKind;
pub use self::options::Options;

use self::bar::Bar;
use self::container::Group;
use self::error::Error as VfioError;
use self::irqs::Interrupts;
use self::kernel::Kernel;
pub(crate) use self::kernel::Mmap;

/// The six BARs are regions 0..=5.
const BAR_COUNT: usize = 6;

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
    /// What its opener said ([`Options::dma_alignment`], [`Device::dma_alignment`]).
    dma_alignment: usize,
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

    fn dma_alignment(&self) -> usize {
        self.dma_alignment
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
                #[cfg(feature = "tracing")]
                tracing::info!(device = %self.identity, reset = "bus", "device reset");
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
        #[cfg(feature = "tracing")]
        tracing::info!(device = %self.identity, reset = "function", "device reset");
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
