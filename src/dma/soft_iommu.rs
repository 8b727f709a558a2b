//! [`SoftIommu`]: a software IOMMU, the DMA address space of a device simulated in software (the
//! loopback NPU, a test playing a device) — its own translation table, the way an IOMMU's page
//! table is the hardware's. Mapping assigns IOVAs from the shared
//! allocator and records each IOVA range with the host memory behind it; the device thread
//! resolves every address it is given with [`SoftIommu::translate`] and can reach nothing that is
//! not mapped. Unmapping removes the entry; a lookup that raced with it keeps the memory mapped
//! (it holds the region) until it is done, so a late device access is never a use-after-free.
//!
//! A device that keeps its own copy of the table (the out-of-process loopback device, or a
//! translation cache) learns of every change through a watcher registered with
//! [`SoftIommu::watch`] — told of each mapped piece before `map` returns and of each unmapped
//! piece before its IOVAs can be reused — or checks [`SoftIommu::generation`], which moves on
//! every change, instead of polling the table.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Weak};

use super::iommu::{place, without_null_page};
use super::iova::{mask_of, IovaAllocator, IovaRange};
use super::mapping::{Backend, Counters, Piece};
use super::{Access, Error, Iova, Kind, Mapping, Slice, Space, Stats};
use crate::memory::u64_of;
use crate::memory::Region;
use crate::sync::{AtomicU64, Mutex, Ordering};

/// A change of a [`SoftIommu`] table, as a watcher registered with [`SoftIommu::watch`] is told
/// of it.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// `range` now maps `region` from byte `offset` (one piece of a mapping; a mapping made of
    /// several pieces is one change per piece).
    Mapped {
        /// The IOVAs.
        range: IovaRange,
        /// The memory behind them.
        region: &'a Arc<Region>,
        /// Where `range.start` is in the region.
        offset: usize,
        /// What the device may do with it.
        access: Access,
    },
    /// `range` is no longer mapped.
    Unmapped {
        /// The IOVAs.
        range: IovaRange,
    },
}

impl Change<'_> {
    /// The IOVAs that changed.
    pub fn range(&self) -> IovaRange {
        match *self {
            Change::Mapped { range, .. } | Change::Unmapped { range } => range,
        }
    }

    /// For a new mapping, the region and the offset in it of `range().start`.
    pub fn mapped(&self) -> Option<(&Arc<Region>, usize)> {
        match *self {
            Change::Mapped { region, offset, .. } => Some((region, offset)),
            Change::Unmapped { .. } => None,
        }
    }

    /// For a new mapping, what the device may do with it.
    pub fn access(&self) -> Option<Access> {
        match *self {
            Change::Mapped { access, .. } => Some(access),
            Change::Unmapped { .. } => None,
        }
    }
}

/// A watcher's callback.
type Callback = dyn Fn(&Change<'_>) -> io::Result<()> + Send + Sync;

/// A registered watcher.
struct Watcher {
    id: u64,
    tell: Box<Callback>,
}

impl fmt::Debug for Watcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watcher").field("id", &self.id).finish()
    }
}

/// A registration made by [`SoftIommu::watch`]; dropping it stops the calls.
#[must_use = "dropping the registration stops the watcher at once"]
pub struct Watching {
    inner: Weak<Inner>,
    id: u64,
}

impl fmt::Debug for Watching {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watching").field("id", &self.id).finish()
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            inner.with_table(|table| table.watchers.retain(|w| w.id != self.id));
        }
    }
}

/// One table entry: `last` is the last IOVA of the piece, `offset` where it starts in `region`.
#[derive(Debug)]
struct Entry {
    last: u64,
    offset: usize,
    region: Arc<Region>,
    access: Access,
}

/// The table and the allocator, under one lock. Map and unmap are rare; lookups are short
/// (a B-tree search and a reference-count increment).
#[derive(Debug)]
struct Table {
    alloc: IovaAllocator,
    /// IOVA of a piece's first byte -> the piece.
    entries: BTreeMap<u64, Entry>,
    /// Registered watchers.
    watchers: Vec<Watcher>,
    /// The id of the next registration.
    next_watcher: u64,
}

impl Table {
    /// Tells every watcher that `range` is unmapped; the first error, if any.
    fn tell_unmapped(&self, range: IovaRange) -> io::Result<()> {
        let mut first = Ok(());
        for watcher in &self.watchers {
            let told = (watcher.tell)(&Change::Unmapped { range });
            if first.is_ok() {
                first = told;
            }
        }
        first
    }
}

