//! Buffer-pool benchmarks, each against its baselines in the same run:
//!
//! | group | what one iteration is |
//! |---|---|
//! | `alloc_free/4KiB`, `alloc_free/64KiB` | one allocation, 8 bytes written at offset 0, its free, on one thread |
//! | `in_flight_256/4KiB` | free the oldest of 256 live buffers, allocate a new one |
//! | `bulk_32/4KiB` | allocate 32, write 8 bytes into each, free 32 (batch or bulk calls where the allocator has them) |
//! | `pipeline/4KiB`, `pipeline_burst_32/4KiB` | allocate on CPU 0 and write 8 bytes, pass through an SPSC ring to CPU 1, read them there and free (per object) |
//!
//! `pool` is the borrowed [`Buffer`] path, `pool_owned` the [`OwnedBuffer`] one (the same
//! allocation plus a lease counted in the thread's cache slot; its line also says
//! `pool_owned ÷ pool`, round by round), `pool_batch` a [`Batch`] of 32 (allocated and
//! freed as one; in the pipeline the batch is what crosses the ring, one slot per burst of a
//! 32-slot ring: the same 1024 buffers in flight as the other cases' 1024 slots), `pool_refill`
//! one [`Batch`] kept across iterations, refilled (`Batch::fill`) and emptied (`Batch::free`)
//! in place, as DPDK's loop keeps its array of pointers (whole batches of 32 move between the
//! thread cache and the batch as one array value in both shapes, so the two should agree), in the
//! pipeline `pool_batch_in_place` the batch made and filled in its ring slot and read and
//! dropped there (no move of it at all; the other batch case moves it into the ring and out),
//! `pool_vec` the older `alloc_bulk` / `free_bulk` calls on a `Vec`. The cases without a suffix
//! run over a page-aligned pool: what a device that needs 4 KiB alignment gets (any VFIO or UIO
//! device unless its opener says otherwise, `Device::dma_alignment`), and what `Pool::new`
//! gives with no alignment stated. A `_coloured` suffix: the same over the layout a device
//! that takes 256-byte alignment gets by default (the loopback NPU, through `Runtime::pool`):
//! `Config::dma_alignment(256)`, which colours the classes from 4 KiB up, so its 4 KiB buffers
//! are 4352 bytes apart instead of 4096.
//!
//! Baselines: DPDK 22.11's `rte_mempool` (cache 256, 8191 objects of 4 KiB; get/put, bulk
//! get/put of 32, and the pipeline over an SP/SC `rte_ring` of 1024 slots, run from C by
//! `userdma-bench-support` with the same loops, CPUs and buffer writes), glibc
//! `malloc`/`free`, `posix_memalign(4096)`, mimalloc, and a pool of preallocated blocks in a
//! crossbeam `ArrayQueue`. DPDK runs on 2 MiB hugepages if 256 are free, else `--no-huge`;
//! the pools run over 256 MiB loopback DMA mappings of the same kind of page (2 MiB hugepages
//! when DPDK has them and 256 more are free, else base pages), and the output says which.
//! Reserve 512 hugepages (`userdma hugepages`, or `/proc/sys/vm/nr_hugepages`) for both.
//! DPDK runs twice: `dpdk`, its default layout (4 KiB objects 4160 bytes apart, so their first
//! lines spread over the L1 cache sets), and `dpdk_4k_stride`, objects 4096 bytes apart, the
//! layout of page-aligned 4 KiB buffers like the pool's, whose first lines all fall into one L1
//! set: writing the first line of 32 of them misses L1, in either allocator.
//!
//! After criterion's report (or alone, with the filter `ratios-only`), the userdma ÷ DPDK table:
//! every case in nine alternating rounds of 60 ms (fresh threads for each two-thread round),
//! the median with the range over the rounds, and the ratio of each round to the DPDK round
//! next to it. The two-thread lines come with the CPU 0 <-> CPU 1 cache-line ping-pong taken
//! before and after them: compare two runs only when it agrees (a VM can switch between a fast
//! and a slow state for cross-core traffic).
//!
//! The one-thread loops (get + put, bulk of 32), ours and DPDK's, are timed in every layout:
//! their code placed 0, 16, 32 or 48 bytes into a 64-byte line (`place::<AT>()` here, the same
//! nop pad in the C), under each of four stack depths (`on_stack`). A round keeps each side's
//! fastest layout; two lines under each give the medians per code placement and per stack
//! depth. On this machine one code placement slowed DPDK's bulk loop 1.5× (0.59 -> 0.88 ns),
//! and a stack depth slowed it 4× in one process and ours 4× in another: a figure taken in the
//! one layout a build and a process happened to get is the layout's, not the loop's.
//!
//! `USERDMA_BENCH_LINES` runs only the table lines whose label contains one of its
//! comma-separated words (`USERDMA_BENCH_LINES=bulk`, `=get,burst 32`).
//!
//! ```text
//! cargo bench --bench pool -- --warm-up-time 1 --measurement-time 3
//! cargo bench --bench pool -- ratios-only
//! USERDMA_BENCH_LINES=bulk cargo bench --bench pool -- ratios-only
//! chrt -f 50 target/release/deps/pool-<hash> --bench ratios-only
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};
use crossbeam_queue::ArrayQueue;
use mimalloc::MiMalloc;
use userdma::dma::{SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{Batch, Buffer, Config, OwnedBuffer, Pool};
use userdma_bench_support::cpu::{self, Line};
use userdma_bench_support::dpdk::{self, Mempool, Pair};
use userdma_bench_support::{frame_pad, on_stack, place, PLACEMENTS, STACK_OFFSETS};

const KIB4: usize = 4 << 10;
const KIB64: usize = 64 << 10;
/// The burst of the bulk and burst cases.
const BURST: usize = 32;
/// Slots of the pipeline's SPSC ring (per-object cases; batches take `RING / BURST`).
const RING: usize = 1024;

/// A pool over 256 MiB of `page` pages (2 MiB hugepages or base pages), in the layout of a
/// device that needs 4 KiB alignment (page aligned) or of one that takes 256 bytes (the
/// loopback NPU's default: coloured).
fn make_pool(page: PageSize, coloured: bool) -> Pool {
    let region = Region::builder(256 << 20)
        .page_size(page)
        .build()
        .expect("256 MiB of locked memory (raise RLIMIT_MEMLOCK or run as root)");
    let space = SoftIommu::new(48).expect("loopback DMA space");
    let mapping = space.map(Arc::new(region)).expect("loopback mapping");
    let align = if coloured { 256 } else { 4096 };
    let pool =
        Pool::new(mapping, Config::default().dma_alignment(align)).expect("pool over the mapping");
    assert_eq!(
        pool.is_coloured(KIB4),
        coloured,
        "the layout the alignment calls for"
    );
    pool
}

/// The pools' page size: 2 MiB hugepages when DPDK runs on them and 256 more are free for the
/// two pools, else base pages, so that both sides run on the same kind of page when they can.
fn pool_pages(eal: &dpdk::Eal) -> (PageSize, &'static str) {
    if eal.hugepages && dpdk::free_hugepages() >= 256 {
        (PageSize::Huge2M, "2 MiB hugepages")
    } else if eal.hugepages {
        (
            PageSize::Base,
            "base pages (fewer than 256 2 MiB hugepages left after DPDK's)",
        )
    } else {
        (PageSize::Base, "base pages")
    }
}

/// The allocators under test, behind one interface for the single-thread groups.
trait Allocator: Sync {
    type Block: Send;
    fn alloc(&self) -> Self::Block;
    fn free(&self, block: Self::Block);
    /// Writes `value` into the block's first 8 bytes (what a user filling a buffer does first).
    fn touch(&self, block: &Self::Block, value: u64);
    /// Reads the block's first 8 bytes (what the consumer of a filled buffer does).
    fn peek(&self, block: &Self::Block) -> u64;
}

/// A raw block from a C-style allocator; `Send` so it can cross the pipeline's ring.
struct Raw(*mut u8);
// SAFETY: a heap block may be freed by any thread.
unsafe impl Send for Raw {}

impl Raw {
    fn touch(&self, value: u64) {
        // SAFETY: every block here is at least 4 KiB and aligned to at least 8 bytes.
        unsafe { self.0.cast::<u64>().write_volatile(value) }
    }
    fn peek(&self) -> u64 {
        // SAFETY: as for `touch`; the block was written first.
        unsafe { self.0.cast::<u64>().read_volatile() }
    }
}

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
    fn touch(&self, block: &Raw, value: u64) {
        block.touch(value)
    }
    fn peek(&self, block: &Raw) -> u64 {
        block.peek()
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
    fn touch(&self, block: &Raw, value: u64) {
        block.touch(value)
    }
    fn peek(&self, block: &Raw) -> u64 {
        block.peek()
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
    fn touch(&self, block: &Raw, value: u64) {
        block.touch(value)
    }
    fn peek(&self, block: &Raw) -> u64 {
        block.peek()
    }
}

/// Preallocated blocks handed out from a lock-free bounded queue.
struct QueuePool {
    queue: ArrayQueue<usize>,
    _memory: Vec<u64>,
}
impl QueuePool {
    fn new(size: usize, count: usize) -> Self {
        let memory = vec![0u64; size / 8 * count];
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
    fn touch(&self, block: &usize, value: u64) {
        Raw(*block as *mut u8).touch(value)
    }
    fn peek(&self, block: &usize) -> u64 {
        Raw(*block as *mut u8).peek()
    }
}

struct PoolAllocator<'p>(&'p Pool, usize);
impl<'p> Allocator for PoolAllocator<'p> {
    type Block = Buffer<'p>;
    #[inline(always)]
    fn alloc(&self) -> Buffer<'p> {
        self.0.alloc(self.1).expect("a pool buffer")
    }
    #[inline(always)]
    fn free(&self, block: Buffer<'p>) {
        drop(block);
    }
    #[inline(always)]
    fn touch(&self, block: &Buffer<'p>, value: u64) {
        block.slice().write(0, value).expect("8 bytes at 0");
    }
    #[inline(always)]
    fn peek(&self, block: &Buffer<'p>) -> u64 {
        block.slice().read(0).expect("8 bytes at 0")
    }
}

/// The pool through owned buffers ([`Pool::alloc_owned`]): the borrowed path plus a lease
/// counted in the thread's cache slot. It holds the pool as [`PoolAllocator`] does, by
/// reference: holding the `&Arc<Pool>` instead made every allocation load the pool's address
/// through the `Arc` as well, a cost of the benchmark (about 0.3 ns, 0.07 of `pool_owned ÷
/// pool` on one thread), not of owned buffers.
struct OwnedAllocator<'p>(&'p Pool, usize);
impl Allocator for OwnedAllocator<'_> {
    type Block = OwnedBuffer;
    #[inline(always)]
    fn alloc(&self) -> OwnedBuffer {
        self.0.alloc_owned(self.1).expect("a pool buffer")
    }
    #[inline(always)]
    fn free(&self, block: OwnedBuffer) {
        drop(block);
    }
    #[inline(always)]
    fn touch(&self, block: &OwnedBuffer, value: u64) {
        block.slice().write(0, value).expect("8 bytes at 0");
    }
    #[inline(always)]
    fn peek(&self, block: &OwnedBuffer) -> u64 {
        block.slice().read(0).expect("8 bytes at 0")
    }
}

