//! The IOVA allocator shared by the IOMMU-backed spaces and the loopback table: hands out ranges
//! of IO virtual addresses that a device with a given DMA mask can reach, inside the ranges the
//! kernel allows, aligned (to the hugepage size, so the IOMMU can use large page-table entries),
//! and coalesces them back when freed. Pure logic; fuzzed against a model in
//! `fuzz/fuzz_targets/dma_iova.rs`.

use std::collections::BTreeMap;
use std::fmt;

use super::Error;

/// An inclusive range of IOVAs, `start..=last` (inclusive so that the top of the 64-bit space is
/// representable, as in the kernel's own `vfio_iova_range` and `iommu_iova_range`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IovaRange {
    /// The first IOVA.
    pub start: u64,
    /// The last IOVA (inclusive).
    pub last: u64,
}

impl IovaRange {
    /// `start..=last`; `None` if `last < start`.
    pub fn new(start: u64, last: u64) -> Option<IovaRange> {
        (start <= last).then_some(IovaRange { start, last })
    }

    /// `len` bytes from `start`; `None` if `len` is 0 or the range passes the top of the space.
    pub fn from_len(start: u64, len: u64) -> Option<IovaRange> {
        let last = start.checked_add(len.checked_sub(1)?)?;
        Some(IovaRange { start, last })
    }

    /// Bytes in the range (up to 2^64, hence `u128`).
    pub fn size(&self) -> u128 {
        u128::from(self.last - self.start) + 1
    }

    /// Whether `iova` is in the range.
    pub fn contains(&self, iova: u64) -> bool {
        self.start <= iova && iova <= self.last
    }

    /// Whether all of `other` is in the range.
    pub fn covers(&self, other: &IovaRange) -> bool {
        self.start <= other.start && other.last <= self.last
    }
}

impl fmt::Display for IovaRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}..={:#x}", self.start, self.last)
    }
}

/// A list of ranges, displayed as `[a..=b, c..=d]` in errors.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RangeList(pub Vec<IovaRange>);

impl fmt::Display for RangeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, range) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{range}")?;
        }
        f.write_str("]")
    }
}

/// The highest IOVA a device with a `bits`-bit DMA mask can address.
pub fn mask_of(bits: u32) -> Result<u64, Error> {
    match bits {
        64 => Ok(u64::MAX),
        1..=63 => Ok((1u64 << bits) - 1),
        _ => Err(Error::InvalidDmaMask { bits }),
    }
}

/// Sorts, merges (overlapping or adjacent) and clips `ranges` to `0..=mask`.
pub(crate) fn normalize(ranges: &[IovaRange], mask: u64) -> Vec<IovaRange> {
    let mut clipped: Vec<IovaRange> = ranges
        .iter()
        .filter(|range| range.start <= range.last && range.start <= mask)
        .map(|range| IovaRange {
            start: range.start,
            last: range.last.min(mask),
        })
        .collect();
    clipped.sort_unstable();
    let mut merged: Vec<IovaRange> = Vec::with_capacity(clipped.len());
    for range in clipped {
        match merged.last_mut() {
            // Touching or overlapping the previous range (`last + 1 >= start`, written so that
            // `last == u64::MAX` cannot overflow).
            Some(prev) if range.start <= prev.last || range.start - prev.last == 1 => {
                prev.last = prev.last.max(range.last);
            }
            _ => merged.push(range),
        }
    }
    merged
}

/// `value` rounded up to a multiple of `align` (a power of two); `None` on overflow.
fn align_up(value: u64, align: u64) -> Option<u64> {
    Some(value.checked_add(align - 1)? & !(align - 1))
}

/// Hands out aligned IOVA ranges inside the usable space: the kernel's valid ranges clipped to the
/// device's DMA mask. First fit, lowest address first; freed ranges coalesce with free neighbours.
#[derive(Debug, Clone)]
pub struct IovaAllocator {
    mask_bits: u32,
    usable: Vec<IovaRange>,
    /// Free ranges: start -> last. Never adjacent to each other (they are coalesced).
    free: BTreeMap<u64, u64>,
    /// Allocations: start -> last.
    allocated: BTreeMap<u64, u64>,
}

impl IovaAllocator {
    /// An allocator for a device with a `mask_bits`-bit DMA mask (1–64: 28 for QEMU's edu
    /// device, 32, 48, 64) over the kernel's valid `ranges` (unsorted, possibly overlapping; the
    /// parts above the mask are dropped). No ranges means nothing can be allocated.
    pub fn new(mask_bits: u32, ranges: &[IovaRange]) -> Result<IovaAllocator, Error> {
        let mask = mask_of(mask_bits)?;
        let usable = normalize(ranges, mask);
        let free = usable
            .iter()
            .map(|range| (range.start, range.last))
            .collect();
        Ok(IovaAllocator {
            mask_bits,
            usable,
            free,
            allocated: BTreeMap::new(),
        })
    }

