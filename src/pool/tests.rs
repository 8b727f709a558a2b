//! Unit tests of the arena (no mapping) and of the pool over a loopback mapping.

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use super::arena::{Arena, ArenaBox, Block, Failure};
use super::geometry::Geometry;
use super::meta::Meta;
use super::*;
use crate::dma::{SoftIommu, Space};
use crate::memory::{PageSize, Region};

fn arena_with(len: u64, config: &Config) -> ArenaBox {
    let g = Geometry::new(len, config).expect("valid test geometry");
    let meta = Meta::heap(&g);
    let slots = Arena::slots_for(&g).expect("cache slots");
    Arena::create(g, meta, slots, true, config.timeout(), false)
}

/// 8 MiB arena, 64 KiB chunks, classes 256 B ..= 64 KiB.
fn small_config() -> Config {
    Config::default()
        .chunk_size(64 << 10)
        .max_class(64 << 10)
        .thread_cache_bytes(64 << 10)
}

/// Live blocks by offset; checks alignment and overlap on insert.
#[derive(Default)]
struct Live(BTreeMap<u64, u64>);

impl Live {
    fn insert(&mut self, block: &Block, g: &Geometry) {
        let size = block.size(g);
        match block.class() {
            Some(c) => {
                assert!(
                    g.is_block(c, block.unit()),
                    "a block where its class puts them"
                );
                assert_eq!(block.offset() % MIN_ALIGN as u64, 0);
                let chunk = g.chunk_size();
                assert_eq!(
                    block.offset() / chunk.max(size),
                    (block.offset() + size - 1) / chunk.max(size),
                    "inside one slab"
                );
            }
            None => assert_eq!(
                block.offset() % size.min(g.chunk_size()),
                0,
                "large block aligned to its chunks"
            ),
        }
        assert!(block.offset() + size <= g.len, "block inside the arena");
        if let Some((&start, &len)) = self.0.range(..=block.offset()).next_back() {
            assert!(
                start + len <= block.offset(),
                "overlaps the block at {start:#x}"
            );
        }
        if let Some((&start, _)) = self.0.range(block.offset()..).next() {
            assert!(
                block.offset() + size <= start,
                "overlaps the block at {start:#x}"
            );
        }
        self.0.insert(block.offset(), size);
    }

    fn remove(&mut self, block: &Block) {
        assert!(self.0.remove(&block.offset()).is_some());
    }
}

fn assert_all_free(stats: &Stats) {
    for class in &stats.classes {
        assert_eq!(class.in_use, 0, "class {} in use", class.size);
        assert_eq!(class.outstanding, 0, "class {} outstanding", class.size);
    }
    assert_eq!(stats.large.in_use_bytes, 0);
    assert_eq!(
        stats.accounted_bytes(),
        stats.arena_bytes,
        "every byte accounted for"
    );
}

/// Offsets of the blocks of `count` allocations of `len` bytes.
fn offsets_of(arena: &Arena, len: usize, count: usize) -> Vec<u64> {
    (0..count)
        .map(|_| arena.alloc(len).expect("room").offset())
        .collect()
}

/// How many consecutive pairs of `offsets` lie `apart` bytes from each other.
fn neighbours(offsets: &[u64], apart: u64) -> usize {
    offsets
        .windows(2)
        .filter(|w| w[0].abs_diff(w[1]) == apart)
        .count()
}

#[test]
fn page_strided_blocks_leave_a_fresh_slab_scattered_and_each_once() {
    let arena = arena_with(8 << 20, &small_config());
    // The first allocations of a class carve its first slab, a thread cache's batch at a time.
    let pages = offsets_of(&arena, 4096, 64);
    let mut distinct = pages.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        pages.len(),
        "a block handed out twice: {pages:?}"
    );
    assert!(pages.iter().all(|o| o % 4096 == 0), "{pages:?}");
    // Scattered: few allocations follow one a page away (in address order, all but the
    // batches' ends would).
    assert!(neighbours(&pages, 4096) < pages.len() / 8, "{pages:?}");
    // A class whose blocks share pages keeps address order.
    let small = offsets_of(&arena, 256, 64);
    assert!(neighbours(&small, 256) > small.len() / 2, "{small:?}");
}

#[test]
fn arena_blocks_are_aligned_disjoint_and_accounted() {
    let config = small_config();
    let arena = arena_with(32 << 20, &config);
    let g = arena.geometry().clone();
    let mut live = Live::default();
    let mut blocks = Vec::new();
    for (i, len) in [1usize, 256, 257, 4096, 5000, 65536, 65537, 200_000, 0]
        .iter()
        .cycle()
        .take(300)
        .enumerate()
    {
        let block = arena.alloc(*len).expect("room");
        assert!(block.size(&g) >= *len as u64);
        live.insert(&block, &g);
        blocks.push(block);
        if i % 3 == 0 {
            let gone = blocks.swap_remove(i % blocks.len());
            live.remove(&gone);
            arena.free(gone);
        }
    }
    let stats = arena.stats();
    assert_eq!(stats.accounted_bytes(), stats.arena_bytes);
    assert!(stats.large.allocs > 0 && stats.large.splits > 0);
    for block in blocks.drain(..) {
        live.remove(&block);
        arena.free(block);
    }
    arena.flush_current_thread();
    let stats = arena.stats();
    assert_all_free(&stats);
    assert_eq!(stats.classes[0].allocs, stats.classes[0].frees);
}

