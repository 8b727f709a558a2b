//! [`Container`]: a VFIO container (`/dev/vfio/vfio`) and the groups attached to it.
//!
//! One container can serve several devices and groups of a process, so that they share one
//! IOMMU domain and one DMA space: give the same `Arc<Container>` to each
//! [`Options::container`](super::Options::container). A group is attached once, however many
//! of its devices are opened; it is detached when the last of them is dropped, and the container
//! is closed when the last group and the last user reference are gone.
//!
//! The IOMMU model is set when the first group is attached: type1v2 (`VFIO_TYPE1v2_IOMMU`), or
//! no-IOMMU (`VFIO_NOIOMMU_IOMMU`) for the groups VFIO makes up when the kernel has no IOMMU.

use std::ffi::CString;
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use userdma_sys::vfio::{
    VFIO_TYPE1v2_IOMMU, VFIO_API_VERSION, VFIO_CONTAINER_PATH, VFIO_GROUP_DIR,
    VFIO_GROUP_FLAGS_VIABLE, VFIO_NOIOMMU_GROUP_PREFIX, VFIO_NOIOMMU_IOMMU,
};

use super::kernel::{Kernel, Live, SpaceError};
use crate::device::vfio::Error as VfioError;
use crate::device::Error;
use crate::dma::{self, Space};
use crate::pci::Bdf;
use crate::sync::Mutex;

/// The IOMMU model a container is set to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Model {
    /// `VFIO_TYPE1v2_IOMMU`.
    Type1v2,
    /// `VFIO_NOIOMMU_IOMMU`.
    NoIommu,
}

impl Model {
    fn id(self) -> u32 {
        match self {
            Model::Type1v2 => VFIO_TYPE1v2_IOMMU,
            Model::NoIommu => VFIO_NOIOMMU_IOMMU,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Model::Type1v2 => "type1v2",
            Model::NoIommu => "no-IOMMU",
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

/// What the container has: its model, its groups, and its type1 DMA space.
#[derive(Debug, Default)]
struct State {
    model: Option<Model>,
    groups: Vec<(u32, Weak<Group>)>,
    space: Option<dma::Type1>,
}

/// A VFIO container, shareable between devices (hold it as `Arc<Container>`).
pub struct Container {
    kernel: Arc<dyn Kernel>,
    path: PathBuf,
    state: Mutex<State>,
    // Last: closed after everything above let go of it.
    fd: OwnedFd,
}

impl fmt::Debug for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Container")
            .field("path", &self.path)
            .field("fd", &self.fd)
            .finish_non_exhaustive()
    }
}

impl Container {
    /// Opens a new, empty container (`/dev/vfio/vfio`) and checks the VFIO API version. Pass
    /// it to [`Options::container`](super::Options::container) of each device that should
    /// share it.
    pub fn new() -> Result<Arc<Container>, Error> {
        Container::open_in(Arc::new(Live))
    }

    /// A container through `kernel` (the system's, or a test double).
    pub(crate) fn open_in(kernel: Arc<dyn Kernel>) -> Result<Arc<Container>, Error> {
        let path = PathBuf::from(VFIO_CONTAINER_PATH);
        let fd = kernel.open(&path).map_err(|source| VfioError::Container {
            path: path.clone(),
            operation: "open",
            source,
        })?;
        let version = kernel
            .api_version(fd.as_fd())
            .map_err(|source| VfioError::Container {
                path: path.clone(),
                operation: "VFIO_GET_API_VERSION",
                source,
            })?;
        if u32::try_from(version) != Ok(VFIO_API_VERSION) {
            return Err(VfioError::Unsupported {
                path,
                what: format!("speaks VFIO API version {version}, not {VFIO_API_VERSION}"),
            }
            .into());
        }
        Ok(Arc::new(Container {
            kernel,
            path,
            state: Mutex::new(State::default()),
            fd,
        }))
    }

