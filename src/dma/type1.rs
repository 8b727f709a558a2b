//! [`Type1`]: the DMA address space of a VFIO container with the type1 IOMMU.
//!
//! At creation the space asks the container for its IOMMU info (`VFIO_IOMMU_GET_INFO`): the IOMMU
//! page sizes, the valid IOVA ranges (capability `VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE`: the
//! IOMMU's aperture minus reserved windows such as the MSI doorbell) and how many more mappings
//! the container accepts (`VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL`: the module's `dma_entry_limit`,
//! 65535 by default, less those in use). It never maps outside those ranges or past that count.
//! The info is parsed from bytes by [`Type1Info::parse`], a pure function.
//!
//! The container fd comes already configured (groups attached, `VFIO_SET_IOMMU` done); opening it
//! is the device layer's work.
//!
//! **Unmapping after the container lost its IOMMU.** When the last group leaves a container —
//! the kernel detaches a group by itself when its last device goes away (hot-unplug, unbind:
//! `vfio_device_remove_group` in `drivers/vfio/group.c`), and the device layer detaches it when
//! the device is dropped — the kernel releases the container's type1 IOMMU, and with it every
//! mapping: `vfio_group_detach_container` (`drivers/vfio/container.c`) calls the driver's
//! `release`, whose `vfio_iommu_unmap_unpin_all` unmaps and unpins all of them. From then on every
//! IOMMU ioctl on the container fails with `EINVAL` (`vfio_fops_unl_ioctl` passes it to no
//! driver). An unmap that fails with `EINVAL` is therefore checked with a `VFIO_IOMMU_GET_INFO`
//! on the same container, which a container with an IOMMU always answers: if that fails with
//! `EINVAL` too, the mapping is gone as asked, and the unmap counts as done
//! ([`Stats::unmaps`]) and in [`Stats::unmaps_after_removal`], not as an error. The kernel
//! can also drop the mappings a moment before it lets go of the IOMMU (with the container's
//! last IOMMU domain, as the device goes away): an unmap then succeeds having unmapped nothing
//! (`size` 0 in the reply), nothing is mapped or pinned there any more, and it counts the same
//! way. Any other failure, an `EINVAL` from a container that still answers, or an unmap that
//! unmapped part of the range stays an unmap error.

use std::fmt;
use std::io;
use std::mem::size_of;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use userdma_sys::vfio::{
    vfio_info_cap_header, vfio_iommu_type1_info, vfio_iommu_type1_info_cap_iova_range,
    vfio_iommu_type1_info_dma_avail, vfio_iova_range, VFIO_IOMMU_INFO_CAPS,
    VFIO_IOMMU_INFO_PGSIZES, VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE, VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL,
};

use super::iommu::{Core, Iommu};
use super::iova::IovaRange;
use super::shim::KernelType1;
use super::{Access, Error, Kind, Mapping, Space, Stats};
use crate::memory::u64_of;
use crate::memory::{base_page_size, Region};
use crate::sync::{AtomicU64, Ordering};

/// The kernel's default `vfio_iommu_type1.dma_entry_limit`, assumed when the container does not
/// report how many mappings are left (kernels before 5.10).
pub const DEFAULT_DMA_ENTRY_LIMIT: u64 = 65535;

/// Largest `VFIO_IOMMU_GET_INFO` reply accepted (a real one is a few hundred bytes).
const MAX_INFO_BYTES: usize = 1 << 20;

/// The three type1 container ioctls this space makes. The kernel-backed implementation is
/// private; tests and users' CI implement this trait with a double that simulates the kernel.
pub trait Type1Ioctl: Send + Sync + fmt::Debug {
    /// `VFIO_IOMMU_GET_INFO`. `buf` starts with a `vfio_iommu_type1_info` whose `argsz` is
    /// `buf.len()`. Like the kernel: write the info; if capabilities do not fit, set `argsz` to the
    /// size needed (and `VFIO_IOMMU_INFO_CAPS` in `flags`) without writing them; otherwise write
    /// them after the info and point `cap_offset` at the first.
    fn get_info(&self, buf: &mut [u8]) -> io::Result<()>;

    /// `VFIO_IOMMU_MAP_DMA` of `size` bytes at `vaddr` to `iova`, readable and writable.
    fn map_dma(&self, vaddr: u64, iova: u64, size: u64) -> io::Result<()>;

    /// `VFIO_IOMMU_MAP_DMA` with the device's access as `access` says
    /// (`VFIO_DMA_MAP_FLAG_READ` when it reads, `_WRITE` when it writes). Default: read-write
    /// through [`Type1Ioctl::map_dma`]; a double that cannot tell the modes apart refuses the
    /// others with `EINVAL`.
    fn map_dma_with(&self, vaddr: u64, iova: u64, size: u64, access: Access) -> io::Result<()> {
        if access == Access::ReadWrite {
            self.map_dma(vaddr, iova, size)
        } else {
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        }
    }

