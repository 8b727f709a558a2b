//! Descriptor ring benchmarks, each against baselines in the same run.
//!
//! - `handoff/{8B,64B}/burst{1,32}`: the pure submission handoff, the case that compares with
//!   an SPSC queue: descriptors handed from one thread to another. The ring writes them into
//!   DMA memory (one descriptor: `Queue::post_and_flush`; a burst, like rtrb's write chunk,
//!   waits for room for the whole burst with `Queue::room`, then `Queue::post_burst` and
//!   `Queue::flush`): one doorbell per burst, posted descriptors (no completion). The device
//!   thread reads the doorbell (`DeviceQueue::fetch`), then every announced descriptor, and
//!   writes its head back once (`DeviceQueue::release`). It reads them in one of two ways,
//!   both measured: `ring` takes the run at once (`DeviceQueue::pop_burst`: plain loads the
//!   compiler vectorises), `ring-pop` one at a time (`DeviceQueue::pop`: volatile loads, the
//!   loopback engine's way). Baselines carrying the same bytes per item: `rtrb` (a wait-free
//!   SPSC ring; the consumer takes a read chunk, or with `rtrb-pop` one `pop` per item),
//!   crossbeam's `ArrayQueue` (MPMC), and DPDK 22.11's `rte_ring` (SP/SC, 256 slots of the
//!   descriptor's size, driven from C by `userdma-bench-support` with the same loop: one
//!   enqueue, or room for the burst then one bulk enqueue; its consumer on CPU 1 dequeues up to
//!   32 at a time). One iteration is one burst; the throughput line gives
//!   the time per descriptor.
//!
//!   Which way of consuming is faster depends on the burst. With bursts of 32 the consumer's
//!   cost per item decides, and reading the run at once wins. With one descriptor per
//!   doorbell, a consumer that polls as fast as it can takes a few descriptors per pass and
//!   each pass pulls the doorbell's and the newest entries' cache lines away from the producer
//!   in the middle of its writes; a consumer that spends a little longer per item takes more
//!   per pass, the producer stalls less often, and the handoff as a whole goes faster (seen
//!   for both queues on a 2-vCPU VM: 20 to 50 descriptors per pass instead of about ten). So
//!   the ratio table compares each queue with its faster consumer in the same run, and prints
//!   both.
//! - `roundtrip`: the full submit -> complete path: the host submits one command (descriptor,
//!   payload into the in-flight table, doorbell), the device thread completes it (completion
//!   with phase), the host sees the completion (busy-polling) and takes the payload back;
//!   baselines: a pair of `rtrb` rings and a pair of `ArrayQueue`s, and `floor`, one value
//!   bounced between two cores through one cache line each way.
//! - `doorbell`: one 32-bit doorbell write, single-threaded, on the loopback device's BAR
//!   (shared memory): through the type-erased block (`DynBlock::write`: bounds check and a
//!   call through the backend) and through the block's `RawRegister` (one atomic store, what
//!   `ring::Doorbells` does), against a plain `AtomicU32` `Release` store.
//!
//! After criterion's report (or alone, with the filter `ratios-only`, which no criterion
//! benchmark matches), two ratio tables: ring / rtrb (each with its faster consumer, both
//! shown), ring / ArrayQueue and ring / DPDK per handoff case, with the CPU 0 <-> CPU 1
//! cache-line ping-pong before and after it (compare runs only when it agrees), and each round
//! trip against the floor. For
//! those, every side runs in nine alternating rounds of 60 ms (a fresh pair of threads each)
//! and the best round of each is kept, so a burst of load from elsewhere hits every side
//! alike; criterion's figures, taken one benchmark after another, can swing several-fold on a
//! shared machine.
//!
//! Host and device threads are pinned to CPUs 0 and 1 where the machine has them. On a busy
//! machine, run it under a real-time class so other load stays off the two CPUs:
//!
//! ```text
//! cargo bench --bench ring -- --warm-up-time 1 --measurement-time 3
//! cargo bench --bench ring -- ratios-only
//! chrt -f 50 target/release/deps/ring-<hash> --bench ratios-only
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use crossbeam_queue::ArrayQueue;
use userdma::dma::{SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::mmio::{Block, Shared, Width};
use userdma::ring::{
    Command, Config, DeviceQueue, Doorbells, Error, Layout, Memory, Queue, Status, Submission,
};
use userdma::zerocopy::{FromBytes, Immutable, IntoBytes};
use userdma_bench_support::{cpu, dpdk};

const DEPTH: u32 = 256;

/// An 8-byte descriptor.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable)]
#[zerocopy(crate = "userdma::zerocopy")]
struct Desc8 {
    id: u16,
    tag: u16,
    value: u32,
}
impl Submission for Desc8 {
    fn command_id(&self) -> u16 {
        self.id
    }
    fn set_command_id(&mut self, id: u16) {
        self.id = id;
    }
}

/// What each descriptor type gives the consumer to look at.
trait Item: Submission + Default + Send + 'static {
    const NAME: &'static str;
    fn make(i: u64) -> Self;
    fn value(&self) -> u64;
}
impl Item for Desc8 {
    const NAME: &'static str = "8B";
    fn make(i: u64) -> Self {
        Desc8 {
            id: 0,
            tag: 1,
            value: i as u32,
        }
    }
    fn value(&self) -> u64 {
        u64::from(self.value)
    }
}
impl Item for Command {
    const NAME: &'static str = "64B";
    fn make(i: u64) -> Self {
        Command {
            src: i,
            dst: i,
            len: 64,
            ..Command::default()
        }
    }
    fn value(&self) -> u64 {
        self.src
    }
}

