//! DMA address spaces: mapping pinned regions where a device can reach them, and volatile handles
//! to the memory a device reads and writes.
//!
//! A [`Space`] is "a device's DMA address space". Mapping a [`Region`] into it gives a
//! [`Mapping`]: it holds the region alive, knows the IOVA (the address the device uses) of every
//! byte in O(1), and is undone on drop. The spaces:
//!
//! | space | the device sees | mapping does |
//! |---|---|---|
//! | [`Type1`] | IOVAs of a VFIO type1 container | `VFIO_IOMMU_MAP_DMA` at IOVAs from the allocator, within the container's IOVA ranges and mapping-count limit |
//! | [`Iommufd`] | IOVAs of an iommufd IO address space | `IOMMU_IOAS_MAP` at fixed IOVAs from the allocator |
//! | [`Physical`] | physical addresses (UIO, no-IOMMU VFIO) | looks up `/proc/self/pagemap`, refuses non-contiguous pages |
//! | [`SoftIommu`] | IOVAs of a software device's own table (the loopback device's) | records IOVA -> host ranges; the device translates through it |
//!
//! The IOMMU-backed spaces and the loopback table place mappings with one [`IovaAllocator`]
//! logic: within the device's DMA mask, the kernel's valid IOVA ranges, aligned to the region's
//! page size. The raw ioctls sit in a private shim behind the [`Type1Ioctl`] and [`IommufdIoctl`]
//! traits, so tests drive the spaces with a double that simulates the kernel.
//!
//! Device-visible memory is never a `&[u8]`: [`Slice`] is a bounds-checked `{ptr, len,
//! lifetime}` handle with volatile reads and writes of [`Pod`] values and copy-in/copy-out.
//!
//! ```
//! use std::sync::Arc;
//! use userdma::dma::{SoftIommu, Space};
//! use userdma::memory::{PageSize, Region};
//!
//! # fn main() -> Result<(), userdma::dma::Error> {
//! let region = Region::builder(64 << 10).page_size(PageSize::Base).build();
//! let region = Arc::new(region.expect("64 KiB of locked memory"));
//! let space = SoftIommu::new(32)?;
//! let mapping = space.map(region)?;
//! let iova = mapping.iova(0x100).expect("in bounds");
//! mapping.slice().write(0x100, 0xfeed_u32)?;
//! // What the device sees at that IOVA:
//! let window = space.translate(iova, 4).expect("mapped");
//! assert_eq!(window.slice().read::<u32>(0)?, 0xfeed);
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::io;
use std::sync::Arc;

mod access;
mod address;
mod iommu;
mod iommufd;
mod iova;
mod mapping;
mod physical;
mod shim;
mod slice;
mod soft_iommu;
mod type1;

pub use self::access::Access;
pub use self::address::{DeviceOffset, Iova};
pub use self::iommufd::{Iommufd, IommufdIoctl};
pub use self::iova::{mask_of, IovaAllocator, IovaRange, RangeList};
pub use self::mapping::{Mapping, Stats};
pub use self::physical::Physical;
pub use self::slice::{Pod, Slice};
pub use self::soft_iommu::{Change, SoftIommu, Watching, Window};
pub use self::type1::{InfoDefect, Type1, Type1Info, Type1Ioctl, DEFAULT_DMA_ENTRY_LIMIT};

use crate::memory::{self, PageSize, Region};

/// A device's DMA address space: where a region must be mapped before the device can reach it.
///
/// `Arc` here is the standard library's: it is part of the public contract (a mapping owns an
/// `Arc<Region>` the caller may share), not a synchronisation algorithm loom would check.
pub trait Space: Send + Sync + fmt::Debug {
    /// Maps all of `region` once; the mapping is undone when the returned [`Mapping`] is dropped.
    fn map(&self, region: Arc<Region>) -> Result<Mapping, Error>;

    /// [`Space::map`] with what the device may do with the memory ([`Access`]).
    ///
    /// # Errors
    /// As [`Space::map`]; [`Error::AccessMode`] for a mode this space cannot enforce (every
    /// mode but read-write on a physical-address space).
    fn map_with(&self, region: Arc<Region>, access: Access) -> Result<Mapping, Error> {
        if access == Access::ReadWrite {
            return self.map(region);
        }
        Err(Error::AccessMode {
            kind: self.kind(),
            access,
        })
    }

    /// Maps all of `region` by file descriptor: the IOMMU maps the file behind it
    /// ([`Region::fd`], from byte 0) instead of its addresses, which stay the CPU's view of the
    /// same bytes. iommufd does (`IOMMU_IOAS_MAP_FILE`, Linux 6.13); the others cannot.
    ///
    /// # Errors
    /// [`Error::MapFile`] when the space or the kernel cannot map the file.
    fn map_file(&self, region: Arc<Region>, access: Access) -> Result<Mapping, Error> {
        let _ = (region, access);
        Err(Error::MapFile {
            kind: self.kind(),
            source: std::io::Error::from_raw_os_error(libc::ENOTTY),
        })
    }

    /// What the space has done so far, including unmap failures on drop.
    fn stats(&self) -> Stats;

