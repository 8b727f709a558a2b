//! Per-thread caches: magazines of block units, one per size class, per (thread, pool).
//!
//! A pool owns a fixed set of cache [`Slot`]s (`Config::max_threads`), allocated at creation
//! as zeroed memory ([`Slots::new`]): a slot's magazines take room (memory the process
//! touches) only in the classes its thread uses, each sized by the pool's geometry the first
//! time ([`OwnedSlot::enable`]). A thread claims a slot the first time it uses a pool (one CAS) and
//! records it in its thread-local table: `WAYS` entries of `(pool id, slot)`, the pool's *home* entry being
//! `id % WAYS` (a hit elsewhere swaps the entry home). The table has two halves: [`FastTable`], what
//! the fast path reads, has no destructor, so reaching it is a plain `%fs`-relative access with
//! no "initialized?" check; [`OwnerTable`] owns the slots and has the destructor that flushes them
//! at thread exit. The fast path is that one thread-local access, one compare of the home
//! entry's id, and a pop or push on the class's magazine: plain loads and stores, no atomic
//! read-modify-write. Pool ids are never reused, so an entry left behind by a dropped pool can
//! never match a live one. With more than `WAYS` pools in use, a thread evicts (flushes) the
//! entry of the pool it used least recently at the home position.
//!
//! **Lifetimes.** The slots are shared by the pool and the threads that claimed one of them
//! through an `Arc` ([`SlotRef`]), and each slot's `state` word arbitrates who may touch the
//! pool through it:
//!
//! ```text
//!   FREE --claim (thread, CAS)--> ACTIVE --release (thread exit / eviction, CAS)--> FLUSHING
//!     ^                              |                                                  |
//!     +--------------- flushed into the pool's shared lists, store --------------------+
//!   FREE or ACTIVE --pool drop (CAS)--> GONE   (the pool drains an ACTIVE slot's magazines)
//! ```
//!
//! A thread flushes its slot back to the shared lists when it exits (`OwnerTable`'s destructor, which
//! also empties `FastTable`, so a buffer freed later in the thread's teardown goes to the shared
//! lists) or evicts the entry; the pool's `Drop` waits while a slot is `FLUSHING`, so a flushing thread
//! always flushes into a live pool, and marks every slot `GONE`, after which the thread only
//! drops its `SlotRef`. The pool can drain an `ACTIVE` slot in its `Drop` because dropping a pool
//! requires that no `&Pool` or `Buffer` borrow is alive, so no thread is inside a pool call, and
//! the end of those borrows on other threads was synchronized (join, channel) as it must be for
//! any `Sync` type. A dropped pool therefore neither leaks blocks into a cache nor leaves a
//! dangling pointer in one.
//!
//! If all slots are claimed, further threads run uncached: correct, slower (every operation goes
//! to the shared lists). That decision is remembered per thread (an entry with no slot).
//!
//! **Reclaiming.** Blocks in a thread's magazine are free, and an allocation must not fail
//! while a free block of its class is anywhere in the process, however large the caches and
//! whether their threads are busy or idle. When a class's shared level is dry, the allocating
//! thread becomes the class's *reclaimer* (`Arena::reclaim`, under the class's lock): it claims
//! every owned slot's cached blocks of the class from the bottom of the magazine (moving its
//! `top`), runs a heavy barrier (`crate::sync::asymmetric`: `membarrier`), reads each
//! magazine's length again and takes what the owner did not pop meanwhile. The owner's pop
//! reads `top` after lowering `len` and a compiler barrier; its push needs nothing (see
//! [`ClassCache`]): one load per pop is all the fast path pays, because the reclaimer's
//! barrier makes every CPU running an owner execute the fence. Blocks an owner is moving
//! between its magazine and the shared level (a refill or a flush) are in neither place for a
//! moment: the owner marks such moves ([`OwnedSlot::moving`]) and a reclaimer that finds nothing
//! looks again while one is under way. A free reads the count of waiting allocations after its
//! push ([`fast_push`]): a waiter counts itself in and then reclaims, so either it finds the
//! block in the cache or the free hands the class's blocks over.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use super::arena::Arena;
use super::geometry::{Geometry, BATCH_MAX, MAG_MAX, MAX_CLASSES};
#[cfg(loom)]
use crate::sync::UnsafeCell;
use crate::sync::{asymmetric, thread, Arc, AtomicU32, AtomicU64, Mutex, Ordering};

/// Slot state: claimable.
const FREE: u32 = 0;
/// Slot state: owned by a thread.
const ACTIVE: u32 = 1;
/// Slot state: its thread is flushing it into the pool.
const FLUSHING: u32 = 2;
/// Slot state: the pool is gone.
const GONE: u32 = 3;

/// Entries in a thread's table: the pools a thread can use concurrently without evictions.
const WAYS: usize = 8;

/// The block units of one class's magazine: `items[top..len]` of its [`ClassCache`]. The owner
/// reads and writes at the `len` end; a reclaimer reads only a range it claimed below the
/// owner's (see [`ClassCache`]), so no element is ever touched by both at once. The elements
/// are reached through raw pointers to exactly the range an access uses, never through a
/// reference to the whole array, which the other side's accesses would alias.
#[cfg(not(loom))]
struct Items(std::cell::UnsafeCell<[u32; MAG_MAX]>);

/// Under loom, one cell per element, so the model checks each element's accesses (a cell for
/// the whole array would report the owner's and the reclaimer's disjoint accesses as a race).
#[cfg(loom)]
struct Items([UnsafeCell<u32>; MAG_MAX]);

impl std::fmt::Debug for Items {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Items")
    }
}

#[cfg(not(loom))]
impl Items {
    /// The first element.
    #[inline(always)]
    fn base(&self) -> *mut u32 {
        self.0.get().cast::<u32>()
    }

    /// Element `i`.
    ///
    /// # Safety
    /// `i < MAG_MAX`, and no other thread writes element `i` during the call.
    #[inline(always)]
    unsafe fn get(&self, i: usize) -> u32 {
        // SAFETY: in bounds, and not written concurrently (caller's contract).
        unsafe { self.base().add(i).read() }
    }

    /// Sets element `i`.
    ///
    /// # Safety
    /// `i < MAG_MAX`, and no other thread touches element `i` during the call.
    #[inline(always)]
    unsafe fn set(&self, i: usize, unit: u32) {
        // SAFETY: in bounds, and not touched concurrently (caller's contract).
        unsafe { self.base().add(i).write(unit) }
    }