/// A value on cache lines of its own (128 bytes: the pair of lines x86 cores prefetch
/// together), so that the harness's own shared words (the stop flag, the consumer's count, the
/// producer's state) never share a line with each other or with the queue under test: a
/// harness word next to a hot queue word would slow one side and not another by where the
/// allocator happened to put it.
#[repr(align(128))]
struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

fn set_affinity(cpus: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it; the call reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        // Best effort: a machine with one CPU (or a restricted mask) just runs unpinned.
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn pin(cpu: usize) {
    set_affinity(&[cpu]);
}

/// Spawns `f` on CPU 1 (the device side). The new thread starts with its parent's CPU mask, so
/// the parent (on CPU 0) widens it first: a thread that could only start on CPU 0 would wait
/// behind a spinning parent, for ever under a real-time scheduling class (`chrt -f`, which
/// keeps other load off the measurement).
fn spawn_device(f: impl FnOnce() + Send + 'static) -> thread::JoinHandle<()> {
    set_affinity(&[0, 1]);
    let handle = thread::spawn(move || {
        pin(1);
        f()
    });
    pin(0);
    handle
}

/// A host queue and its device view over loopback DMA memory; the doorbells sit on separate
/// cache lines of a shared-memory BAR (the loopback device's layout), lines wholly inside its
/// allocation so that no other heap object shares them.
fn pair<D: Submission, T: Send>(
    space: &SoftIommu,
) -> (Queue<D, Status, T>, DeviceQueue<D, Status>) {
    let layout = Layout::new::<D, Status>(DEPTH).unwrap();
    let len = layout.size().next_multiple_of(4096);
    let region = Region::builder(len)
        .page_size(PageSize::Base)
        .lock(false)
        .build()
        .unwrap();
    let mapping = Arc::new(space.map(Arc::new(region)).unwrap());
    let memory = Memory::from_mapping(mapping, 0, layout.size()).unwrap();
    let doorbells = Doorbells::new(Block::new(Shared::new(512)).erase(), 128, 384).unwrap();
    let queue = Queue::new(Config::new(DEPTH), memory.clone(), doorbells.clone(), None).unwrap();
    let window = space.translate(memory.iova(), layout.size()).unwrap();
    let device_memory = Memory::from_window(window, memory.iova()).unwrap();
    let device = DeviceQueue::new(0, DEPTH, device_memory, doorbells, None).unwrap();
    (queue, device)
}

/// A consumer thread pinned to CPU 1 that runs `step` until stopped; `step` returns how many
/// items it consumed, added to the shared count.
fn consumer(
    stop: &Arc<Line<AtomicBool>>,
    count: &Arc<Line<AtomicU64>>,
    mut step: impl FnMut() -> u64 + Send + 'static,
) -> thread::JoinHandle<()> {
    let (stop, count) = (Arc::clone(stop), Arc::clone(count));
    spawn_device(move || {
        while !stop.load(Ordering::Relaxed) {
            let n = step();
            if n > 0 {
                count.fetch_add(n, Ordering::Release);
            } else {
                std::hint::spin_loop();
            }
        }
    })
}

/// Runs `iters` bursts through `produce` and waits until the consumer has taken them all.
fn timed(iters: u64, burst: u64, count: &AtomicU64, mut produce: impl FnMut(u64)) -> Duration {
    let start_count = count.load(Ordering::Acquire);
    let start = Instant::now();
    for i in 0..iters {
        produce(i);
    }
    let target = start_count + iters * burst;
    while count.load(Ordering::Acquire) < target {
        std::hint::spin_loop();
    }
    start.elapsed()
}

/// A running handoff: the producer side (`run(iters)` hands over `iters` bursts and returns
/// the time taken until the consumer has them all) and its consumer thread, stopped on drop.
struct Handoff {
    run: Box<dyn FnMut(u64) -> Duration>,
    stop: Arc<Line<AtomicBool>>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Handoff {
    fn new(
        step: impl FnMut() -> u64 + Send + 'static,
        burst: u64,
        produce: impl FnMut(u64) + 'static,
    ) -> Handoff {
        let (stop, count) = (
            Arc::new(Line(AtomicBool::new(false))),
            Arc::new(Line(AtomicU64::new(0))),
        );
        let handle = consumer(&stop, &count, step);
        pin(0);
        Handoff {
            run: {
                // The producer's state (the queue under test) on lines of its own.
                let mut produce = Line(produce);
                Box::new(move |iters| timed(iters, burst, &count, &mut produce.0))
            },
            stop,
            handle: Some(handle),
        }
    }

    fn run(&mut self, iters: u64) -> Duration {
        (self.run)(iters)
    }
}

impl Drop for Handoff {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            handle.join().unwrap();
        }
    }
}

