//! Buffer-pool benchmarks, each against its baselines in the same run:
//!
//! | group | what one iteration is |
//! |---|---|
//! | `alloc_free/4KiB`, `alloc_free/64KiB` | one allocation and its free, on one thread |
//! | `in_flight_256/4KiB` | free the oldest of 256 live buffers, allocate a new one |
//! | `bulk_32/4KiB` | allocate 32, free 32 (bulk calls where the allocator has them) |
//! | `pipeline/4KiB`, `pipeline_burst_32/4KiB` | allocate on one thread, pass through an SPSC ring to another, free there (per object; bursts of 32 use the ring's chunk API and the pool's bulk calls) |
//!
//! `pool` is the borrowed [`Buffer`] path, `pool_owned` the [`OwnedBuffer`] one (the same
//! allocation plus the pool's reference count).
//!
//! Baselines: glibc `malloc`/`free`, `posix_memalign(4096)`, mimalloc, and a pool of
//! preallocated blocks in a crossbeam `ArrayQueue`. The pool runs over a 256 MiB loopback DMA
//! mapping of base pages. Criterion prints times; divide to get the ratios.
//!
//! ```text
//! cargo bench --bench pool -- --warm-up-time 1 --measurement-time 3
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use crossbeam_queue::ArrayQueue;
use mimalloc::MiMalloc;
use userdma::dma::{Loopback, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{Buffer, Config, OwnedBuffer, Pool};

const KIB4: usize = 4 << 10;
const KIB64: usize = 64 << 10;

fn pool() -> Pool {
    let region = Region::builder(256 << 20)
        .page_size(PageSize::Base)
        .build()
        .expect("256 MiB of locked base pages (raise RLIMIT_MEMLOCK or run as root)");
    let space = Loopback::new(48).expect("loopback DMA space");
    let mapping = space.map(Arc::new(region)).expect("loopback mapping");
    Pool::new(mapping, Config::default()).expect("pool over the mapping")
}

/// The allocators under test, behind one interface for the single-thread groups.
trait Allocator: Sync {
    type Block: Send;
    fn alloc(&self) -> Self::Block;
    fn free(&self, block: Self::Block);
}

/// A raw block from a C-style allocator; `Send` so it can cross the pipeline's ring.
struct Raw(*mut u8);
// SAFETY: a heap block may be freed by any thread.
unsafe impl Send for Raw {}

struct Malloc(usize);
impl Allocator for Malloc {
    type Block = Raw;
    #[inline]
    fn alloc(&self) -> Raw {
        // SAFETY: malloc has no preconditions; the result is checked.
        let p = unsafe { libc::malloc(self.0) }.cast::<u8>();
        assert!(!p.is_null());
        Raw(p)
    }
    #[inline]
    fn free(&self, block: Raw) {
        // SAFETY: `block` came from malloc and is freed once.
        unsafe { libc::free(block.0.cast()) }
    }
}

struct Memalign(usize);
impl Allocator for Memalign {
    type Block = Raw;
    #[inline]
    fn alloc(&self) -> Raw {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; 4096 is a power of two multiple of the pointer size.
        let rc = unsafe { libc::posix_memalign(&mut p, 4096, self.0) };
        assert_eq!(rc, 0);
        Raw(p.cast())
    }
    #[inline]
    fn free(&self, block: Raw) {
        // SAFETY: `block` came from posix_memalign and is freed once.
        unsafe { libc::free(block.0.cast()) }
    }
}

struct Mimalloc(Layout);
impl Allocator for Mimalloc {
    type Block = Raw;
    #[inline]
    fn alloc(&self) -> Raw {
        // SAFETY: the layout has a nonzero size.
        let p = unsafe { MiMalloc.alloc(self.0) };
        assert!(!p.is_null());
        Raw(p)
    }
    #[inline]
    fn free(&self, block: Raw) {
        // SAFETY: `block` came from MiMalloc with this layout and is freed once.
        unsafe { MiMalloc.dealloc(block.0, self.0) }
    }
}

/// Preallocated blocks handed out from a lock-free bounded queue.
struct QueuePool {
    queue: ArrayQueue<usize>,
    _memory: Vec<u8>,
}
impl QueuePool {
    fn new(size: usize, count: usize) -> Self {
        let memory = vec![0u8; size * count];
        let queue = ArrayQueue::new(count);
        for i in 0..count {
            queue
                .push(memory.as_ptr() as usize + i * size)
                .expect("room");
        }
        QueuePool {
            queue,
            _memory: memory,
        }
    }
}
impl Allocator for QueuePool {
    type Block = usize;
    #[inline]
    fn alloc(&self) -> usize {
        self.queue.pop().expect("a preallocated block")
    }
    #[inline]
    fn free(&self, block: usize) {
        self.queue.push(block).expect("room for the returned block");
    }
}

struct PoolAllocator<'p>(&'p Pool, usize);
impl<'p> Allocator for PoolAllocator<'p> {
    type Block = Buffer<'p>;
    #[inline]
    fn alloc(&self) -> Buffer<'p> {
        self.0.alloc(self.1).expect("a pool buffer")
    }
    #[inline]
    fn free(&self, block: Buffer<'p>) {
        drop(block);
    }
}