#[test]
fn a_coloured_arena_spreads_first_lines_and_loses_no_byte() {
    let config = Config::default().colouring(true);
    // Four 2 MiB chunks: 4 KiB blocks 4352 bytes apart, 481 to a chunk.
    let arena = arena_with(8 << 20, &config);
    let g = arena.geometry().clone();
    let mut live = Live::default();
    let mut blocks = Vec::new();
    while let Ok(block) = arena.alloc(4096) {
        live.insert(&block, &g);
        blocks.push(block);
    }
    assert_eq!(
        blocks.len(),
        4 * 481,
        "every chunk carved into 4 KiB blocks"
    );
    // Consecutive blocks start at 16 different offsets within a page (a thread cache hands a
    // refill's blocks out last first, so any run of 16 of one refill covers all of them).
    let positions: std::collections::BTreeSet<u64> =
        blocks[..16].iter().map(|b| b.offset() % 4096).collect();
    assert_eq!(positions.len(), 16, "{positions:?}");
    let stats = arena.stats();
    let class = &stats.classes[4];
    assert_eq!(class.stride, 4352);
    assert_eq!(class.slabs, 4);
    assert_eq!(class.uncarved_bytes, 0);
    assert_eq!(class.gap_bytes, 4 * ((2 << 20) - 481 * 4096));
    assert_eq!(stats.accounted_bytes(), stats.arena_bytes);
    for block in blocks.drain(..) {
        live.remove(&block);
        arena.free(block);
    }
    arena.flush_current_thread();
    assert_all_free(&arena.stats());
    // The same blocks come back, and nothing else.
    let mut again = 0;
    while let Ok(block) = arena.alloc(4096) {
        live.insert(&block, &g);
        blocks.push(block);
        again += 1;
    }
    assert_eq!(again, 4 * 481);
    // Smaller classes are not coloured: 2 KiB blocks of a fresh arena are 2 KiB-aligned.
    let arena = arena_with(8 << 20, &config);
    let block = arena.alloc(2048).expect("room");
    assert_eq!(block.offset() % 2048, 0);
    assert_eq!(arena.stats().classes[3].stride, 2048);
    arena.free(block);
}

#[test]
fn exhaustion_fails_fast_then_recovers() {
    let config = small_config().thread_cache(0);
    let arena = arena_with(1 << 20, &config);
    let mut blocks = Vec::new();
    loop {
        match arena.alloc(64 << 10) {
            Ok(block) => blocks.push(block),
            Err(failure) => {
                assert_eq!(failure, Failure::Exhausted);
                break;
            }
        }
    }
    assert_eq!(blocks.len(), 16);
    assert_eq!(arena.alloc(1 << 30), Err(Failure::TooLarge));
    // A small class has no slab left either: the buddy allocator is empty.
    assert_eq!(arena.alloc(256), Err(Failure::Exhausted));
    for block in blocks.drain(..) {
        arena.free(block);
    }
    assert!(arena.alloc(64 << 10).is_ok_and(|b| {
        arena.free(b);
        true
    }));
    assert_all_free(&arena.stats());
}

#[test]
fn large_blocks_split_and_merge() {
    let config = small_config();
    let arena = arena_with(1 << 20, &config);
    let a = arena.alloc(65 << 10).unwrap(); // 2 chunks: 16 -> 8 -> 4 -> 2 splits
    let b = arena.alloc(64 << 10 | 1).unwrap();
    let stats = arena.stats();
    assert_eq!(stats.large.splits, 3);
    assert_eq!(stats.large.in_use_bytes, 256 << 10);
    assert_eq!(a.size(arena.geometry()), 128 << 10);
    arena.free(a);
    arena.free(b);
    let stats = arena.stats();
    assert_eq!(stats.large.merges, 3);
    assert_eq!(stats.large.largest_free_bytes, 1 << 20);
    assert_eq!(stats.large.high_water_bytes, 256 << 10);
    assert_all_free(&stats);
}

#[test]
fn a_thread_returns_its_cache_when_it_exits() {
    let config = small_config();
    let arena = arena_with(4 << 20, &config);
    // Joined explicitly: a scope's implicit join may return before the thread's thread-local
    // destructors (which flush its cache) have run.
    std::thread::scope(|s| {
        s.spawn(|| {
            let blocks: Vec<_> = (0..40).map(|_| arena.alloc(4096).unwrap()).collect();
            for block in blocks {
                arena.free(block);
            }
            let stats = arena.stats();
            assert_eq!(stats.classes[4].in_use, 0);
            assert!(
                stats.classes[4].outstanding > 0,
                "blocks sit in this thread's cache"
            );
            assert_eq!(stats.cached_threads, 1);
        })
        .join()
        .unwrap();
    });
    let stats = arena.stats();
    assert_eq!(stats.cached_threads, 0);
    assert_all_free(&stats);
}