    /// The container's fd (for diagnostics; the container keeps ownership).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The numbers of the groups attached now.
    pub fn groups(&self) -> Vec<u32> {
        let state = self.lock();
        state
            .groups
            .iter()
            .filter(|(_, g)| g.strong_count() > 0)
            .map(|(n, _)| *n)
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state as consistent as any error return
        // does: take it anyway.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Attaches group `number` (once; later calls share it) for `bdf`, setting the container's
    /// model on the first attach, and returns the group and the device's DMA space.
    pub(crate) fn attach(
        self: &Arc<Self>,
        bdf: Bdf,
        number: u32,
        model: Model,
        mask_bits: u32,
    ) -> Result<(Arc<Group>, Arc<dyn Space>), Error> {
        #[cfg(feature = "tracing")]
        let _span = tracing::debug_span!(
            "vfio.attach",
            %bdf,
            group = number,
            model = model.name(),
            dma_mask_bits = mask_bits
        )
        .entered();
        let mut state = self.lock();
        if let Some(current) = state.model {
            if current != model {
                return Err(VfioError::ContainerModel {
                    bdf,
                    model: current.name(),
                }
                .into());
            }
        }
        let existing = state
            .groups
            .iter()
            .find(|(n, _)| *n == number)
            .and_then(|(_, g)| g.upgrade());
        let group = match existing {
            Some(group) => group,
            None => {
                let group = self.open_group(bdf, number, model)?;
                state.groups.retain(|(_, g)| g.strong_count() > 0);
                state.groups.push((number, Arc::downgrade(&group)));
                group
            }
        };
        let space = self.configure(&mut state, bdf, model, mask_bits);
        // Release the lock before `group` can be dropped on an error: its drop takes the lock.
        drop(state);
        Ok((group, space?))
    }

    /// Sets the model on the first attach and gives the device its DMA space.
    fn configure(
        &self,
        state: &mut State,
        bdf: Bdf,
        model: Model,
        mask_bits: u32,
    ) -> Result<Arc<dyn Space>, Error> {
        if state.model.is_none() {
            if !self
                .kernel
                .check_extension(self.fd.as_fd(), model.id())
                .map_err(|source| VfioError::Ioctl {
                    bdf,
                    ioctl: "VFIO_CHECK_EXTENSION",
                    source,
                })?
            {
                return Err(VfioError::Unsupported {
                    path: self.path.clone(),
                    what: format!("does not offer the {} IOMMU model", model.name()),
                }
                .into());
            }
            self.kernel
                .set_iommu(self.fd.as_fd(), model.id())
                .map_err(|source| VfioError::Ioctl {
                    bdf,
                    ioctl: "VFIO_SET_IOMMU",
                    source,
                })?;
            state.model = Some(model);
        }
        let space: Arc<dyn Space> = match model {
            Model::NoIommu => Arc::new(
                dma::Physical::new(mask_bits).map_err(|source| Error::DmaSpace { bdf, source })?,
            ),
            Model::Type1v2 => {
                if let Some(space) = &state.space {
                    let bits = space.dma_mask_bits();
                    if bits > mask_bits {
                        return Err(VfioError::ContainerMask {
                            bdf,
                            wanted: mask_bits,
                            space: bits,
                        }
                        .into());
                    }
                    Arc::new(space.clone())
                } else {
                    let space = self
                        .kernel
                        .type1_space(self.fd.as_fd(), mask_bits)
                        .map_err(|e| space_error(bdf, e))?;
                    state.space = Some(space.clone());
                    Arc::new(space)
                }
            }
        };
        Ok(space)
    }

    /// Opens group `number`, checks that it is viable and attaches it.
    fn open_group(
        self: &Arc<Self>,
        bdf: Bdf,
        number: u32,
        model: Model,
    ) -> Result<Arc<Group>, Error> {
        let path = model.group_path(number);
        let fd = self.kernel.open(&path).map_err(|source| Error::Open {
            bdf,
            path: path.clone(),
            source,
        })?;
        let flags = self
            .kernel
            .group_status(fd.as_fd())
            .map_err(|source| VfioError::Ioctl {
                bdf,
                ioctl: "VFIO_GROUP_GET_STATUS",
                source,
            })?;
        if flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(VfioError::GroupNotViable {
                bdf,
                group: number,
                culprits: Vec::new(),
            }
            .into());
        }
        self.kernel
            .group_set_container(fd.as_fd(), self.fd.as_fd())
            .map_err(|source| VfioError::Ioctl {
                bdf,
                ioctl: "VFIO_GROUP_SET_CONTAINER",
                source,
            })?;
        Ok(Arc::new(Group {
            number,
            path,
            fd,
            container: Arc::clone(self),
        }))
    }
}

/// A space error as the device error.
pub(crate) fn space_error(bdf: Bdf, error: SpaceError) -> Error {
    match error {
        SpaceError::Dup(source) => VfioError::Ioctl {
            bdf,
            ioctl: "dup of the VFIO container fd",
            source,
        }
        .into(),
        SpaceError::Space(source) => Error::DmaSpace { bdf, source },
    }
}

/// A group attached to a container. Dropping the last reference detaches it (and, with it, the
/// container's last hold on the group's devices).
pub(crate) struct Group {
    number: u32,
    path: PathBuf,
    fd: OwnedFd,
    container: Arc<Container>,
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("number", &self.number)
            .field("path", &self.path)
            .field("fd", &self.fd)
            .finish_non_exhaustive()
    }
}

impl Group {
    /// The group number.
    pub(crate) fn number(&self) -> u32 {
        self.number
    }

    /// The container.
    /// The group fd's number (`VFIO_DEVICE_PCI_HOT_RESET` proves ownership of the group
    /// with it); valid while the group lives.
    pub(crate) fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }

    pub(crate) fn container(&self) -> &Arc<Container> {
        &self.container
    }

    /// `VFIO_GROUP_GET_DEVICE_FD` for `bdf`.
    pub(crate) fn device_fd(&self, bdf: Bdf) -> Result<OwnedFd, Error> {
        let name = CString::new(bdf.to_string()).map_err(|_| VfioError::Ioctl {
            bdf,
            ioctl: "VFIO_GROUP_GET_DEVICE_FD",
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        self.container
            .kernel
            .group_device_fd(self.fd.as_fd(), &name)
            .map_err(|source| VfioError::Ioctl {
                bdf,
                ioctl: "VFIO_GROUP_GET_DEVICE_FD",
                source,
            })
            .map_err(Into::into)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Detach from the container; a failure leaves the kernel to detach when the fd closes
        // right after, so there is nothing else to do with it.
        let _ = self.container.kernel.group_unset_container(self.fd.as_fd());
        let mut state = self.container.lock();
        state.groups.retain(|(_, g)| g.strong_count() > 0);
        if state.groups.is_empty() {
            // The kernel forgets the container's IOMMU with its last group: start over next time.
            state.model = None;
            state.space = None;
        }
    }
}
