//! Per-thread caches: magazines of block units, one per size class, per (thread, pool).
//!
//! A pool owns a fixed set of cache [`Slot`]s (`Config::max_threads`), allocated at creation
//! as zeroed memory ([`Slots::new`]): a slot's magazines take room (memory the process
//! touches) only in the classes its thread uses, each sized by the pool's geometry the first
//! time ([`Mine::enable`]). A thread claims a slot the first time it uses a pool (one CAS) and
//! records it in its thread-local table: `WAYS` entries of `(pool id, slot)`, the pool's *home* entry being
//! `id % WAYS` (a hit elsewhere swaps the entry home). The table has two halves: [`Hot`], what
//! the fast path reads, has no destructor, so reaching it is a plain `%fs`-relative access with
//! no "initialized?" check; [`Cold`] owns the slots and has the destructor that flushes them
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
//! A thread flushes its slot back to the shared lists when it exits (`Cold`'s destructor, which
//! also empties `Hot`, so a buffer freed later in the thread's teardown goes to the shared
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

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use super::arena::Arena;
use super::geometry::{Geometry, BATCH_MAX, MAG_MAX, MAX_CLASSES};
use crate::sync::{thread, Arc, AtomicU32, AtomicU64, Ordering, UnsafeCell};

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

/// One class's magazine: a stack of block units, owned by the slot's thread. `repr(C)` keeps
/// the header in the first cache line of its [`ClassCache`], next to the counters.
#[repr(C)]
#[derive(Debug)]
struct Magazine {
    len: u32,
    cap: u32,
    batch: u32,
    items: [u32; MAG_MAX],
}

/// A thread's cache of one size class, with the thread's counters for that class.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct ClassCache {
    /// Allocations served through this cache (hits and refills).
    pub(crate) allocs: AtomicU64,
    /// Frees into this cache (including those that flushed).
    pub(crate) frees: AtomicU64,
    /// Allocations that found the magazine empty and refilled it from the shared level.
    pub(crate) misses: AtomicU64,
    mag: UnsafeCell<Magazine>,
}

/// Adds one to a counter only its owner writes: a load and a store, no read-modify-write.
#[inline(always)]
fn bump(counter: &AtomicU64) {
    add(counter, 1);
}

/// Adds `n` to a counter only its owner writes (see [`bump`]).
#[inline(always)]
fn add(counter: &AtomicU64, n: usize) {
    // Relaxed: statistics; single writer (the slot's owner), readers only load.
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n as u64),
        Ordering::Relaxed,
    );
}

impl ClassCache {
    /// An empty cache with no room yet (all zero: see [`Slots::new`]); [`Mine::enable`] gives
    /// it its capacity the first time the slot's thread uses the class.
    #[cfg(loom)]
    fn new() -> Self {
        Self {
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            mag: UnsafeCell::new(Magazine {
                len: 0,
                cap: 0,
                batch: 0,
                items: [0; MAG_MAX],
            }),
        }
    }

    /// Runs `f` on the magazine.
    ///
    /// # Safety
    /// The calling thread owns the slot, or has exclusive access to it (see [`Mine`]).
    #[inline(always)]
    unsafe fn with<R>(&self, f: impl FnOnce(&mut Magazine) -> R) -> R {
        // SAFETY: only the owner touches the magazine (caller's contract), and `f` cannot reach
        // it through another path, so this is the only reference during the call.
        self.mag.with_mut(|m| f(unsafe { &mut *m }))
    }
}

/// A cache slot the calling thread owns (it claimed it and has not released it), or that the
/// pool's `Drop` has exclusive access to, for `'a`. Not `Send`: ownership is per thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mine<'a> {
    slot: &'a Slot,
    _not_send: PhantomData<*const ()>,
}

impl<'a> Mine<'a> {
    /// Asserts ownership of `slot`.
    ///
    /// # Safety
    /// For `'a`, the calling thread owns `slot` (claimed by it, not released), or has exclusive
    /// access to it (the pool's `Drop`). Several `Mine`s of one slot on its thread are fine:
    /// each method borrows the magazine only for its own duration and none calls another.
    #[inline(always)]
    pub(crate) unsafe fn new(slot: &'a Slot) -> Self {
        Self {
            slot,
            _not_send: PhantomData,
        }
    }

