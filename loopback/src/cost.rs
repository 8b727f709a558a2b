//! The loopback device's cost model: how long each descriptor takes on the modelled device, and
//! how the engine makes the host see that time.
//!
//! A descriptor costs `descriptor_ns`, plus its DMA bytes at `dma_bytes_per_sec` (host<->device
//! copies and fills move `len` bytes; a device-to-device copy reads and writes, `2 * len`), plus
//! its compute bytes at `compute_bytes_per_sec`, plus `context_switch_ns` when the engine takes
//! it from a queue of another context than the previous descriptor's, plus `fence_ns` for a
//! `Wait` on another queue (the synchronisation between queues). Compute bytes are the bytes
//! the compute unit reads plus the bytes it writes: `len` for `Compute`; for `Layer`, each
//! present input's length up to `len` (the input words the output uses, a shorter input read
//! once and repeated) plus `len`; for `Compact`, `len` plus the whole output,
//! `8 + capacity * record` (the slots left over are zeroed).
//!
//! **Device SRAM.** With `sram_bytes` set, a queue whose context declares a working set (its
//! registers `ws_private`, `ws_shared`, `share_key`: hot activations, and weights shared by
//! every queue of the same key) computes at `compute_bytes_per_sec` only for the part of its
//! working set resident in SRAM: a compute descriptor touching `B` bytes with a fraction `f`
//! of its working set resident is served `f * B` from SRAM, and the other `(1 - f) * B` at
//! `dram_bytes_per_sec`, which also loads those bytes into SRAM, evicting the least recently
//! used other working sets to make room. So a context switch costs its explicit
//! `context_switch_ns` and, implicitly, the refill of what the other context evicted; a
//! working set larger than SRAM never gets above `sram_bytes / working set` hits. Each queue
//! counts the bytes it touched and those served from SRAM: its hit rate.
//!
//! **Host side.** `mmio_read_ns` per 8 bytes read in place through the memory BAR
//! ([`Loopback::read_device_memory`](super::Loopback::read_device_memory)), and
//! `map_page_ns` / `unmap_page_ns` per 4 KiB page mapped into or unmapped from the device's
//! DMA space (pinning and IOMMU page-table and IOTLB work, paid by the mapping thread).
//!
//! The engine does the work at host speed, then holds the completion back until the modelled
//! time has passed (sleeping for long waits, yielding for short ones), so the host measures
//! the modelled device; each unit counts both its modelled and its measured busy time. A zero
//! rate means "free": [`Cost::zero`] charges nothing and never waits.
//!
//! Each unit keeps its own modelled clock, and a descriptor starts when the previous one of
//! its unit ended (it was waiting in the ring). A `Wait` on the other unit's queue also starts
//! no earlier than the modelled end of the descriptor it waited for: a unit whose clock runs
//! behind would otherwise model a wait that ended before what it waited for (the activity
//! records, which carry these times, would show a frame's copy back before its compute).
//!
//! [`Cost::npu`] is the default. Its rates are chosen so that a YOLOv5s-like frame
//! (`userdma_infer::pipeline::zoo::yolov5s_like`: 640x640x3 input,
//! about 77 MB of tensor traffic) costs
//! about 18 ms of compute with its working set resident, as in the case study the demo
//! reproduces.

use std::time::{Duration, Instant};