/// `iters` of: allocate, write, free.
#[inline(never)]
fn alloc_free_loop<const AT: usize>(a: &impl Allocator, iters: u64) -> Duration {
    place::<AT>();
    let _pad = frame_pad::<AT>();
    let start = Instant::now();
    for i in 0..iters {
        let block = black_box(a.alloc());
        a.touch(&block, i);
        a.free(block);
    }
    start.elapsed()
}

/// `iters` of: allocate a batch of 32, write each, free the batch.
#[inline(never)]
fn batch_loop<const AT: usize>(pool: &Pool, iters: u64) -> Duration {
    place::<AT>();
    let _pad = frame_pad::<AT>();
    let start = Instant::now();
    for i in 0..iters {
        let batch = pool
            .alloc_batch::<BURST>(KIB4, BURST)
            .expect("a pool batch");
        for buffer in batch.iter() {
            buffer.slice().write(0, i).expect("8 bytes at 0");
        }
        // Freed where it goes out of scope, in place: `drop(batch)` would move the
        // black-boxed value first, a 160-byte copy no caller makes.
        black_box(&batch);
    }
    start.elapsed()
}

/// `iters` of: refill one batch with 32, write each, free them (the batch stays, as DPDK's
/// loop keeps its array of pointers).
#[inline(never)]
fn refill_loop<const AT: usize>(pool: &Pool, iters: u64) -> Duration {
    place::<AT>();
    let _pad = frame_pad::<AT>();
    let mut batch = Batch::<BURST>::new(pool, KIB4).expect("a batch of 4 KiB buffers");
    let start = Instant::now();
    for i in 0..iters {
        batch.fill(BURST).expect("a pool batch");
        for buffer in batch.iter() {
            buffer.slice().write(0, i).expect("8 bytes at 0");
        }
        black_box(&batch);
        batch.free();
    }
    start.elapsed()
}

