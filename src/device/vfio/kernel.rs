//! The raw VFIO calls the device backend makes: one `unsafe fn` per ioctl, errno turned into
//! `io::Error` right there, behind the crate-private [`Kernel`] trait so that the open sequence
//! and every failure path can be driven by a test double (the iommufd path in particular, which
//! kernels built without `CONFIG_IOMMUFD` cannot exercise).
//!
//! File descriptors stay real: the double hands out descriptors of ordinary files (so `pread`,
//! `pwrite` and `mmap` of a "device" work on them) and fakes only the ioctls.

use std::ffi::CStr;
use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use userdma_sys::vfio::{
    vfio_device_attach_iommufd_pt, vfio_device_bind_iommufd, vfio_device_info, vfio_group_status,
    vfio_irq_info,
};

use crate::dma;

/// The VFIO system calls of the device backend. [`Live`] makes them; tests implement a double.
pub(crate) trait Kernel: Send + Sync + fmt::Debug {
    /// Opens a device node read-write, close-on-exec.
    fn open(&self, path: &Path) -> io::Result<OwnedFd>;

    /// Whether a device node exists.
    fn exists(&self, path: &Path) -> bool;

    /// `VFIO_GET_API_VERSION` on a container.
    fn api_version(&self, container: BorrowedFd<'_>) -> io::Result<i32>;

    /// `VFIO_CHECK_EXTENSION`: whether the container offers IOMMU model `model`.
    fn check_extension(&self, container: BorrowedFd<'_>, model: u32) -> io::Result<bool>;

    /// `VFIO_SET_IOMMU`.
    fn set_iommu(&self, container: BorrowedFd<'_>, model: u32) -> io::Result<()>;

    /// `VFIO_GROUP_GET_STATUS`: the group's flags.
    fn group_status(&self, group: BorrowedFd<'_>) -> io::Result<u32>;

    /// `VFIO_GROUP_SET_CONTAINER`.
    fn group_set_container(
        &self,
        group: BorrowedFd<'_>,
        container: BorrowedFd<'_>,
    ) -> io::Result<()>;

    /// `VFIO_GROUP_UNSET_CONTAINER`.
    fn group_unset_container(&self, group: BorrowedFd<'_>) -> io::Result<()>;

    /// `VFIO_GROUP_GET_DEVICE_FD` for the device named `name` (`"0000:00:03.0"`).
    fn group_device_fd(&self, group: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd>;

    /// `VFIO_DEVICE_GET_INFO`.
    fn device_info(&self, device: BorrowedFd<'_>) -> io::Result<vfio_device_info>;

    /// `VFIO_DEVICE_GET_REGION_INFO` into `buf`, which starts with a `vfio_region_info` whose
    /// `argsz` (at most `buf.len()`) and `index` the caller set. Like the kernel: if the
    /// capabilities do not fit, `argsz` comes back larger.
    fn region_info(&self, device: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()>;

    /// `VFIO_DEVICE_GET_IRQ_INFO` for `index`.
    fn irq_info(&self, device: BorrowedFd<'_>, index: u32) -> io::Result<vfio_irq_info>;

    /// `VFIO_DEVICE_SET_IRQS` with `buf`: a `vfio_irq_set` and its data, `argsz` = `buf.len()`.
    fn set_irqs(&self, device: BorrowedFd<'_>, buf: &[u8]) -> io::Result<()>;

    /// `VFIO_DEVICE_RESET`.
    fn reset(&self, device: BorrowedFd<'_>) -> io::Result<()>;

    /// `VFIO_DEVICE_GET_PCI_HOT_RESET_INFO` into `buf` (a `vfio_pci_hot_reset_info` whose
    /// `argsz` the caller set, then room for the devices); `ENOSPC` with `count` set when the
    /// devices do not fit.
    fn hot_reset_info(&self, device: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()>;

    /// `VFIO_DEVICE_PCI_HOT_RESET` from `buf`: a `vfio_pci_hot_reset` (argsz, flags, count)
    /// followed by `count` group fds that own every device the bus reset touches (none on the
    /// device cdev path, where the kernel checks ownership through the iommufd).
    fn hot_reset(&self, device: BorrowedFd<'_>, buf: &[u8]) -> io::Result<()>;

    /// `VFIO_DEVICE_BIND_IOMMUFD`: returns the device id.
    fn bind_iommufd(&self, device: BorrowedFd<'_>, iommufd: BorrowedFd<'_>) -> io::Result<u32>;

    /// `VFIO_DEVICE_ATTACH_IOMMUFD_PT` to IOAS (or page table) `pt_id`.
    fn attach_pt(&self, device: BorrowedFd<'_>, pt_id: u32) -> io::Result<()>;

    /// The DMA space of a configured container (`VFIO_SET_IOMMU` done). `container` is
    /// borrowed: the space works on a duplicate.
    fn type1_space(
        &self,
        container: BorrowedFd<'_>,
        mask_bits: u32,
    ) -> Result<dma::Type1, SpaceError>;

    /// A new IOAS on the iommufd `iommufd` (the space owns it).
    fn iommufd_space(&self, iommufd: OwnedFd, mask_bits: u32) -> Result<dma::Iommufd, SpaceError>;
}

/// Why a DMA space could not be made: duplicating the fd, or the space itself.
#[derive(Debug)]
pub(crate) enum SpaceError {
    /// `dup` of the container failed.
    Dup(io::Error),
    /// The space refused.
    Space(dma::Error),
}

/// The kernel itself.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Live;

/// The ioctls, as `nix` generates them: each takes the raw fd and its argument (a value, or a
/// pointer to what the request expects) and turns a negative return into the errno. The
/// request numbers are `userdma_sys`'s, which its ABI tests check against the kernel headers
/// (VFIO encodes no size in them: `_IO(';', nr)`, whence nix's `_bad` forms).
mod raw {
    use userdma_sys::vfio::{
        vfio_device_attach_iommufd_pt, vfio_device_bind_iommufd, vfio_device_info,
        vfio_group_status, vfio_irq_info, VFIO_CHECK_EXTENSION, VFIO_DEVICE_ATTACH_IOMMUFD_PT,
        VFIO_DEVICE_BIND_IOMMUFD, VFIO_DEVICE_GET_INFO, VFIO_DEVICE_GET_IRQ_INFO,
        VFIO_DEVICE_GET_PCI_HOT_RESET_INFO, VFIO_DEVICE_GET_REGION_INFO, VFIO_DEVICE_PCI_HOT_RESET,
        VFIO_DEVICE_RESET, VFIO_DEVICE_SET_IRQS, VFIO_GET_API_VERSION, VFIO_GROUP_GET_DEVICE_FD,
        VFIO_GROUP_GET_STATUS, VFIO_GROUP_SET_CONTAINER, VFIO_GROUP_UNSET_CONTAINER,
        VFIO_SET_IOMMU,
    };

    nix::ioctl_none_bad!(get_api_version, VFIO_GET_API_VERSION);
    nix::ioctl_write_int_bad!(check_extension, VFIO_CHECK_EXTENSION);
    nix::ioctl_write_int_bad!(set_iommu, VFIO_SET_IOMMU);
    nix::ioctl_readwrite_bad!(group_get_status, VFIO_GROUP_GET_STATUS, vfio_group_status);
    nix::ioctl_write_ptr_bad!(group_set_container, VFIO_GROUP_SET_CONTAINER, libc::c_int);
    nix::ioctl_none_bad!(group_unset_container, VFIO_GROUP_UNSET_CONTAINER);
    nix::ioctl_write_ptr_bad!(group_get_device_fd, VFIO_GROUP_GET_DEVICE_FD, libc::c_char);
    nix::ioctl_readwrite_bad!(device_get_info, VFIO_DEVICE_GET_INFO, vfio_device_info);
    nix::ioctl_readwrite_bad!(device_get_region_info, VFIO_DEVICE_GET_REGION_INFO, u8);
    nix::ioctl_readwrite_bad!(device_get_irq_info, VFIO_DEVICE_GET_IRQ_INFO, vfio_irq_info);
    nix::ioctl_write_ptr_bad!(device_set_irqs, VFIO_DEVICE_SET_IRQS, u8);
    nix::ioctl_none_bad!(device_reset, VFIO_DEVICE_RESET);
    nix::ioctl_write_ptr_bad!(device_pci_hot_reset, VFIO_DEVICE_PCI_HOT_RESET, u8);
    nix::ioctl_readwrite_bad!(
        device_get_pci_hot_reset_info,
        VFIO_DEVICE_GET_PCI_HOT_RESET_INFO,
        u8
    );
    nix::ioctl_readwrite_bad!(
        device_bind_iommufd,
        VFIO_DEVICE_BIND_IOMMUFD,
        vfio_device_bind_iommufd
    );
    nix::ioctl_readwrite_bad!(
        device_attach_iommufd_pt,
        VFIO_DEVICE_ATTACH_IOMMUFD_PT,
        vfio_device_attach_iommufd_pt
    );
}

/// A `nix` ioctl result as this module's: the kernel's non-negative return, or the errno.
fn done(result: nix::Result<libc::c_int>) -> io::Result<i32> {
    result.map_err(io::Error::from)
}

/// `size_of::<T>()` as the `u32` VFIO's `argsz` holds (the structs are a few dozen bytes).
fn argsz<T>() -> u32 {
    u32::try_from(size_of::<T>()).unwrap_or(u32::MAX)
}

/// A by-value ioctl argument as the `int` nix passes (VFIO's models and extensions are small).
fn int(value: u32) -> io::Result<libc::c_int> {
    libc::c_int::try_from(value).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The `argsz` at the start of `buf`, checked not to exceed `buf.len()` (the kernel writes up
/// to `argsz` bytes).
fn checked_argsz(buf: &[u8], min: usize) -> io::Result<()> {
    let argsz = buf
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let fits = usize::try_from(argsz).is_ok_and(|a| a <= buf.len() && a >= min);
    if fits {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }
}

impl Kernel for Live {
    fn open(&self, path: &Path) -> io::Result<OwnedFd> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        Ok(file.into())
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn api_version(&self, container: BorrowedFd<'_>) -> io::Result<i32> {
        // SAFETY: VFIO_GET_API_VERSION takes no argument.
        done(unsafe { raw::get_api_version(container.as_raw_fd()) })
    }

    fn check_extension(&self, container: BorrowedFd<'_>, model: u32) -> io::Result<bool> {
        // SAFETY: VFIO_CHECK_EXTENSION takes the extension by value.
        let ret = done(unsafe { raw::check_extension(container.as_raw_fd(), int(model)?) })?;
        Ok(ret > 0)
    }

    fn set_iommu(&self, container: BorrowedFd<'_>, model: u32) -> io::Result<()> {
        // SAFETY: VFIO_SET_IOMMU takes the model by value.
        done(unsafe { raw::set_iommu(container.as_raw_fd(), int(model)?) }).map(drop)
    }

    fn group_status(&self, group: BorrowedFd<'_>) -> io::Result<u32> {
        let mut status = vfio_group_status {
            argsz: argsz::<vfio_group_status>(),
            flags: 0,
        };
        // SAFETY: the kernel writes a vfio_group_status of `argsz` bytes into `status`, which
        // lives across the call.
        done(unsafe { raw::group_get_status(group.as_raw_fd(), &mut status) })?;
        Ok(status.flags)
    }

    fn group_set_container(
        &self,
        group: BorrowedFd<'_>,
        container: BorrowedFd<'_>,
    ) -> io::Result<()> {
        let fd: libc::c_int = container.as_raw_fd();
        // SAFETY: the kernel reads one int (the container fd) through the pointer; `fd` lives
        // across the call and the container stays open (borrowed).
        done(unsafe { raw::group_set_container(group.as_raw_fd(), &fd) }).map(drop)
    }

    fn group_unset_container(&self, group: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: VFIO_GROUP_UNSET_CONTAINER takes no argument.
        done(unsafe { raw::group_unset_container(group.as_raw_fd()) }).map(drop)
    }

    fn group_device_fd(&self, group: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
        // SAFETY: the kernel reads a NUL-terminated string through the pointer; `name` lives
        // across the call.
        let fd = done(unsafe { raw::group_get_device_fd(group.as_raw_fd(), name.as_ptr()) })?;
        // SAFETY: on success the ioctl returned a new fd that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn device_info(&self, device: BorrowedFd<'_>) -> io::Result<vfio_device_info> {
        let mut info = vfio_device_info {
            argsz: argsz::<vfio_device_info>(),
            ..Default::default()
        };
        // SAFETY: the kernel writes at most `argsz` bytes of a vfio_device_info into `info`,
        // which is one and lives across the call (capabilities that do not fit are not written).
        done(unsafe { raw::device_get_info(device.as_raw_fd(), &mut info) })?;
        Ok(info)
    }

    fn region_info(&self, device: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()> {
        checked_argsz(buf, size_of::<userdma_sys::vfio::vfio_region_info>())?;
        // SAFETY: the kernel writes at most `argsz` bytes, just checked against `buf.len()`;
        // `buf` lives across the call.
        done(unsafe { raw::device_get_region_info(device.as_raw_fd(), buf.as_mut_ptr()) }).map(drop)
    }

    fn irq_info(&self, device: BorrowedFd<'_>, index: u32) -> io::Result<vfio_irq_info> {
        let mut info = vfio_irq_info {
            argsz: argsz::<vfio_irq_info>(),
            index,
            ..Default::default()
        };
        // SAFETY: the kernel reads and writes one vfio_irq_info in `info`, alive across the call.
        done(unsafe { raw::device_get_irq_info(device.as_raw_fd(), &mut info) })?;
        Ok(info)
    }

    fn set_irqs(&self, device: BorrowedFd<'_>, buf: &[u8]) -> io::Result<()> {
        checked_argsz(buf, size_of::<userdma_sys::vfio::vfio_irq_set>())?;
        // SAFETY: the kernel only reads `argsz` bytes (checked against `buf.len()`) of a
        // vfio_irq_set and its data; `buf` lives across the call. The eventfds in the data are
        // open (the caller holds them).
        done(unsafe { raw::device_set_irqs(device.as_raw_fd(), buf.as_ptr()) }).map(drop)
    }

    fn reset(&self, device: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: VFIO_DEVICE_RESET takes no argument.
        done(unsafe { raw::device_reset(device.as_raw_fd()) }).map(drop)
    }

    fn hot_reset(&self, device: BorrowedFd<'_>, buf: &[u8]) -> io::Result<()> {
        checked_argsz(buf, size_of::<userdma_sys::vfio::vfio_pci_hot_reset>())?;
        // SAFETY: the kernel reads `argsz` bytes (checked against `buf.len()`) and writes none.
        done(unsafe { raw::device_pci_hot_reset(device.as_raw_fd(), buf.as_ptr()) }).map(drop)
    }

    fn hot_reset_info(&self, device: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()> {
        checked_argsz(buf, size_of::<userdma_sys::vfio::vfio_pci_hot_reset_info>())?;
        // SAFETY: the kernel writes at most `argsz` bytes (checked against `buf.len()`).
        done(unsafe { raw::device_get_pci_hot_reset_info(device.as_raw_fd(), buf.as_mut_ptr()) })
            .map(drop)
    }

    fn bind_iommufd(&self, device: BorrowedFd<'_>, iommufd: BorrowedFd<'_>) -> io::Result<u32> {
        let mut bind = vfio_device_bind_iommufd {
            argsz: argsz::<vfio_device_bind_iommufd>(),
            flags: 0,
            iommufd: iommufd.as_raw_fd(),
            out_devid: 0,
            token_uuid_ptr: 0,
        };
        // SAFETY: the kernel reads the struct and writes `out_devid`; `bind` lives across the
        // call and the iommufd stays open (borrowed). No token: `token_uuid_ptr` is unused.
        done(unsafe { raw::device_bind_iommufd(device.as_raw_fd(), &mut bind) })?;
        Ok(bind.out_devid)
    }

    fn attach_pt(&self, device: BorrowedFd<'_>, pt_id: u32) -> io::Result<()> {
        let mut attach = vfio_device_attach_iommufd_pt {
            argsz: argsz::<vfio_device_attach_iommufd_pt>(),
            flags: 0,
            pt_id,
            pasid: 0,
        };
        // SAFETY: the kernel reads the struct and may write `pt_id` back; it lives across the
        // call.
        done(unsafe { raw::device_attach_iommufd_pt(device.as_raw_fd(), &mut attach) }).map(drop)
    }

    fn type1_space(
        &self,
        container: BorrowedFd<'_>,
        mask_bits: u32,
    ) -> Result<dma::Type1, SpaceError> {
        let fd = container.try_clone_to_owned().map_err(SpaceError::Dup)?;
        dma::Type1::new(fd, mask_bits).map_err(SpaceError::Space)
    }

    fn iommufd_space(&self, iommufd: OwnedFd, mask_bits: u32) -> Result<dma::Iommufd, SpaceError> {
        dma::Iommufd::new(iommufd, mask_bits).map_err(SpaceError::Space)
    }
}

/// `mmap` of `len` bytes of `fd` at `offset`, shared and read-write, unmapped on drop
/// (`memmap2::MmapRaw`, which never hands out a reference to the mapped bytes). Only ever
/// touched through raw pointers (the volatile accesses of [`crate::mmio::Direct`]).
#[derive(Debug)]
pub(crate) struct Mmap {
    map: memmap2::MmapRaw,
    /// `map`'s first byte.
    ptr: std::ptr::NonNull<u8>,
}

// SAFETY: as `MmapRaw` (Send): the pointer is `map`'s own, handed out raw only.
unsafe impl Send for Mmap {}
// SAFETY: as `MmapRaw` (Sync): `&Mmap` gives only the raw pointer and the length.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// Maps `len` bytes of `fd` at `offset` (page-aligned, as every region offset is).
    pub(crate) fn shared(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Mmap> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot map 0 bytes",
            ));
        }
        libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mmap offset too large"))?;
        let map = memmap2::MmapOptions::new()
            .offset(offset)
            .len(len)
            .map_raw(&fd)?;
        let ptr = std::ptr::NonNull::new(map.as_mut_ptr())
            .ok_or_else(|| io::Error::other("mmap returned a null address"))?;
        Ok(Mmap { map, ptr })
    }

    /// The first byte (raw: never make a reference from it).
    pub(crate) fn as_ptr(&self) -> std::ptr::NonNull<u8> {
        self.ptr
    }

    /// The mapped length.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Replaces the mapping, at the same address and length, by private anonymous memory that
    /// reads all-ones (what a PCIe read of a device that is gone returns), so that the mapping
    /// no longer holds the file it mapped (the kernel can release the device) and stray
    /// accesses through it reach no device (a write lands in the new memory). The all-ones
    /// pages are filled first and then moved over the old mapping in one `mremap`, so an
    /// access racing with it sees either the device or all-ones, never zeros or a hole. The
    /// `MmapRaw` then unmaps the anonymous pages on drop (same address, same length).
    pub(crate) fn cut_off(&self) -> io::Result<()> {
        use nix::sys::mman::{MRemapFlags, MapFlags, ProtFlags};
        let len = std::num::NonZeroUsize::new(self.len())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a new private anonymous mapping placed by the kernel (no address hint): no
        // existing memory is replaced.
        let fresh = unsafe {
            nix::sys::mman::mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }?;
        // SAFETY: `fresh` is the mapping just made, `len` writable bytes nothing else knows.
        unsafe { std::ptr::write_bytes(fresh.as_ptr().cast::<u8>(), 0xff, len.get()) };
        // SAFETY: moves the fresh pages over exactly the range this value owns (MREMAP_FIXED
        // unmaps what was there: the device mapping, which nothing references — only volatile
        // accesses through raw pointers, which stay valid: the range stays mapped). On failure
        // the fresh mapping is unmapped below and the old one is untouched.
        let moved = unsafe {
            nix::sys::mman::mremap(
                fresh,
                len.get(),
                len.get(),
                MRemapFlags::MREMAP_MAYMOVE | MRemapFlags::MREMAP_FIXED,
                Some(self.as_ptr().cast()),
            )
        };
        if let Err(errno) = moved {
            // SAFETY: `fresh` is still the mapping made above, owned by nobody else.
            let _ = unsafe { nix::sys::mman::munmap(fresh, len.get()) };
            return Err(errno.into());
        }
        Ok(())
    }
}