#[test]
fn cross_thread_frees_land_in_the_freeing_thread_cache() {
    let config = small_config();
    let arena = arena_with(4 << 20, &config);
    let (tx, rx) = mpsc::sync_channel::<Block>(8);
    std::thread::scope(|s| {
        let freer = s.spawn(|| {
            for block in rx {
                arena.free(block);
            }
        });
        for _ in 0..1000 {
            tx.send(arena.alloc(1024).unwrap()).unwrap();
        }
        drop(tx);
        freer.join().unwrap();
    });
    arena.flush_current_thread();
    let stats = arena.stats();
    assert_eq!(stats.classes[2].allocs, 1000);
    assert_eq!(stats.classes[2].frees, 1000);
    assert!(
        stats.classes[2].shared_hits > 0,
        "allocating thread refilled from the depot"
    );
    assert_all_free(&stats);
}

#[test]
fn dropping_an_arena_while_a_thread_caches_its_blocks_is_clean() {
    let config = small_config();
    let arena: Arc<ArenaBox> = Arc::new(arena_with(4 << 20, &config));
    let used = Arc::new(Barrier::new(2));
    let dropped = Arc::new(Barrier::new(2));
    let thread = {
        let (arena, used, dropped) = (Arc::clone(&arena), Arc::clone(&used), Arc::clone(&dropped));
        std::thread::spawn(move || {
            let block = arena.alloc(512).unwrap();
            arena.free(block);
            drop(arena);
            used.wait();
            dropped.wait();
            // This thread's table still names the dead arena; its exit must not touch it.
        })
    };
    used.wait();
    let arena = Arc::into_inner(arena).expect("last reference");
    assert_eq!(arena.stats().cached_threads, 1);
    drop(arena);
    dropped.wait();
    thread.join().unwrap();
    // A new arena in this thread and the old thread's id space do not interfere.
    let again = arena_with(4 << 20, &config);
    let block = again.alloc(512).unwrap();
    again.free(block);
}

#[test]
fn waiting_allocation_is_woken_by_a_free() {
    let config = small_config()
        .thread_cache(0)
        .exhaustion(Exhaustion::Wait(Duration::from_secs(10)));
    let arena = arena_with(1 << 20, &config);
    let blocks: Vec<_> = (0..16).map(|_| arena.alloc(64 << 10).unwrap()).collect();
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            for block in blocks {
                arena.free(block);
            }
        });
        let block = arena.alloc(64 << 10).expect("woken by the free");
        arena.free(block);
    });
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(40) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

#[test]
fn waiting_allocation_times_out() {
    let config = small_config().exhaustion(Exhaustion::Wait(Duration::from_millis(30)));
    let arena = arena_with(1 << 20, &config);
    let block = arena.alloc(1 << 20).unwrap();
    let start = Instant::now();
    assert_eq!(arena.alloc(1 << 20), Err(Failure::Exhausted));
    assert!(start.elapsed() >= Duration::from_millis(25));
    arena.free(block);
}

#[test]
fn threads_beyond_the_slots_run_uncached() {
    let config = small_config().max_threads(1);
    let arena = arena_with(4 << 20, &config);
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let blocks: Vec<_> = (0..100).map(|_| arena.alloc(300).unwrap()).collect();
                    barrier.wait();
                    assert_eq!(arena.stats().cached_threads, 1, "one slot, two threads");
                    for block in blocks {
                        arena.free(block);
                    }
                    barrier.wait();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    });
    let stats = arena.stats();
    assert_eq!(stats.classes[1].allocs, 200);
    assert_eq!(stats.classes[1].frees, 200);
    assert!(
        stats.classes[1].cache_hits < 100,
        "the uncached thread never hit a cache"
    );
    assert_all_free(&stats);
}

#[test]
fn more_pools_than_table_entries_evict_cleanly() {
    let config = small_config();
    let arenas: Vec<_> = (0..12).map(|_| arena_with(1 << 20, &config)).collect();
    for round in 0..5 {
        for arena in &arenas {
            let blocks: Vec<_> = (0..3)
                .map(|_| arena.alloc(256 << (round % 3)).unwrap())
                .collect();
            for block in blocks {
                arena.free(block);
            }
        }
    }
    for arena in &arenas {
        arena.flush_current_thread();
        assert_all_free(&arena.stats());
    }
}

#[test]
fn bulk_alloc_and_free() {
    let config = small_config();
    let arena = arena_with(4 << 20, &config);
    let mut live = Live::default();
    let mut blocks = Vec::new();
    arena.alloc_bulk(4096, 100, |b| blocks.push(b)).unwrap();
    assert_eq!(blocks.len(), 100);
    for block in &blocks {
        live.insert(block, arena.geometry());
    }
    arena.free_bulk(blocks.drain(..));
    // All or nothing is the pool's job; the arena reports how far it got: one 64 KiB block per
    // chunk the 4 KiB class did not take.
    let free_chunks = arena.stats().large.free_bytes >> 16;
    assert_eq!(free_chunks, 64 - 7);
    let failure = arena.alloc_bulk(64 << 10, 1000, |b| blocks.push(b));
    assert_eq!(failure, Err(Failure::Exhausted));
    assert_eq!(blocks.len() as u64, free_chunks);
    arena.free_bulk(blocks.drain(..));
    arena.flush_current_thread();
    let stats = arena.stats();
    assert_eq!(stats.classes[4].allocs, 100);
    assert_all_free(&stats);
}

