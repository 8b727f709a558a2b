//! The pool's shared metadata: free-list heads, depot magazines, buddy tables, counters and the
//! link table, all made of atomics holding offsets and indices (never pointers).
//!
//! A private pool keeps these tables on the heap. A shared pool places them at the start of the
//! shareable region, behind a [`SharedHeader`], so that a second process mapping the same region
//! allocates from the same lists. Every type here is `#[repr(C)]`, made only of `u32`/`u64`
//! atomics, and valid when all-zero, which is what placing it in fresh shared memory requires.

use std::ops::Deref;
use std::ptr::NonNull;

use super::geometry::{Geometry, BATCH_MAX, MAX_CLASSES, MAX_ORDERS};
use crate::sync::{AtomicU32, AtomicU64};

/// One metadata table: a slice owned by this process (heap) or borrowed from shared memory.
pub(crate) struct Table<T> {
    ptr: NonNull<T>,
    len: usize,
    owned: bool,
}

// SAFETY: a `Table<T>` is a `Box<[T]>` or a `&[T]` into shared memory that outlives it; both are
// Send/Sync exactly when `T: Sync` (the elements are atomics, shared by design).
unsafe impl<T: Sync> Send for Table<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for Table<T> {}

impl<T> Table<T> {
    /// A heap table of `len` elements, each made by `make`.
    pub(crate) fn heap(len: usize, make: impl FnMut() -> T) -> Self {
        let mut make = make;
        let boxed: Box<[T]> = (0..len).map(|_| make()).collect();
        let len = boxed.len();
        // `Box::into_raw` never returns null.
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<T>()).unwrap_or(NonNull::dangling());
        Self {
            ptr,
            len,
            owned: true,
        }
    }

    /// A table of `len` elements at `ptr`, not owned.
    ///
    /// # Safety
    /// `ptr` is aligned for `T`, and `len` initialized elements live there (for the types of
    /// this module: any bytes, since they are valid when zero and every bit pattern is a valid
    /// integer) for as long as the table and every reference derived from it live. The memory
    /// is only accessed through atomics.
    #[cfg(not(loom))]
    pub(crate) unsafe fn borrowed(ptr: NonNull<T>, len: usize) -> Self {
        Self {
            ptr,
            len,
            owned: false,
        }
    }
}

impl<T> Deref for Table<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `ptr`/`len` describe initialized elements that outlive `self` (a leaked box we
        // own, or shared memory per `borrowed`'s contract); elements are only mutated through
        // atomics, so a shared slice is sound.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for Table<T> {
    fn drop(&mut self) {
        if self.owned {
            let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
            // SAFETY: an owned table is exactly the box leaked in `heap`, dropped once here.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}

impl<T> std::fmt::Debug for Table<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("len", &self.len)
            .field("owned", &self.owned)
            .finish()
    }
}

/// Pool-wide words: the empty-magazine stack, the buddy lock and the buddy's counters.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub(crate) struct Globals {
    /// Head of the stack of empty depot magazines (a tagged [`super::stack`] head).
    pub(crate) empty: AtomicU64,
    /// The buddy lock: 0 free, 1 held.
    pub(crate) lock: AtomicU32,
    /// Chunks currently free in the buddy allocator (written under the lock).
    pub(crate) free_chunks: AtomicU64,
    /// Buddy allocations (large buffers and slabs).
    pub(crate) buddy_allocs: AtomicU64,
    /// Buddy frees.
    pub(crate) buddy_frees: AtomicU64,
    /// Block splits.
    pub(crate) splits: AtomicU64,
    /// Buddy merges.
    pub(crate) merges: AtomicU64,
    /// Chunks held by large (above the largest class) buffers right now.
    pub(crate) large_chunks: AtomicU64,
    /// Peak of `large_chunks`.
    pub(crate) large_high_water: AtomicU64,
    /// Large-buffer allocations.
    pub(crate) large_allocs: AtomicU64,
    /// Large-buffer frees.
    pub(crate) large_frees: AtomicU64,
}

