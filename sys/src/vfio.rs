//! VFIO (`<linux/vfio.h>`): the container/group API with the type1 IOMMU, the device API, and the
//! device cdev API that binds a device to iommufd.
//!
//! Structs and constant values are re-exported from `vfio-bindings` (bindgen output of the kernel
//! header, Linux 7.2). Ioctl numbers are computed here: every VFIO ioctl is `_IO(VFIO_TYPE,
//! VFIO_BASE + n)`, with the struct's length in its own `argsz` field instead of the number, which
//! is how VFIO structs grow without new ioctl numbers: the kernel reads the first `argsz` bytes it
//! knows and ignores the rest of a longer struct as long as no new flag asks for it.
//!
//! Three ways in, with the fds they open:
//!
//! * **container + group** (any kernel): [`VFIO_CONTAINER_PATH`] gives a container fd
//!   ([`VFIO_GET_API_VERSION`], [`VFIO_CHECK_EXTENSION`], [`VFIO_SET_IOMMU`] with
//!   [`VFIO_TYPE1v2_IOMMU`] or [`VFIO_NOIOMMU_IOMMU`], then [`VFIO_IOMMU_GET_INFO`],
//!   [`VFIO_IOMMU_MAP_DMA`], [`VFIO_IOMMU_UNMAP_DMA`]); `/dev/vfio/<group>` gives a group fd
//!   ([`VFIO_GROUP_GET_STATUS`], [`VFIO_GROUP_SET_CONTAINER`], [`VFIO_GROUP_GET_DEVICE_FD`] with
//!   the device's PCI address as a NUL-terminated string).
//! * **device cdev + iommufd** (Linux 6.6): `/dev/vfio/devices/vfioN` is the device fd itself;
//!   [`VFIO_DEVICE_BIND_IOMMUFD`] binds it to an fd of `/dev/iommu` and
//!   [`VFIO_DEVICE_ATTACH_IOMMUFD_PT`] attaches it to an IO address space made with
//!   [`crate::iommufd`].
//! * **the device fd** (both ways): [`VFIO_DEVICE_GET_INFO`], [`VFIO_DEVICE_GET_REGION_INFO`] (then
//!   `pread`/`pwrite`/`mmap` at the region's `offset`), [`VFIO_DEVICE_GET_IRQ_INFO`],
//!   [`VFIO_DEVICE_SET_IRQS`] (eventfds for INTx/MSI/MSI-X), [`VFIO_DEVICE_RESET`].
//!
//! Info structs ([`vfio_device_info`], [`vfio_region_info`], [`vfio_iommu_type1_info`]) may be
//! followed by a capability chain: when the `*_CAPS` flag is set, `cap_offset` is the byte offset
//! (from the start of the info struct) of the first [`vfio_info_cap_header`], whose `next` is the
//! offset of the next one, 0 ending the chain. If the buffer was too small the kernel sets `argsz`
//! to the size it needs and the call is repeated with a larger buffer.

use crate::ioctl::{io, Ioctl};

pub use vfio_bindings::bindings::vfio::{
    vfio_device_attach_iommufd_pt, vfio_device_bind_iommufd, vfio_device_detach_iommufd_pt,
    vfio_device_info, vfio_group_status, vfio_info_cap_header, vfio_iommu_type1_dma_map,
    vfio_iommu_type1_dma_unmap, vfio_iommu_type1_info, vfio_iommu_type1_info_cap_iova_range,
    vfio_iommu_type1_info_dma_avail, vfio_iova_range, vfio_irq_info, vfio_irq_set,
    vfio_pci_dependent_device, vfio_pci_hot_reset, vfio_pci_hot_reset_info, vfio_region_info,
    vfio_region_info_cap_sparse_mmap, vfio_region_info_cap_type, vfio_region_sparse_mmap_area,
};

// API version, ioctl type/base and IOMMU types (VFIO_CHECK_EXTENSION / VFIO_SET_IOMMU arguments).
pub use vfio_bindings::bindings::vfio::{
    VFIO_TYPE1v2_IOMMU, VFIO_API_VERSION, VFIO_BASE, VFIO_DMA_CC_IOMMU, VFIO_NOIOMMU_IOMMU,
    VFIO_TYPE, VFIO_TYPE1_IOMMU, VFIO_UNMAP_ALL,
};

// vfio_group_status.flags
pub use vfio_bindings::bindings::vfio::{VFIO_GROUP_FLAGS_CONTAINER_SET, VFIO_GROUP_FLAGS_VIABLE};

