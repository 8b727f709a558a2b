//! Pool statistics: what [`Pool::stats`](super::Pool::stats) returns.
//!
//! **How exact.** Every counter is a relaxed atomic. Thread-cache counters are written by their
//! thread alone with a plain load and store (no read-modify-write on the fast path) and summed
//! over threads when read; shared-level counters are updated once per batch. A snapshot taken
//! while traffic runs is therefore not one instant: each counter is exact as of some moment
//! during the call, and counters read a few nanoseconds apart may disagree by the operations in
//! flight (`in_use` is clamped at zero for that reason). A snapshot taken while no thread is in
//! a pool call is exact and self-consistent; the tests rely on that.
//!
//! **Whose counters.** `allocs`, `frees`, `cache_hits` and `in_use` count this process's
//! operations. `outstanding`, `high_water`, `shared_hits`, `carved`, `free`, `slabs` and the
//! large-buffer figures describe the pool's shared state, so for a pool shared between
//! processes they cover all of them.

/// Statistics of one size class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ClassStats {
    /// Block size of the class in bytes.
    pub size: u64,
    /// Allocations (this process).
    pub allocs: u64,
    /// Frees (this process).
    pub frees: u64,
    /// Allocations served from the thread's cache without touching shared state.
    pub cache_hits: u64,
    /// Blocks taken from the shared lists (refills and uncached allocations), all processes.
    pub shared_hits: u64,
    /// Blocks carved from fresh slabs, all processes.
    pub carved: u64,
    /// Buffers of this class alive now (this process): `allocs - frees`.
    pub in_use: u64,
    /// Blocks out of the shared lists now, all processes: in use plus in thread caches.
    pub outstanding: u64,
    /// Peak of `outstanding` since the pool was created. Exact; an upper bound of the peak of
    /// buffers in use, by at most what thread caches held at that moment.
    pub high_water: u64,
    /// Carved blocks free in the shared lists.
    pub free: u64,
    /// Slabs (chunks or buddy blocks) given to this class.
    pub slabs: u64,
    /// Bytes of the class's current slab not carved yet.
    pub uncarved_bytes: u64,
    /// Bytes of the class's slabs that no block uses: the gaps cache colouring
    /// ([`Config::colouring`](super::Config::colouring)) leaves between blocks and at the end
    /// of each slab. Zero for an uncoloured class.
    pub gap_bytes: u64,
    /// Distance between two blocks of the class in a slab: `size`, or `size + 256` for a
    /// coloured class.
    pub stride: u64,
}

/// Statistics of the buddy allocator and of buffers above the largest class.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LargeStats {
    /// Large-buffer allocations.
    pub allocs: u64,
    /// Large-buffer frees.
    pub frees: u64,
    /// Bytes held by large buffers now.
    pub in_use_bytes: u64,
    /// Peak of `in_use_bytes`.
    pub high_water_bytes: u64,
    /// Buddy allocations of any kind (large buffers and slabs).
    pub buddy_allocs: u64,
    /// Buddy frees.
    pub buddy_frees: u64,
    /// Buddy block splits.
    pub splits: u64,
    /// Buddy block merges.
    pub merges: u64,
    /// Bytes free in the buddy allocator.
    pub free_bytes: u64,
    /// Size of the largest free buddy block, in bytes (0 if none).
    pub largest_free_bytes: u64,
}

/// A snapshot of a pool's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Stats {
    /// Arena size in bytes (the part of the mapping buffers are carved from).
    pub arena_bytes: u64,
    /// Buddy chunk size in bytes.
    pub chunk_bytes: u64,
    /// One entry per size class, smallest first.
    pub classes: Vec<ClassStats>,
    /// Buffers above the largest class, and the buddy allocator.
    pub large: LargeStats,
    /// Threads of this process holding a cache slot in the pool now.
    pub cached_threads: u64,
}

impl Stats {
    /// The statistics of the class serving `len`-byte requests, if one does.
    pub fn class_for(&self, len: usize) -> Option<&ClassStats> {
        self.classes.get(super::geometry::class_of(len))
    }

    /// Bytes accounted for: every class's slabs plus the buddy allocator's free bytes plus large
    /// buffers in use. Equals `arena_bytes` whenever the counters are consistent (see the
    /// module docs), which is what "no byte is lost" means for a pool.
    pub fn accounted_bytes(&self) -> u64 {
        let classes: u64 = self
            .classes
            .iter()
            .map(|c| (c.outstanding + c.free) * c.size + c.uncarved_bytes + c.gap_bytes)
            .sum();
        classes + self.large.free_bytes + self.large.in_use_bytes
    }
}
