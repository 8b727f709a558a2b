//! A pool's counters (`udma_pool_stats`, `udma_pool_get_stats`).

use udma::pool;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::tables::{buffers_of, pin_pool, udma_pool};
use crate::abi;
use crate::error::{call, udma_status};

/// A snapshot of a pool's counters (`udma_pool_get_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_pool_stats {
    /// `sizeof(udma_pool_stats)`.
    pub size: usize,
    /// Bytes buffers are carved from.
    pub arena_bytes: u64,
    /// The pool's chunk (slab) size.
    pub chunk_bytes: u64,
    /// The largest length `udma_pool_alloc` can ever satisfy.
    pub max_len: u64,
    /// Allocations, all sizes (this process).
    pub allocs: u64,
    /// Frees, all sizes (this process).
    pub frees: u64,
    /// Buffers in use now: `allocs - frees`.
    pub in_use: u64,
    /// Allocations served from the thread's cache.
    pub cache_hits: u64,
    /// Allocations above the largest size class (whole chunks).
    pub large_allocs: u64,
    /// Bytes held by such large buffers now.
    pub large_in_use_bytes: u64,
    /// Buffer handles of this pool alive now (on the host or in a queue), and calls holding
    /// the pool on other threads (stats, bulk frees): what makes `udma_pool_destroy` busy.
    pub handles: u64,
}

abi::sized!(udma_pool_stats);

/// A snapshot of the pool's counters.
///
/// # Safety
/// `stats` points to `stats->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_pool_get_stats(
    pool: *const udma_pool,
    stats: *mut udma_pool_stats,
) -> udma_status {
    call("udma_pool_get_stats", || {
        let pin = pin_pool(pool)?;
        // The buffers out, and other calls holding the pool (every pin but this call's).
        let handles = buffers_of(pin.key()) + pin.count().saturating_sub(1);
        pin.with(|p| {
            let s = p.pool.stats();
            let sum = |f: fn(&pool::ClassStats) -> u64| s.classes.iter().map(f).sum::<u64>();
            let large_live = s.large.allocs.saturating_sub(s.large.frees);
            let value = udma_pool_stats {
                size: 0,
                arena_bytes: s.arena_bytes,
                chunk_bytes: s.chunk_bytes,
                max_len: p.pool.max_len() as u64,
                allocs: sum(|c| c.allocs) + s.large.allocs,
                frees: sum(|c| c.frees) + s.large.frees,
                in_use: sum(|c| c.in_use) + large_live,
                cache_hits: sum(|c| c.cache_hits),
                large_allocs: s.large.allocs,
                large_in_use_bytes: s.large.in_use_bytes,
                handles,
            };
            // SAFETY: per this function's contract.
            unsafe { abi::write(stats, "stats", value) }
        })
    })
}