    /// Copies elements `start..start + out.len()` into `out`, the last first (the magazine's
    /// top first, as single pops hand them out). Inlined by the compiler as vector loads,
    /// shuffles and stores rather than a call, which costs more than the copy at these sizes.
    ///
    /// # Safety
    /// In bounds, and no other thread writes those elements during the call.
    #[inline(always)]
    unsafe fn read_rev(&self, start: usize, out: &mut [u32]) {
        // SAFETY: in bounds, initialized (zeroed memory or written units), and not written
        // concurrently (caller's contract).
        let items = unsafe { std::slice::from_raw_parts(self.base().add(start), out.len()) };
        for (slot, &unit) in out.iter_mut().zip(items.iter().rev()) {
            *slot = unit;
        }
    }

    /// Writes `units` reversed at `start` (so `read_rev` hands them back in this order).
    ///
    /// # Safety
    /// In bounds, and no other thread touches those elements during the call.
    #[inline(always)]
    unsafe fn write_rev(&self, start: usize, units: &[u32]) {
        // SAFETY: in bounds and not touched concurrently (caller's contract): the only
        // reference to them.
        let items = unsafe { std::slice::from_raw_parts_mut(self.base().add(start), units.len()) };
        for (slot, &unit) in items.iter_mut().rev().zip(units) {
            *slot = unit;
        }
    }

    /// Copies elements `start..start + out.len()` into `out`, in order.
    ///
    /// # Safety
    /// As [`Items::read_rev`].
    #[inline(always)]
    unsafe fn read(&self, start: usize, out: &mut [u32]) {
        // SAFETY: as `read_rev` (caller's contract); `out` is not the magazine.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base().add(start), out.as_mut_ptr(), out.len())
        }
    }

    /// Writes `units` at `start`, in order.
    ///
    /// # Safety
    /// As [`Items::write_rev`].
    #[inline(always)]
    unsafe fn write(&self, start: usize, units: &[u32]) {
        // SAFETY: as `write_rev` (caller's contract); `units` is not the magazine.
        unsafe {
            std::ptr::copy_nonoverlapping(units.as_ptr(), self.base().add(start), units.len())
        }
    }

    /// The `N` elements from `start`, as an array.
    ///
    /// # Safety
    /// As [`Items::range`].
    #[inline(always)]
    unsafe fn array<const N: usize>(&self, start: usize) -> [u32; N] {
        // SAFETY: as `range` (caller's contract); `[u32; N]` has `u32`'s alignment.
        unsafe { self.base().add(start).cast::<[u32; N]>().read() }
    }

    /// Writes `units` at `start`.
    ///
    /// # Safety
    /// As [`Items::range_mut`].
    #[inline(always)]
    unsafe fn set_array<const N: usize>(&self, start: usize, units: [u32; N]) {
        // SAFETY: as `range_mut` (caller's contract).
        unsafe { self.base().add(start).cast::<[u32; N]>().write(units) }
    }

    /// Moves elements `from..from + len` to `to..to + len` (`to < from`).
    ///
    /// # Safety
    /// In bounds, and no other thread touches either range during the call.
    unsafe fn move_down(&self, from: usize, to: usize, len: usize) {
        // SAFETY: in bounds and unshared (caller's contract); `copy` allows overlap.
        unsafe { std::ptr::copy(self.base().add(from), self.base().add(to), len) }
    }
}

#[cfg(loom)]
impl Items {
    fn new() -> Self {
        Items(std::array::from_fn(|_| UnsafeCell::new(0)))
    }

    unsafe fn get(&self, i: usize) -> u32 {
        // SAFETY: as in the non-loom build.
        self.0[i].with(|p| unsafe { *p })
    }

    unsafe fn set(&self, i: usize, unit: u32) {
        // SAFETY: as in the non-loom build.
        self.0[i].with_mut(|p| unsafe { *p = unit })
    }

    unsafe fn array<const N: usize>(&self, start: usize) -> [u32; N] {
        // SAFETY: as in the non-loom build.
        std::array::from_fn(|k| unsafe { self.get(start + k) })
    }

    unsafe fn read_rev(&self, start: usize, out: &mut [u32]) {
        let n = out.len();
        for (k, slot) in out.iter_mut().enumerate() {
            // SAFETY: as in the non-loom build.
            *slot = unsafe { self.get(start + n - 1 - k) };
        }
    }

    unsafe fn write_rev(&self, start: usize, units: &[u32]) {
        let n = units.len();
        for (k, &unit) in units.iter().enumerate() {
            // SAFETY: as in the non-loom build.
            unsafe { self.set(start + n - 1 - k, unit) };
        }
    }

    unsafe fn read(&self, start: usize, out: &mut [u32]) {
        for (k, slot) in out.iter_mut().enumerate() {
            // SAFETY: as in the non-loom build.
            *slot = unsafe { self.get(start + k) };
        }
    }

    unsafe fn write(&self, start: usize, units: &[u32]) {
        for (k, &unit) in units.iter().enumerate() {
            // SAFETY: as in the non-loom build.
            unsafe { self.set(start + k, unit) };
        }
    }

    unsafe fn set_array<const N: usize>(&self, start: usize, units: [u32; N]) {
        for (k, unit) in units.into_iter().enumerate() {
            // SAFETY: as in the non-loom build.
            unsafe { self.set(start + k, unit) };
        }
    }

    unsafe fn move_down(&self, from: usize, to: usize, len: usize) {
        for k in 0..len {
            // SAFETY: as in the non-loom build.
            unsafe { self.set(to + k, self.get(from + k)) };
        }
    }
}

