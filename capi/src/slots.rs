//! Lock-free handle slots, for the kinds on the hot path: buffers (allocated, freed and
//! submitted many times a second) and the pools they come from.
//!
//! A [`Registry`](crate::handle::Registry) takes one mutex per call; a [`Table`] takes none
//! on the hot path. Its handles are the same tagged, generation-checked keys, and every check
//! holds as before (NULL, another kind, foreign, stale, freed twice). Each slot is a state
//! word and a value:
//!
//! ```text
//! state = generation << 32 | pins << 2 | LOCKED << 1 | LIVE
//! ```
//!
//! - `LIVE`: the slot holds occupant `generation`'s value. A free slot carries the
//!   generation its next occupant gets: removing bumps it, so every copy of an old handle
//!   stops matching (until 2^32 reuses of one slot).
//! - `LOCKED`: one caller holds the slot exclusively ([`Table::lock`]); only it reads or
//!   writes the value, and it unlocks (a store) or removes the value. Other lockers wait.
//! - pins: callers that read the value shared ([`Table::pin`]). A slot with pins is not
//!   locked (its remover gets "busy"), and a locked one is not pinned, so a pinned value
//!   neither changes nor goes.
//!
//! The pool table's hot path reads without a pin, inside a quiescence section
//! ([`crate::quiesce`], [`Table::peek_ptr`]): its remover locks the slot and waits the sections
//! out before it touches the value.
//!
//! Every transition of a live slot is one compare-and-swap on its state from a value that
//! names the generation, which is the ABA defence: a slot freed and reused between a load
//! and the CAS has another generation, and the CAS fails.
//!
//! Free slot indices go to a caller's own list first (a thread's cache, for buffers), then
//! to the table's list under a mutex, in batches of [`BATCH`]; a new slot is made under that
//! mutex too. Slots live in segments of `2^B`, made when first needed and never
//! freed while the table lives, so a slot's address is stable and a lookup is one load.

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::null_mut;

use crate::error::{udma_status, Fail};
use crate::handle::{self, Key, Kind, MAX_LIVE};
use crate::sync::{hint, thread, AtomicPtr, AtomicU64, Mutex, MutexGuard, Ordering, UnsafeCell};

const LIVE: u64 = 1;
const LOCKED: u64 = 2;
const PIN_SHIFT: u32 = 2;
const PIN: u64 = 1 << PIN_SHIFT;
const MAX_PINS: u64 = (1 << (32 - PIN_SHIFT)) - 1;
/// Free indices moved between a caller's list and the table's at once.
pub(crate) const BATCH: usize = 32;

/// A caller's own free indices (a thread's, for buffers): at most `2 * BATCH`, in cells, so
/// a thread-local list is used through a shared reference, with no borrow flag to check.
/// Not `Sync`: one thread's.
pub(crate) struct LocalList {
    len: Cell<usize>,
    items: [Cell<u32>; 2 * BATCH],
}

impl LocalList {
    /// An empty list.
    pub(crate) const fn new() -> LocalList {
        LocalList {
            len: Cell::new(0),
            items: [const { Cell::new(0) }; 2 * BATCH],
        }
    }

    /// How many indices it holds.
    pub(crate) fn len(&self) -> usize {
        self.len.get()
    }

    #[inline(always)]
    fn pop(&self) -> Option<u32> {
        let n = self.len.get().checked_sub(1)?;
        self.len.set(n);
        self.items.get(n).map(Cell::get)
    }

    /// Pushes `index`; false (and nothing pushed) when full.
    #[inline(always)]
    fn push(&self, index: u32) -> bool {
        let n = self.len.get();
        match self.items.get(n) {
            Some(item) => {
                item.set(index);
                self.len.set(n + 1);
                true
            }
            None => false,
        }
    }

    /// Moves the last `n` (or all) indices into `to`.
    fn drain_into(&self, n: usize, to: &mut Vec<u32>) {
        let len = self.len.get();
        let at = len.saturating_sub(n);
        to.extend(self.items[at..len].iter().map(Cell::get));
        self.len.set(at);
    }
}

fn generation(state: u64) -> u32 {
    (state >> 32) as u32
}

fn pins(state: u64) -> u64 {
    (state >> PIN_SHIFT) & MAX_PINS
}

/// The state of a live, unlocked, unpinned slot of occupant `generation`.
fn live(generation: u32) -> u64 {
    u64::from(generation) << 32 | LIVE
}

