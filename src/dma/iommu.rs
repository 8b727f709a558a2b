//! What the IOMMU-backed spaces (VFIO type1, iommufd) share: IOVA placement, the kernel's
//! mapping-count budget, one kernel mapping per IOVA-contiguous piece, rollback of half-done maps,
//! and unmapping with every failure reported.
//!
//! A region is virtually contiguous, so it is mapped with one kernel call at one IOVA range:
//! all its pages merge into one kernel mapping (one entry of the type1 `dma_entry_limit`, not one
//! per page). Only when no free IOVA range holds the whole region is it scattered over the
//! fewest pieces that fit (the largest piece each free range holds, lowest first), each piece one
//! kernel mapping; the [`Mapping`] then translates per page.

use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use super::iova::{IovaAllocator, IovaRange};
use super::mapping::{Backend, Counters, Piece};
use super::{Access, Error, Kind, Mapping, Stats};
use crate::memory::u64_of;
use crate::memory::Region;
use crate::sync::Mutex;

/// The two calls an IOMMU backend makes.
pub(crate) trait Iommu: Send + Sync + fmt::Debug + 'static {
    /// Maps `len` bytes of this process's memory at `vaddr` to `iova`, for the device to reach
    /// as `access` says.
    fn map(&self, vaddr: u64, iova: u64, len: u64, access: Access) -> io::Result<()>;
    /// Maps `len` bytes of `file` from byte `start` to `iova` by file descriptor. Default:
    /// `ENOTTY` (an IOMMU interface with no such call).
    fn map_file(
        &self,
        file: BorrowedFd<'_>,
        start: u64,
        iova: u64,
        len: u64,
        access: Access,
    ) -> io::Result<()> {
        let _ = (file, start, iova, len, access);
        Err(io::Error::from_raw_os_error(libc::ENOTTY))
    }
    /// Unmaps `iova..+len`; returns the bytes the kernel unmapped.
    fn unmap(&self, iova: u64, len: u64) -> io::Result<u64>;
}

/// IOVA 0 is never handed out, so a zeroed descriptor makes the device fault instead of
/// reaching real memory: usable ranges start at this IOVA or above.
pub(crate) const FIRST_IOVA: u64 = 0x1000;

/// `ranges` without `0..FIRST_IOVA`.
pub(crate) fn without_null_page(ranges: &[IovaRange]) -> Vec<IovaRange> {
    ranges
        .iter()
        .filter_map(|range| IovaRange::new(range.start.max(FIRST_IOVA), range.last))
        .collect()
}

/// Places a mapping of `len` bytes: one piece if a free range holds it, else the fewest pieces
/// (each a multiple of `align`) the free ranges hold. All or nothing: on exhaustion nothing stays
/// allocated and the error names the whole length.
pub(crate) fn place(alloc: &mut IovaAllocator, len: u64, align: u64) -> Result<Vec<Piece>, Error> {
    let exhausted = match alloc.alloc(len, align) {
        Ok(iova) => {
            return Ok(vec![Piece {
                iova,
                offset: 0,
                len,
            }])
        }
        Err(err @ Error::IovaExhausted { .. }) => err,
        Err(other) => return Err(other),
    };
    let mut pieces: Vec<Piece> = Vec::new();
    let mut done = 0u64;
    while done < len {
        match alloc.alloc_partial(len - done, align) {
            Ok(range) => {
                let piece_len = u64::try_from(range.size()).unwrap_or(u64::MAX);
                pieces.push(Piece {
                    iova: range.start,
                    offset: usize::try_from(done).unwrap_or(usize::MAX),
                    len: piece_len,
                });
                done += piece_len;
            }
            Err(_) => {
                for piece in &pieces {
                    // Just allocated above, so freeing cannot fail.
                    let _ = alloc.free(piece.iova);
                }
                return Err(exhausted);
            }
        }
    }
    Ok(pieces)
}

/// Allocator and kernel-mapping budget, under one lock.
#[derive(Debug)]
struct State {
    alloc: IovaAllocator,
    /// Kernel mappings still allowed (`None`: no limit known).
    entries_left: Option<u64>,
}

/// The shared state of an IOMMU-backed space; its mappings keep it alive.
#[derive(Debug)]
pub(crate) struct Core<I> {
    iommu: I,
    kind: Kind,
    /// The IOMMU's smallest page: every IOVA and length is a multiple of it.
    min_page: u64,
    /// The kernel's mapping-count limit at creation (`None`: none known).
    entry_limit: Option<u64>,
    state: Mutex<State>,
    counters: Counters,
}

