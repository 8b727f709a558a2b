//! The loopback device's cost model: how long each descriptor takes on the modelled device, and
//! how the engine makes the host see that time.
//!
//! A descriptor costs `descriptor_ns`, plus its DMA bytes at `dma_bytes_per_sec` (host<->device
//! copies and fills move `len` bytes; a device-to-device copy reads and writes, `2 * len`), plus
//! its compute bytes at `compute_bytes_per_sec`, plus `context_switch_ns` when the engine takes
//! it from a queue of another context than the previous descriptor's. Compute bytes are the
//! bytes the compute unit reads plus the bytes it writes: `len` for `Compute`; for `Layer`, each
//! present input's length up to `len` (the input words the output uses, a shorter input read
//! once and repeated) plus `len`; for `Compact`, `len` plus the whole output,
//! `8 + capacity * record` (the slots left over are zeroed). The engine does the work at host
//! speed, then holds the completion back until the modelled time has passed (sleeping for long
//! waits, yielding for short ones), so the host measures the
//! modelled device. A zero rate means "free": [`Cost::zero`] charges nothing and never waits.

use std::time::{Duration, Instant};

use serde::Serialize;

/// The cost model. See the module docs for how a descriptor is charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
        }
    }

    /// A small NPU behind PCIe: 12 GB/s of DMA, 1 µs per descriptor, 8 GB/s of compute, 20 µs
    /// per context switch, 1 µs per 8-byte host read of device memory through the BAR.
    pub const fn npu() -> Cost {
        Cost {
            dma_bytes_per_sec: 12_000_000_000,
            descriptor_ns: 1_000,
            compute_bytes_per_sec: 8_000_000_000,
            context_switch_ns: 20_000,
            mmio_read_ns: 1_000,
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

    /// The modelled time of one descriptor moving `dma_bytes`, computing over `compute_bytes`,
    /// with or without a context switch before it.
    pub fn charge(&self, dma_bytes: u64, compute_bytes: u64, switch: bool) -> Duration {
        let ns = self
            .descriptor_ns
            .saturating_add(Cost::at_rate(dma_bytes, self.dma_bytes_per_sec))
            .saturating_add(Cost::at_rate(compute_bytes, self.compute_bytes_per_sec))
            .saturating_add(if switch { self.context_switch_ns } else { 0 });
        Duration::from_nanos(ns)
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
}

impl Clock {
    pub(super) fn new() -> Clock {
        Clock { due: None }
    }

    /// Charges `cost` for work that started no earlier than `start`; returns when it is done.
    pub(super) fn charge(&mut self, start: Instant, cost: Duration) -> Instant {
        let begin = match self.due {
            Some(due) if due > start => due,
            _ => start,
        };
        let done = begin.checked_add(cost).unwrap_or(begin);
        self.due = Some(done);
        done
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
        assert_eq!(npu.charge(0, 8_000, true), Duration::from_micros(22));
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
        let t0 = Instant::now();
        let a = clock.charge(t0, Duration::from_micros(10));
        assert_eq!(a, t0 + Duration::from_micros(10));
        // Started before the previous finished: runs after it.
        let b = clock.charge(t0 + Duration::from_micros(5), Duration::from_micros(10));
        assert_eq!(b, t0 + Duration::from_micros(20));
        // Started after an idle gap: runs from its start.
        let c = clock.charge(t0 + Duration::from_millis(1), Duration::from_micros(1));
        assert_eq!(c, t0 + Duration::from_millis(1) + Duration::from_micros(1));
        let before = Instant::now();
        Clock::wait_until(before + Duration::from_micros(300));
        assert!(before.elapsed() >= Duration::from_micros(300));
    }
}