    /// Which kind of space this is.
    fn kind(&self) -> Kind;

    /// The width of the device's DMA mask, in bits.
    fn dma_mask_bits(&self) -> u32;
}

/// The kinds of DMA address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A VFIO container with the type1 IOMMU ([`Type1`]).
    Type1,
    /// An iommufd IO address space ([`Iommufd`]).
    Iommufd,
    /// Physical addresses, no IOMMU ([`Physical`]).
    Physical,
    /// A software IOMMU, a simulated device's own table ([`SoftIommu`]).
    SoftIommu,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Type1 => "VFIO type1",
            Kind::Iommufd => "iommufd",
            Kind::Physical => "physical",
            Kind::SoftIommu => "software IOMMU",
        })
    }
}

/// What went wrong in this module. Each variant names the operation, the addresses and sizes
/// involved and, where there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A DMA mask width outside 1–64 bits.
    #[error("a DMA mask of {bits} bits is not possible: use 1 to 64 (e.g. 28 for QEMU's edu device, 32, 48, 64)")]
    InvalidDmaMask {
        /// The width given.
        bits: u32,
    },

    /// An IOVA request of zero bytes or with an alignment that is not a power of two.
    #[error("cannot allocate {size:#x} bytes of IOVA aligned to {align:#x}: the size must be positive and the alignment a power of two")]
    InvalidIovaRequest {
        /// Bytes asked for.
        size: u64,
        /// Alignment asked for.
        align: u64,
    },

    /// No free IOVA range holds the request.
    #[error(
        "no IOVA space for {size:#x} bytes aligned to {align:#x} under a {mask_bits}-bit DMA mask \
         in ranges {ranges} (free now: {free}); unmap something, map smaller regions, or use a \
         device with a wider DMA mask"
    )]
    IovaExhausted {
        /// Bytes asked for.
        size: u64,
        /// Alignment asked for.
        align: u64,
        /// The device's DMA mask width.
        mask_bits: u32,
        /// The usable ranges (the kernel's, clipped to the mask).
        ranges: RangeList,
        /// What was free when the request failed.
        free: RangeList,
    },

    /// A specific IOVA range is not free.
    #[error("IOVA range {range} is not free under a {mask_bits}-bit DMA mask in ranges {ranges}")]
    IovaUnavailable {
        /// The range asked for.
        range: IovaRange,
        /// The device's DMA mask width.
        mask_bits: u32,
        /// The usable ranges.
        ranges: RangeList,
    },

    /// Freeing an IOVA that was not allocated (or was freed already).
    #[error("IOVA {iova:#x} is not the start of a live allocation")]
    UnknownIova {
        /// The IOVA given.
        iova: u64,
    },

    /// The container's mapping-count limit would be exceeded.
    #[error(
        "the VFIO container allows {limit} DMA mappings and {available} are left, but this region \
         needs {needed}: map fewer, larger regions (hugepages), or raise the limit with \
         `modprobe vfio_iommu_type1 dma_entry_limit=N`"
    )]
    MappingLimit {
        /// Kernel mappings the region needs.
        needed: u64,
        /// Kernel mappings left.
        available: u64,
        /// The container's limit when the space was made.
        limit: u64,
    },

    /// An access mode the space cannot enforce ([`Space::map_with`]).
    #[error(
        "a {access} mapping cannot be enforced on a {kind} space (no IOMMU checks the device's \
         accesses): map it read-write, or put the device behind an IOMMU (VFIO type1 or iommufd)"
    )]
    AccessMode {
        /// The space.
        kind: Kind,
        /// The mode asked for.
        access: Access,
    },

    /// The space cannot map memory by file descriptor, or the kernel refused this file.
    #[error(
        "{kind} cannot map this file by descriptor ({source}): iommufd's IOMMU_IOAS_MAP_FILE \
         takes memfds from Linux 6.13 and dma-bufs from Linux 6.19 (only from exporters that \
         allow it, such as vfio-pci's MMIO dma-bufs); VFIO type1 and software spaces map by \
         address only"
    )]
    MapFile {
        /// The space.
        kind: Kind,
        /// The kernel's answer (`ENOTTY`: no such ioctl; `EINVAL`/`EOPNOTSUPP`: not this file).
        source: std::io::Error,
    },

    /// The region's pages are smaller than the IOMMU's smallest page.
    #[error("{kind} IOMMU pages are at least {iommu_page:#x} bytes, larger than the region's {page_size} pages: use hugepages")]
    IommuPageSize {
        /// The space.
        kind: Kind,
        /// The region's page size.
        page_size: PageSize,
        /// The IOMMU's smallest page.
        iommu_page: u64,
    },

    /// `VFIO_IOMMU_GET_INFO` failed.
    #[error("VFIO_IOMMU_GET_INFO on the container failed: is VFIO_SET_IOMMU done (type1v2)?")]
    GetInfo {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// The `VFIO_IOMMU_GET_INFO` reply is malformed.
    #[error("malformed VFIO_IOMMU_GET_INFO reply at byte {offset}: {defect}")]
    MalformedInfo {
        /// Byte offset of the defect.
        offset: usize,
        /// What is wrong.
        defect: InfoDefect,
    },

    /// `IOMMU_IOAS_ALLOC` failed.
    #[error("IOMMU_IOAS_ALLOC failed: is /dev/iommu an iommufd (Linux 6.2+)?")]
    IoasAlloc {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// `IOMMU_IOAS_IOVA_RANGES` failed.
    #[error("IOMMU_IOAS_IOVA_RANGES of IOAS {ioas} failed")]
    IovaRanges {
        /// The IOAS.
        ioas: u32,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// The kernel refused to map.
    #[error(
        "{kind} map of {len:#x} bytes at IOVA {iova:#x} failed (ENOMEM usually means \
         RLIMIT_MEMLOCK is too low for the pinned pages: raise it with `ulimit -l`)"
    )]
    Map {
        /// The space.
        kind: Kind,
        /// The IOVA.
        iova: u64,
        /// The length.
        len: u64,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A region without a file descriptor mapped for a device that reaches memory only through
    /// shared files (an out-of-process loopback device).
    #[error(
        "the {len:#x}-byte region is anonymous memory, which an out-of-process {kind} device \
         cannot reach: build it with `Region::builder(..).memfd()` or on a hugetlbfs file"
    )]
    NotShareable {
        /// The space.
        kind: Kind,
        /// The region's length.
        len: u64,
    },

    /// The space cannot be used for DMA at all (for example physical addresses for a device the
    /// IOMMU translates); the cause says why and what to do.
    #[error("the {kind} DMA space refuses to map {len:#x} bytes")]
    Refused {
        /// The space.
        kind: Kind,
        /// The region's length.
        len: u64,
        /// Why, and what to do.
        #[source]
        source: io::Error,
    },

    /// The kernel refused to unmap; the IOVA range stays reserved.
    #[error("{kind} unmap of {len:#x} bytes at IOVA {iova:#x} failed; the range stays reserved")]
    Unmap {
        /// The space.
        kind: Kind,
        /// The IOVA.
        iova: u64,
        /// The length.
        len: u64,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// The kernel unmapped a different number of bytes than asked; the range stays reserved.
    #[error(
        "{kind} unmap of {len:#x} bytes at IOVA {iova:#x} removed {unmapped:#x} bytes; the range \
         stays reserved"
    )]
    UnmapIncomplete {
        /// The space.
        kind: Kind,
        /// The IOVA.
        iova: u64,
        /// The length asked for.
        len: u64,
        /// The length the kernel reported.
        unmapped: u64,
    },

    /// An unmap failed; the same error is kept as the space's last unmap error ([`Stats`]).
    #[error("unmapping failed")]
    UnmapFailed {
        /// The failure, shared with [`Stats::last_unmap_error`].
        #[source]
        source: Arc<Error>,
    },

    /// The region's physical addresses cannot be used.
    #[error("the region cannot be used for physical-address DMA")]
    Physical {
        /// Why (not contiguous, hidden addresses, ...).
        #[source]
        source: memory::Error,
    },

    /// A physical page lies above the device's DMA mask.
    #[error(
        "the page at offset {offset:#x} is at physical address {addr:#x}, beyond the device's \
         {mask_bits}-bit DMA mask: reserve hugepages early (at boot, or on a low NUMA node), or \
         use an IOMMU"
    )]
    BeyondMask {
        /// Byte offset of the page in the region.
        offset: usize,
        /// Its physical address.
        addr: u64,
        /// The device's DMA mask width.
        mask_bits: u32,
    },

    /// An access outside a [`Slice`] or [`Mapping`].
    #[error("{len} bytes at offset {offset} are outside the {size}-byte buffer")]
    OutOfBounds {
        /// Offset of the access.
        offset: usize,
        /// Its length.
        len: usize,
        /// The buffer's length.
        size: usize,
    },

    /// A value access at an offset not aligned for its type.
    #[error("offset {offset} is not aligned to {align} bytes for this value")]
    Misaligned {
        /// Offset of the access.
        offset: usize,
        /// The alignment the type needs.
        align: usize,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::InvalidDmaMask { .. }
            | Error::InvalidIovaRequest { .. }
            | Error::OutOfBounds { .. }
            | Error::Misaligned { .. }
            | Error::BeyondMask { .. } => Code::InvalidArgument,
            Error::IovaExhausted { .. } | Error::MappingLimit { .. } => Code::Exhausted,
            // The exact range asked for is held by a live allocation.
            Error::IovaUnavailable { .. } => Code::Busy,
            Error::UnknownIova { .. } => Code::NotFound,
            Error::Refused { .. } => Code::Refused,
            Error::NotShareable { .. }
            | Error::IommuPageSize { .. }
            | Error::AccessMode { .. }
            | Error::MapFile { .. } => Code::Unsupported,
            Error::GetInfo { .. }
            | Error::MalformedInfo { .. }
            | Error::IoasAlloc { .. }
            | Error::IovaRanges { .. }
            | Error::Map { .. }
            | Error::Unmap { .. }
            | Error::UnmapIncomplete { .. } => Code::System,
            Error::UnmapFailed { source } => source.code(),
            Error::Physical { source } => source.code(),
        }
    }
}