/// A thread's cache of one size class: a magazine of block units, `items[top..len]`, and the
/// thread's counters for the class.
///
/// **Who touches what.** The owner (the slot's thread) pops and pushes at the `len` end; it
/// alone writes `len`, `cap` and `batch`. A *reclaimer* (`Arena::reclaim`, holding the class's
/// reclaim lock) claims blocks from the `top` end: it stores `top = len` (all it saw), runs a
/// heavy barrier, reads `len` again and keeps `[old top, min(claim, len))`, then stores `top`
/// there. A pop stores its new `len`, runs a light barrier (`crate::sync::asymmetric`) and
/// reads `top`: either the reclaimer's second read of `len` sees the pop (and leaves that
/// block alone) or the pop sees the claim (and takes nothing, restores `len` and goes to its
/// slow path, which settles under the lock). A push writes above `len` and needs no check: a
/// reclaimer reads only below the `len` it saw. So the fast path pays one load (of `top`, in
/// the line it writes anyway) per pop and nothing per push: no fence, no read-modify-write,
/// no extra store.
///
/// `top` is written only under the class's reclaim lock, by a reclaimer or by the owner
/// settling ([`OwnedSlot::settle`]: moving the blocks down to index 0 after a reclaim).
#[repr(C, align(64))]
pub(crate) struct ClassCache {
    /// Allocations served through this cache (hits and refills). Written only by the owner.
    allocs: AtomicU64,
    /// Frees into this cache (including those that flushed). Written only by the owner.
    frees: AtomicU64,
    /// Allocations that found the magazine empty and refilled it from the shared level.
    misses: AtomicU64,
    /// One past the newest cached block. Written only by the owner.
    len: AtomicU32,
    /// Capacity, 0 until the class is first used ([`OwnedSlot::enable`]). Owner only.
    cap: AtomicU32,
    /// Blocks moved per refill or flush. Owner only.
    batch: AtomicU32,
    /// The oldest cached block the owner may use (see above).
    top: AtomicU32,
    items: Items,
    // The fields of the slow paths after the magazine, so that its elements start where
    // they did before the reclaimer's fields were added: moving them by 28 bytes slowed a
    // batch made each round by half here (the elements' offset in the page against the
    // buffers' first lines, which the same loop writes).
    /// A reclaimer's claim: `1 + top` before it (0: none). Reclaimer only, under the lock.
    claim: AtomicU32,
    /// Twice the number of moves of blocks between this magazine and the shared level the
    /// owner began, plus 1 while one is under way (the blocks then in neither place): a
    /// reclaimer that found nothing retries while it sees one move, or one more than before.
    /// Owner only (a plain load and store per move).
    moves: AtomicU64,
    /// The reclaimer's snapshot of `moves`. Reclaimer only, under the lock.
    seen_moves: AtomicU64,
}

impl std::fmt::Debug for ClassCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Relaxed: a snapshot for debugging.
        f.debug_struct("ClassCache")
            .field("len", &self.len.load(Ordering::Relaxed))
            .field("top", &self.top.load(Ordering::Relaxed))
            .field("cap", &self.cap.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Adds `n` to a counter only its owner writes: a load and a store, no read-modify-write.
#[inline(always)]
fn add(counter: &AtomicU64, n: usize) {
    // Relaxed: single writer (the slot's owner); readers only load.
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n as u64),
        Ordering::Relaxed,
    );
}

impl ClassCache {
    /// An empty cache with no room yet (all zero: see [`Slots::new`]); [`OwnedSlot::enable`] gives
    /// it its capacity the first time the slot's thread uses the class.
    #[cfg(loom)]
    fn new() -> Self {
        Self {
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            len: AtomicU32::new(0),
            top: AtomicU32::new(0),
            cap: AtomicU32::new(0),
            batch: AtomicU32::new(0),
            moves: AtomicU64::new(0),
            claim: AtomicU32::new(0),
            seen_moves: AtomicU64::new(0),
            items: Items::new(),
        }
    }

    /// Allocations served through this cache (hits and refills), as of some moment during the
    /// call (statistics).
    pub(crate) fn allocs(&self) -> u64 {
        // Relaxed: statistics.
        self.allocs.load(Ordering::Relaxed)
    }

    /// Frees into this cache (statistics, as [`ClassCache::allocs`]).
    pub(crate) fn frees(&self) -> u64 {
        // Relaxed: statistics.
        self.frees.load(Ordering::Relaxed)
    }

    /// Allocations that refilled the magazine (statistics, as [`ClassCache::allocs`]).
    pub(crate) fn misses(&self) -> u64 {
        // Relaxed: statistics.
        self.misses.load(Ordering::Relaxed)
    }

    /// Owner: the magazine's length now.
    #[inline(always)]
    fn len(&self) -> u32 {
        // Relaxed: only the owner writes it.
        self.len.load(Ordering::Relaxed)
    }

    /// Owner: sets the length.
    #[inline(always)]
    fn set_len(&self, len: u32) {
        // Release: the units written below `len` before this are seen by a reclaimer that
        // reads this value (Acquire); every store of `len` is a Release, so whichever value a
        // reclaimer reads, it synchronizes with the store that wrote it.
        self.len.store(len, Ordering::Release);
    }

    /// Owner, after lowering `len` to `new`: whether a reclaimer's claim reaches above `new`,
    /// in which case the owner must not take the blocks (see [`ClassCache`]).
    #[inline(always)]
    fn claimed_above(&self, new: u32) -> bool {
        asymmetric::light();
        // Relaxed: what decides is which store of `len` and `top` each side saw, which the
        // barriers order; no data moves through `top`.
        self.top.load(Ordering::Relaxed) > new
    }

    /// Owner: a move between the magazine and the shared level begins (see `moves`).
    fn move_begins(&self) {
        // Relaxed, then the light barrier: a reclaimer's heavy barrier makes the mark visible
        // before the blocks leave the magazine or the shared level, as far as it can tell.
        add(&self.moves, 1);
        asymmetric::light();
    }

    /// Owner: the move ended (the blocks are in their new place).
    fn move_ends(&self) {
        // Release: the blocks' arrival (the shared level's push, or `len`) happens before a
        // reclaimer that reads this value (Acquire).
        self.moves.store(
            self.moves.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Release,
        );
    }

    /// Reclaimer (holding the class's lock): claims every block the magazine holds and
    /// records the owner's moves; `false` if it holds none.
    pub(crate) fn claim(&self) -> bool {
        // Acquire: pairs with the owner's Release stores (`move_ends`).
        self.seen_moves
            .store(self.moves.load(Ordering::Acquire), Ordering::Relaxed);
        // Relaxed: `top` changes only under the lock we hold.
        let top = self.top.load(Ordering::Relaxed);
        // Acquire: pairs with `set_len`: the units below it are seen.
        let len = self.len.load(Ordering::Acquire);
        if len <= top {
            self.claim.store(0, Ordering::Relaxed);
            return false;
        }
        self.claim.store(top + 1, Ordering::Relaxed);
        // Relaxed: ordered before the owner's next `claimed_above` by the heavy barrier the
        // reclaimer runs before `take_claimed`.
        self.top.store(len, Ordering::Relaxed);
        true
    }