/// The ring: `post_and_flush`, or `post_burst` and one doorbell per burst, into DMA memory;
/// the device thread `fetch`es, reads every announced descriptor (`EACH`: one `pop` each, the
/// loopback engine's way; otherwise one `pop_burst`) and `release`s.
fn ring_handoff<D: Item, const EACH: bool>(burst: u64) -> Handoff {
    let space = SoftIommu::new(48).unwrap();
    let (mut queue, mut device) = pair::<D, ()>(&space);
    let step = move || {
        let mut sum = 0;
        device.fetch().unwrap();
        let n = if EACH {
            let mut n = 0;
            while let Some(d) = device.pop() {
                sum += d.value();
                n += 1;
            }
            n
        } else {
            device.pop_burst(u32::MAX, |d| sum += d.value())
        };
        device.release();
        black_box(sum);
        u64::from(n)
    };
    // Each burst size has a producer loop of its own (here and for the baselines), compiled
    // apart, so that neither's registers are spent on the other's state.
    if burst == 1 {
        return Handoff::new(step, burst, move |i| {
            // The DMA space the ring memory is mapped in lives as long as the producer.
            let _ = &space;
            // One descriptor, one doorbell: `post_and_flush`, three stores.
            let d = D::make(i);
            // SAFETY: the descriptor names no host memory.
            while let Err(error) = unsafe { queue.post_and_flush(d) } {
                // Full: let the device catch up (everything queued was announced).
                assert!(matches!(error, Error::Full { .. }), "{error}");
                std::hint::spin_loop();
            }
        });
    }
    Handoff::new(step, burst, move |i| {
        let _ = &space;
        // Like rtrb's write chunk: wait for room for the whole burst, then write it.
        let wanted = burst as u32;
        while queue.room(wanted).unwrap() < wanted {
            std::hint::spin_loop();
        }
        let mut descs = (0..burst).map(|k| D::make(i * burst + k));
        // SAFETY: the descriptors name no host memory.
        let n = unsafe { queue.post_burst(&mut descs) }.unwrap();
        debug_assert_eq!(n, wanted);
        // One doorbell per burst.
        queue.flush().unwrap();
    })
}