/// `iters` of: `alloc_bulk` 32 into a `Vec` (made once, before the clock starts), write each,
/// `free_bulk` them.
#[inline(never)]
fn vec_loop<const AT: usize>(pool: &Pool, iters: u64) -> Duration {
    place::<AT>();
    let _pad = frame_pad::<AT>();
    let mut buffers = Vec::with_capacity(BURST);
    let buffers = &mut buffers;
    let start = Instant::now();
    for i in 0..iters {
        pool.alloc_bulk(KIB4, BURST, buffers).expect("a pool batch");
        for buffer in buffers.iter() {
            buffer.slice().write(0, i).expect("8 bytes at 0");
        }
        black_box(&*buffers);
        pool.free_bulk(buffers.drain(..));
    }
    start.elapsed()
}

/// `iters` of: allocate 32 one by one, write each, free each.
fn bulk_loop<A: Allocator>(a: &A, blocks: &mut Vec<A::Block>, iters: u64) -> Duration {
    let start = Instant::now();
    for i in 0..iters {
        for _ in 0..BURST {
            let block = a.alloc();
            a.touch(&block, i);
            blocks.push(block);
        }
        black_box(&*blocks);
        for block in blocks.drain(..) {
            a.free(block);
        }
    }
    start.elapsed()
}

fn alloc_free<A: Allocator>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, a: &A) {
    group.bench_function(name, |b| {
        b.iter_custom(|iters| alloc_free_loop::<0>(a, iters))
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
    let mut blocks: Vec<A::Block> = Vec::with_capacity(BURST);
    group.bench_function(name, |b| {
        b.iter_custom(|iters| bulk_loop(a, &mut blocks, iters))
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

/// A running pipeline: the producer side of an SPSC ring (the caller, on CPU 0) and a consumer
/// thread on CPU 1 that takes what arrives, reads and frees it, and counts the objects freed.
struct Pipe<T: Send + 'static> {
    tx: rtrb::Producer<T>,
    freed: Arc<Line<AtomicU64>>,
    stop: Arc<Line<AtomicBool>>,
    handle: Option<thread::JoinHandle<()>>,
}

impl<T: Send + 'static> Pipe<T> {
    /// A ring of `slots`; the consumer calls `consume` on the ring, which takes what it finds
    /// and returns how many objects it freed (0: nothing there).
    fn new(
        slots: usize,
        mut consume: impl FnMut(&mut rtrb::Consumer<T>) -> u64 + Send + 'static,
    ) -> Self {
        let (tx, mut rx) = rtrb::RingBuffer::<T>::new(slots);
        let freed = Arc::new(Line(AtomicU64::new(0)));
        let stop = Arc::new(Line(AtomicBool::new(false)));
        let handle = {
            let (freed, stop) = (Arc::clone(&freed), Arc::clone(&stop));
            cpu::spawn_device(move || loop {
                let n = consume(&mut rx);
                if n > 0 {
                    // Release: the producer's Acquire load sees every free before the count.
                    freed.fetch_add(n, Ordering::Release);
                    continue;
                }
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                wait_until(|| rx.slots() > 0 || stop.load(Ordering::Relaxed));
            })
        };
        Pipe {
            tx,
            freed,
            stop,
            handle: Some(handle),
        }
    }

    /// Sends `objects` objects in bursts of up to `burst` (`produce(n, ring)` allocates,
    /// writes and enqueues `n`), and returns the time until the consumer has freed them all.
    fn run(
        &mut self,
        objects: u64,
        burst: usize,
        mut produce: impl FnMut(usize, &mut rtrb::Producer<T>),
    ) -> Duration {
        let target = self.freed.load(Ordering::Acquire) + objects;
        let start = Instant::now();
        let mut left = objects;
        while left > 0 {
            let n = burst.min(left as usize);
            produce(n, &mut self.tx);
            left -= n as u64;
        }
        wait_until(|| self.freed.load(Ordering::Acquire) >= target);
        start.elapsed()
    }
}

impl<T: Send + 'static> Drop for Pipe<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            handle.join().expect("pipeline consumer");
        }
    }
}