    /// `VFIO_IOMMU_UNMAP_DMA` of `iova..+size`; returns the bytes unmapped (the kernel's
    /// write-back of `size`). Like the kernel, a double whose container lost its IOMMU (its last
    /// group left it) fails this and `get_info` with `EINVAL`: the space then counts the unmap
    /// as done, the mapping gone with the IOMMU (see the module docs).
    fn unmap_dma(&self, iova: u64, size: u64) -> io::Result<u64>;
}

/// Why a `VFIO_IOMMU_GET_INFO` reply could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InfoDefect {
    /// Shorter than `vfio_iommu_type1_info`.
    TooShort,
    /// A capability points into the info struct itself.
    CapInsideHeader,
    /// A capability, or its payload, runs past the end of the reply.
    CapOutOfBounds,
    /// A capability's `next` does not point forward (the chain could loop).
    ChainNotAscending,
    /// An IOVA range has `end < start`.
    InvertedRange,
    /// The kernel asked for a buffer larger than any real reply.
    TooLarge,
}

impl fmt::Display for InfoDefect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InfoDefect::TooShort => "shorter than vfio_iommu_type1_info",
            InfoDefect::CapInsideHeader => "capability offset points inside the info header",
            InfoDefect::CapOutOfBounds => "capability runs past the end of the reply",
            InfoDefect::ChainNotAscending => "capability chain does not point forward",
            InfoDefect::InvertedRange => "IOVA range ends before it starts",
            InfoDefect::TooLarge => "reply size is implausibly large",
        })
    }
}

/// A container's IOMMU info, as parsed from `VFIO_IOMMU_GET_INFO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Type1Info {
    /// `flags` of the reply.
    pub flags: u32,
    /// Supported IOMMU page sizes, one bit per size (if `VFIO_IOMMU_INFO_PGSIZES`).
    pub iova_pgsizes: Option<u64>,
    /// Valid IOVA ranges (if the capability was present; absent means no restriction known).
    pub iova_ranges: Option<Vec<IovaRange>>,
    /// How many more mappings the container accepts (if the capability was present).
    pub dma_avail: Option<u32>,
}

/// Reads a native-endian `u32`/`u64` at `offset`, if in bounds.
fn read_u32(bytes: &[u8], offset: usize) -> Option<u32> {
    let end = offset.checked_add(4)?;
    Some(u32::from_ne_bytes(bytes.get(offset..end)?.try_into().ok()?))
}

fn read_u64(bytes: &[u8], offset: usize) -> Option<u64> {
    let end = offset.checked_add(8)?;
    Some(u64::from_ne_bytes(bytes.get(offset..end)?.try_into().ok()?))
}

fn read_u16(bytes: &[u8], offset: usize) -> Option<u16> {
    let end = offset.checked_add(2)?;
    Some(u16::from_ne_bytes(bytes.get(offset..end)?.try_into().ok()?))
}

impl Type1Info {
    /// Parses a `VFIO_IOMMU_GET_INFO` reply: the info struct and, if flagged, its capability
    /// chain (walked with every offset bounds-checked and required to point forward, so any
    /// input terminates). Unknown capabilities are skipped; of a repeated one the first counts.
    pub fn parse(bytes: &[u8]) -> Result<Type1Info, Error> {
        let defect = |offset: usize, defect: InfoDefect| Error::MalformedInfo { offset, defect };
        let header_len = size_of::<vfio_iommu_type1_info>();
        if bytes.len() < header_len {
            return Err(defect(0, InfoDefect::TooShort));
        }
        let field = |offset: usize| defect(offset, InfoDefect::TooShort);
        let flags = read_u32(bytes, 4).ok_or_else(|| field(4))?;
        let pgsizes = read_u64(bytes, 8).ok_or_else(|| field(8))?;
        let cap_offset = read_u32(bytes, 16).ok_or_else(|| field(16))?;
        let mut info = Type1Info {
            flags,
            iova_pgsizes: (flags & VFIO_IOMMU_INFO_PGSIZES != 0).then_some(pgsizes),
            iova_ranges: None,
            dma_avail: None,
        };
        if flags & VFIO_IOMMU_INFO_CAPS == 0 || cap_offset == 0 {
            return Ok(info);
        }
        let cap_header_len = size_of::<vfio_info_cap_header>();
        let mut offset = usize::try_from(cap_offset).unwrap_or(usize::MAX);
        loop {
            if offset < header_len {
                return Err(defect(offset, InfoDefect::CapInsideHeader));
            }
            let out_of_bounds = || defect(offset, InfoDefect::CapOutOfBounds);
            if offset
                .checked_add(cap_header_len)
                .is_none_or(|end| end > bytes.len())
            {
                return Err(out_of_bounds());
            }
            let id = read_u16(bytes, offset).ok_or_else(out_of_bounds)?;
            let next = read_u32(bytes, offset + 4).ok_or_else(out_of_bounds)?;
            match u32::from(id) {
                VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE if info.iova_ranges.is_none() => {
                    info.iova_ranges = Some(parse_iova_ranges(bytes, offset)?);
                }
                VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL if info.dma_avail.is_none() => {
                    let at = offset + std::mem::offset_of!(vfio_iommu_type1_info_dma_avail, avail);
                    info.dma_avail = Some(read_u32(bytes, at).ok_or_else(out_of_bounds)?);
                }
                _ => {}
            }
            if next == 0 {
                return Ok(info);
            }
            let next = usize::try_from(next).unwrap_or(usize::MAX);
            if next <= offset {
                return Err(defect(offset, InfoDefect::ChainNotAscending));
            }
            offset = next;
        }
    }
}

