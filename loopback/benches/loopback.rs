//! Loopback device copy bandwidth against plain `memcpy` of the same sizes, in the same run.
//!
//! - `copy/memcpy/{4K,64K,1M}`: 32 copies of the size between two ordinary buffers (the
//!   baseline: what one core moves).
//! - `copy/loopback/{4K,64K,1M}`: 32 host-to-device descriptors of the size through a
//!   zero-cost loopback device (one doorbell, the engine thread copies, the host busy-polls the
//!   32 completions): the ring, the translation and the engine on top of the same copies, and
//!   one round trip per 32 (the engine idles while the host sees the last completion and
//!   queues the next 32).
//! - `copy/loopback_streamed/{4K,64K,1M}`: the same 32 descriptors, queued (one doorbell) while
//!   the 32 before them run, then the older 32 reaped: the queue is never empty, as a host that
//!   moves bulk data keeps it, so this is the device's copy bandwidth; the difference from
//!   `loopback` is the round trip.
//!
//! Like with like: each side copies the same bytes the same number of times (one copy per
//! descriptor: a host-to-device transfer is one copy, as one `memcpy` is), from a source and
//! into a destination that stay in the copying core's caches on both sides, each starting at a
//! page boundary on both sides.
//!
//! Where this process may use CPUs 0 and 1, the engine is pinned to CPU 1
//! (`Config::engine_cpu`) and the host thread to CPU 0, and the memcpy baseline runs on CPU 1:
//! the core that does the loopback's copies does the baseline's, and no run measures two
//! threads sharing a core or a thread the scheduler moved.
//!
//! After criterion's report, alternating short rounds of each print the ratios loopback /
//! memcpy and streamed / memcpy per size: the median of the ratios of each loopback round to the
//! memcpy round just before it, with their range (the target, for the device's bandwidth, is
//! streamed at least 0.9 from 64 KiB up). Run nothing but the ratios with
//! `cargo bench --bench loopback -- ratios-only` (a filter no criterion benchmark matches),
//! and only some sizes' lines with `USERDMA_BENCH_SIZES=64K` (comma-separated).
//! The table comes with the CPU 0 <-> CPU 1 cache-line ping-pong taken before and after it:
//! every completion the engine writes is a line the polling host reads, so the loopback's
//! per-descriptor cost follows the VM's cross-core state (compare tables only between runs
//! whose ping-pong agrees).
//!
//! ```text
//! cargo bench --bench loopback
//! cargo bench --bench loopback -- ratios-only
//! chrt -f 50 target/release/deps/loopback-<hash> --bench ratios-only
//! ```

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use userdma::device::Device;
use userdma::dma::Mapping;
use userdma::memory::{PageSize, Region};
use userdma::ring::{self, Command, Queue, Status};
use userdma_bench_support::cpu;
use userdma_loopback::{Config, Cost, Loopback, Opcode, Wait};

const SIZES: [(usize, &str); 3] = [(4 << 10, "4K"), (64 << 10, "64K"), (1 << 20, "1M")];
/// Copies per iteration.
const BATCH: usize = 32;

/// Where the threads run when this process may use CPUs 0 and 1: the engine on 1, the host
/// thread polling it on 0, and the memcpy baseline on 1 too, the core that does the loopback's
/// copies (cores of one machine need not copy equally fast).
const HOST_CPU: usize = 0;
const ENGINE_CPU: usize = 1;

/// Whether this process may use CPUs 0 and 1.
fn two_cpus() -> bool {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it in; CPU_ISSET reads
    // bits 0 and 1, inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0
            && libc::CPU_ISSET(HOST_CPU, &set)
            && libc::CPU_ISSET(ENGINE_CPU, &set)
    }
}

