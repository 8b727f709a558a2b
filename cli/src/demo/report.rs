//! The demo's report: latency percentiles, pool figures, the JSON document, and the same as
//! text.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;
use userdma_loopback as loopback;

use super::timing::Timing;
use super::{CostModel, DemoArgs};

/// Latency percentiles, in nanoseconds.
#[derive(Debug, Default, Serialize)]
pub(super) struct Latency {
    pub(super) p50: u64,
    pub(super) p99: u64,
    pub(super) p999: u64,
    pub(super) max: u64,
}

impl Latency {
    pub(super) fn of(h: &Histogram<u64>) -> Latency {
        Latency {
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// A histogram of latencies in ns (1 ns to an hour, three significant digits): a fixed size
/// whatever `--count` is.
pub(super) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

/// Pool figures for the report.
#[derive(Debug, Serialize)]
pub(super) struct PoolReport {
    pub(super) arena_bytes: u64,
    pub(super) high_water_bytes: u64,
}

/// The JSON document.
#[derive(Debug, Serialize)]
pub(super) struct Report {
    pub(super) config: DemoArgs,
    pub(super) transfers: u64,
    pub(super) bytes: u64,
    pub(super) seconds: f64,
    pub(super) bytes_per_sec: f64,
    pub(super) transfers_per_sec: f64,
    pub(super) latency_ns: Latency,
    pub(super) device: loopback::Counters,
    pub(super) timing: Timing,
    pub(super) pool: PoolReport,
}

/// Microseconds, for humans.
pub(super) fn micros(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1000.0)
}

/// The text report.
pub(super) fn render(r: &Report) -> String {
    let mut text = String::new();
    let c = &r.config;
    let _ = writeln!(
        text,
        "loopback demo: {} transfers of {} bytes (to device, compute, to host) on {} queues, \
         batches of {}, {} cost model{}",
        r.transfers,
        c.size,
        c.queues,
        c.batch,
        match c.cost {
            CostModel::Npu => "npu",
            CostModel::Zero => "zero",
        },
        if c.process {
            ", device in a child process"
        } else {
            ""
        }
    );
    let _ = writeln!(
        text,
        "verified:   every byte of {} transfers ({} bytes)",
        r.transfers, r.bytes
    );
    let _ = writeln!(
        text,
        "throughput: {:.2} GB/s, {:.0} transfers/s in {:.3} s",
        r.bytes_per_sec / 1e9,
        r.transfers_per_sec,
        r.seconds
    );
    let l = &r.latency_ns;
    let _ = writeln!(
        text,
        "latency:    p50 {}  p99 {}  p99.9 {}  max {}",
        micros(l.p50),
        micros(l.p99),
        micros(l.p999),
        micros(l.max)
    );
    let d = &r.device;
    let _ = writeln!(
        text,
        "device:     {} descriptors, {} bytes, {} context switches, {} errors, busy {:.3} s \
         (modelled {:.3} s), {} interrupts",
        d.descriptors,
        d.bytes,
        d.context_switches,
        d.errors,
        d.busy_ns as f64 / 1e9,
        d.modelled_ns as f64 / 1e9,
        d.interrupts
    );
    let t = &r.timing;
    let _ = writeln!(
        text,
        "modelled:   busy {:.3} s against {:.3} s modelled{}: {}",
        t.busy_ns as f64 / 1e9,
        t.modelled_ns as f64 / 1e9,
        t.ratio
            .map_or_else(String::new, |r| format!(", ratio {r:.2}")),
        t.verdict()
    );
    for (q, queue) in d.queues.iter().enumerate() {
        let _ = writeln!(
            text,
            "  queue {q}:  {} descriptors, {} errors",
            queue.completed, queue.errors
        );
    }
    let _ = writeln!(
        text,
        "pool:       {} bytes of arena, high water {} bytes",
        r.pool.arena_bytes, r.pool.high_water_bytes
    );
    text
}
