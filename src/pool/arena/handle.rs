//! Who drops an arena, and in which order: [`ArenaBox`], the handle [`Arena::create`]
//! returns, retires the cache slots ([`Arena::retire_slots`]) before the arena goes.

#![allow(clippy::wildcard_imports)] // the arena module's types, constants and imports

use super::*;

impl Arena {
    /// Marks every cache slot `GONE`, draining those a thread still holds, and waits out a
    /// thread that is flushing its slot right now (a thread exiting). The owner of the arena
    /// calls it before dropping it, once no thread is inside an arena call: through `&self`,
    /// because an exiting thread's flush holds a `&Arena` until it marks its slot free, and
    /// dropping takes `&mut Arena` (a `&mut` made while another thread reads through a `&` is
    /// a data race in Rust's model even if nothing is written: Miri reports it).
    pub(crate) fn retire_slots(&self) {
        for slot in self.slots.iter() {
            if slot.retire() {
                // SAFETY: no thread is inside a pool call (the caller's contract) and the slot
                // is GONE, so its former owner will not touch it again: we have exclusive
                // access.
                self.drain_slot(unsafe { OwnedSlot::new(slot) });
            }
        }
    }
}

/// The arena [`Arena::create`] makes, and the order it goes in: its cache slots retired through
/// `&Arena` ([`Arena::retire_slots`]) before the arena is dropped. A thread that used the
/// arena may still be exiting when its owner lets it go (a scoped thread's thread-local
/// destructors, which flush its cache slot into the arena, run after the scope has let the
/// owner go on): that flush reads the arena through a `&Arena` until it marks its slot free,
/// and dropping the arena takes `&mut Arena`, which must not exist meanwhile (a data race in
/// Rust's model even if nothing is written: Miri reports it). A pool's state and the tests
/// hold their arena through this, so the order is written once.
///
/// Its owner drops it once no thread is inside an arena call (the contract of
/// [`Arena::retire_slots`]).
pub(crate) struct ArenaBox(pub(super) ManuallyDrop<Box<Arena>>);

impl ArenaBox {
    /// Drops the arena, and returns how many of its blocks this process still had out (see
    /// [`Arena::blocks_out`]), counted after every cache slot was drained into it.
    pub(crate) fn close(self) -> u64 {
        self.retire_slots();
        self.blocks_out()
        // `self` drops here: its slots are retired already.
    }
}

impl std::ops::Deref for ArenaBox {
    type Target = Arena;
    fn deref(&self) -> &Arena {
        &self.0
    }
}

impl std::fmt::Debug for ArenaBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self.0, f)
    }
}

impl Drop for ArenaBox {
    fn drop(&mut self) {
        // Through `&Arena`: waits out a thread flushing its slot, and marks every slot gone
        // (nothing to do for slots a `close` retired already).
        self.0.retire_slots();
        // SAFETY: dropped once, here; `self.0` is not used after this line.
        unsafe { ManuallyDrop::drop(&mut self.0) };
    }
}
