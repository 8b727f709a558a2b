//! A thread's cache slot: [`Slot`], one thread's caches for one pool, its state word
//! (`FREE` → `ACTIVE` → `FLUSHING`, `GONE`); and [`OwnedSlot`], what the owning thread does
//! with it (pop, push, refill, flush, settle after a reclaim). A pool's slots together are in
//! the `slots` module.

#![allow(clippy::wildcard_imports)] // the cache module's constants and imports

use std::marker::PhantomData;

use super::magazine::add;
use super::*;

/// A cache slot the calling thread owns (it claimed it and has not released it), or that the
/// pool's `Drop` has exclusive access to, for `'a`. Not `Send`: ownership is per thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnedSlot<'a> {
    pub(super) slot: &'a Slot,
    pub(super) _not_send: PhantomData<*const ()>,
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
    pub(super) fn cache(&self, c: usize) -> &'a ClassCache {
        &self.slot.classes[c.min(MAX_CLASSES - 1)]
    }

    /// Pops a cached block of class `c`. `None` if the magazine is empty, or a reclaimer
    /// claimed the block (the slow path then settles).
    #[inline(always)]
    pub(crate) fn pop(&self, c: usize) -> Option<u32> {
        self.pop_counted(c, false)
    }

    /// [`OwnedSlot::pop`] for an owned buffer: the block counted as leased in the class's
    /// cache (`ClassCache::owned`, the `lease` module).
    #[inline(always)]
    pub(crate) fn pop_owned(&self, c: usize) -> Option<u32> {
        self.pop_counted(c, true)
    }

    #[inline(always)]
    fn pop_counted(&self, c: usize, owned: bool) -> Option<u32> {
        let cache = self.cache(c);
        let word = cache.word();
        let new = (word as u32).checked_sub(1)?;
        // Read before the pop commits: only the owner ever writes a magazine's elements (a
        // reclaimer only reads), so the read races with nothing; if the block turns out to be
        // claimed, the value is dropped.
        // SAFETY: `new < len <= cap <= MAG_MAX` (the mask changes nothing and spares a bounds
        // check); no other thread writes it.
        let unit = unsafe { cache.items.get(new as usize & (MAG_MAX - 1)) };
        cache.set_word(ClassCache::popped(word, owned));
        if cache.claimed_above(new) {
            cache.set_word(word);
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
        let word = cache.word();
        let len = word as u32;
        let n = (len as usize).min(out.len()).min(MAG_MAX);
        if n == 0 {
            return 0;
        }
        // `n <= len`.
        let new = len - n as u32;
        // Read before the pop commits, as in `pop`. Top first, as single pops hand them out.
        // SAFETY: `new + n = len <= MAG_MAX`; no other thread writes them.
        unsafe { cache.items.read_rev(new as usize, &mut out[..n]) };
        // `n <= len`: the length half only (the owned count kept).
        cache.set_word(word - n as u64);
        if cache.claimed_above(new) {
            cache.set_word(word);
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
        let word = cache.word();
        let new = (word as u32).checked_sub(u32::try_from(N).ok()?)?;
        // Read before the pop commits, as in `pop`.
        // SAFETY: `new + N = len <= MAG_MAX`; no other thread writes them.
        let mut units: [u32; N] = unsafe { cache.items.array(new as usize) };
        // `N <= len`: the length half only (the owned count kept).
        cache.set_word(word - N as u64);
        if cache.claimed_above(new) {
            cache.set_word(word);
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
        let word = cache.word();
        let len = word as u32;
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
        // `len + n <= MAG_MAX`: the length half only (the owned count kept).
        cache.set_word(word + n as u64);
        add(&cache.frees, n);
        n
    }

    /// Pushes `N` freed blocks of class `c` in one fixed-size copy (reversed, as `push_from`
    /// stores them); `false` (and nothing pushed) if the magazine has room for fewer.
    #[inline(always)]
    pub(crate) fn push_array<const N: usize>(&self, c: usize, units: &[u32; N]) -> bool {
        let cache = self.cache(c);
        let word = cache.word();
        let len = word as u32 as usize;
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
        // `end <= MAG_MAX`: the length half only (the owned count kept).
        cache.set_word(word + N as u64);
        add(&cache.frees, N);
        true
    }

    /// Pushes a freed block of class `c`; `false` (and nothing pushed) if the magazine is full.
    #[inline(always)]
    pub(crate) fn push(&self, c: usize, unit: u32) -> bool {
        // SAFETY: clamped to the last class.
        unsafe { self.push_in(c.min(MAX_CLASSES - 1), unit) }
    }

    /// [`OwnedSlot::push`] for a class the caller knows is one (no clamp: an owned buffer's
    /// free, whose drop inlines into its caller only while it stays this small).
    ///
    /// # Safety
    /// `c < MAX_CLASSES`.
    #[inline(always)]
    pub(crate) unsafe fn push_in(&self, c: usize, unit: u32) -> bool {
        // SAFETY: the caller's contract.
        unsafe { self.push_counted(c, unit, false) }
    }

    /// [`OwnedSlot::push_in`] for an owned buffer: its lease counted back in the class's cache
    /// (`ClassCache::owned`) if it is pushed, not otherwise.
    ///
    /// # Safety
    /// `c < MAX_CLASSES`.
    #[inline(always)]
    pub(crate) unsafe fn push_in_owned(&self, c: usize, unit: u32) -> bool {
        // SAFETY: the caller's contract.
        unsafe { self.push_counted(c, unit, true) }
    }

    /// # Safety
    /// `c < MAX_CLASSES`.
    #[inline(always)]
    unsafe fn push_counted(&self, c: usize, unit: u32, owned: bool) -> bool {
        // SAFETY: in bounds (the caller's contract).
        let cache = unsafe { self.slot.classes.get_unchecked(c) };
        let word = cache.word();
        let len = word as u32;
        // Relaxed: owner only.
        if len >= cache.cap.load(Ordering::Relaxed) {
            return false;
        }
        // SAFETY: `len < cap <= MAG_MAX` (`enable` is the only writer of `cap`, and caps it);
        // above `len`, where no reclaimer reads.
        unsafe { cache.items.set(len as usize, unit) };
        cache.set_word(ClassCache::pushed(word, owned));
        add(&cache.frees, 1);
        true
    }

    /// Counts `delta` owned buffers (wrapping: `u32::MAX` for minus one) out through this
    /// slot's cache of class `c`, as [`OwnedSlot::pop_owned`] and
    /// [`OwnedSlot::push_in_owned`] do: for an owned allocation on the slow path.
    pub(crate) fn count_owned(&self, c: usize, delta: u32) {
        self.cache(c).count_owned(delta);
    }

    /// An owned buffer's free begins: marks the slot busy, then a light barrier, so that the
    /// retirement check after it and the pool handle's drop see each other (the `lease`
    /// module's handshake). [`OwnedSlot::leave_owned`] ends it.
    #[inline(always)]
    pub(crate) fn enter_owned(&self) {
        // Relaxed (single writer), then the light barrier: against the handle's store and
        // heavy barrier. A constant: no load, so nothing chains one free's mark to the next.
        self.slot.busy.store(1, Ordering::Relaxed);
        asymmetric::light();
    }

    /// The owned free ends: what it did to the pool (its push, and the lease counted back
    /// with it) happens before a handle's drop that sees the slot idle.
    #[inline(always)]
    pub(crate) fn leave_owned(&self) {
        // Release: pairs with `Slot::is_freeing_owned`'s Acquire.
        self.slot.busy.store(0, Ordering::Release);
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
    pub(super) state: AtomicU32,
    /// 1 while the owner frees an owned buffer (the `lease` module's handshake), else 0.
    /// Owner only; the leases themselves are counted per class (`ClassCache::owned`).
    pub(super) busy: AtomicU32,
    pub(super) classes: [ClassCache; MAX_CLASSES],
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
    /// Whether its owner is freeing an owned buffer now (see [`OwnedSlot::enter_owned`]).
    pub(crate) fn is_freeing_owned(&self) -> bool {
        // Acquire: pairs with `leave_owned`'s Release: a free seen ended has its count and
        // its use of the pool before this.
        self.busy.load(Ordering::Acquire) != 0
    }

    /// The slot's share of the owned buffers out, over its first `classes` classes (the
    /// pool's: no other is counted in, and their pages need not be touched), wrapping (see
    /// `ClassCache::owned`). Read by the pool handle's drop after `is_freeing_owned` ordered
    /// the last free's counts.
    pub(crate) fn owned_out(&self, classes: usize) -> u32 {
        self.classes
            .iter()
            .take(classes)
            .fold(0u32, |sum, class| sum.wrapping_add(class.owned()))
    }

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
    pub(super) unsafe fn release(&self, arena: *const Arena) {
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

    pub(super) fn is_gone(&self) -> bool {
        // Relaxed: a hint for choosing which table entry to reuse; GONE is final.
        self.state.load(Ordering::Relaxed) == GONE
    }
}
