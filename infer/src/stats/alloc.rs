//! A counting global allocator: the system allocator, counting every allocation in the
//! process, so a program can measure (not assume) that its steady state allocates nothing.
//!
//! ```text
//! #[global_allocator]
//! static ALLOCATOR: userdma_infer::stats::CountingAllocator = userdma_infer::stats::CountingAllocator;
//! let before = userdma_infer::stats::allocations();
//! // ... the steady state ...
//! assert_eq!(userdma_infer::stats::allocations() - before, 0);
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// Allocations (and reallocations) made through [`CountingAllocator`] so far.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// This thread's allocations through [`CountingAllocator`]. A `const`-initialised `Cell`:
    /// reaching it never allocates (nor registers a destructor), so the allocator may use it.
    static THREAD_ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts one allocation, for the process and for the calling thread.
fn count() {
    // Relaxed: a statistic; nothing is ordered by it.
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    // A thread being torn down has no counter any more: its allocations count only above.
    let _ = THREAD_ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

/// The system allocator, counting allocations; install it with `#[global_allocator]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAllocator;

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds the
// `GlobalAlloc` contract; the only addition is a relaxed counter increment.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations made through [`CountingAllocator`] in this process so far (0 when it is not
/// the global allocator). Read it before and after a stretch of work; other threads'
/// allocations count too.
pub fn allocations() -> u64 {
    // Relaxed: a statistic; read after the work it counts.
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Allocations the calling thread made through [`CountingAllocator`] so far (0 when it is not
/// the global allocator): for work done on one thread, unaffected by what other threads (a
/// test harness, a logger) allocate meanwhile.
pub fn thread_allocations() -> u64 {
    THREAD_ALLOCATIONS
        .try_with(std::cell::Cell::get)
        .unwrap_or(0)
}
