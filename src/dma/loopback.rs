//! [`Loopback`]: the DMA address space of the software loopback device — its own translation
//! table, the way an IOMMU's page table is the hardware's. Mapping assigns IOVAs from the shared
//! allocator and records each IOVA range with the host memory behind it; the device thread
//! resolves every address it is given with [`Loopback::translate`] and can reach nothing that is
//! not mapped. Unmapping removes the entry; a lookup that raced with it keeps the memory mapped
//! (it holds the region) until it is done, so a late device access is never a use-after-free.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Arc;

use super::iommu::{place, without_null_page};
use super::iova::{mask_of, IovaAllocator, IovaRange};
use super::mapping::{Backend, Counters, Piece};
use super::{Error, Kind, Mapping, Slice, Space, Stats};
use crate::memory::u64_of;
use crate::memory::Region;
use crate::sync::Mutex;

/// One table entry: `last` is the last IOVA of the piece, `offset` where it starts in `region`.
#[derive(Debug)]
struct Entry {
    last: u64,
    offset: usize,
    region: Arc<Region>,
}

/// The table and the allocator, under one lock. Map and unmap are rare; lookups are short
/// (a B-tree search and a reference-count increment).
#[derive(Debug)]
struct Table {
    alloc: IovaAllocator,
    /// IOVA of a piece's first byte -> the piece.
    entries: BTreeMap<u64, Entry>,
}

#[derive(Debug)]
struct Inner {
    table: Mutex<Table>,
    counters: Counters,
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
}

impl Backend for Inner {
    fn unmap(&self, region: &Region, pieces: &[Piece]) -> Result<(), Error> {
        let result = self.with_table(|table| {
            for piece in pieces {
                if table.entries.remove(&piece.iova).is_none() {
                    return Err(Error::UnknownIova { iova: piece.iova });
                }
                table.alloc.free(piece.iova)?;
            }
            Ok(())
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
}

impl Window {
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

/// The loopback device's DMA address space: a translation table. Cheap to clone: the device
/// thread keeps a clone for lookups while the host maps and unmaps through another.
#[derive(Debug, Clone)]
pub struct Loopback {
    inner: Arc<Inner>,
    mask_bits: u32,
}

impl Loopback {
    /// A table for a device with a `dma_mask_bits`-bit DMA mask, over the whole mask (without
    /// IOVA page 0).
    pub fn new(dma_mask_bits: u32) -> Result<Loopback, Error> {
        let mask = mask_of(dma_mask_bits)?;
        Loopback::with_ranges(
            dma_mask_bits,
            &[IovaRange {
                start: 0,
                last: mask,
            }],
        )
    }

    /// A table that places mappings only in `ranges` (clipped to the mask, without page 0), to
    /// mimic an IOMMU with reserved windows.
    pub fn with_ranges(dma_mask_bits: u32, ranges: &[IovaRange]) -> Result<Loopback, Error> {
        let alloc = IovaAllocator::new(dma_mask_bits, &without_null_page(ranges))?;
        Ok(Loopback {
            inner: Arc::new(Inner {
                table: Mutex::new(Table {
                    alloc,
                    entries: BTreeMap::new(),
                }),
                counters: Counters::default(),
            }),
            mask_bits: dma_mask_bits,
        })
    }

    /// Resolves `len` bytes at `iova` as the device would: `None` unless all of them lie in one
    /// mapped piece (and `len > 0`).
    pub fn translate(&self, iova: u64, len: usize) -> Option<Window> {
        let last = iova.checked_add(u64_of(len).checked_sub(1)?)?;
        self.inner.with_table(|table| {
            let (&start, entry) = table.entries.range(..=iova).next_back()?;
            if last > entry.last {
                return None;
            }
            let offset = entry
                .offset
                .checked_add(usize::try_from(iova - start).ok()?)?;
            Some(Window {
                region: Arc::clone(&entry.region),
                offset,
                len,
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

    fn try_map(&self, region: &Arc<Region>) -> Result<Vec<Piece>, Error> {
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
                    },
                );
            }
            Ok(pieces)
        })
    }
}

impl Space for Loopback {
    fn map(&self, region: Arc<Region>) -> Result<Mapping, Error> {
        match self.try_map(&region) {
            Ok(pieces) => {
                self.inner.counters.mapped(u64_of(region.len()));
                let backend: Arc<dyn Backend> = Arc::clone(&self.inner) as Arc<dyn Backend>;
                Ok(Mapping::new(region, pieces, Kind::Loopback, backend))
            }
            Err(err) => {
                self.inner.counters.map_failed();
                Err(err)
            }
        }
    }

    fn stats(&self) -> Stats {
        self.inner.counters.snapshot()
    }

    fn kind(&self) -> Kind {
        Kind::Loopback
    }

    fn dma_mask_bits(&self) -> u32 {
        self.mask_bits
    }
}
