//! The pool's core: an offset allocator over an arena `[0, len)`.
//!
//! It knows nothing of pointers, IOVAs or mappings — blocks are byte offsets — which is what
//! lets the same code serve a private pool, a pool whose metadata is in memory shared with
//! another process, the loom models and the fuzz target. [`super::Pool`] wraps its blocks into
//! buffers at the edge.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::buddy::Buddy;
use super::cache::{self, OwnedSlot, SlotRef, Slots};
use super::central::Central;
use super::geometry::{class_of, Geometry, BATCH_MAX, MAX_CLASSES};
use super::meta::Meta;
use super::stats::{ClassStats, LargeStats, Stats};
use super::wait;
use super::Error;
use crate::sync::{asymmetric, thread, Arc, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering};

mod bulk;
mod handle;
mod reclaim;

pub(crate) use self::handle::ArenaBox;

/// Longest a waiter sleeps before re-checking (and reclaiming) on its own: bounds the delay
/// for a free in another process of a shared pool, whose caches this process cannot reclaim
/// and whose frees this process's heavy barrier does not order.
const POLL: Duration = Duration::from_millis(1);

/// How long a reclaimer that finds nothing keeps looking while owners move blocks between
/// their caches and the shared level (see `Arena::reclaim`).
const RECLAIM_PATIENCE: Duration = Duration::from_millis(50);

/// Tag bit of a block's kind for a buddy (large) block; the low bits are then its order.
const LARGE: u32 = 1 << 31;

/// Bit of a [`Block::tag`] marking a large block; the bits below it are then its order.
pub(crate) const TAG_LARGE: u32 = 64;
// Every class and every order fits below the bit, and a tag fits in 7 bits.
const _: () = assert!(MAX_CLASSES <= TAG_LARGE as usize);
const _: () = assert!(super::geometry::MAX_ORDERS <= TAG_LARGE as usize);

/// An allocated block: where it is in the arena and what it was allocated as, packed in one
/// `u64` (unit in the low half, kind in the high half) so that a [`super::Buffer`] stays small
/// and moves it with single 8-byte loads and stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Block(u64);

impl Block {
    /// The block at `unit` of kind `kind` (a size class, or `LARGE | order`).
    #[inline(always)]
    fn new(unit: u32, kind: u32) -> Self {
        Self(u64::from(unit) | (u64::from(kind) << 32))
    }

    /// Block `unit` of size class `class`.
    #[inline(always)]
    pub(crate) fn small(unit: u32, class: usize) -> Self {
        // `class < MAX_CLASSES`, so the cast is exact.
        Self::new(unit, class as u32)
    }

    /// The large block of `2^order` chunks starting at chunk `chunk`.
    fn large(chunk: u32, order: u32, g: &Geometry) -> Self {
        Self::new(
            Geometry::unit(u64::from(chunk) << g.chunk_shift),
            LARGE | order,
        )
    }

    /// The block's kind in 7 bits, for a buffer to carry: its size class, or
    /// [`TAG_LARGE`]` | order` for a large block.
    #[inline(always)]
    pub(crate) fn tag(&self) -> u32 {
        match self.class() {
            Some(c) => c as u32,
            None => TAG_LARGE | (self.kind() & !LARGE),
        }
    }

    /// The block at `unit` whose [`Block::tag`] is `tag`.
    #[inline(always)]
    pub(crate) fn from_tag(unit: u32, tag: u32) -> Self {
        if tag & TAG_LARGE == 0 {
            Self::new(unit, tag)
        } else {
            Self::new(unit, LARGE | (tag & !TAG_LARGE))
        }
    }

    /// Size class, or `LARGE | order`.
    #[inline(always)]
    fn kind(&self) -> u32 {
        // The high half of our own packed word.
        (self.0 >> 32) as u32
    }

    /// Offset in the arena in 256-byte units.
    #[inline(always)]
    pub(crate) fn unit(&self) -> u32 {
        // The low half of our own packed word.
        self.0 as u32
    }

    /// Byte offset in the arena (a multiple of 256).
    #[inline(always)]
    pub(crate) fn offset(&self) -> u64 {
        Geometry::offset(self.unit())
    }

