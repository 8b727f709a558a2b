//! An allocation never fails while a free block of its class is anywhere in the process: on the
//! shared level, still to be carved, or in another thread's cache, however big the caches are
//! and whether the thread holding them is busy or idle; and a waiting allocation is woken by a
//! free on any thread.
//!
//! Small pools are the case: device memory and 32-bit DMA windows give a few MiB, where
//! thread caches of up to 512 blocks a class can hold most of the pool.
#![cfg(not(loom))]

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::dma::{Mapping, SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{Buffer, Config, Error, Exhaustion, Pool};
use userdma::Runtime;

fn mapping(bytes: usize) -> Mapping {
    let region = Region::builder(bytes)
        .page_size(PageSize::Base)
        .lock(false)
        .build()
        .expect("region");
    SoftIommu::new(48)
        .expect("loopback DMA space")
        .map(Arc::new(region))
        .expect("mapping")
}

/// A pool of `bytes` on base pages, as `Runtime::pool` makes one (64 KiB chunks).
fn pool(bytes: usize, config: Config) -> Pool {
    Pool::new(mapping(bytes), config).expect("pool")
}

/// xorshift: sizes and choices without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The shape: one thread allocates 64 B to 16 KiB and hands every fourth buffer to a
/// second thread, which frees it; the first frees the others after holding a few. Fewer than
/// 40 buffers are ever out of a 4 MiB pool, so no allocation may fail.
fn handoff(config: Config, rounds: usize) {
    let pool = pool(4 << 20, config.clone());
    let (to_freer, from_allocator) = mpsc::sync_channel::<Buffer<'_>>(16);
    std::thread::scope(|s| {
        s.spawn(move || {
            for buffer in from_allocator {
                drop(buffer);
            }
        });
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut held = std::collections::VecDeque::new();
        for i in 0..rounds {
            let len = 64 + (rng.next() % (16 << 10)) as usize;
            let buffer = pool.alloc(len).unwrap_or_else(|error| {
                panic!(
                    "allocation {i} of {len} bytes failed with {} of ours held (thread cache {:?}): {error}",
                    held.len(),
                    config
                )
            });
            if i % 4 == 0 {
                to_freer.send(buffer).expect("the freeing thread is there");
            } else {
                held.push_back(buffer);
                if held.len() > 8 {
                    held.pop_front();
                }
            }
        }
        drop(held);
        drop(to_freer);
    });
    let stats = pool.stats();
    assert!(stats.classes.iter().all(|c| c.in_use == 0), "{stats:#?}");
}

#[test]
fn a_4_mib_pool_never_starves_a_thread_handing_buffers_to_another() {
    handoff(Runtime::pool_config(PageSize::Base), 200_000);
}

#[test]
fn handing_buffers_over_starves_no_cache_size() {
    for cache in [0usize, 1, 2, 7, 64, 512] {
        handoff(
            Runtime::pool_config(PageSize::Base).thread_cache(cache),
            20_000,
        );
    }
}

/// Every class of a small pool, every cache size: an idle thread's cache holds as many blocks
/// as it can take, and another thread then allocates every block of the class, which it can
/// only do by reclaiming the idle thread's. Then the other way round, with the first thread
/// allocating and freeing on its cache while the second reclaims.
#[test]
fn every_block_of_every_class_is_reachable_from_any_thread() {
    // About 16 chunks of 64 KiB; classes 256 B to 64 KiB (one block per chunk at the top).
    let bytes = 1 << 20;
    for cache in [1usize, 2, 7, 64, 512] {
        for shift in 8..=16 {
            let size = 1usize << shift;
            let config = Runtime::pool_config(PageSize::Base)
                .max_class(64 << 10)
                .thread_cache(cache);
            let pool = pool(bytes, config);
            // The arena starts at the first chunk-aligned IOVA of the mapping.
            let total = pool.arena_len() / size;
            let (parked, park) = mpsc::channel::<()>();
            let (ready, cached) = mpsc::channel::<usize>();
            std::thread::scope(|s| {
                let pool = &pool;
                s.spawn(move || {
                    // Take every block, free them all: the cache keeps what it can hold.
                    let all: Vec<_> = (0..total)
                        .map(|i| {
                            pool.alloc(size).unwrap_or_else(|e| {
                                panic!("block {i} of {total} of {size} B, cache {cache}: {e}")
                            })
                        })
                        .collect();
                    drop(all);
                    ready.send(total).expect("main waits");
                    // Idle, holding its cache, until the main thread is done.
                    let _ = park.recv();
                });
                let n = cached.recv().expect("the caching thread");
                let all: Vec<_> = (0..n)
                    .map(|i| {
                        pool.alloc(size).unwrap_or_else(|e| {
                            panic!(
                                "block {i} of {n} of {size} B with the other thread idle \
                                 (cache {cache}): {e}"
                            )
                        })
                    })
                    .collect();
                assert_eq!(all.len(), total);
                assert!(
                    matches!(pool.alloc(size), Err(Error::Exhausted { .. })),
                    "one block more than the pool holds"
                );
                drop(all);
                drop(parked);
            });
            let stats = pool.stats();
            assert!(stats.classes.iter().all(|c| c.in_use == 0), "{stats:#?}");
        }
    }
}

/// Two threads each allocate and free at random on one class of a pool just large enough
/// for both at their peak: neither may ever fail, whichever cache holds the free blocks.
#[test]
fn two_busy_threads_share_a_pool_that_holds_exactly_their_peak() {
    for cache in [2usize, 64, 512] {
        let size = 4096;
        // 4 chunks of 64 KiB (the arena starts at a chunk-aligned IOVA, so the mapping has one
        // more): 64 blocks of 4 KiB; each thread holds at most 32.
        let config = Runtime::pool_config(PageSize::Base)
            .max_class(64 << 10)
            .thread_cache(cache);
        let pool = pool(5 << 16, config);
        assert_eq!(pool.arena_len(), 4 << 16);
        std::thread::scope(|s| {
            for seed in [1u64, 2] {
                let pool = &pool;
                s.spawn(move || {
                    let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
                    let mut held: Vec<Buffer<'_>> = Vec::with_capacity(32);
                    for i in 0..30_000 {
                        if held.len() < 32 && (held.is_empty() || rng.next() % 2 == 0) {
                            let buffer = pool.alloc(size).unwrap_or_else(|e| {
                                panic!(
                                    "thread {seed}, step {i}, {} held, cache {cache}: {e}",
                                    held.len()
                                )
                            });
                            held.push(buffer);
                        } else {
                            let at = (rng.next() as usize) % held.len();
                            held.swap_remove(at);
                        }
                    }
                });
            }
        });
    }
}

/// A waiting allocation is woken by a free on another thread, whether that free happened just
/// before the wait began (then into the other thread's cache, which the waiter reclaims) or
/// during it (then handed to the waiter).
#[test]
fn a_free_on_any_thread_wakes_a_waiting_allocation() {
    let size = 4096;
    let config = Runtime::pool_config(PageSize::Base)
        .max_class(64 << 10)
        .exhaustion(Exhaustion::Wait(Duration::from_secs(30)));
    let pool = pool(256 << 10, config);
    let total = pool.arena_len() / size;
    for delay_ms in [0u64, 1, 20] {
        let mut ours: Vec<_> = (0..total - 1)
            .map(|_| pool.alloc(size).expect("room"))
            .collect();
        std::thread::scope(|s| {
            let pool = &pool;
            let (taken, last_taken) = mpsc::channel::<()>();
            let freer = s.spawn(move || {
                let last = pool.alloc(size).expect("the last block");
                taken.send(()).expect("main waits for it");
                std::thread::sleep(Duration::from_millis(delay_ms));
                drop(last);
            });
            last_taken.recv().expect("the freer took the last block");
            let began = Instant::now();
            let got = pool.alloc(size).expect("woken by the other thread's free");
            let waited = began.elapsed();
            ours.push(got);
            freer.join().expect("freer");
            // Well inside the 30 s wait: the free woke it (not a benchmark: any wake-up that
            // works is far below this).
            assert!(
                waited < Duration::from_secs(10),
                "waited {waited:?} for a block freed after {delay_ms} ms"
            );
        });
        drop(ours);
    }
}