// ---- the pool over a loopback mapping ----------------------------------------------------

fn mapping(len: usize) -> crate::dma::Mapping {
    let region = Region::builder(len)
        .page_size(PageSize::Base)
        .build()
        .expect("base-page region (needs RLIMIT_MEMLOCK for the test size)");
    SoftIommu::new(48).unwrap().map(Arc::new(region)).unwrap()
}

#[test]
fn buffers_carry_host_address_iova_and_alignment() {
    let pool = Pool::new(mapping(4 << 20), small_config()).unwrap();
    assert_eq!(pool.arena_offset() % 4096, 0);
    let mut buffers = Vec::new();
    for len in [1usize, 300, 4096, 40_000, 64 << 10, 100_000] {
        let buffer = pool.alloc(len).unwrap();
        assert_eq!(buffer.len(), len);
        assert!(buffer.capacity() >= len);
        let align = buffer.capacity().min(64 << 10) as u64;
        assert_eq!(buffer.iova() % align, 0, "IOVA aligned to the block size");
        assert_eq!(buffer.iova() % MIN_ALIGN as u64, 0);
        assert_eq!(pool.mapping().iova(buffer.offset()), Some(buffer.iova()));
        let host = pool.mapping().as_ptr().as_ptr() as usize + buffer.offset();
        assert_eq!(buffer.as_ptr().as_ptr() as usize, host);
        assert_eq!(buffer.iova_at(1), Some(buffer.iova() + 1));
        assert_eq!(buffer.iova_at(buffer.capacity()), None);
        assert_eq!(buffer.contiguous_len(), buffer.capacity());
        buffers.push(buffer);
    }
    let buffer = &buffers[2];
    buffer.write(10, b"hello").unwrap();
    let mut out = [0u8; 5];
    buffer.read(10, &mut out).unwrap();
    assert_eq!(&out, b"hello");
    assert!(matches!(buffer.write(4094, b"abc"), Err(Error::Access(_))));
    let mut grow = buffers.pop().unwrap();
    let capacity = grow.capacity();
    grow.set_len(capacity).unwrap();
    assert!(matches!(
        grow.set_len(capacity + 1),
        Err(Error::Length { .. })
    ));
    drop(grow);
    drop(buffers);
    pool.flush_thread_cache();
    assert_all_free(&pool.stats());
}

#[test]
fn pool_errors_name_the_problem() {
    let pool = Pool::new(mapping(1 << 20), small_config()).unwrap();
    let err = pool.alloc(usize::MAX).unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooLarge {
                len: usize::MAX,
                ..
            }
        ),
        "{err}"
    );
    let mut all = Vec::new();
    while let Ok(buffer) = pool.alloc(64 << 10) {
        all.push(buffer);
    }
    assert_eq!(all.len(), pool.arena_len() >> 16);
    // No chunk is left for a slab of the 256-byte class.
    let err = pool.alloc(64).unwrap_err();
    assert!(matches!(err, Error::Exhausted { len: 64, .. }), "{err}");
    assert!(err.to_string().contains("free buffers"));
    drop(all);
    assert!(matches!(
        Pool::new(mapping(64 << 10), Config::default()),
        Err(Error::ArenaTooSmall { .. })
    ));
    assert!(matches!(
        Pool::new(mapping(1 << 20), small_config().max_class(3 << 10)),
        Err(Error::Config {
            field: "max_class",
            ..
        })
    ));
    assert!(matches!(
        Pool::create_shared(mapping(4 << 20), small_config()),
        Err(Error::NotShareable)
    ));
}

#[test]
fn pool_bulk_is_all_or_nothing_and_frees_only_its_own() {
    let pool = Pool::new(mapping(2 << 20), small_config()).unwrap();
    let other = Pool::new(mapping(2 << 20), small_config()).unwrap();
    let mut buffers = Vec::with_capacity(64);
    pool.alloc_bulk(4096, 32, &mut buffers).unwrap();
    assert_eq!(buffers.len(), 32);
    let err = pool.alloc_bulk(64 << 10, 1000, &mut buffers).unwrap_err();
    assert!(matches!(err, Error::Exhausted { .. }));
    assert_eq!(buffers.len(), 32, "nothing kept from the failed batch");
    buffers.push(other.alloc(256).unwrap());
    pool.free_bulk(buffers.drain(..));
    pool.flush_thread_cache();
    other.flush_thread_cache();
    assert_all_free(&pool.stats());
    assert_all_free(&other.stats());
    assert_eq!(other.stats().classes[0].frees, 1);
}