/// rtrb: `push`, or a write chunk per burst; the consumer takes every readable slot (`EACH`:
/// one `pop` each; otherwise as one read chunk).
fn rtrb_handoff<D: Item, const EACH: bool>(burst: u64) -> Handoff {
    let (mut tx, mut rx) = rtrb::RingBuffer::<D>::new(DEPTH as usize);
    let step = move || {
        if EACH {
            let (mut n, mut sum) = (0, 0);
            while let Ok(d) = rx.pop() {
                sum += d.value();
                n += 1;
            }
            black_box(sum);
            return n;
        }
        let n = rx.slots();
        if n == 0 {
            return 0;
        }
        let chunk = rx.read_chunk(n).unwrap();
        let (a, b) = chunk.as_slices();
        let sum: u64 = a.iter().chain(b).map(Item::value).sum();
        chunk.commit_all();
        black_box(sum);
        n as u64
    };
    if burst == 1 {
        return Handoff::new(step, burst, move |i| {
            let mut d = D::make(i);
            while let Err(rtrb::PushError::Full(back)) = tx.push(d) {
                d = back;
                std::hint::spin_loop();
            }
        });
    }
    Handoff::new(step, burst, move |i| {
        let chunk = loop {
            match tx.write_chunk_uninit(burst as usize) {
                Ok(chunk) => break chunk,
                Err(_) => std::hint::spin_loop(),
            }
        };
        chunk.fill_from_iter((0..burst).map(|k| D::make(i * burst + k)));
    })
}

/// DPDK's `rte_ring` (SP/SC, 256 slots, elements of `D`'s size): `rte_ring_sp_enqueue_elem`,
/// or waiting for room for the burst and one `rte_ring_sp_enqueue_bulk_elem`; the consumer on
/// lcore 1 (CPU 1) dequeues up to 32 at a time and adds up a field of each (see
/// `userdma-bench-support`).
fn dpdk_handoff<D: Item>(burst: u64) -> Handoff {
    let size = std::mem::size_of::<D>() as u32;
    let mut pair = dpdk::Pair::handoff(burst as u32, size).expect("DPDK handoff on lcore 1");
    Handoff {
        run: Box::new(move |iters| pair.run(iters * burst)),
        stop: Arc::new(Line(AtomicBool::new(false))),
        handle: None,
    }
}

/// crossbeam's `ArrayQueue`: one `push` per item; the consumer pops until empty.
fn array_queue_handoff<D: Item>(burst: u64) -> Handoff {
    let queue = Arc::new(ArrayQueue::<D>::new(DEPTH as usize));
    let rx = Arc::clone(&queue);
    let step = move || {
        let mut n = 0;
        let mut sum = 0;
        while let Some(d) = rx.pop() {
            sum += d.value();
            n += 1;
        }
        black_box(sum);
        n
    };
    Handoff::new(step, burst, move |i| {
        for k in 0..burst {
            let mut d = D::make(i * burst + k);
            while let Err(back) = queue.push(d) {
                d = back;
                std::hint::spin_loop();
            }
        }
    })
}

