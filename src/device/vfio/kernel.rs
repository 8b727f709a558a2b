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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use userdma_sys::vfio::{
    vfio_device_attach_iommufd_pt, vfio_device_bind_iommufd, vfio_device_info, vfio_group_status,
    vfio_irq_info, VFIO_CHECK_EXTENSION, VFIO_DEVICE_ATTACH_IOMMUFD_PT, VFIO_DEVICE_BIND_IOMMUFD,
    VFIO_DEVICE_GET_INFO, VFIO_DEVICE_GET_IRQ_INFO, VFIO_DEVICE_GET_PCI_HOT_RESET_INFO,
    VFIO_DEVICE_GET_REGION_INFO, VFIO_DEVICE_PCI_HOT_RESET, VFIO_DEVICE_RESET,
    VFIO_DEVICE_SET_IRQS, VFIO_GET_API_VERSION, VFIO_GROUP_GET_DEVICE_FD, VFIO_GROUP_GET_STATUS,
    VFIO_GROUP_SET_CONTAINER, VFIO_GROUP_UNSET_CONTAINER, VFIO_SET_IOMMU,
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

/// `ioctl(fd, request, arg)`, a negative return turned into the errno; returns the result.
///
/// # Safety
/// `arg` must be what `request` expects: for a pointer, to memory readable and writable for the
/// whole size the kernel will access, alive across the call.
unsafe fn ioctl_raw(
    fd: BorrowedFd<'_>,
    request: libc::Ioctl,
    arg: libc::c_ulong,
) -> io::Result<i32> {
    // SAFETY: the caller vouches for `arg`; `fd` is open for the duration of the borrow.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A pointer as the `unsigned long` argument of an ioctl.
fn arg<T>(ptr: *const T) -> libc::c_ulong {
    ptr as libc::c_ulong
}

/// A pointer to memory the kernel writes, as the `unsigned long` argument of an ioctl.
fn arg_mut<T>(value: &mut T) -> libc::c_ulong {
    std::ptr::from_mut(value) as libc::c_ulong
}

/// `size_of::<T>()` as the `u32` VFIO's `argsz` holds (the structs are a few dozen bytes).
fn argsz<T>() -> u32 {
    u32::try_from(size_of::<T>()).unwrap_or(u32::MAX)
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
        unsafe { ioctl_raw(container, VFIO_GET_API_VERSION, 0) }
    }

    fn check_extension(&self, container: BorrowedFd<'_>, model: u32) -> io::Result<bool> {
        // SAFETY: VFIO_CHECK_EXTENSION takes the extension by value.
        let ret =
            unsafe { ioctl_raw(container, VFIO_CHECK_EXTENSION, libc::c_ulong::from(model)) }?;
        Ok(ret > 0)
    }

    fn set_iommu(&self, container: BorrowedFd<'_>, model: u32) -> io::Result<()> {
        // SAFETY: VFIO_SET_IOMMU takes the model by value.
        unsafe { ioctl_raw(container, VFIO_SET_IOMMU, libc::c_ulong::from(model)) }.map(drop)
    }

    fn group_status(&self, group: BorrowedFd<'_>) -> io::Result<u32> {
        let mut status = vfio_group_status {
            argsz: argsz::<vfio_group_status>(),
            flags: 0,
        };
        // SAFETY: the kernel writes a vfio_group_status of `argsz` bytes into `status`, which
        // lives across the call.
        unsafe { ioctl_raw(group, VFIO_GROUP_GET_STATUS, arg_mut(&mut status)) }?;
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
        unsafe { ioctl_raw(group, VFIO_GROUP_SET_CONTAINER, arg(&fd)) }.map(drop)
    }

    fn group_unset_container(&self, group: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: VFIO_GROUP_UNSET_CONTAINER takes no argument.
        unsafe { ioctl_raw(group, VFIO_GROUP_UNSET_CONTAINER, 0) }.map(drop)
    }

    fn group_device_fd(&self, group: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
        // SAFETY: the kernel reads a NUL-terminated string through the pointer; `name` lives
        // across the call.
        let fd = unsafe { ioctl_raw(group, VFIO_GROUP_GET_DEVICE_FD, arg(name.as_ptr())) }?;
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
        unsafe { ioctl_raw(device, VFIO_DEVICE_GET_INFO, arg_mut(&mut info)) }?;
        Ok(info)
    }

    fn region_info(&self, device: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()> {
        checked_argsz(buf, size_of::<userdma_sys::vfio::vfio_region_info>())?;
        // SAFETY: the kernel writes at most `argsz` bytes, just checked against `buf.len()`;
        // `buf` lives across the call.
        unsafe { ioctl_raw(device, VFIO_DEVICE_GET_REGION_INFO, arg(buf.as_mut_ptr())) }.map(drop)
    }

    fn irq_info(&self, device: BorrowedFd<'_>, index: u32) -> io::Result<vfio_irq_info> {
        let mut info = vfio_irq_info {
            argsz: argsz::<vfio_irq_info>(),
            index,
            ..Default::default()
        };
        // SAFETY: the kernel reads and writes one vfio_irq_info in `info`, alive across the call.
        unsafe { ioctl_raw(device, VFIO_DEVICE_GET_IRQ_INFO, arg_mut(&mut info)) }?;
        Ok(info)
    }

    fn set_irqs(&self, device: BorrowedFd<'_>, buf: &[u8]) -> io::Result<()> {
        checked_argsz(buf, size_of::<userdma_sys::vfio::vfio_irq_set>())?;
        // SAFETY: the kernel only reads `argsz` bytes (checked against `buf.len()`) of a
        // vfio_irq_set and its data; `buf` lives across the call. The eventfds in the data are
        // open (the caller holds them).
        unsafe { ioctl_raw(device, VFIO_DEVICE_SET_IRQS, arg(buf.as_ptr())) }.map(drop)
    }

    fn reset(&self, device: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: VFIO_DEVICE_RESET takes no argument.
        unsafe { ioctl_raw(device, VFIO_DEVICE_RESET, 0) }.map(drop)
    }

    fn hot_reset(&self, device: BorrowedFd<'_>, buf: &[u8]) -> io::Result<()> {
        checked_argsz(buf, size_of::<userdma_sys::vfio::vfio_pci_hot_reset>())?;
        // SAFETY: the kernel reads `argsz` bytes (checked against `buf.len()`) and writes none.
        unsafe { ioctl_raw(device, VFIO_DEVICE_PCI_HOT_RESET, arg(buf.as_ptr())) }.map(drop)
    }

    fn hot_reset_info(&self, device: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()> {
        checked_argsz(buf, size_of::<userdma_sys::vfio::vfio_pci_hot_reset_info>())?;
        // SAFETY: the kernel writes at most `argsz` bytes (checked against `buf.len()`).
        unsafe {
            ioctl_raw(
                device,
                VFIO_DEVICE_GET_PCI_HOT_RESET_INFO,
                arg(buf.as_mut_ptr()),
            )
        }
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
        unsafe { ioctl_raw(device, VFIO_DEVICE_BIND_IOMMUFD, arg_mut(&mut bind)) }?;
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
        unsafe { ioctl_raw(device, VFIO_DEVICE_ATTACH_IOMMUFD_PT, arg_mut(&mut attach)) }.map(drop)
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

/// `mmap` of `len` bytes of `fd` at `offset`, shared and read-write, unmapped on drop. Only
/// ever touched through raw pointers (the volatile accesses of [`crate::mmio::Direct`]).
#[derive(Debug)]
pub(crate) struct Mmap {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: a Mmap is an owned mapping; it only hands out the raw pointer, and unmapping from any
// thread is fine.
unsafe impl Send for Mmap {}
// SAFETY: `&Mmap` gives only the raw pointer and the length.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// Maps `len` bytes of `fd` at `offset`.
    pub(crate) fn shared(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Mmap> {
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mmap offset too large"))?;
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot map 0 bytes",
            ));
        }
        // SAFETY: a new mapping placed by the kernel (address NULL), so no existing memory is
        // replaced; `fd` is open across the call (borrowed); MAP_FAILED is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_fd().as_raw_fd(),
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null address"))?;
        Ok(Mmap { ptr, len })
    }

    /// The first byte (raw: never make a reference from it).
    pub(crate) fn as_ptr(&self) -> std::ptr::NonNull<u8> {
        self.ptr
    }

    /// The mapped length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Replaces the mapping, at the same address and length, by private anonymous memory that
    /// reads all-ones (what a PCIe read of a device that is gone returns), so that the mapping
    /// no longer holds the file it mapped (the kernel can release the device) and stray
    /// accesses through it reach no device (a write lands in the new memory). The all-ones pages are filled first and then moved
    /// over the old mapping in one `mremap`, so an access racing with it sees either the device
    /// or all-ones, never zeros or a hole.
    pub(crate) fn cut_off(&self) -> io::Result<()> {
        // SAFETY: a new private anonymous mapping placed by the kernel (address NULL): no
        // existing memory is replaced; MAP_FAILED is checked before use.
        let fresh = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if fresh == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fresh` is the mapping just made, `len` writable bytes nothing else knows.
        unsafe { std::ptr::write_bytes(fresh.cast::<u8>(), 0xff, self.len) };
        // SAFETY: moves the fresh pages over exactly the range this value owns (MREMAP_FIXED
        // unmaps what was there: the device mapping, which nothing references — only volatile
        // accesses through raw pointers, which stay valid: the range stays mapped). On failure
        // the fresh mapping is unmapped below and the old one is untouched.
        let moved = unsafe {
            libc::mremap(
                fresh,
                self.len,
                self.len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                self.ptr.as_ptr().cast::<libc::c_void>(),
            )
        };
        if moved == libc::MAP_FAILED {
            let err = io::Error::last_os_error();
            // SAFETY: `fresh` is still the mapping made above, owned by nobody else.
            unsafe { libc::munmap(fresh, self.len) };
            return Err(err);
        }
        Ok(())
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + len` is a mapping this value made and owns; every register block
        // over it holds the `Arc` this value lives in, so none outlives it.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
