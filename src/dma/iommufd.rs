//! [`Iommufd`]: the DMA address space of an iommufd IO address space (IOAS), Linux 6.2+.
//!
//! The space allocates its own IOAS on the `/dev/iommu` fd it is given, reads the IOVA ranges the
//! IOAS allows (`IOMMU_IOAS_IOVA_RANGES`) and their alignment, and maps with fixed IOVAs from the
//! shared allocator (`IOMMU_IOAS_MAP` with `IOMMU_IOAS_MAP_FIXED_IOVA`), so placement follows the
//! device's DMA mask, which the kernel does not know. Attaching a device narrows the allowed
//! ranges: call [`Iommufd::refresh_ranges`] after every attach or detach.

use std::fmt;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::iommu::{Core, Iommu};
use super::iova::IovaRange;
use super::shim::KernelIommufd;
use super::{Access, Error, Kind, Mapping, Space, Stats};
use crate::memory::u64_of;
use crate::memory::{base_page_size, Region};

/// Ranges asked for per `IOMMU_IOAS_IOVA_RANGES` call at first; more if the kernel says so.
const INITIAL_RANGES: usize = 16;
/// More ranges than any IOMMU reports; a reply above it is refused.
const MAX_RANGES: usize = 1 << 16;

/// The iommufd ioctls this space makes. The kernel-backed implementation is private; tests and
/// users' CI implement this trait with a double that simulates the kernel.
pub trait IommufdIoctl: Send + Sync + fmt::Debug {
    /// `IOMMU_IOAS_ALLOC`: a new IOAS; returns its id.
    fn ioas_alloc(&self) -> io::Result<u32>;

    /// `IOMMU_IOAS_IOVA_RANGES` of `ioas`: fills as many of `out` as there are ranges (at most
    /// `out.len()`) and returns how many ranges there are in total and the IOVA alignment. A total
    /// above `out.len()` means "call again with room for that many" (the kernel's `EMSGSIZE`).
    fn ioas_iova_ranges(&self, ioas: u32, out: &mut [IovaRange]) -> io::Result<(usize, u64)>;

    /// `IOMMU_IOAS_MAP` of `len` bytes at `vaddr` to the fixed `iova`, readable and writable.
    fn ioas_map(&self, ioas: u32, vaddr: u64, iova: u64, len: u64) -> io::Result<()>;

    /// `IOMMU_IOAS_MAP` with the device's access as `access` says
    /// (`IOMMU_IOAS_MAP_READABLE` when it reads, `_WRITEABLE` when it writes). Default:
    /// read-write through [`IommufdIoctl::ioas_map`]; a double that cannot tell the modes
    /// apart refuses the others with `EINVAL`.
    fn ioas_map_with(
        &self,
        ioas: u32,
        vaddr: u64,
        iova: u64,
        len: u64,
        access: Access,
    ) -> io::Result<()> {
        if access == Access::ReadWrite {
            self.ioas_map(ioas, vaddr, iova, len)
        } else {
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        }
    }

    /// `IOMMU_IOAS_MAP_FILE` (Linux 6.13) of `len` bytes of `file` from byte `start` to the
    /// fixed `iova`, with the device's access as `access` says. Default: `ENOTTY`, what a kernel
    /// without the ioctl answers.
    fn ioas_map_file(
        &self,
        ioas: u32,
        file: BorrowedFd<'_>,
        start: u64,
        iova: u64,
        len: u64,
        access: Access,
    ) -> io::Result<()> {
        let _ = (ioas, file, start, iova, len, access);
        Err(io::Error::from_raw_os_error(libc::ENOTTY))
    }

    /// `IOMMU_IOAS_UNMAP` of `iova..+len`; returns the bytes unmapped.
    fn ioas_unmap(&self, ioas: u32, iova: u64, len: u64) -> io::Result<u64>;

    /// `IOMMU_DESTROY` of an object.
    fn destroy(&self, id: u32) -> io::Result<()>;

    /// The iommufd, for binding devices to it (`None` for a double).
    fn fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

/// The calls `Core` makes, on one IOAS.
#[derive(Debug)]
struct IoasIommu {
    ioctl: Box<dyn IommufdIoctl>,
    ioas: u32,
}

impl Iommu for IoasIommu {
    fn map(&self, vaddr: u64, iova: u64, len: u64, access: Access) -> io::Result<()> {
        self.ioctl
            .ioas_map_with(self.ioas, vaddr, iova, len, access)
    }

    fn map_file(
        &self,
        file: BorrowedFd<'_>,
        start: u64,
        iova: u64,
        len: u64,
        access: Access,
    ) -> io::Result<()> {
        self.ioctl
            .ioas_map_file(self.ioas, file, start, iova, len, access)
    }

