//! What VFIO says about a device: its regions ([`RegionInfo`], with the capability chain of
//! `VFIO_DEVICE_GET_REGION_INFO` parsed: sparse mmap areas, region type, MSI-X mappable) and its
//! interrupt indexes ([`IrqInfo`]). The parsers are pure functions of the kernel's bytes, never
//! panic, and are fuzzed.

use std::fmt;
use std::mem::{offset_of, size_of};

use userdma_sys::vfio::{
    vfio_info_cap_header, vfio_irq_info, vfio_region_info, vfio_region_info_cap_sparse_mmap,
    vfio_region_info_cap_type, vfio_region_sparse_mmap_area, VFIO_IRQ_INFO_AUTOMASKED,
    VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE, VFIO_IRQ_INFO_NORESIZE,
    VFIO_REGION_INFO_CAP_MSIX_MAPPABLE, VFIO_REGION_INFO_CAP_SPARSE_MMAP,
    VFIO_REGION_INFO_CAP_TYPE, VFIO_REGION_INFO_FLAG_CAPS, VFIO_REGION_INFO_FLAG_MMAP,
    VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};

/// Most sparse areas accepted in one capability (a real region has a handful).
pub const MAX_SPARSE_AREAS: u32 = 1 << 12;

/// One part of a region the kernel allows to be mapped (`vfio_region_sparse_mmap_area`), in
/// bytes from the region's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SparseArea {
    /// Offset from the start of the region.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
}

/// A device region (a BAR, the ROM, config space, VGA), as `VFIO_DEVICE_GET_REGION_INFO`
/// reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RegionInfo {
    /// The region index (`VFIO_PCI_BAR0_REGION_INDEX` ..).
    pub index: u32,
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
    /// Size in bytes (0: the device does not have it).
    pub size: u64,
    /// Where the region starts in the device fd (for `pread`/`pwrite`/`mmap`).
    pub offset: u64,
    /// The parts that may be mapped, when the kernel restricts mapping
    /// (`VFIO_REGION_INFO_CAP_SPARSE_MMAP`); `None`: the whole region if
    /// [`mappable`](Self::mappable).
    pub sparse: Option<Vec<SparseArea>>,
    /// `(type, subtype)` of a device-specific region (`VFIO_REGION_INFO_CAP_TYPE`).
    pub region_type: Option<(u32, u32)>,
    /// Whether the MSI-X table in this BAR may be mapped (`VFIO_REGION_INFO_CAP_MSIX_MAPPABLE`).
    pub msix_mappable: bool,
}

impl RegionInfo {
    /// Whether the region can be read (`pread`).
    pub fn readable(&self) -> bool {
        self.flags & VFIO_REGION_INFO_FLAG_READ != 0
    }

    /// Whether the region can be written (`pwrite`).
    pub fn writable(&self) -> bool {
        self.flags & VFIO_REGION_INFO_FLAG_WRITE != 0
    }

    /// Whether (some of) the region can be mapped (`mmap`).
    pub fn mappable(&self) -> bool {
        self.flags & VFIO_REGION_INFO_FLAG_MMAP != 0
    }

    /// The parts of the region that may be mapped: the sparse areas (clipped to the region),
    /// the whole region, or none.
    pub fn mmap_areas(&self) -> Vec<SparseArea> {
        if !self.mappable() || self.size == 0 {
            return Vec::new();
        }
        match &self.sparse {
            None => vec![SparseArea {
                offset: 0,
                size: self.size,
            }],
            Some(areas) => areas
                .iter()
                .filter(|a| a.size > 0)
                .filter(|a| a.offset.checked_add(a.size).is_some_and(|e| e <= self.size))
                .copied()
                .collect(),
        }
    }

    /// The flags as text: `read write mmap caps`.
    pub fn flag_names(&self) -> String {
        let mut names = Vec::new();
        for (bit, name) in [
            (VFIO_REGION_INFO_FLAG_READ, "read"),
            (VFIO_REGION_INFO_FLAG_WRITE, "write"),
            (VFIO_REGION_INFO_FLAG_MMAP, "mmap"),
            (VFIO_REGION_INFO_FLAG_CAPS, "caps"),
        ] {
            if self.flags & bit != 0 {
                names.push(name);
            }
        }
        names.join(" ")
    }

