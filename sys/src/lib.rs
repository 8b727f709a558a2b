//! Kernel ABI for userdma: structs, computed ioctl numbers and constants. No logic.
//!
//! Everything here is the Linux user-space ABI exactly as the kernel defines it, under the kernel's own
//! names (`VFIO_IOMMU_MAP_DMA`, `vfio_region_info`, `PCI_COMMAND_MASTER`), grouped by the interface it
//! belongs to. The safe layer lives in the `userdma` crate; this crate only says what the bytes are.
//!
//! | module | interface | kernel source of truth |
//! |---|---|---|
//! | [`ioctl`] | the `_IOC` ioctl number encoding (`_IO`, `_IOR`, `_IOW`, `_IOWR`) as `const fn`s | `<asm-generic/ioctl.h>` |
//! | [`vfio`] | VFIO container/group + type1 IOMMU, device, device cdev + iommufd | `<linux/vfio.h>` |
//! | [`iommufd`] | `/dev/iommu`: IO address spaces, map/unmap, IOVA ranges | `<linux/iommufd.h>` |
//! | [`uio`] | UIO device nodes, sysfs class, interrupt enable/count protocol | `drivers/uio/uio.c` |
//! | [`pci`] | PCI configuration space registers, sysfs `resource` flags | `<linux/pci_regs.h>`, `include/linux/ioport.h` |
//! | [`mman`] | hugetlb `mmap`/`memfd_create` flags, `mbind` policies, pagemap entries, hugepage sysfs | `<linux/mman.h>`, `<linux/memfd.h>`, `<linux/mempolicy.h>` |
//! | [`dmabuf`] | dma-buf sync and naming, udmabuf (memfd ranges as dma-bufs), dma-heap allocation | `<linux/dma-buf.h>`, `<linux/udmabuf.h>`, `<linux/dma-heap.h>` |
//! | [`membarrier`] | process-wide memory barriers (asymmetric fences) | `<linux/membarrier.h>` |
//!
//! # How the ABI is proven
//!
//! * Structs come from the bindgen-generated `vfio-bindings` and `iommufd-bindings` crates. Every struct
//!   this crate exposes has compile-time assertions (`const` `assert!`s naming the struct and field) on
//!   its size, alignment and the offset of every field, and a destructuring check that no field was left out of the list.
//! * Ioctl numbers are never literals: each one is computed by [`ioctl`] from the kernel's
//!   `(type, number)` pair (and `size_of::<T>()` where the kernel encodes a size).
//! * The integration test `tests/kernel_abi.rs` compiles a C program against real kernel uapi headers
//!   (the system's `linux-libc-dev` and the newer sets `scripts/uapi-headers.sh` fetches), which prints
//!   every constant, ioctl number, struct size and field offset; the test compares each one with the
//!   value this crate has and fails on any difference.
//!
//! Each item newer than Linux 6.1 (the oldest uapi this crate is checked against) names the kernel
//! release that introduced it; using it on an older kernel fails with the kernel's error (`ENOTTY`,
//! `EINVAL`), which the safe layer reports.

/// Compile-time layout proof of a `#[repr(C)]` struct: size, alignment, the offset of every field,
/// and a destructuring pattern that fails to compile if the list misses a field.
///
/// `nested { a.b: off }` adds offsets of fields inside anonymous unions (not part of the pattern).
macro_rules! assert_layout {
    (
        $ty:ident { size: $size:expr, align: $align:expr $(,)? }
        fields { $($field:ident : $off:expr),+ $(,)? }
        $(nested { $($($path:ident).+ : $noff:expr),+ $(,)? })?
    ) => {
        const _: () = assert!(
            ::core::mem::size_of::<$ty>() == $size,
            concat!("the size of ", stringify!($ty), " is not ", stringify!($size)),
        );
        const _: () = assert!(
            ::core::mem::align_of::<$ty>() == $align,
            concat!("the alignment of ", stringify!($ty), " is not ", stringify!($align)),
        );
        $(const _: () = assert!(
            ::core::mem::offset_of!($ty, $field) == $off,
            concat!(stringify!($ty), ".", stringify!($field), " is not at offset ", stringify!($off)),
        );)+
        $($(const _: () = assert!(
            ::core::mem::offset_of!($ty, $($path).+) == $noff,
            concat!(stringify!($ty), ".", stringify!($($path).+), " is not at offset ", stringify!($noff)),
        );)+)?
        const _: () = {
            // Fails to compile if `$ty` has a field the list above does not name.
            fn _every_field_listed(value: &$ty) {
                let $ty { $($field: _),+ } = value;
            }
        };
    };
}

pub mod dmabuf;
pub mod ioctl;
pub mod iommufd;
pub mod membarrier;
pub mod mman;
pub mod pci;
pub mod uio;
pub mod vfio;