/// The words a waiter and a freer meet on; on its own cache line because every fast-path free
/// reads `waiters` and nothing else writes this line while nobody waits.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub(crate) struct WaitWords {
    /// Threads (of any process) waiting for a buffer.
    pub(crate) waiters: AtomicU32,
    /// Bumped on every wake-up; the futex word.
    pub(crate) seq: AtomicU32,
}

/// The shared state of one size class.
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub(crate) struct ClassShared {
    /// Head of the stack of full depot magazines (tagged).
    pub(crate) full: AtomicU64,
    /// Head of the stack of single free blocks (tagged; nodes are units).
    pub(crate) list: AtomicU64,
    /// Next uncarved byte of the class's current slab (under the buddy lock).
    pub(crate) carve_next: AtomicU64,
    /// End of the class's current slab (under the buddy lock).
    pub(crate) carve_end: AtomicU64,
    /// Blocks out of the shared level: in thread caches or in use. Exact.
    pub(crate) out: AtomicU64,
    /// Peak of `out`.
    pub(crate) high_water: AtomicU64,
    /// Blocks taken from the shared lists (depot or list), not carved.
    pub(crate) shared_hits: AtomicU64,
    /// Blocks ever carved from slabs.
    pub(crate) carved: AtomicU64,
    /// Slabs taken from the buddy allocator.
    pub(crate) slabs: AtomicU64,
    /// Allocations made without a thread cache (no slot, or caching disabled).
    pub(crate) direct_allocs: AtomicU64,
    /// Frees made without a thread cache (no slot, caching disabled, or while someone waits).
    pub(crate) direct_frees: AtomicU64,
}

/// One depot magazine: up to [`BATCH_MAX`] block units moved between caches as a unit. Its
/// stack link and count share its first cache line, so a pop or push touches the head word and
/// this line only; cache-line aligned, so two magazines never share a line.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct DepotMagazine {
    /// The next magazine on the stack (full or empty) this one is on (see `stack::Links`).
    pub(crate) next: AtomicU32,
    /// Number of valid entries.
    pub(crate) count: AtomicU32,
    /// Block units.
    pub(crate) items: [AtomicU32; BATCH_MAX],
}

impl Default for DepotMagazine {
    fn default() -> Self {
        Self {
            next: AtomicU32::new(0),
            count: AtomicU32::new(0),
            items: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

/// Buddy bookkeeping of one chunk: its state (if it heads a block) and free-list links.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct BuddyNode {
    /// `FREE | order` or `USED | order` when this chunk heads a block, 0 inside a block.
    pub(crate) state: AtomicU32,
    /// Next free block of the same order.
    pub(crate) next: AtomicU32,
    /// Previous free block of the same order.
    pub(crate) prev: AtomicU32,
}

/// All metadata tables of one arena.
#[derive(Debug)]
pub(crate) struct Meta {
    pub(crate) globals: Table<Globals>,
    pub(crate) wait: Table<WaitWords>,
    pub(crate) classes: Table<ClassShared>,
    pub(crate) orders: Table<AtomicU32>,
    pub(crate) nodes: Table<BuddyNode>,
    pub(crate) magazines: Table<DepotMagazine>,
    pub(crate) links: Table<AtomicU32>,
}

/// Byte offsets of every table inside a shared metadata area.
#[cfg(not(loom))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    globals: usize,
    wait: usize,
    classes: usize,
    orders: usize,
    nodes: usize,
    magazines: usize,
    links: usize,
    /// Total bytes, header included.
    pub(crate) len: usize,
}

/// Rounds `n` up to a multiple of 128 (a pair of cache lines).
#[cfg(not(loom))]
fn line(n: usize) -> usize {
    n.div_ceil(128) * 128
}

#[cfg(not(loom))]
impl Layout {
    /// The layout of the tables for `g`, after a header of `header` bytes.
    pub(crate) fn new(g: &Geometry, header: usize) -> Self {
        use std::mem::size_of;
        let mut at = line(header);
        let mut place = |bytes: usize| {
            let start = at;
            at = line(at + bytes);
            start
        };
        let globals = place(size_of::<Globals>());
        let wait = place(size_of::<WaitWords>());
        let classes = place(size_of::<ClassShared>() * MAX_CLASSES);
        let orders = place(size_of::<AtomicU32>() * MAX_ORDERS);
        let nodes = place(size_of::<BuddyNode>() * g.chunks as usize);
        let magazines = place(size_of::<DepotMagazine>() * g.magazines as usize);
        let links = place(size_of::<AtomicU32>() * g.units as usize);
        Self {
            globals,
            wait,
            classes,
            orders,
            nodes,
            magazines,
            links,
            len: at,
        }
    }
}

impl Meta {
    /// Zero-valued tables for `g` on the heap.
    pub(crate) fn heap(g: &Geometry) -> Self {
        Self {
            globals: Table::heap(1, Globals::default),
            wait: Table::heap(1, WaitWords::default),
            classes: Table::heap(MAX_CLASSES, ClassShared::default),
            orders: Table::heap(MAX_ORDERS, || AtomicU32::new(0)),
            nodes: Table::heap(g.chunks as usize, BuddyNode::default),
            magazines: Table::heap(g.magazines as usize, DepotMagazine::default),
            links: Table::heap(g.units as usize, || AtomicU32::new(0)),
        }
    }