    /// Parses a `VFIO_DEVICE_GET_REGION_INFO` reply: the info struct and, if flagged, its
    /// capability chain, every offset bounds-checked and required to point forward (so any
    /// input terminates). Unknown capabilities are skipped; of a repeated one the first counts.
    pub fn parse(bytes: &[u8]) -> Result<RegionInfo, RegionDefect> {
        let header_len = size_of::<vfio_region_info>();
        if bytes.len() < header_len {
            return Err(RegionDefect::TooShort { len: bytes.len() });
        }
        let short = RegionDefect::TooShort { len: bytes.len() };
        let flags = read_u32(bytes, offset_of!(vfio_region_info, flags)).ok_or(short)?;
        let index = read_u32(bytes, offset_of!(vfio_region_info, index)).ok_or(short)?;
        let cap_offset = read_u32(bytes, offset_of!(vfio_region_info, cap_offset)).ok_or(short)?;
        let size = read_u64(bytes, offset_of!(vfio_region_info, size)).ok_or(short)?;
        let offset = read_u64(bytes, offset_of!(vfio_region_info, offset)).ok_or(short)?;
        let mut info = RegionInfo {
            index,
            flags,
            size,
            offset,
            sparse: None,
            region_type: None,
            msix_mappable: false,
        };
        if flags & VFIO_REGION_INFO_FLAG_CAPS == 0 || cap_offset == 0 {
            return Ok(info);
        }
        let mut at = usize::try_from(cap_offset).unwrap_or(usize::MAX);
        let mut seen_msix = false;
        loop {
            if at < header_len {
                return Err(RegionDefect::CapInsideHeader { offset: at });
            }
            if at % 4 != 0 {
                return Err(RegionDefect::Misaligned { offset: at });
            }
            let out = RegionDefect::CapOutOfBounds { offset: at };
            let cap_header = size_of::<vfio_info_cap_header>();
            if at
                .checked_add(cap_header)
                .is_none_or(|end| end > bytes.len())
            {
                return Err(out);
            }
            let id = read_u16(bytes, at + offset_of!(vfio_info_cap_header, id)).ok_or(out)?;
            let next = read_u32(bytes, at + offset_of!(vfio_info_cap_header, next)).ok_or(out)?;
            match u32::from(id) {
                VFIO_REGION_INFO_CAP_SPARSE_MMAP if info.sparse.is_none() => {
                    info.sparse = Some(parse_sparse(bytes, at)?);
                }
                VFIO_REGION_INFO_CAP_TYPE if info.region_type.is_none() => {
                    if at
                        .checked_add(size_of::<vfio_region_info_cap_type>())
                        .is_none_or(|end| end > bytes.len())
                    {
                        return Err(out);
                    }
                    let ty = read_u32(bytes, at + offset_of!(vfio_region_info_cap_type, type_))
                        .ok_or(out)?;
                    let sub = read_u32(bytes, at + offset_of!(vfio_region_info_cap_type, subtype))
                        .ok_or(out)?;
                    info.region_type = Some((ty, sub));
                }
                VFIO_REGION_INFO_CAP_MSIX_MAPPABLE if !seen_msix => {
                    seen_msix = true;
                    info.msix_mappable = true;
                }
                _ => {}
            }
            if next == 0 {
                return Ok(info);
            }
            let next = usize::try_from(next).unwrap_or(usize::MAX);
            if next <= at {
                return Err(RegionDefect::ChainNotAscending { offset: at });
            }
            at = next;
        }
    }
}

/// Parses the sparse-mmap capability at `at`.
fn parse_sparse(bytes: &[u8], at: usize) -> Result<Vec<SparseArea>, RegionDefect> {
    let out = RegionDefect::CapOutOfBounds { offset: at };
    let count = read_u32(
        bytes,
        at + offset_of!(vfio_region_info_cap_sparse_mmap, nr_areas),
    )
    .ok_or(out)?;
    if count > MAX_SPARSE_AREAS {
        return Err(RegionDefect::TooManyAreas { offset: at, count });
    }
    let count = usize::try_from(count).map_err(|_| out)?;
    let first = at + size_of::<vfio_region_info_cap_sparse_mmap>();
    let entry = size_of::<vfio_region_sparse_mmap_area>();
    if count
        .checked_mul(entry)
        .and_then(|len| first.checked_add(len))
        .is_none_or(|end| end > bytes.len())
    {
        return Err(out);
    }
    let mut areas = Vec::with_capacity(count);
    for i in 0..count {
        let base = first + i * entry;
        let offset = read_u64(
            bytes,
            base + offset_of!(vfio_region_sparse_mmap_area, offset),
        )
        .ok_or(out)?;
        let size =
            read_u64(bytes, base + offset_of!(vfio_region_sparse_mmap_area, size)).ok_or(out)?;
        if offset.checked_add(size).is_none() {
            return Err(RegionDefect::AreaOverflows { offset: base });
        }
        areas.push(SparseArea { offset, size });
    }
    Ok(areas)
}

/// Why a `VFIO_DEVICE_GET_REGION_INFO` reply could not be parsed (offsets are bytes into the
/// reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionDefect {
    /// Shorter than `vfio_region_info`.
    TooShort {
        /// The reply's length.
        len: usize,
    },
    /// A capability points into the info struct itself.
    CapInsideHeader {
        /// The capability's offset.
        offset: usize,
    },
    /// A capability is not 4-byte aligned.
    Misaligned {
        /// The capability's offset.
        offset: usize,
    },
    /// A capability, or its payload, runs past the end of the reply.
    CapOutOfBounds {
        /// The capability's offset.
        offset: usize,
    },
    /// A capability's `next` does not point forward (the chain could loop).
    ChainNotAscending {
        /// The capability's offset.
        offset: usize,
    },
    /// A sparse-mmap capability lists implausibly many areas.
    TooManyAreas {
        /// The capability's offset.
        offset: usize,
        /// The count it gives.
        count: u32,
    },
    /// A sparse area's `offset + size` overflows.
    AreaOverflows {
        /// The area's offset in the reply.
        offset: usize,
    },
    /// The kernel asked for a buffer larger than any real reply.
    TooLarge {
        /// The size asked for.
        argsz: u32,
    },
}

