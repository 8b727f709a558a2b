//! Opening a device through VFIO's container/group interface with the raw ioctls of
//! `userdma::sys::vfio`. Test code: the crate's own VFIO device backend will replace it.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use userdma::mmio::{Block, FileBacked};
use userdma::pci::Bdf;
use userdma::sys::pci::{PCI_CFG_SPACE_SIZE, PCI_COMMAND, PCI_COMMAND_MASTER, PCI_COMMAND_MEMORY};
use userdma::sys::vfio::{
    vfio_group_status, vfio_region_info, VFIO_TYPE1v2_IOMMU, VFIO_API_VERSION,
    VFIO_CHECK_EXTENSION, VFIO_CONTAINER_PATH, VFIO_DEVICE_GET_REGION_INFO, VFIO_GET_API_VERSION,
    VFIO_GROUP_DIR, VFIO_GROUP_FLAGS_VIABLE, VFIO_GROUP_GET_DEVICE_FD, VFIO_GROUP_GET_STATUS,
    VFIO_GROUP_SET_CONTAINER, VFIO_NOIOMMU_GROUP_PREFIX, VFIO_NOIOMMU_IOMMU,
    VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_REGION_INFO_FLAG_MMAP,
    VFIO_SET_IOMMU,
};

use crate::edu::{self, Edu};
use crate::failure::{ensure, Context, Failure};
use crate::mmap::Mmap;

/// The IOMMU model a container is set to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Model {
    /// `VFIO_TYPE1v2_IOMMU`: DMA translated through the mappings the process makes.
    Type1v2,
    /// `VFIO_NOIOMMU_IOMMU`: no translation, no isolation; the device uses physical addresses.
    NoIommu,
}

impl Model {
    fn id(self) -> u32 {
        match self {
            Model::Type1v2 => VFIO_TYPE1v2_IOMMU,
            Model::NoIommu => VFIO_NOIOMMU_IOMMU,
        }
    }

    /// The group node of group `number`: `/dev/vfio/N`, or `/dev/vfio/noiommu-N`.
    pub(crate) fn group_path(self, number: u32) -> PathBuf {
        let name = match self {
            Model::Type1v2 => number.to_string(),
            Model::NoIommu => format!("{VFIO_NOIOMMU_GROUP_PREFIX}{number}"),
        };
        Path::new(VFIO_GROUP_DIR).join(name)
    }
}

/// A group attached to a container, and the device fd. Drop order is the field order: the
/// device, then the group (which detaches it from the container).
#[derive(Debug)]
pub(crate) struct Attached {
    /// The device fd.
    pub(crate) device: OwnedFd,
    _group: OwnedFd,
}

/// Opens the container and group `number`, attaches them with IOMMU `model`, and gets the
/// device fd of `bdf`. Returns the container (for a DMA space to own) and the attachment.
pub(crate) fn open(bdf: Bdf, number: u32, model: Model) -> Result<(OwnedFd, Attached), Failure> {
    let container = open_rw(Path::new(VFIO_CONTAINER_PATH))?;
    let fd = container.as_raw_fd();
    // SAFETY: VFIO_GET_API_VERSION takes no argument; `fd` is an open file.
    let version = unsafe { libc::ioctl(fd, VFIO_GET_API_VERSION) };
    ensure!(
        u32::try_from(version) == Ok(VFIO_API_VERSION),
        "VFIO_GET_API_VERSION returned {version}, want {VFIO_API_VERSION}"
    );
    // SAFETY: VFIO_CHECK_EXTENSION takes an integer by value; `fd` is an open file.
    let supported =
        unsafe { libc::ioctl(fd, VFIO_CHECK_EXTENSION, libc::c_ulong::from(model.id())) };
    ensure!(
        supported == 1,
        "VFIO_CHECK_EXTENSION({model:?}) returned {supported}: the kernel's VFIO does not offer this IOMMU model"
    );

    let path = model.group_path(number);
    let group = open_rw(&path)?;
    let mut status = vfio_group_status {
        argsz: size_of_u32::<vfio_group_status>(),
        ..Default::default()
    };
    // SAFETY: VFIO_GROUP_GET_STATUS writes a vfio_group_status, whose argsz says how large the
    // struct is; `status` is one and lives across the call.
    let rc = unsafe { libc::ioctl(group.as_raw_fd(), VFIO_GROUP_GET_STATUS, &mut status) };
    check_rc(rc, || {
        format!("VFIO_GROUP_GET_STATUS on {}", path.display())
    })?;
    ensure!(
        status.flags & VFIO_GROUP_FLAGS_VIABLE != 0,
        "group {} is not viable (flags {:#x}): a member is bound to a host driver",
        path.display(),
        status.flags
    );
    let container_fd: libc::c_int = fd;
    // SAFETY: VFIO_GROUP_SET_CONTAINER reads one int (the container fd) through the pointer;
    // `container_fd` lives across the call.
    let rc = unsafe { libc::ioctl(group.as_raw_fd(), VFIO_GROUP_SET_CONTAINER, &container_fd) };
    check_rc(rc, || {
        format!("VFIO_GROUP_SET_CONTAINER {}", path.display())
    })?;
    // SAFETY: VFIO_SET_IOMMU takes an integer by value; `fd` is an open file.
    let rc = unsafe { libc::ioctl(fd, VFIO_SET_IOMMU, libc::c_ulong::from(model.id())) };
    check_rc(rc, || format!("VFIO_SET_IOMMU({model:?})"))?;

    let name = CString::new(bdf.to_string())
        .map_err(|_| Failure::Check(format!("PCI address {bdf} contains a NUL byte")))?;
    // SAFETY: VFIO_GROUP_GET_DEVICE_FD reads a NUL-terminated string through the pointer; `name`
    // lives across the call.
    let device = unsafe { libc::ioctl(group.as_raw_fd(), VFIO_GROUP_GET_DEVICE_FD, name.as_ptr()) };
    check_rc(device, || format!("VFIO_GROUP_GET_DEVICE_FD({bdf})"))?;
    // SAFETY: on success the ioctl returned a new fd that nothing else owns.
    let device = unsafe { OwnedFd::from_raw_fd(device) };
    Ok((
        container,
        Attached {
            device,
            _group: group,
        },
    ))
}

