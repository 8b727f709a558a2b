//! The DMA-mapping ioctls (through `nix`'s ioctl macros): one `unsafe fn` per ioctl, errno turned into `io::Error` right
//! here, and the kernel-backed implementations of [`Type1Ioctl`] and [`IommufdIoctl`] over them.
//! Nothing above this file touches a raw fd or a kernel struct.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use userdma_sys::iommufd::{
    iommu_destroy, iommu_ioas_alloc, iommu_ioas_iova_ranges, iommu_ioas_map, iommu_ioas_map_file,
    iommu_ioas_unmap, iommu_iova_range, IOMMU_IOAS_MAP_FIXED_IOVA, IOMMU_IOAS_MAP_READABLE,
    IOMMU_IOAS_MAP_WRITEABLE,
};
use userdma_sys::vfio::{
    vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, vfio_iommu_type1_info,
    VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE,
};

use super::iommufd::IommufdIoctl;
use super::iova::IovaRange;
use super::type1::Type1Ioctl;
use super::Access;

/// The ioctls, as `nix` generates them: each takes the raw fd and a pointer to its argument and
/// turns `-1` into the errno. The request numbers are `userdma_sys`'s, which its ABI tests check
/// against the kernel headers (VFIO and iommufd encode no size in them: `_IO(type, nr)`, whence
/// nix's `_bad` form).
mod raw {
    use userdma_sys::iommufd::{
        iommu_destroy, iommu_ioas_alloc, iommu_ioas_iova_ranges, iommu_ioas_map,
        iommu_ioas_map_file, iommu_ioas_unmap, IOMMU_DESTROY, IOMMU_IOAS_ALLOC,
        IOMMU_IOAS_IOVA_RANGES, IOMMU_IOAS_MAP, IOMMU_IOAS_MAP_FILE, IOMMU_IOAS_UNMAP,
    };
    use userdma_sys::vfio::{
        vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, VFIO_IOMMU_GET_INFO,
        VFIO_IOMMU_MAP_DMA, VFIO_IOMMU_UNMAP_DMA,
    };

    nix::ioctl_readwrite_bad!(vfio_iommu_get_info, VFIO_IOMMU_GET_INFO, u8);
    nix::ioctl_readwrite_bad!(
        vfio_iommu_map_dma,
        VFIO_IOMMU_MAP_DMA,
        vfio_iommu_type1_dma_map
    );
    nix::ioctl_readwrite_bad!(
        vfio_iommu_unmap_dma,
        VFIO_IOMMU_UNMAP_DMA,
        vfio_iommu_type1_dma_unmap
    );
    nix::ioctl_readwrite_bad!(iommu_ioas_alloc, IOMMU_IOAS_ALLOC, iommu_ioas_alloc);
    nix::ioctl_readwrite_bad!(
        iommu_ioas_iova_ranges,
        IOMMU_IOAS_IOVA_RANGES,
        iommu_ioas_iova_ranges
    );
    nix::ioctl_readwrite_bad!(iommu_ioas_map, IOMMU_IOAS_MAP, iommu_ioas_map);
    nix::ioctl_readwrite_bad!(
        iommu_ioas_map_file,
        IOMMU_IOAS_MAP_FILE,
        iommu_ioas_map_file
    );
    nix::ioctl_readwrite_bad!(iommu_ioas_unmap, IOMMU_IOAS_UNMAP, iommu_ioas_unmap);
    nix::ioctl_readwrite_bad!(iommu_destroy, IOMMU_DESTROY, iommu_destroy);
}

/// `IOMMU_IOAS_MAP_READABLE` / `_WRITEABLE` as `access` says.
fn map_flags(access: Access) -> u32 {
    let read = if access.device_reads() {
        IOMMU_IOAS_MAP_READABLE
    } else {
        0
    };
    let write = if access.device_writes() {
        IOMMU_IOAS_MAP_WRITEABLE
    } else {
        0
    };
    read | write
}

/// A `nix` ioctl result as this module's.
fn done(result: nix::Result<libc::c_int>) -> io::Result<()> {
    result.map(drop).map_err(io::Error::from)
}

/// `struct` sizes as the `u32` the kernel's `argsz`/`size` fields hold (all are a few dozen
/// bytes, so the conversion cannot truncate).
const fn size_u32<T>() -> u32 {
    size_of::<T>() as u32
}

