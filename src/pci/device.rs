//! What sysfs says about one PCI function: identity, driver, IOMMU group, NUMA node, BARs and
//! capabilities.

use super::{Bdf, Capabilities, DmaPath, Iommu, IommuGroup, Resource, ResourceKind};

/// A snapshot of one PCI function's sysfs directory, as read by
/// [`Sysfs::device`](super::Sysfs::device).
///
/// Fields the kernel always provides (`vendor`, `device`, `class`, `resource`) are plain values;
/// fields that depend on the kernel's configuration or the reader's privileges are `Option`s
/// (`None` = the attribute is absent), and the capability list says how much of it could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The function's address.
    pub bdf: Bdf,
    /// Vendor ID (sysfs `vendor`).
    pub vendor: u16,
    /// Device ID (sysfs `device`).
    pub device: u16,
    /// Subsystem vendor ID (sysfs `subsystem_vendor`).
    pub subsystem_vendor: Option<u16>,
    /// Subsystem device ID (sysfs `subsystem_device`).
    pub subsystem_device: Option<u16>,
    /// The 24-bit class code: base class, subclass, programming interface (sysfs `class`).
    pub class: u32,
    /// Revision ID (sysfs `revision`).
    pub revision: Option<u8>,
    /// Name of the bound driver (the `driver` symlink), `None` when unbound.
    pub driver: Option<String>,
    /// The driver the next probe must use (sysfs `driver_override`), `None` when unset.
    pub driver_override: Option<String>,
    /// The IOMMU group and its members (the `iommu_group` symlink), `None` when the function is
    /// in no group (no IOMMU, or no IOMMU translates it).
    pub iommu_group: Option<IommuGroup>,
    /// NUMA node (sysfs `numa_node`), `None` for `-1` (no affinity) or when absent.
    pub numa_node: Option<u32>,
    /// The used lines of sysfs `resource` (size > 0), in file order.
    pub resources: Vec<Resource>,
    /// Header type from configuration space (0 device, 1 PCI bridge, 2 CardBus bridge), when
    /// readable.
    pub header_type: Option<u8>,
    /// Legacy interrupt pin from configuration space (0 none, 1..=4 INTA#..INTD#), when readable.
    pub interrupt_pin: Option<u8>,
    /// The capability list from configuration space.
    pub capabilities: Capabilities,
}

impl DeviceInfo {
    /// The BARs and the expansion ROM that have an address range.
    pub fn bars(&self) -> impl Iterator<Item = &Resource> {
        self.resources
            .iter()
            .filter(|r| matches!(r.kind(), ResourceKind::Bar(_) | ResourceKind::Rom))
    }

    /// The base class byte (e.g. `0x02` network controller).
    pub fn base_class(&self) -> u8 {
        self.class.to_le_bytes()[2]
    }

    /// The subclass byte.
    pub fn subclass(&self) -> u8 {
        self.class.to_le_bytes()[1]
    }

    /// Whether the function is a bridge (header type 1 or 2, or, when configuration space was
    /// not readable, a PCI-to-PCI or CardBus bridge class). Bridges are never handed to user space.
    pub fn is_bridge(&self) -> bool {
        match self.header_type {
            Some(t) => t != 0,
            None => self.base_class() == 0x06 && matches!(self.subclass(), 0x04 | 0x07 | 0x09),
        }
    }

    /// Whether the function has a legacy interrupt pin (INTx), which `uio_pci_generic` needs to
    /// deliver interrupts; `None` when configuration space was not readable.
    pub fn has_intx(&self) -> Option<bool> {
        self.interrupt_pin.map(|pin| pin != 0)
    }

    /// The user-space DMA access paths this function supports on a system with `iommu`; see
    /// [`DmaPath`] for the rules.
    pub fn dma_paths(&self, iommu: &Iommu) -> Vec<DmaPath> {
        DmaPath::available(self, iommu)
    }
}