/// `VFIO_DEVICE_GET_REGION_INFO` for region `index`.
pub(crate) fn region_info(device: BorrowedFd<'_>, index: u32) -> Result<vfio_region_info, Failure> {
    let mut info = vfio_region_info {
        argsz: size_of_u32::<vfio_region_info>(),
        index,
        ..Default::default()
    };
    // SAFETY: VFIO_DEVICE_GET_REGION_INFO reads and writes a vfio_region_info of `argsz` bytes
    // (the kernel writes at most argsz bytes); `info` is one and lives across the call.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), VFIO_DEVICE_GET_REGION_INFO, &mut info) };
    check_rc(rc, || format!("VFIO_DEVICE_GET_REGION_INFO({index})"))?;
    Ok(info)
}

/// Maps edu's BAR0 from the device fd (at the region's offset).
pub(crate) fn map_edu(device: BorrowedFd<'_>) -> Result<Edu, Failure> {
    let info = region_info(device, VFIO_PCI_BAR0_REGION_INDEX)?;
    ensure!(
        info.size == edu::BAR0_LEN,
        "VFIO says BAR0 is {:#x} bytes, edu's is {:#x}",
        info.size,
        edu::BAR0_LEN
    );
    ensure!(
        info.flags & VFIO_REGION_INFO_FLAG_MMAP != 0,
        "VFIO says BAR0 cannot be mapped (flags {:#x})",
        info.flags
    );
    let len = usize::try_from(info.size)
        .map_err(|_| Failure::Check(format!("BAR0 size {:#x}", info.size)))?;
    let map = Mmap::shared(device, info.offset, len).context(|| {
        format!(
            "mmap BAR0 ({len:#x} bytes at {:#x}) of the device fd",
            info.offset
        )
    })?;
    Edu::new(map)
}

/// Sets memory decoding and bus mastering in the command register, through the config region.
pub(crate) fn enable_bus_master(device: BorrowedFd<'_>) -> Result<(), Failure> {
    let info = region_info(device, VFIO_PCI_CONFIG_REGION_INDEX)?;
    let config = Block::new(FileBacked::new(
        device,
        info.offset,
        usize::from(PCI_CFG_SPACE_SIZE),
    ));
    set_command_bits(&config, "the VFIO config region")
}

/// Sets `MEMORY | MASTER` in the command register of a configuration space block, and checks
/// that they stick.
pub(crate) fn set_command_bits<F>(config: &Block<FileBacked<F>>, what: &str) -> Result<(), Failure>
where
    F: AsFd + std::fmt::Debug + Send + Sync,
{
    let at = usize::from(PCI_COMMAND);
    let command: u16 = config
        .read(at)
        .context(|| format!("read the command register from {what}"))?;
    let wanted = command | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
    config
        .write(at, wanted)
        .context(|| format!("write the command register through {what}"))?;
    let back: u16 = config
        .read(at)
        .context(|| format!("read the command register from {what}"))?;
    ensure!(
        back & (PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER) == PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER,
        "command register reads {back:#06x} after writing {wanted:#06x} through {what}"
    );
    Ok(())
}

fn open_rw(path: &Path) -> Result<OwnedFd, Failure> {
    let file: File = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .context(|| format!("open {}", path.display()))?;
    Ok(file.into())
}

fn check_rc(rc: libc::c_int, op: impl FnOnce() -> String) -> Result<(), Failure> {
    if rc < 0 {
        Err(io::Error::last_os_error()).context(op)
    } else {
        Ok(())
    }
}

/// `size_of::<T>()` as the `u32` VFIO's `argsz` fields hold (the structs are a few dozen bytes).
fn size_of_u32<T>() -> u32 {
    u32::try_from(mem::size_of::<T>()).unwrap_or(u32::MAX)
}