/// A named way to start a [`Handoff`] at a burst size.
type Maker = (&'static str, fn(u64) -> Handoff);

/// The handoffs of descriptor type `D`, by name: the ring and rtrb each with both ways of
/// consuming (the whole run at once, or one descriptor at a time), `ArrayQueue`, and DPDK's
/// `rte_ring`.
fn handoffs<D: Item>() -> [Maker; 6] {
    [
        ("ring", ring_handoff::<D, false>),
        ("ring-pop", ring_handoff::<D, true>),
        ("rtrb", rtrb_handoff::<D, false>),
        ("rtrb-pop", rtrb_handoff::<D, true>),
        ("ArrayQueue", array_queue_handoff::<D>),
        ("dpdk", dpdk_handoff::<D>),
    ]
}

fn handoff_cases<D: Item>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    burst: u64,
) {
    for (name, make) in handoffs::<D>() {
        let mut handoff = make(burst);
        c.bench_function(
            BenchmarkId::new(name, format!("{}/burst{burst}", D::NAME)),
            |b| b.iter_custom(|iters| handoff.run(iters)),
        );
    }
}

fn handoff(c: &mut Criterion) {
    let mut group = c.benchmark_group("handoff");
    for burst in [1u64, 32] {
        group.throughput(Throughput::Elements(burst));
        handoff_cases::<Desc8>(&mut group, burst);
        handoff_cases::<Command>(&mut group, burst);
    }
    group.finish();
}

/// How many alternating rounds the ratio tables take, and how long each: nine of 60 ms, or in
/// criterion's test mode (`-- --test`, which runs every benchmark once to check it works) one
/// of 2 ms.
fn rounds() -> (usize, Duration) {
    if std::env::args().any(|arg| arg == "--test") {
        (1, Duration::from_millis(2))
    } else {
        (9, Duration::from_millis(60))
    }
}

/// Nanoseconds per item of one round of about `time`: a fresh handoff (its own consumer
/// thread), warmed up, then timed over whole calls.
fn handoff_round(make: fn(u64) -> Handoff, burst: u64, time: Duration) -> f64 {
    let mut handoff = make(burst);
    let mut iters = 64u64;
    // Warm up, and find a call of about a millisecond (or of the whole round, if shorter).
    let call = time.min(Duration::from_millis(1));
    loop {
        let took = handoff.run(iters);
        if took >= call || iters >= 1 << 24 {
            break;
        }
        iters *= 2;
    }
    let (mut total, mut items) = (Duration::ZERO, 0u64);
    while total < time {
        total += handoff.run(iters);
        items += iters * burst;
    }
    total.as_nanos() as f64 / items as f64
}

/// The ratio table for the handoff: ring / rtrb and ring / ArrayQueue for each descriptor size
/// and burst, each queue with its faster way of consuming in this run (both are shown: which
/// one wins depends on the burst, see the module docs). All run in alternating short rounds
/// and the best round of each is kept, so all see the same machine (a burst of load from
/// elsewhere hits every side, not one).
fn handoff_ratios<D: Item>(burst: u64) {
    let cases = handoffs::<D>();
    let mut best = [f64::INFINITY; 6];
    let (count, time) = rounds();
    for _ in 0..count {
        for (k, (_, make)) in cases.iter().enumerate() {
            best[k] = best[k].min(handoff_round(*make, burst, time));
        }
    }
    let [burst_read, popped, chunk, rtrb_popped, array_queue, dpdk] = best;
    let (ring, rtrb) = (burst_read.min(popped), chunk.min(rtrb_popped));
    println!(
        "  {:>3} burst {burst:>2}: ring {ring:6.2} ns (pop_burst {burst_read:.2}, pop \
         {popped:.2}), rtrb {rtrb:6.2} ns (read chunk {chunk:.2}, pop {rtrb_popped:.2}), \
         ArrayQueue {array_queue:6.2} ns, DPDK rte_ring {dpdk:6.2} ns per descriptor; ring / \
         rtrb {:.2}, ring / ArrayQueue {:.2}, ring / DPDK {:.2}",
        D::NAME,
        ring / rtrb,
        ring / array_queue,
        ring / dpdk,
    );
}

/// Starts a device thread on CPU 1 running `step` until stopped (`step` spins itself when it
/// finds nothing), and returns the stop flag and the thread.
fn device_loop(
    mut step: impl FnMut() + Send + 'static,
) -> (Arc<Line<AtomicBool>>, thread::JoinHandle<()>) {
    let stop = Arc::new(Line(AtomicBool::new(false)));
    let s = Arc::clone(&stop);
    let handle = spawn_device(move || {
        while !s.load(Ordering::Relaxed) {
            step();
        }
    });
    pin(0);
    (stop, handle)
}

