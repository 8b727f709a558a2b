//! The buddy allocator over whole chunks: large buffers and the slabs size classes carve.
//!
//! Blocks are `2^order` chunks, aligned (within the arena) to their size. Allocation takes the
//! smallest free block of at least the wanted order and splits it, pushing each upper half onto
//! the free list of its order; freeing merges a block with its buddy (`index ^ 2^order`) for as
//! long as the buddy is free at the same order. An arena whose chunk count is not a power of two
//! starts as the maximal aligned blocks that fit; a buddy beyond the arena's end is never free,
//! so merges stop there.
//!
//! **Locking.** The free lists are doubly linked (O(1) removal of a buddy in the middle of a
//! list, which a lock-free stack cannot do) and guarded by one spin lock: a word in the shared
//! metadata, so that it works between processes, where a `Mutex` does not. It is taken only for
//! requests above the largest size class and when a size class needs a new slab, never on the
//! size classes' alloc/free path. A process that dies while holding it leaves it held; the pool
//! documents that a shared pool's processes must not be killed mid-operation.
//!
//! All state is atomics so that it may live in shared memory; under the lock they are accessed
//! with `Relaxed` ordering, the lock's Acquire/Release ordering everything.

use super::geometry::Geometry;
use super::meta::Meta;
use super::stack::NIL;
use crate::sync::{hint, thread, AtomicU32, Ordering};

/// State bit: this chunk heads a free block (order in the low bits).
const FREE: u32 = 1 << 31;
/// State bit: this chunk heads an allocated block (order in the low bits).
const USED: u32 = 1 << 30;

/// Proof that the buddy lock is held; releases it on drop.
#[derive(Debug)]
pub(crate) struct Guard<'a> {
    lock: &'a AtomicU32,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        // Release: pairs with the Acquire CAS in `Buddy::lock`; everything written under the
        // lock is visible to the next holder.
        self.lock.store(0, Ordering::Release);
    }
}

/// A view of the buddy allocator of one arena.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Buddy<'a> {
    g: &'a Geometry,
    meta: &'a Meta,
}

impl<'a> Buddy<'a> {
    /// The buddy allocator whose state is in `meta`.
    pub(crate) fn new(g: &'a Geometry, meta: &'a Meta) -> Self {
        Self { g, meta }
    }

