//! Soak: many random transfers through the loopback device — sizes from 1 byte to 1 MiB (most
//! small), host to device and back, on several queues from several threads, in random batch
//! sizes, each checked by checksum — then no corruption, no error, every pool buffer back, no
//! queue leaked.
//!
//! `USERDMA_SOAK_TRANSFERS` sets the number of round trips (default 1,000,000). Run the full
//! soak optimised:
//!
//! ```text
//! cargo test --release --test loopback_soak
//! ```
//!
//! (a debug build runs the same test, slower; CI's debug pass sets a smaller count).

use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::Device;
use userdma::memory::PageSize;
use userdma::pool::{self, Buffer, Pool};
use userdma::ring::{self, Command, Queue, Status};
use userdma_loopback::{Config, Cost, Loopback, Opcode, Wait};

const QUEUES: u16 = 3;
/// Transfers in flight per queue at most (one device-memory slot each).
const MAX_BATCH: usize = 16;
const SLOT: usize = 1 << 20;
const TIMEOUT: Option<Duration> = Some(Duration::from_secs(30));

fn transfers() -> u64 {
    match std::env::var("USERDMA_SOAK_TRANSFERS") {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("USERDMA_SOAK_TRANSFERS={text:?} is not a number")),
        Err(_) => 1_000_000,
    }
}

/// xorshift64*: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A transfer size: 95% up to 256 B, 4.9% up to 64 KiB, 0.1% up to 1 MiB (log-uniform
    /// within each band), so the total stays near 1 KB per transfer.
    fn size(&mut self) -> usize {
        let band = self.below(1000);
        let (low_bits, high_bits) = match band {
            0 => (16, 20),
            1..=49 => (8, 16),
            _ => (0, 8),
        };
        let bits = low_bits + self.below(high_bits - low_bits + 1);
        let max = 1u64 << bits;
        (1 + self.below(max)).min(1 << 20) as usize
    }

    fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// FNV-1a over the bytes.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What one thread did.
#[derive(Debug, Default)]
struct Report {
    transfers: u64,
    bytes: u64,
    corrupted: u64,
    failed: u64,
}

/// One transfer in flight: the source buffer rides with the `ToDevice` descriptor, the
/// destination with the `ToHost` one.
enum Payload<'p> {
    /// Held until the device has read it.
    Source(#[allow(dead_code)] Buffer<'p>),
    Destination {
        buffer: Buffer<'p>,
        expect: u64,
    },
}

fn run_queue(device: &Arc<Loopback>, pool: &Pool, q: u16, count: u64, seed: u64) -> Report {
    let mut queue: Queue<Command, Status, Payload<'_>> = device
        .open_queue(ring::Config::new(64).with_id(q), Wait::Interrupt)
        .expect("queue");
    let mut rng = Rng(seed);
    let mut report = Report::default();
    let mut scratch = vec![0u8; 1 << 20];
    let window = usize::from(q) * MAX_BATCH * SLOT;
    let mut left = count;
    while left > 0 {
        let batch = (1 + rng.below(MAX_BATCH as u64)).min(left);
        for i in 0..batch as usize {
            let len = rng.size();
            let data = &mut scratch[..len];
            rng.fill(data);
            let expect = checksum(data);
            let source = pool.alloc(len).expect("source buffer");
            source.write(0, data).unwrap();
            let destination = pool.alloc(len).expect("destination buffer");
            let slot = (window + i * SLOT) as u64;
            let to_device = Command {
                opcode: Opcode::ToDevice as u8,
                src: source.iova().raw(),
                dst: slot,
                len: len as u64,
                ..Command::default()
            };
            let to_host = Command {
                opcode: Opcode::ToHost as u8,
                src: slot,
                dst: destination.iova().raw(),
                len: len as u64,
                ..Command::default()
            };
            queue
                .push_wait(to_device, Payload::Source(source), TIMEOUT)
                .expect("push");
            let payload = Payload::Destination {
                buffer: destination,
                expect,
            };
            queue.push_wait(to_host, payload, TIMEOUT).expect("push");
        }
        queue.flush().unwrap();
        let mut pending = 2 * batch;
        while pending > 0 {
            let done = queue.wait(TIMEOUT).expect("completion");
            pending -= 1;
            if !done.entry.is_success() {
                report.failed += 1;
            }
            if let Payload::Destination { buffer, expect } = done.payload {
                let data = &mut scratch[..buffer.len()];
                buffer.read(0, data).unwrap();
                if checksum(data) != expect {
                    report.corrupted += 1;
                }
                report.transfers += 1;
                report.bytes += buffer.len() as u64;
            }
        }
        left -= batch;
    }
    report
}

#[test]
fn soak_random_transfers_through_the_loopback_device() {
    let total = transfers();
    let config = Config::default()
        .cost(Cost::zero())
        .queues(QUEUES)
        .memory_size(usize::from(QUEUES) * MAX_BATCH * SLOT);
    let device = Arc::new(Loopback::new(config).expect("loopback device"));
    let mapping =
        userdma::runtime::map_memory(device.dma_space().as_ref(), 128 << 20, PageSize::Base)
            .expect("128 MiB of host memory mapped into the device's DMA space");
    let pool = Pool::new(
        mapping,
        pool::Config::default().exhaustion(pool::Exhaustion::Wait(Duration::from_secs(30))),
    )
    .expect("pool");
    let leaks = ring::leaks();
    let start = Instant::now();
    let reports: Vec<Report> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..QUEUES)
            .map(|q| {
                let share =
                    total / u64::from(QUEUES) + u64::from(u64::from(q) < total % u64::from(QUEUES));
                let (device, pool) = (&device, &pool);
                scope.spawn(move || run_queue(device, pool, q, share, 0x9e37_79b9 + u64::from(q)))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let elapsed = start.elapsed();
    let transfers: u64 = reports.iter().map(|r| r.transfers).sum();
    let bytes: u64 = reports.iter().map(|r| r.bytes).sum();
    let corrupted: u64 = reports.iter().map(|r| r.corrupted).sum();
    let failed: u64 = reports.iter().map(|r| r.failed).sum();
    eprintln!(
        "soak: {transfers} round trips, {bytes} bytes each way, in {elapsed:?} ({:.0} round trips/s)",
        transfers as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(transfers, total);
    assert_eq!(corrupted, 0, "corrupted transfers");
    assert_eq!(failed, 0, "error completions");
    let counters = device.counters().unwrap();
    assert_eq!(counters.descriptors, 2 * total);
    assert_eq!(counters.errors, 0);
    assert_eq!(counters.bytes, 2 * bytes);
    assert_eq!(ring::leaks(), leaks, "a queue leaked");
    let stats = pool.stats();
    for class in &stats.classes {
        assert_eq!(class.in_use, 0, "class {} leaked buffers", class.size);
        assert_eq!(
            class.outstanding, 0,
            "class {} blocks not returned",
            class.size
        );
    }
    assert_eq!(stats.large.in_use_bytes, 0, "large buffers leaked");
    assert_eq!(stats.accounted_bytes(), stats.arena_bytes);
}