/// One measured side of a case: `run(objects)` moves that many objects and returns the time.
type Run = Box<dyn FnMut(u64) -> Duration>;
/// Makes a fresh [`Run`] (with fresh threads, for the two-thread cases) of the loop at code
/// placement `at`, an index into [`PLACEMENTS`] (the two-thread cases have one placement and
/// ignore it).
type Maker<'a> = Box<dyn Fn(usize) -> Run + 'a>;

const _: () = assert!(PLACEMENTS.len() == 4, "placed! has one arm per placement");

/// A [`Maker`] of a single-thread loop `f::<AT>(args)` that is generic over its placement:
/// `placed!(|n| refill_loop(pool, n))` runs `refill_loop::<{ PLACEMENTS[at] }>`.
macro_rules! placed {
    (|$n:ident| $f:ident($($arg:expr),*)) => {
        Box::new(move |at: usize| -> Run {
            match at {
                0 => Box::new(move |$n: u64| $f::<{ PLACEMENTS[0] }>($($arg),*)),
                1 => Box::new(move |$n: u64| $f::<{ PLACEMENTS[1] }>($($arg),*)),
                2 => Box::new(move |$n: u64| $f::<{ PLACEMENTS[2] }>($($arg),*)),
                3 => Box::new(move |$n: u64| $f::<{ PLACEMENTS[3] }>($($arg),*)),
                _ => unreachable!("placement {at} outside 0..{}", PLACEMENTS.len()),
            }
        })
    };
}

/// The pipeline with one allocation and free per object: the producer waits for room for the
/// burst, allocates and writes each object into a write chunk; the consumer takes up to a
/// burst, reads and frees each.
fn piped<A: Allocator + 'static>(a: &'static A, burst: usize) -> Run
where
    A::Block: 'static,
{
    let mut pipe = Pipe::<A::Block>::new(RING, move |rx| {
        let n = rx.slots().min(burst);
        if n == 0 {
            return 0;
        }
        let mut sum = 0;
        for block in rx.read_chunk(n).expect("n slots are readable") {
            sum += a.peek(&block);
            a.free(block);
        }
        black_box(sum);
        n as u64
    });
    let mut seq = 0u64;
    Box::new(move |objects| {
        pipe.run(objects, burst, |n, tx| {
            wait_until(|| tx.slots() >= n);
            let chunk = tx.write_chunk_uninit(n).expect("n slots are writable");
            let written = chunk.fill_from_iter((0..n).map(|k| {
                let block = a.alloc();
                a.touch(&block, seq + k as u64);
                block
            }));
            debug_assert_eq!(written, n);
            seq += n as u64;
        })
    })
}

/// Writes `seq`, `seq + 1`, ... into the first 8 bytes of the batch's buffers; returns the next.
fn write_seq(batch: &Batch<'_, BURST>, seq: u64) -> u64 {
    for (k, buffer) in batch.iter().enumerate() {
        buffer
            .slice()
            .write(0, seq + k as u64)
            .expect("8 bytes at 0");
    }
    seq + batch.len() as u64
}

/// Reads the first 8 bytes of every buffer of the batch; returns how many buffers it has.
fn read_all(batch: &Batch<'_, BURST>) -> u64 {
    let mut sum = 0u64;
    for buffer in batch.iter() {
        sum += buffer.slice().read::<u64>(0).expect("8 bytes at 0");
    }
    black_box(sum);
    batch.len() as u64
}

/// The pipeline in batches: the producer allocates a [`Batch`] of the burst, writes each
/// buffer, and enqueues the batch (one slot); the consumer takes a batch, reads each buffer and
/// frees the batch.
fn piped_batch(pool: &'static Pool, burst: usize) -> Run {
    let mut pipe = Pipe::<Batch<'static, BURST>>::new(RING / BURST, |rx| {
        let Ok(batch) = rx.pop() else {
            return 0;
        };
        let n = read_all(&batch);
        drop(batch);
        n
    });
    let mut seq = 0u64;
    Box::new(move |objects| {
        pipe.run(objects, burst, |n, tx| {
            wait_until(|| tx.slots() >= 1);
            let batch = pool.alloc_batch::<BURST>(KIB4, n).expect("a pool batch");
            seq = write_seq(&batch, seq);
            if tx.push(batch).is_err() {
                unreachable!("a slot was free");
            }
        })
    })
}

