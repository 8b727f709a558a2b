//! The shared level of the size classes: what thread caches refill from and flush to.
//!
//! Per class, free blocks at the shared level are in one of three places, tried in this order
//! by [`Central::take`]:
//!
//! 1. the **depot**: a lock-free stack of full magazines (arrays of up to a batch of block
//!    units). A refill pops one magazine and copies its entries out: one CAS and the magazine's
//!    own cache lines (its stack link is in the first) for a whole batch, whoever filled it.
//!    Empty magazines wait on a pool-wide stack.
//! 2. the **list**: a lock-free stack of single blocks linked through the link table (one
//!    `u32` per 256-byte unit). Used when the depot has no empty magazine to fill; a refill pops
//!    up to a batch as one chain.
//! 3. the class's **current slab**: uncarved blocks of a chunk taken from the buddy allocator,
//!    carved under the buddy lock. A chunk carved into a class stays in that class.
//!
//! [`Central::give`] fills an empty depot magazine when there is one and otherwise pushes the
//! batch onto the list as one pre-linked chain. A class's depot magazines hold at most the
//! class's batch, so a popped magazine always fits an empty thread cache.

use super::buddy::Buddy;
use super::geometry::{Geometry, BATCH_MAX};
use super::meta::{ClassShared, DepotMagazine, Meta};
use super::stack::{pack, Stack, EMPTY, NIL};
use crate::sync::{AtomicU32, Ordering};

/// A view of the shared level of one arena.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Central<'a> {
    g: &'a Geometry,
    meta: &'a Meta,
}

impl<'a> Central<'a> {
    /// The shared level whose state is in `meta`.
    pub(crate) fn new(g: &'a Geometry, meta: &'a Meta) -> Self {
        Self { g, meta }
    }