// vfio_device_info.flags
pub use vfio_bindings::bindings::vfio::{
    VFIO_DEVICE_FLAGS_CAPS, VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET,
};

// vfio_region_info.flags and region capability ids
pub use vfio_bindings::bindings::vfio::{
    VFIO_REGION_INFO_CAP_MSIX_MAPPABLE, VFIO_REGION_INFO_CAP_SPARSE_MMAP,
    VFIO_REGION_INFO_CAP_TYPE, VFIO_REGION_INFO_FLAG_CAPS, VFIO_REGION_INFO_FLAG_MMAP,
    VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};

// vfio_irq_info.flags and vfio_irq_set.flags
pub use vfio_bindings::bindings::vfio::{
    VFIO_IRQ_INFO_AUTOMASKED, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE,
    VFIO_IRQ_INFO_NORESIZE, VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_ACTION_TYPE_MASK, VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_BOOL,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_IRQ_SET_DATA_TYPE_MASK,
};

// vfio-pci region and irq indexes
pub use vfio_bindings::bindings::vfio::{
    VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_BAR1_REGION_INDEX, VFIO_PCI_BAR2_REGION_INDEX,
    VFIO_PCI_BAR3_REGION_INDEX, VFIO_PCI_BAR4_REGION_INDEX, VFIO_PCI_BAR5_REGION_INDEX,
    VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_ERR_IRQ_INDEX, VFIO_PCI_INTX_IRQ_INDEX,
    VFIO_PCI_MSIX_IRQ_INDEX, VFIO_PCI_MSI_IRQ_INDEX, VFIO_PCI_NUM_IRQS, VFIO_PCI_NUM_REGIONS,
    VFIO_PCI_REQ_IRQ_INDEX, VFIO_PCI_ROM_REGION_INDEX, VFIO_PCI_VGA_REGION_INDEX,
};

// Hot reset with device cdev ids (Linux 6.6).
pub use vfio_bindings::bindings::vfio::{
    VFIO_PCI_DEVID_NOT_OWNED, VFIO_PCI_DEVID_OWNED, VFIO_PCI_HOT_RESET_FLAG_DEV_ID,
    VFIO_PCI_HOT_RESET_FLAG_DEV_ID_OWNED,
};

// vfio_iommu_type1_info.flags, its capability ids, and DMA map/unmap flags.
pub use vfio_bindings::bindings::vfio::{
    VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE, VFIO_DMA_UNMAP_FLAG_ALL, VFIO_IOMMU_INFO_CAPS,
    VFIO_IOMMU_INFO_PGSIZES, VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE, VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL,
};

// Device cdev flags: VF token on bind (Linux 6.17), PASID attach/detach (Linux 6.15).
pub use vfio_bindings::bindings::vfio::{
    VFIO_DEVICE_ATTACH_PASID, VFIO_DEVICE_BIND_FLAG_TOKEN, VFIO_DEVICE_DETACH_PASID,
};

/// The command number of a VFIO ioctl: `_IO(VFIO_TYPE, VFIO_BASE + n)`.
const fn vfio_io(n: u8) -> Ioctl {
    assert!(
        VFIO_BASE + (n as u32) <= u8::MAX as u32,
        "VFIO command number overflows a byte"
    );
    io(VFIO_TYPE, VFIO_BASE as u8 + n)
}

// ---- container ----

/// Container: returns [`VFIO_API_VERSION`].
pub const VFIO_GET_API_VERSION: Ioctl = vfio_io(0);
/// Container: returns 1 if the IOMMU type (or extension) given by value is supported, else 0.
pub const VFIO_CHECK_EXTENSION: Ioctl = vfio_io(1);
/// Container: selects the IOMMU type given by value, once at least one group is attached.
pub const VFIO_SET_IOMMU: Ioctl = vfio_io(2);
/// Container: fills a [`vfio_iommu_type1_info`] (page sizes, capability chain).
pub const VFIO_IOMMU_GET_INFO: Ioctl = vfio_io(12);
/// Container: maps user memory at an IOVA, from a [`vfio_iommu_type1_dma_map`].
pub const VFIO_IOMMU_MAP_DMA: Ioctl = vfio_io(13);
/// Container: unmaps an IOVA range, from a [`vfio_iommu_type1_dma_unmap`] (the kernel writes back
/// the size unmapped).
pub const VFIO_IOMMU_UNMAP_DMA: Ioctl = vfio_io(14);

// ---- group ----

