//! [`Options`]: how a [`Vfio`](super::Vfio) device is opened — its DMA mask, the interrupts
//! enabled at open, no-IOMMU, a shared container or iommufd, bus mastering, the sysfs tree.

use std::sync::Arc;

use super::{Container, IrqKind};
use crate::pci;

/// How to open a device. Builder-style:
/// `Options::new().dma_mask_bits(28).interrupts(IrqKind::Msi, 1)`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    pub(super) dma_mask_bits: u32,
    pub(super) interrupts: Option<(IrqKind, u32)>,
    pub(super) allow_noiommu: bool,
    pub(super) container: Option<Arc<Container>>,
    pub(super) iommufd: bool,
    pub(super) bus_master: bool,
    pub(super) sysfs: Option<pci::Sysfs>,
    pub(super) dma_alignment: usize,
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
            dma_alignment: crate::pool::DEFAULT_DMA_ALIGNMENT,
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

    /// The alignment, in bytes, the device needs of a DMA buffer's start (a power of two; a
    /// base page, 4096, by default): what the opened device says as
    /// [`Device::dma_alignment`](crate::device::Device::dma_alignment), and so how
    /// [`Runtime::pool`](crate::Runtime::pool) lays its pools out (at most 256: cache-coloured
    /// classes, faster; more: size-aligned classes). State the device's own: QEMU's edu
    /// takes any byte address, an NVMe controller's PRPs need 4096.
    pub fn dma_alignment(mut self, bytes: usize) -> Options {
        self.dma_alignment = bytes;
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