    #[inline(always)]
    fn cache(&self, c: usize) -> &'a ClassCache {
        &self.slot.classes[c]
    }

    /// Pops a cached block of class `c`.
    #[inline(always)]
    pub(crate) fn pop(&self, c: usize) -> Option<u32> {
        let cache = self.cache(c);
        // SAFETY: `Mine` proves ownership.
        let unit = unsafe {
            cache.with(|m| {
                let len = m.len.checked_sub(1)?;
                m.len = len;
                // `len < cap <= MAG_MAX`: the mask changes nothing and spares a bounds check.
                Some(m.items[len as usize & (MAG_MAX - 1)])
            })
        }?;
        bump(&cache.allocs);
        Some(unit)
    }

    /// Pops up to `max` cached blocks of class `c`, handing each to `sink`; returns how many.
    /// One borrow of the magazine and one counter update for the whole batch.
    #[inline]
    pub(crate) fn pop_many(&self, c: usize, max: usize, mut sink: impl FnMut(u32)) -> usize {
        let cache = self.cache(c);
        // SAFETY: `Mine` proves ownership; `sink` is the pool's own buffer wrapping, which never
        // reaches the magazine.
        let n = unsafe {
            cache.with(|m| {
                let n = (m.len as usize).min(max);
                let start = m.len as usize - n;
                // Shortened before the blocks are handed out: if `sink` unwound halfway, the
                // rest would be lost (leaked), never handed out twice.
                m.len = start as u32;
                for &unit in m.items[start..start + n].iter().rev() {
                    sink(unit);
                }
                n
            })
        };
        add(&cache.allocs, n);
        n
    }

    /// Moves up to `out.len()` cached blocks of class `c` into `out` (the magazine's top, in
    /// its order), returns how many. One copy and one counter update for the whole batch: what
    /// a [`Batch`](super::Batch) allocates with.
    #[inline(always)]
    pub(crate) fn pop_into(&self, c: usize, out: &mut [u32]) -> usize {
        let cache = self.cache(c);
        // SAFETY: `Mine` proves ownership; `out` is the caller's memory, not the magazine.
        let n = unsafe {
            cache.with(|m| {
                let len = m.len as usize;
                let n = len.min(out.len());
                let start = len - n;
                // `len <= cap <= MAG_MAX`: in bounds; `get` spares the panic path all the same.
                let Some(items) = m.items.get(start..len) else {
                    return 0;
                };
                // Top first, as single pops would hand them out. A reversed copy is also one
                // the compiler inlines (vector loads, shuffles, stores) rather than a call to
                // `memcpy`, which costs more than the copy at these sizes.
                for (slot, &unit) in out[..n].iter_mut().zip(items.iter().rev()) {
                    *slot = unit;
                }
                m.len = start as u32;
                n
            })
        };
        add(&cache.allocs, n);
        n
    }

    /// Takes the top `N` cached blocks of class `c` as an array (top first, as `pop_into` hands
    /// them out), or `None` (and nothing taken) if fewer are cached.
    #[inline(always)]
    pub(crate) fn pop_array<const N: usize>(&self, c: usize) -> Option<[u32; N]> {
        let cache = self.cache(c);
        // SAFETY: `Mine` proves ownership.
        let units = unsafe {
            cache.with(|m| {
                let len = m.len as usize;
                let start = len.checked_sub(N)?;
                let top: &[u32; N] = m.items.get(start..len)?.try_into().ok()?;
                let mut units = *top;
                units.reverse();
                m.len = start as u32;
                Some(units)
            })
        }?;
        add(&cache.allocs, N);
        Some(units)
    }

    /// Pushes as many of `units` (freed blocks of class `c`) as the magazine has room for, in
    /// one copy; returns how many (a prefix of `units`).
    #[inline(always)]
    pub(crate) fn push_from(&self, c: usize, units: &[u32]) -> usize {
        let cache = self.cache(c);
        // SAFETY: `Mine` proves ownership; `units` is the caller's memory, not the magazine.
        let n = unsafe {
            cache.with(|m| {
                let len = m.len as usize;
                let n = (m.cap as usize).saturating_sub(len).min(units.len());
                // `len + n <= cap <= MAG_MAX`: in bounds; `get_mut` spares the panic path.
                let Some(items) = m.items.get_mut(len..len + n) else {
                    return 0;
                };
                // Reversed, so that `pop_into` (which takes the top first) hands a batch back in
                // the order it was freed; and inlined, as there (see `pop_into`).
                for (slot, &unit) in items.iter_mut().rev().zip(&units[..n]) {
                    *slot = unit;
                }
                m.len = (len + n) as u32;
                n
            })
        };
        add(&cache.frees, n);
        n
    }

    /// Pushes `N` freed blocks of class `c` in one fixed-size copy (reversed, as `push_from`
    /// stores them); `false` (and nothing pushed) if the magazine has room for fewer.
    #[inline(always)]
    pub(crate) fn push_array<const N: usize>(&self, c: usize, units: &[u32; N]) -> bool {
        let cache = self.cache(c);
        // SAFETY: `Mine` proves ownership; `units` is the caller's memory, not the magazine.
        let pushed = unsafe {
            cache.with(|m| {
                let len = m.len as usize;
                let end = len + N;
                if end > m.cap as usize {
                    return false;
                }
                // `end <= cap <= MAG_MAX`: in bounds; `get_mut` spares the panic path.
                let Some(items) = m.items.get_mut(len..end) else {
                    return false;
                };
                let Ok(items) = <&mut [u32; N]>::try_from(items) else {
                    return false;
                };
                let mut reversed = *units;
                reversed.reverse();
                *items = reversed;
                m.len = end as u32;
                true
            })
        };
        if pushed {
            add(&cache.frees, N);
        }
        pushed
    }

    /// Pushes a freed block of class `c`; `false` (and nothing pushed) if the magazine is full.
    #[inline(always)]
    pub(crate) fn push(&self, c: usize, unit: u32) -> bool {
        let cache = self.cache(c);
        // SAFETY: `Mine` proves ownership.
        let pushed = unsafe {
            cache.with(|m| {
                if m.len >= m.cap {
                    return false;
                }
                // `len < cap <= MAG_MAX`: the mask changes nothing and spares a bounds check.
                m.items[m.len as usize & (MAG_MAX - 1)] = unit;
                m.len += 1;
                true
            })
        };
        if pushed {
            bump(&cache.frees);
        }
        pushed
    }

    /// Whether class `c` is cached at all, giving its magazine the capacity and batch of
    /// geometry `g` (the slot's pool's) the first time: a slot is made with no room in any
    /// class, so that the pages of the classes a thread never uses are never written. Called
    /// by every slow path before it uses the magazine; until then the fast paths find a
    /// magazine with no room and go there.
    #[inline]
    pub(crate) fn enable(&self, c: usize, g: &Geometry) -> bool {
        // SAFETY: `Mine` proves ownership.
        unsafe {
            self.cache(c).with(|m| {
                if m.cap == 0 && c < g.classes {
                    // `len <= cap == 0`: nothing held, so any capacity is consistent.
                    let class = g.class[c];
                    m.cap = class.cap.min(MAG_MAX as u32);
                    m.batch = class.batch;
                }
                m.cap != 0
            })
        }
    }

    /// Class `c`'s refill/flush batch.
    #[inline(always)]
    pub(crate) fn batch(&self, c: usize) -> u32 {
        // SAFETY: `Mine` proves ownership.
        unsafe { self.cache(c).with(|m| m.batch) }
    }

    /// Adds `items` to class `c`'s magazine (as many as fit; callers refill an empty one with at
    /// most a batch) and counts one allocation that missed; the caller then pops.
    pub(crate) fn refill(&self, c: usize, items: &[u32]) {
        let cache = self.cache(c);
        // SAFETY: `Mine` proves ownership.
        unsafe {
            cache.with(|m| {
                let start = m.len as usize;
                let room = (m.cap as usize)
                    .min(MAG_MAX)
                    .saturating_sub(start)
                    .min(items.len());
                m.items[start..start + room].copy_from_slice(&items[..room]);
                m.len += room as u32;
            });
        }
        bump(&cache.misses);
    }

    /// Moves up to `n` of class `c`'s most recently cached blocks into `out`; returns how many.
    pub(crate) fn take(&self, c: usize, n: usize, out: &mut [u32; BATCH_MAX]) -> usize {
        // SAFETY: `Mine` proves ownership.
        unsafe {
            self.cache(c).with(|m| {
                let n = n.min(m.len as usize).min(BATCH_MAX);
                let start = m.len as usize - n;
                out[..n].copy_from_slice(&m.items[start..start + n]);
                m.len = start as u32;
                n
            })
        }
    }
}