    fn class(&self, c: usize) -> &'a ClassShared {
        &self.meta.classes[c]
    }

    fn list(&self, c: usize) -> Stack<'a, [AtomicU32]> {
        Stack::new(&self.class(c).list, &self.meta.links)
    }

    fn depot(&self, c: usize) -> Stack<'a, [DepotMagazine]> {
        Stack::new(&self.class(c).full, &self.meta.magazines)
    }

    fn empties(&self) -> Stack<'a, [DepotMagazine]> {
        Stack::new(&self.meta.globals[0].empty, &self.meta.magazines)
    }

    /// Sets up a fresh arena: empty lists and depots, every magazine on the empty stack. Only at
    /// creation, before another thread or process can see the arena.
    pub(crate) fn init(&self) {
        for class in self.meta.classes.iter().take(self.g.classes) {
            class.full.store(EMPTY, Ordering::Relaxed);
            class.list.store(EMPTY, Ordering::Relaxed);
        }
        let empties = self.empties();
        let n = self.g.magazines;
        for m in 0..n {
            empties.link(m, if m + 1 < n { m + 1 } else { NIL });
        }
        let head = if n == 0 { EMPTY } else { pack(0, 0) };
        // Relaxed: the arena is published to other threads (a Box handed over) or processes
        // (the header's Release store of its state) after this.
        self.meta.globals[0].empty.store(head, Ordering::Relaxed);
    }

    /// Whether `unit` is a plausible block of class `c`: inside the arena and where the
    /// class's slabs put blocks ([`Geometry::is_block`]). Entries failing this can only come
    /// from shared memory overwritten from outside; they are dropped rather than handed out.
    #[inline]
    fn valid(&self, c: usize, unit: u32) -> bool {
        self.g.is_block(c, unit)
    }

    /// Takes up to `want` (1..=batch) free blocks of class `c` into `out`; returns how many.
    /// A depot magazine is taken whole, so the count may exceed `want` (never the batch).
    /// Returns 0 when the class and the buddy allocator are exhausted.
    pub(crate) fn take(&self, c: usize, want: u32, out: &mut [u32; BATCH_MAX]) -> usize {
        let class = self.class(c);
        let mut got = 0usize;
        if let Some(m) = self.depot(c).pop() {
            let magazine = &self.meta.magazines[m as usize];
            // Relaxed: ordered by the Acquire of the pop (pairs with the filler's Release push).
            let count = (magazine.count.load(Ordering::Relaxed) as usize).min(BATCH_MAX);
            for item in &magazine.items[..count] {
                let unit = item.load(Ordering::Relaxed);
                if self.valid(c, unit) {
                    out[got] = unit;
                    got += 1;
                }
            }
            self.empties().push(m);
        } else if let Some((first, count)) = self.list(c).pop_chain(want) {
            let list = self.list(c);
            let mut unit = first;
            for _ in 0..count {
                if unit == NIL || !self.valid(c, unit) {
                    break;
                }
                out[got] = unit;
                got += 1;
                unit = list.next(unit);
            }
        }
        if got > 0 {
            // Relaxed counters: statistics only.
            class.shared_hits.fetch_add(got as u64, Ordering::Relaxed);
        } else {
            got = self.carve(c, want, out);
        }
        if got > 0 {
            let out_now = class.out.fetch_add(got as u64, Ordering::Relaxed) + got as u64;
            // A plain load first: the read-modify-write only when the peak moves.
            if out_now > class.high_water.load(Ordering::Relaxed) {
                class.high_water.fetch_max(out_now, Ordering::Relaxed);
            }
        }
        got
    }

    /// Carves up to `want` new blocks of class `c` from its slab, taking a new slab from the
    /// buddy allocator when no further block fits in the current one. Blocks are `stride`
    /// bytes apart (the block size, or more for a coloured class, whose slab then ends in a
    /// gap shorter than a stride that is never carved).
    fn carve(&self, c: usize, want: u32, out: &mut [u32; BATCH_MAX]) -> usize {
        let class = self.class(c);
        let buddy = Buddy::new(self.g, self.meta);
        let guard = buddy.lock();
        // Relaxed: `carve_*` are only accessed under the buddy lock.
        let mut next = class.carve_next.load(Ordering::Relaxed);
        let mut end = class.carve_end.load(Ordering::Relaxed);
        let size = self.g.block_size(c);
        let stride = self.g.stride(c);
        if end.saturating_sub(next) < size {
            let order = self.g.class[c].slab_order;
            let Some(chunk) = buddy.alloc(&guard, order) else {
                return 0;
            };
            next = u64::from(chunk) << self.g.chunk_shift;
            end = next + (self.g.chunk_size() << order);
            class.slabs.fetch_add(1, Ordering::Relaxed);
        }
        // Blocks that fit in `[next, end)`: the first needs `size`, each further one `stride`.
        // One division per carve (a batch), under the lock; `end - next >= size` here.
        let fit = (end - next - size) / stride + 1;
        let n = fit.min(u64::from(want)).min(BATCH_MAX as u64);
        let step = scatter_step(size, stride, n);
        for (i, slot) in out.iter_mut().take(n as usize).enumerate() {
            // A permutation of `0..n` (`step` is prime to `n`): the run's blocks, each once.
            *slot = Geometry::unit(next + (i as u64 * step) % n * stride);
        }
        // Past `end` after the slab's last block of a coloured class: the next carve then
        // sees no room and takes a new slab.
        class.carve_next.store(next + n * stride, Ordering::Relaxed);
        class.carve_end.store(end, Ordering::Relaxed);
        class.carved.fetch_add(n, Ordering::Relaxed);
        n as usize
    }

    /// Returns `items` (1..=batch blocks of class `c`, owned by the caller) to the shared level.
    pub(crate) fn give(&self, c: usize, items: &[u32]) {
        let (Some(&first), Some(&last)) = (items.first(), items.last()) else {
            return;
        };
        debug_assert!(items.len() <= self.g.class[c].batch as usize);
        if let Some(m) = self.empties().pop() {
            let magazine = &self.meta.magazines[m as usize];
            for (slot, &unit) in magazine.items.iter().zip(items) {
                // Relaxed: published by the Release CAS of the depot push below.
                slot.store(unit, Ordering::Relaxed);
            }
            magazine.count.store(items.len() as u32, Ordering::Relaxed);
            self.depot(c).push(m);
        } else {
            let list = self.list(c);
            for pair in items.windows(2) {
                list.link(pair[0], pair[1]);
            }
            list.push_chain(first, last);
        }
        // Relaxed: statistics; ordered after the matching `take` by the hand-over of the blocks.
        self.class(c)
            .out
            .fetch_sub(items.len() as u64, Ordering::Relaxed);
    }

    /// Allocates a large block of `2^order` chunks from the buddy allocator; returns its first
    /// chunk.
    pub(crate) fn alloc_large(&self, order: u32) -> Option<u32> {
        let buddy = Buddy::new(self.g, self.meta);
        let guard = buddy.lock();
        let chunk = buddy.alloc(&guard, order)?;
        let globals = &self.meta.globals[0];
        // Relaxed counters: statistics (written under the lock, read anywhere).
        let now = globals
            .large_chunks
            .fetch_add(1 << order, Ordering::Relaxed)
            + (1 << order);
        globals.large_high_water.fetch_max(now, Ordering::Relaxed);
        globals.large_allocs.fetch_add(1, Ordering::Relaxed);
        Some(chunk)
    }

    /// Frees a large block allocated by [`Central::alloc_large`].
    pub(crate) fn free_large(&self, chunk: u32, order: u32) {
        let buddy = Buddy::new(self.g, self.meta);
        let guard = buddy.lock();
        buddy.free(&guard, chunk, order);
        let globals = &self.meta.globals[0];
        globals
            .large_chunks
            .fetch_sub(1 << order, Ordering::Relaxed);
        globals.large_frees.fetch_add(1, Ordering::Relaxed);
    }

    /// Blocks of class `c` free at the shared level (carved, not out), the bytes of its
    /// current slab that are still to be carved, and the bytes of its slabs that no block
    /// uses (the gaps cache colouring leaves between blocks and at a slab's end; zero for an
    /// uncoloured class). Read without any lock: exact when no thread is inside `take`/`give`
    /// of this class, otherwise off by the blocks of the batches in flight.
    pub(crate) fn free_in_class(&self, c: usize) -> (u64, u64, u64) {
        let class = self.class(c);
        // Relaxed: statistics.
        let carved = class.carved.load(Ordering::Relaxed);
        let out = class.out.load(Ordering::Relaxed);
        let end = class.carve_end.load(Ordering::Relaxed);
        let next = class.carve_next.load(Ordering::Relaxed);
        let slabs = class.slabs.load(Ordering::Relaxed);
        let size = self.g.block_size(c);
        // What is left of the slab is carvable only if a block still fits (a coloured slab
        // ends in a gap shorter than a block).
        let left = end.saturating_sub(next);
        let uncarved = if left >= size { left } else { 0 };
        let slab_bytes = self.g.chunk_size() << self.g.class[c].slab_order;
        let gaps = slabs
            .wrapping_mul(slab_bytes)
            .saturating_sub(carved.wrapping_mul(size))
            .saturating_sub(uncarved);
        (carved.saturating_sub(out), uncarved, gaps)
    }
}