/// Moves the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes a bit inside it (cpu is
    // 0 or 1); the kernel reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        // Best effort: unpinned, the figures only get noisier.
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// A zero-cost device, one polled queue, and 1 MiB of host memory mapped for it.
struct Rig {
    queue: Queue<Command, Status, ()>,
    host: Mapping,
    device: Arc<Loopback>,
    /// Threads pinned (see [`ENGINE_CPU`]).
    pinned: bool,
}

impl Rig {
    fn new() -> Rig {
        let config = Config::default()
            .cost(Cost::zero())
            .queues(1)
            .memory_size(2 << 20)
            .max_burst(BATCH as u32)
            .idle_spin(Duration::from_millis(2));
        // The engine on a core of its own, the host (polling, and copying for the baseline)
        // on another: no run measures two threads sharing a core, or a thread that migrated.
        let pinned = two_cpus();
        let config = if pinned {
            pin(HOST_CPU);
            config.engine_cpu(ENGINE_CPU as u32)
        } else {
            config
        };
        let device = Arc::new(Loopback::new(config).expect("loopback device"));
        let region = Region::builder(1 << 20)
            .page_size(PageSize::Base)
            .memfd()
            .lock(false)
            .build()
            .expect("host memory");
        let host = device.dma_space().map(Arc::new(region)).expect("mapped");
        host.slice().fill(0x5a);
        // Room for two batches (a streamed one queued behind the one running) and the
        // ring's reserved slot, in a power-of-two depth.
        let depth = (2 * BATCH as u32 + 1).next_power_of_two();
        let queue = device
            .open_queue(ring::Config::new(depth), Wait::Poll)
            .expect("queue");
        Rig {
            queue,
            host,
            device,
            pinned,
        }
    }

    /// Runs `f` on the engine's core (the baseline's place), then comes back to the host's.
    fn on_engine_cpu<R>(&self, f: impl FnOnce() -> R) -> R {
        if !self.pinned {
            return f();
        }
        pin(ENGINE_CPU);
        let result = f();
        pin(HOST_CPU);
        result
    }

    /// `BATCH` host-to-device copies of `size` bytes: one doorbell, then poll them all back.
    fn copy(&mut self, size: usize) {
        self.submit(size);
        self.reap_to(0);
    }

    /// `BATCH` host-to-device copies of `size` bytes queued behind the `BATCH` in flight (the
    /// first call queues two batches), then the older `BATCH` polled back: the engine finds
    /// the next batch queued when it finishes one. [`Rig::drain`] ends the stream.
    fn stream(&mut self, size: usize) {
        if self.queue.in_flight() == 0 {
            self.submit(size);
        }
        self.submit(size);
        self.reap_to(BATCH);
    }

    /// Waits for every copy in flight, so the engine is idle (before a memcpy round on its
    /// core, say).
    fn drain(&mut self) {
        self.reap_to(0);
    }

    /// Queues `BATCH` host-to-device copies of `size` bytes and rings the doorbell once.
    fn submit(&mut self, size: usize) {
        let command = Command {
            opcode: Opcode::ToDevice as u8,
            src: self.host.iova(0).expect("mapped").raw(),
            dst: 0,
            len: size as u64,
            ..Command::default()
        };
        for _ in 0..BATCH {
            self.queue.push(command, ()).expect("room");
        }
        self.queue.flush().expect("doorbell");
    }

