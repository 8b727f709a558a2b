//! The steps of [`Vfio::open`](super::Vfio::open) that talk to the kernel on their own: region
//! info (with the buffer grown for the capability chain), the device cdev's name, and the
//! iommufd path (a new IOAS, the device bound and attached to it).

use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use userdma_sys::vfio::{VFIO_DEVICES_DIR, VFIO_SYSFS_DEV_DIR};

use super::container::space_error;
use super::info::{put, read_u32};
use super::kernel::{Kernel, Live};
use super::{Attachment, Mode, RegionDefect, RegionInfo};
use crate::device::vfio::Error as VfioError;
use crate::device::Error;
use crate::{dma, pci};

/// The iommufd device node.
pub(super) const IOMMUFD_PATH: &str = "/dev/iommu";
/// Largest `VFIO_DEVICE_GET_REGION_INFO` reply accepted.
const MAX_REGION_INFO: usize = 1 << 16;

/// Where the system's files are: the sysfs tree, and the system calls.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    pub(crate) sysfs: pci::Sysfs,
    pub(crate) kernel: Arc<dyn Kernel>,
}

impl Host {
    /// `/sys` and the kernel.
    pub(super) fn system() -> Host {
        Host {
            sysfs: pci::Sysfs::system(),
            kernel: Arc::new(Live),
        }
    }
}

/// Reads region `index`'s info, growing the buffer when the capabilities do not fit.
pub(super) fn region_info(
    kernel: &dyn Kernel,
    bdf: pci::Bdf,
    device: BorrowedFd<'_>,
    index: u32,
) -> Result<RegionInfo, Error> {
    let mut len = std::mem::size_of::<userdma_sys::vfio::vfio_region_info>();
    for _ in 0..3 {
        let mut buf = vec![0u8; len];
        put(
            &mut buf,
            0,
            &u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes(),
        );
        put(&mut buf, 8, &index.to_ne_bytes());
        match kernel.region_info(device, &mut buf) {
            Ok(()) => {}
            // vfio-pci answers EINVAL for a region the function lacks (VGA on a non-VGA
            // device): an empty region.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Ok(RegionInfo {
                    index,
                    flags: 0,
                    size: 0,
                    offset: 0,
                    sparse: None,
                    region_type: None,
                    msix_mappable: false,
                })
            }
            Err(source) => {
                return Err(VfioError::Ioctl {
                    bdf,
                    ioctl: "VFIO_DEVICE_GET_REGION_INFO",
                    source,
                }
                .into())
            }
        }
        let argsz = read_u32(&buf, 0).unwrap_or(0);
        let wanted = usize::try_from(argsz).unwrap_or(usize::MAX);
        if wanted <= len {
            return RegionInfo::parse(&buf)
                .map_err(|defect| VfioError::MalformedRegion { bdf, index, defect })
                .map_err(Into::into);
        }
        if wanted > MAX_REGION_INFO {
            return Err(VfioError::MalformedRegion {
                bdf,
                index,
                defect: RegionDefect::TooLarge { argsz },
            }
            .into());
        }
        len = wanted;
    }
    Err(VfioError::MalformedRegion {
        bdf,
        index,
        defect: RegionDefect::TooLarge {
            argsz: u32::try_from(len).unwrap_or(u32::MAX),
        },
    }
    .into())
}

/// The device cdev of `bdf` (`/dev/vfio/devices/vfioN`, named in sysfs `vfio-dev/`), if the
/// kernel made one.
pub(super) fn cdev_path(host: &Host, bdf: pci::Bdf) -> Option<PathBuf> {
    let dir = host.sysfs.device_dir(bdf).join(VFIO_SYSFS_DEV_DIR);
    let name = fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .find(|n| n.starts_with("vfio"))?;
    let path = Path::new(VFIO_DEVICES_DIR).join(name);
    host.kernel.exists(&path).then_some(path)
}

/// The iommufd path: a new IOAS, the device cdev bound and attached to it.
pub(super) fn open_iommufd(
    host: &Host,
    bdf: pci::Bdf,
    cdev: &Path,
    mask_bits: u32,
) -> Result<(OwnedFd, Arc<dyn dma::Space>, Attachment, Mode), Error> {
    let kernel = host.kernel.as_ref();
    let open = |path: &Path| {
        kernel.open(path).map_err(|source| Error::Open {
            bdf,
            path: path.to_owned(),
            source,
        })
    };
    let device = open(cdev)?;
    let iommufd = open(Path::new(IOMMUFD_PATH))?;
    let for_space = iommufd.try_clone().map_err(|source| Error::Open {
        bdf,
        path: PathBuf::from(IOMMUFD_PATH),
        source,
    })?;
    let space = kernel
        .iommufd_space(for_space, mask_bits)
        .map_err(|e| space_error(bdf, e))?;
    let ioctl = |ioctl: &'static str| move |source| VfioError::Ioctl { bdf, ioctl, source };
    kernel
        .bind_iommufd(device.as_fd(), iommufd.as_fd())
        .map_err(ioctl("VFIO_DEVICE_BIND_IOMMUFD"))?;
    kernel
        .attach_pt(device.as_fd(), space.ioas_id())
        .map_err(ioctl("VFIO_DEVICE_ATTACH_IOMMUFD_PT"))?;
    space
        .refresh_ranges()
        .map_err(|source| Error::DmaSpace { bdf, source })?;
    Ok((
        device,
        Arc::new(space),
        Attachment::Iommufd { _iommufd: iommufd },
        Mode::Iommufd,
    ))
}
