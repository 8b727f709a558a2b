//! Many blocks at once: [`Arena::alloc_bulk`] / [`Arena::free_bulk`] for blocks of any size,
//! and the batch paths of one size class ([`Arena::alloc_units`] / [`Arena::free_units`]) that
//! `pool::Batch` runs on: whole magazine runs from the thread's cache, the shared level when
//! it is dry.

#![allow(clippy::wildcard_imports)] // the arena module's types, constants and imports

use super::*;

impl Arena {
    /// Allocates `count` blocks for `len` bytes each, handing each to `sink`; stops at the first
    /// failure and returns it (blocks already handed over stay with the caller). One cache
    /// lookup for the whole batch.
    pub(crate) fn alloc_bulk(
        &self,
        len: usize,
        count: usize,
        mut sink: impl FnMut(Block),
    ) -> Result<(), Failure> {
        let c = class_of(len);
        let mut done = 0;
        if c < self.g.classes {
            cache::with_slot(self, |mine| {
                let Some(mine) = mine.filter(|mine| mine.enable(c, &self.g)) else {
                    return;
                };
                let mut units = [0u32; 64];
                while done < count {
                    let want = (count - done).min(units.len());
                    let popped = mine.pop_into(c, &mut units[..want]);
                    for &unit in &units[..popped] {
                        sink(Block::small(unit, c));
                    }
                    done += popped;
                    if popped > 0 {
                        continue;
                    }
                    if mine.held(c) > 0 || !mine.is_settled(c) {
                        mine.settle(c, self.lock(c));
                    } else if !self.refill(mine, c) {
                        return;
                    }
                }
            });
        }
        while done < count {
            sink(self.alloc(len)?);
            done += 1;
        }
        Ok(())
    }

    /// Frees every block of `blocks`, with one cache lookup for the whole batch.
    pub(crate) fn free_bulk(&self, blocks: impl IntoIterator<Item = Block>) {
        let mut blocks = blocks.into_iter();
        cache::with_slot(self, |mine| {
            let Some(mine) = mine else {
                return;
            };
            for block in blocks.by_ref() {
                let Some(c) = block.class() else {
                    self.free_large(block);
                    continue;
                };
                let unit = block.unit();
                if !self.cache_free(mine, c, unit) {
                    self.free_direct(c, unit);
                }
            }
        });
        for block in blocks {
            self.free(block);
        }
    }

    /// Fills `out` with blocks of class `c` (a class of this arena): one copy from this
    /// thread's cache when it holds enough, else refilled from the shared level a batch at a
    /// time. All or nothing: on failure the blocks taken so far go back and the failure is
    /// returned (after waiting, if the arena waits). `Pool::alloc_units` is the same path with
    /// the pool's copy of the id; this entry is the one the loom models and unit tests drive.
    #[cfg(test)]
    pub(crate) fn alloc_units(&self, c: usize, out: &mut [u32]) -> Result<(), Failure> {
        let done = cache::with_fast_slot(self.id, |mine| mine.pop_into(c, out)).unwrap_or(0);
        if done == out.len() {
            return Ok(());
        }
        self.alloc_units_slow(c, out, done)
    }

    /// [`Arena::alloc_units`] once its fast path took the first `done` blocks.
    #[cold]
    pub(crate) fn alloc_units_slow(
        &self,
        c: usize,
        out: &mut [u32],
        mut done: usize,
    ) -> Result<(), Failure> {
        cache::with_slot(self, |mine| {
            let Some(mine) = mine.filter(|mine| mine.enable(c, &self.g)) else {
                return;
            };
            while done < out.len() {
                let popped = mine.pop_into(c, &mut out[done..]);
                done += popped;
                if popped > 0 {
                    continue;
                }
                if mine.held(c) > 0 || !mine.is_settled(c) {
                    mine.settle(c, self.lock(c));
                } else if !self.refill(mine, c) {
                    return;
                }
            }
        });
        // Uncached, or the shared level ran dry: one at a time, reclaiming, and waiting if
        // the arena waits.
        while done < out.len() {
            match self.alloc_small_slow(c) {
                Ok(block) => {
                    out[done] = block.unit();
                    done += 1;
                }
                Err(failure) => {
                    self.free_units(c, &out[..done]);
                    return Err(failure);
                }
            }
        }
        Ok(())
    }

    /// Frees `units`, blocks of class `c` this arena allocated: one copy into this thread's
    /// cache when it has room, else flushing a batch to the shared level as needed.
    #[inline]
    pub(crate) fn free_units(&self, c: usize, units: &[u32]) {
        let done = cache::with_fast_slot(self.id, |mine| mine.push_from(c, units)).unwrap_or(0);
        if done > 0 && cache::someone_waits_after_push(self.waiters_word()) {
            self.hand_over(c);
        }
        if done < units.len() {
            self.free_units_slow(c, &units[done..]);
        }
    }

    /// [`Arena::free_units`] for what its fast path could not take.
    #[cold]
    pub(crate) fn free_units_slow(&self, c: usize, mut units: &[u32]) {
        cache::with_slot(self, |mine| {
            let Some(mine) = mine.filter(|mine| mine.enable(c, &self.g)) else {
                return;
            };
            let mut cached = false;
            while !units.is_empty() {
                let n = mine.push_from(c, units);
                units = &units[n..];
                cached |= n > 0;
                if n > 0 || units.is_empty() {
                    continue;
                }
                // No room: what a reclaimer took is room again after settling; else flush.
                if !mine.is_settled(c) {
                    mine.settle(c, self.lock(c));
                } else if self.flush(mine, c) == 0 {
                    break;
                }
            }
            if cached && cache::someone_waits_after_push(self.waiters_word()) {
                self.hand_over_from(mine, c);
            }
        });
        // Uncached: straight to the shared level, a batch at a time.
        let batch = (self.g.class[c].batch as usize).clamp(1, BATCH_MAX);
        for chunk in units.chunks(batch) {
            self.give(c, chunk);
            // Relaxed: statistics.
            self.direct[c]
                .frees
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    }
}
