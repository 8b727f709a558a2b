//! The cost model's device SRAM, through the registers: contexts declare working sets, a
//! context switch evicts, each queue counts its hit rate, shared weights survive a switch, and
//! each unit counts the modelled time next to the measured time (never less measured than
//! modelled); DMA maps and unmaps cost their pages.

use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::Device;
use userdma::dma::DeviceOffset;
use userdma::memory::PageSize;
use userdma::ring::{self, Command, Queue, Status};
use userdma_loopback::{
    Config, Cost, Descriptor, Loopback, LoopbackStatus, StatusCode, Unit, Wait,
};

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(20));
const MIB: u64 = 1 << 20;
/// Compute bytes of one descriptor: a `Compute` of `len` bytes touches `len`.
const TOUCH: u64 = MIB / 2;

fn cost() -> Cost {
    Cost {
        // 512 KiB at 4 GB/s: 131 µs a descriptor from SRAM, four times that from DRAM.
        compute_bytes_per_sec: 4_000_000_000,
        dram_bytes_per_sec: 1_000_000_000,
        sram_bytes: 4 * MIB,
        ..Cost::zero()
    }
}

fn device(cost: Cost) -> Arc<Loopback> {
    let config = Config::default().cost(cost).memory_size(2 * MIB as usize);
    Arc::new(Loopback::new(config).expect("loopback device"))
}

/// Queue `id` on the compute unit in context `id + 1`.
fn open(device: &Arc<Loopback>, id: u16) -> Queue<Command, Status, ()> {
    device
        .open_queue_on(
            ring::Config::new(16)
                .with_id(id)
                .with_context(u32::from(id) + 1),
            Wait::Interrupt,
            Unit::Compute,
        )
        .expect("queue opened")
}

/// Runs `n` in-place compute descriptors of `TOUCH` bytes on `queue` (context `id + 1`).
fn compute(queue: &mut Queue<Command, Status, ()>, id: u16, n: usize) {
    for _ in 0..n {
        let c = Descriptor::compute(DeviceOffset(0), DeviceOffset(0), TOUCH, 1, 2)
            .context(u32::from(id) + 1)
            .build();
        queue.submit(c, ()).expect("submitted");
        let done = queue.wait(TIMEOUT).expect("completed");
        assert_eq!(done.entry.loopback_code(), Ok(StatusCode::Success));
    }
}

#[test]
fn a_switch_evicts_and_each_context_counts_its_hit_rate() {
    let dev = device(cost());
    // 3 MiB each on 4 MiB of SRAM: they cannot both stay.
    dev.set_working_set(0, 3 * MIB, 0, 0).unwrap();
    dev.set_working_set(1, 3 * MIB, 0, 0).unwrap();
    let (mut a, mut b) = (open(&dev, 0), open(&dev, 1));
    // A alone: 6 touches of 512 KiB load its 3 MiB, then 6 more hit.
    compute(&mut a, 0, 12);
    let c = dev.counters().unwrap();
    assert_eq!(c.queues[0].sram_touched, 12 * TOUCH);
    assert_eq!(c.queues[0].sram_hits, 6 * TOUCH);
    // B: its 3 MiB evict 2 MiB of A's.
    compute(&mut b, 1, 6);
    let c = dev.counters().unwrap();
    assert_eq!(c.queues[1].sram_hits, 0);
    // Back to A: the first 2 MiB (4 touches) miss, then it hits again.
    compute(&mut a, 0, 6);
    let c = dev.counters().unwrap();
    assert_eq!(c.queues[0].sram_touched, 18 * TOUCH);
    assert_eq!(c.queues[0].sram_hits, 8 * TOUCH);
    assert_eq!(c.queues[0].sram_hit_rate(), Some(8.0 / 18.0));
    // Two switches, each charged; the modelled time is what the rates say, and measured
    // time is never less than modelled.
    let u = c.units[Unit::Compute as usize];
    assert_eq!(u.context_switches, 2);
    let per = |bytes: u64, rate: u64| bytes * 1_000_000_000 / rate;
    let misses = 6 + 6 + 4;
    let hits = 24 - misses;
    let modelled = misses * per(TOUCH, 1_000_000_000) + hits * per(TOUCH, 4_000_000_000);
    assert_eq!(u.modelled_ns, modelled);
    assert!(u.busy_ns >= u.modelled_ns, "{u:?}");
}

#[test]
fn shared_weights_survive_a_switch_and_undeclared_queues_are_left_alone() {
    let dev = device(cost());
    // 2 MiB of shared weights and 512 KiB each of activations: all fits.
    dev.set_working_set(0, TOUCH, 2 * MIB, 9).unwrap();
    dev.set_working_set(1, TOUCH, 2 * MIB, 9).unwrap();
    let (mut a, mut b) = (open(&dev, 0), open(&dev, 1));
    compute(&mut a, 0, 5);
    compute(&mut b, 1, 5);
    let c = dev.counters().unwrap();
    // A loaded the weights and its activations (5 touches); B only its activations (1).
    assert_eq!(c.queues[0].sram_hits, 0);
    assert_eq!(c.queues[1].sram_hits, 4 * TOUCH);
    compute(&mut a, 0, 3);
    assert_eq!(dev.counters().unwrap().queues[0].sram_hits, 3 * TOUCH);
    // A queue that declared nothing computes at the SRAM rate and counts nothing.
    let mut plain = open(&dev, 2);
    compute(&mut plain, 2, 2);
    let c = dev.counters().unwrap();
    assert_eq!(
        (c.queues[2].sram_touched, c.queues[2].sram_hit_rate()),
        (0, None)
    );
    assert!(dev.set_working_set(99, 1, 0, 0).is_err());
}

#[test]
fn dma_maps_and_unmaps_cost_their_pages() {
    let slow = Cost {
        map_page_ns: 20_000,
        unmap_page_ns: 10_000,
        ..Cost::zero()
    };
    let dev = device(slow);
    // 64 pages: at least 1.28 ms to map, 0.64 ms to unmap.
    let start = Instant::now();
    let mapping =
        userdma::runtime::map_memory(dev.dma_space().as_ref(), 64 * 4096, PageSize::Base).unwrap();
    let mapped = start.elapsed();
    let start = Instant::now();
    drop(mapping);
    let unmapped = start.elapsed();
    assert!(mapped >= Duration::from_micros(1280), "{mapped:?}");
    assert!(unmapped >= Duration::from_micros(640), "{unmapped:?}");
    let stats = dev.dma_space().stats();
    assert_eq!((stats.maps, stats.unmaps), (1, 1));
}
