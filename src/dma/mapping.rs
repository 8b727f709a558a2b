//! [`Mapping`]: a region mapped into a device's DMA address space, with O(1) IOVA lookup, undone
//! on drop; and the counters every space keeps.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::iova::IovaRange;
use super::{Access, Error, Iova, Kind, Slice};
use crate::memory::u64_of;
use crate::memory::Region;
use crate::sync::{AtomicU64, Mutex, Ordering};

/// One contiguous piece of a mapping as the backend knows it: `len` bytes at region offset
/// `offset`, mapped at `iova` (one kernel mapping, one table entry, one IOVA allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) iova: u64,
    pub(crate) offset: usize,
    pub(crate) len: u64,
}

/// What a space does when a mapping goes away. Crate-private: each space implements it on the
/// shared state its mappings keep alive.
pub(crate) trait Backend: Send + Sync + fmt::Debug {
    /// Undoes `pieces` of a mapping of `region` (reverse order is not required). Records every
    /// failure in the counters and returns the first.
    fn unmap(&self, region: &Region, pieces: &[Piece]) -> Result<(), Error>;
}

/// How offsets translate to IOVAs.
#[derive(Debug)]
enum Translation {
    /// The whole mapping is one IOVA range.
    Linear { iova: u64 },
    /// Per page: `iovas[i]` is the IOVA of page `i`; pages `i..run_end[i]` are IOVA-contiguous.
    Pages {
        page_bytes: usize,
        iovas: Box<[u64]>,
        run_end: Box<[usize]>,
    },
}

/// A region mapped into a device's DMA address space, mapped once and undone when dropped (or by
/// [`Mapping::unmap`], which returns the error; a failed unmap on drop is counted in the space's
/// [`Stats`]). Holds the region alive. Cheap to query: [`Mapping::iova`] and
/// [`Mapping::contiguous_len`] are O(1).
#[derive(Debug)]
pub struct Mapping {
    region: Arc<Region>,
    translation: Translation,
    pieces: Box<[Piece]>,
    kind: Kind,
    backend: Arc<dyn Backend>,
    /// What the device may do with it.
    access: Access,
    /// Set once the pieces have been undone (by `unmap` or drop).
    released: bool,
}

impl Mapping {
    /// A mapping whose pieces, in region order, are given; the translation is linear when they
    /// form one IOVA range, per page otherwise. `pieces` must cover the region in order, each a
    /// whole number of pages.
    pub(crate) fn new(
        region: Arc<Region>,
        pieces: Vec<Piece>,
        kind: Kind,
        backend: Arc<dyn Backend>,
    ) -> Mapping {
        let translation = translation_of(&region, &pieces);
        Mapping {
            region,
            translation,
            pieces: pieces.into_boxed_slice(),
            kind,
            backend,
            access: Access::ReadWrite,
            released: false,
        }
    }

    /// The mapping with its access mode recorded (what the space mapped it with).
    pub(crate) fn with_access(mut self, access: Access) -> Mapping {
        self.access = access;
        self
    }

    /// What the device may do with the memory ([`Space::map_with`](super::Space::map_with)).
    pub fn access(&self) -> Access {
        self.access
    }