impl fmt::Display for RegionDefect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionDefect::TooShort { len } => {
                write!(f, "{len} bytes, shorter than vfio_region_info")
            }
            RegionDefect::CapInsideHeader { offset } => {
                write!(f, "capability at byte {offset} is inside the info header")
            }
            RegionDefect::Misaligned { offset } => {
                write!(f, "capability at byte {offset} is not 4-byte aligned")
            }
            RegionDefect::CapOutOfBounds { offset } => {
                write!(f, "capability at byte {offset} runs past the end of the reply")
            }
            RegionDefect::ChainNotAscending { offset } => {
                write!(f, "capability at byte {offset} does not point forward")
            }
            RegionDefect::TooManyAreas { offset, count } => write!(
                f,
                "sparse-mmap capability at byte {offset} lists {count} areas (at most {MAX_SPARSE_AREAS})"
            ),
            RegionDefect::AreaOverflows { offset } => {
                write!(f, "sparse area at byte {offset} ends past 2^64")
            }
            RegionDefect::TooLarge { argsz } => {
                write!(f, "the kernel asked for {argsz} bytes, implausibly many")
            }
        }
    }
}

/// One interrupt index (INTx, MSI, MSI-X, error, request), as `VFIO_DEVICE_GET_IRQ_INFO`
/// reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct IrqInfo {
    /// The index (`VFIO_PCI_INTX_IRQ_INDEX` ..).
    pub index: u32,
    /// `VFIO_IRQ_INFO_*`.
    pub flags: u32,
    /// How many vectors the index has (0: none).
    pub count: u32,
}

impl IrqInfo {
    /// From the kernel's struct.
    pub fn from_raw(raw: &vfio_irq_info) -> IrqInfo {
        IrqInfo {
            index: raw.index,
            flags: raw.flags,
            count: raw.count,
        }
    }

    /// Parses a `VFIO_DEVICE_GET_IRQ_INFO` reply (`None` if shorter than `vfio_irq_info`).
    pub fn parse(bytes: &[u8]) -> Option<IrqInfo> {
        if bytes.len() < size_of::<vfio_irq_info>() {
            return None;
        }
        Some(IrqInfo {
            flags: read_u32(bytes, offset_of!(vfio_irq_info, flags))?,
            index: read_u32(bytes, offset_of!(vfio_irq_info, index))?,
            count: read_u32(bytes, offset_of!(vfio_irq_info, count))?,
        })
    }

    /// Whether vectors can be signalled through eventfds.
    pub fn eventfd(&self) -> bool {
        self.flags & VFIO_IRQ_INFO_EVENTFD != 0
    }

    /// Whether vectors can be masked and unmasked (`VFIO_IRQ_SET_ACTION_MASK`/`UNMASK`).
    pub fn maskable(&self) -> bool {
        self.flags & VFIO_IRQ_INFO_MASKABLE != 0
    }

    /// Whether the kernel masks the vector when it fires (INTx): unmask after each interrupt.
    pub fn automasked(&self) -> bool {
        self.flags & VFIO_IRQ_INFO_AUTOMASKED != 0
    }

    /// Whether the vector count is fixed once enabled (more vectors need a disable first).
    pub fn noresize(&self) -> bool {
        self.flags & VFIO_IRQ_INFO_NORESIZE != 0
    }

    /// The flags as text: `eventfd maskable automasked noresize`.
    pub fn flag_names(&self) -> String {
        let mut names = Vec::new();
        for (on, name) in [
            (self.eventfd(), "eventfd"),
            (self.maskable(), "maskable"),
            (self.automasked(), "automasked"),
            (self.noresize(), "noresize"),
        ] {
            if on {
                names.push(name);
            }
        }
        names.join(" ")
    }
}

/// Reads a native-endian integer at `offset`, if in bounds.
pub(crate) fn read_u16(bytes: &[u8], offset: usize) -> Option<u16> {
    let end = offset.checked_add(2)?;
    Some(u16::from_ne_bytes(bytes.get(offset..end)?.try_into().ok()?))
}

pub(crate) fn read_u32(bytes: &[u8], offset: usize) -> Option<u32> {
    let end = offset.checked_add(4)?;
    Some(u32::from_ne_bytes(bytes.get(offset..end)?.try_into().ok()?))
}

pub(crate) fn read_u64(bytes: &[u8], offset: usize) -> Option<u64> {
    let end = offset.checked_add(8)?;
    Some(u64::from_ne_bytes(bytes.get(offset..end)?.try_into().ok()?))
}

/// Writes a native-endian integer at `offset` of `bytes` (which the caller sized).
pub(crate) fn put(bytes: &mut [u8], offset: usize, value: &[u8]) {
    if let Some(slot) = offset
        .checked_add(value.len())
        .and_then(|end| bytes.get_mut(offset..end))
    {
        slot.copy_from_slice(value);
    }
}

#[cfg(test)]
pub(crate) mod tests;
