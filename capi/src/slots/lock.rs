//! Reaching a slot through its handle: locking it exclusively, pinning it shared, peeking at
//! it inside a quiescence section; counting and listing the live ones.

use super::{backoff, generation, live, pins, Guard, Pin, Table, LIVE, LOCKED, MAX_PINS, PIN};
use crate::error::{udma_status, Fail};
use crate::handle::{self, Key};
use crate::sync::Ordering;

impl<T, const B: u32, const S: usize> Table<T, B, S> {
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
