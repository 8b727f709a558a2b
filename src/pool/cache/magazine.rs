//! A class's magazine ([`ClassCache`]): the block units a thread keeps for one size class,
//! the owner's end and the reclaimer's, and the counters the pool's statistics read.

#![allow(clippy::wildcard_imports)] // the cache module's constants and imports

use super::*;
#[cfg(loom)]
use crate::sync::UnsafeCell;

/// The block units of one class's magazine: `items[top..len]` of its [`ClassCache`]. The owner
/// reads and writes at the `len` end; a reclaimer reads only a range it claimed below the
/// owner's (see [`ClassCache`]), so no element is ever touched by both at once. The elements
/// are reached through raw pointers to exactly the range an access uses, never through a
/// reference to the whole array, which the other side's accesses would alias.
#[cfg(not(loom))]
pub(super) struct Items(std::cell::UnsafeCell<[u32; MAG_MAX]>);

/// Under loom, one cell per element, so the model checks each element's accesses (a cell for
/// the whole array would report the owner's and the reclaimer's disjoint accesses as a race).
#[cfg(loom)]
pub(super) struct Items([UnsafeCell<u32>; MAG_MAX]);

impl std::fmt::Debug for Items {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Items")
    }
}

#[cfg(not(loom))]
impl Items {
    /// The first element.
    #[inline(always)]
    pub(super) fn base(&self) -> *mut u32 {
        self.0.get().cast::<u32>()
    }

    /// Element `i`.
    ///
    /// # Safety
    /// `i < MAG_MAX`, and no other thread writes element `i` during the call.
    #[inline(always)]
    pub(super) unsafe fn get(&self, i: usize) -> u32 {
        // SAFETY: in bounds, and not written concurrently (caller's contract).
        unsafe { self.base().add(i).read() }
    }

