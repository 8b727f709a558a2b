//! Opening a [`Vfio`]: the sequence of [`Vfio::open`] and [`Vfio::open_with`] (the
//! [`vfio`](super) module docs list its steps), the device's info read into the value, and the
//! steps that talk to the kernel on their own: region info (with the buffer grown for the
//! capability chain), the device cdev's name, and the iommufd path (a new IOAS, the device bound
//! and attached to it).

use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use userdma_sys::vfio::{VFIO_DEVICES_DIR, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_SYSFS_DEV_DIR};

use super::container::{space_error, Model};
use super::info::{put, read_u32};
use super::irqs::Interrupts;
use super::kernel::{Kernel, Live};
use super::{
    Attachment, Container, IrqInfo, Mode, Options, RegionDefect, RegionInfo, Vfio, BAR_COUNT,
};
use crate::device::vfio::Error as VfioError;
use crate::device::{Error, Identity, Kind, Source};
use crate::mmio::{Block, FileBacked};
use crate::sync::Mutex;
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
    #[cfg(feature = "tracing")]
    let _span = tracing::debug_span!(
        "vfio.iommufd",
        %bdf,
        cdev = %cdev.display(),
        dma_mask_bits = mask_bits
    )
    .entered();
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

impl Vfio {
    /// Opens `bdf` (bound to `vfio-pci`) with [`Options::new`].
    pub fn open(bdf: pci::Bdf) -> Result<Vfio, Error> {
        Vfio::open_with(bdf, &Options::new())
    }

    /// Opens `bdf` (bound to `vfio-pci`) with `options`.
    pub fn open_with(bdf: pci::Bdf, options: &Options) -> Result<Vfio, Error> {
        let mut host = Host::system();
        if let Some(sysfs) = &options.sysfs {
            host.sysfs = sysfs.clone();
        }
        Vfio::open_in(&host, bdf, options)
    }

    /// The open sequence, against `host`.
    pub(crate) fn open_in(host: &Host, bdf: pci::Bdf, options: &Options) -> Result<Vfio, Error> {
        #[cfg(feature = "tracing")]
        let _span = tracing::info_span!(
            "vfio.open",
            %bdf,
            iommufd = options.iommufd,
            allow_noiommu = options.allow_noiommu
        )
        .entered();
        let sysfs_err = |source| Error::Sysfs { bdf, source };
        let info = host.sysfs.device(bdf).map_err(sysfs_err)?;
        match info.driver.as_deref() {
            None => return Err(Error::NotBound { bdf }),
            Some(d) if d == pci::Driver::VfioPci.name() || d.ends_with("vfio_pci") => {}
            Some(d) => {
                return Err(Error::WrongDriver {
                    bdf,
                    driver: d.to_owned(),
                })
            }
        }
        let group = info.iommu_group.clone().ok_or(VfioError::NoGroup { bdf })?;
        if group.noiommu && !options.allow_noiommu {
            return Err(VfioError::NoIommuRefused {
                bdf,
                group: group.number,
            }
            .into());
        }
        let mut culprits = Vec::new();
        for member in group.others(bdf) {
            if let Some(driver) = host.sysfs.driver(member).map_err(sysfs_err)? {
                if !pci::vfio_compatible(&driver) {
                    culprits.push((member, driver));
                }
            }
        }
        if !culprits.is_empty() {
            return Err(VfioError::GroupNotViable {
                bdf,
                group: group.number,
                culprits,
            }
            .into());
        }
        let identity = Identity {
            name: format!("{:04x}:{:04x}", info.vendor, info.device),
            kind: Kind::Vfio,
            bdf: Some(bdf),
        };
        let cdev = if options.iommufd && options.container.is_none() && !group.noiommu {
            cdev_path(host, bdf).filter(|_| host.kernel.exists(Path::new(IOMMUFD_PATH)))
        } else {
            None
        };
        let (device, space, attachment, path) = match cdev {
            Some(cdev) => open_iommufd(host, bdf, &cdev, options.dma_mask_bits)?,
            None => {
                let model = if group.noiommu {
                    eprintln!(
                        "warning: {bdf}: VFIO no-IOMMU mode: the device's DMA is neither translated nor isolated; it can reach all of memory"
                    );
                    Model::NoIommu
                } else {
                    Model::Type1v2
                };
                let container = match &options.container {
                    Some(c) => Arc::clone(c),
                    None => Container::open_in(Arc::clone(&host.kernel))?,
                };
                let (group, space) =
                    container.attach(bdf, group.number, model, options.dma_mask_bits)?;
                let device = group.device_fd(bdf)?;
                let path = match model {
                    Model::Type1v2 => Mode::Type1,
                    Model::NoIommu => Mode::NoIommu,
                };
                (device, space, Attachment::Group(group), path)
            }
        };
        let mut vfio = Vfio::from_fd(host, bdf, identity, device, space, attachment, path)?;
        vfio.numa_node = crate::memory::numa::placement(host.sysfs.root(), info.numa_node);
        vfio.dma_alignment = options.dma_alignment;
        vfio.start_monitor()?;
        if options.bus_master {
            vfio.set_bus_master(true)?;
        }
        if let Some((kind, count)) = options.interrupts {
            vfio.enable_interrupts(kind, count)?;
        }
        #[cfg(feature = "tracing")]
        tracing::info!(
            device = %vfio.identity,
            mode = ?vfio.mode,
            group = vfio.group(),
            regions = vfio.regions.len(),
            irqs = vfio.irqs.len(),
            numa_node = vfio.numa_node,
            "device opened"
        );
        Ok(vfio)
    }

