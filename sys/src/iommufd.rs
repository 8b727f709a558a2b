//! iommufd (`<linux/iommufd.h>`, Linux 6.2): IO address spaces on `/dev/iommu`.
//!
//! An iommufd holds objects named by `u32` ids. [`IOMMU_IOAS_ALLOC`] creates an IO address space
//! (IOAS); a VFIO device cdev bound to the iommufd ([`crate::vfio::VFIO_DEVICE_BIND_IOMMUFD`]) is
//! attached to it ([`crate::vfio::VFIO_DEVICE_ATTACH_IOMMUFD_PT`]); [`IOMMU_IOAS_MAP`] pins user
//! memory and maps it at an IOVA (chosen by the kernel, or fixed with
//! [`IOMMU_IOAS_MAP_FIXED_IOVA`]); [`IOMMU_IOAS_IOVA_RANGES`] says which IOVAs the attached devices
//! can reach; [`IOMMU_DESTROY`] frees an object.
//!
//! Structs and enum values come from `iommufd-bindings` (bindgen output of the kernel header, Linux
//! 7.1). The crate names enum members `<enum>_<member>`; this module gives them back their kernel
//! names. Ioctl numbers are computed here: every iommufd ioctl is `_IO(IOMMUFD_TYPE,
//! IOMMUFD_CMD_*)`, and each struct starts with its own `size`, which lets structs grow the same
//! way VFIO's `argsz` does.

use crate::ioctl::{io, Ioctl};

pub use iommufd_bindings::{
    iommu_destroy, iommu_ioas_alloc, iommu_ioas_iova_ranges, iommu_ioas_map, iommu_ioas_map_file,
    iommu_ioas_unmap, iommu_iova_range, iommu_option,
};

pub use iommufd_bindings::{
    IOMMUFD_CMD_DESTROY, IOMMUFD_CMD_IOAS_ALLOC, IOMMUFD_CMD_IOAS_IOVA_RANGES,
    IOMMUFD_CMD_IOAS_MAP, IOMMUFD_CMD_IOAS_MAP_FILE, IOMMUFD_CMD_IOAS_UNMAP, IOMMUFD_CMD_OPTION,
    IOMMUFD_TYPE,
};

/// The iommufd device node.
pub const IOMMUFD_PATH: &str = "/dev/iommu";

/// The command number of an iommufd ioctl: `_IO(IOMMUFD_TYPE, cmd)`.
const fn iommufd_io(cmd: u32) -> Ioctl {
    assert!(
        cmd <= u8::MAX as u32,
        "iommufd command number overflows a byte"
    );
    io(IOMMUFD_TYPE, cmd as u8)
}

/// Destroys any destroyable object by id, from an [`iommu_destroy`].
pub const IOMMU_DESTROY: Ioctl = iommufd_io(IOMMUFD_CMD_DESTROY);
/// Allocates an IO address space, from an [`iommu_ioas_alloc`] (the kernel writes `out_ioas_id`).
pub const IOMMU_IOAS_ALLOC: Ioctl = iommufd_io(IOMMUFD_CMD_IOAS_ALLOC);
/// Reports the IOVA ranges an IOAS may map, into the [`iommu_iova_range`] array an
/// [`iommu_ioas_iova_ranges`] points to (`EMSGSIZE` and the needed `num_iovas` if the array is
/// short).
pub const IOMMU_IOAS_IOVA_RANGES: Ioctl = iommufd_io(IOMMUFD_CMD_IOAS_IOVA_RANGES);
/// Pins user memory and maps it into an IOAS, from an [`iommu_ioas_map`] (the kernel writes `iova`
/// unless [`IOMMU_IOAS_MAP_FIXED_IOVA`] is set).
pub const IOMMU_IOAS_MAP: Ioctl = iommufd_io(IOMMUFD_CMD_IOAS_MAP);
/// Maps a range of a file into an IOAS by file descriptor instead of address, from an
/// [`iommu_ioas_map_file`] (Linux 6.13: memfds, shmem and hugetlbfs; Linux 6.19 adds dma-bufs
/// whose exporter supports it, VFIO's MMIO dma-bufs). Flags as [`IOMMU_IOAS_MAP`]'s.
pub const IOMMU_IOAS_MAP_FILE: Ioctl = iommufd_io(IOMMUFD_CMD_IOAS_MAP_FILE);
/// Unmaps an IOVA range of an IOAS, from an [`iommu_ioas_unmap`] (the kernel writes back the length
/// unmapped).
pub const IOMMU_IOAS_UNMAP: Ioctl = iommufd_io(IOMMUFD_CMD_IOAS_UNMAP);
/// Sets or gets an option of the iommufd or of an object, from an [`iommu_option`].
pub const IOMMU_OPTION: Ioctl = iommufd_io(IOMMUFD_CMD_OPTION);

