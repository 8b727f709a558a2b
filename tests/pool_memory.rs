//! A pool's thread caches take memory only for the threads and classes that use them.
//!
//! Every cache slot has room for a 512-entry magazine in each of its 23 classes (about 47 KiB),
//! and a pool has `max_threads` slots. They are made as zeroed memory that nothing writes
//! until a thread claims a slot and uses a class, so the process's resident memory grows with
//! use, not with `max_threads`. Measured here by the process's own resident set
//! (`/proc/self/status`), in a test binary of its own so that no other test allocates
//! meanwhile.

use std::sync::Arc;

use userdma::dma::{SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{Config, Pool};

/// The resident set of this process, in KiB.
fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line in /proc/self/status")
}

#[test]
fn thread_caches_take_memory_only_for_what_threads_use() {
    // Room for what eight threads hold at once, in use and cached (at most 300 + 512 blocks
    // each), however their runs overlap; never written, so it takes no memory itself.
    let region = Region::builder(32 << 20)
        .page_size(PageSize::Base)
        .lock(false)
        .build()
        .expect("32 MiB region");
    let mapping = SoftIommu::new(48)
        .expect("loopback DMA space")
        .map(Arc::new(region))
        .expect("mapping");
    // Slots for 4096 threads: about 190 MiB of magazines, had they been written.
    let config = Config::default().chunk_size(64 << 10).max_threads(4096);
    let before = resident_kib();
    let pool = Pool::new(mapping, config).expect("pool");
    let made = resident_kib();
    assert!(
        made.saturating_sub(before) < 16 << 10,
        "making a pool with 4096 cache slots grew the resident set by {} KiB",
        made - before
    );
    // Eight threads, each using the 4 KiB class through its cache (whole magazines of it).
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..4 {
                    let buffers: Vec<_> = (0..300)
                        .map(|_| pool.alloc(4096).expect("buffer"))
                        .collect();
                    drop(buffers);
                }
                pool.flush_thread_cache();
            });
        }
    });
    let used = resident_kib();
    // Each thread touched its slot's 4 KiB magazine (2 KiB) and the header pages around it,
    // and the pool's metadata for the blocks it carved.
    assert!(
        used.saturating_sub(made) < 8 << 10,
        "eight threads using one class grew the resident set by {} KiB",
        used - made
    );
    let stats = pool.stats();
    assert_eq!(stats.classes[4].allocs, 8 * 4 * 300);
    assert_eq!(stats.classes[4].in_use, 0);
}
