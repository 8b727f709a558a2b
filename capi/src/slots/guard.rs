//! What locking and pinning give: a locked slot ([`Guard`]: read and write the value, remove
//! or discard it) and a pinned one ([`Pin`]: read it).

use super::{free, live, next_generation, pins, LocalList, Slot, Table, PIN};
use crate::handle::{Key, MAX_LIVE};
use crate::sync::Ordering;

/// A slot locked by [`Table::lock`]: unlocked when dropped, freed by [`Guard::remove`].
pub(crate) struct Guard<'t, T, const B: u32 = 12, const S: usize = { MAX_LIVE >> 12 }> {
    pub(super) table: &'t Table<T, B, S>,
    pub(super) slot: &'t Slot<T>,
    pub(super) key: Key,
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
    pub(super) slot: &'t Slot<T>,
    pub(super) key: Key,
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
