//! When a class's shared level is dry: taking back the blocks parked in other threads' caches
//! ([`Arena::reclaim`], under the class's lock, with one process-wide barrier), handing a
//! class's blocks over to a waiting allocation ([`Arena::hand_over`]), and waiting for a free
//! ([`Arena::wait_for`]).

#![allow(clippy::wildcard_imports)] // the arena module's types, constants and imports

use super::*;

impl Arena {
    /// A free cached a block of class `c` while a thread waits for one: every block of the
    /// class in this thread's cache goes to the shared level, where waiters look (and `give`
    /// wakes them).
    #[cold]
    #[inline(never)]
    pub(crate) fn hand_over(&self, c: usize) {
        cache::with_slot(self, |mine| {
            if let Some(mine) = mine {
                self.hand_over_from(mine, c);
            }
        });
    }

    pub(super) fn hand_over_from(&self, mine: OwnedSlot<'_>, c: usize) {
        mine.settle(c, self.lock(c));
        while self.flush(mine, c) > 0 {}
    }

    /// Takes the blocks of class `c` the threads of this process hold in their caches (see
    /// `ClassCache`: claim, heavy barrier, take what the owners did not pop meanwhile), keeps
    /// one for the caller and gives the rest to the shared level, where other threads find
    /// them. Looks again while an owner is moving blocks between its cache and the shared
    /// level (they are in neither place for that moment). `None` if no block of the class is
    /// free in this process: not in a cache, not on the shared level.
    ///
    /// One reclaimer per class at a time (its lock), which also keeps owners from settling
    /// while a reclaimer reads their magazines. The caller holds no lock.
    #[cold]
    #[inline(never)]
    pub(super) fn reclaim(&self, c: usize) -> Option<Block> {
        if self.g.class[c].cap == 0 {
            return None;
        }
        let _locked = lock(self.lock(c));
        // Bounded: moves end within microseconds; a thread that keeps moving blocks in and
        // out for this long while the shared level stays dry is not giving any up. (Under
        // loom, where time does not pass, a few rounds: the models check each round, not how
        // long the patience lasts.)
        let deadline = Instant::now() + RECLAIM_PATIENCE;
        let mut rounds = 0u32;
        loop {
            rounds += 1;
            // A reclaimer that held the lock before, or a move that ended, may have put blocks
            // on the shared level.
            // SeqCst: see `take_direct`.
            let uncached = self.uncached_moves[c].load(Ordering::SeqCst);
            if let Some(block) = self.take_direct(c) {
                return Some(block);
            }
            for slot in self.slots.iter().filter(|slot| slot.is_owned()) {
                slot.class(c).claim();
            }
            asymmetric::heavy();
            let mut kept = None;
            // The shared level takes at most a batch at a time (a depot magazine's size).
            let batch = self.g.class[c].batch as usize;
            for slot in self.slots.iter() {
                slot.class(c).take_claimed(batch, |units| {
                    let mut units = units;
                    if kept.is_none() {
                        if let Some((&first, rest)) = units.split_first() {
                            kept = Some(first);
                            units = rest;
                        }
                    }
                    self.give(c, units);
                });
            }
            if let Some(unit) = kept {
                // Relaxed: statistics (the block was counted freed when its owner cached it).
                self.direct[c].allocs.fetch_add(1, Ordering::Relaxed);
                return Some(Block::small(unit, c));
            }
            if let Some(block) = self.take_direct(c) {
                return Some(block);
            }
            let moved = self
                .slots
                .iter()
                .any(|slot| slot.is_owned() && slot.class(c).moved())
                // SeqCst: see `take_direct` (our own two calls added 4).
                || self.uncached_moves[c].load(Ordering::SeqCst) != uncached + 4;
            if !moved || Instant::now() >= deadline || (cfg!(loom) && rounds >= 2) {
                return None;
            }
            thread::yield_now();
        }
    }

    /// Returns blocks to the shared level and wakes waiters, if any.
    #[inline]
    pub(super) fn give(&self, c: usize, items: &[u32]) {
        self.central().give(c, items);
        self.wake_waiters();
    }

    pub(super) fn wake_waiters(&self) {
        let words = &self.meta.wait[0];
        // Relaxed, and no fence here: a waiter of this process counts itself in and then runs a
        // heavy barrier before it looks, so either this load sees it or its look sees the
        // blocks given (see `wait_for`). A waiter in another process re-checks every POLL.
        if words.waiters.load(Ordering::Relaxed) != 0 {
            // Release: a waiter that sees the new sequence number also sees our blocks.
            words.seq.fetch_add(1, Ordering::Release);
            wait::wake_all(&words.seq, self.shared_futex);
        }
    }

    /// Retries `attempt` until it succeeds or the pool's timeout passes.
    pub(super) fn wait_for<T>(&self, mut attempt: impl FnMut() -> Option<T>) -> Result<T, Failure> {
        let Some(timeout) = self.timeout else {
            return Err(Failure::Exhausted);
        };
        let deadline = Instant::now().checked_add(timeout);
        let words = &self.meta.wait[0];
        // Relaxed, then the heavy barrier: a free of this process whose read of the count comes
        // before the barrier's effect on its thread put its block in its cache (or the shared
        // level) before it too, where the attempts below find it (by reclaiming, or on the
        // shared level); one whose read comes after sees the count and hands the block over
        // (shared level and wake-up). Other processes' frees are found by the POLL re-checks.
        words.waiters.fetch_add(1, Ordering::Relaxed);
        asymmetric::heavy();
        let result = loop {
            // Acquire: pairs with the Release bump in `wake_waiters`.
            let seq = words.seq.load(Ordering::Acquire);
            if let Some(found) = attempt() {
                break Ok(found);
            }
            let left = match deadline {
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => break Err(Failure::Exhausted),
                },
                None => POLL,
            };
            wait::wait(&words.seq, seq, left.min(POLL), self.shared_futex);
        };
        // Relaxed: nothing is published by leaving.
        words.waiters.fetch_sub(1, Ordering::Relaxed);
        result
    }
}
