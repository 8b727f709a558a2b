//! Loom models of the pool's concurrent parts. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --lib pool::`.
//!
//! Each model is explored with at most two preemptions unless `LOOM_MAX_PREEMPTIONS` says
//! otherwise: about 15 seconds for all of them on two cores (three preemptions: about three
//! minutes).
//!
//! Arenas here are tiny (1 KiB chunks, two or four of them, classes 256 B and 512 B) and
//! caches hold two blocks with a batch of one, so refills, flushes, slab carving and buddy
//! splits and merges all happen within a handful of operations.
//!
//! Loom's `join` synchronizes with the end of a thread's closure, before its thread-local
//! destructors (which flush its caches) run — as `std::thread::scope` does. Models that check
//! final counts therefore flush explicitly at the end of each thread; the race between a
//! thread's exit flush and the pool's drop has a model of its own.

use super::arena::{Arena, ArenaBox, Block};
use super::cache;
use super::geometry::Geometry;
use super::lease::Leases;
use super::meta::Meta;
use super::stack::{Stack, EMPTY, NIL};
use super::Config;
use crate::sync::{thread, Arc, AtomicU32, AtomicU64, Ordering, UnsafeCell};

/// Runs `f` under loom with a default preemption bound of two.
fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    // A magazine's length, claim and counters are atomics (a reclaiming thread reads them),
    // each a scheduling point: an execution of these models takes more than loom's default
    // 1,000.
    builder.max_branches = 20_000;
    builder.check(f);
}

fn arena(chunks: u64, threads: usize) -> Arc<ArenaBox> {
    let config = Config::default()
        .chunk_size(1024)
        .max_class(512)
        .thread_cache(2)
        .thread_cache_bytes(512)
        .max_threads(threads)
        .magazines(2);
    let g = Geometry::new(chunks * 1024, &config).expect("valid loom geometry");
    let meta = Meta::heap(&g);
    let slots = Arena::slots_for(&g).expect("cache slots");
    Arc::new(Arena::create(g, meta, slots, true, None, false))
}

/// Every byte of an arena nobody uses is accounted for and no block is out.
fn assert_quiescent(arena: &Arena) {
    let stats = arena.stats();
    for class in &stats.classes {
        assert_eq!(
            class.outstanding, 0,
            "class {} still out: {stats:#?}",
            class.size
        );
    }
    assert_eq!(stats.accounted_bytes(), stats.arena_bytes);
}

fn overlap(a: &Block, b: &Block, g: &Geometry) -> bool {
    a.offset() < b.offset() + b.size(g) && b.offset() < a.offset() + a.size(g)
}

#[test]
fn stack_concurrent_push_pop_keeps_every_node_once() {
    model(|| {
        let head = Arc::new(AtomicU64::new(EMPTY));
        let links: Arc<Vec<AtomicU32>> = Arc::new((0..2).map(|_| AtomicU32::new(NIL)).collect());
        {
            let s = Stack::new(&head, &links[..]);
            s.push(0);
            s.push(1);
        }
        // The ABA shape: while `popper` is between reading `top = 1, next(1) = 0` and its CAS,
        // `juggler` pops 1 and 0 and pushes 1 back (now with `next(1) = NIL`). Without the tag,
        // the popper's CAS would succeed and install 0, which the juggler owns.
        let popper = {
            let (head, links) = (Arc::clone(&head), Arc::clone(&links));
            thread::spawn(move || {
                let s = Stack::new(&head, &links[..]);
                if let Some(node) = s.pop() {
                    s.push(node);
                }
            })
        };
        let s = Stack::new(&head, &links[..]);
        let a = s.pop();
        let b = s.pop();
        if let Some(a) = a {
            s.push(a);
        }
        if let Some(b) = b {
            s.push(b);
        }
        popper.join().unwrap();
        let mut seen = Vec::new();
        // Bounded: a corrupted stack may be cyclic.
        while let Some(node) = s.pop() {
            seen.push(node);
            assert!(seen.len() <= 2, "a node is on the stack twice: {seen:?}");
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1]);
    });
}