/// The state of a free slot whose next occupant gets `generation`.
fn free(generation: u32) -> u64 {
    u64::from(generation) << 32
}

/// The generation after `g` (never 0: a handle's value is never its tag alone).
fn next_generation(g: u32) -> u32 {
    g.wrapping_add(1).max(1)
}

/// One cache line a slot (for buffers: the state and two words of value), so that filling a
/// slot never writes across two lines, and threads using neighbouring slots do not share one.
#[repr(align(64))]
struct Slot<T> {
    state: AtomicU64,
    /// Initialised exactly while `state` has LIVE (so a fill can write it field by field,
    /// in place, and nothing reads a tag to know it is there).
    value: UnsafeCell<MaybeUninit<T>>,
}

struct Grow {
    /// Slots made.
    len: u32,
    /// Free indices not in any caller's list.
    free: Vec<u32>,
}

/// Slots of one kind of handle, in `S` segments of `2^B` slots. See the module docs. Both
/// are constants, so that a lookup shifts and masks by immediates and a table is made at
/// compile time (a `static`, with no lazy initialisation to check on every call); the
/// defaults give [`MAX_LIVE`] slots, 4096 a segment, and tests use small ones.
pub(crate) struct Table<T, const B: u32 = 12, const S: usize = { MAX_LIVE >> 12 }> {
    kind: Kind,
    /// Each null or the first of `2^B` slots (a leaked `Box<[Slot<T>]>`).
    segments: [AtomicPtr<Slot<T>>; S],
    grow: Mutex<Grow>,
    _values: PhantomData<*const T>,
}

// SAFETY: the table owns its values (moved in by `insert`, out by `remove`), so sending it
// sends them: `T: Send`.
unsafe impl<T: Send, const B: u32, const S: usize> Send for Table<T, B, S> {}
// SAFETY: through a shared table, values move between threads (inserted on one, removed or
// locked on another: `T: Send`) and are read by several at once while pinned (`T: Sync`);
// every access is ordered by the slot's state (the module docs).
unsafe impl<T: Send + Sync, const B: u32, const S: usize> Sync for Table<T, B, S> {}

impl<T, const B: u32, const S: usize> Table<T, B, S> {
    /// An empty table for `kind`.
    #[cfg(not(loom))]
    pub(crate) const fn new(kind: Kind) -> Self {
        Table {
            kind,
            segments: [const { AtomicPtr::new(null_mut()) }; S],
            grow: Mutex::new(Grow {
                len: 0,
                free: Vec::new(),
            }),
            _values: PhantomData,
        }
    }

    /// An empty table for `kind` (loom's atomics and mutexes are made at run time).
    #[cfg(loom)]
    pub(crate) fn new(kind: Kind) -> Self {
        Table {
            kind,
            segments: std::array::from_fn(|_| AtomicPtr::new(null_mut())),
            grow: Mutex::new(Grow {
                len: 0,
                free: Vec::new(),
            }),
            _values: PhantomData,
        }
    }

    fn lock_grow(&self) -> MutexGuard<'_, Grow> {
        // A panic while it was held left it consistent: each change is one push, pop or add.
        self.grow
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[inline]
    fn slot(&self, index: u32) -> Option<&Slot<T>> {
        let segment = self.segments.get((index >> B) as usize)?;
        // Acquire: pairs with the Release store in `new_slot` that published the segment, so
        // its slots' initialisation happens before this lookup uses them.
        let first = segment.load(Ordering::Acquire);
        if first.is_null() {
            return None;
        }
        let at = (index & ((1 << B) - 1)) as usize;
        // SAFETY: a non-null segment pointer is the first of `2^B` slots made by
        // `new_slot` and freed only when the table drops (which `&self` rules out); `at` is
        // below `2^B`.
        Some(unsafe { &*first.add(at) })
    }

    fn exhausted(&self) -> Fail {
        Fail::new(
            udma_status::UDMA_ERR_EXHAUSTED,
            format!(
                "{} live {} handles, the most the library keeps: free or destroy some first",
                self.segments.len() << B,
                self.kind.name()
            ),
        )
    }