    /// Reclaimer, after [`ClassCache::claim`] and a heavy barrier: hands the claimed blocks the
    /// owner did not take meanwhile to `sink`, in batches of at most `batch`, and gives the
    /// rest back (`top`).
    pub(crate) fn take_claimed(&self, batch: usize, mut sink: impl FnMut(&[u32])) {
        // Relaxed: only the reclaimer writes it.
        let Some(from) = self.claim.load(Ordering::Relaxed).checked_sub(1) else {
            return;
        };
        self.claim.store(0, Ordering::Relaxed);
        let claimed = self.top.load(Ordering::Relaxed);
        // Acquire: as in `claim`. After the heavy barrier this sees every pop that did not see
        // the claim, so the blocks below it are the owner's no more.
        let end = claimed.min(self.len.load(Ordering::Acquire));
        let mut units = [0u32; BATCH_MAX];
        let mut at = from;
        while at < end {
            let n = ((end - at) as usize).min(batch.clamp(1, BATCH_MAX));
            for (k, unit) in units[..n].iter_mut().enumerate() {
                // SAFETY: `at + k < end <= len <= MAG_MAX`; the owner touches no element below
                // `end` while `top` (the claim) is above its `len` (see `ClassCache`).
                *unit = unsafe { self.items.get(at as usize + k) };
            }
            sink(&units[..n]);
            at += n as u32;
        }
        // Release: pairs with nothing the owner needs to see but the index itself; the
        // blocks from `end` up are the owner's again.
        self.top.store(end.max(from), Ordering::Release);
    }

    /// Reclaimer: whether the owner began or ended a move since [`ClassCache::claim`], or is
    /// in one.
    pub(crate) fn moved(&self) -> bool {
        // Acquire: pairs with `move_ends`: a move seen ended has its blocks in place.
        let now = self.moves.load(Ordering::Acquire);
        now & 1 != 0 || now != self.seen_moves.load(Ordering::Relaxed)
    }
}

/// A cache slot the calling thread owns (it claimed it and has not released it), or that the
/// pool's `Drop` has exclusive access to, for `'a`. Not `Send`: ownership is per thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnedSlot<'a> {
    slot: &'a Slot,
    _not_send: PhantomData<*const ()>,
}

impl<'a> OwnedSlot<'a> {
    /// Asserts ownership of `slot`.
    ///
    /// # Safety
    /// For `'a`, the calling thread owns `slot` (claimed by it, not released), or has exclusive
    /// access to it (the pool's `Drop`). Several `OwnedSlot`s of one slot on its thread are fine:
    /// each method touches the magazine only for its own duration and none calls another.
    #[inline(always)]
    pub(crate) unsafe fn new(slot: &'a Slot) -> Self {
        Self {
            slot,
            _not_send: PhantomData,
        }
    }