/// A shared pool created with `config` over 8 MiB of memfd memory, opened a second time, and
/// the loopback space both are mapped into.
fn shared_pair(config: Config) -> (Pool, Pool, SoftIommu) {
    let region = Region::builder(8 << 20)
        .page_size(PageSize::Base)
        .memfd()
        .build()
        .expect("base-page memfd region");
    let region = Arc::new(region);
    let space = SoftIommu::new(48).unwrap();
    let first = Pool::create_shared(space.map(Arc::clone(&region)).unwrap(), config).unwrap();
    let second =
        Pool::open_shared(space.map(Arc::clone(&region)).unwrap(), Exhaustion::Fail).unwrap();
    (first, second, space)
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: a shared pool needs a memfd, which Miri does not emulate (its regions are private memory there)"
)]
fn shared_pool_opened_twice_in_one_process() {
    let (first, second, space) = shared_pair(small_config());
    assert_eq!(first.arena_offset(), second.arena_offset());
    assert_eq!(first.arena_len(), second.arena_len());
    assert!(first.is_shared() && second.is_shared());
    let mut offsets = BTreeMap::new();
    let mut keep = Vec::new();
    for i in 0..200 {
        let pool = if i % 2 == 0 { &first } else { &second };
        let buffer = pool.alloc(3000).unwrap();
        assert!(
            offsets.insert(buffer.offset(), i).is_none(),
            "two pools handed out one block"
        );
        keep.push(buffer);
    }
    let (one, two) = (first.stats(), second.stats());
    assert_eq!(
        (one.classes[4].in_use, two.classes[4].in_use),
        (100, 100),
        "per process"
    );
    assert_eq!(
        one.classes[4].outstanding, two.classes[4].outstanding,
        "shared counters"
    );
    assert!(one.classes[4].outstanding >= 200);
    drop(keep);
    // Dropping a handle flushes its caches into the shared lists.
    drop(second);
    first.flush_thread_cache();
    assert_all_free(&first.stats());
    // A region that holds no pool is refused.
    let plain = Region::builder(4 << 20)
        .page_size(PageSize::Base)
        .memfd()
        .build()
        .unwrap();
    let err = Pool::open_shared(space.map(Arc::new(plain)).unwrap(), Exhaustion::Fail).unwrap_err();
    assert!(matches!(err, Error::NotAPool { found: 0 }), "{err}");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: a shared pool needs a memfd, which Miri does not emulate (its regions are private memory there)"
)]
fn a_shared_coloured_pool_is_coloured_in_every_process() {
    let (first, second, _space) = shared_pair(small_config().colouring(true));
    assert!(second.config().colouring_enabled());
    assert!(first.is_coloured(4096) && second.is_coloured(4096));
    assert!(!second.is_coloured(2048) && !second.is_coloured(1 << 20));
    let mut offsets = BTreeMap::new();
    let mut keep = Vec::new();
    for i in 0..200 {
        let pool = if i % 2 == 0 { &first } else { &second };
        let buffer = pool.alloc(4096).unwrap();
        assert_eq!(buffer.iova() % MIN_ALIGN as u64, 0);
        let (start, end) = (buffer.offset(), buffer.offset() + buffer.capacity());
        if let Some((_, &prev_end)) = offsets.range(..start).next_back() {
            assert!(prev_end <= start, "overlapping buffers");
        }
        if let Some((&next, _)) = offsets.range(start..).next() {
            assert!(end <= next, "overlapping buffers");
        }
        offsets.insert(start, end);
        keep.push(buffer);
    }
    // Buffers of one process freed into the other's lists are taken there.
    let (evens, odds): (Vec<_>, Vec<_>) =
        keep.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    drop(odds);
    drop(evens);
    drop(second);
    first.flush_thread_cache();
    assert_all_free(&first.stats());
}

#[test]
fn a_mapping_in_pieces_gets_per_chunk_iovas() {
    use crate::dma::IovaRange;
    // Two 1 MiB IOVA windows far apart: a 2 MiB region is mapped in two pieces.
    let ranges = [
        IovaRange {
            start: 0x10_0000,
            last: 0x1f_ffff,
        },
        IovaRange {
            start: 0x4000_0000,
            last: 0x400f_ffff,
        },
    ];
    let space = SoftIommu::with_ranges(48, &ranges).unwrap();
    let region = Region::builder(2 << 20)
        .page_size(PageSize::Base)
        .build()
        .unwrap();
    let mapping = space.map(Arc::new(region)).unwrap();
    assert!(
        mapping.contiguous_len(0) < mapping.len(),
        "the mapping is in pieces"
    );
    let pool = Pool::new(mapping, small_config()).unwrap();
    let mut buffers = Vec::new();
    while let Ok(buffer) = pool.alloc(16 << 10) {
        assert_eq!(pool.mapping().iova(buffer.offset()), Some(buffer.iova()));
        assert_eq!(buffer.iova() % (16 << 10), 0);
        buffers.push(buffer);
    }
    assert_eq!(buffers.len(), pool.arena_len() / (16 << 10));
    let high = buffers
        .iter()
        .filter(|b| b.iova().raw() >= 0x4000_0000)
        .count();
    assert!(high > 0 && high < buffers.len(), "buffers from both pieces");
    drop(buffers);
    // A largest class above the chunk size cannot be contiguous on such a mapping.
    let region = Region::builder(2 << 20)
        .page_size(PageSize::Base)
        .build()
        .unwrap();
    let space = SoftIommu::with_ranges(48, &ranges).unwrap();
    let mapping = space.map(Arc::new(region)).unwrap();
    let err = Pool::new(mapping, small_config().chunk_size(16 << 10)).unwrap_err();
    assert!(matches!(err, Error::NotContiguous { .. }), "{err}");
}