    /// Makes slot `grow.len` (and its segment, if it is the segment's first).
    fn new_slot(&self, grow: &mut Grow) -> Result<u32, Fail> {
        let index = grow.len;
        let segment = (index >> B) as usize;
        if segment >= self.segments.len() {
            return Err(self.exhausted());
        }
        if index & ((1 << B) - 1) == 0 {
            let slots: Box<[Slot<T>]> = (0..1u32 << B)
                .map(|_| Slot {
                    state: AtomicU64::new(free(1)),
                    value: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect();
            let first = Box::into_raw(slots).cast::<Slot<T>>();
            // Release: the slots' initialisation happens before every lookup that loads
            // the pointer (Acquire in `slot`).
            self.segments[segment].store(first, Ordering::Release);
        }
        grow.len += 1;
        Ok(index)
    }

    /// A free index: from `local`, refilled from the table's list, or a new slot. The hot
    /// paths claim and [`Table::fill`] apart, so that the value is written once, straight
    /// into its slot, not moved through the thread-local access first.
    ///
    /// # Errors
    /// `UDMA_ERR_EXHAUSTED` when every slot is live.
    #[inline]
    pub(crate) fn claim(&self, local: Option<&LocalList>) -> Result<u32, Fail> {
        match local.and_then(LocalList::pop) {
            Some(index) => Ok(index),
            None => self.claim_slow(local),
        }
    }

    #[cold]
    #[inline(never)]
    fn claim_slow(&self, local: Option<&LocalList>) -> Result<u32, Fail> {
        let mut grow = self.lock_grow();
        if let Some(local) = local {
            let at = grow.free.len().saturating_sub(BATCH);
            for index in grow.free.drain(at..) {
                local.push(index);
            }
            if let Some(index) = local.pop() {
                return Ok(index);
            }
        } else if let Some(index) = grow.free.pop() {
            return Ok(index);
        }
        self.new_slot(&mut grow)
    }

    /// Stores `value` in the slot `index` (claimed by [`Table::claim`] and not filled
    /// since) and returns its key.
    ///
    /// # Errors
    /// `UDMA_ERR_INTERNAL` if the index has no slot (a claimed index always has one); the
    /// value is dropped.
    #[inline]
    pub(crate) fn fill(&self, index: u32, value: T) -> Result<Key, Fail> {
        // SAFETY: `write` initialises the whole value.
        unsafe { self.fill_with(index, |p| p.write(value)) }
    }

    /// As [`Table::fill`], with the value written in place by `init` (field by field, say,
    /// rather than built elsewhere and copied in).
    ///
    /// # Safety
    /// `init` initialises the whole `T` it is given a pointer to (it is not called if the
    /// index has no slot). If it panics, the slot stays free and its index is lost.
    #[inline(always)]
    pub(crate) unsafe fn fill_with(
        &self,
        index: u32,
        init: impl FnOnce(*mut T),
    ) -> Result<Key, Fail> {
        let Some(slot) = self.slot(index) else {
            return Err(self.unmade(index));
        };
        // Relaxed: the slot is free and its index ours alone. Its state was last written by
        // the `remove` or `discard` that freed it (or `new_slot`), which happens before our
        // claim through the free lists (the same thread's list, or the table's mutex).
        let generation = generation(slot.state.load(Ordering::Relaxed));
        // The slot is free and its index claimed by us alone, so no caller reads or writes
        // its value (lockers, pinners and peekers refuse a slot that is not LIVE) until the
        // Release store below publishes it. A free slot's value is uninitialised (its remover
        // moved or dropped it): writing it drops nothing.
        slot.value.with_mut(|v| init(v.cast::<T>()));
        // Release: the value's write happens before the reads of every caller that locks or
        // pins the slot (their Acquire CAS reads this store or a later one).
        slot.state.store(live(generation), Ordering::Release);
        Ok(Key::new(index, generation))
    }

    #[cold]
    fn unmade(&self, index: u32) -> Fail {
        Fail::new(
            udma_status::UDMA_ERR_INTERNAL,
            format!(
                "{} slot {index} was claimed but has no segment",
                self.kind.name()
            ),
        )
    }

    /// Returns a free index: to `local` (spilling a batch to the table's list when it holds
    /// two), or to the table's list.
    #[inline]
    pub(crate) fn release(&self, index: u32, local: Option<&LocalList>) {
        match local {
            Some(local) if local.len() + 1 < 2 * BATCH => {
                local.push(index);
            }
            local => self.release_slow(index, local),
        }
    }

    #[cold]
    #[inline(never)]
    fn release_slow(&self, index: u32, local: Option<&LocalList>) {
        let mut grow = self.lock_grow();
        match local {
            Some(local) => {
                if !local.push(index) {
                    grow.free.push(index);
                }
                if local.len() >= 2 * BATCH {
                    local.drain_into(BATCH, &mut grow.free);
                }
            }
            None => grow.free.push(index),
        }
    }

    /// Gives a caller's whole list back to the table (a thread that ends).
    pub(crate) fn return_list(&self, local: &LocalList) {
        if local.len() > 0 {
            local.drain_into(2 * BATCH, &mut self.lock_grow().free);
        }
    }

    /// Stores `value` in a free slot (its index from `local` first) and returns its key.
    ///
    /// # Errors
    /// `UDMA_ERR_EXHAUSTED` when every slot is live.
    pub(crate) fn insert(&self, value: T, local: Option<&LocalList>) -> Result<Key, Fail> {
        let index = self.claim(local)?;
        self.fill(index, value)
    }

    /// Locks the live slot `key` names exclusively (`value`: the handle, for messages),
    /// waiting while another caller holds it.
    ///
    /// # Errors
    /// `UDMA_ERR_INVALID_HANDLE` for a slot that was never made, is free, or holds another
    /// occupant; `busy(pins)` for a slot that is pinned.
    #[inline]
    pub(crate) fn lock(
        &self,
        key: Key,
        value: u64,
        busy: impl FnOnce(u64) -> Fail,
    ) -> Result<Guard<'_, T, B, S>, Fail> {
        // The common case, inline: a live, unlocked, unpinned slot of this occupant, locked
        // at the first try. ABA and orderings: as in the loop of `lock_slow`.
        if let Some(slot) = self.slot(key.index()) {
            let state = live(key.generation());
            if slot
                .state
                .compare_exchange(state, state | LOCKED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(Guard {
                    table: self,
                    slot,
                    key,
                });
            }
        }
        self.lock_slow(key, value, busy)
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(
        &self,
        key: Key,
        value: u64,
        busy: impl FnOnce(u64) -> Fail,
    ) -> Result<Guard<'_, T, B, S>, Fail> {
        let slot = self
            .slot(key.index())
            .ok_or_else(|| handle::foreign(self.kind, value))?;
        let mut spins = 0u32;
        loop {
            // Acquire: a slot found freed was freed by its remover's Release store, after its
            // last access to the value; that access so happens before the caller's next step
            // (`count`, for a pool being destroyed: freeing the pool).
            let state = slot.state.load(Ordering::Acquire);
            if state & LIVE == 0 || generation(state) != key.generation() {
                return Err(handle::stale(self.kind, value));
            }
            let n = pins(state);
            if n > 0 {
                return Err(busy(n));
            }
            if state & LOCKED != 0 {
                backoff(&mut spins);
                continue;
            }
            // ABA: `state` names the occupant's generation; a slot freed and reused since the
            // load has another, and the CAS fails. Acquire: pairs with the Release of the
            // insert that published the value and of the unlock or unpin before us, so their
            // accesses to the value happen before ours.
            if slot
                .state
                .compare_exchange_weak(state, state | LOCKED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(Guard {
                    table: self,
                    slot,
                    key,
                });
            }
        }
    }

    /// Pins the live slot `key` names: its value stays as it is until the pin is dropped.
    ///
    /// # Errors
    /// `UDMA_ERR_INVALID_HANDLE` as [`Table::lock`], and for a slot locked to be removed;
    /// `UDMA_ERR_EXHAUSTED` for 2^30 pins.
    #[inline]
    pub(crate) fn pin(&self, key: Key, value: u64) -> Result<Pin<'_, T>, Fail> {
        // The common case, inline: a live, unlocked slot of this occupant with room for a
        // pin, pinned at the first try. ABA and orderings: as in the loop of `pin_slow`.
        if let Some(slot) = self.slot(key.index()) {
            let state = slot.state.load(Ordering::Relaxed);
            if state & (LIVE | LOCKED) == LIVE
                && generation(state) == key.generation()
                && pins(state) < MAX_PINS
                && slot
                    .state
                    .compare_exchange(state, state + PIN, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return Ok(Pin { slot, key });
            }
        }
        self.pin_slow(key, value)
    }