    /// The size class, or `None` for a large block.
    #[inline(always)]
    pub(crate) fn class(&self) -> Option<usize> {
        let kind = self.kind();
        (kind & LARGE == 0).then_some(kind as usize)
    }

    /// Capacity of the block in bytes.
    pub(crate) fn size(&self, g: &Geometry) -> u64 {
        match self.class() {
            Some(c) => g.block_size(c),
            None => g.chunk_size() << (self.kind() & !LARGE),
        }
    }
}

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Nothing free (after waiting, if the pool waits).
    Exhausted,
    /// Larger than the largest buddy block the arena can ever hold.
    TooLarge,
}

/// Process-wide source of pool ids; 0 is never handed out (it marks an empty cache entry).
/// A plain std atomic on purpose: a unique-id counter, not part of any modelled algorithm.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Counters of operations that bypass thread caches, for this process.
#[derive(Debug, Default)]
struct Direct {
    allocs: AtomicU64,
    frees: AtomicU64,
}

/// One process's handle on an arena: shared metadata plus process-local caches and counters.
/// Always boxed: thread caches hold its address (see [`cache`]), so it must not move.
#[derive(Debug)]
pub(crate) struct Arena {
    id: u64,
    g: Geometry,
    meta: Meta,
    slots: Arc<Slots>,
    direct: [Direct; MAX_CLASSES],
    /// Large blocks this process allocated and freed.
    large: Direct,
    timeout: Option<Duration>,
    shared_futex: bool,
    /// `meta.wait[0].waiters`, read on every free: a pointer saves the table indirection.
    waiters: NonNull<AtomicU32>,
    /// Per class: held by its reclaimer, and by an owner settling its magazine after one
    /// ([`Arena::reclaim`], `cache::OwnedSlot::settle`).
    locks: [Mutex<()>; MAX_CLASSES],
    /// Per class: twice the moves of uncached threads through the shared level begun (see
    /// [`Arena::take_direct`]), for reclaimers.
    uncached_moves: [AtomicU64; MAX_CLASSES],
}

