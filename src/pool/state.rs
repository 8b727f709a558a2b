//! The pool's state ([`Core`]): what a [`Pool`](super::Pool) handle and its buffers point
//! to, freed by the last of the handle and the owned buffers (the `lease` module), and how
//! its drop drains the caches and unmaps (or keeps) the mapping.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use super::arena::{ArenaBox, Block, Failure};
use super::cache::{self, OwnedSlot};
use super::geometry::Geometry;
use super::lease::Leases;
use super::{Config, Error, MIN_ALIGN};
use crate::dma::Mapping;
use crate::sync::AtomicU32;

/// Offset -> IOVA translation of the arena, precomputed at creation so the fast path never asks
/// the mapping.
#[derive(Debug)]
pub(super) enum Iovas {
    /// The arena is one IOVA range starting here.
    Linear(u64),
    /// Per chunk (each chunk is IOVA-contiguous; consecutive chunks need not be).
    Chunks { shift: u32, iovas: Box<[u64]> },
}

/// The pool's state: what its buffers reach (they point here, with their size class in the
/// low bits of the pointer). 128-byte aligned: its read-mostly fields have their cache lines
/// to themselves, and a buffer keeps its size class in the low bits of its pointer to it.
#[repr(align(128))]
pub(crate) struct Core {
    /// The arena's id (what thread caches key on).
    pub(super) id: u64,
    /// Who frees this state: the pool handle, or the last owned buffer after it. Next to the
    /// fields every free reads (an owned free reads whether it is retired).
    pub(super) leases: Leases,
    /// The arena's waiter count (see `Arena::waiters`).
    pub(super) waiters: NonNull<AtomicU32>,
    /// Dropped by `Drop` before the mapping: it drains thread caches into metadata that may
    /// live in `mapping`.
    pub(super) arena: ManuallyDrop<ArenaBox>,
    /// Host address of arena offset 0.
    pub(super) base: NonNull<u8>,
    pub(super) iovas: Iovas,
    /// Offset of the arena in the mapping (nonzero for a shared pool: the metadata comes first).
    pub(super) arena_offset: usize,
    pub(super) config: Config,
    pub(super) shared: bool,
    /// Unmapped by `Drop`, or leaked if buffers are still out.
    pub(super) mapping: ManuallyDrop<Mapping>,
}

/// Mappings leaked by pools dropped while buffers were still out, in this process. A plain std
/// atomic on purpose: a process-wide count, not part of any modelled algorithm.
static LEAKED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times, in this process, a [`Pool`](super::Pool) was dropped while some of its buffers were
/// still out and therefore left its mapping mapped (see [`Pool`](super::Pool)'s `Drop`).
pub fn leaked_mappings() -> u64 {
    // Relaxed: a statistic; it orders nothing.
    LEAKED.load(std::sync::atomic::Ordering::Relaxed)
}

impl Drop for Core {
    /// Drains the thread caches and unmaps the mapping (which DMA-unmaps and unpins it).
    ///
    /// If buffers of this pool are still out — possible only by `mem::forget`-ing a
    /// [`Buffer`](super::Buffer), e.g. a ring that gives up buffers a device never released — the device may
    /// still write them, so the pool leaks its mapping on purpose: the memory stays mapped,
    /// pinned and in the device's address space until the process exits, and
    /// [`leaked_mappings`] counts it.
    /// Nothing is logged. Buffers allocated by other processes of a shared pool are theirs to
    /// account for: only this process's buffers count here.
    fn drop(&mut self) {
        // The arena first (its slots retired before it goes: `ArenaBox`), the mapping under
        // it after.
        // SAFETY: taken once, here; `self.arena` is not used after this line.
        let out = unsafe { ManuallyDrop::take(&mut self.arena) }.close();
        // SAFETY: taken once, here; `self.mapping` is not used after this line.
        let mapping = unsafe { ManuallyDrop::take(&mut self.mapping) };
        if out == 0 {
            drop(mapping);
        } else {
            // Relaxed: a statistic.
            LEAKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            crate::memory::keep_until_exit(mapping);
        }
    }
}

// SAFETY: `base` points into `mapping`, which the pool owns and which is Send; the arena is made
// of atomics and of cache slots whose unsynchronized parts are only touched by their owning
// thread (see the `cache` module). Nothing in a pool is tied to the thread that made it.
unsafe impl Send for Core {}
// SAFETY: every `&self` method either touches the arena's atomics, the calling thread's own
// cache slot, or reads immutable fields; buffer memory is only reached through raw pointers and
// volatile accesses by the buffer that owns it.
unsafe impl Sync for Core {}

impl Core {
    /// The count of threads waiting for a free block, which every cached free reads after its
    /// push (`cache::someone_waits_after_push`).
    #[inline(always)]
    pub(super) fn waiters(&self) -> &AtomicU32 {
        // SAFETY: `waiters` points into the arena's metadata, alive as long as `self`.
        unsafe { self.waiters.as_ref() }
    }