/// One thread's caches for one pool.
#[derive(Debug)]
pub(crate) struct Slot {
    state: AtomicU32,
    classes: [ClassCache; MAX_CLASSES],
}

// SAFETY: the magazines (the only non-atomic state) are touched by one thread at a time: the
// thread that claimed the slot (state ACTIVE or FLUSHING, handed over with Acquire/Release on
// `state`), or the pool's Drop once no thread can be inside a pool call (see the module docs).
// Everything else is atomics.
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
            unsafe { (*arena).drain_slot(Mine::new(self)) };
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

/// One entry of a thread's hot table: what the fast path reads.
#[derive(Debug)]
struct HotEntry {
    /// Pool id, 0 for an empty entry.
    id: Cell<u64>,
    /// The claimed slot, or null if the pool had no free slot (the thread runs uncached).
    slot: Cell<*const Slot>,
}

/// The fast path's half of a thread's table. No destructor, so a thread-local access to it is a
/// plain `%fs`-relative address with no "initialized / destroyed" check; entries are only set
/// while [`Cold`] (which has the destructor) holds the slots, and `Cold`'s destructor clears
/// them.
#[derive(Debug)]
struct Hot {
    entries: [HotEntry; WAYS],
}

/// The slow path's half of a thread's table: ownership of the slots and the arenas to flush
/// them into. Entry `i` describes the same pool as `Hot::entries[i]`.
#[derive(Debug)]
struct Cold {
    arenas: [Cell<*const Arena>; WAYS],
    owners: RefCell<[Option<SlotRef>; WAYS]>,
}

