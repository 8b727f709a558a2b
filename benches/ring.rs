//! Descriptor ring benchmarks, each against baselines in the same run.
//!
//! - `handoff/{8B,64B}/burst{1,32}`: the pure submission handoff, the case that compares with
//!   an SPSC queue: descriptors handed from one thread to another. The ring writes them into
//!   DMA memory (`Queue::post`, or `Queue::post_burst` for a burst) and rings one doorbell per
//!   burst (posted descriptors: no completion); the device thread reads the doorbell, then the
//!   descriptors (`DeviceQueue::fetch`, `DeviceQueue::pop_burst`) and writes its head back
//!   (`DeviceQueue::release`), as the loopback device's engine does. Baselines carrying the
//!   same bytes per item: `rtrb` (a wait-free SPSC ring, chunk API for bursts) and crossbeam's
//!   `ArrayQueue` (MPMC). One iteration is one burst; the throughput line gives the time per
//!   descriptor.
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
//! Host and device threads are pinned to CPUs 0 and 1 where the machine has them. On a busy
//! machine, run it under a real-time class so other load stays off the two CPUs:
//!
//! ```text
//! cargo bench --bench ring -- --warm-up-time 1 --measurement-time 3
//! chrt -f 50 target/release/deps/ring-<hash> --bench --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbeam_queue::ArrayQueue;
use userdma::dma::{Loopback, Space};
use userdma::memory::{PageSize, Region};
use userdma::mmio::{Block, Shared, Width};
use userdma::ring::{
    Command, Config, DeviceQueue, Doorbells, Layout, Memory, Pod, Queue, Status, Submission,
};

const DEPTH: u32 = 256;

/// An 8-byte descriptor.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Desc8 {
    id: u16,
    tag: u16,
    value: u32,
}
// SAFETY: repr(C), integers only, no padding (2 + 2 + 4 = 8).
unsafe impl Pod for Desc8 {}
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
fn pair<D: Submission, T: Send>(space: &Loopback) -> (Queue<D, Status, T>, DeviceQueue<D, Status>) {
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
    stop: &Arc<AtomicBool>,
    count: &Arc<AtomicU64>,
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

fn handoff_ring<D: Item>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    burst: u64,
) {
    let space = Loopback::new(48).unwrap();
    let (mut queue, mut device) = pair::<D, ()>(&space);
    let (stop, count) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let handle = consumer(&stop, &count, move || {
        let mut sum = 0;
        device.fetch().unwrap();
        let n = device.pop_burst(u32::MAX, |d| sum += d.value());
        device.release();
        black_box(sum);
        u64::from(n)
    });
    pin(0);
    c.bench_function(
        BenchmarkId::new("ring", format!("{}/burst{burst}", D::NAME)),
        |b| {
            b.iter_custom(|iters| {
                timed(iters, burst, &count, |i| {
                    if burst == 1 {
                        let mut d = D::make(i);
                        // SAFETY: the descriptor names no host memory.
                        while let Err(rejected) = unsafe { queue.post(d) } {
                            // Full: announce what is queued and let the device catch up.
                            d = rejected.descriptor;
                            queue.flush().unwrap();
                            std::hint::spin_loop();
                        }
                    } else {
                        let mut descs = (0..burst).map(|k| D::make(i * burst + k));
                        let mut done = 0;
                        while done < burst {
                            // SAFETY: the descriptors name no host memory.
                            let n = unsafe { queue.post_burst(&mut descs) }.unwrap();
                            if n == 0 {
                                queue.flush().unwrap();
                                std::hint::spin_loop();
                            }
                            done += u64::from(n);
                        }
                    }
                    // One doorbell per burst.
                    queue.flush().unwrap();
                })
            })
        },
    );
    stop.store(true, Ordering::Relaxed);
    handle.join().unwrap();
}

fn handoff_rtrb<D: Item>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    burst: u64,
) {
    let (mut tx, mut rx) = rtrb::RingBuffer::<D>::new(DEPTH as usize);
    let (stop, count) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let handle = consumer(&stop, &count, move || {
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
    });
    pin(0);
    c.bench_function(
        BenchmarkId::new("rtrb", format!("{}/burst{burst}", D::NAME)),
        |b| {
            b.iter_custom(|iters| {
                timed(iters, burst, &count, |i| {
                    let n = burst as usize;
                    if n == 1 {
                        let mut d = D::make(i);
                        while let Err(rtrb::PushError::Full(back)) = tx.push(d) {
                            d = back;
                            std::hint::spin_loop();
                        }
                    } else {
                        let chunk = loop {
                            match tx.write_chunk_uninit(n) {
                                Ok(chunk) => break chunk,
                                Err(_) => std::hint::spin_loop(),
                            }
                        };
                        chunk.fill_from_iter((0..burst).map(|k| D::make(i * burst + k)));
                    }
                })
            })
        },
    );
    stop.store(true, Ordering::Relaxed);
    handle.join().unwrap();
}