    /// Class `c`'s cache (`c` is a class of the pool: callers check it). Clamped rather than
    /// bounds-checked: no panic path on the fast path, whose size decides whether a
    /// `Buffer`'s drop inlines it.
    #[inline(always)]
    fn cache(&self, c: usize) -> &'a ClassCache {
        &self.slot.classes[c.min(MAX_CLASSES - 1)]
    }

    /// Pops a cached block of class `c`. `None` if the magazine is empty, or a reclaimer
    /// claimed the block (the slow path then settles).
    #[inline(always)]
    pub(crate) fn pop(&self, c: usize) -> Option<u32> {
        let cache = self.cache(c);
        let len = cache.len();
        let new = len.checked_sub(1)?;
        // Read before the pop commits: only the owner ever writes a magazine's elements (a
        // reclaimer only reads), so the read races with nothing; if the block turns out to be
        // claimed, the value is dropped.
        // SAFETY: `new < len <= cap <= MAG_MAX` (the mask changes nothing and spares a bounds
        // check); no other thread writes it.
        let unit = unsafe { cache.items.get(new as usize & (MAG_MAX - 1)) };
        cache.set_len(new);
        if cache.claimed_above(new) {
            cache.set_len(len);
            return None;
        }
        add(&cache.allocs, 1);
        Some(unit)
    }

    /// Moves up to `out.len()` cached blocks of class `c` into `out` (the magazine's top, in
    /// its order), returns how many: 0 as well if a reclaimer claimed some of them. One copy
    /// and one counter update for the whole batch: what a [`Batch`](super::Batch) allocates
    /// with.
    #[inline(always)]
    pub(crate) fn pop_into(&self, c: usize, out: &mut [u32]) -> usize {
        let cache = self.cache(c);
        let len = cache.len();
        let n = (len as usize).min(out.len()).min(MAG_MAX);
        if n == 0 {
            return 0;
        }
        // `n <= len`.
        let new = len - n as u32;
        // Read before the pop commits, as in `pop`. Top first, as single pops hand them out.
        // SAFETY: `new + n = len <= MAG_MAX`; no other thread writes them.
        unsafe { cache.items.read_rev(new as usize, &mut out[..n]) };
        cache.set_len(new);
        if cache.claimed_above(new) {
            cache.set_len(len);
            return 0;
        }
        add(&cache.allocs, n);
        n
    }

    /// Takes the top `N` cached blocks of class `c` as an array (top first, as `pop_into` hands
    /// them out), or `None` (and nothing taken) if fewer are cached or some are claimed.
    #[inline(always)]
    pub(crate) fn pop_array<const N: usize>(&self, c: usize) -> Option<[u32; N]> {
        let cache = self.cache(c);
        let len = cache.len();
        let new = len.checked_sub(u32::try_from(N).ok()?)?;
        // Read before the pop commits, as in `pop`.
        // SAFETY: `new + N = len <= MAG_MAX`; no other thread writes them.
        let mut units: [u32; N] = unsafe { cache.items.array(new as usize) };
        cache.set_len(new);
        if cache.claimed_above(new) {
            cache.set_len(len);
            return None;
        }
        units.reverse();
        add(&cache.allocs, N);
        Some(units)
    }

    /// Pushes as many of `units` (freed blocks of class `c`) as the magazine has room for, in
    /// one copy; returns how many (a prefix of `units`).
    #[inline(always)]
    pub(crate) fn push_from(&self, c: usize, units: &[u32]) -> usize {
        let cache = self.cache(c);
        let len = cache.len();
        // Relaxed: owner only. `cap <= MAG_MAX`.
        let cap = cache.cap.load(Ordering::Relaxed);
        let n = (cap.saturating_sub(len) as usize).min(units.len());
        if n == 0 {
            return 0;
        }
        // SAFETY: `len + n <= cap <= MAG_MAX`; above `len`, where no reclaimer reads.
        // Reversed, so that `pop_into` (which takes the top first) hands a batch back in the
        // order it was freed.
        unsafe { cache.items.write_rev(len as usize, &units[..n]) };
        cache.set_len(len + n as u32);
        add(&cache.frees, n);
        n
    }

    /// Pushes `N` freed blocks of class `c` in one fixed-size copy (reversed, as `push_from`
    /// stores them); `false` (and nothing pushed) if the magazine has room for fewer.
    #[inline(always)]
    pub(crate) fn push_array<const N: usize>(&self, c: usize, units: &[u32; N]) -> bool {
        let cache = self.cache(c);
        let len = cache.len() as usize;
        // Relaxed: owner only.
        let cap = cache.cap.load(Ordering::Relaxed) as usize;
        let end = len + N;
        if end > cap.min(MAG_MAX) {
            return false;
        }
        let mut reversed = *units;
        reversed.reverse();
        // SAFETY: `end <= MAG_MAX`; above `len`, where no reclaimer reads.
        unsafe { cache.items.set_array(len, reversed) };
        cache.set_len(end as u32);
        add(&cache.frees, N);
        true
    }

    /// Pushes a freed block of class `c`; `false` (and nothing pushed) if the magazine is full.
    #[inline(always)]
    pub(crate) fn push(&self, c: usize, unit: u32) -> bool {
        let cache = self.cache(c);
        let len = cache.len();
        // Relaxed: owner only.
        if len >= cache.cap.load(Ordering::Relaxed) {
            return false;
        }
        // SAFETY: `len < cap <= MAG_MAX` (the mask changes nothing and spares a bounds check);
        // above `len`, where no reclaimer reads.
        unsafe { cache.items.set(len as usize & (MAG_MAX - 1), unit) };
        cache.set_len(len + 1);
        add(&cache.frees, 1);
        true
    }

    /// Whether class `c` is cached at all, giving its magazine the capacity and batch of
    /// geometry `g` (the slot's pool's) the first time: a slot is made with no room in any
    /// class, so that the pages of the classes a thread never uses are never written. Called
    /// by every slow path before it uses the magazine; until then the fast paths find a
    /// magazine with no room and go there.
    #[inline]
    pub(crate) fn enable(&self, c: usize, g: &Geometry) -> bool {
        let cache = self.cache(c);
        // Relaxed: owner only.
        if cache.cap.load(Ordering::Relaxed) == 0 && c < g.classes {
            // Nothing held (`len <= cap == 0`), so any capacity is consistent.
            let class = g.class[c];
            cache
                .cap
                .store(class.cap.min(MAG_MAX as u32), Ordering::Relaxed);
            cache.batch.store(class.batch, Ordering::Relaxed);
        }
        cache.cap.load(Ordering::Relaxed) != 0
    }

    /// Class `c`'s refill/flush batch (0 until the class is enabled).
    #[inline(always)]
    pub(crate) fn batch(&self, c: usize) -> u32 {
        // Relaxed: owner only.
        self.cache(c).batch.load(Ordering::Relaxed)
    }

    /// Settles class `c` after a reclaimer took blocks from it: under `lock` (the class's
    /// reclaim lock, so no reclaimer is at work), moves the remaining blocks down to index 0.
    /// A pop that found its blocks claimed, or a push that found no room, calls this before
    /// trying again.
    pub(crate) fn settle(&self, c: usize, lock: &Mutex<()>) {
        let cache = self.cache(c);
        // Relaxed: a hint; the lock orders the real read.
        if cache.top.load(Ordering::Relaxed) == 0 {
            return;
        }
        let _locked = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // Relaxed: `top` changes only under the lock we hold (which ordered the last
        // reclaimer's writes before this).
        let top = cache.top.load(Ordering::Relaxed);
        let len = cache.len();
        // A reclaimer leaves `top <= len` (it keeps only what the owner did not take).
        let kept = len.saturating_sub(top);
        if top > 0 {
            // SAFETY: `top + kept = len <= MAG_MAX`; no reclaimer works (we hold the lock) and
            // this is the owner: nobody else touches the elements.
            unsafe { cache.items.move_down(top as usize, 0, kept as usize) };
        }
        cache.set_len(kept);
        // Relaxed: under the lock, which the next reclaimer takes.
        cache.top.store(0, Ordering::Relaxed);
    }

    /// Marks a move of class `c`'s blocks between the magazine and the shared level: `f` does
    /// it (see `ClassCache::moves`). A reclaimer that finds nothing while one is under way, or
    /// happened since it looked, looks again.
    pub(crate) fn moving<R>(&self, c: usize, f: impl FnOnce() -> R) -> R {
        let cache = self.cache(c);
        cache.move_begins();
        // Ends however `f` returns.
        struct End<'a>(&'a ClassCache);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                self.0.move_ends();
            }
        }
        let _end = End(cache);
        f()
    }

    /// Adds `items` to class `c`'s magazine (as many as fit; callers refill an empty one with at
    /// most a batch), returns how many it took, and counts one allocation that missed; the
    /// caller then pops, and gives back what did not fit.
    pub(crate) fn refill(&self, c: usize, items: &[u32]) -> usize {
        let cache = self.cache(c);
        let len = cache.len() as usize;
        // Relaxed: owner only.
        let cap = (cache.cap.load(Ordering::Relaxed) as usize).min(MAG_MAX);
        let room = cap.saturating_sub(len).min(items.len());
        // SAFETY: `len + room <= MAG_MAX`; above `len`, where no reclaimer reads.
        unsafe { cache.items.write(len, &items[..room]) };
        cache.set_len((len + room) as u32);
        add(&cache.misses, 1);
        room
    }

    /// Moves up to `n` of class `c`'s most recently cached blocks into `out`; returns how many
    /// (0 as well if a reclaimer claimed them: settle first).
    pub(crate) fn take(&self, c: usize, n: usize, out: &mut [u32; BATCH_MAX]) -> usize {
        let cache = self.cache(c);
        let len = cache.len();
        let n = n.min(len as usize).min(BATCH_MAX);
        if n == 0 {
            return 0;
        }
        let new = len - n as u32;
        // Read before the take commits, as in `pop`.
        // SAFETY: `new + n = len <= MAG_MAX`; no other thread writes them.
        unsafe { cache.items.read(new as usize, &mut out[..n]) };
        cache.set_len(new);
        if cache.claimed_above(new) {
            cache.set_len(len);
            return 0;
        }
        n
    }

    /// Whether no reclaimer took from class `c` since the magazine was last settled (its
    /// blocks start at index 0).
    pub(crate) fn is_settled(&self, c: usize) -> bool {
        // Relaxed: a hint; `settle` reads it again under the lock.
        self.cache(c).top.load(Ordering::Relaxed) == 0
    }

    /// Blocks cached in class `c` that this thread may use (statistics and tests).
    pub(crate) fn held(&self, c: usize) -> usize {
        let cache = self.cache(c);
        // Relaxed: owner only (and `top` a hint).
        cache
            .len()
            .saturating_sub(cache.top.load(Ordering::Relaxed)) as usize
    }
}