    /// Sets element `i`.
    ///
    /// # Safety
    /// `i < MAG_MAX`, and no other thread touches element `i` during the call.
    #[inline(always)]
    pub(super) unsafe fn set(&self, i: usize, unit: u32) {
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
    pub(super) unsafe fn read_rev(&self, start: usize, out: &mut [u32]) {
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
    pub(super) unsafe fn write_rev(&self, start: usize, units: &[u32]) {
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
    pub(super) unsafe fn read(&self, start: usize, out: &mut [u32]) {
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
    pub(super) unsafe fn write(&self, start: usize, units: &[u32]) {
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
    pub(super) unsafe fn array<const N: usize>(&self, start: usize) -> [u32; N] {
        // SAFETY: as `range` (caller's contract); `[u32; N]` has `u32`'s alignment.
        unsafe { self.base().add(start).cast::<[u32; N]>().read() }
    }

    /// Writes `units` at `start`.
    ///
    /// # Safety
    /// As [`Items::range_mut`].
    #[inline(always)]
    pub(super) unsafe fn set_array<const N: usize>(&self, start: usize, units: [u32; N]) {
        // SAFETY: as `range_mut` (caller's contract).
        unsafe { self.base().add(start).cast::<[u32; N]>().write(units) }
    }

    /// Moves elements `from..from + len` to `to..to + len` (`to < from`).
    ///
    /// # Safety
    /// In bounds, and no other thread touches either range during the call.
    #[inline]
    pub(super) unsafe fn move_down(&self, from: usize, to: usize, len: usize) {
        // SAFETY: in bounds and unshared (caller's contract); `copy` allows overlap.
        unsafe { std::ptr::copy(self.base().add(from), self.base().add(to), len) }
    }
}

#[cfg(loom)]
impl Items {
    pub(super) fn new() -> Self {
        Items(std::array::from_fn(|_| UnsafeCell::new(0)))
    }

    pub(super) unsafe fn get(&self, i: usize) -> u32 {
        // SAFETY: as in the non-loom build.
        self.0[i].with(|p| unsafe { *p })
    }

    pub(super) unsafe fn set(&self, i: usize, unit: u32) {
        // SAFETY: as in the non-loom build.
        self.0[i].with_mut(|p| unsafe { *p = unit })
    }

    pub(super) unsafe fn array<const N: usize>(&self, start: usize) -> [u32; N] {
        // SAFETY: as in the non-loom build.
        std::array::from_fn(|k| unsafe { self.get(start + k) })
    }

    pub(super) unsafe fn read_rev(&self, start: usize, out: &mut [u32]) {
        let n = out.len();
        for (k, slot) in out.iter_mut().enumerate() {
            // SAFETY: as in the non-loom build.
            *slot = unsafe { self.get(start + n - 1 - k) };
        }
    }

    pub(super) unsafe fn write_rev(&self, start: usize, units: &[u32]) {
        let n = units.len();
        for (k, &unit) in units.iter().enumerate() {
            // SAFETY: as in the non-loom build.
            unsafe { self.set(start + n - 1 - k, unit) };
        }
    }

    pub(super) unsafe fn read(&self, start: usize, out: &mut [u32]) {
        for (k, slot) in out.iter_mut().enumerate() {
            // SAFETY: as in the non-loom build.
            *slot = unsafe { self.get(start + k) };
        }
    }

    pub(super) unsafe fn write(&self, start: usize, units: &[u32]) {
        for (k, &unit) in units.iter().enumerate() {
            // SAFETY: as in the non-loom build.
            unsafe { self.set(start + k, unit) };
        }
    }

    pub(super) unsafe fn set_array<const N: usize>(&self, start: usize, units: [u32; N]) {
        for (k, unit) in units.into_iter().enumerate() {
            // SAFETY: as in the non-loom build.
            unsafe { self.set(start + k, unit) };
        }
    }

    #[inline]
    pub(super) unsafe fn move_down(&self, from: usize, to: usize, len: usize) {
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
    pub(super) allocs: AtomicU64,
    /// Frees into this cache (including those that flushed). Written only by the owner.
    pub(super) frees: AtomicU64,
    /// The magazine's length (low 32 bits: one past the newest cached block) and this cache's
    /// count of owned buffers ([`OwnedBuffer`](crate::pool::OwnedBuffer)) out (high 32 bits:
    /// those allocated from this cache minus those freed into it, wrapping; the pool's count
    /// is the sum over its caches, with the `lease` module's shared count, modulo 2^32, which
    /// is exact: a pool has fewer blocks). Written only by the owner. One word, so that an
    /// owned pop or push counts its lease in the store of the length it makes anyway: with a
    /// load and a store of their own, the counts chained an owned get + put through one more
    /// word, and it measured 1.16x a borrowed one on one thread with them in the slot's busy
    /// word (the layout before this one) and 1.12x in a word of each class cache (tried, not
    /// kept), against 1.05x this way (`benches/pool.rs`, the `lease` module).
    pub(super) len: AtomicU64,
    /// Capacity, 0 until the class is first used ([`OwnedSlot::enable`]). Owner only.
    pub(super) cap: AtomicU32,
    /// Blocks moved per refill or flush. Owner only.
    pub(super) batch: AtomicU32,
    /// The oldest cached block the owner may use (see above).
    pub(super) top: AtomicU32,
    /// A reclaimer's claim: `1 + top` before it (0: none). Reclaimer only, under the lock.
    pub(super) claim: AtomicU32,
    pub(super) items: Items,
    // The fields of the slow paths after the magazine, so that its elements start where
    // they did before the reclaimer's fields were added (byte 40, asserted below): moving
    // them by 28 bytes slowed a batch made each round by half here (the elements' offset in
    // the page against the buffers' first lines, which the same loop writes).
    /// Twice the number of moves of blocks between this magazine and the shared level the
    /// owner began, plus 1 while one is under way (the blocks then in neither place): a
    /// reclaimer that found nothing retries while it sees one move, or one more than before.
    /// Owner only (a plain load and store per move).
    pub(super) moves: AtomicU64,
    /// The reclaimer's snapshot of `moves`. Reclaimer only, under the lock.
    pub(super) seen_moves: AtomicU64,
    /// Allocations that found the magazine empty and refilled it from the shared level.
    /// Owner only (a refill's slow path).
    pub(super) misses: AtomicU64,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::offset_of!(ClassCache, items) == 40);

/// One owned buffer in the high half of [`ClassCache::len`].
const OWNED_ONE: u64 = 1 << 32;

impl std::fmt::Debug for ClassCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Relaxed: a snapshot for debugging.
        f.debug_struct("ClassCache")
            .field("len", &(self.len.load(Ordering::Relaxed) as u32))
            .field("top", &self.top.load(Ordering::Relaxed))
            .field("cap", &self.cap.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Adds `n` to a counter only its owner writes: a load and a store, no read-modify-write.
#[inline(always)]
pub(super) fn add(counter: &AtomicU64, n: usize) {
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
    pub(super) fn new() -> Self {
        Self {
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            len: AtomicU64::new(0),
            top: AtomicU32::new(0),
            cap: AtomicU32::new(0),
            batch: AtomicU32::new(0),
            moves: AtomicU64::new(0),
            claim: AtomicU32::new(0),
            seen_moves: AtomicU64::new(0),
            misses: AtomicU64::new(0),
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

    /// This cache's share of the pool's owned buffers out (wrapping, modulo 2^32; see `len`),
    /// as of the owner's last store: read by the pool handle's drop, after the `lease`
    /// module's handshake ordered that store.
    pub(crate) fn owned(&self) -> u32 {
        // Relaxed: ordered by the handshake (`Slot::is_freeing_owned`'s Acquire).
        (self.len.load(Ordering::Relaxed) >> 32) as u32
    }

    /// Owner: the length word now (the length in its low half, the owned count in its high
    /// half; see `len`).
    #[inline(always)]
    pub(super) fn word(&self) -> u64 {
        // Relaxed: only the owner writes it.
        self.len.load(Ordering::Relaxed)
    }

    /// Owner: the magazine's length now.
    #[inline(always)]
    pub(super) fn len(&self) -> u32 {
        self.word() as u32
    }

    /// Owner: sets the length word (see `len`).
    #[inline(always)]
    pub(super) fn set_word(&self, word: u64) {
        // Release: the units written below the length before this are seen by a reclaimer
        // that reads this value (Acquire); every store of `len` is a Release, so whichever
        // value a reclaimer reads, it synchronizes with the store that wrote it.
        self.len.store(word, Ordering::Release);
    }

    /// Owner: sets the length, keeping the owned count (a load of the word: the fast paths,
    /// which loaded it already, store `set_word` with their length change instead).
    #[inline(always)]
    pub(super) fn set_len(&self, len: u32) {
        self.set_word(self.word() & !(OWNED_ONE - 1) | u64::from(len));
    }

    /// Owner: the word with the length one less (a pop), and one more owned buffer out if
    /// `owned`.
    #[inline(always)]
    pub(super) fn popped(word: u64, owned: bool) -> u64 {
        // The length is not zero (the caller checked): no borrow into the high half.
        word.wrapping_sub(1)
            .wrapping_add(if owned { OWNED_ONE } else { 0 })
    }

    /// Owner: the word with the length one more (a push), and one owned buffer fewer out if
    /// `owned`.
    #[inline(always)]
    pub(super) fn pushed(word: u64, owned: bool) -> u64 {
        // The length is below the capacity (the caller checked): no carry into the high half.
        word.wrapping_add(1)
            .wrapping_sub(if owned { OWNED_ONE } else { 0 })
    }

    /// Owner: counts `delta` owned buffers out (wrapping: `u32::MAX` for minus one) without
    /// moving a block (an owned allocation on the slow path).
    pub(super) fn count_owned(&self, delta: u32) {
        self.set_word(self.word().wrapping_add(u64::from(delta) << 32));
    }

    /// Owner, after lowering `len` to `new`: whether a reclaimer's claim reaches above `new`,
    /// in which case the owner must not take the blocks (see [`ClassCache`]).
    #[inline(always)]
    pub(super) fn claimed_above(&self, new: u32) -> bool {
        asymmetric::light();
        // Relaxed: what decides is which store of `len` and `top` each side saw, which the
        // barriers order; no data moves through `top`.
        self.top.load(Ordering::Relaxed) > new
    }

    /// Owner: a move between the magazine and the shared level begins (see `moves`).
    #[inline]
    pub(super) fn move_begins(&self) {
        // Relaxed, then the light barrier: a reclaimer's heavy barrier makes the mark visible
        // before the blocks leave the magazine or the shared level, as far as it can tell.
        add(&self.moves, 1);
        asymmetric::light();
    }

    /// Owner: the move ended (the blocks are in their new place).
    #[inline]
    pub(super) fn move_ends(&self) {
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
        // Acquire: pairs with `set_word`: the units below it are seen. The low half is the
        // length.
        let len = self.len.load(Ordering::Acquire) as u32;
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
        let end = claimed.min(self.len.load(Ordering::Acquire) as u32);
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