/// The pool through owned buffers ([`Pool::alloc_owned`]): the borrowed path plus the pool's
/// reference count.
struct OwnedAllocator<'p>(&'p Arc<Pool>, usize);
impl Allocator for OwnedAllocator<'_> {
    type Block = OwnedBuffer;
    #[inline]
    fn alloc(&self) -> OwnedBuffer {
        self.0.alloc_owned(self.1).expect("a pool buffer")
    }
    #[inline]
    fn free(&self, block: OwnedBuffer) {
        drop(block);
    }
}

fn alloc_free<A: Allocator>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, a: &A) {
    group.bench_function(name, |b| {
        b.iter(|| {
            let block = black_box(a.alloc());
            a.free(block);
        })
    });
}

fn in_flight<A: Allocator>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, a: &A) {
    let mut ring: Vec<A::Block> = (0..256).map(|_| a.alloc()).collect();
    let mut oldest = 0;
    group.bench_function(name, |b| {
        b.iter(|| {
            let fresh = black_box(a.alloc());
            let old = std::mem::replace(&mut ring[oldest], fresh);
            a.free(old);
            oldest = (oldest + 1) % 256;
        })
    });
    for block in ring {
        a.free(block);
    }
}

fn bulk<A: Allocator>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, a: &A) {
    let mut blocks: Vec<A::Block> = Vec::with_capacity(32);
    group.bench_function(name, |b| {
        b.iter(|| {
            for _ in 0..32 {
                blocks.push(a.alloc());
            }
            black_box(&blocks);
            for block in blocks.drain(..) {
                a.free(block);
            }
        })
    });
}

/// Waits for `ready`: spins briefly, then yields (the machine may have more runnable threads
/// than cores, where pure spinning measures the scheduler).
fn wait_until(ready: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !ready() {
        if spins < 256 {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Allocates on this thread, frees on a consumer thread, through an SPSC ring of 1024 slots.
/// The consumer lives for the whole benchmark; each sample times `iters` objects from the first
/// allocation to the last free. `burst` objects move per ring operation.
fn pipeline<T: Send>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    burst: usize,
    mut produce: impl FnMut(usize, &mut dyn FnMut(T)),
    consume: impl Fn(&mut dyn Iterator<Item = T>) + Sync,
) {
    let (mut tx, mut rx) = rtrb::RingBuffer::<T>::new(1024);
    let freed = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| loop {
            let n = rx.slots().min(burst);
            if n == 0 {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                wait_until(|| rx.slots() > 0 || stop.load(Ordering::Relaxed));
                continue;
            }
            let chunk = rx.read_chunk(n).expect("n slots are readable");
            consume(&mut chunk.into_iter());
            // Release: the producer's Acquire load sees every free before the count.
            freed.fetch_add(n as u64, Ordering::Release);
        });
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let target = freed.load(Ordering::Acquire) + iters;
                let start = Instant::now();
                let mut left = iters;
                while left > 0 {
                    let n = burst.min(left as usize);
                    wait_until(|| tx.slots() >= n);
                    let mut chunk = tx.write_chunk_uninit(n).expect("n slots are writable");
                    let (first, second) = chunk.as_mut_slices();
                    let mut slots = first.iter_mut().chain(second.iter_mut());
                    produce(n, &mut |item| {
                        slots.next().expect("a slot per item").write(item);
                    });
                    // SAFETY: `produce` wrote exactly `n` items, one into each slot.
                    unsafe { chunk.commit_all() };
                    left -= n as u64;
                }
                wait_until(|| freed.load(Ordering::Acquire) >= target);
                start.elapsed()
            })
        });
        stop.store(true, Ordering::Relaxed);
    });
}