#[derive(Debug)]
struct Inner {
    table: Mutex<Table>,
    counters: Counters,
    /// Moves on every change of the table (see [`SoftIommu::generation`]).
    generation: AtomicU64,
    /// What mapping and unmapping one 4 KiB page costs the calling thread, in ns (see
    /// [`SoftIommu::with_mapping_cost`]).
    map_page_ns: AtomicU64,
    unmap_page_ns: AtomicU64,
}

/// Spins for `per_page` ns for each 4 KiB page of `bytes`: the CPU time pinning and IOMMU
/// page-table work take on hardware (a spin, not a sleep: that thread is busy meanwhile).
fn pay_for_pages(bytes: u64, per_page: u64) {
    if per_page == 0 {
        return;
    }
    let ns = bytes.div_ceil(4096).saturating_mul(per_page);
    let until = std::time::Instant::now() + std::time::Duration::from_nanos(ns);
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

impl Inner {
    /// Runs `f` on the table under the lock. A poisoned lock is taken over: every update of the
    /// table is completed before anything that could panic.
    fn with_table<R>(&self, f: impl FnOnce(&mut Table) -> R) -> R {
        let mut table = self
            .table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut table)
    }

    /// Records a change of the table (called with the table locked, after the change).
    fn changed(&self) {
        // Release: pairs with the Acquire in `SoftIommu::generation`; a reader that sees the new
        // value and then takes the lock sees the change (the lock orders it anyway; the
        // counter lets a cache skip the lock while nothing changed).
        self.generation.fetch_add(1, Ordering::Release);
    }
}

impl Backend for Inner {
    fn unmap(&self, region: &Region, pieces: &[Piece]) -> Result<(), Error> {
        // Relaxed: a setting (see `SoftIommu::with_mapping_cost`).
        pay_for_pages(
            pieces.iter().map(|p| p.len).sum(),
            self.unmap_page_ns.load(Ordering::Relaxed),
        );
        let result = self.with_table(|table| {
            let mut first = Ok(());
            for piece in pieces {
                let Some(entry) = table.entries.remove(&piece.iova) else {
                    first = first.and(Err(Error::UnknownIova { iova: piece.iova }));
                    continue;
                };
                self.changed();
                let range = IovaRange {
                    start: piece.iova,
                    last: entry.last,
                };
                match table.tell_unmapped(range) {
                    Ok(()) => {
                        if let Err(err) = table.alloc.free(piece.iova) {
                            first = first.and(Err(err));
                        }
                    }
                    // A watcher may still reach the range: its IOVAs stay reserved.
                    Err(source) => {
                        first = first.and(Err(Error::Unmap {
                            kind: Kind::SoftIommu,
                            iova: piece.iova,
                            len: piece.len,
                            source,
                        }));
                    }
                }
            }
            first
        });
        match result {
            Ok(()) => {
                self.counters.unmapped(u64_of(region.len()));
                Ok(())
            }
            Err(err) => Err(self.counters.unmap_failed(err)),
        }
    }
}

/// What a device access resolved to: `len` bytes of host memory, kept mapped while the window
/// lives (it holds the region), accessed through a volatile [`Slice`].
#[derive(Debug, Clone)]
pub struct Window {
    region: Arc<Region>,
    offset: usize,
    len: usize,
    access: Access,
}

impl Window {
    /// What the device may do with the memory (a device that writes where the mapping is
    /// [`Access::ReadOnly`], or reads where it is [`Access::WriteOnly`], must refuse).
    pub fn access(&self) -> Access {
        self.access
    }

    /// The bytes, for volatile access.
    pub fn slice(&self) -> Slice<'_> {
        // SAFETY: `translate` makes a window only for bytes inside one mapped piece, and a piece
        // lies inside its region, so `offset + len <= region.len()` and the pointer arithmetic
        // stays in the mapping. The region stays mapped while `self` (which holds it) is
        // borrowed, and never hands out references to its bytes.
        unsafe { Slice::from_raw_parts(self.region.as_ptr().add(self.offset), self.len) }
    }

    /// The host address of the first byte (raw: never make a reference from it).
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.slice().as_ptr()
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty (never, for a successful translation).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A software IOMMU: a simulated device's DMA address space (the loopback device's), a
/// translation table. Cheap to clone: the device
/// thread keeps a clone for lookups while the host maps and unmaps through another.
#[derive(Debug, Clone)]
pub struct SoftIommu {
    inner: Arc<Inner>,
    mask_bits: u32,
}