    /// Host address of block `unit` (for [`Buffer::as_ptr`]).
    #[inline(always)]
    pub(super) fn host_of(&self, unit: u32) -> NonNull<u8> {
        // SAFETY: `assemble` refused a base that is not a multiple of MIN_ALIGN. Telling the
        // compiler so lets it drop the alignment checks of `Slice::read`/`write` at offsets
        // it can see are aligned (every unit offset is a multiple of MIN_ALIGN too).
        unsafe { std::hint::assert_unchecked(self.base.as_ptr() as usize % MIN_ALIGN == 0) };
        // SAFETY: `unit` is a block of this arena, so its offset is below the arena length, and
        // the arena lies inside the mapping: the result is inside it too.
        unsafe { self.base.add(Geometry::offset(unit) as usize) }
    }

    /// IOVA of block `unit` (for [`Buffer::iova`]).
    #[inline(always)]
    pub(super) fn iova_of(&self, unit: u32) -> u64 {
        let offset = Geometry::offset(unit);
        match &self.iovas {
            Iovas::Linear(first) => first + offset,
            Iovas::Chunks { shift, iovas } => {
                let chunk = iovas.get((offset >> shift) as usize).copied().unwrap_or(0);
                chunk + (offset & ((1 << shift) - 1))
            }
        }
    }

    #[cold]
    pub(super) fn error(&self, failure: Failure, len: usize) -> Error {
        match failure {
            Failure::Exhausted => Error::Exhausted {
                len,
                waited: self.config.timeout().unwrap_or_default(),
            },
            Failure::TooLarge => Error::TooLarge {
                len,
                max: self.max_len() as u64,
            },
        }
    }

    /// Capacity in bytes of `block` (for [`Buffer::capacity`]).
    pub(super) fn capacity_of(&self, block: Block) -> usize {
        // At most the arena length, which fits a `usize`.
        block.size(self.arena.geometry()) as usize
    }

    /// Frees a buffer's block (its `Drop`).
    #[inline(always)]
    pub(super) fn free_block(&self, block: Block) {
        let mut cached = false;
        if let Some(c) = block.class() {
            cached = cache::fast_push(self.id, c, block.unit());
            if cached && !cache::someone_waits_after_push(self.waiters()) {
                return;
            }
        }
        self.free_slow(block, cached);
    }

    /// A free that the cache did not take, or that it took while a thread waits for a block
    /// (`cached`): one out-of-line call from the fast path for both, so the path a `Buffer`'s
    /// drop inlines stays small.
    #[cold]
    pub(super) fn free_slow(&self, block: Block, cached: bool) {
        match block.class() {
            Some(c) if cached => self.arena.hand_over(c),
            _ => self.arena.free(block),
        }
    }

    /// The mapping offset of block `unit`.
    pub(super) fn mapping_offset(&self, unit: u32) -> usize {
        self.arena_offset + Geometry::offset(unit) as usize
    }

    /// The largest `len` an allocation can ever satisfy (see [`Pool::max_len`]).
    #[inline]
    pub(super) fn max_len(&self) -> usize {
        let g = self.arena.geometry();
        (g.chunk_size() << g.max_order).min(u64::from(u32::MAX)) as usize
    }

    /// The mapping the pool carves.
    pub(super) fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// The fast half of an owned buffer's free (its `Drop`), for a small block (`unit` of
    /// class `c`): on this thread's slot of a live pool with room in its magazine, into it
    /// (handing the class over, inside the handshake, if a thread waits for a block), and
    /// `true`; otherwise nothing, and `false` (the caller then runs `free_owned_uncached`).
    #[inline(always)]
    pub(super) fn free_owned_cached(&self, c: usize, unit: u32) -> bool {
        let Some(slot) = cache::fast_slot(self.id) else {
            return false;
        };
        // SAFETY: a slot in this thread's fast table was claimed by this thread and is kept
        // alive by its table, which nothing below touches (as `cache::with_fast_slot`).
        let mine = unsafe { OwnedSlot::new(slot.as_ref()) };
        self.leases
            .free_cached(mine, move |mine| {
                // SAFETY: `c` is the class in a small buffer's tag, which `Buffer::new` took
                // from a block of this pool's classes (at most `MAX_CLASSES`), and which
                // nothing else writes (the buffer's fields are private).
                if !unsafe { mine.push_in_owned(c, unit) } {
                    return None;
                }
                if cache::someone_waits_after_push(self.waiters()) {
                    self.hand_over(c);
                }
                Some(())
            })
            .is_some()
    }

    /// A thread waits for a block of class `c`: hands this thread's cached ones over.
    #[cold]
    #[inline(never)]
    pub(super) fn hand_over(&self, c: usize) {
        self.arena.hand_over(c);
    }

    /// The slow half of an owned buffer's free: `Leases::free_uncached` over this pool.
    /// Returns whether the caller frees this state now.
    pub(super) fn free_owned_uncached(&self, block: Block) -> bool {
        self.leases.free_uncached(
            || self.free_block(block),
            || self.arena.free_uncached(block),
        )
    }

    /// Counts an owned allocation this thread made on its slow path: in its slot's cache of
    /// class `c` if it has one at hand (for a large buffer, class 0, which every pool has:
    /// only the sum over a slot's classes is read), else in the shared count.
    #[cold]
    pub(super) fn count_owned_alloc(&self, c: usize) {
        if cache::with_fast_slot(self.id, |mine| mine.count_owned(c, 1)).is_none() {
            self.leases.count_direct(1);
        }
    }

    /// The handle's drop: whether it frees this state now (see `Leases::retire`).
    pub(super) fn retire(&self) -> bool {
        self.leases
            .retire(self.arena.slots(), self.arena.geometry().classes)
    }
}