/// The pipeline of [`piped_batch`] with no batch moved: the producer makes its batch in the
/// ring's slot and fills it there; the consumer reads it there and frees it by releasing the
/// slot (which drops it in place).
fn piped_batch_in_place(pool: &'static Pool, burst: usize) -> Run {
    let mut pipe = Pipe::<Batch<'static, BURST>>::new(RING / BURST, |rx| {
        let Ok(chunk) = rx.read_chunk(1) else {
            return 0;
        };
        let (slots, _) = chunk.as_slices();
        let batch = &slots[0];
        let n = read_all(batch);
        chunk.commit_all();
        n
    });
    let mut seq = 0u64;
    Box::new(move |objects| {
        pipe.run(objects, burst, |n, tx| {
            wait_until(|| tx.slots() >= 1);
            let mut chunk = tx.write_chunk_uninit(1).expect("a slot is writable");
            let (slots, _) = chunk.as_mut_slices();
            let batch = slots[0].write(Batch::new(pool, KIB4).expect("a batch of 4 KiB"));
            batch.fill(n).expect("a pool batch");
            seq = write_seq(batch, seq);
            // SAFETY: the chunk's one slot was written above (a panic before this leaks the
            // batch in the slot, never publishes it).
            unsafe { chunk.commit_all() };
        })
    })
}

/// The pipeline with the older bulk calls: `alloc_bulk` into a `Vec`, moved into the ring per
/// buffer; the consumer `free_bulk`s what it takes.
fn piped_vec(pool: &'static Pool, burst: usize) -> Run {
    let mut pipe = Pipe::<Buffer<'static>>::new(RING, move |rx| {
        let n = rx.slots().min(burst);
        if n == 0 {
            return 0;
        }
        let chunk = rx.read_chunk(n).expect("n slots are readable");
        let (a, b) = chunk.as_slices();
        let sum: u64 = a
            .iter()
            .chain(b)
            .map(|buffer| buffer.slice().read::<u64>(0).expect("8 bytes at 0"))
            .sum();
        black_box(sum);
        pool.free_bulk(chunk);
        n as u64
    });
    let mut batch = Vec::with_capacity(burst);
    let mut seq = 0u64;
    Box::new(move |objects| {
        pipe.run(objects, burst, |n, tx| {
            wait_until(|| tx.slots() >= n);
            pool.alloc_bulk(KIB4, n, &mut batch).expect("a pool batch");
            for (k, buffer) in batch.iter().enumerate() {
                buffer
                    .slice()
                    .write(0, seq + k as u64)
                    .expect("8 bytes at 0");
            }
            seq += n as u64;
            let chunk = tx.write_chunk_uninit(n).expect("n slots are writable");
            chunk.fill_from_iter(batch.drain(..));
        })
    })
}

/// DPDK's pipeline: `rte_mempool_get_bulk` -> SP/SC `rte_ring` -> `rte_mempool_put_bulk`.
fn piped_dpdk(mp: &'static Mempool, burst: usize) -> Run {
    let mut pair = Pair::pipeline(mp, burst as u32).expect("DPDK pipeline on lcore 1");
    Box::new(move |objects| pair.run(objects))
}

/// The two `rte_mempool`s the DPDK cases use, 8191 objects with a cache of 256 each: 4 KiB
/// objects at DPDK's default stride, and objects 4096 bytes apart (the layout of page-aligned
/// 4 KiB buffers, like the pool's).
type Mempools = (&'static Mempool, &'static Mempool);

fn mempools() -> Mempools {
    let mp = Mempool::new("userdma_bench", 8191, KIB4 as u32, 256).expect("rte_mempool");
    // The object header is 64 bytes: 4032-byte objects then start 4096 bytes apart.
    let mp4k =
        Mempool::unspread("userdma_bench_4k", 8191, KIB4 as u32 - 64, 256).expect("rte_mempool");
    assert_eq!(
        mp4k.stride(),
        KIB4 as u32,
        "DPDK's object header is not 64 bytes"
    );
    (Box::leak(Box::new(mp)), Box::leak(Box::new(mp4k)))
}

/// How many alternating rounds the ratio table takes, and how long each: nine of 60 ms, or in
/// criterion's test mode (`-- --test`, which runs every benchmark once to check it works) one
/// of 2 ms.
fn rounds() -> (usize, Duration) {
    if std::env::args().any(|arg| arg == "--test") {
        (1, Duration::from_millis(2))
    } else {
        (9, Duration::from_millis(60))
    }
}

/// Nanoseconds per object of one round of about `time`: warmed up, then timed over whole calls
/// of about a millisecond.
fn round(run: &mut Run, time: Duration) -> f64 {
    let mut objects = 64u64;
    let call = time.min(Duration::from_millis(1));
    loop {
        if run(objects) >= call || objects >= 1 << 26 {
            break;
        }
        objects *= 2;
    }
    let (mut total, mut done) = (Duration::ZERO, 0u64);
    while total < time {
        total += run(objects);
        done += objects;
    }
    total.as_nanos() as f64 / done as f64
}

/// Whether the table line `label` is wanted: every line, unless `USERDMA_BENCH_LINES` names
/// some (comma-separated words, each matched against the line's label), as in
/// `USERDMA_BENCH_LINES=bulk,burst 32`.
fn wanted(label: &str) -> bool {
    match std::env::var("USERDMA_BENCH_LINES") {
        Ok(lines) if !lines.trim().is_empty() => lines
            .split(',')
            .any(|word| !word.trim().is_empty() && label.contains(word.trim())),
        _ => true,
    }
}

/// Median, minimum and maximum.
fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    (median, values[0], values[n - 1])
}