// ---- batches -------------------------------------------------------------------------------

#[test]
fn a_batch_of_a_coloured_pool_holds_whole_disjoint_buffers_at_16_page_offsets() {
    let pool = Pool::new(mapping(8 << 20), Config::default().colouring(true)).unwrap();
    assert!(pool.is_coloured(4096) && !pool.is_coloured(2048));
    let mut batches = Vec::new();
    for round in 0..4u8 {
        let batch = pool.alloc_batch::<32>(4096, 32).unwrap();
        let positions: std::collections::BTreeSet<usize> =
            batch.iter().map(|b| b.offset() % 4096).collect();
        assert_eq!(positions.len(), 16, "round {round}: {positions:?}");
        for buffer in batch.iter() {
            assert_eq!(buffer.capacity(), 4096);
            assert_eq!(buffer.iova() % MIN_ALIGN as u64, 0);
            assert_eq!(pool.mapping().iova(buffer.offset()), Some(buffer.iova()));
            buffer.write(0, &[round; 4096]).unwrap();
        }
        batches.push(batch);
    }
    // Every byte of every buffer is still its own batch's: no two overlap.
    for (round, batch) in batches.iter().enumerate() {
        for buffer in batch.iter() {
            let mut bytes = vec![0u8; 4096];
            buffer.read(0, &mut bytes).unwrap();
            assert!(bytes.iter().all(|&b| b == round as u8), "batch {round}");
        }
    }
    drop(batches);
    pool.flush_thread_cache();
    assert_all_free(&pool.stats());
}

#[test]
fn arena_units_are_all_or_nothing_and_refill_and_flush_through_the_cache() {
    let config = small_config();
    let arena = arena_with(4 << 20, &config);
    let g = arena.geometry().clone();
    let mut live = Live::default();
    // More than a magazine holds: refills from the shared level, then the caller owns them all.
    let mut units = vec![0u32; 300];
    arena.alloc_units(4, &mut units).unwrap();
    for &unit in &units {
        live.insert(&Block::small(unit, 4), &g);
    }
    // And back: more than a magazine has room for, so it flushes batches to the shared level.
    arena.free_units(4, &units);
    let stats = arena.stats();
    assert_eq!(
        (stats.classes[4].allocs, stats.classes[4].frees),
        (300, 300)
    );
    // The 4 MiB arena has 64 blocks of 64 KiB; asking for more fails and keeps nothing.
    let mut too_many = vec![0u32; 65];
    assert_eq!(arena.alloc_units(8, &mut too_many), Err(Failure::Exhausted));
    assert_eq!(arena.stats().classes[8].in_use, 0, "nothing kept");
    arena.flush_current_thread();
    assert_all_free(&arena.stats());
}

#[test]
fn a_batch_allocates_distinct_buffers_and_frees_them_once() {
    let pool = Pool::new(mapping(4 << 20), small_config()).unwrap();
    let mut batch: Batch<'_> = pool.alloc_batch(3000, 32).unwrap();
    assert_eq!(
        (batch.len(), batch.capacity(), batch.buffer_len()),
        (32, 32, 3000)
    );
    let mut offsets: Vec<usize> = batch.iter().map(|b| b.offset()).collect();
    for (i, buffer) in batch.iter().enumerate() {
        assert_eq!((buffer.len(), buffer.capacity()), (3000, 4096));
        assert_eq!(buffer.iova().raw() % 4096, 0);
        // The view's own address and slice are the buffer's.
        assert_eq!(buffer.as_ptr(), (*buffer).as_ptr());
        assert_eq!(buffer.slice().len(), 3000);
        assert_eq!(batch.get(i).map(|e| e.as_ptr()), Some(buffer.as_ptr()));
        buffer.slice().write(8, i as u64).unwrap();
        assert_eq!((*buffer).slice().read::<u64>(8).unwrap(), i as u64);
        buffer.write(0, &(i as u64).to_le_bytes()).unwrap();
    }
    for (i, buffer) in batch.iter().enumerate() {
        let mut bytes = [0u8; 8];
        buffer.read(0, &mut bytes).unwrap();
        assert_eq!(
            u64::from_le_bytes(bytes),
            i as u64,
            "buffers do not overlap"
        );
    }
    assert_eq!(batch.get(31).map(|b| b.offset()), Some(offsets[31]));
    assert!(batch.get(32).is_none());
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(offsets.len(), 32, "32 distinct blocks");
    assert_eq!(pool.stats().classes[4].in_use, 32);
    batch.free();
    assert!(batch.is_empty());
    assert_eq!(pool.stats().classes[4].in_use, 0);
    // Refilled, the batch takes the same blocks back from this thread's cache.
    batch.fill(32).unwrap();
    let mut again: Vec<usize> = batch.iter().map(|b| b.offset()).collect();
    again.sort_unstable();
    assert_eq!(again, offsets);
    drop(batch);
    assert_eq!(pool.stats().classes[4].in_use, 0);
    pool.flush_thread_cache();
    assert_all_free(&pool.stats());
}