    #[cold]
    #[inline(never)]
    fn pin_slow(&self, key: Key, value: u64) -> Result<Pin<'_, T>, Fail> {
        self.pin_loop(key, value, false)
    }

    /// Pins the live slot `key` names; a locked slot is stale (its locker is removing it), or
    /// with `wait_locked`, waited for (its locker may unlock it instead).
    fn pin_loop(&self, key: Key, value: u64, wait_locked: bool) -> Result<Pin<'_, T>, Fail> {
        let slot = self
            .slot(key.index())
            .ok_or_else(|| handle::foreign(self.kind, value))?;
        let mut spins = 0u32;
        let mut state = slot.state.load(Ordering::Relaxed);
        loop {
            if state & LIVE == 0 || generation(state) != key.generation() {
                return Err(handle::stale(self.kind, value));
            }
            if state & LOCKED != 0 {
                if !wait_locked {
                    return Err(handle::stale(self.kind, value));
                }
                backoff(&mut spins);
                state = slot.state.load(Ordering::Relaxed);
                continue;
            }
            if pins(state) == MAX_PINS {
                return Err(self.exhausted());
            }
            // ABA: as in `lock`. Acquire: pairs with the insert's Release (and the Release of
            // an unlock), so the value's write happens before our reads.
            match slot.state.compare_exchange_weak(
                state,
                state + PIN,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(Pin { slot, key }),
                Err(now) => state = now,
            }
        }
    }

    /// The address of the value of the live, unlocked slot `key` names, read without a pin,
    /// for the caller to read until it leaves its section; `None` if the slot is not that
    /// (never made, free, another occupant's, or locked).
    ///
    /// # Safety
    /// The caller is inside a [`crate::quiesce`] section for this slot's handle, entered
    /// before this call and left after its last read through the pointer, and every caller
    /// that removes or writes this table's values locks the slot and waits that section out
    /// ([`crate::quiesce::Quiesce::wait_out`]) before it does.
    #[inline(always)]
    pub(crate) unsafe fn peek_ptr(&self, key: Key) -> Option<*const T> {
        let slot = self.slot(key.index())?;
        // Acquire: pairs with the Release of the insert that published the value (and of
        // an unlock after a remover gave up), so their writes happen before our reads.
        let state = slot.state.load(Ordering::Acquire);
        if state & (LIVE | LOCKED) != LIVE || generation(state) != key.generation() {
            return None;
        }
        // Live, so initialised; not locked when loaded inside the caller's section, so it
        // stays until the caller leaves (this function's contract).
        Some(slot.value.with(|v| v.cast::<T>()))
    }

    /// Pins the live slot `key` names as [`Table::pin`] does, but waits while it is locked
    /// (after a [`Table::peek_ptr`] saw it locked: its locker may unlock it rather than remove
    /// it, and a pin refused meanwhile would call a live handle stale).
    ///
    /// # Errors
    /// As [`Table::pin`], once the slot is unlocked.
    #[cold]
    #[inline(never)]
    pub(crate) fn pin_unlocked(&self, key: Key, value: u64) -> Result<Pin<'_, T>, Fail> {
        self.pin_loop(key, value, true)
    }

    /// How many live slots hold a value for which `pred` holds, each locked in turn to be
    /// read (so a value a holder is changing is counted once it is settled). For a table whose
    /// slots are never pinned (buffers): a pinned slot is not counted.
    pub(crate) fn count(&self, mut pred: impl FnMut(&T) -> bool) -> u64 {
        let kind = self.kind;
        let not_counted = |_| Fail::new(udma_status::UDMA_ERR_BUSY, String::new());
        self.live()
            .into_iter()
            .filter(|&key| {
                // A slot freed since the snapshot is stale now: not counted (and its freeing
                // is ordered before our return, see `lock_slow`).
                self.lock(key, key.value(kind), not_counted)
                    .is_ok_and(|mut guard| guard.with(|v| pred(v)))
            })
            .count() as u64
    }

    /// The keys of the slots live now (a snapshot: lock each to use it).
    pub(crate) fn live(&self) -> Vec<Key> {
        let len = self.lock_grow().len;
        (0..len)
            .filter_map(|index| {
                // Acquire: as in `lock_slow`, for a slot seen free.
                let state = self.slot(index)?.state.load(Ordering::Acquire);
                (state & LIVE != 0).then(|| Key::new(index, generation(state)))
            })
            .collect()
    }
}