/// A running round trip: `run(iters)` does `iters` of them, one at a time.
fn trip(
    (stop, handle): (Arc<Line<AtomicBool>>, thread::JoinHandle<()>),
    once: impl FnMut(u64) + 'static,
) -> Handoff {
    let mut next = 0u64;
    // The host's state (the queue under test) on lines of its own.
    let mut once = Line(once);
    Handoff {
        run: Box::new(move |iters| {
            let start = Instant::now();
            for _ in 0..iters {
                next += 1;
                (once.0)(next);
            }
            start.elapsed()
        }),
        stop,
        handle: Some(handle),
    }
}

/// The floor: one value bounced between the cores, one cache line each way.
fn floor_trip(_: u64) -> Handoff {
    let ping = Arc::new(Line(AtomicU64::new(0)));
    let pong = Arc::new(Line(AtomicU64::new(0)));
    let (p, q) = (Arc::clone(&ping), Arc::clone(&pong));
    let mut last = 0;
    let device = device_loop(move || {
        let v = p.load(Ordering::Acquire);
        if v != last {
            last = v;
            q.store(v, Ordering::Release);
        } else {
            std::hint::spin_loop();
        }
    });
    trip(device, move |next| {
        ping.store(next, Ordering::Release);
        while pong.load(Ordering::Acquire) != next {
            std::hint::spin_loop();
        }
    })
}

/// The ring: submit (descriptor, payload into the in-flight table, doorbell), the device
/// completes it, the host polls the completion and takes the payload back.
fn ring_trip(_: u64) -> Handoff {
    let space = SoftIommu::new(48).unwrap();
    let (mut queue, mut device) = pair::<Command, ()>(&space);
    let device = device_loop(move || {
        device.fetch().unwrap();
        let mut any = false;
        while let Some(command) = device.pop() {
            device
                .complete(Status::new(command.command_id, 0, command.src))
                .unwrap();
            any = true;
        }
        if any {
            device.release();
            device.interrupt().unwrap();
        } else {
            std::hint::spin_loop();
        }
    });
    trip(device, move |next| {
        // The DMA space the ring memory is mapped in lives as long as the queue.
        let _ = &space;
        queue.submit(Command::make(next), ()).unwrap();
        loop {
            if let Some(done) = queue.poll_one().unwrap() {
                black_box(done.entry.result);
                break;
            }
            std::hint::spin_loop();
        }
    })
}

/// rtrb: one ring each way.
fn rtrb_trip(_: u64) -> Handoff {
    let (mut to_dev, mut dev_rx) = rtrb::RingBuffer::<Command>::new(DEPTH as usize);
    let (mut dev_tx, mut from_dev) = rtrb::RingBuffer::<Status>::new(DEPTH as usize);
    let device = device_loop(move || match dev_rx.pop() {
        Ok(command) => {
            let _ = dev_tx.push(Status::new(command.command_id, 0, command.src));
        }
        Err(_) => std::hint::spin_loop(),
    });
    trip(device, move |next| {
        let _ = to_dev.push(Command::make(next));
        loop {
            if let Ok(status) = from_dev.pop() {
                black_box(status.result);
                break;
            }
            std::hint::spin_loop();
        }
    })
}

/// ArrayQueue: one queue each way.
fn array_queue_trip(_: u64) -> Handoff {
    let to_dev = Arc::new(ArrayQueue::<Command>::new(DEPTH as usize));
    let from_dev = Arc::new(ArrayQueue::<Status>::new(DEPTH as usize));
    let (rx, tx) = (Arc::clone(&to_dev), Arc::clone(&from_dev));
    let device = device_loop(move || match rx.pop() {
        Some(command) => {
            let _ = tx.push(Status::new(command.command_id, 0, command.src));
        }
        None => std::hint::spin_loop(),
    });
    trip(device, move |next| {
        let _ = to_dev.push(Command::make(next));
        loop {
            if let Some(status) = from_dev.pop() {
                black_box(status.result);
                break;
            }
            std::hint::spin_loop();
        }
    })
}