#[test]
fn a_batch_refuses_what_it_cannot_hold() {
    let pool = Pool::new(mapping(4 << 20), small_config()).unwrap();
    let other = Pool::new(mapping(2 << 20), small_config()).unwrap();
    assert!(matches!(
        Batch::<'_, 8>::new(&pool, (64 << 10) + 1),
        Err(Error::Unbatchable { max_class, .. }) if max_class == 64 << 10
    ));
    let mut batch = pool.alloc_batch::<8>(4096, 6).unwrap();
    assert!(matches!(
        batch.fill(3),
        Err(Error::BatchFull { count: 3, room: 2 })
    ));
    assert_eq!(batch.len(), 6, "a refused fill keeps the batch as it was");
    // Exhaustion (in a pool of its own: carved 64 KiB blocks stay in their class): 31 blocks
    // of 64 KiB in 2 MiB; the failed fill keeps nothing.
    let third = Pool::new(mapping(2 << 20), small_config()).unwrap();
    let mut big = third.alloc_batch::<128>(64 << 10, 30).unwrap();
    assert!(matches!(big.fill(10), Err(Error::Exhausted { .. })));
    assert_eq!(big.len(), 30);
    assert_eq!(third.stats().classes[8].in_use, 30);
    // A new batch refused the same ways: more than it holds, above the largest class, more
    // than the pool has left (2 of the 1 left: the pool carves 31); none keeps a block.
    assert!(matches!(
        third.alloc_batch::<8>(4096, 9),
        Err(Error::BatchFull { count: 9, room: 8 })
    ));
    assert!(matches!(
        third.alloc_batch::<8>((64 << 10) + 1, 1),
        Err(Error::Unbatchable { .. })
    ));
    assert_eq!(third.stats().classes[8].carved, 31);
    assert!(matches!(
        third.alloc_batch::<8>(64 << 10, 2),
        Err(Error::Exhausted { .. })
    ));
    assert_eq!(third.stats().classes[8].in_use, 30);
    let last = third.alloc_batch::<8>(64 << 10, 1).unwrap();
    assert_eq!((last.len(), third.stats().classes[8].in_use), (1, 31));
    drop((big, last));
    third.flush_thread_cache();
    assert_all_free(&third.stats());
    // Only buffers of the same pool and class join; the others come back untouched.
    let foreign = other.alloc(4096).unwrap();
    let foreign = batch.push(foreign).unwrap_err();
    assert!(foreign.is_from(&other) && !foreign.is_from(&pool));
    let small = batch.push(pool.alloc(256).unwrap()).unwrap_err();
    assert_eq!(small.capacity(), 256);
    drop((foreign, small));
    let single = pool.alloc(3000).unwrap();
    let iova = single.iova();
    batch.push(single).unwrap();
    assert_eq!(batch.len(), 7);
    batch.push(pool.alloc(4096).unwrap()).unwrap();
    let full = batch.push(pool.alloc(4096).unwrap()).unwrap_err();
    drop(full);
    // Out again: the pushed buffer has the batch's length now.
    batch.pop().unwrap();
    let popped = batch.pop().unwrap();
    assert_eq!((popped.iova(), popped.len()), (iova, 4096));
    drop(popped);
    let owned: Vec<Buffer<'_>> = batch.into_iter().take(2).collect();
    assert_eq!(owned.len(), 2);
    assert_eq!(
        pool.stats().classes[4].in_use,
        2,
        "the iterator freed the rest"
    );
    drop(owned);
    pool.flush_thread_cache();
    other.flush_thread_cache();
    assert_all_free(&pool.stats());
    assert_all_free(&other.stats());
}

/// A config whose thread cache holds `blocks` blocks of 4 KiB (chunks of 64 KiB, as
/// `small_config`).
fn cache_of(blocks: usize) -> Config {
    Config::default()
        .chunk_size(64 << 10)
        .max_class(64 << 10)
        .thread_cache(blocks)
        .thread_cache_bytes(blocks << 12)
}