    fn unmap(&self, iova: u64, len: u64) -> io::Result<u64> {
        self.ioctl.ioas_unmap(self.ioas, iova, len)
    }
}

impl Drop for IoasIommu {
    fn drop(&mut self) {
        // Runs after the last mapping is gone (mappings keep the core alive), so the IOAS is
        // empty. If a device is still attached the kernel refuses (EBUSY) and the IOAS lives on
        // until the iommufd is closed, which happens right after when the fd is ours; there is
        // nothing else to do with the error.
        let _ = self.ioctl.destroy(self.ioas);
    }
}

/// Reads the IOAS's ranges and alignment, growing the array if the kernel has more ranges.
fn read_ranges(ioctl: &dyn IommufdIoctl, ioas: u32) -> Result<(Vec<IovaRange>, u64), Error> {
    let mut room = INITIAL_RANGES;
    loop {
        let mut ranges = vec![IovaRange { start: 0, last: 0 }; room];
        let (total, alignment) = ioctl
            .ioas_iova_ranges(ioas, &mut ranges)
            .map_err(|source| Error::IovaRanges { ioas, source })?;
        if total <= room {
            ranges.truncate(total);
            // Drop what a misbehaving reply could hold: inverted ranges.
            ranges.retain(|range| range.start <= range.last);
            return Ok((ranges, alignment));
        }
        if total > MAX_RANGES {
            return Err(Error::IovaRanges {
                ioas,
                source: io::Error::from_raw_os_error(libc::E2BIG),
            });
        }
        room = total;
    }
}

/// The DMA address space of an iommufd IOAS owned by this space. Cheap to clone (clones share
/// the space).
#[derive(Debug, Clone)]
pub struct Iommufd {
    core: Arc<Core<IoasIommu>>,
    ioas: u32,
}

impl Iommufd {
    /// A new IOAS on `iommufd` (an open `/dev/iommu`), for a device with a `dma_mask_bits`-bit
    /// DMA mask. The space owns the fd from now on; [`Iommufd::fd`] lends it for binding devices.
    pub fn new(iommufd: OwnedFd, dma_mask_bits: u32) -> Result<Iommufd, Error> {
        Iommufd::with_ioctl(KernelIommufd::new(iommufd), dma_mask_bits)
    }

    /// A new IOAS over any implementation of the ioctls (a test double, typically).
    pub fn with_ioctl(
        ioctl: impl IommufdIoctl + 'static,
        dma_mask_bits: u32,
    ) -> Result<Iommufd, Error> {
        let ioas = ioctl
            .ioas_alloc()
            .map_err(|source| Error::IoasAlloc { source })?;
        let iommu = IoasIommu {
            ioctl: Box::new(ioctl),
            ioas,
        };
        // From here on, dropping `iommu` on an error destroys the IOAS again.
        let (ranges, alignment) = read_ranges(iommu.ioctl.as_ref(), ioas)?;
        let min_page = if alignment.is_power_of_two() {
            alignment.max(u64_of(base_page_size()))
        } else {
            u64_of(base_page_size())
        };
        // iommufd has no mapping-count limit of its own.
        let core = Core::new(iommu, Kind::Iommufd, dma_mask_bits, &ranges, min_page, None)?;
        Ok(Iommufd {
            core: Arc::new(core),
            ioas,
        })
    }

    /// The IOAS id, to attach devices to (`VFIO_DEVICE_ATTACH_IOMMUFD_PT`).
    pub fn ioas_id(&self) -> u32 {
        self.ioas
    }

    /// The iommufd, to bind devices to (`VFIO_DEVICE_BIND_IOMMUFD`); `None` over a double.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.core.iommu().ioctl.fd()
    }

    /// Re-reads the allowed IOVA ranges (they narrow when a device is attached). Fails, changing
    /// nothing, if a live mapping lies outside the new ranges.
    pub fn refresh_ranges(&self) -> Result<(), Error> {
        let (ranges, _) = read_ranges(self.core.iommu().ioctl.as_ref(), self.ioas)?;
        self.core.set_ranges(&ranges)
    }

    /// The IOVA ranges mappings are placed in: the IOAS's allowed ranges, clipped to the DMA mask,
    /// without IOVA page 0.
    pub fn usable_ranges(&self) -> Vec<IovaRange> {
        self.core.usable_ranges()
    }
}

impl Space for Iommufd {
    fn map(&self, region: Arc<Region>) -> Result<Mapping, Error> {
        self.core.map(region, Access::ReadWrite)
    }

    fn map_with(&self, region: Arc<Region>, access: Access) -> Result<Mapping, Error> {
        self.core.map(region, access)
    }

    fn map_file(&self, region: Arc<Region>, access: Access) -> Result<Mapping, Error> {
        self.core.map_file(region, access)
    }

    fn stats(&self) -> Stats {
        self.core.stats()
    }

    fn kind(&self) -> Kind {
        Kind::Iommufd
    }

    fn dma_mask_bits(&self) -> u32 {
        self.core.mask_bits()
    }
}
