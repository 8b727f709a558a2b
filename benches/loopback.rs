//! Loopback device copy bandwidth against plain `memcpy` of the same sizes, in the same run.
//!
//! - `copy/memcpy/{4K,64K,1M}`: 32 copies of the size between two ordinary buffers (the
//!   baseline: what one core moves).
//! - `copy/loopback/{4K,64K,1M}`: 32 host-to-device descriptors of the size through a
//!   zero-cost loopback device (one doorbell, the engine thread copies, the host busy-polls the
//!   32 completions): the ring, the translation and the engine on top of the same copies.
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
//! After criterion's report, alternating short rounds of each print the ratio loopback / memcpy
//! per size: the median of the ratios of adjacent pairs of rounds, with their range (the target
//! is at least 0.9 from 64 KiB up). Run nothing but the ratios with
//! `cargo bench --bench loopback -- ratios-only` (a filter no criterion benchmark matches).
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
use userdma::device::loopback::{Config, Cost, Loopback, Opcode, Wait};
use userdma::device::Device;
use userdma::dma::Mapping;
use userdma::memory::{PageSize, Region};
use userdma::ring::{self, Command, Queue, Status};
use userdma_bench_support::cpu;

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
        let queue = device
            .open_queue(ring::Config::new(64), Wait::Poll)
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
        let mut left = BATCH;
        let mut idle = 0u32;
        while left > 0 {
            let got = self
                .queue
                .reap(left, |done| {
                    assert!(done.entry.is_success());
                })
                .expect("completions");
            left -= got;
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

/// The ratio table: loopback / memcpy per size. The two are measured in alternating short
/// rounds, each loopback round right after a memcpy round, and the ratio is the median of those
/// pairs' ratios (with their range): the two sides of a pair see the same machine, and the
/// median is not decided by one round that a burst of load from another process slowed or
/// spared. The best round of each side is printed too, and the engine's mean busy time per
/// descriptor next to the mean time of one `memcpy` of the size (their difference is what a
/// descriptor costs beyond its copy).
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
        "\nloopback copy bandwidth / memcpy bandwidth (same run, zero-cost model; ping-pong {} \
         before):",
        pingpong(rig)
    );
    for (size, name) in SIZES {
        let bytes = size * BATCH;
        // Eleven pairs of rounds of 100 ms; in criterion's test mode (`-- --test`: every
        // benchmark once, to check it works) one of 2 ms.
        let (rounds, round) = if std::env::args().any(|arg| arg == "--test") {
            (1, Duration::from_millis(2))
        } else {
            (11, Duration::from_millis(100))
        };
        let mut pairs = Vec::with_capacity(rounds);
        let before = rig.device.counters().expect("counters");
        for _ in 0..rounds {
            let plain = rig.on_engine_cpu(|| rate(bytes, round, || memcpy(src, dst, size)));
            let device = rate(bytes, round, || rig.copy(size));
            pairs.push((plain, device));
        }
        let after = rig.device.counters().expect("counters");
        let busy = (after.busy_ns - before.busy_ns) as f64
            / (after.descriptors - before.descriptors).max(1) as f64;
        // Rounds of equal length: the mean time of one copy is the mean of the rounds' times.
        let copy_ns = pairs
            .iter()
            .map(|&(plain, _)| size as f64 / plain)
            .sum::<f64>()
            * 1e9
            / rounds as f64;
        let best = |side: fn(&(f64, f64)) -> f64| pairs.iter().map(side).fold(0.0, f64::max);
        let mut ratios: Vec<f64> = pairs
            .iter()
            .map(|&(plain, device)| device / plain)
            .collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "  {name:>4}: ratio {:.2} ({:.2}-{:.2}); best memcpy {:6.2} GB/s, best loopback \
             {:6.2} GB/s; engine busy {busy:.0} ns per descriptor, memcpy {copy_ns:.0} ns per copy",
            ratios[rounds / 2],
            ratios[0],
            ratios[rounds - 1],
            best(|p| p.0) / 1e9,
            best(|p| p.1) / 1e9,
        );
    }
    println!("  ping-pong {} after", pingpong(rig));
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