impl<I: Iommu> Core<I> {
    pub(crate) fn new(
        iommu: I,
        kind: Kind,
        mask_bits: u32,
        ranges: &[IovaRange],
        min_page: u64,
        entry_limit: Option<u64>,
    ) -> Result<Core<I>, Error> {
        let alloc = IovaAllocator::new(mask_bits, &without_null_page(ranges))?;
        Ok(Core {
            iommu,
            kind,
            min_page: min_page.max(1),
            entry_limit,
            state: Mutex::new(State {
                alloc,
                entries_left: entry_limit,
            }),
            counters: Counters::default(),
        })
    }

    pub(crate) fn iommu(&self) -> &I {
        &self.iommu
    }

    /// Runs `f` on the state under the lock. A poisoned lock is taken over: every update of the
    /// state is completed before anything that could panic.
    fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut state)
    }

    pub(crate) fn mask_bits(&self) -> u32 {
        self.with_state(|state| state.alloc.mask_bits())
    }

    pub(crate) fn usable_ranges(&self) -> Vec<IovaRange> {
        self.with_state(|state| state.alloc.usable().to_vec())
    }

    pub(crate) fn entries_left(&self) -> Option<u64> {
        self.with_state(|state| state.entries_left)
    }

    pub(crate) fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    /// Replaces the usable ranges (the kernel narrowed or widened them), keeping every live
    /// allocation; fails, changing nothing, if one falls outside the new ranges.
    pub(crate) fn set_ranges(&self, ranges: &[IovaRange]) -> Result<(), Error> {
        self.with_state(|state| {
            let mut fresh =
                IovaAllocator::new(state.alloc.mask_bits(), &without_null_page(ranges))?;
            for range in state.alloc.allocations() {
                fresh.reserve(range)?;
            }
            state.alloc = fresh;
            Ok(())
        })
    }

    /// Maps all of `region`, for the device to reach as `access` says.
    pub(crate) fn map(
        self: &Arc<Self>,
        region: Arc<Region>,
        access: Access,
    ) -> Result<Mapping, Error> {
        #[cfg(feature = "tracing")]
        let _span = super::mapping::map_span(self.kind, &region, access);
        let placed = self.try_map(&region, access, false);
        Mapping::from_placement(region, placed, self.kind, &self.counters, self)
            .map(|mapping| mapping.with_access(access))
    }

    /// [`Core::map`] by file descriptor: the IOMMU maps the file behind `region` (its
    /// [`Region::fd`], from byte 0) instead of the region's addresses, which stay the CPU's view
    /// of the same bytes.
    pub(crate) fn map_file(
        self: &Arc<Self>,
        region: Arc<Region>,
        access: Access,
    ) -> Result<Mapping, Error> {
        #[cfg(feature = "tracing")]
        let _span = super::mapping::map_span(self.kind, &region, access);
        let placed = if region.fd().is_some() {
            self.try_map(&region, access, true)
        } else {
            Err(Error::MapFile {
                kind: self.kind,
                source: io::Error::from_raw_os_error(libc::EBADF),
            })
        };
        Mapping::from_placement(region, placed, self.kind, &self.counters, self)
            .map(|mapping| mapping.with_access(access))
    }

    fn try_map(&self, region: &Region, access: Access, by_file: bool) -> Result<Vec<Piece>, Error> {
        let len = u64_of(region.len());
        let page = u64_of(region.page_size().bytes());
        // Both are powers of two, so this is `page < min_page`.
        if page % self.min_page != 0 {
            return Err(Error::IommuPageSize {
                kind: self.kind,
                page_size: region.page_size(),
                iommu_page: self.min_page,
            });
        }
        let pieces = self.with_state(|state| {
            let pieces = place(&mut state.alloc, len, page)?;
            let needed = u64_of(pieces.len());
            if let Some(left) = state.entries_left {
                if needed > left {
                    for piece in &pieces {
                        // Just placed, so freeing cannot fail.
                        let _ = state.alloc.free(piece.iova);
                    }
                    return Err(Error::MappingLimit {
                        needed,
                        available: left,
                        limit: self.entry_limit.unwrap_or(left),
                    });
                }
                state.entries_left = Some(left - needed);
            }
            Ok(pieces)
        })?;
        // The kernel calls run without the lock: the IOVAs and budget are already ours.
        let vaddr = region.as_ptr().as_ptr() as u64;
        for (index, piece) in pieces.iter().enumerate() {
            let host = vaddr.saturating_add(u64_of(piece.offset));
            let mapped = match region.fd().filter(|_| by_file) {
                Some(file) => {
                    let start = u64_of(piece.offset);
                    self.iommu
                        .map_file(file, start, piece.iova, piece.len, access)
                }
                None => self.iommu.map(host, piece.iova, piece.len, access),
            };
            if let Err(source) = mapped {
                let kept = self.roll_back(&pieces[..index]);
                self.release(&pieces[index..], &kept);
                let error = if by_file {
                    Error::MapFile {
                        kind: self.kind,
                        source,
                    }
                } else if source.raw_os_error() == Some(libc::ENOSPC) {
                    Error::MappingLimit {
                        needed: u64_of(pieces.len()),
                        available: 0,
                        limit: self.entry_limit.unwrap_or(0),
                    }
                } else {
                    Error::Map {
                        kind: self.kind,
                        iova: piece.iova,
                        len: piece.len,
                        source,
                    }
                };
                return Err(error);
            }
        }
        Ok(pieces)
    }

    /// Undoes the already-mapped `pieces` of a failed map; returns those whose unmap failed (their
    /// IOVAs and budget stay taken). The failures are counted.
    fn roll_back(&self, pieces: &[Piece]) -> Vec<Piece> {
        let mut kept = Vec::new();
        for piece in pieces {
            if let Err(err) = self.unmap_piece(piece) {
                let _ = self.counters.unmap_failed(err);
                kept.push(*piece);
            }
        }
        self.release(pieces, &kept);
        kept
    }

    /// Returns the IOVAs and budget of `pieces`, except those in `kept`.
    fn release(&self, pieces: &[Piece], kept: &[Piece]) {
        self.with_state(|state| {
            for piece in pieces.iter().filter(|piece| !kept.contains(piece)) {
                // Every piece given here was allocated by `place` and not freed since.
                let _ = state.alloc.free(piece.iova);
                if let Some(left) = state.entries_left.as_mut() {
                    *left += 1;
                }
            }
        });
    }

    /// One kernel unmap, checked to have removed exactly the piece.
    fn unmap_piece(&self, piece: &Piece) -> Result<(), Error> {
        match self.iommu.unmap(piece.iova, piece.len) {
            Ok(unmapped) if unmapped == piece.len => Ok(()),
            Ok(unmapped) => Err(Error::UnmapIncomplete {
                kind: self.kind,
                iova: piece.iova,
                len: piece.len,
                unmapped,
            }),
            Err(source) => Err(Error::Unmap {
                kind: self.kind,
                iova: piece.iova,
                len: piece.len,
                source,
            }),
        }
    }
}