/// Parses the IOVA-range capability at `offset`.
fn parse_iova_ranges(bytes: &[u8], offset: usize) -> Result<Vec<IovaRange>, Error> {
    let out_of_bounds = || Error::MalformedInfo {
        offset,
        defect: InfoDefect::CapOutOfBounds,
    };
    let count_at = offset + std::mem::offset_of!(vfio_iommu_type1_info_cap_iova_range, nr_iovas);
    let count = read_u32(bytes, count_at).ok_or_else(out_of_bounds)?;
    let count = usize::try_from(count).map_err(|_| out_of_bounds())?;
    let first = offset + size_of::<vfio_iommu_type1_info_cap_iova_range>();
    let entry = size_of::<vfio_iova_range>();
    // Bounds-check the whole array before allocating for it.
    if count
        .checked_mul(entry)
        .and_then(|len| first.checked_add(len))
        .is_none_or(|end| end > bytes.len())
    {
        return Err(out_of_bounds());
    }
    let mut ranges = Vec::with_capacity(count);
    for index in 0..count {
        let at = first + index * entry;
        let start = read_u64(bytes, at).ok_or_else(out_of_bounds)?;
        let end = read_u64(bytes, at + 8).ok_or_else(out_of_bounds)?;
        let range = IovaRange::new(start, end).ok_or(Error::MalformedInfo {
            offset: at,
            defect: InfoDefect::InvertedRange,
        })?;
        ranges.push(range);
    }
    Ok(ranges)
}

/// Asks `ioctl` for the info, growing the buffer once if the capabilities did not fit.
fn read_info(ioctl: &dyn Type1Ioctl) -> Result<Type1Info, Error> {
    let mut len = size_of::<vfio_iommu_type1_info>();
    for _ in 0..3 {
        let mut buf = vec![0u8; len];
        let argsz = u32::try_from(len).map_err(|_| Error::MalformedInfo {
            offset: 0,
            defect: InfoDefect::TooLarge,
        })?;
        buf[..4].copy_from_slice(&argsz.to_ne_bytes());
        ioctl
            .get_info(&mut buf)
            .map_err(|source| Error::GetInfo { source })?;
        let wanted = read_u32(&buf, 0)
            .and_then(|argsz| usize::try_from(argsz).ok())
            .unwrap_or(usize::MAX);
        if wanted <= len {
            return Type1Info::parse(&buf);
        }
        if wanted > MAX_INFO_BYTES {
            break;
        }
        len = wanted;
    }
    Err(Error::MalformedInfo {
        offset: 0,
        defect: InfoDefect::TooLarge,
    })
}

/// The calls `Core` makes, through a `Type1Ioctl`.
#[derive(Debug)]
struct Type1Iommu {
    ioctl: Box<dyn Type1Ioctl>,
    /// Kernel unmaps that found the container without its IOMMU (see the module docs).
    /// A statistic: `Relaxed`, nothing is synchronised through it.
    unmaps_after_removal: AtomicU64,
}

impl Type1Iommu {
    /// Whether the container has lost its IOMMU (its last group left it), so that the kernel
    /// has unmapped everything: a `VFIO_IOMMU_GET_INFO` with a well-formed buffer, which type1
    /// always answers, fails with `EINVAL` only when the container has no IOMMU driver.
    fn iommu_released(&self) -> bool {
        let mut buf = [0u8; size_of::<vfio_iommu_type1_info>()];
        // The size of the info struct (24 bytes) fits in `argsz`.
        let argsz = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        buf[..4].copy_from_slice(&argsz.to_ne_bytes());
        let probe = self.ioctl.get_info(&mut buf);
        matches!(probe, Err(err) if err.raw_os_error() == Some(libc::EINVAL))
    }
}