impl SoftIommu {
    /// A table for a device with a `dma_mask_bits`-bit DMA mask, over the whole mask (without
    /// IOVA page 0).
    pub fn new(dma_mask_bits: u32) -> Result<SoftIommu, Error> {
        let mask = mask_of(dma_mask_bits)?;
        SoftIommu::with_ranges(
            dma_mask_bits,
            &[IovaRange {
                start: 0,
                last: mask,
            }],
        )
    }

    /// A table that places mappings only in `ranges` (clipped to the mask, without page 0), to
    /// mimic an IOMMU with reserved windows.
    pub fn with_ranges(dma_mask_bits: u32, ranges: &[IovaRange]) -> Result<SoftIommu, Error> {
        let alloc = IovaAllocator::new(dma_mask_bits, &without_null_page(ranges))?;
        Ok(SoftIommu {
            inner: Arc::new(Inner {
                table: Mutex::new(Table {
                    alloc,
                    entries: BTreeMap::new(),
                    watchers: Vec::new(),
                    next_watcher: 0,
                }),
                counters: Counters::default(),
                generation: AtomicU64::new(0),
                map_page_ns: AtomicU64::new(0),
                unmap_page_ns: AtomicU64::new(0),
            }),
            mask_bits: dma_mask_bits,
        })
    }

    /// Makes every later map and unmap cost the calling thread `map_page_ns` and
    /// `unmap_page_ns` per 4 KiB page (the loopback NPU's cost model's `Cost::map_page_ns`),
    /// so a path that maps
    /// per frame pays on the loopback device what it pays on hardware. Clones share it.
    pub fn with_mapping_cost(self, map_page_ns: u64, unmap_page_ns: u64) -> SoftIommu {
        // Relaxed: a setting, read by each map and unmap; no data is published with it.
        self.inner.map_page_ns.store(map_page_ns, Ordering::Relaxed);
        self.inner
            .unmap_page_ns
            .store(unmap_page_ns, Ordering::Relaxed);
        self
    }

    /// Resolves `len` bytes at `iova` as the device would: `None` unless all of them lie in one
    /// mapped piece (and `len > 0`).
    pub fn translate(&self, iova: Iova, len: usize) -> Option<Window> {
        let iova = iova.raw();
        let last = iova.checked_add(u64_of(len).checked_sub(1)?)?;
        let (range, piece) = self.piece_at(iova)?;
        if last > range.last {
            return None;
        }
        let offset = usize::try_from(iova - range.start).ok()?;
        Some(Window {
            region: piece.region,
            offset: piece.offset.checked_add(offset)?,
            len,
            access: piece.access,
        })
    }

    /// The whole mapped piece that holds `iova`: its IOVA range and a window over all of it
    /// (for a device that caches translations; check [`SoftIommu::generation`] before reusing
    /// one).
    pub fn piece_at(&self, iova: u64) -> Option<(IovaRange, Window)> {
        self.inner.with_table(|table| {
            let (&start, entry) = table.entries.range(..=iova).next_back()?;
            if iova > entry.last {
                return None;
            }
            let len = usize::try_from(entry.last - start).ok()?.checked_add(1)?;
            Some((
                IovaRange {
                    start,
                    last: entry.last,
                },
                Window {
                    region: Arc::clone(&entry.region),
                    offset: entry.offset,
                    len,
                    access: entry.access,
                },
            ))
        })
    }