    /// The end of every space's `map`: `placed` is the space's placement of all of `region`
    /// (its pieces, mapped, in region order) or why it failed. A placement becomes the mapping,
    /// undone by `backend` (the space's shared state, which holds `counters`), and is counted
    /// as a map; a failure is counted as a failed map and returned.
    pub(crate) fn from_placement<B: Backend + 'static>(
        region: Arc<Region>,
        placed: Result<Vec<Piece>, Error>,
        kind: Kind,
        counters: &Counters,
        backend: &Arc<B>,
    ) -> Result<Mapping, Error> {
        match placed {
            Ok(pieces) => {
                counters.mapped(u64_of(region.len()));
                #[cfg(feature = "tracing")]
                tracing::debug!(
                    space = %kind,
                    bytes = region.len(),
                    iova = %Iova(pieces.first().map_or(0, |p| p.iova)),
                    pieces = pieces.len(),
                    "mapped"
                );
                let backend: Arc<dyn Backend> = Arc::clone(backend) as Arc<dyn Backend>;
                Ok(Mapping::new(region, pieces, kind, backend))
            }
            Err(err) => {
                counters.map_failed();
                #[cfg(feature = "tracing")]
                tracing::warn!(space = %kind, bytes = region.len(), error = %err, "DMA map failed");
                Err(err)
            }
        }
    }

    /// The mapped region.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// The kind of space it is mapped in.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Length in bytes (the region's length).
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Always `false` (regions are never empty).
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    /// The host address of the first byte. A raw pointer: the device writes this memory, so
    /// never make a reference from it; use [`Mapping::slice`].
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.region.as_ptr()
    }

    /// The IOVA (the address the device uses) of the byte at `offset`; `None` past the end. O(1).
    pub fn iova(&self, offset: usize) -> Option<Iova> {
        if offset >= self.len() {
            return None;
        }
        let raw = match &self.translation {
            Translation::Linear { iova } => iova.checked_add(u64_of(offset)),
            Translation::Pages {
                page_bytes, iovas, ..
            } => iovas
                .get(offset / page_bytes)?
                .checked_add(u64_of(offset % page_bytes)),
        };
        raw.map(Iova)
    }

    /// How many bytes from `offset` on are IOVA-contiguous (a device can reach them with one
    /// address and length); 0 past the end. O(1).
    pub fn contiguous_len(&self, offset: usize) -> usize {
        let len = self.len();
        if offset >= len {
            return 0;
        }
        match &self.translation {
            Translation::Linear { .. } => len - offset,
            Translation::Pages {
                page_bytes,
                run_end,
                ..
            } => run_end
                .get(offset / page_bytes)
                .map_or(0, |&end| end.saturating_mul(*page_bytes).min(len) - offset),
        }
    }

    /// The IOVA range of the whole mapping, when it is one contiguous range (always for IOMMU and
    /// loopback spaces unless the IOVA space was too fragmented; for physical spaces only if the
    /// pages happen to be physically adjacent).
    pub fn iova_range(&self) -> Option<IovaRange> {
        if self.contiguous_len(0) != self.len() {
            return None;
        }
        IovaRange::from_len(self.iova(0)?.raw(), u64_of(self.len()))
    }

    /// The pieces the space mapped (one per kernel mapping or table entry), as IOVA ranges in
    /// region order.
    pub fn segments(&self) -> impl Iterator<Item = (usize, IovaRange)> + '_ {
        self.pieces.iter().filter_map(|piece| {
            IovaRange::from_len(piece.iova, piece.len).map(|range| (piece.offset, range))
        })
    }

    /// A volatile view of the whole mapping.
    pub fn slice(&self) -> Slice<'_> {
        Slice::from_region(&self.region)
    }

    /// A volatile view of `len` bytes at `offset`.
    pub fn slice_at(&self, offset: usize, len: usize) -> Result<Slice<'_>, Error> {
        self.slice().subslice(offset, len)
    }

    /// Unmaps now and reports failure. After an error the IOVAs stay reserved (they may still be
    /// mapped) and the error is also counted in the space's [`Stats`].
    pub fn unmap(mut self) -> Result<(), Error> {
        self.release()
    }

    fn release(&mut self) -> Result<(), Error> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        #[cfg(feature = "tracing")]
        let _span = tracing::debug_span!(
            "dma.unmap",
            space = %self.kind,
            bytes = self.region.len(),
            iova = %Iova(self.pieces.first().map_or(0, |p| p.iova)),
            pieces = self.pieces.len()
        )
        .entered();
        self.backend.unmap(&self.region, &self.pieces)
    }
}

/// Enters the span of one map of `region` into a space of `kind` for `access` (the `tracing`
/// feature; docs/tracing-events.md). Every space's `map` opens it; [`Mapping::from_placement`]
/// reports the outcome inside it.
#[cfg(feature = "tracing")]
pub(crate) fn map_span(kind: Kind, region: &Region, access: Access) -> tracing::span::EnteredSpan {
    tracing::debug_span!(
        "dma.map",
        space = %kind,
        bytes = region.len(),
        page_size = %region.page_size(),
        access = ?access
    )
    .entered()
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // A failure is not lost: the backend counted it and kept it as the space's last unmap
        // error (`Space::stats`); a Drop has nobody to return it to.
        let _ = self.release();
    }
}

/// Builds the offset -> IOVA translation for `pieces` covering `region`.
fn translation_of(region: &Region, pieces: &[Piece]) -> Translation {
    if let [only] = pieces {
        return Translation::Linear { iova: only.iova };
    }
    let page_bytes = region.page_size().bytes();
    let pages = region.page_count();
    let mut iovas = Vec::with_capacity(pages);
    for piece in pieces {
        let count = usize::try_from(piece.len).unwrap_or(0) / page_bytes;
        let step = u64_of(page_bytes);
        iovas.extend((0..u64_of(count)).map(|i| piece.iova.wrapping_add(i.wrapping_mul(step))));
    }
    let run_end = run_ends(&iovas, u64_of(page_bytes));
    Translation::Pages {
        page_bytes,
        iovas: iovas.into_boxed_slice(),
        run_end: run_end.into_boxed_slice(),
    }
}