#[test]
fn a_whole_batch_leaves_and_reenters_the_cache_as_single_buffers_would() {
    // A cache of 64 blocks of 4 KiB (refilled and flushed 32 at a time): room for a batch.
    let pool = Pool::new(mapping(4 << 20), cache_of(64)).unwrap();
    let offset = |b: &Buffer<'_>| b.offset();
    // 32 single buffers, freed in order: the cache's top is the last one freed.
    let singles: Vec<Buffer<'_>> = (0..32).map(|_| pool.alloc(4096).unwrap()).collect();
    let freed: Vec<usize> = singles.iter().map(offset).collect();
    drop(singles);
    let before = pool.stats().classes[4].clone();
    // A whole batch takes the 32 from the cache, top first, as 32 single allocations would,
    // with no refill from the shared level.
    let batch = pool.alloc_batch::<32>(4096, 32).unwrap();
    let taken: Vec<usize> = batch.iter().map(|b| b.offset()).collect();
    let top_first: Vec<usize> = freed.iter().rev().copied().collect();
    assert_eq!(taken, top_first);
    let after = pool.stats().classes[4].clone();
    assert_eq!(after.allocs - before.allocs, 32);
    assert_eq!(
        after.cache_hits - before.cache_hits,
        32,
        "every one a cache hit"
    );
    assert_eq!(after.shared_hits, before.shared_hits, "no refill");
    assert_eq!(after.in_use, 32);
    // Freed whole, it goes back so that the next batch gets the same order, and single
    // allocations take its first buffer first (as if its buffers were freed last to first).
    drop(batch);
    assert_eq!(pool.stats().classes[4].frees - before.frees, 32);
    assert_eq!(pool.stats().classes[4].in_use, 0);
    let mut kept = Batch::<32>::new(&pool, 4096).unwrap();
    kept.fill(32).unwrap();
    assert_eq!(
        kept.iter().map(|b| b.offset()).collect::<Vec<_>>(),
        top_first
    );
    kept.free();
    let first = pool.alloc(4096).unwrap();
    assert_eq!(first.offset(), top_first[0]);
    drop(first);
    // A part of a batch, and a batch larger than the cache could ever hold, take the loop
    // path and end the same way: every block back, none twice.
    let mut part = Batch::<32>::new(&pool, 4096).unwrap();
    part.fill(20).unwrap();
    part.fill(12).unwrap();
    assert_eq!(part.len(), 32);
    let huge = pool.alloc_batch::<300>(4096, 300).unwrap();
    let mut all: Vec<usize> = huge.iter().map(|b| b.offset()).collect();
    all.extend(part.iter().map(|b| b.offset()));
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 332, "distinct blocks");
    drop((huge, part));
    pool.flush_thread_cache();
    assert_all_free(&pool.stats());
}

#[test]
fn a_whole_batch_the_cache_cannot_take_goes_to_the_shared_level() {
    // A cache of 40 blocks: a batch of 32 fits only while it holds at most 8.
    let pool = Pool::new(mapping(4 << 20), cache_of(40)).unwrap();
    let first = pool.alloc_batch::<32>(4096, 32).unwrap();
    let second = pool.alloc_batch::<32>(4096, 32).unwrap();
    let third = pool.alloc_batch::<32>(4096, 32).unwrap();
    assert_eq!(pool.stats().classes[4].in_use, 96);
    // The first free fits whole; the later ones meet a cache with less room than a batch, so
    // part goes in and the rest flushes. The cache never holds more than its 40.
    drop((first, second, third));
    let stats = pool.stats();
    assert_eq!((stats.classes[4].frees, stats.classes[4].in_use), (96, 0));
    assert!(
        stats.classes[4].outstanding <= 40,
        "the rest went to the shared level"
    );
    // An empty cache (flushed) cannot hand out a whole batch: the batch refills it first.
    pool.flush_thread_cache();
    let again = pool.alloc_batch::<32>(4096, 32).unwrap();
    let mut offsets: Vec<usize> = again.iter().map(|b| b.offset()).collect();
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(offsets.len(), 32);
    drop(again);
    pool.flush_thread_cache();
    assert_all_free(&pool.stats());
}

#[test]
fn a_batch_freed_on_another_thread_goes_to_that_thread_and_back() {
    // 100 batches (under Miri, scripts/miri.sh, 5: each is ~10^4 times slower there).
    let batches = if cfg!(miri) { 5 } else { 100 };
    let pool = Pool::new(mapping(4 << 20), small_config()).unwrap();
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::sync_channel::<Batch<'_>>(4);
        let consumer = s.spawn(move || {
            let mut freed = 0;
            for batch in rx {
                freed += batch.len();
            }
            freed
        });
        for _ in 0..batches {
            let batch = pool.alloc_batch(4096, 32).unwrap();
            for buffer in batch.iter() {
                buffer.write(0, &[7; 8]).unwrap();
            }
            tx.send(batch).unwrap();
        }
        drop(tx);
        assert_eq!(consumer.join().unwrap(), 32 * batches);
    });
    pool.flush_thread_cache();
    let stats = pool.stats();
    let buffers = 32 * batches as u64;
    assert_eq!(
        (stats.classes[4].allocs, stats.classes[4].frees),
        (buffers, buffers)
    );
    assert_all_free(&stats);
}

#[test]
fn batches_work_without_thread_caches() {
    let pool = Pool::new(mapping(4 << 20), small_config().thread_cache(0)).unwrap();
    let batch = pool.alloc_batch::<32>(4096, 32).unwrap();
    assert_eq!(batch.len(), 32);
    drop(batch);
    assert_all_free(&pool.stats());
}