    /// Busy-polls completions until at most `left` copies are in flight.
    fn reap_to(&mut self, left: usize) {
        let mut idle = 0u32;
        while self.queue.in_flight() > left {
            let want = self.queue.in_flight() - left;
            let got = self
                .queue
                .reap(want, |done| {
                    assert!(done.entry.is_success());
                })
                .expect("completions");
            idle = if got == 0 { idle + 1 } else { 0 };
            if idle % 64 == 63 {
                // Let the engine run if it shares this core (the machine may have few).
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// 1 MiB of ordinary memory for the baseline, starting at a page boundary as the loopback's
/// source (offset 0 of its host mapping) and destination (offset 0 of device memory) do: the
/// allocator's 1 MiB blocks start 16 bytes past a page, and `memcpy` from and to addresses off
/// a 64-byte boundary is slower (at 4 KiB, less than half as fast on the development VM), which
/// would flatter the loopback.
struct Buffers(Vec<u8>);

impl Buffers {
    fn new(byte: u8) -> Buffers {
        Buffers(vec![byte; (1 << 20) + 4096])
    }

    fn page(&mut self) -> &mut [u8] {
        let at = self.0.as_ptr().align_offset(4096);
        &mut self.0[at..at + (1 << 20)]
    }
}

/// `BATCH` plain copies of `size` bytes.
fn memcpy(src: &[u8], dst: &mut [u8], size: usize) {
    for _ in 0..BATCH {
        dst[..size].copy_from_slice(black_box(&src[..size]));
        black_box(&mut *dst);
    }
}

fn copy(c: &mut Criterion, rig: &mut Rig) {
    let (mut src, mut dst) = (Buffers::new(0x5a), Buffers::new(0));
    let (src, dst) = (src.page(), dst.page());
    let mut group = c.benchmark_group("copy");
    for (size, name) in SIZES {
        group.throughput(Throughput::Bytes((size * BATCH) as u64));
        rig.on_engine_cpu(|| {
            group.bench_function(BenchmarkId::new("memcpy", name), |b| {
                b.iter(|| memcpy(src, dst, size))
            })
        });
        group.bench_function(BenchmarkId::new("loopback", name), |b| {
            b.iter(|| rig.copy(size))
        });
        group.bench_function(BenchmarkId::new("loopback_streamed", name), |b| {
            b.iter(|| rig.stream(size))
        });
        rig.drain();
    }
    group.finish();
}

/// Bytes per second of `f` (which moves `bytes` per call) over about `time`.
fn rate(bytes: usize, time: Duration, mut f: impl FnMut()) -> f64 {
    for _ in 0..16 {
        f();
    }
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < time {
        f();
        calls += 1;
    }
    (calls as f64 * bytes as f64) / start.elapsed().as_secs_f64()
}

/// One size's rounds: bytes per second of each memcpy round and of the loopback round after it.
struct Rounds {
    /// (memcpy, loopback one batch at a time), adjacent rounds.
    batched: Vec<(f64, f64)>,
    /// (memcpy, loopback streamed), adjacent rounds.
    streamed: Vec<(f64, f64)>,
}

impl Rounds {
    /// Median, least and greatest of loopback / memcpy over `pairs`.
    fn ratio(pairs: &[(f64, f64)]) -> (f64, f64, f64) {
        let mut ratios: Vec<f64> = pairs
            .iter()
            .map(|&(plain, device)| device / plain)
            .collect();
        ratios.sort_by(f64::total_cmp);
        (
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1],
        )
    }

    /// The best loopback round of `pairs`, bytes per second.
    fn best(pairs: &[(f64, f64)]) -> f64 {
        pairs.iter().map(|p| p.1).fold(0.0, f64::max)
    }

    /// Every memcpy round, bytes per second.
    fn plain(&self) -> impl Iterator<Item = f64> + '_ {
        self.batched.iter().chain(&self.streamed).map(|p| p.0)
    }
}

/// The ratio table: loopback / memcpy and streamed / memcpy per size. Memcpy and loopback are
/// measured in alternating short rounds, each loopback round (one batch at a time, then
/// streamed) right after a memcpy round, and each ratio is the median of those pairs' ratios
/// (with their range): the two sides of a pair see the same machine, and the median is not
/// decided by one round that a burst of load from another process slowed or spared. The best
/// round of each side is printed too, and the engine's mean busy time per descriptor next to
/// the mean time of one `memcpy` of the size (their difference is what a descriptor costs
/// beyond its copy).
fn ratios(rig: &mut Rig) {
    let (mut src, mut dst) = (Buffers::new(0x5a), Buffers::new(0));
    let (src, dst) = (src.page(), dst.page());
    if std::env::args().any(|arg| arg == "--test") {
        println!("\n(test mode: one short round each, to check the table runs; not a measurement)");
    }
    let pingpong = |rig: &Rig| {
        if rig.pinned {
            // Leaves this thread on HOST_CPU, where it was.
            format!("{:.0} ns", cpu::pingpong(Duration::from_millis(20)))
        } else {
            "not taken (CPUs 0 and 1 not both available)".to_owned()
        }
    };
    println!(
        "\nloopback copy bandwidth / memcpy bandwidth (same run, zero-cost model; `batched`: 32 \
         descriptors, then all polled back; `streamed`: 32 queued behind the 32 running, the \
         device's bandwidth; ping-pong {} before):",
        pingpong(rig)
    );
    for (size, name) in SIZES.into_iter().filter(|(_, name)| wanted(name)) {
        let bytes = size * BATCH;
        // Eleven rounds of each of 100 ms; in criterion's test mode (`-- --test`: every
        // benchmark once, to check it works) one of 2 ms.
        let (rounds, round) = if std::env::args().any(|arg| arg == "--test") {
            (1, Duration::from_millis(2))
        } else {
            (11, Duration::from_millis(100))
        };
        let mut all = Rounds {
            batched: Vec::with_capacity(rounds),
            streamed: Vec::with_capacity(rounds),
        };
        let before = rig.device.counters().expect("counters");
        for _ in 0..rounds {
            let plain = rig.on_engine_cpu(|| rate(bytes, round, || memcpy(src, dst, size)));
            let device = rate(bytes, round, || rig.copy(size));
            all.batched.push((plain, device));
            let plain = rig.on_engine_cpu(|| rate(bytes, round, || memcpy(src, dst, size)));
            let device = rate(bytes, round, || rig.stream(size));
            // The engine idle again before the next memcpy round on its core.
            rig.drain();
            all.streamed.push((plain, device));
        }
        let after = rig.device.counters().expect("counters");
        let busy = (after.busy_ns - before.busy_ns) as f64
            / (after.descriptors - before.descriptors).max(1) as f64;
        // Rounds of equal length: the mean time of one copy is the mean of the rounds' times.
        let copy_ns =
            all.plain().map(|plain| size as f64 / plain).sum::<f64>() * 1e9 / (2 * rounds) as f64;
        let (batched, streamed) = (Rounds::ratio(&all.batched), Rounds::ratio(&all.streamed));
        println!(
            "  {name:>4}: batched {:.2} ({:.2}-{:.2}), streamed {:.2} ({:.2}-{:.2}); best memcpy \
             {:6.2} GB/s, best batched {:6.2} GB/s, best streamed {:6.2} GB/s; engine busy \
             {busy:.0} ns per descriptor, memcpy {copy_ns:.0} ns per copy",
            batched.0,
            batched.1,
            batched.2,
            streamed.0,
            streamed.1,
            streamed.2,
            all.plain().fold(0.0, f64::max) / 1e9,
            Rounds::best(&all.batched) / 1e9,
            Rounds::best(&all.streamed) / 1e9,
        );
    }
    println!("  ping-pong {} after", pingpong(rig));
}

/// Whether the table's line for size `name` is wanted: every size, unless
/// `USERDMA_BENCH_SIZES` names some (comma-separated: `USERDMA_BENCH_SIZES=64K,1M`).
fn wanted(name: &str) -> bool {
    std::env::var("USERDMA_BENCH_SIZES").map_or(true, |sizes| {
        sizes.split(',').any(|size| size.trim() == name)
    })
}

fn main() {
    let mut rig = Rig::new();
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
        .configure_from_args();
    copy(&mut criterion, &mut rig);
    criterion.final_summary();
    ratios(&mut rig);
}