/// For each page, the index one past the last page of the IOVA-contiguous run it belongs to.
pub(crate) fn run_ends(iovas: &[u64], page_bytes: u64) -> Vec<usize> {
    let mut run_end = vec![iovas.len(); iovas.len()];
    for i in (0..iovas.len().saturating_sub(1)).rev() {
        let next_follows = iovas[i].checked_add(page_bytes) == Some(iovas[i + 1]);
        run_end[i] = if next_follows { run_end[i + 1] } else { i + 1 };
    }
    run_end
}

/// Counters of one space. Statistics only: every counter is updated and read with `Relaxed`
/// ordering because nothing is synchronised through them.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    maps: AtomicU64,
    map_errors: AtomicU64,
    unmaps: AtomicU64,
    unmap_errors: AtomicU64,
    live_bytes: AtomicU64,
    last_unmap_error: Mutex<Option<Arc<Error>>>,
}

impl Counters {
    pub(crate) fn mapped(&self, bytes: u64) {
        // Relaxed: a statistic (see the type's comment).
        self.maps.fetch_add(1, Ordering::Relaxed);
        self.live_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn map_failed(&self) {
        // Relaxed: a statistic.
        self.map_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn unmapped(&self, bytes: u64) {
        // Relaxed: a statistic.
        self.unmaps.fetch_add(1, Ordering::Relaxed);
        self.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Counts an unmap failure and keeps it as the last one; returns it for the caller.
    pub(crate) fn unmap_failed(&self, error: Error) -> Error {
        // Relaxed: a statistic.
        self.unmap_errors.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "tracing")]
        tracing::error!(error = %error, "DMA unmap failed: the IOVAs stay reserved");
        let shared = Arc::new(error);
        let mut last = self
            .last_unmap_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *last = Some(Arc::clone(&shared));
        drop(last);
        Error::UnmapFailed { source: shared }
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let last_unmap_error = self
            .last_unmap_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        // Relaxed loads: a statistic; the fields are not a consistent snapshot of each other.
        Stats {
            maps: self.maps.load(Ordering::Relaxed),
            map_errors: self.map_errors.load(Ordering::Relaxed),
            unmaps: self.unmaps.load(Ordering::Relaxed),
            unmap_errors: self.unmap_errors.load(Ordering::Relaxed),
            // Kept by the type1 space itself, which fills it in (`Type1::stats`).
            unmaps_after_removal: 0,
            live_bytes: self.live_bytes.load(Ordering::Relaxed),
            last_unmap_error,
        }
    }
}

/// What a space has done so far. Each field is read on its own; under concurrent map/unmap they
/// may be a moment apart.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Successful `map` calls.
    pub maps: u64,
    /// Failed `map` calls.
    pub map_errors: u64,
    /// Successful unmaps (drop or [`Mapping::unmap`]), including those the kernel had already
    /// done (see `unmaps_after_removal`).
    pub unmaps: u64,
    /// Failed unmaps (drop or [`Mapping::unmap`]): the mapping may still be there, and its IOVAs
    /// stay reserved. Never an unmap the kernel had already done.
    pub unmap_errors: u64,
    /// VFIO type1 only (0 in the other spaces): kernel unmaps that found the mapping already
    /// gone because the container had lost its IOMMU, which the kernel releases, unmapping and
    /// unpinning everything, when the container's last group leaves it: its device was
    /// hot-unplugged or unbound, or dropped before its mappings; or because the kernel had
    /// dropped every mapping with the container's last IOMMU domain as the device went away
    /// (the unmap then unmaps nothing, with the IOMMU still there). Such an unmap did what was
    /// asked, so its mapping counts in `unmaps`, not in `unmap_errors`. Counted per kernel
    /// mapping: one per [`Mapping`], unless the mapping was scattered over several IOVA ranges
    /// ([`Mapping::segments`]) or a map was undone half-way.
    pub unmaps_after_removal: u64,
    /// Bytes currently mapped.
    pub live_bytes: u64,
    /// The most recent unmap failure.
    pub last_unmap_error: Option<Arc<Error>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ends_group_adjacent_pages() {
        let page = 0x1000;
        let iovas = [0x1000, 0x2000, 0x3000, 0x8000, 0xa000, 0xb000];
        assert_eq!(run_ends(&iovas, page), vec![3, 3, 3, 4, 6, 6]);
        assert_eq!(run_ends(&[], page), Vec::<usize>::new());
        assert_eq!(run_ends(&[u64::MAX - 0xfff, 0], page), vec![1, 2]);
    }
}