    /// The tables for `g` placed at `base` according to `layout`.
    ///
    /// # Safety
    /// `base` is aligned to 128 bytes, points to at least `layout.len` bytes that stay mapped
    /// for as long as the returned tables live, and are accessed (by every process) only as the
    /// atomics of this module.
    #[cfg(not(loom))]
    pub(crate) unsafe fn place(g: &Geometry, base: NonNull<u8>, layout: &Layout) -> Self {
        fn at<T>(base: NonNull<u8>, offset: usize, len: usize) -> Table<T> {
            // SAFETY: `offset + len * size_of::<T>() <= layout.len` by construction of `Layout`,
            // offsets are multiples of 128 (>= the alignment of every type here), and the memory
            // contract is the caller's (see `place`).
            unsafe { Table::borrowed(base.add(offset).cast::<T>(), len) }
        }
        Self {
            globals: at(base, layout.globals, 1),
            wait: at(base, layout.wait, 1),
            classes: at(base, layout.classes, MAX_CLASSES),
            orders: at(base, layout.orders, MAX_ORDERS),
            nodes: at(base, layout.nodes, g.chunks as usize),
            magazines: at(base, layout.magazines, g.magazines as usize),
            links: at(base, layout.links, g.units as usize),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::pool::Config;

    #[test]
    fn layout_is_ordered_aligned_and_sized() {
        let g = Geometry::new(64 << 20, &Config::default()).unwrap();
        let l = Layout::new(&g, 200);
        let starts = [
            l.globals,
            l.wait,
            l.classes,
            l.orders,
            l.nodes,
            l.magazines,
            l.links,
        ];
        assert_eq!(l.globals, 256);
        for pair in starts.windows(2) {
            assert!(pair[0] < pair[1]);
        }
        for s in starts {
            assert_eq!(s % 128, 0);
        }
        assert!(l.links + 4 * g.units as usize <= l.len);
        // The link table dominates: 4 bytes per 256-byte unit.
        assert!(l.len < (64 << 20) / 64 + (1 << 20));
    }

    #[test]
    fn heap_tables_have_the_geometry_sizes() {
        let g = Geometry::new(8 << 20, &Config::default().magazines(16)).unwrap();
        let m = Meta::heap(&g);
        assert_eq!(m.links.len(), (8 << 20) >> 8);
        assert_eq!(m.nodes.len(), 4);
        assert_eq!(m.magazines.len(), 16);
        assert_eq!(m.classes.len(), MAX_CLASSES);
    }
}