/// One thread's caches for one pool.
#[derive(Debug)]
pub(crate) struct Slot {
    state: AtomicU32,
    classes: [ClassCache; MAX_CLASSES],
}

// SAFETY: a magazine's elements (the only non-atomic state) are touched by one thread at a
// time: the thread that claimed the slot (state ACTIVE or FLUSHING, handed over with
// Acquire/Release on `state`) above the magazine's `top`, a reclaimer the range below it that
// it claimed (see `ClassCache`), or the pool's Drop once no thread can be inside a pool call
// (see the module docs). Everything else is atomics.
unsafe impl Sync for Slot {}
// SAFETY: as above; a slot holds no thread-bound data.
unsafe impl Send for Slot {}

impl Slot {
    /// The counters of class `c` (`c < MAX_CLASSES`).
    pub(crate) fn class(&self, c: usize) -> &ClassCache {
        &self.classes[c]
    }

    /// Claims the slot for the calling thread if it is free.
    pub(crate) fn claim(&self) -> bool {
        // Acquire: pairs with the Release store of FREE by the previous owner's release, so
        // this thread sees the magazines and counters as that thread left them.
        self.state
            .compare_exchange(FREE, ACTIVE, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Called by the owning thread when it stops using the slot (thread exit, eviction):
    /// flushes the magazines into `arena` and frees the slot, unless the pool is gone.
    ///
    /// # Safety
    /// The caller is the slot's owning thread, and `arena` is the arena that handed the slot
    /// out (it may have been dropped since; then the slot is `GONE` and `arena` is not used).
    unsafe fn release(&self, arena: *const Arena) {
        // Acquire: pairs with nothing the pool writes before GONE that we need; it orders our
        // flush after our claim. The CAS is what keeps the pool alive: its Drop waits while the
        // state is FLUSHING.
        if self
            .state
            .compare_exchange(ACTIVE, FLUSHING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            // SAFETY: the state is FLUSHING, so the arena's Drop has not passed this slot and
            // waits for it: the arena is alive until we store FREE. We are the owner (contract).
            unsafe { (*arena).drain_slot(OwnedSlot::new(self)) };
            // Release: pairs with the Acquire CAS in `claim` (next owner) and in `retire` (the
            // pool's Drop), publishing the emptied magazines.
            self.state.store(FREE, Ordering::Release);
        }
    }

    /// Called by the pool's `Drop`: marks the slot `GONE`, waiting while its thread flushes.
    /// Returns whether the slot was owned (its magazines may hold blocks to drain).
    pub(crate) fn retire(&self) -> bool {
        loop {
            // Acquire: pairs with the Release store of FREE in `release`.
            let state = self.state.load(Ordering::Acquire);
            match state {
                FLUSHING => thread::yield_now(),
                GONE => return false,
                _ => {
                    // Acquire: as above, if the state changed under us.
                    if self
                        .state
                        .compare_exchange(state, GONE, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        return state == ACTIVE;
                    }
                }
            }
        }
    }

    /// Whether a thread holds the slot or is flushing it: whose magazines a reclaimer looks
    /// in.
    pub(crate) fn is_owned(&self) -> bool {
        // Relaxed: a slot claimed after this has empty magazines (drained when last released,
        // and the claim's Acquire saw it); one released after this is looked in all the same,
        // and its flush is a marked move (`OwnedSlot::moving`).
        matches!(self.state.load(Ordering::Relaxed), ACTIVE | FLUSHING)
    }

    /// Whether a thread holds the slot now (statistics).
    pub(crate) fn is_claimed(&self) -> bool {
        // Relaxed: statistics.
        self.state.load(Ordering::Relaxed) == ACTIVE
    }

    fn is_gone(&self) -> bool {
        // Relaxed: a hint for choosing which table entry to reuse; GONE is final.
        self.state.load(Ordering::Relaxed) == GONE
    }
}

/// One entry of a thread's fast table: what the fast path reads.
#[derive(Debug)]
struct FastEntry {
    /// Pool id, 0 for an empty entry.
    id: Cell<u64>,
    /// The claimed slot, or null if the pool had no free slot (the thread runs uncached).
    slot: Cell<*const Slot>,
}

/// The fast path's half of a thread's table. No destructor, so a thread-local access to it is a
/// plain `%fs`-relative address with no "initialized / destroyed" check; entries are only set
/// while [`OwnerTable`] (which has the destructor) holds the slots, and `OwnerTable`'s destructor clears
/// them.
#[derive(Debug)]
struct FastTable {
    entries: [FastEntry; WAYS],
}

/// The slow path's half of a thread's table: ownership of the slots and the arenas to flush
/// them into. Entry `i` describes the same pool as `FastTable::entries[i]`.
#[derive(Debug)]
struct OwnerTable {
    arenas: [Cell<*const Arena>; WAYS],
    owners: RefCell<[Option<SlotRef>; WAYS]>,
}

#[cfg(not(loom))]
std::thread_local! {
    static FAST: FastTable = const { FastTable::new() };
    static OWNERS: OwnerTable = const { OwnerTable::new() };
}

#[cfg(loom)]
loom::thread_local! {
    static FAST: FastTable = FastTable::new();
    static OWNERS: OwnerTable = OwnerTable::new();
}

impl FastTable {
    const fn new() -> Self {
        Self {
            entries: [const {
                FastEntry {
                    id: Cell::new(0),
                    slot: Cell::new(ptr::null()),
                }
            }; WAYS],
        }
    }

    /// Home entry index of pool `id`.
    #[inline(always)]
    fn home(id: u64) -> usize {
        // Truncation intended: only the low bits select the entry.
        id as usize & (WAYS - 1)
    }
}

impl OwnerTable {
    const fn new() -> Self {
        Self {
            arenas: [const { Cell::new(ptr::null()) }; WAYS],
            owners: RefCell::new([const { None }; WAYS]),
        }
    }

    /// The slot of `arena` in this thread: found, or claimed now. `None`: uncached.
    fn find_or_claim(&self, fast: &FastTable, arena: &Arena) -> Option<*const Slot> {
        let id = arena.id();
        let home = FastTable::home(id);
        if let Some(at) = fast.entries.iter().position(|e| e.id.get() == id) {
            if at != home {
                self.swap(fast, at, home);
            }
            return Some(fast.entries[home].slot.get()).filter(|p| !p.is_null());
        }
        let claimed = arena.claim_slot();
        // Reuse an empty entry or one of a dropped pool, preferring home; else evict home.
        let reusable = |e: &FastEntry| {
            let slot = e.slot.get();
            // SAFETY: a non-null slot pointer is kept alive by the `SlotRef` in `owners`.
            e.id.get() == 0 || (!slot.is_null() && unsafe { &*slot }.is_gone())
        };
        let victim = if reusable(&fast.entries[home]) {
            home
        } else {
            fast.entries.iter().position(reusable).unwrap_or(home)
        };
        self.release(fast, victim);
        let slot = claimed.as_deref().map_or(ptr::null(), ptr::from_ref);
        fast.entries[victim].id.set(id);
        fast.entries[victim].slot.set(slot);
        self.arenas[victim].set(arena);
        self.owners.borrow_mut()[victim] = claimed;
        if victim != home {
            self.swap(fast, victim, home);
        }
        Some(slot).filter(|p| !p.is_null())
    }

    fn swap(&self, fast: &FastTable, a: usize, b: usize) {
        fast.entries[a].id.swap(&fast.entries[b].id);
        fast.entries[a].slot.swap(&fast.entries[b].slot);
        self.arenas[a].swap(&self.arenas[b]);
        self.owners.borrow_mut().swap(a, b);
    }

    /// Releases entry `at`: forgets it, then flushes its slot into its pool (if alive).
    fn release(&self, fast: &FastTable, at: usize) {
        fast.entries[at].id.set(0);
        fast.entries[at].slot.set(ptr::null());
        let arena = self.arenas[at].replace(ptr::null());
        let owner = self.owners.borrow_mut()[at].take();
        if let Some(slot) = owner {
            // SAFETY: this thread claimed the slot (it is in this thread's table) and `arena`
            // is the arena that handed it out.
            unsafe { slot.release(arena) };
        }
    }
}

impl Drop for OwnerTable {
    fn drop(&mut self) {
        let drained = FAST.try_with(|fast| {
            for at in 0..WAYS {
                self.release(fast, at);
            }
        });
        if drained.is_err() {
            // The fast table is already gone (loom drops every thread-local at once): flush with
            // a scratch one.
            let fast = FastTable::new();
            for at in 0..WAYS {
                self.release(&fast, at);
            }
        }
    }
}

/// The slot of this thread in the pool `id`, if it is in the home entry and has a slot.
#[inline(always)]
fn fast_slot(id: u64) -> Option<NonNull<Slot>> {
    // Only the lookup runs inside the thread-local access, and the operation after it, so how
    // much the operation inlines never decides whether the access itself is inlined (with a
    // whole batch free inside it, `LocalKey::try_with` went out of line: a call on every
    // batch free).
    FAST.try_with(|fast| {
        let entry = &fast.entries[FastTable::home(id)];
        (entry.id.get() == id).then(|| entry.slot.get())
    })
    .ok()
    .flatten()
    .and_then(|slot| NonNull::new(slot.cast_mut()))
}

/// Runs `f` on this thread's slot in the pool `id` if it is in the home entry (the fast path).
/// `None` if it is not, or if the thread runs uncached.
#[inline(always)]
pub(crate) fn with_fast_slot<R>(id: u64, f: impl FnOnce(OwnedSlot<'_>) -> R) -> Option<R> {
    let slot = fast_slot(id)?;
    // SAFETY: a non-null slot in this thread's fast table is kept alive by the `SlotRef` in its
    // owner table and was claimed by this thread, which has not released it (releasing clears
    // the entry first). `f` runs on this thread and never reaches the tables (pool operations
    // do not re-enter them), so nothing releases the slot during the call.
    Some(f(unsafe { OwnedSlot::new(slot.as_ref()) }))
}

/// After a push into a cache: whether a thread waits for a free block. Read after the push's
/// store of `len` and a light barrier; a waiter counts itself in (`waiters`), runs a heavy
/// barrier and then reclaims (reading `len`): either the waiter finds the block in the cache,
/// or this sees the count and the free hands the blocks over (`Arena::hand_over`).
#[inline(always)]
pub(crate) fn someone_waits_after_push(waiters: &AtomicU32) -> bool {
    asymmetric::light();
    // Relaxed: ordered after the push by the light barrier, against the waiter's heavy one.
    waiters.load(Ordering::Relaxed) != 0
}

/// The fast path of an allocation: pops a block of class `c` from this thread's cache of the
/// pool `id`, if that is its home entry and the magazine is not empty.
#[inline(always)]
pub(crate) fn fast_pop(id: u64, c: usize) -> Option<u32> {
    with_fast_slot(id, |mine| mine.pop(c)).flatten()
}

/// The fast path of a free: pushes block `unit` of class `c` into this thread's cache of the
/// pool `id`, if that is its home entry and the magazine has room (the caller then checks
/// [`someone_waits_after_push`]).
#[inline(always)]
pub(crate) fn fast_push(id: u64, c: usize, unit: u32) -> bool {
    with_fast_slot(id, |mine| mine.push(c, unit)).unwrap_or(false)
}

/// The whole-batch fast path of an allocation: the top `N` blocks of class `c` from this
/// thread's cache of the pool `id` as one array, if that is its home entry and the magazine
/// holds `N`.
#[inline(always)]
pub(crate) fn fast_pop_array<const N: usize>(id: u64, c: usize) -> Option<[u32; N]> {
    with_fast_slot(id, |mine| mine.pop_array(c)).flatten()
}

/// The whole-batch fast path of a free: pushes the `N` blocks of class `c` in `units` into
/// this thread's cache of the pool `id` in one copy, if that is its home entry and the
/// magazine has room for all of them (the caller then checks [`someone_waits_after_push`]).
#[inline(always)]
pub(crate) fn fast_push_array<const N: usize>(id: u64, c: usize, units: &[u32; N]) -> bool {
    with_fast_slot(id, |mine| mine.push_array(c, units)).unwrap_or(false)
}

/// Runs `f` on this thread's slot in `arena`, claiming one if needed; `f` gets `None` if the
/// thread runs uncached (no free slot, or its table is gone during thread teardown).
pub(crate) fn with_slot<R>(arena: &Arena, f: impl FnOnce(Option<OwnedSlot<'_>>) -> R) -> R {
    let slot = FAST
        .try_with(|fast| {
            OWNERS
                .try_with(|owners| owners.find_or_claim(fast, arena))
                .ok()
                .flatten()
        })
        .ok()
        .flatten();
    // SAFETY: `find_or_claim` returned a slot this thread claimed, kept alive by the `SlotRef` in
    // this thread's table until the entry is released. Only this thread releases it: on exit,
    // through `release_current` (flush), or by evicting it to claim a slot in another pool.
    // `f` is an operation on this same pool that never calls back into the table, so none of
    // those can happen while it runs.
    f(slot.map(|slot| unsafe { OwnedSlot::new(&*slot) }))
}

/// Flushes and releases this thread's slot in the pool `id`, if it has one.
pub(crate) fn release_current(id: u64) {
    let _ = FAST.try_with(|fast| {
        OWNERS.try_with(|owners| {
            if let Some(at) = fast.entries.iter().position(|e| e.id.get() == id) {
                owners.release(fast, at);
            }
        })
    });
}

/// A pool's cache slots, all unclaimed, in one allocation that lives as long as the pool or any
/// thread that holds one of them (see [`SlotRef`]).
pub(crate) struct Slots {
    /// The slots' memory: an anonymous mapping, zero-filled by the kernel page by page as it
    /// is first touched (an allocator's zeroed allocation of this alignment would write every
    /// byte), unmapped when dropped (nothing in a slot owns anything). `None` for no slots.
    #[cfg(not(loom))]
    _map: Option<memmap2::MmapRaw>,
    /// The first of `len` slots, at the start of `_map` (dangling when `len` is 0).
    #[cfg(not(loom))]
    first: NonNull<Slot>,
    /// How many slots (not under loom, where `slots` knows).
    #[cfg(not(loom))]
    len: usize,
    #[cfg(loom)]
    slots: Box<[Slot]>,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("len", &self.as_slice().len())
            .finish_non_exhaustive()
    }
}

// SAFETY: `Slots` owns its mapping and only hands out `&Slot`s, which are `Sync`; it holds no
// thread-bound data (the raw pointer is into the mapping it owns).
unsafe impl Send for Slots {}
// SAFETY: as above: `&Slots` gives only `&Slot`s, and `Slot` is `Sync`.
unsafe impl Sync for Slots {}

// Unclaimed is all-zero: a slot is made by zeroing its memory.
const _: () = assert!(FREE == 0);

impl Slots {
    /// `n` unclaimed slots, each with empty magazines that have no room yet.
    ///
    /// Made as zero-filled memory, which is every field's starting value (`FREE`, zero
    /// counters, empty magazines with capacity zero), so nothing is written: a slot's pages
    /// (about 47 KiB of magazines per slot) take memory only once its thread uses a class
    /// (`OwnedSlot::enable`).
    ///
    /// # Errors
    /// The mapping could not be made (address space or map count exhausted).
    #[cfg(not(loom))]
    pub(crate) fn new(n: usize) -> std::io::Result<Self> {
        let size = std::mem::size_of::<Slot>()
            .checked_mul(n)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        if size == 0 {
            return Ok(Self {
                _map: None,
                first: NonNull::dangling(),
                len: 0,
            });
        }
        let map = memmap2::MmapRaw::from(memmap2::MmapOptions::new().len(size).map_anon()?);
        // Page-aligned, and a slot's alignment (64) divides a page.
        const _: () = assert!(std::mem::align_of::<Slot>() <= 4096);
        let Some(first) = NonNull::new(map.as_mut_ptr().cast::<Slot>()) else {
            unreachable!("a mapping is never at address 0");
        };
        Ok(Self {
            _map: Some(map),
            first,
            len: n,
        })
    }

    /// `n` unclaimed slots (loom's atomics and cells carry model state, so each is built).
    #[cfg(loom)]
    pub(crate) fn new(n: usize) -> std::io::Result<Self> {
        let slots: Box<[Slot]> = (0..n)
            .map(|_| Slot {
                state: AtomicU32::new(FREE),
                classes: std::array::from_fn(|_| ClassCache::new()),
            })
            .collect();
        Ok(Self { slots })
    }

    /// The slots.
    pub(crate) fn as_slice(&self) -> &[Slot] {
        #[cfg(not(loom))]
        // SAFETY: `first` points to `len` slots at the start of `_map`, which this value owns
        // (a dangling pointer for none): the mapping is `len * size_of::<Slot>()` bytes,
        // page-aligned (so aligned for `Slot`), and zero-filled where never written, and zero
        // is a valid value of every field of a slot (atomics, `FREE` being 0; `u32`s in an
        // `UnsafeCell`). Slots are only ever changed through those atomics and cells, never
        // through a `&mut`, so shared references to them are sound for as long as `self`
        // lives, which keeps the mapping.
        unsafe {
            std::slice::from_raw_parts(self.first.as_ptr(), self.len)
        }
        #[cfg(loom)]
        &self.slots
    }

    /// The slots, one by one.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, Slot> {
        self.as_slice().iter()
    }
}

/// One slot of a pool's [`Slots`], held by the thread that claimed it: it keeps the slots alive
/// (after the pool is gone too, until the thread has released it).
#[derive(Debug)]
pub(crate) struct SlotRef {
    slots: Arc<Slots>,
    index: usize,
}

impl std::ops::Deref for SlotRef {
    type Target = Slot;
    fn deref(&self) -> &Slot {
        &self.slots.as_slice()[self.index]
    }
}

impl SlotRef {
    /// Claims a free slot of `slots` for the calling thread: a handle that keeps every slot
    /// alive.
    pub(crate) fn claim(slots: &Arc<Slots>) -> Option<Self> {
        let index = slots.iter().position(Slot::claim)?;
        Some(Self {
            slots: Arc::clone(slots),
            index,
        })
    }
}