/// The cost model. See the module docs for how a descriptor is charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Cost {
    /// DMA bandwidth in bytes per second (0: unlimited).
    pub dma_bytes_per_sec: u64,
    /// Fixed cost of fetching, decoding and completing one descriptor, in nanoseconds.
    pub descriptor_ns: u64,
    /// Compute throughput in bytes per second for `Compute`, `Layer` and `Compact` descriptors,
    /// over the bytes each reads and writes (see the module docs; 0: unlimited).
    pub compute_bytes_per_sec: u64,
    /// Cost of moving from one context to another, in nanoseconds.
    pub context_switch_ns: u64,
    /// Cost to the host of one read of up to 8 bytes of device memory through the mapped
    /// BAR, in nanoseconds: a PCIe non-posted read, whose round trip stalls the reading CPU
    /// (of the order of 1 µs on PCIe 3 and 4 hosts). Charged by
    /// [`Loopback::read_device_memory`](super::Loopback::read_device_memory), the host's
    /// in-place read of device results; the engine never charges it.
    pub mmio_read_ns: u64,
    /// Bytes of device SRAM holding the working sets of the contexts that ran last (0: no
    /// SRAM modelled, every compute byte at the compute rate).
    pub sram_bytes: u64,
    /// Bandwidth, in bytes per second, at which compute reads what is not resident in SRAM
    /// (device DRAM; 0: as fast as SRAM).
    pub dram_bytes_per_sec: u64,
    /// Cost of a `Wait` on another queue (an event or fence between queues), in nanoseconds.
    pub fence_ns: u64,
    /// Cost to the mapping thread of mapping one 4 KiB page into the device's DMA space, in
    /// nanoseconds (pinning plus IOMMU page tables).
    pub map_page_ns: u64,
    /// Cost of unmapping one 4 KiB page (page tables plus the IOTLB invalidation), in
    /// nanoseconds.
    pub unmap_page_ns: u64,
}

/// What one descriptor did, for [`Cost::charge_work`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Bytes moved by DMA.
    pub dma_bytes: u64,
    /// Bytes the compute unit read and wrote.
    pub compute_bytes: u64,
    /// Of `compute_bytes`, those not resident in SRAM (read at the DRAM rate).
    pub missed_bytes: u64,
    /// It came from another context than the previous descriptor.
    pub switch: bool,
    /// It was a `Wait` on another queue.
    pub fence: bool,
}

impl Cost {
    /// No cost at all: the engine runs as fast as the host can and never waits.
    pub const fn zero() -> Cost {
        Cost {
            dma_bytes_per_sec: 0,
            descriptor_ns: 0,
            compute_bytes_per_sec: 0,
            context_switch_ns: 0,
            mmio_read_ns: 0,
            sram_bytes: 0,
            dram_bytes_per_sec: 0,
            fence_ns: 0,
            map_page_ns: 0,
            unmap_page_ns: 0,
        }
    }

    /// A small NPU behind PCIe, the default:
    ///
    /// | parameter | value | |
    /// |---|---|---|
    /// | `dma_bytes_per_sec` | 12 GB/s | PCIe 3 x16 / 4 x8 in practice |
    /// | `descriptor_ns` | 1 µs | fetch, decode, complete |
    /// | `compute_bytes_per_sec` | 6 GB/s | tensor traffic with the working set in SRAM: a YOLOv5s-like frame, about 77 MB of it, in about 18 ms at 85 % hits (below) |
    /// | `context_switch_ns` | 20 µs | the explicit save and restore |
    /// | `mmio_read_ns` | 1 µs | one PCIe non-posted read |
    /// | `sram_bytes` | 8 MiB | the case study's on-chip SRAM |
    /// | `dram_bytes_per_sec` | 1.5 GB/s | what compute gets from LPDDR4x for data it must fetch (a quarter of its SRAM-fed rate) |
    /// | `fence_ns` | 2 µs | a cross-queue event |
    /// | `map_page_ns` | 1.5 µs | pinning a 4 KiB page and writing its IOMMU entry |
    /// | `unmap_page_ns` | 1 µs | clearing it and the IOTLB invalidation |
    ///
    /// The map and unmap costs sit between what the guest suite's `vfio-map-cost` case
    /// measures for VFIO type1 behind an emulated Intel IOMMU (under QEMU's TCG): 1 MiB in 4
    /// KiB pages of a few physically contiguous runs maps in about 190 µs and unmaps in about
    /// 110 µs (0.75 and 0.43 µs a page); freshly allocated, scattered pages (about 166 runs)
    /// take about 720 µs and 570 µs (2.8 and 2.2 µs a page), the case a per-frame map pays.
    pub const fn npu() -> Cost {
        Cost {
            dma_bytes_per_sec: 12_000_000_000,
            descriptor_ns: 1_000,
            compute_bytes_per_sec: 6_000_000_000,
            context_switch_ns: 20_000,
            mmio_read_ns: 1_000,
            sram_bytes: 8 << 20,
            dram_bytes_per_sec: 1_500_000_000,
            fence_ns: 2_000,
            map_page_ns: 1_500,
            unmap_page_ns: 1_000,
        }
    }

