//! A thread's table of the pools it caches for: the fast half the allocation path reads
//! ([`FastTable`], no destructor) and the half that owns the slots and flushes them at thread
//! exit ([`OwnerTable`]); the fast paths over them ([`fast_pop`], [`fast_push`],
//! [`with_fast_slot`]) and the slow path that claims a slot ([`with_slot`]).

#![allow(clippy::wildcard_imports)] // the cache module's constants and imports

use std::cell::{Cell, RefCell};
use std::ptr::{self, NonNull};

use super::*;

/// One entry of a thread's fast table: what the fast path reads.
#[derive(Debug)]
pub(super) struct FastEntry {
    /// Pool id, 0 for an empty entry.
    pub(super) id: Cell<u64>,
    /// The claimed slot, or null if the pool had no free slot (the thread runs uncached).
    pub(super) slot: Cell<*const Slot>,
}

/// The fast path's half of a thread's table. No destructor, so a thread-local access to it is a
/// plain `%fs`-relative address with no "initialized / destroyed" check; entries are only set
/// while [`OwnerTable`] (which has the destructor) holds the slots, and `OwnerTable`'s destructor clears
/// them.
#[derive(Debug)]
pub(super) struct FastTable {
    pub(super) entries: [FastEntry; WAYS],
}

/// The slow path's half of a thread's table: ownership of the slots and the arenas to flush
/// them into. Entry `i` describes the same pool as `FastTable::entries[i]`.
#[derive(Debug)]
pub(super) struct OwnerTable {
    pub(super) arenas: [Cell<*const Arena>; WAYS],
    pub(super) owners: RefCell<[Option<SlotRef>; WAYS]>,
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
    pub(super) fn home(id: u64) -> usize {
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
    pub(super) fn find_or_claim(&self, fast: &FastTable, arena: &Arena) -> Option<*const Slot> {
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

    pub(super) fn swap(&self, fast: &FastTable, a: usize, b: usize) {
        fast.entries[a].id.swap(&fast.entries[b].id);
        fast.entries[a].slot.swap(&fast.entries[b].slot);
        self.arenas[a].swap(&self.arenas[b]);
        self.owners.borrow_mut().swap(a, b);
    }

    /// Releases entry `at`: forgets it, then flushes its slot into its pool (if alive).
    pub(super) fn release(&self, fast: &FastTable, at: usize) {
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
pub(crate) fn fast_slot(id: u64) -> Option<NonNull<Slot>> {
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