/// The order in which [`Central::carve`] hands out a run of `n` fresh blocks: block `i` of the
/// batch is the run's block `i * step mod n`.
///
/// Blocks of an uncoloured class from 4 KiB up all start on a page boundary, so their first
/// lines share one L1 set whatever the order; handed out in address order, the blocks of a
/// batch are also consecutive pages, and they stay in runs as they go round the thread caches.
/// Measured on the development VM (`benches/pool.rs`, two-thread burst 32, page-aligned
/// layout, the machine's fast cross-core state): 13.5-15.0 ns per buffer with the runs in
/// address order, 8.9 and 12.0 ns scattered this way (DPDK's page-stride mempool 7.0-7.5 in
/// the same runs), and the pipeline of single buffers 12.5-13.6 ns before, 11.8-12.1 after;
/// the cause is not known. Smaller classes keep address order (their blocks share pages,
/// whose lines the caches fetch together), and so do coloured classes (their strides already
/// spread the first lines; scattered, their one-thread bulk loop was 0.1 ns slower per
/// buffer).
///
/// On a second machine (an AMD EPYC VM, three processes) the gap is gone: the same pipeline
/// through a `Batch` 0.96-0.98 of DPDK's page-stride mempool (about 21 ns per buffer each, in
/// either cross-core state), single buffers 1.05-1.08.
///
/// What the rest of that gap to DPDK (9.4-10.6 ns against 6.9-7.7 in the fast state) is and
/// is not, from throwaway builds on the first VM, each against the code as it is in the same
/// minutes:
/// - a shared L1 set with other data: moving the written line within the page changed
///   nothing;
/// - the L2 sets: in this order, as in address order, a batch's 32 blocks fall into the 32
///   different groups of L2 sets that page-aligned lines can use;
/// - this particular permutation: other steps, and a random shuffle of each run, measured
///   the same (9.4-10.5 ns);
/// - the reuse distance, for a third of it: a FIFO depot with 8192 blocks going round
///   (DPDK's population; here about 1300 go round, the caches and depot being LIFO) took
///   8.9-9.0 ns against 10.1, and the FIFO depot without the extra blocks 10.5. A FIFO
///   depot shared between processes (a bounded queue of magazines) would also need a way
///   past a slot a process died while filling, where the stack loses at most the magazine
///   that process held.
///
/// With no allocator at all (a producer's free list of page-aligned blocks fed back by a
/// second SPSC ring, every block going round all the others) the same pipeline took 11-12 ns
/// with 2048 blocks in address order, 7.7-8.5 with them shuffled or in a golden-ratio
/// order, and 7.2-8.3 with 8192 in any order: at DPDK's figure, about 2 ns under the
/// pool's. A profile of the pool's run (both threads busy) put 13 % of the samples in the
/// depot's copies (the consumer's flush writes 16 lines of `u32`s that the producer's refill
/// then reads), and 15 % in the copies of the `Batch` into and out of the ring, where the
/// stores of the producer's buffer writes drain.
fn scatter_step(size: u64, stride: u64, n: u64) -> u64 {
    if stride != size || size < 4096 || n < 4 {
        return 1;
    }
    // About `n` times the golden ratio's fractional part (0.618), which spreads consecutive
    // blocks furthest apart, moved up to the next odd number prime to `n` (a permutation
    // then); a step of 1 or `n - 1` would be address order, up or down.
    let mut step = (n * 618 / 1000) | 1;
    while gcd(step, n) != 1 {
        step += 2;
    }
    // Only a handful of blocks (`n` of 4 or 6) has no other.
    if step < n - 1 {
        step
    } else {
        1
    }
}

/// The greatest common divisor of `a` and `b`.
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