#[test]
fn concurrent_alloc_free_never_hands_out_a_block_twice() {
    model(|| {
        let arena = arena(2, 2);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let arena = Arc::clone(&arena);
                thread::spawn(move || {
                    let a = arena.alloc(256).expect("room");
                    let b = arena.alloc(256).expect("room");
                    let c = arena.alloc(256).expect("room"); // refill after the first batch
                    arena.free(a);
                    arena.free(b);
                    arena.free(c); // flush: the magazine holds two
                    let d = arena.alloc(256).expect("room");
                    let e = arena.alloc(256).expect("room");
                    arena.flush_current_thread();
                    (d, e)
                })
            })
            .collect();
        let held: Vec<(Block, Block)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let g = arena.geometry();
        let all: Vec<Block> = held.iter().flat_map(|(a, b)| [*a, *b]).collect();
        for (i, x) in all.iter().enumerate() {
            for y in &all[i + 1..] {
                assert!(!overlap(x, y, g), "{x:?} and {y:?} overlap");
            }
        }
        for block in all {
            arena.free(block);
        }
        arena.flush_current_thread();
        assert_quiescent(&arena);
    });
}

#[test]
fn cross_thread_free_goes_into_the_freeing_thread_cache() {
    model(|| {
        let arena = arena(2, 2);
        let a = arena.alloc(512).expect("room");
        let b = arena.alloc(512).expect("room");
        let freer = {
            let arena = Arc::clone(&arena);
            thread::spawn(move || {
                arena.free(a);
                arena.free(b);
                // The third free overflows this thread's two-block magazine: a flush.
                let c = arena.alloc(512).expect("room");
                arena.free(c);
                arena.flush_current_thread();
            })
        };
        // Meanwhile the allocating thread keeps allocating and freeing.
        let d = arena.alloc(512).expect("room");
        arena.free(d);
        freer.join().unwrap();
        arena.flush_current_thread();
        assert_quiescent(&arena);
        let stats = arena.stats();
        assert_eq!(stats.classes[1].allocs, stats.classes[1].frees);
    });
}

#[test]
fn buddy_split_and_merge_under_contention() {
    model(|| {
        let arena = arena(4, 2);
        let worker = {
            let arena = Arc::clone(&arena);
            thread::spawn(move || {
                // One chunk: splits the arena's single order-2 block unless the other thread
                // already did.
                let block = arena.alloc(1024).expect("room");
                arena.free(block);
            })
        };
        // Two chunks (order 1), competing for the same lock and blocks.
        let block = arena.alloc(2048).expect("room");
        arena.free(block);
        worker.join().unwrap();
        let stats = arena.stats();
        assert_eq!(stats.large.allocs, 2);
        assert!(
            stats.large.splits >= 2,
            "an order-0 block was split out of the order-2 one"
        );
        assert_eq!(
            stats.large.splits, stats.large.merges,
            "everything merged back"
        );
        assert_eq!(stats.large.largest_free_bytes, stats.arena_bytes);
        assert_quiescent(&arena);
    });
}

#[test]
fn thread_exit_racing_pool_drop_neither_leaks_nor_dangles() {
    model(|| {
        let arena = arena(2, 2);
        let worker = {
            let arena = Arc::clone(&arena);
            thread::spawn(move || {
                let block = arena.alloc(256).expect("room");
                arena.free(block);
                drop(arena);
                // Thread exit flushes this thread's slot, concurrently with the drop below.
            })
        };
        // Whoever drops the last reference runs the arena's Drop (retire + drain).
        drop(arena);
        worker.join().unwrap();
    });
}