/// [`pipeline`] with one allocation or free per object.
fn piped<A: Allocator>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, a: &A, burst: usize) {
    pipeline(
        group,
        name,
        burst,
        |n, push| (0..n).for_each(|_| push(a.alloc())),
        |blocks| blocks.for_each(|block| a.free(block)),
    );
}

fn benches(c: &mut Criterion) {
    let pool = Arc::new(pool());
    // One second of traffic before the first measurement, so that the first group (the pool's)
    // does not pay for the process warming up (clock ramp, first touches of the code).
    let warm = Instant::now();
    while warm.elapsed().as_secs() < 1 {
        drop(black_box(pool.alloc(KIB4).expect("a pool buffer")));
        Malloc(KIB4).free(black_box(Malloc(KIB4).alloc()));
    }
    for (label, size) in [("4KiB", KIB4), ("64KiB", KIB64)] {
        let mut group = c.benchmark_group(format!("alloc_free/{label}"));
        alloc_free(&mut group, "pool", &PoolAllocator(&pool, size));
        alloc_free(&mut group, "pool_owned", &OwnedAllocator(&pool, size));
        alloc_free(&mut group, "malloc", &Malloc(size));
        alloc_free(&mut group, "posix_memalign_4096", &Memalign(size));
        alloc_free(
            &mut group,
            "mimalloc",
            &Mimalloc(Layout::from_size_align(size, 256).unwrap()),
        );
        alloc_free(&mut group, "array_queue", &QueuePool::new(size, 64));
        group.finish();
    }

    let mut group = c.benchmark_group("in_flight_256/4KiB");
    in_flight(&mut group, "pool", &PoolAllocator(&pool, KIB4));
    in_flight(&mut group, "pool_owned", &OwnedAllocator(&pool, KIB4));
    in_flight(&mut group, "malloc", &Malloc(KIB4));
    in_flight(&mut group, "posix_memalign_4096", &Memalign(KIB4));
    in_flight(
        &mut group,
        "mimalloc",
        &Mimalloc(Layout::from_size_align(KIB4, 256).unwrap()),
    );
    in_flight(&mut group, "array_queue", &QueuePool::new(KIB4, 512));
    group.finish();

    let mut group = c.benchmark_group("bulk_32/4KiB");
    {
        let mut buffers = Vec::with_capacity(32);
        group.bench_function("pool", |b| {
            b.iter(|| {
                pool.alloc_bulk(KIB4, 32, &mut buffers)
                    .expect("a pool batch");
                black_box(&buffers);
                pool.free_bulk(buffers.drain(..));
            })
        });
    }
    bulk(&mut group, "malloc", &Malloc(KIB4));
    bulk(&mut group, "posix_memalign_4096", &Memalign(KIB4));
    bulk(
        &mut group,
        "mimalloc",
        &Mimalloc(Layout::from_size_align(KIB4, 256).unwrap()),
    );
    bulk(&mut group, "array_queue", &QueuePool::new(KIB4, 64));
    group.finish();

    for burst in [1usize, 32] {
        let name = if burst == 1 {
            "pipeline/4KiB".to_owned()
        } else {
            format!("pipeline_burst_{burst}/4KiB")
        };
        let mut group = c.benchmark_group(name);
        piped(&mut group, "pool", &PoolAllocator(&pool, KIB4), burst);
        piped(
            &mut group,
            "pool_owned",
            &OwnedAllocator(&pool, KIB4),
            burst,
        );
        if burst > 1 {
            let mut batch = Vec::with_capacity(burst);
            pipeline(
                &mut group,
                "pool_bulk",
                burst,
                |n, push| {
                    pool.alloc_bulk(KIB4, n, &mut batch).expect("a pool batch");
                    batch.drain(..).for_each(&mut *push);
                },
                |buffers| pool.free_bulk(buffers),
            );
        }
        piped(&mut group, "malloc", &Malloc(KIB4), burst);
        piped(&mut group, "posix_memalign_4096", &Memalign(KIB4), burst);
        let mi = Mimalloc(Layout::from_size_align(KIB4, 256).expect("layout"));
        piped(&mut group, "mimalloc", &mi, burst);
        piped(
            &mut group,
            "array_queue",
            &QueuePool::new(KIB4, 4096),
            burst,
        );
        group.finish();
    }
    let stats = pool.stats();
    eprintln!(
        "pool 4 KiB class after the run: {} allocs, {} cache hits, {} shared hits",
        stats.classes[4].allocs, stats.classes[4].cache_hits, stats.classes[4].shared_hits
    );
}

criterion_group!(pool_benches, benches);
criterion_main!(pool_benches);