/// `VFIO_IOMMU_GET_INFO` into `buf`, which starts with a `vfio_iommu_type1_info` whose `argsz`
/// the caller set.
///
/// # Safety
/// The `argsz` in `buf` must not exceed `buf.len()`: the kernel writes up to `argsz` bytes.
pub(crate) unsafe fn vfio_iommu_get_info(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()> {
    // SAFETY: the kernel reads `argsz` and writes at most that many bytes, which the caller
    // bounds by `buf.len()`.
    done(unsafe { raw::vfio_iommu_get_info(fd.as_raw_fd(), buf.as_mut_ptr()) })
}

/// `VFIO_IOMMU_MAP_DMA`.
///
/// # Safety
/// `map.vaddr..+map.size` must be memory that stays mapped in this process until it is
/// DMA-unmapped, and that nothing in the process holds a Rust reference to: the device writes it.
pub(crate) unsafe fn vfio_iommu_map_dma(
    fd: BorrowedFd<'_>,
    map: &mut vfio_iommu_type1_dma_map,
) -> io::Result<()> {
    // SAFETY: `map` is a complete, initialised struct whose argsz is its size; the caller vouches
    // for the memory it describes.
    done(unsafe { raw::vfio_iommu_map_dma(fd.as_raw_fd(), map) })
}

/// `VFIO_IOMMU_UNMAP_DMA`; the kernel writes the bytes unmapped back into `unmap.size`.
///
/// # Safety
/// Unmapping cuts the device off from memory, which is always memory-safe for this process; the
/// caller must only make sure no DMA it still relies on targets the range.
pub(crate) unsafe fn vfio_iommu_unmap_dma(
    fd: BorrowedFd<'_>,
    unmap: &mut vfio_iommu_type1_dma_unmap,
) -> io::Result<()> {
    // SAFETY: `unmap` is a complete struct whose argsz is its size (no dirty bitmap follows).
    done(unsafe { raw::vfio_iommu_unmap_dma(fd.as_raw_fd(), unmap) })
}

/// `IOMMU_IOAS_ALLOC`.
///
/// # Safety
/// None beyond the call itself (`alloc` is a complete struct); `unsafe` for uniformity with the
/// other ioctls of this file.
pub(crate) unsafe fn iommu_ioas_alloc(
    fd: BorrowedFd<'_>,
    alloc: &mut iommu_ioas_alloc,
) -> io::Result<()> {
    // SAFETY: `alloc` is a complete struct whose size field is its size.
    done(unsafe { raw::iommu_ioas_alloc(fd.as_raw_fd(), alloc) })
}

/// `IOMMU_IOAS_IOVA_RANGES`.
///
/// # Safety
/// `ranges.allowed_iovas` must point to `ranges.num_iovas` writable `iommu_iova_range`s.
pub(crate) unsafe fn iommu_ioas_iova_ranges(
    fd: BorrowedFd<'_>,
    ranges: &mut iommu_ioas_iova_ranges,
) -> io::Result<()> {
    // SAFETY: the caller vouches for the output array; the struct is complete.
    done(unsafe { raw::iommu_ioas_iova_ranges(fd.as_raw_fd(), ranges) })
}

/// `IOMMU_IOAS_MAP`.
///
/// # Safety
/// As [`vfio_iommu_map_dma`]: `map.user_va..+map.length` stays mapped until unmapped and is
/// never referenced.
pub(crate) unsafe fn iommu_ioas_map(
    fd: BorrowedFd<'_>,
    map: &mut iommu_ioas_map,
) -> io::Result<()> {
    // SAFETY: `map` is a complete struct; the caller vouches for the memory.
    done(unsafe { raw::iommu_ioas_map(fd.as_raw_fd(), map) })
}

/// `IOMMU_IOAS_MAP_FILE` (Linux 6.13).
///
/// # Safety
/// `map.fd` names a file whose `map.start..+map.length` stays allocated until the range is
/// unmapped (the kernel holds the file; the caller keeps the mapping's owner alive).
pub(crate) unsafe fn iommu_ioas_map_file(
    fd: BorrowedFd<'_>,
    map: &mut iommu_ioas_map_file,
) -> io::Result<()> {
    // SAFETY: `map` is a complete struct; the kernel reads the file, not user memory.
    done(unsafe { raw::iommu_ioas_map_file(fd.as_raw_fd(), map) })
}

/// `IOMMU_IOAS_UNMAP`; the kernel writes the bytes unmapped back into `unmap.length`.
///
/// # Safety
/// As [`vfio_iommu_unmap_dma`].
pub(crate) unsafe fn iommu_ioas_unmap(
    fd: BorrowedFd<'_>,
    unmap: &mut iommu_ioas_unmap,
) -> io::Result<()> {
    // SAFETY: `unmap` is a complete struct whose size field is its size.
    done(unsafe { raw::iommu_ioas_unmap(fd.as_raw_fd(), unmap) })
}

/// `IOMMU_DESTROY`.
///
/// # Safety
/// Destroying an IOAS that still has mappings the process relies on cuts the device off from
/// them; the caller destroys only what it owns.
pub(crate) unsafe fn iommu_destroy(
    fd: BorrowedFd<'_>,
    destroy: &mut iommu_destroy,
) -> io::Result<()> {
    // SAFETY: `destroy` is a complete struct whose size field is its size.
    done(unsafe { raw::iommu_destroy(fd.as_raw_fd(), destroy) })
}

/// A VFIO type1 container, driven through the real ioctls.
#[derive(Debug)]
pub(crate) struct KernelType1 {
    container: OwnedFd,
}

impl KernelType1 {
    pub(crate) fn new(container: OwnedFd) -> KernelType1 {
        KernelType1 { container }
    }
}

impl Type1Ioctl for KernelType1 {
    fn get_info(&self, buf: &mut [u8]) -> io::Result<()> {
        let argsz = buf
            .get(..4)
            .and_then(|bytes| bytes.try_into().ok())
            .map(u32::from_ne_bytes)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let fits = usize::try_from(argsz).is_ok_and(|argsz| argsz <= buf.len());
        if !fits || buf.len() < size_of::<vfio_iommu_type1_info>() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: argsz was just checked against the buffer's length.
        unsafe { vfio_iommu_get_info(self.container.as_fd(), buf) }
    }

    fn map_dma(&self, vaddr: u64, iova: u64, size: u64) -> io::Result<()> {
        self.map_dma_with(vaddr, iova, size, Access::ReadWrite)
    }

    fn map_dma_with(&self, vaddr: u64, iova: u64, size: u64, access: Access) -> io::Result<()> {
        let read = if access.device_reads() {
            VFIO_DMA_MAP_FLAG_READ
        } else {
            0
        };
        let write = if access.device_writes() {
            VFIO_DMA_MAP_FLAG_WRITE
        } else {
            0
        };
        let mut map = vfio_iommu_type1_dma_map {
            argsz: size_u32::<vfio_iommu_type1_dma_map>(),
            flags: read | write,
            vaddr,
            iova,
            size,
        };
        // SAFETY: this type is crate-private and `dma::iommu::Core` is its only caller, which
        // passes the memory of a region that the resulting `Mapping` keeps alive (and that hands
        // out no references) until this range is unmapped.
        unsafe { vfio_iommu_map_dma(self.container.as_fd(), &mut map) }
    }

    fn unmap_dma(&self, iova: u64, size: u64) -> io::Result<u64> {
        let mut unmap = vfio_iommu_type1_dma_unmap {
            argsz: size_u32::<vfio_iommu_type1_dma_unmap>(),
            flags: 0,
            iova,
            size,
            ..Default::default()
        };
        // SAFETY: unmapping is memory-safe for the process; `Core` unmaps only its own ranges.
        unsafe { vfio_iommu_unmap_dma(self.container.as_fd(), &mut unmap) }?;
        Ok(unmap.size)
    }
}

/// An iommufd, driven through the real ioctls.
#[derive(Debug)]
pub(crate) struct KernelIommufd {
    iommufd: OwnedFd,
}

impl KernelIommufd {
    pub(crate) fn new(iommufd: OwnedFd) -> KernelIommufd {
        KernelIommufd { iommufd }
    }
}

impl IommufdIoctl for KernelIommufd {
    fn ioas_alloc(&self) -> io::Result<u32> {
        let mut alloc = iommu_ioas_alloc {
            size: size_u32::<iommu_ioas_alloc>(),
            ..Default::default()
        };
        // SAFETY: a complete struct.
        unsafe { iommu_ioas_alloc(self.iommufd.as_fd(), &mut alloc) }?;
        Ok(alloc.out_ioas_id)
    }

    fn ioas_iova_ranges(&self, ioas: u32, out: &mut [IovaRange]) -> io::Result<(usize, u64)> {
        let mut raw = vec![iommu_iova_range::default(); out.len()];
        let mut query = iommu_ioas_iova_ranges {
            size: size_u32::<iommu_ioas_iova_ranges>(),
            ioas_id: ioas,
            num_iovas: u32::try_from(raw.len()).unwrap_or(u32::MAX),
            allowed_iovas: raw.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `allowed_iovas` points to `raw`, which holds at least `num_iovas` entries and
        // outlives the call.
        let result = unsafe { iommu_ioas_iova_ranges(self.iommufd.as_fd(), &mut query) };
        match result {
            // EMSGSIZE: the array was short; num_iovas now says how many there are.
            Err(err) if err.raw_os_error() != Some(libc::EMSGSIZE) => return Err(err),
            _ => {}
        }
        for (dst, src) in out.iter_mut().zip(&raw) {
            *dst = IovaRange {
                start: src.start,
                last: src.last,
            };
        }
        let total = usize::try_from(query.num_iovas).unwrap_or(usize::MAX);
        Ok((total, query.out_iova_alignment))
    }

    fn ioas_map(&self, ioas: u32, vaddr: u64, iova: u64, len: u64) -> io::Result<()> {
        self.ioas_map_with(ioas, vaddr, iova, len, Access::ReadWrite)
    }

    fn ioas_map_with(
        &self,
        ioas: u32,
        vaddr: u64,
        iova: u64,
        len: u64,
        access: Access,
    ) -> io::Result<()> {
        let mut map = iommu_ioas_map {
            size: size_u32::<iommu_ioas_map>(),
            flags: IOMMU_IOAS_MAP_FIXED_IOVA | map_flags(access),
            ioas_id: ioas,
            user_va: vaddr,
            length: len,
            iova,
            ..Default::default()
        };
        // SAFETY: as in `KernelType1::map_dma`: only `dma::iommu::Core` calls this, with a
        // region's memory that its `Mapping` keeps alive until the range is unmapped.
        unsafe { iommu_ioas_map(self.iommufd.as_fd(), &mut map) }
    }

    fn ioas_map_file(
        &self,
        ioas: u32,
        file: BorrowedFd<'_>,
        start: u64,
        iova: u64,
        len: u64,
        access: Access,
    ) -> io::Result<()> {
        let mut map = iommu_ioas_map_file {
            size: size_u32::<iommu_ioas_map_file>(),
            flags: IOMMU_IOAS_MAP_FIXED_IOVA | map_flags(access),
            ioas_id: ioas,
            fd: file.as_raw_fd(),
            start,
            length: len,
            iova,
        };
        // SAFETY: only `dma::iommu::Core` calls this, for a region whose `Mapping` keeps the
        // file open (the region holds it) until the range is unmapped.
        unsafe { iommu_ioas_map_file(self.iommufd.as_fd(), &mut map) }
    }

    fn ioas_unmap(&self, ioas: u32, iova: u64, len: u64) -> io::Result<u64> {
        let mut unmap = iommu_ioas_unmap {
            size: size_u32::<iommu_ioas_unmap>(),
            ioas_id: ioas,
            iova,
            length: len,
        };
        // SAFETY: unmapping is memory-safe for the process; `Core` unmaps only its own ranges.
        unsafe { iommu_ioas_unmap(self.iommufd.as_fd(), &mut unmap) }?;
        Ok(unmap.length)
    }

    fn destroy(&self, id: u32) -> io::Result<()> {
        let mut destroy = iommu_destroy {
            size: size_u32::<iommu_destroy>(),
            id,
        };
        // SAFETY: only the space that allocated the IOAS destroys it, after its last mapping.
        unsafe { iommu_destroy(self.iommufd.as_fd(), &mut destroy) }
    }

    fn fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.iommufd.as_fd())
    }
}