/// The round trips, by name.
const TRIPS: [Maker; 4] = [
    ("floor", floor_trip),
    ("ring", ring_trip),
    ("rtrb", rtrb_trip),
    ("ArrayQueue", array_queue_trip),
];

fn roundtrip(c: &mut Criterion) {
    let mut group = c.benchmark_group("roundtrip");
    for (name, make) in TRIPS {
        let mut trip = make(1);
        group.bench_function(name, |b| b.iter_custom(|iters| trip.run(iters)));
    }
    group.finish();
}

/// The round-trip table: each against the floor, in alternating rounds (best of each kept).
fn roundtrip_ratios() {
    let mut best = [f64::INFINITY; 4];
    let (count, time) = rounds();
    for _ in 0..count {
        for (k, (_, make)) in TRIPS.iter().enumerate() {
            best[k] = best[k].min(handoff_round(*make, 1, time));
        }
    }
    let line: Vec<String> = TRIPS
        .iter()
        .zip(best)
        .map(|((name, _), ns)| format!("{name} {ns:.0} ns ({:.2}x)", ns / best[0]))
        .collect();
    println!("  round trip: {}", line.join(", "));
}

/// Handoff and round-trip ratios, after criterion's report or alone (`-- ratios-only`).
fn ratios() {
    let (count, _) = rounds();
    if count == 1 {
        println!("\n(test mode: one short round each, to check the tables run; not a measurement)");
    }
    let eal = dpdk::eal().expect("DPDK EAL");
    let before = cpu::pingpong(Duration::from_millis(20));
    println!(
        "\ndescriptor handoff, best of {count} alternating rounds (CPU 0 -> CPU 1; {}); \
         ping-pong {before:.0} ns before:",
        eal.memory()
    );
    for burst in [1, 32] {
        handoff_ratios::<Desc8>(burst);
        handoff_ratios::<Command>(burst);
    }
    let after = cpu::pingpong(Duration::from_millis(20));
    println!("  ping-pong {after:.0} ns after (CPU 0 <-> CPU 1 round trip of one cache line)");
    println!(
        "submit -> complete round trip, best of {count} alternating rounds, against the floor:"
    );
    roundtrip_ratios();
}

fn doorbell(c: &mut Criterion) {
    let mut group = c.benchmark_group("doorbell");
    pin(0);
    let block = Block::new(Shared::new(512)).erase();
    let mut value = 0u32;
    group.bench_function("block", |b| {
        b.iter(|| {
            value = value.wrapping_add(1);
            block.write::<u32>(black_box(128), value).unwrap();
        })
    });
    let register = block
        .raw_register(128, Width::U32)
        .unwrap()
        .expect("a shared-memory BAR serves 32-bit registers directly");
    group.bench_function("raw", |b| {
        b.iter(|| {
            value = value.wrapping_add(1);
            // SAFETY: `block`, whose backend handed out the register, lives; it is 32-bit.
            unsafe { black_box(&register).write_u32(value) };
        })
    });
    let word = AtomicU32::new(0);
    group.bench_function("AtomicU32", |b| {
        b.iter(|| {
            value = value.wrapping_add(1);
            black_box(&word).store(value, Ordering::Release);
        })
    });
    group.finish();
}

fn main() {
    // DPDK first: the EAL makes this thread lcore 0 (pinned to CPU 0, the host side) and keeps
    // lcore 1 (CPU 1) for its consumers.
    dpdk::eal().expect("DPDK EAL (-l 0-1 --no-pci -m 512)");
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .configure_from_args();
    handoff(&mut criterion);
    roundtrip(&mut criterion);
    doorbell(&mut criterion);
    criterion.final_summary();
    if userdma_bench_support::wants_ratios() {
        ratios();
    }
}