fn handoff_array_queue<D: Item>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    burst: u64,
) {
    let queue = Arc::new(ArrayQueue::<D>::new(DEPTH as usize));
    let rx = Arc::clone(&queue);
    let (stop, count) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let handle = consumer(&stop, &count, move || {
        let mut n = 0;
        let mut sum = 0;
        while let Some(d) = rx.pop() {
            sum += d.value();
            n += 1;
        }
        black_box(sum);
        n
    });
    pin(0);
    c.bench_function(
        BenchmarkId::new("ArrayQueue", format!("{}/burst{burst}", D::NAME)),
        |b| {
            b.iter_custom(|iters| {
                timed(iters, burst, &count, |i| {
                    for k in 0..burst {
                        let mut d = D::make(i * burst + k);
                        while let Err(back) = queue.push(d) {
                            d = back;
                            std::hint::spin_loop();
                        }
                    }
                })
            })
        },
    );
    stop.store(true, Ordering::Relaxed);
    handle.join().unwrap();
}

fn handoff(c: &mut Criterion) {
    let mut group = c.benchmark_group("handoff");
    for burst in [1u64, 32] {
        group.throughput(Throughput::Elements(burst));
        handoff_ring::<Desc8>(&mut group, burst);
        handoff_rtrb::<Desc8>(&mut group, burst);
        handoff_array_queue::<Desc8>(&mut group, burst);
        handoff_ring::<Command>(&mut group, burst);
        handoff_rtrb::<Command>(&mut group, burst);
        handoff_array_queue::<Command>(&mut group, burst);
    }
    group.finish();
}

fn roundtrip(c: &mut Criterion) {
    let mut group = c.benchmark_group("roundtrip");
    pin(0);

    // The floor: one cache line each way.
    {
        let ping = Arc::new(AtomicU64::new(0));
        let pong = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, q, s) = (Arc::clone(&ping), Arc::clone(&pong), Arc::clone(&stop));
        let handle = spawn_device(move || {
            let mut last = 0;
            while !s.load(Ordering::Relaxed) {
                let v = p.load(Ordering::Acquire);
                if v != last {
                    last = v;
                    q.store(v, Ordering::Release);
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut next = 0u64;
        group.bench_function("floor", |b| {
            b.iter(|| {
                next += 1;
                ping.store(next, Ordering::Release);
                while pong.load(Ordering::Acquire) != next {
                    std::hint::spin_loop();
                }
            })
        });
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
    }

    // The ring: submit, the device completes, poll the completion.
    {
        let space = Loopback::new(48).unwrap();
        let (mut queue, mut device) = pair::<Command, ()>(&space);
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let handle = spawn_device(move || {
            while !s.load(Ordering::Relaxed) {
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
            }
        });
        let mut next = 0u64;
        group.bench_function("ring", |b| {
            b.iter(|| {
                next += 1;
                queue.submit(Command::make(next), ()).unwrap();
                loop {
                    if let Some(done) = queue.poll_one().unwrap() {
                        black_box(done.entry.result);
                        break;
                    }
                    std::hint::spin_loop();
                }
            })
        });
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
    }

    // rtrb: one ring each way.
    {
        let (mut to_dev, mut dev_rx) = rtrb::RingBuffer::<Command>::new(DEPTH as usize);
        let (mut dev_tx, mut from_dev) = rtrb::RingBuffer::<Status>::new(DEPTH as usize);
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let handle = spawn_device(move || {
            while !s.load(Ordering::Relaxed) {
                match dev_rx.pop() {
                    Ok(command) => {
                        let _ = dev_tx.push(Status::new(command.command_id, 0, command.src));
                    }
                    Err(_) => std::hint::spin_loop(),
                }
            }
        });
        let mut next = 0u64;
        group.bench_function("rtrb", |b| {
            b.iter(|| {
                next += 1;
                let _ = to_dev.push(Command::make(next));
                loop {
                    if let Ok(status) = from_dev.pop() {
                        black_box(status.result);
                        break;
                    }
                    std::hint::spin_loop();
                }
            })
        });
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
    }

    // ArrayQueue: one queue each way.
    {
        let to_dev = Arc::new(ArrayQueue::<Command>::new(DEPTH as usize));
        let from_dev = Arc::new(ArrayQueue::<Status>::new(DEPTH as usize));
        let (rx, tx) = (Arc::clone(&to_dev), Arc::clone(&from_dev));
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let handle = spawn_device(move || {
            while !s.load(Ordering::Relaxed) {
                match rx.pop() {
                    Some(command) => {
                        let _ = tx.push(Status::new(command.command_id, 0, command.src));
                    }
                    None => std::hint::spin_loop(),
                }
            }
        });
        let mut next = 0u64;
        group.bench_function("ArrayQueue", |b| {
            b.iter(|| {
                next += 1;
                let _ = to_dev.push(Command::make(next));
                loop {
                    if let Some(status) = from_dev.pop() {
                        black_box(status.result);
                        break;
                    }
                    std::hint::spin_loop();
                }
            })
        });
        stop.store(true, Ordering::Relaxed);
        handle.join().unwrap();
    }
    group.finish();
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

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = handoff, roundtrip, doorbell
}
criterion_main!(benches);