/// Group: fills a [`vfio_group_status`].
pub const VFIO_GROUP_GET_STATUS: Ioctl = vfio_io(3);
/// Group: attaches the group to the container whose fd is passed by pointer to an `i32`.
pub const VFIO_GROUP_SET_CONTAINER: Ioctl = vfio_io(4);
/// Group: detaches the group from its container.
pub const VFIO_GROUP_UNSET_CONTAINER: Ioctl = vfio_io(5);
/// Group: returns a new device fd for the device named by a NUL-terminated string
/// (`"0000:01:00.0"`).
pub const VFIO_GROUP_GET_DEVICE_FD: Ioctl = vfio_io(6);

// ---- device ----

/// Device: fills a [`vfio_device_info`] (flags, region and irq counts).
pub const VFIO_DEVICE_GET_INFO: Ioctl = vfio_io(7);
/// Device: fills a [`vfio_region_info`] for `index` (size, offset in the device fd, flags, caps).
pub const VFIO_DEVICE_GET_REGION_INFO: Ioctl = vfio_io(8);
/// Device: fills a [`vfio_irq_info`] for `index` (vector count, flags).
pub const VFIO_DEVICE_GET_IRQ_INFO: Ioctl = vfio_io(9);
/// Device: sets eventfds / masks / triggers for a range of vectors, from a [`vfio_irq_set`]
/// followed by its data (`i32` fds for [`VFIO_IRQ_SET_DATA_EVENTFD`]).
pub const VFIO_DEVICE_SET_IRQS: Ioctl = vfio_io(10);
/// Device: function-level (or other) reset, if [`VFIO_DEVICE_FLAGS_RESET`] is set.
pub const VFIO_DEVICE_RESET: Ioctl = vfio_io(11);
/// Device: fills a [`vfio_pci_hot_reset_info`] followed by the devices a bus reset would affect.
pub const VFIO_DEVICE_GET_PCI_HOT_RESET_INFO: Ioctl = vfio_io(12);
/// Device: resets the bus, from a [`vfio_pci_hot_reset`] followed by the group fds that own every
/// affected device.
pub const VFIO_DEVICE_PCI_HOT_RESET: Ioctl = vfio_io(13);

// ---- device cdev + iommufd (Linux 6.6) ----

/// Device cdev: binds the device fd to an iommufd, from a [`vfio_device_bind_iommufd`] (the kernel
/// writes `out_devid`). Linux 6.6.
pub const VFIO_DEVICE_BIND_IOMMUFD: Ioctl = vfio_io(18);
/// Device cdev: attaches the bound device to an IO address space or page table (`pt_id`), from a
/// [`vfio_device_attach_iommufd_pt`]. Linux 6.6.
pub const VFIO_DEVICE_ATTACH_IOMMUFD_PT: Ioctl = vfio_io(19);
/// Device cdev: detaches the device from its page table, from a
/// [`vfio_device_detach_iommufd_pt`]. Linux 6.6.
pub const VFIO_DEVICE_DETACH_IOMMUFD_PT: Ioctl = vfio_io(20);

// ---- device nodes, sysfs and driver names (path ABI; no header defines these) ----

/// The container node; each open gives a new, empty container.
pub const VFIO_CONTAINER_PATH: &str = "/dev/vfio/vfio";
/// Directory of the group nodes: `/dev/vfio/<group number>`.
pub const VFIO_GROUP_DIR: &str = "/dev/vfio";
/// Prefix of a group node in no-IOMMU mode: `/dev/vfio/noiommu-<group number>`.
pub const VFIO_NOIOMMU_GROUP_PREFIX: &str = "noiommu-";
/// Directory of the device cdev nodes: `/dev/vfio/devices/vfio<N>` (Linux 6.6).
pub const VFIO_DEVICES_DIR: &str = "/dev/vfio/devices";
/// Directory under a PCI device's sysfs node whose single entry `vfio<N>` names its device cdev.
pub const VFIO_SYSFS_DEV_DIR: &str = "vfio-dev";
/// The vfio-pci driver's name (for `driver_override` and `/sys/bus/pci/drivers/`).
pub const VFIO_PCI_DRIVER: &str = "vfio-pci";
/// Module parameter that allows [`VFIO_NOIOMMU_IOMMU`] containers (`Y`/`N`; root only, taints).
pub const VFIO_NOIOMMU_PARAM: &str = "/sys/module/vfio/parameters/enable_unsafe_noiommu_mode";

// ---- layout proof (x86_64 / every LP64 target) ----