impl<T, const B: u32, const S: usize> Drop for Table<T, B, S> {
    fn drop(&mut self) {
        let count = 1usize << B;
        for segment in self.segments.iter() {
            let first = segment.load(Ordering::Acquire);
            if !first.is_null() {
                // SAFETY: made by `new_slot` from a `Box<[Slot<T>]>` of `count` slots, and
                // dropped once, here (`&mut self`: nothing borrows a slot).
                let slots =
                    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(first, count)) };
                for slot in slots.iter() {
                    if slot.state.load(Ordering::Acquire) & LIVE != 0 {
                        // SAFETY: LIVE: initialised, and dropped once, here (`&mut self`: no
                        // guard or pin is out).
                        slot.value.with_mut(|v| unsafe { (*v).assume_init_drop() });
                    }
                }
                drop(slots);
            }
        }
    }
}

/// Waits a little for a locked slot: spins, then lets other threads run.
pub(crate) fn backoff(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    if *spins < 64 {
        hint::spin_loop();
    } else {
        thread::yield_now();
    }
}

/// A slot locked by [`Table::lock`]: unlocked when dropped, freed by [`Guard::remove`].
pub(crate) struct Guard<'t, T, const B: u32 = 12, const S: usize = { MAX_LIVE >> 12 }> {
    table: &'t Table<T, B, S>,
    slot: &'t Slot<T>,
    key: Key,
}