    /// The DMA mask width in bits.
    pub fn mask_bits(&self) -> u32 {
        self.mask_bits
    }

    /// The highest reachable IOVA.
    pub fn mask(&self) -> u64 {
        // mask_bits was validated in `new`.
        mask_of(self.mask_bits).unwrap_or(u64::MAX)
    }

    /// The usable ranges: sorted, disjoint, non-adjacent, within the mask.
    pub fn usable(&self) -> &[IovaRange] {
        &self.usable
    }

    /// The free ranges, ascending.
    pub fn free_ranges(&self) -> impl Iterator<Item = IovaRange> + '_ {
        self.free
            .iter()
            .map(|(&start, &last)| IovaRange { start, last })
    }

    /// The allocated ranges, ascending.
    pub fn allocations(&self) -> impl Iterator<Item = IovaRange> + '_ {
        self.allocated
            .iter()
            .map(|(&start, &last)| IovaRange { start, last })
    }

    /// Number of live allocations.
    pub fn allocation_count(&self) -> usize {
        self.allocated.len()
    }

    fn check_request(size: u64, align: u64) -> Result<(), Error> {
        if size == 0 || !align.is_power_of_two() {
            return Err(Error::InvalidIovaRequest { size, align });
        }
        Ok(())
    }

    fn exhausted(&self, size: u64, align: u64) -> Error {
        Error::IovaExhausted {
            size,
            align,
            mask_bits: self.mask_bits,
            ranges: RangeList(self.usable.clone()),
            free: RangeList(self.free_ranges().collect()),
        }
    }

    /// Allocates `size` bytes at an IOVA aligned to `align` (a power of two), the lowest that fits.
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<u64, Error> {
        Self::check_request(size, align)?;
        let found = self.free.iter().find_map(|(&start, &last)| {
            let iova = align_up(start, align)?;
            let end = iova.checked_add(size - 1)?;
            (iova <= last && end <= last).then_some((start, iova, end))
        });
        let (free_start, iova, end) = found.ok_or_else(|| self.exhausted(size, align))?;
        self.take(free_start, iova, end);
        Ok(iova)
    }

    /// Allocates the first aligned piece of at most `max_size` bytes, a multiple of `align` and at
    /// least `align` long: as much of `max_size` as the lowest fitting free range holds. Returns
    /// the piece. Used to scatter a mapping over several ranges when no single one holds it.
    pub fn alloc_partial(&mut self, max_size: u64, align: u64) -> Result<IovaRange, Error> {
        Self::check_request(max_size, align)?;
        if max_size < align {
            return Err(Error::InvalidIovaRequest {
                size: max_size,
                align,
            });
        }
        let found = self.free.iter().find_map(|(&start, &last)| {
            let iova = align_up(start, align)?;
            if iova > last {
                return None;
            }
            // Bytes from `iova` to the end of the free range, rounded down to whole `align`s.
            let room = (u128::from(last - iova) + 1) & !u128::from(align - 1);
            let max_whole = u128::from(max_size) & !u128::from(align - 1);
            let size = u64::try_from(room.min(max_whole)).ok()?;
            (size >= align).then(|| (start, iova, iova + (size - 1)))
        });
        let (free_start, iova, end) = found.ok_or_else(|| self.exhausted(align, align))?;
        self.take(free_start, iova, end);
        Ok(IovaRange {
            start: iova,
            last: end,
        })
    }

    /// Marks `iova..=end`, inside the free range starting at `free_start`, as allocated.
    fn take(&mut self, free_start: u64, iova: u64, end: u64) {
        if let Some(free_last) = self.free.remove(&free_start) {
            if free_start < iova {
                self.free.insert(free_start, iova - 1);
            }
            if end < free_last {
                self.free.insert(end + 1, free_last);
            }
            self.allocated.insert(iova, end);
        }
    }

    /// Allocates exactly `range` (it must be entirely free), e.g. to re-register mappings that
    /// already exist after the usable ranges changed.
    pub fn reserve(&mut self, range: IovaRange) -> Result<(), Error> {
        let holder = self
            .free
            .range(..=range.start)
            .next_back()
            .map(|(&start, &last)| (start, last));
        match holder {
            Some((start, last)) if last >= range.last => {
                self.take(start, range.start, range.last);
                Ok(())
            }
            _ => Err(Error::IovaUnavailable {
                range,
                mask_bits: self.mask_bits,
                ranges: RangeList(self.usable.clone()),
            }),
        }
    }

    /// Frees the allocation starting at `iova`; returns its range.
    pub fn free(&mut self, iova: u64) -> Result<IovaRange, Error> {
        let last = self
            .allocated
            .remove(&iova)
            .ok_or(Error::UnknownIova { iova })?;
        let mut start = iova;
        let mut end = last;
        // Coalesce with the free range just below, if it ends right before `start`.
        let below = self.free.range(..start).next_back().map(|(&s, &l)| (s, l));
        if let Some((below_start, below_last)) = below {
            if below_last.checked_add(1) == Some(start) {
                self.free.remove(&below_start);
                start = below_start;
            }
        }
        // ... and with the one just above, if it starts right after `end`.
        if let Some(above_start) = end.checked_add(1) {
            if let Some(above_last) = self.free.remove(&above_start) {
                end = above_last;
            }
        }
        self.free.insert(start, end);
        Ok(IovaRange { start: iova, last })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: u64, last: u64) -> IovaRange {
        IovaRange::new(start, last).unwrap()
    }

    #[test]
    fn mask_bits_are_validated() {
        assert_eq!(mask_of(28).unwrap(), 0x0FFF_FFFF);
        assert_eq!(mask_of(64).unwrap(), u64::MAX);
        assert!(matches!(mask_of(0), Err(Error::InvalidDmaMask { bits: 0 })));
        assert!(matches!(
            mask_of(65),
            Err(Error::InvalidDmaMask { bits: 65 })
        ));
    }

    #[test]
    fn ranges_are_sorted_merged_and_clipped() {
        let ranges = [
            range(0x3000, 0x3fff),
            range(0x1000, 0x1fff),
            range(0x2000, 0x2fff),
            range(0x8000, 0xffff_ffff),
            range(0x1_0000_0000, u64::MAX),
        ];
        assert_eq!(
            normalize(&ranges, 0x0fff_ffff),
            vec![range(0x1000, 0x3fff), range(0x8000, 0x0fff_ffff)]
        );
        assert_eq!(
            normalize(&[range(0, u64::MAX), range(5, 6)], u64::MAX),
            vec![range(0, u64::MAX)]
        );
    }

    #[test]
    fn mask_64_reaches_the_top_of_the_space() {
        let mut alloc = IovaAllocator::new(64, &[range(u64::MAX - 0xfff, u64::MAX)]).unwrap();
        assert_eq!(alloc.alloc(0x1000, 0x1000).unwrap(), u64::MAX - 0xfff);
        assert!(alloc.alloc(1, 1).is_err());
        alloc.free(u64::MAX - 0xfff).unwrap();
        assert_eq!(alloc.free_ranges().collect::<Vec<_>>(), alloc.usable());
    }

    #[test]
    fn zero_ranges_exhaust_with_a_clear_error() {
        let mut alloc = IovaAllocator::new(32, &[]).unwrap();
        let err = alloc.alloc(0x20_0000, 0x20_0000).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("32-bit"), "{text}");
        assert!(text.contains("0x200000"), "{text}");
        assert!(text.contains("[]"), "{text}");
    }

    #[test]
    fn range_crossing_the_mask_is_cut_at_the_mask() {
        // edu: 28-bit mask; the kernel allows 0..=4 GiB.
        let mut alloc = IovaAllocator::new(28, &[range(0, 0xffff_ffff)]).unwrap();
        assert_eq!(alloc.usable(), &[range(0, 0x0fff_ffff)]);
        let two_mib = 2 << 20;
        let mut got = Vec::new();
        while let Ok(iova) = alloc.alloc(two_mib, two_mib) {
            assert!(iova + two_mib - 1 <= 0x0fff_ffff);
            got.push(iova);
        }
        assert_eq!(got.len(), 128);
        let err = alloc.alloc(two_mib, two_mib).unwrap_err().to_string();
        assert!(
            err.contains("28-bit") && err.contains("0x0..=0xfffffff"),
            "{err}"
        );
    }

    #[test]
    fn reserved_hole_is_never_handed_out() {
        // The x86 MSI window 0xfee00000..=0xfeefffff is a hole between two ranges.
        let ranges = [range(0, 0xfedf_ffff), range(0xfef0_0000, 0xffff_ffff)];
        let mut alloc = IovaAllocator::new(32, &ranges).unwrap();
        // 1 MiB pieces (under Miri, scripts/miri.sh, 16 MiB ones: 255 rather than 4095
        // allocations; the hole still costs exactly one piece).
        let piece_len: u64 = if cfg!(miri) { 16 << 20 } else { 1 << 20 };
        while let Ok(iova) = alloc.alloc(piece_len, piece_len) {
            let piece = IovaRange::from_len(iova, piece_len).unwrap();
            assert!(
                ranges.iter().any(|r| r.covers(&piece)),
                "{piece} in the hole"
            );
        }
        assert_eq!(alloc.allocation_count() as u64, (1 << 32) / piece_len - 1);
    }

    #[test]
    fn alignment_skips_to_the_next_boundary() {
        let mut alloc = IovaAllocator::new(48, &[range(0x1000, 0xffff_ffff)]).unwrap();
        assert_eq!(alloc.alloc(0x1000, 0x1000).unwrap(), 0x1000);
        assert_eq!(alloc.alloc(0x20_0000, 0x20_0000).unwrap(), 0x20_0000);
        assert_eq!(alloc.alloc(0x1000, 0x1000).unwrap(), 0x2000);
        assert_eq!(alloc.alloc(1 << 30, 1 << 30).unwrap(), 1 << 30);
        assert!(matches!(
            alloc.alloc(0x1000, 0x3000),
            Err(Error::InvalidIovaRequest { .. })
        ));
        assert!(matches!(
            alloc.alloc(0, 0x1000),
            Err(Error::InvalidIovaRequest { .. })
        ));
    }

    #[test]
    fn freeing_coalesces_back_to_the_usable_ranges() {
        let ranges = [range(0x1000, 0x8fff), range(0x10000, 0x1ffff)];
        let mut alloc = IovaAllocator::new(32, &ranges).unwrap();
        let mut iovas = Vec::new();
        while let Ok(iova) = alloc.alloc(0x1000, 0x1000) {
            iovas.push(iova);
        }
        assert_eq!(iovas.len(), 8 + 16);
        assert_eq!(alloc.free_ranges().count(), 0);
        // Free in an interleaved order so both-sided coalescing is exercised.
        for &iova in iovas
            .iter()
            .step_by(2)
            .chain(iovas.iter().skip(1).step_by(2))
        {
            alloc.free(iova).unwrap();
        }
        assert_eq!(alloc.free_ranges().collect::<Vec<_>>(), ranges);
        assert!(matches!(
            alloc.free(0x1000),
            Err(Error::UnknownIova { iova: 0x1000 })
        ));
    }

    #[test]
    fn partial_allocation_takes_what_a_hole_holds() {
        let ranges = [range(0x1000, 0x2fff), range(0x5000, 0x8fff)];
        let mut alloc = IovaAllocator::new(32, &ranges).unwrap();
        assert!(alloc.alloc(0x5000, 0x1000).is_err());
        assert_eq!(
            alloc.alloc_partial(0x5000, 0x1000).unwrap(),
            range(0x1000, 0x2fff)
        );
        assert_eq!(
            alloc.alloc_partial(0x3000, 0x1000).unwrap(),
            range(0x5000, 0x7fff)
        );
        assert_eq!(
            alloc.alloc_partial(0x3000, 0x1000).unwrap(),
            range(0x8000, 0x8fff)
        );
        assert!(alloc.alloc_partial(0x1000, 0x1000).is_err());
    }

    #[test]
    fn partial_allocation_is_whole_alignments() {
        let mut alloc = IovaAllocator::new(32, &[range(0x1000, 0xffff)]).unwrap();
        assert_eq!(
            alloc.alloc_partial(0x2fff, 0x1000).unwrap(),
            range(0x1000, 0x2fff)
        );
        assert!(matches!(
            alloc.alloc_partial(0xfff, 0x1000),
            Err(Error::InvalidIovaRequest { .. })
        ));
    }

    #[test]
    fn reserve_takes_an_exact_free_range() {
        let mut alloc = IovaAllocator::new(32, &[range(0, 0xffff)]).unwrap();
        alloc.reserve(range(0x4000, 0x4fff)).unwrap();
        assert!(matches!(
            alloc.reserve(range(0x4800, 0x5fff)),
            Err(Error::IovaUnavailable { .. })
        ));
        assert_eq!(alloc.alloc(0x5000, 0x1000).unwrap(), 0x5000);
        alloc.free(0x4000).unwrap();
        alloc.free(0x5000).unwrap();
        assert_eq!(
            alloc.free_ranges().collect::<Vec<_>>(),
            vec![range(0, 0xffff)]
        );
    }
}