    /// Takes the lock, spinning (then yielding) while another thread or process holds it.
    pub(crate) fn lock(&self) -> Guard<'a> {
        let lock = &self.meta.globals[0].lock;
        let mut spins = 0u32;
        loop {
            // Acquire: pairs with the Release store in `Guard::drop` of the previous holder.
            if lock
                .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Guard { lock };
            }
            // Relaxed: only a hint to retry the CAS.
            while lock.load(Ordering::Relaxed) != 0 {
                if spins < 64 {
                    spins += 1;
                    hint::spin_loop();
                } else {
                    thread::yield_now();
                }
            }
        }
    }

    /// Sets up the free lists of a fresh arena (all chunks free). Only at creation, before any
    /// other thread or process can see the arena.
    pub(crate) fn init(&self) {
        let _guard = self.lock();
        for head in self.meta.orders.iter().take(self.g.max_order as usize + 1) {
            head.store(NIL, Ordering::Relaxed);
        }
        for node in self.meta.nodes.iter() {
            node.state.store(0, Ordering::Relaxed);
        }
        let chunks = self.g.chunks;
        let mut index = 0u32;
        while index < chunks {
            // The largest order that is aligned at `index` and still fits.
            let mut order = if index == 0 {
                self.g.max_order
            } else {
                index.trailing_zeros()
            };
            while (1u64 << order) > u64::from(chunks - index) {
                order -= 1;
            }
            self.push(index, order);
            index += 1 << order;
        }
        self.meta.globals[0]
            .free_chunks
            .store(u64::from(chunks), Ordering::Relaxed);
    }

    fn node(&self, index: u32) -> &'a super::meta::BuddyNode {
        &self.meta.nodes[index as usize]
    }

    /// Pushes free block `(index, order)` on its list and marks it free.
    fn push(&self, index: u32, order: u32) {
        let head = &self.meta.orders[order as usize];
        let old = head.load(Ordering::Relaxed);
        let node = self.node(index);
        node.next.store(old, Ordering::Relaxed);
        node.prev.store(NIL, Ordering::Relaxed);
        node.state.store(FREE | order, Ordering::Relaxed);
        if old != NIL {
            self.node(old).prev.store(index, Ordering::Relaxed);
        }
        head.store(index, Ordering::Relaxed);
    }

    /// Removes free block `(index, order)` from its list (anywhere in it).
    fn remove(&self, index: u32, order: u32) {
        let node = self.node(index);
        let next = node.next.load(Ordering::Relaxed);
        let prev = node.prev.load(Ordering::Relaxed);
        if prev == NIL {
            self.meta.orders[order as usize].store(next, Ordering::Relaxed);
        } else {
            self.node(prev).next.store(next, Ordering::Relaxed);
        }
        if next != NIL {
            self.node(next).prev.store(prev, Ordering::Relaxed);
        }
        node.state.store(0, Ordering::Relaxed);
    }

    /// Allocates a block of `2^order` chunks; returns its first chunk.
    pub(crate) fn alloc(&self, _guard: &Guard<'_>, order: u32) -> Option<u32> {
        if order > self.g.max_order {
            return None;
        }
        let globals = &self.meta.globals[0];
        let mut have = (order..=self.g.max_order)
            .find(|&o| self.meta.orders[o as usize].load(Ordering::Relaxed) != NIL)?;
        let index = self.meta.orders[have as usize].load(Ordering::Relaxed);
        self.remove(index, have);
        while have > order {
            have -= 1;
            self.push(index + (1 << have), have);
            globals.splits.fetch_add(1, Ordering::Relaxed);
        }
        self.node(index)
            .state
            .store(USED | order, Ordering::Relaxed);
        globals.free_chunks.fetch_sub(1 << order, Ordering::Relaxed);
        globals.buddy_allocs.fetch_add(1, Ordering::Relaxed);
        Some(index)
    }

    /// Frees block `(index, order)`, merging it with free buddies.
    ///
    /// Panics if the block is not an allocated block of that order: a bookkeeping bug, since
    /// only the pool's own records reach here.
    pub(crate) fn free(&self, _guard: &Guard<'_>, index: u32, order: u32) {
        let state = self.node(index).state.load(Ordering::Relaxed);
        assert_eq!(
            state,
            USED | order,
            "buddy free of a block that is not allocated"
        );
        self.node(index).state.store(0, Ordering::Relaxed);
        let globals = &self.meta.globals[0];
        globals.free_chunks.fetch_add(1 << order, Ordering::Relaxed);
        globals.buddy_frees.fetch_add(1, Ordering::Relaxed);
        let (mut index, mut order) = (index, order);
        while order < self.g.max_order {
            let buddy = index ^ (1 << order);
            let fits = u64::from(buddy) + (1u64 << order) <= u64::from(self.g.chunks);
            if !fits || self.node(buddy).state.load(Ordering::Relaxed) != FREE | order {
                break;
            }
            self.remove(buddy, order);
            globals.merges.fetch_add(1, Ordering::Relaxed);
            index = index.min(buddy);
            order += 1;
        }
        self.push(index, order);
    }

    /// Free chunks, and the order of the largest free block (if any). Read without the lock:
    /// exact when no buddy operation runs concurrently.
    pub(crate) fn free_summary(&self) -> (u64, Option<u32>) {
        // Relaxed: statistics.
        let largest = (0..=self.g.max_order)
            .rev()
            .find(|&o| self.meta.orders[o as usize].load(Ordering::Relaxed) != NIL);
        (
            self.meta.globals[0].free_chunks.load(Ordering::Relaxed),
            largest,
        )
    }

    /// Every free block as `(first chunk, order)`, for consistency checks. Takes the lock.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn free_blocks(&self) -> Vec<(u32, u32)> {
        let _guard = self.lock();
        let mut out = Vec::new();
        for order in 0..=self.g.max_order {
            let mut at = self.meta.orders[order as usize].load(Ordering::Relaxed);
            while at != NIL {
                assert_eq!(self.node(at).state.load(Ordering::Relaxed), FREE | order);
                out.push((at, order));
                at = self.node(at).next.load(Ordering::Relaxed);
            }
        }
        out
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::pool::Config;

    fn setup(chunks: u64) -> (Geometry, Meta) {
        // Under Miri (scripts/miri.sh), 64 KiB chunks: the tables are made element by
        // element, ~10^4 times slower there. The tests count in chunks.
        let (shift, config) = if cfg!(miri) {
            let small = 64 << 10;
            (16, Config::default().chunk_size(small).max_class(small))
        } else {
            (21, Config::default())
        };
        let g = Geometry::new(chunks << shift, &config).unwrap();
        let m = Meta::heap(&g);
        Buddy::new(&g, &m).init();
        (g, m)
    }

    #[test]
    fn init_makes_maximal_aligned_blocks() {
        let (g, m) = setup(13);
        let b = Buddy::new(&g, &m);
        let mut blocks = b.free_blocks();
        blocks.sort_unstable();
        assert_eq!(blocks, vec![(0, 3), (8, 2), (12, 0)]);
        assert_eq!(b.free_summary(), (13, Some(3)));
    }

    #[test]
    fn split_then_merge_back() {
        let (g, m) = setup(8);
        let b = Buddy::new(&g, &m);
        let guard = b.lock();
        let a = b.alloc(&guard, 0).unwrap();
        assert_eq!(a, 0);
        assert_eq!(m.globals[0].splits.load(Ordering::Relaxed), 3);
        let c = b.alloc(&guard, 1).unwrap();
        assert_eq!(c, 2);
        let d = b.alloc(&guard, 0).unwrap();
        assert_eq!(d, 1);
        assert_eq!(b.alloc(&guard, 3), None);
        b.free(&guard, a, 0);
        b.free(&guard, c, 1);
        b.free(&guard, d, 0);
        drop(guard);
        assert_eq!(b.free_blocks(), vec![(0, 3)]);
        assert_eq!(m.globals[0].merges.load(Ordering::Relaxed), 3);
        assert_eq!(b.free_summary(), (8, Some(3)));
    }

    #[test]
    fn merge_stops_at_the_arena_end() {
        let (g, m) = setup(6);
        let b = Buddy::new(&g, &m);
        let guard = b.lock();
        let x = b.alloc(&guard, 1).unwrap();
        assert_eq!(x, 4);
        b.free(&guard, x, 1);
        drop(guard);
        let mut blocks = b.free_blocks();
        blocks.sort_unstable();
        assert_eq!(blocks, vec![(0, 2), (4, 1)]);
    }

    #[test]
    #[should_panic(expected = "not allocated")]
    fn double_free_is_caught() {
        let (g, m) = setup(2);
        let b = Buddy::new(&g, &m);
        let guard = b.lock();
        let x = b.alloc(&guard, 0).unwrap();
        b.free(&guard, x, 0);
        b.free(&guard, x, 0);
    }
}