assert_layout! {
    vfio_info_cap_header { size: 8, align: 4 }
    fields { id: 0, version: 2, next: 4 }
}
assert_layout! {
    vfio_group_status { size: 8, align: 4 }
    fields { argsz: 0, flags: 4 }
}
assert_layout! {
    vfio_device_info { size: 24, align: 4 }
    fields { argsz: 0, flags: 4, num_regions: 8, num_irqs: 12, cap_offset: 16, pad: 20 }
}
assert_layout! {
    vfio_region_info { size: 32, align: 8 }
    fields { argsz: 0, flags: 4, index: 8, cap_offset: 12, size: 16, offset: 24 }
}
assert_layout! {
    vfio_region_sparse_mmap_area { size: 16, align: 8 }
    fields { offset: 0, size: 8 }
}
assert_layout! {
    vfio_region_info_cap_sparse_mmap { size: 16, align: 8 }
    fields { header: 0, nr_areas: 8, reserved: 12, areas: 16 }
}
assert_layout! {
    vfio_region_info_cap_type { size: 16, align: 4 }
    fields { header: 0, type_: 8, subtype: 12 }
}
assert_layout! {
    vfio_irq_info { size: 16, align: 4 }
    fields { argsz: 0, flags: 4, index: 8, count: 12 }
}
assert_layout! {
    vfio_irq_set { size: 20, align: 4 }
    fields { argsz: 0, flags: 4, index: 8, start: 12, count: 16, data: 20 }
}
assert_layout! {
    vfio_pci_dependent_device { size: 8, align: 4 }
    fields { __bindgen_anon_1: 0, segment: 4, bus: 6, devfn: 7 }
    nested { __bindgen_anon_1.group_id: 0, __bindgen_anon_1.devid: 0 }
}
const _: () = assert!(
    ::core::mem::size_of::<vfio_bindings::bindings::vfio::vfio_pci_dependent_device__bindgen_ty_1>(
    ) == 4,
    "the union of vfio_pci_dependent_device is not 4 bytes",
);
assert_layout! {
    vfio_pci_hot_reset_info { size: 12, align: 4 }
    fields { argsz: 0, flags: 4, count: 8, devices: 12 }
}
assert_layout! {
    vfio_pci_hot_reset { size: 12, align: 4 }
    fields { argsz: 0, flags: 4, count: 8, group_fds: 12 }
}
assert_layout! {
    vfio_iommu_type1_info { size: 24, align: 8 }
    fields { argsz: 0, flags: 4, iova_pgsizes: 8, cap_offset: 16, pad: 20 }
}
assert_layout! {
    vfio_iova_range { size: 16, align: 8 }
    fields { start: 0, end: 8 }
}
assert_layout! {
    vfio_iommu_type1_info_cap_iova_range { size: 16, align: 8 }
    fields { header: 0, nr_iovas: 8, reserved: 12, iova_ranges: 16 }
}
assert_layout! {
    vfio_iommu_type1_info_dma_avail { size: 12, align: 4 }
    fields { header: 0, avail: 8 }
}
assert_layout! {
    vfio_iommu_type1_dma_map { size: 32, align: 8 }
    fields { argsz: 0, flags: 4, vaddr: 8, iova: 16, size: 24 }
}
assert_layout! {
    vfio_iommu_type1_dma_unmap { size: 24, align: 8 }
    fields { argsz: 0, flags: 4, iova: 8, size: 16, data: 24 }
}
assert_layout! {
    vfio_device_bind_iommufd { size: 24, align: 8 }
    fields { argsz: 0, flags: 4, iommufd: 8, out_devid: 12, token_uuid_ptr: 16 }
}
assert_layout! {
    vfio_device_attach_iommufd_pt { size: 16, align: 4 }
    fields { argsz: 0, flags: 4, pt_id: 8, pasid: 12 }
}
assert_layout! {
    vfio_device_detach_iommufd_pt { size: 12, align: 4 }
    fields { argsz: 0, flags: 4, pasid: 8 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_are_io_semicolon_base_plus_n() {
        // Values as <linux/vfio.h> expands them: _IO(';', 100 + n) = 0x3B00 | (100 + n).
        assert_eq!(VFIO_GET_API_VERSION, 0x3B64);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3B71);
        assert_eq!(VFIO_IOMMU_UNMAP_DMA, 0x3B72);
        assert_eq!(VFIO_DEVICE_BIND_IOMMUFD, 0x3B76);
        assert_eq!(VFIO_DEVICE_DETACH_IOMMUFD_PT, 0x3B78);
        // Two pairs share a number; the fd type tells them apart.
        assert_eq!(VFIO_IOMMU_GET_INFO, VFIO_DEVICE_GET_PCI_HOT_RESET_INFO);
        assert_eq!(VFIO_IOMMU_MAP_DMA, VFIO_DEVICE_PCI_HOT_RESET);
    }
}