    /// A number that moves on every map and unmap: a translation cached while it had one value
    /// is still right while it has it.
    pub fn generation(&self) -> u64 {
        // Acquire: pairs with the Release increment made after each change, so a caller that
        // sees an unchanged value re-checks nothing it read before.
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Registers `watcher` to be told of every later change of the table, after it is told of
    /// every piece mapped now (so it starts from the whole table), until the returned
    /// registration is dropped. This is how a device that keeps its own copy of the table (the
    /// out-of-process loopback device) learns of mappings without polling.
    ///
    /// The calls are made with the table locked: they arrive one at a time, in the table's
    /// order (a piece's `Unmapped` always before a later `Mapped` of the same IOVAs), each
    /// `Mapped` before [`Space::map`] returns and each `Unmapped` before its IOVAs can be
    /// reused. For the same reason the watcher must not call into this table (translate, map,
    /// unmap, watch): that deadlocks.
    ///
    /// An error from `Mapped` undoes the whole mapping and `map` fails with [`Error::Map`]
    /// carrying it; an error from `Unmapped` makes the unmap report [`Error::Unmap`], and the
    /// range's IOVAs stay reserved (never reused), as for a kernel that refused to unmap. An
    /// error while telling it of the current pieces is returned, and nothing is registered.
    pub fn watch<F>(&self, watcher: F) -> Result<Watching, Error>
    where
        F: Fn(&Change<'_>) -> io::Result<()> + Send + Sync + 'static,
    {
        self.inner.with_table(|table| {
            for (&start, entry) in &table.entries {
                let range = IovaRange {
                    start,
                    last: entry.last,
                };
                let change = Change::Mapped {
                    range,
                    region: &entry.region,
                    offset: entry.offset,
                    access: entry.access,
                };
                watcher(&change).map_err(|source| Error::Map {
                    kind: Kind::SoftIommu,
                    iova: start,
                    len: entry.last - start + 1,
                    source,
                })?;
            }
            let id = table.next_watcher;
            table.next_watcher += 1;
            table.watchers.push(Watcher {
                id,
                tell: Box::new(watcher),
            });
            Ok(Watching {
                inner: Arc::downgrade(&self.inner),
                id,
            })
        })
    }

    /// The mapped IOVA ranges, ascending.
    pub fn mapped_ranges(&self) -> Vec<IovaRange> {
        self.inner.with_table(|table| {
            table
                .entries
                .iter()
                .map(|(&start, entry)| IovaRange {
                    start,
                    last: entry.last,
                })
                .collect()
        })
    }

    fn try_map(&self, region: &Arc<Region>, access: Access) -> Result<Vec<Piece>, Error> {
        let len = u64_of(region.len());
        let align = u64_of(region.page_size().bytes());
        self.inner.with_table(|table| {
            let pieces = place(&mut table.alloc, len, align)?;
            for piece in &pieces {
                table.entries.insert(
                    piece.iova,
                    Entry {
                        last: piece.iova + (piece.len - 1),
                        offset: piece.offset,
                        region: Arc::clone(region),
                        access,
                    },
                );
            }
            self.inner.changed();
            let told = pieces.iter().try_for_each(|piece| {
                let range = IovaRange {
                    start: piece.iova,
                    last: piece.iova + (piece.len - 1),
                };
                table
                    .watchers
                    .iter()
                    .try_for_each(|w| {
                        (w.tell)(&Change::Mapped {
                            range,
                            region,
                            offset: piece.offset,
                            access,
                        })
                    })
                    .map_err(|source| (piece, source))
            });
            let Err((failed, source)) = told else {
                return Ok(pieces);
            };
            // Undo: every watcher hears of the removal of every piece (one that never heard of
            // a piece ignores it), then the IOVAs go back.
            let mut reserved = false;
            for piece in &pieces {
                table.entries.remove(&piece.iova);
                let range = IovaRange {
                    start: piece.iova,
                    last: piece.iova + (piece.len - 1),
                };
                if table.tell_unmapped(range).is_err() {
                    reserved = true;
                }
            }
            self.inner.changed();
            if !reserved {
                for piece in &pieces {
                    // Allocated just above: freeing cannot fail.
                    let _ = table.alloc.free(piece.iova);
                }
            }
            Err(Error::Map {
                kind: Kind::SoftIommu,
                iova: failed.iova,
                len: failed.len,
                source,
            })
        })
    }
}

impl Space for SoftIommu {
    fn map(&self, region: Arc<Region>) -> Result<Mapping, Error> {
        self.map_with(region, Access::ReadWrite)
    }

    /// Enforced by the device that translates through this table (the loopback NPU fails a
    /// descriptor that writes a read-only mapping or reads a write-only one).
    fn map_with(&self, region: Arc<Region>, access: Access) -> Result<Mapping, Error> {
        #[cfg(feature = "tracing")]
        let _span = super::mapping::map_span(Kind::SoftIommu, &region, access);
        let placed = self.try_map(&region, access);
        if placed.is_ok() {
            // Relaxed: a setting (see `with_mapping_cost`).
            pay_for_pages(
                u64_of(region.len()),
                self.inner.map_page_ns.load(Ordering::Relaxed),
            );
        }
        let inner = &self.inner;
        Mapping::from_placement(region, placed, Kind::SoftIommu, &inner.counters, inner)
            .map(|mapping| mapping.with_access(access))
    }

    fn stats(&self) -> Stats {
        self.inner.counters.snapshot()
    }

    fn kind(&self) -> Kind {
        Kind::SoftIommu
    }

    fn dma_mask_bits(&self) -> u32 {
        self.mask_bits
    }
}

#[cfg(test)]
mod tests;