// SAFETY: `waiters` points into `meta`, which the arena owns (heap) or borrows from a mapping
// that outlives it, and is only read atomically; everything else is Send + Sync on its own.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// An arena over `meta`, with `slots` (made for `g.threads`: [`Arena::slots_for`]) as its
    /// thread-cache slots. `fresh`: initialize the metadata (a new pool); otherwise attach to
    /// metadata another process initialized. `timeout`: how long an allocation waits when
    /// nothing is free (`None`: fail at once). `shared_futex`: the metadata is in memory shared
    /// between processes. Returns the handle that owns it ([`ArenaBox`]).
    pub(crate) fn create(
        g: Geometry,
        meta: Meta,
        slots: Slots,
        fresh: bool,
        timeout: Option<Duration>,
        shared_futex: bool,
    ) -> ArenaBox {
        if fresh {
            Central::new(&g, &meta).init();
            Buddy::new(&g, &meta).init();
        }
        let waiters = NonNull::from(&meta.wait[0].waiters);
        ArenaBox(ManuallyDrop::new(Box::new(Self {
            waiters,
            // Relaxed: uniqueness is all that is needed.
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            slots: Arc::new(slots),
            g,
            meta,
            direct: std::array::from_fn(|_| Direct::default()),
            large: Direct::default(),
            timeout,
            shared_futex,
            locks: std::array::from_fn(|_| Mutex::new(())),
            uncached_moves: std::array::from_fn(|_| AtomicU64::new(0)),
        })))
    }

    /// The thread-cache slots for an arena of geometry `g`: made before the arena, so that a
    /// pool being created fails before it has written anything.
    ///
    /// # Errors
    /// [`Error::CacheSlots`] when their memory cannot be mapped.
    pub(crate) fn slots_for(g: &Geometry) -> Result<Slots, Error> {
        Slots::new(g.threads).map_err(|source| Error::CacheSlots {
            threads: g.threads,
            source,
        })
    }

    /// The pool id thread caches key on.
    #[inline(always)]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The word waiters count themselves in (see `waiters_word`), for the pool's fast path.
    pub(crate) fn waiters(&self) -> NonNull<AtomicU32> {
        self.waiters
    }

    /// The arena's geometry.
    pub(crate) fn geometry(&self) -> &Geometry {
        &self.g
    }

    fn central(&self) -> Central<'_> {
        Central::new(&self.g, &self.meta)
    }

    /// The count of threads (of any process) waiting for a free block, which a free reads
    /// after pushing into its cache (`cache::someone_waits_after_push`).
    #[inline(always)]
    pub(crate) fn waiters_word(&self) -> &AtomicU32 {
        // SAFETY: `waiters` points into `self.meta` (see the field), alive as long as `self`.
        unsafe { self.waiters.as_ref() }
    }

    /// Claims a free cache slot for the calling thread.
    pub(crate) fn claim_slot(&self) -> Option<SlotRef> {
        SlotRef::claim(&self.slots)
    }

    /// Class `c`'s reclaim lock (see `Arena::reclaim`).
    fn lock(&self, c: usize) -> &Mutex<()> {
        &self.locks[c]
    }

    /// Allocates a block for `len` bytes.
    #[inline]
    pub(crate) fn alloc(&self, len: usize) -> Result<Block, Failure> {
        let c = class_of(len);
        if c < self.g.classes {
            if let Some(Some(unit)) = cache::with_fast_slot(self.id, |mine| mine.pop(c)) {
                return Ok(Block::small(unit, c));
            }
            return self.alloc_small_slow(c);
        }
        self.alloc_large(len)
    }

    /// Frees a block this arena allocated.
    #[inline]
    pub(crate) fn free(&self, block: Block) {
        if let Some(c) = block.class() {
            let unit = block.unit();
            if !cache::fast_push(self.id, c, unit) {
                self.free_small_slow(c, unit);
            } else if cache::someone_waits_after_push(self.waiters_word()) {
                self.hand_over(c);
            }
        } else {
            self.free_large(block);
        }
    }

    /// Frees a block straight to the shared level, through no thread cache: a retired pool's
    /// owned buffer (the `lease` module), whose pool no thread should cache for again.
    pub(crate) fn free_uncached(&self, block: Block) {
        match block.class() {
            Some(c) => self.free_direct(c, block.unit()),
            None => self.free_large(block),
        }
    }

    /// The thread-cache slots.
    pub(crate) fn slots(&self) -> &Slots {
        &self.slots
    }

    #[cold]
    fn alloc_small_slow(&self, c: usize) -> Result<Block, Failure> {
        if let Some(block) = self.try_alloc_small(c).or_else(|| self.reclaim(c)) {
            return Ok(block);
        }
        self.wait_for(|| self.try_alloc_small(c).or_else(|| self.reclaim(c)))
    }

    /// A block of class `c` from this thread's cache, refilled from the shared level if empty,
    /// or straight from the shared level for an uncached thread.
    fn try_alloc_small(&self, c: usize) -> Option<Block> {
        let cached = cache::with_slot(self, |mine| {
            let mine = mine.filter(|mine| mine.enable(c, &self.g))?;
            if let Some(unit) = self.cache_pop(mine, c) {
                return Some(Some(unit));
            }
            if !self.refill(mine, c) {
                return Some(None);
            }
            Some(self.cache_pop(mine, c))
        });
        match cached {
            Some(result) => result.map(|unit| Block::small(unit, c)),
            None => self.take_direct(c),
        }
    }

    /// Pops a block of class `c` from this thread's cache, settling the magazine when a
    /// reclaimer took from it (a pop then finds its block claimed, or an empty top).
    fn cache_pop(&self, mine: OwnedSlot<'_>, c: usize) -> Option<u32> {
        // A reclaimer can claim again only after taking the lock `settle` takes, so each
        // round either pops or settles a claim that came in between: a few rounds suffice.
        for _ in 0..4 {
            if let Some(unit) = mine.pop(c) {
                return Some(unit);
            }
            if mine.held(c) == 0 && mine.is_settled(c) {
                return None;
            }
            mine.settle(c, self.lock(c));
        }
        None
    }

    /// Refills class `c`'s magazine with a batch from the shared level, giving back whatever
    /// it did not take (a move: see `OwnedSlot::moving`); `false` if the shared level had nothing.
    fn refill(&self, mine: OwnedSlot<'_>, c: usize) -> bool {
        mine.moving(c, || {
            let mut batch = [0u32; BATCH_MAX];
            let n = self.central().take(c, mine.batch(c), &mut batch);
            if n == 0 {
                return false;
            }
            // Counts one miss; the pop that follows is that allocation.
            let kept = mine.refill(c, &batch[..n]);
            if kept < n {
                self.give(c, &batch[kept..n]);
            }
            true
        })
    }

    /// Moves up to a batch of class `c`'s cached blocks to the shared level (a move); returns
    /// how many.
    fn flush(&self, mine: OwnedSlot<'_>, c: usize) -> usize {
        let batch = (mine.batch(c) as usize).max(1);
        let mut units = [0u32; BATCH_MAX];
        let mut n = mine.moving(c, || {
            let n = mine.take(c, batch, &mut units);
            self.give(c, &units[..n]);
            n
        });
        if n == 0 && mine.held(c) > 0 {
            // A reclaimer claimed the top blocks meanwhile: settle and try once more.
            mine.settle(c, self.lock(c));
            n = mine.moving(c, || {
                let n = mine.take(c, batch, &mut units);
                self.give(c, &units[..n]);
                n
            });
        }
        n
    }

    /// Frees `unit` (class `c`) into this thread's cache, making room if the magazine is full;
    /// `false` if the class is uncached (the caller frees it directly). Hands the class's
    /// blocks over if a thread waits.
    fn cache_free(&self, mine: OwnedSlot<'_>, c: usize, unit: u32) -> bool {
        if !mine.enable(c, &self.g) {
            return false;
        }
        let mut pushed = mine.push(c, unit);
        if !pushed {
            // Room below a reclaimer's old claim comes back by settling; else flush a batch.
            mine.settle(c, self.lock(c));
            pushed = mine.push(c, unit) || (self.flush(mine, c) > 0 && mine.push(c, unit));
        }
        if pushed && cache::someone_waits_after_push(self.waiters_word()) {
            self.hand_over_from(mine, c);
        }
        pushed
    }

    #[cold]
    fn free_small_slow(&self, c: usize, unit: u32) {
        let cached = cache::with_slot(self, |mine| {
            mine.is_some_and(|mine| self.cache_free(mine, c, unit))
        });
        if !cached {
            self.free_direct(c, unit);
        }
    }

    /// Frees a block straight to the shared level.
    fn free_direct(&self, c: usize, unit: u32) {
        self.give(c, &[unit]);
        // Relaxed: statistics.
        self.direct[c].frees.fetch_add(1, Ordering::Relaxed);
    }

    /// One block of class `c` straight from the shared level (an uncached thread, or a
    /// reclaimer), the rest of what came with it given back. The blocks given back are in
    /// neither place meanwhile: counted in `uncached_moves` for reclaimers.
    fn take_direct(&self, c: usize) -> Option<Block> {
        let moves = &self.uncached_moves[c];
        // SeqCst (both): a reclaimer that reads the count after missing these blocks sees the
        // move begun, or its end (after the give).
        moves.fetch_add(1, Ordering::SeqCst);
        let mut batch = [0u32; BATCH_MAX];
        let n = self.central().take(c, 1, &mut batch);
        if n > 1 {
            self.give(c, &batch[1..n]);
        }
        moves.fetch_add(1, Ordering::SeqCst);
        if n == 0 {
            return None;
        }
        // Relaxed: statistics.
        self.direct[c].allocs.fetch_add(1, Ordering::Relaxed);
        Some(Block::small(batch[0], c))
    }

    fn alloc_large(&self, len: usize) -> Result<Block, Failure> {
        let order = u64::try_from(len)
            .ok()
            .and_then(|len| self.g.order_of(len))
            .ok_or(Failure::TooLarge)?;
        let attempt = || {
            self.central()
                .alloc_large(order)
                .map(|chunk| Block::large(chunk, order, &self.g))
        };
        let block = match attempt() {
            Some(block) => block,
            None => self.wait_for(attempt)?,
        };
        // Relaxed: statistics (see `blocks_out`).
        self.large.allocs.fetch_add(1, Ordering::Relaxed);
        Ok(block)
    }

    fn free_large(&self, block: Block) {
        let chunk = u32::try_from(block.offset() >> self.g.chunk_shift).unwrap_or(u32::MAX);
        self.central().free_large(chunk, block.kind() & !LARGE);
        // Relaxed: statistics (see `blocks_out`).
        self.large.frees.fetch_add(1, Ordering::Relaxed);
        self.wake_waiters();
    }

    /// Blocks this process allocated and has not freed (small and large). Exact when no thread
    /// is inside a call on this arena (the pool's `Drop`): every counter is then final and
    /// its last write happened before the borrows of the pool ended.
    pub(crate) fn blocks_out(&self) -> u64 {
        let mut out = 0u64;
        for c in 0..self.g.classes {
            for slot in self.slots.iter() {
                let cache = slot.class(c);
                // See above: the end of the borrows ordered the counters' writes.
                out = out.wrapping_add(cache.allocs()).wrapping_sub(cache.frees());
            }
            out = out
                .wrapping_add(self.direct[c].allocs.load(Ordering::Relaxed))
                .wrapping_sub(self.direct[c].frees.load(Ordering::Relaxed));
        }
        out.wrapping_add(self.large.allocs.load(Ordering::Relaxed))
            .wrapping_sub(self.large.frees.load(Ordering::Relaxed))
    }

    /// Flushes a slot's magazines into the shared level: its owner releasing it, or `Drop`.
    pub(crate) fn drain_slot(&self, mine: OwnedSlot<'_>) {
        for c in 0..self.g.classes {
            mine.settle(c, self.lock(c));
            while self.flush(mine, c) > 0 {}
        }
    }

    /// Flushes and releases the calling thread's cache of this arena.
    pub(crate) fn flush_current_thread(&self) {
        cache::release_current(self.id);
    }

    /// A snapshot of the counters (see [`super::stats`] for how exact it is).
    pub(crate) fn stats(&self) -> Stats {
        let shared = self.central();
        let classes = (0..self.g.classes)
            .map(|c| {
                let (mut allocs, mut frees, mut misses) = (0u64, 0u64, 0u64);
                for slot in self.slots.iter() {
                    let cache = slot.class(c);
                    allocs += cache.allocs();
                    frees += cache.frees();
                    misses += cache.misses();
                }
                let cache_hits = allocs.saturating_sub(misses);
                allocs += self.direct[c].allocs.load(Ordering::Relaxed);
                frees += self.direct[c].frees.load(Ordering::Relaxed);
                let class = &self.meta.classes[c];
                let (free, uncarved_bytes, gap_bytes) = shared.free_in_class(c);
                ClassStats {
                    size: self.g.block_size(c),
                    allocs,
                    frees,
                    cache_hits,
                    shared_hits: class.shared_hits.load(Ordering::Relaxed),
                    carved: class.carved.load(Ordering::Relaxed),
                    in_use: allocs.saturating_sub(frees),
                    outstanding: class.out.load(Ordering::Relaxed),
                    high_water: class.high_water.load(Ordering::Relaxed),
                    free,
                    slabs: class.slabs.load(Ordering::Relaxed),
                    uncarved_bytes,
                    gap_bytes,
                    stride: self.g.stride(c),
                }
            })
            .collect();
        let globals = &self.meta.globals[0];
        let chunk = self.g.chunk_size();
        let (free_chunks, largest) = Buddy::new(&self.g, &self.meta).free_summary();
        let large = LargeStats {
            allocs: globals.large_allocs.load(Ordering::Relaxed),
            frees: globals.large_frees.load(Ordering::Relaxed),
            in_use_bytes: globals.large_chunks.load(Ordering::Relaxed) * chunk,
            high_water_bytes: globals.large_high_water.load(Ordering::Relaxed) * chunk,
            buddy_allocs: globals.buddy_allocs.load(Ordering::Relaxed),
            buddy_frees: globals.buddy_frees.load(Ordering::Relaxed),
            splits: globals.splits.load(Ordering::Relaxed),
            merges: globals.merges.load(Ordering::Relaxed),
            free_bytes: free_chunks * chunk,
            largest_free_bytes: largest.map_or(0, |order| chunk << order),
        };
        Stats {
            arena_bytes: self.g.len,
            chunk_bytes: chunk,
            classes,
            large,
            cached_threads: self.slots.iter().filter(|s| s.is_claimed()).count() as u64,
        }
    }
}

/// Locks `mutex`, which guards no data (a panic while holding it left nothing half done).
fn lock(mutex: &Mutex<()>) -> MutexGuard<'_, ()> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