    /// What the host pays to read `bytes` of device memory in place through the BAR: one
    /// [`Cost::mmio_read_ns`] per 8 bytes or part of them.
    pub fn mmio_read(&self, bytes: u64) -> Duration {
        Duration::from_nanos(bytes.div_ceil(8).saturating_mul(self.mmio_read_ns))
    }

    /// Whether nothing is ever charged.
    pub fn is_zero(&self) -> bool {
        *self == Cost::zero()
    }

    /// Nanoseconds to move or compute `bytes` at `per_sec` (0: free).
    fn at_rate(bytes: u64, per_sec: u64) -> u64 {
        if per_sec == 0 {
            return 0;
        }
        let ns = u128::from(bytes) * 1_000_000_000 / u128::from(per_sec);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    /// The modelled time of one descriptor moving `dma_bytes`, computing over `compute_bytes`
    /// (all resident), with or without a context switch before it.
    pub fn charge(&self, dma_bytes: u64, compute_bytes: u64, switch: bool) -> Duration {
        self.charge_work(Work {
            dma_bytes,
            compute_bytes,
            switch,
            ..Work::default()
        })
    }

    /// The modelled time of one descriptor (see the module docs).
    pub fn charge_work(&self, w: Work) -> Duration {
        let missed = w.missed_bytes.min(w.compute_bytes);
        let dram = if self.dram_bytes_per_sec == 0 {
            self.compute_bytes_per_sec
        } else {
            self.dram_bytes_per_sec
        };
        let ns = self
            .descriptor_ns
            .saturating_add(Cost::at_rate(w.dma_bytes, self.dma_bytes_per_sec))
            .saturating_add(Cost::at_rate(
                w.compute_bytes - missed,
                self.compute_bytes_per_sec,
            ))
            .saturating_add(Cost::at_rate(missed, dram))
            .saturating_add(if w.switch { self.context_switch_ns } else { 0 })
            .saturating_add(if w.fence { self.fence_ns } else { 0 });
        Duration::from_nanos(ns)
    }

    /// What mapping (`map`) or unmapping `bytes` into the DMA space costs the host: one
    /// [`Cost::map_page_ns`] or [`Cost::unmap_page_ns`] per 4 KiB page or part of one.
    pub fn mapping(&self, bytes: u64, map: bool) -> Duration {
        let per_page = if map {
            self.map_page_ns
        } else {
            self.unmap_page_ns
        };
        Duration::from_nanos(bytes.div_ceil(4096).saturating_mul(per_page))
    }
}

impl Default for Cost {
    /// [`Cost::npu`].
    fn default() -> Cost {
        Cost::npu()
    }
}

/// Waits longer than this sleep (most of the time); shorter ones yield the CPU in a loop.
/// The engine threads run with a timer slack of [`TIMER_SLACK_NS`], so a sleep ends a few
/// microseconds late, and a late end costs no throughput inside a burst (the next
/// descriptor's modelled time runs from this one's modelled end).
const SLEEP_ABOVE: Duration = Duration::from_micros(40);
/// How much of a long wait is left to the yielding loop (sleep overshoots).
const SLEEP_MARGIN: Duration = Duration::from_micros(20);
/// The engine threads' timer slack under a cost model, in nanoseconds.
pub(super) const TIMER_SLACK_NS: u64 = 1_000;

/// The modelled device's clock: when it will have finished what it was given.
#[derive(Debug)]
pub(super) struct Clock {
    /// When the modelled device finishes the last charged descriptor.
    due: Option<Instant>,
    /// When the modelled device began the last charged descriptor.
    began: Option<Instant>,
}

impl Clock {
    pub(super) fn new() -> Clock {
        Clock {
            due: None,
            began: None,
        }
    }