impl<I: Iommu> Backend for Core<I> {
    fn unmap(&self, region: &Region, pieces: &[Piece]) -> Result<(), Error> {
        let mut first_error = None;
        let mut kept = Vec::new();
        for piece in pieces {
            if let Err(err) = self.unmap_piece(piece) {
                // Never reuse an IOVA that may still be mapped: it stays allocated.
                kept.push(*piece);
                let err = self.counters.unmap_failed(err);
                first_error.get_or_insert(err);
            }
        }
        self.release(pieces, &kept);
        match first_error {
            None => {
                self.counters.unmapped(u64_of(region.len()));
                Ok(())
            }
            Some(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: u64, last: u64) -> IovaRange {
        IovaRange::new(start, last).unwrap()
    }

    #[test]
    fn null_page_is_carved_out() {
        assert_eq!(
            without_null_page(&[range(0, 0xfff), range(0, 0xffff), range(0x10000, 0x1ffff)]),
            vec![range(0x1000, 0xffff), range(0x10000, 0x1ffff)]
        );
    }

    #[test]
    fn place_prefers_one_piece() {
        let mut alloc = IovaAllocator::new(32, &[range(0x1000, 0xffff_ffff)]).unwrap();
        let pieces = place(&mut alloc, 0x40_0000, 0x20_0000).unwrap();
        assert_eq!(
            pieces,
            vec![Piece {
                iova: 0x20_0000,
                offset: 0,
                len: 0x40_0000
            }]
        );
    }

    #[test]
    fn place_scatters_over_holes_and_undoes_on_exhaustion() {
        let page = 0x1000;
        let ranges = [
            range(0x1000, 0x2fff),
            range(0x4000, 0x4fff),
            range(0x8000, 0x9fff),
        ];
        let mut alloc = IovaAllocator::new(32, &ranges).unwrap();
        let pieces = place(&mut alloc, 5 * page, page).unwrap();
        let layout: Vec<(u64, usize, u64)> =
            pieces.iter().map(|p| (p.iova, p.offset, p.len)).collect();
        assert_eq!(
            layout,
            vec![
                (0x1000, 0, 0x2000),
                (0x4000, 0x2000, 0x1000),
                (0x8000, 0x3000, 0x2000)
            ]
        );
        for piece in &pieces {
            alloc.free(piece.iova).unwrap();
        }
        let err = place(&mut alloc, 6 * page, page).unwrap_err();
        assert!(
            matches!(err, Error::IovaExhausted { size: 0x6000, .. }),
            "{err:?}"
        );
        assert_eq!(alloc.allocation_count(), 0);
    }
}