impl<T, const B: u32, const S: usize> std::fmt::Debug for Guard<'_, T, B, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").field("key", &self.key).finish()
    }
}

impl<T, const B: u32, const S: usize> Guard<'_, T, B, S> {
    /// The slot's key.
    pub(crate) fn key(&self) -> Key {
        self.key
    }

    /// Runs `f` on the value.
    pub(crate) fn with<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> R {
        self.slot.value.with_mut(|v| {
            // SAFETY: LOCKED is ours, so no other caller reads or writes the value until we
            // unlock (pinners refuse a locked slot, and it had no pins when we locked it); the
            // slot is LIVE, so the value is initialised.
            f(unsafe { (*v).assume_init_mut() })
        })
    }

    /// Frees the slot (its index back to `local` first) and returns the value; every copy of
    /// its handle is stale from now on.
    pub(crate) fn remove(self, local: Option<&LocalList>) -> T {
        let table = self.table;
        let mut taken = None;
        let index = self.discard_with(|value| taken = Some(value));
        table.release(index, local);
        taken.expect("discard_with hands the value over")
    }
}

impl<T, const B: u32, const S: usize> Guard<'_, T, B, S> {
    /// Frees the slot, dropping its value where it lies, and returns its index for
    /// [`Table::release`] (the caller gives it back once it has left the thread-local
    /// access it needs for that); every copy of its handle is stale from now on.
    ///
    /// The value is handed to `finish` (which drops it: `drop`, or a match on it so that the
    /// dropping is inlined) while the slot is still locked.
    #[inline(always)]
    pub(crate) fn discard_with(self, finish: impl FnOnce(T)) -> u32 {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: as in `with`: LOCKED is ours, the value initialised. It is moved out once:
        // the slot is free (uninitialised) from the store below, which comes after `finish`
        // is done with it.
        let value = this
            .slot
            .value
            .with_mut(|v| unsafe { (*v).assume_init_read() });
        finish(value);
        // Release: as in `remove`.
        this.slot.state.store(
            free(next_generation(this.key.generation())),
            Ordering::Release,
        );
        this.key.index()
    }
}

impl<T, const B: u32, const S: usize> Drop for Guard<'_, T, B, S> {
    fn drop(&mut self) {
        // Release: our writes to the value happen before the next locker's or pinner's reads
        // (their Acquire CAS). No pins to keep: a locked slot has none.
        self.slot
            .state
            .store(live(self.key.generation()), Ordering::Release);
    }
}

/// A pinned slot ([`Table::pin`]): its value is read-only and stays until the pin goes.
pub(crate) struct Pin<'t, T> {
    slot: &'t Slot<T>,
    key: Key,
}

impl<T> std::fmt::Debug for Pin<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pin").field("key", &self.key).finish()
    }
}

impl<T> Pin<'_, T> {
    /// The slot's key.
    pub(crate) fn key(&self) -> Key {
        self.key
    }

    /// Runs `f` on the value.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        self.slot.value.with(|v| {
            // SAFETY: while pinned, the slot is LIVE (initialised) and not locked, so nobody
            // writes or removes the value; every holder only reads it.
            f(unsafe { (*v).assume_init_ref() })
        })
    }

    /// The pins on the slot now, this one included.
    pub(crate) fn count(&self) -> u64 {
        pins(self.slot.state.load(Ordering::Relaxed))
    }
}

impl<T> Drop for Pin<'_, T> {
    fn drop(&mut self) {
        // Release: our reads of the value happen before a remover's Acquire CAS.
        self.slot.state.fetch_sub(PIN, Ordering::Release);
    }
}

// By path: the fuzz targets and the benches include this file by path too.
#[cfg(test)]
#[path = "slots/tests.rs"]
mod tests;