    /// Charges `cost` for work that started no earlier than `start`; returns when it is done.
    pub(super) fn charge(&mut self, start: Instant, cost: Duration) -> Instant {
        let begin = match self.due {
            Some(due) if due > start => due,
            _ => start,
        };
        let done = begin.checked_add(cost).unwrap_or(begin);
        self.began = Some(begin);
        self.due = Some(done);
        done
    }

    /// When the last charged work began and ended on the modelled device (`None` before the
    /// first charge): what the unit's activity record of it says.
    pub(super) fn last(&self) -> Option<(Instant, Instant)> {
        Some((self.began?, self.due?))
    }

    /// Waits until `deadline`: sleeps for most of a long wait, yields for the rest.
    pub(super) fn wait_until(deadline: Instant) {
        loop {
            let now = Instant::now();
            let Some(left) = deadline
                .checked_duration_since(now)
                .filter(|l| !l.is_zero())
            else {
                return;
            };
            if left > SLEEP_ABOVE {
                std::thread::sleep(left - SLEEP_MARGIN);
            } else {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_add_up() {
        let npu = Cost::npu();
        // 12 KB at 12 GB/s = 1 µs, plus 1 µs per descriptor.
        assert_eq!(npu.charge(12_000, 0, false), Duration::from_micros(2));
        // 12 KB at 6 GB/s = 2 µs, plus the descriptor and a 20 µs switch.
        assert_eq!(npu.charge(0, 12_000, true), Duration::from_micros(23));
        // Half of it missed in SRAM: 6 KB at 6 GB/s and 6 KB at 1.5 GB/s; a fence adds 2 µs.
        let work = Work {
            compute_bytes: 12_000,
            missed_bytes: 6_000,
            fence: true,
            ..Work::default()
        };
        assert_eq!(npu.charge_work(work), Duration::from_micros(1 + 1 + 4 + 2));
        // More missed than touched counts as all missed.
        let all = Work {
            missed_bytes: 99_999,
            ..work
        };
        assert_eq!(npu.charge_work(all), Duration::from_micros(1 + 8 + 2));
        // No DRAM rate: misses cost what hits cost.
        let flat = Cost {
            dram_bytes_per_sec: 0,
            ..npu
        };
        assert_eq!(flat.charge_work(work), Duration::from_micros(1 + 2 + 2));
        // 1 MiB is 256 pages; a partial page counts whole.
        assert_eq!(npu.mapping(1 << 20, true), Duration::from_micros(384));
        assert_eq!(npu.mapping(1 << 20, false), Duration::from_micros(256));
        assert_eq!(npu.mapping(1, true), Duration::from_nanos(1_500));
        assert_eq!(npu.mmio_read(9), Duration::from_micros(2));
        assert_eq!(Cost::zero().charge(1 << 30, 1 << 30, true), Duration::ZERO);
        assert!(Cost::zero().is_zero());
        assert!(!npu.is_zero());
        let slow = Cost {
            dma_bytes_per_sec: 1,
            ..Cost::zero()
        };
        assert_eq!(
            slow.charge(u64::MAX, 0, false),
            Duration::from_nanos(u64::MAX)
        );
    }

    #[test]
    fn the_clock_queues_work_back_to_back() {
        let mut clock = Clock::new();
        assert_eq!(clock.last(), None);
        let t0 = Instant::now();
        let a = clock.charge(t0, Duration::from_micros(10));
        assert_eq!(a, t0 + Duration::from_micros(10));
        // Started before the previous finished: runs after it.
        let b = clock.charge(t0 + Duration::from_micros(5), Duration::from_micros(10));
        assert_eq!(b, t0 + Duration::from_micros(20));
        // Its modelled span starts where the previous one ended, not at its own start.
        assert_eq!(clock.last(), Some((a, b)));
        // Started after an idle gap: runs from its start.
        let c = clock.charge(t0 + Duration::from_millis(1), Duration::from_micros(1));
        assert_eq!(c, t0 + Duration::from_millis(1) + Duration::from_micros(1));
        let before = Instant::now();
        Clock::wait_until(before + Duration::from_micros(300));
        assert!(before.elapsed() >= Duration::from_micros(300));
    }
}