#[cfg(not(loom))]
std::thread_local! {
    static HOT: Hot = const { Hot::new() };
    static COLD: Cold = const { Cold::new() };
}

#[cfg(loom)]
loom::thread_local! {
    static HOT: Hot = Hot::new();
    static COLD: Cold = Cold::new();
}

impl Hot {
    const fn new() -> Self {
        Self {
            entries: [const {
                HotEntry {
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

impl Cold {
    const fn new() -> Self {
        Self {
            arenas: [const { Cell::new(ptr::null()) }; WAYS],
            owners: RefCell::new([const { None }; WAYS]),
        }
    }

    /// The slot of `arena` in this thread: found, or claimed now. `None`: uncached.
    fn find_or_claim(&self, hot: &Hot, arena: &Arena) -> Option<*const Slot> {
        let id = arena.id();
        let home = Hot::home(id);
        if let Some(at) = hot.entries.iter().position(|e| e.id.get() == id) {
            if at != home {
                self.swap(hot, at, home);
            }
            return Some(hot.entries[home].slot.get()).filter(|p| !p.is_null());
        }
        let claimed = arena.claim_slot();
        // Reuse an empty entry or one of a dropped pool, preferring home; else evict home.
        let reusable = |e: &HotEntry| {
            let slot = e.slot.get();
            // SAFETY: a non-null slot pointer is kept alive by the `SlotRef` in `owners`.
            e.id.get() == 0 || (!slot.is_null() && unsafe { &*slot }.is_gone())
        };
        let victim = if reusable(&hot.entries[home]) {
            home
        } else {
            hot.entries.iter().position(reusable).unwrap_or(home)
        };
        self.release(hot, victim);
        let slot = claimed.as_deref().map_or(ptr::null(), ptr::from_ref);
        hot.entries[victim].id.set(id);
        hot.entries[victim].slot.set(slot);
        self.arenas[victim].set(arena);
        self.owners.borrow_mut()[victim] = claimed;
        if victim != home {
            self.swap(hot, victim, home);
        }
        Some(slot).filter(|p| !p.is_null())
    }

    fn swap(&self, hot: &Hot, a: usize, b: usize) {
        hot.entries[a].id.swap(&hot.entries[b].id);
        hot.entries[a].slot.swap(&hot.entries[b].slot);
        self.arenas[a].swap(&self.arenas[b]);
        self.owners.borrow_mut().swap(a, b);
    }

    /// Releases entry `at`: forgets it, then flushes its slot into its pool (if alive).
    fn release(&self, hot: &Hot, at: usize) {
        hot.entries[at].id.set(0);
        hot.entries[at].slot.set(ptr::null());
        let arena = self.arenas[at].replace(ptr::null());
        let owner = self.owners.borrow_mut()[at].take();
        if let Some(slot) = owner {
            // SAFETY: this thread claimed the slot (it is in this thread's table) and `arena`
            // is the arena that handed it out.
            unsafe { slot.release(arena) };
        }
    }
}

impl Drop for Cold {
    fn drop(&mut self) {
        let drained = HOT.try_with(|hot| {
            for at in 0..WAYS {
                self.release(hot, at);
            }
        });
        if drained.is_err() {
            // The hot table is already gone (loom drops every thread-local at once): flush with
            // a scratch one.
            let hot = Hot::new();
            for at in 0..WAYS {
                self.release(&hot, at);
            }
        }
    }
}

/// Runs `f` on this thread's slot in the pool `id` if it is in the home entry (the fast path).
/// `None` if it is not, or if the thread runs uncached.
#[inline(always)]
pub(crate) fn with_home<R>(id: u64, f: impl FnOnce(Mine<'_>) -> R) -> Option<R> {
    // Only the lookup runs inside the thread-local access, and `f` after it, so how much `f`
    // inlines never decides whether the access itself is inlined (with a whole batch free
    // inside it, `LocalKey::try_with` went out of line: a call on every batch free).
    let slot = HOT
        .try_with(|hot| {
            let entry = &hot.entries[Hot::home(id)];
            (entry.id.get() == id).then(|| entry.slot.get())
        })
        .ok()
        .flatten()
        .filter(|slot| !slot.is_null())?;
    // SAFETY: a non-null slot in this thread's hot table is kept alive by the `SlotRef` in its
    // cold table and was claimed by this thread, which has not released it (releasing clears
    // the entry first). `f` runs on this thread and never reaches the tables (pool operations
    // do not re-enter them), so nothing releases the slot during the call.
    Some(f(unsafe { Mine::new(&*slot) }))
}

/// The fast path of an allocation: pops a block of class `c` from this thread's cache of the
/// pool `id`, if that is its home entry and the magazine is not empty.
#[inline(always)]
pub(crate) fn fast_pop(id: u64, c: usize) -> Option<u32> {
    with_home(id, |mine| mine.pop(c)).flatten()
}

/// The fast path of a free: pushes block `unit` of class `c` into this thread's cache of the
/// pool `id`, if that is its home entry and the magazine has room.
#[inline(always)]
pub(crate) fn fast_push(id: u64, c: usize, unit: u32) -> bool {
    with_home(id, |mine| mine.push(c, unit)).unwrap_or(false)
}

/// The whole-batch fast path of an allocation: the top `N` blocks of class `c` from this
/// thread's cache of the pool `id` as one array, if that is its home entry and the magazine
/// holds `N`.
#[inline(always)]
pub(crate) fn fast_pop_array<const N: usize>(id: u64, c: usize) -> Option<[u32; N]> {
    with_home(id, |mine| mine.pop_array(c)).flatten()
}

/// The whole-batch fast path of a free: pushes the `N` blocks of class `c` in `units` into
/// this thread's cache of the pool `id` in one copy, if that is its home entry and the
/// magazine has room for all of them.
#[inline(always)]
pub(crate) fn fast_push_array<const N: usize>(id: u64, c: usize, units: &[u32; N]) -> bool {
    with_home(id, |mine| mine.push_array(c, units)).unwrap_or(false)
}

/// Runs `f` on this thread's slot in `arena`, claiming one if needed; `f` gets `None` if the
/// thread runs uncached (no free slot, or its table is gone during thread teardown).
pub(crate) fn with_slot<R>(arena: &Arena, f: impl FnOnce(Option<Mine<'_>>) -> R) -> R {
    let slot = HOT
        .try_with(|hot| {
            COLD.try_with(|cold| cold.find_or_claim(hot, arena))
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
    f(slot.map(|slot| unsafe { Mine::new(&*slot) }))
}

/// Flushes and releases this thread's slot in the pool `id`, if it has one.
pub(crate) fn release_current(id: u64) {
    let _ = HOT.try_with(|hot| {
        COLD.try_with(|cold| {
            if let Some(at) = hot.entries.iter().position(|e| e.id.get() == id) {
                cold.release(hot, at);
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
    /// (`Mine::enable`).
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