impl Iommu for Type1Iommu {
    fn map(&self, vaddr: u64, iova: u64, len: u64, access: Access) -> io::Result<()> {
        self.ioctl.map_dma_with(vaddr, iova, len, access)
    }

    fn unmap(&self, iova: u64, len: u64) -> io::Result<u64> {
        match self.ioctl.unmap_dma(iova, len) {
            // The kernel dropped the mapping with the container's IOMMU: done, as asked.
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) && self.iommu_released() => {
                // Relaxed: a statistic.
                self.unmaps_after_removal.fetch_add(1, Ordering::Relaxed);
                Ok(len)
            }
            // Nothing was mapped there any more: the kernel dropped the mapping with the
            // container's last IOMMU domain before it let go of the IOMMU itself (seen when
            // a device is hot-unplugged). Its pages were unpinned with it: done, as asked.
            Ok(0) if len > 0 => {
                // Relaxed: a statistic.
                self.unmaps_after_removal.fetch_add(1, Ordering::Relaxed);
                Ok(len)
            }
            other => other,
        }
    }
}

/// The DMA address space of a VFIO type1 container. Cheap to clone (clones share the space).
#[derive(Debug, Clone)]
pub struct Type1 {
    core: Arc<Core<Type1Iommu>>,
    info: Arc<Type1Info>,
}

impl Type1 {
    /// The space of an already configured container (groups attached, `VFIO_SET_IOMMU` done),
    /// for a device with a `dma_mask_bits`-bit DMA mask. The space owns the fd from now on.
    pub fn new(container: OwnedFd, dma_mask_bits: u32) -> Result<Type1, Error> {
        Type1::with_ioctl(KernelType1::new(container), dma_mask_bits)
    }

    /// The space over any implementation of the container ioctls (a test double, typically).
    pub fn with_ioctl(
        ioctl: impl Type1Ioctl + 'static,
        dma_mask_bits: u32,
    ) -> Result<Type1, Error> {
        let info = read_info(&ioctl)?;
        let ranges = info.iova_ranges.clone().unwrap_or_else(|| {
            vec![IovaRange {
                start: 0,
                last: u64::MAX,
            }]
        });
        // The smallest IOMMU page: the lowest bit of the page-size bitmap.
        let min_page = match info.iova_pgsizes {
            Some(sizes) if sizes != 0 => 1u64 << sizes.trailing_zeros(),
            _ => u64_of(base_page_size()),
        };
        let limit = info.dma_avail.map_or(DEFAULT_DMA_ENTRY_LIMIT, u64::from);
        let iommu = Type1Iommu {
            ioctl: Box::new(ioctl),
            unmaps_after_removal: AtomicU64::new(0),
        };
        let core = Core::new(
            iommu,
            Kind::Type1,
            dma_mask_bits,
            &ranges,
            min_page,
            Some(limit),
        )?;
        Ok(Type1 {
            core: Arc::new(core),
            info: Arc::new(info),
        })
    }

    /// The container's IOMMU info as read at creation.
    pub fn info(&self) -> &Type1Info {
        &self.info
    }

    /// The IOVA ranges mappings are placed in: the kernel's valid ranges, clipped to the DMA mask,
    /// without IOVA page 0.
    pub fn usable_ranges(&self) -> Vec<IovaRange> {
        self.core.usable_ranges()
    }

    /// How many more kernel mappings this space may make.
    pub fn mappings_left(&self) -> u64 {
        self.core.entries_left().unwrap_or(u64::MAX)
    }
}

impl Space for Type1 {
    fn map(&self, region: Arc<Region>) -> Result<Mapping, Error> {
        self.core.map(region, Access::ReadWrite)
    }

    fn map_with(&self, region: Arc<Region>, access: Access) -> Result<Mapping, Error> {
        self.core.map(region, access)
    }

    fn stats(&self) -> Stats {
        let mut stats = self.core.stats();
        // Relaxed: a statistic.
        stats.unmaps_after_removal = self
            .core
            .iommu()
            .unmaps_after_removal
            .load(Ordering::Relaxed);
        stats
    }

    fn kind(&self) -> Kind {
        Kind::Type1
    }

    fn dma_mask_bits(&self) -> u32 {
        self.core.mask_bits()
    }
}

#[cfg(test)]
mod tests;