    /// Reads the device's info and builds the value.
    fn from_fd(
        host: &Host,
        bdf: pci::Bdf,
        identity: Identity,
        device: OwnedFd,
        space: Arc<dyn dma::Space>,
        attachment: Attachment,
        mode: Mode,
    ) -> Result<Vfio, Error> {
        let kernel = Arc::clone(&host.kernel);
        let ioctl = |ioctl: &'static str| move |source| VfioError::Ioctl { bdf, ioctl, source };
        let info = kernel
            .device_info(device.as_fd())
            .map_err(ioctl("VFIO_DEVICE_GET_INFO"))?;
        let mut regions = Vec::new();
        for index in 0..info.num_regions.min(64) {
            regions.push(region_info(kernel.as_ref(), bdf, device.as_fd(), index)?);
        }
        let mut irqs = Vec::new();
        for index in 0..info.num_irqs.min(64) {
            match kernel.irq_info(device.as_fd(), index) {
                Ok(raw) => irqs.push(IrqInfo::from_raw(&raw)),
                // vfio-pci answers EINVAL for an index the function lacks (the error IRQ of a
                // conventional PCI function): none of it.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => irqs.push(IrqInfo {
                    index,
                    flags: 0,
                    count: 0,
                }),
                Err(source) => return Err(ioctl("VFIO_DEVICE_GET_IRQ_INFO")(source).into()),
            }
        }
        let config_region = regions
            .iter()
            .find(|r| r.index == VFIO_PCI_CONFIG_REGION_INDEX)
            .cloned()
            .ok_or(VfioError::Ioctl {
                bdf,
                ioctl: "VFIO_DEVICE_GET_REGION_INFO",
                source: std::io::Error::other("the device has no PCI config region"),
            })?;
        let config_len = usize::try_from(config_region.size).unwrap_or(0);
        let device = Arc::new(device);
        let events = Source::new(identity.to_string());
        Ok(Vfio {
            bdf,
            identity,
            kernel,
            device_flags: info.flags,
            regions,
            irqs,
            mode,
            interrupts: Mutex::new(Interrupts::default()),
            bars: Arc::new(Mutex::new((0..BAR_COUNT).map(|_| None).collect())),
            config: Block::new(FileBacked::new(
                Arc::clone(&device),
                config_region.offset,
                config_len,
            )),
            events,
            monitor: None,
            device,
            space,
            attachment,
            numa_node: None,
            dma_alignment: crate::pool::DEFAULT_DMA_ALIGNMENT,
        })
    }
}