/// One line of the table: every side (ours, then DPDK's) in alternating rounds (each round a
/// fresh `make(at)`), ns per object as median [min-max], then each of ours over each DPDK side,
/// round by round (median [min-max] of the ratios of rounds run next to each other).
///
/// With `layouts` (the single-thread loops), a side's round times it in every layout, each
/// code placement (`make(at)`, [`PLACEMENTS`]) under each stack offset ([`on_stack`]), for a
/// quarter of the round time each, and keeps the fastest; two more lines give each side's
/// median per code placement (in its best stack offset) and per stack offset (at its best
/// placement).
fn table_line(
    label: &str,
    layouts: bool,
    ours: Vec<(&str, Maker<'_>)>,
    dpdk: Vec<(&str, Maker<'_>)>,
) {
    if !wanted(label) {
        return;
    }
    let (count, time) = rounds();
    let (codes, stacks, time) = if layouts {
        (PLACEMENTS.len(), STACK_OFFSETS.len(), time / 4)
    } else {
        (1, 1, time)
    };
    let mine = ours.len();
    let sides: Vec<(&str, Maker<'_>)> = ours.into_iter().chain(dpdk).collect();
    // ns[side][stack][code][round]
    let mut ns = vec![vec![vec![Vec::new(); codes]; stacks]; sides.len()];
    for _ in 0..count {
        for (k, (_, make)) in sides.iter().enumerate() {
            for (stack, by_code) in ns[k].iter_mut().enumerate() {
                for (at, values) in by_code.iter_mut().enumerate() {
                    let mut run = make(at);
                    values.push(on_stack(stack, &mut || round(&mut run, time)));
                }
            }
        }
    }
    // Per side and round, the fastest layout.
    let best: Vec<Vec<f64>> = ns
        .iter()
        .map(|by_stack| {
            (0..count)
                .map(|r| {
                    by_stack
                        .iter()
                        .flatten()
                        .map(|values| values[r])
                        .fold(f64::INFINITY, f64::min)
                })
                .collect()
        })
        .collect();
    let parts: Vec<String> = sides
        .iter()
        .zip(&best)
        .map(|((name, _), values)| {
            let (m, lo, hi) = spread(&mut values.clone());
            format!("{name} {m:.2} ns [{lo:.2}-{hi:.2}]")
        })
        .collect();
    println!("  {label}: {}", parts.join(", "));
    if layouts {
        // median[side][stack][code]
        let median: Vec<Vec<Vec<f64>>> = ns
            .iter()
            .map(|by_stack| {
                by_stack
                    .iter()
                    .map(|by_code| {
                        by_code
                            .iter()
                            .map(|values| spread(&mut values.clone()).0)
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let per_code = |m: &Vec<Vec<f64>>| -> String {
            (0..codes)
                .map(|at| {
                    format!(
                        "{:.2}",
                        (0..stacks)
                            .map(|st| m[st][at])
                            .fold(f64::INFINITY, f64::min)
                    )
                })
                .collect::<Vec<_>>()
                .join("/")
        };
        let per_stack = |m: &Vec<Vec<f64>>| -> String {
            m.iter()
                .map(|by_code| {
                    format!(
                        "{:.2}",
                        by_code.iter().copied().fold(f64::INFINITY, f64::min)
                    )
                })
                .collect::<Vec<_>>()
                .join("/")
        };
        let line = |what: String, of: &dyn Fn(&Vec<Vec<f64>>) -> String| {
            let parts: Vec<String> = sides
                .iter()
                .zip(&median)
                .map(|((name, _), m)| format!("{name} {}", of(m)))
                .collect();
            println!(
                "  {:width$}  {what}, median ns: {}",
                "",
                parts.join(", "),
                width = label.len()
            );
        };
        let offsets = |values: &[usize]| -> String {
            values
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("/")
        };
        line(
            format!(
                "by code placement (+{} bytes into a 64-byte line, best stack offset)",
                offsets(&PLACEMENTS)
            ),
            &per_code,
        );
        line(
            format!(
                "by stack offset ({} bytes down, best code placement)",
                offsets(&STACK_OFFSETS)
            ),
            &per_stack,
        );
    }
    for d in mine..sides.len() {
        let ratios: Vec<String> = (0..mine)
            .map(|k| {
                let mut per_round: Vec<f64> =
                    best[k].iter().zip(&best[d]).map(|(a, b)| a / b).collect();
                let (r, lo, hi) = spread(&mut per_round);
                format!("{} {r:.2}x [{lo:.2}-{hi:.2}]", sides[k].0)
            })
            .collect();
        println!(
            "  {:width$}  ÷ {}: {}",
            "",
            sides[d].0,
            ratios.join(", "),
            width = label.len()
        );
    }
    // An owned case against its borrowed one, round by round (same run, same rounds).
    for k in 0..mine {
        let Some(base) = sides[k].0.strip_suffix("_owned") else {
            continue;
        };
        if let Some(b) = (0..mine).find(|&b| sides[b].0 == base) {
            let mut per_round: Vec<f64> =
                best[k].iter().zip(&best[b]).map(|(o, p)| o / p).collect();
            let (r, lo, hi) = spread(&mut per_round);
            println!(
                "  {:width$}  {} ÷ {base}: {r:.2}x [{lo:.2}-{hi:.2}]",
                "",
                sides[k].0,
                width = label.len()
            );
        }
    }
}

/// The userdma ÷ DPDK table.
fn ratios(
    pool: &'static Arc<Pool>,
    coloured: &'static Arc<Pool>,
    (mp, mp4k): Mempools,
    eal: &dpdk::Eal,
    pages: &str,
) {
    let (count, time) = rounds();
    if count == 1 {
        println!("\n(test mode: one short round each, to check the table runs; not a measurement)");
    }
    let cached = pool.config().thread_cache_blocks(KIB4);
    println!(
        "\nuserdma ÷ DPDK, ns per 4 KiB buffer, median [min-max] of {count} alternating rounds \
         of {time:?}; each buffer written once (8 bytes at offset 0), read back by the consumer \
         in the pipeline.\n  {}; rte_mempool {} cache 256 (a core's cache refills to 256 from \
         the ring and, when a put would take it past 384, flushes all it holds), 8191 objects, \
         `dpdk` at DPDK's \
         default {}-byte stride (first lines spread over cache sets), `dpdk_4k_stride` at {} \
         bytes (4032-byte objects, no spread: the layout of page-aligned 4 KiB buffers, every \
         first line in one L1 set).\n  userdma: pools over 256 MiB of {pages}; default \
         config (a thread's cache holds up to {cap} 4 KiB buffers, refills and flushes {half} at a \
         time); no suffix: the layout of a device that needs 4 KiB alignment (VFIO, UIO), 4 KiB \
         buffers page aligned (IOVA), so 4096 bytes apart, the layout of `dpdk_4k_stride`; \
         `_coloured`: the default layout of a device that takes 256-byte alignment (the loopback \
         NPU), cache-coloured, 4 KiB buffers 4352 bytes apart (16 offsets within a page), the \
         counterpart of `dpdk`.",
        eal.memory(),
        mp.ops(),
        mp.stride(),
        mp4k.stride(),
        cap = cached,
        half = cached / 2,
    );
    let single: &'static PoolAllocator<'static> = Box::leak(Box::new(PoolAllocator(pool, KIB4)));
    let single_coloured: &'static PoolAllocator<'static> =
        Box::leak(Box::new(PoolAllocator(coloured, KIB4)));
    let owned: &'static OwnedAllocator<'static> = Box::leak(Box::new(OwnedAllocator(pool, KIB4)));
    cpu::pin(cpu::HOST);
    table_line(
        "one thread, get + put",
        true,
        vec![
            ("pool", placed!(|n| alloc_free_loop(single, n))),
            ("pool_owned", placed!(|n| alloc_free_loop(owned, n))),
        ],
        vec![
            (
                "dpdk",
                Box::new(move |at| Box::new(move |n| mp.get_put(n, 1, at))),
            ),
            (
                "dpdk_4k_stride",
                Box::new(move |at| Box::new(move |n| mp4k.get_put(n, 1, at))),
            ),
        ],
    );
    // The bulk loops time `n / 32` batches of 32 for `n` objects: per object as the rest.
    let per_batch = BURST as u64;
    let bulk = BURST as u32;
    table_line(
        "one thread, bulk of 32, per buffer",
        true,
        vec![
            (
                "pool_batch",
                placed!(|n| batch_loop(pool, n.div_ceil(per_batch))),
            ),
            (
                "pool_batch_coloured",
                placed!(|n| batch_loop(coloured, n.div_ceil(per_batch))),
            ),
            (
                "pool_refill",
                placed!(|n| refill_loop(pool, n.div_ceil(per_batch))),
            ),
            (
                "pool_refill_coloured",
                placed!(|n| refill_loop(coloured, n.div_ceil(per_batch))),
            ),
            (
                "pool_vec",
                placed!(|n| vec_loop(pool, n.div_ceil(per_batch))),
            ),
        ],
        vec![
            (
                "dpdk",
                Box::new(move |at| Box::new(move |n| mp.get_put(n.div_ceil(per_batch), bulk, at))),
            ),
            (
                "dpdk_4k_stride",
                Box::new(move |at| {
                    Box::new(move |n| mp4k.get_put(n.div_ceil(per_batch), bulk, at))
                }),
            ),
        ],
    );
    let before = cpu::pingpong(Duration::from_millis(20));
    println!("  two threads, alloc on CPU 0 -> SPSC ring -> free on CPU 1; ping-pong {before:.0} ns before:");
    table_line(
        "  burst 1",
        false,
        vec![
            ("pool", Box::new(move |_| piped(single, 1))),
            (
                "pool_coloured",
                Box::new(move |_| piped(single_coloured, 1)),
            ),
            ("pool_owned", Box::new(move |_| piped(owned, 1))),
        ],
        vec![
            ("dpdk", Box::new(move |_| piped_dpdk(mp, 1))),
            ("dpdk_4k_stride", Box::new(move |_| piped_dpdk(mp4k, 1))),
        ],
    );
    table_line(
        "  burst 32",
        false,
        vec![
            ("pool_batch", Box::new(move |_| piped_batch(pool, BURST))),
            (
                "pool_batch_coloured",
                Box::new(move |_| piped_batch(coloured, BURST)),
            ),
            (
                "pool_batch_in_place_coloured",
                Box::new(move |_| piped_batch_in_place(coloured, BURST)),
            ),
            ("pool", Box::new(move |_| piped(single, BURST))),
            ("pool_vec", Box::new(move |_| piped_vec(pool, BURST))),
        ],
        vec![
            ("dpdk", Box::new(move |_| piped_dpdk(mp, BURST))),
            ("dpdk_4k_stride", Box::new(move |_| piped_dpdk(mp4k, BURST))),
        ],
    );
    let after = cpu::pingpong(Duration::from_millis(20));
    println!("  ping-pong {after:.0} ns after (CPU 0 <-> CPU 1 round trip of one cache line)");
}

fn benches(
    c: &mut Criterion,
    pool: &'static Arc<Pool>,
    coloured: &'static Arc<Pool>,
    (mp, mp4k): Mempools,
) {
    // One second of traffic before the first measurement, so that the first group (the pool's)
    // does not pay for the process warming up (clock ramp, first touches of the code).
    let warm = Instant::now();
    while warm.elapsed().as_secs() < 1 {
        drop(black_box(pool.alloc(KIB4).expect("a pool buffer")));
        Malloc(KIB4).free(black_box(Malloc(KIB4).alloc()));
    }
    for (label, size) in [("4KiB", KIB4), ("64KiB", KIB64)] {
        let mut group = c.benchmark_group(format!("alloc_free/{label}"));
        alloc_free(&mut group, "pool", &PoolAllocator(pool, size));
        alloc_free(&mut group, "pool_owned", &OwnedAllocator(pool, size));
        if size == KIB4 {
            group.bench_function("dpdk_mempool", |b| {
                b.iter_custom(|iters| mp.get_put(iters, 1, 0))
            });
            group.bench_function("dpdk_mempool_4k_stride", |b| {
                b.iter_custom(|iters| mp4k.get_put(iters, 1, 0))
            });
        }
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
    in_flight(&mut group, "pool", &PoolAllocator(pool, KIB4));
    in_flight(&mut group, "pool_owned", &OwnedAllocator(pool, KIB4));
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
    group.bench_function("pool_batch", |b| {
        b.iter_custom(|iters| batch_loop::<0>(pool, iters))
    });
    group.bench_function("pool_batch_coloured", |b| {
        b.iter_custom(|iters| batch_loop::<0>(coloured, iters))
    });
    group.bench_function("pool_refill", |b| {
        b.iter_custom(|iters| refill_loop::<0>(pool, iters))
    });
    group.bench_function("pool_refill_coloured", |b| {
        b.iter_custom(|iters| refill_loop::<0>(coloured, iters))
    });
    group.bench_function("pool_vec", |b| {
        b.iter_custom(|iters| vec_loop::<0>(pool, iters))
    });
    group.bench_function("dpdk_mempool", |b| {
        b.iter_custom(|iters| mp.get_put(iters, BURST as u32, 0))
    });
    group.bench_function("dpdk_mempool_4k_stride", |b| {
        b.iter_custom(|iters| mp4k.get_put(iters, BURST as u32, 0))
    });
    bulk(&mut group, "pool", &PoolAllocator(pool, KIB4));
    bulk(&mut group, "malloc", &Malloc(KIB4));
    bulk(&mut group, "posix_memalign_4096", &Memalign(KIB4));
    bulk(
        &mut group,
        "mimalloc",
        &Mimalloc(Layout::from_size_align(KIB4, 256).unwrap()),
    );
    bulk(&mut group, "array_queue", &QueuePool::new(KIB4, 64));
    group.finish();

    let single: &'static PoolAllocator<'static> = Box::leak(Box::new(PoolAllocator(pool, KIB4)));
    let owned: &'static OwnedAllocator<'static> = Box::leak(Box::new(OwnedAllocator(pool, KIB4)));
    let malloc: &'static Malloc = Box::leak(Box::new(Malloc(KIB4)));
    let memalign: &'static Memalign = Box::leak(Box::new(Memalign(KIB4)));
    let mi: &'static Mimalloc = Box::leak(Box::new(Mimalloc(
        Layout::from_size_align(KIB4, 256).expect("layout"),
    )));
    let queue: &'static QueuePool = Box::leak(Box::new(QueuePool::new(KIB4, 4096)));
    for burst in [1usize, BURST] {
        let name = if burst == 1 {
            "pipeline/4KiB".to_owned()
        } else {
            format!("pipeline_burst_{burst}/4KiB")
        };
        let mut group = c.benchmark_group(name);
        let mut cases: Vec<(&str, Run)> = Vec::new();
        if burst > 1 {
            cases.push(("pool_batch", piped_batch(pool, burst)));
            cases.push(("pool_batch_coloured", piped_batch(coloured, burst)));
            cases.push((
                "pool_batch_in_place_coloured",
                piped_batch_in_place(coloured, burst),
            ));
        }
        cases.push(("pool", piped(single, burst)));
        cases.push(("pool_owned", piped(owned, burst)));
        if burst > 1 {
            cases.push(("pool_vec", piped_vec(pool, burst)));
        }
        for (name, mut run) in cases {
            group.bench_function(name, |b| b.iter_custom(&mut run));
        }
        {
            let mut run = piped_dpdk(mp, burst);
            group.bench_function("dpdk_mempool", |b| b.iter_custom(&mut run));
        }
        for (name, mut run) in [
            ("malloc", piped(malloc, burst)),
            ("posix_memalign_4096", piped(memalign, burst)),
            ("mimalloc", piped(mi, burst)),
            ("array_queue", piped(queue, burst)),
        ] {
            group.bench_function(name, |b| b.iter_custom(&mut run));
        }
        group.finish();
    }
    let stats = pool.stats();
    eprintln!(
        "pool 4 KiB class after the run: {} allocs, {} cache hits, {} shared hits",
        stats.classes[4].allocs, stats.classes[4].cache_hits, stats.classes[4].shared_hits
    );
}

fn main() {
    // DPDK first: the EAL makes this thread lcore 0 and pins it to CPU 0 (the host side).
    let eal = dpdk::eal().expect("DPDK EAL (-l 0-1 --no-pci -m 512)");
    cpu::pin(cpu::HOST);
    let (page, pages) = pool_pages(eal);
    println!("pools over {pages}");
    let pool: &'static Arc<Pool> = Box::leak(Box::new(Arc::new(make_pool(page, false))));
    let coloured: &'static Arc<Pool> = Box::leak(Box::new(Arc::new(make_pool(page, true))));
    let mempools = mempools();
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    benches(&mut criterion, pool, coloured, mempools);
    criterion.final_summary();
    if userdma_bench_support::wants_ratios() {
        ratios(pool, coloured, mempools, eal, pages);
    }
}