#[test]
fn one_cache_slot_handed_from_thread_to_thread() {
    model(|| {
        // One slot: whichever thread comes second either runs uncached or, if the first has
        // released the slot, claims it and inherits the (flushed) magazines.
        let arena = arena(2, 1);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let arena = Arc::clone(&arena);
                thread::spawn(move || {
                    let block = arena.alloc(256).expect("room");
                    arena.free(block);
                    arena.flush_current_thread();
                    let block = arena.alloc(256).expect("room");
                    arena.free(block);
                    arena.flush_current_thread();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_quiescent(&arena);
        let stats = arena.stats();
        assert_eq!((stats.classes[0].allocs, stats.classes[0].frees), (4, 4));
    });
}

/// The end of a model where two threads each hold blocks of class 0 (`ours`, this thread's;
/// `theirs`, handed back by the other): no two overlap; freed, with this thread's cache
/// flushed, nothing is out and the class counted `ops` allocations and as many frees.
fn free_both_and_check(arena: &Arena, ours: &[u32], theirs: &[u32], ops: u64) {
    let g = arena.geometry();
    let all: Vec<Block> = ours
        .iter()
        .chain(theirs)
        .map(|&unit| Block::small(unit, 0))
        .collect();
    for (i, x) in all.iter().enumerate() {
        for y in &all[i + 1..] {
            assert!(!overlap(x, y, g), "{x:?} and {y:?} overlap");
        }
    }
    arena.free_units(0, ours);
    arena.free_units(0, theirs);
    arena.flush_current_thread();
    assert_quiescent(arena);
    let stats = arena.stats();
    assert_eq!(
        (stats.classes[0].allocs, stats.classes[0].frees),
        (ops, ops)
    );
}

#[test]
fn batches_allocated_on_one_thread_and_freed_on_another_are_never_shared() {
    model(|| {
        let arena = arena(2, 2);
        // Three blocks into a caller's batch: more than the two-block magazine holds, so the
        // batch path refills from the shared level on the way.
        let mut batch = [0u32; 3];
        arena.alloc_units(0, &mut batch).expect("room");
        let freer = {
            let arena = Arc::clone(&arena);
            thread::spawn(move || {
                // Three into an empty two-block magazine: the batch free flushes a batch.
                arena.free_units(0, &batch);
                let mut mine = [0u32; 2];
                arena.alloc_units(0, &mut mine).expect("room");
                arena.flush_current_thread();
                mine
            })
        };
        // Meanwhile this thread allocates a batch of its own.
        let mut ours = [0u32; 2];
        arena.alloc_units(0, &mut ours).expect("room");
        let theirs = freer.join().unwrap();
        free_both_and_check(&arena, &ours, &theirs, 7);
    });
}

#[test]
fn whole_batches_through_the_array_path_are_never_shared() {
    model(|| {
        let arena = arena(2, 2);
        // Fill this thread's two-block magazine (a refill of one, and a free back), then take
        // both as one array: the whole-batch path of `Batch`.
        let mut two = [0u32; 2];
        arena.alloc_units(0, &mut two).expect("room");
        arena.free_units(0, &two);
        let taken: [u32; 2] = cache::fast_pop_array(arena.id(), 0).expect("two cached");
        let freer = {
            let arena = Arc::clone(&arena);
            thread::spawn(move || {
                // One allocation claims this thread's slot and leaves its magazine empty:
                // the array goes in whole, then the single free finds it full and flushes.
                let mut one = [0u32; 1];
                arena.alloc_units(0, &mut one).expect("room");
                assert!(
                    cache::fast_push_array(arena.id(), 0, &taken),
                    "room for two"
                );
                arena.free_units(0, &one);
                let mut mine = [0u32; 2];
                arena.alloc_units(0, &mut mine).expect("room");
                arena.flush_current_thread();
                mine
            })
        };
        // Meanwhile this thread, its magazine emptied by the array, refills from the shared
        // level that the other thread flushes into.
        let mut ours = [0u32; 2];
        arena.alloc_units(0, &mut ours).expect("room");
        let theirs = freer.join().unwrap();
        free_both_and_check(&arena, &ours, &theirs, 9);
    });
}

/// Blocks cached by another thread are reclaimed: a one-chunk arena has four 256-byte blocks.
/// This thread takes all four, frees two into its cache (its capacity) and then keeps working
/// on that cache (a free that flushes, an allocation), while another thread allocates two,
/// which it can only have by reclaiming. At most four are ever in use, so no allocation may
/// fail, and none may be handed out while in use (a bit per block, set on allocation and
/// cleared before the free): the reclaimer's stop and heavy barrier against the owner's busy
/// word and light barrier (both `fence(SeqCst)` under loom) must keep the two threads off
/// each other's magazine.
#[test]
fn blocks_in_another_threads_cache_are_reclaimed() {
    model(|| {
        let arena = arena(1, 2);
        let in_use = Arc::new(AtomicU32::new(0));
        let take = |arena: &Arena, in_use: &AtomicU32| {
            let block = arena.alloc(256).expect("room: at most four in use");
            let bit = 1 << (block.offset() / 256);
            let before = in_use.fetch_or(bit, Ordering::Relaxed);
            assert_eq!(before & bit, 0, "block {block:?} handed out while in use");
            block
        };
        let give = |arena: &Arena, in_use: &AtomicU32, block: Block| {
            in_use.fetch_and(!(1 << (block.offset() / 256)), Ordering::Relaxed);
            arena.free(block);
        };
        let all: Vec<Block> = (0..4).map(|_| take(&arena, &in_use)).collect();
        give(&arena, &in_use, all[0]);
        give(&arena, &in_use, all[1]);
        let other = {
            let (arena, in_use) = (Arc::clone(&arena), Arc::clone(&in_use));
            thread::spawn(move || {
                let x = take(&arena, &in_use);
                let y = take(&arena, &in_use);
                give(&arena, &in_use, x);
                give(&arena, &in_use, y);
                arena.flush_current_thread();
            })
        };
        // This thread's cache meanwhile: a free with the magazine full (or emptied by the
        // reclaimer), then an allocation.
        give(&arena, &in_use, all[2]);
        let again = take(&arena, &in_use);
        other.join().unwrap();
        give(&arena, &in_use, again);
        give(&arena, &in_use, all[3]);
        arena.flush_current_thread();
        assert_quiescent(&arena);
    });
}

/// The `lease` module's handshake: an owned buffer freed on another thread while the pool's
/// handle is dropped. `threads` cache slots: 2, the freeing thread has one of its own (the
/// fast path: busy mark and light barrier); 1, the handle's thread takes the only one and the
/// freeing thread runs uncached (the slow path: the `sections` count). Either way the state is
/// freed exactly once, after every use of it: the free's use reads `gone`, which the party that
/// frees the state writes, so loom reports a race if the two are not ordered.
fn owned_free_racing_the_handles_drop(threads: usize) {
    model(move || {
        let arena = arena(2, threads);
        let id = arena.id();
        let leases = Arc::new(Leases::new());
        let gone = Arc::new(UnsafeCell::new(false));
        let freed_by = Arc::new(AtomicU32::new(0));
        // An owned allocation: the block, counted in this thread's slot (or shared count).
        let lease = |arena: &Arena, leases: &Leases| {
            let block = arena.alloc(256).expect("room");
            if cache::with_fast_slot(id, |mine| mine.count_owned(0, 1)).is_none() {
                leases.count_direct(1);
            }
            block
        };
        let ours = lease(&arena, &leases);
        let theirs = lease(&arena, &leases);
        // The party that frees the state: the last one, once.
        let free_state = |gone: &UnsafeCell<bool>, freed_by: &AtomicU32| {
            freed_by.fetch_add(1, Ordering::Relaxed);
            // SAFETY: loom's cell checks the access; nothing else holds a reference.
            gone.with_mut(|g| unsafe { *g = true });
        };
        let worker = {
            let (arena, leases) = (Arc::clone(&arena), Arc::clone(&leases));
            let (gone, freed_by) = (Arc::clone(&gone), Arc::clone(&freed_by));
            thread::spawn(move || {
                if threads > 1 {
                    // Claim a slot first, so the owned free takes the fast path.
                    let block = arena.alloc(256).expect("room");
                    arena.free(block);
                }
                let use_state = || {
                    // SAFETY: loom's cell checks the access (a read racing the write above).
                    gone.with(|g| assert!(!unsafe { *g }, "the state was used after its free"));
                };
                let last = leases.free(
                    id,
                    |mine| {
                        use_state();
                        // The lease counted back with the push, as `push_in_owned` does.
                        if let Some(mine) = mine {
                            mine.count_owned(0, u32::MAX);
                        }
                        arena.free(theirs);
                    },
                    || {
                        use_state();
                        arena.free_uncached(theirs);
                    },
                );
                if last {
                    free_state(&gone, &freed_by);
                }
                arena.flush_current_thread();
            })
        };
        // This thread: one owned free of its own, then the handle's drop.
        let free_ours = |mine: Option<cache::OwnedSlot<'_>>| {
            if let Some(mine) = mine {
                mine.count_owned(0, u32::MAX);
            }
            arena.free(ours);
        };
        assert!(!leases.free(id, free_ours, || unreachable!("not retired yet")));
        arena.flush_current_thread();
        if leases.retire(arena.slots(), arena.geometry().classes) {
            free_state(&gone, &freed_by);
        }
        worker.join().unwrap();
        assert_eq!(freed_by.load(Ordering::Relaxed), 1, "freed exactly once");
        assert_quiescent(&arena);
    });
}

#[test]
fn an_owned_free_racing_the_handles_drop_through_its_slot() {
    owned_free_racing_the_handles_drop(2);
}

#[test]
fn an_owned_free_racing_the_handles_drop_without_a_slot() {
    owned_free_racing_the_handles_drop(1);
}