/// `iommu_ioas_map.flags`: map at the given `iova` instead of letting the kernel choose.
pub const IOMMU_IOAS_MAP_FIXED_IOVA: u32 =
    iommufd_bindings::iommufd_ioas_map_flags_IOMMU_IOAS_MAP_FIXED_IOVA;
/// `iommu_ioas_map.flags`: the device may write the memory.
pub const IOMMU_IOAS_MAP_WRITEABLE: u32 =
    iommufd_bindings::iommufd_ioas_map_flags_IOMMU_IOAS_MAP_WRITEABLE;
/// `iommu_ioas_map.flags`: the device may read the memory.
pub const IOMMU_IOAS_MAP_READABLE: u32 =
    iommufd_bindings::iommufd_ioas_map_flags_IOMMU_IOAS_MAP_READABLE;

/// `iommu_option.option_id`: how pinned pages count against `RLIMIT_MEMLOCK` (0: per user, 1: per
/// process; setting it needs `CAP_SYS_RESOURCE`). Object id 0.
pub const IOMMU_OPTION_RLIMIT_MODE: u32 = iommufd_bindings::iommufd_option_IOMMU_OPTION_RLIMIT_MODE;
/// `iommu_option.option_id`: whether an IOAS may use huge IOMMU pages (1, the default) or must map
/// every page separately (0). Object id: the IOAS.
pub const IOMMU_OPTION_HUGE_PAGES: u32 = iommufd_bindings::iommufd_option_IOMMU_OPTION_HUGE_PAGES;
/// `iommu_option.op`: set the option to `val64`.
pub const IOMMU_OPTION_OP_SET: u16 =
    option_op(iommufd_bindings::iommufd_option_ops_IOMMU_OPTION_OP_SET);
/// `iommu_option.op`: read the option into `val64`.
pub const IOMMU_OPTION_OP_GET: u16 =
    option_op(iommufd_bindings::iommufd_option_ops_IOMMU_OPTION_OP_GET);

/// `iommu_option.op` is a `u16`; the enum is a `u32`.
const fn option_op(op: u32) -> u16 {
    assert!(op <= u16::MAX as u32, "iommu_option op overflows u16");
    op as u16
}

// ---- layout proof ----

assert_layout! {
    iommu_destroy { size: 8, align: 4 }
    fields { size: 0, id: 4 }
}
assert_layout! {
    iommu_ioas_alloc { size: 12, align: 4 }
    fields { size: 0, flags: 4, out_ioas_id: 8 }
}
assert_layout! {
    iommu_iova_range { size: 16, align: 8 }
    fields { start: 0, last: 8 }
}
assert_layout! {
    iommu_ioas_iova_ranges { size: 32, align: 8 }
    fields {
        size: 0, ioas_id: 4, num_iovas: 8, __reserved: 12, allowed_iovas: 16, out_iova_alignment: 24,
    }
}
assert_layout! {
    iommu_ioas_map { size: 40, align: 8 }
    fields { size: 0, flags: 4, ioas_id: 8, __reserved: 12, user_va: 16, length: 24, iova: 32 }
}
assert_layout! {
    iommu_ioas_map_file { size: 40, align: 8 }
    fields { size: 0, flags: 4, ioas_id: 8, fd: 12, start: 16, length: 24, iova: 32 }
}
assert_layout! {
    iommu_ioas_unmap { size: 24, align: 8 }
    fields { size: 0, ioas_id: 4, iova: 8, length: 16 }
}
assert_layout! {
    iommu_option { size: 24, align: 8 }
    fields { size: 0, option_id: 4, op: 8, __reserved: 10, object_id: 12, val64: 16 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_are_io_semicolon_cmd() {
        // Values as <linux/iommufd.h> expands them: _IO(';', 0x80 + n).
        assert_eq!(IOMMU_DESTROY, 0x3B80);
        assert_eq!(IOMMU_IOAS_ALLOC, 0x3B81);
        assert_eq!(IOMMU_IOAS_IOVA_RANGES, 0x3B84);
        assert_eq!(IOMMU_IOAS_MAP, 0x3B85);
        assert_eq!(IOMMU_IOAS_UNMAP, 0x3B86);
        assert_eq!(IOMMU_OPTION, 0x3B87);
    }
}
