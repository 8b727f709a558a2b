//! Modelled against measured: the device's busy time beside its modelled time, per unit, what
//! bound it (the model, the host, an engine thread run late), and the engine's own work per
//! transfer at host speed.

use std::time::Instant;

use serde::Serialize;
use userdma_loopback as loopback;

use super::driver::{expected, input};
use super::placement::Placement;
use super::report::micros;
use super::DemoError;

/// How far measured busy time may be from modelled before the demo says so.
const TOLERANCE: f64 = 0.05;

/// What bound the device's busy time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Bound {
    /// Busy within 5 % of modelled: the modelled device held.
    Model,
    /// The engine's own work at host speed is longer than the modelled time: the host
    /// cannot run the model this fast.
    Host,
    /// The engine's own work fits in the modelled time, yet busy is longer: the engine thread
    /// was not running when its modelled waits ended (the host's CPUs were busy).
    Late,
    /// The zero-cost model charges nothing: busy is the host's work.
    Unmodelled,
}

/// Measured against modelled busy time, for the device and for each unit that worked.
#[derive(Debug, Serialize)]
pub(super) struct Timing {
    pub(super) busy_ns: u64,
    pub(super) modelled_ns: u64,
    /// `busy_ns / modelled_ns` (absent under the zero-cost model).
    pub(super) ratio: Option<f64>,
    /// The ratio is within 5 % of 1.
    within_5_percent: bool,
    bound: Bound,
    /// The engine's own work per transfer at host speed (copy in, compute, copy out timed
    /// on host buffers in this run), and the modelled time per transfer.
    engine_work_ns_per_transfer: u64,
    modelled_ns_per_transfer: u64,
    /// Where the engine and the host threads ran.
    placement: Placement,
    /// The host's CPUs, and its one-minute load average at the end of the run (if known).
    cpus: usize,
    load_average: Option<f64>,
    units: Vec<UnitTiming>,
}

/// One unit's busy and modelled time.
#[derive(Debug, Serialize)]
struct UnitTiming {
    unit: &'static str,
    busy_ns: u64,
    modelled_ns: u64,
    ratio: Option<f64>,
}

/// `busy / modelled`, if anything was modelled.
fn ratio(busy_ns: u64, modelled_ns: u64) -> Option<f64> {
    (modelled_ns > 0).then(|| busy_ns as f64 / modelled_ns as f64)
}

impl Timing {
    pub(super) fn of(
        device: &loopback::Counters,
        transfers: u64,
        engine_work_ns_per_transfer: u64,
        placement: Placement,
    ) -> Timing {
        let ratio_all = ratio(device.busy_ns, device.modelled_ns);
        let within = ratio_all.is_some_and(|r| (r - 1.0).abs() <= TOLERANCE);
        let modelled_ns_per_transfer = device.modelled_ns / transfers.max(1);
        let bound = match ratio_all {
            None => Bound::Unmodelled,
            Some(_) if within => Bound::Model,
            Some(_) if engine_work_ns_per_transfer > modelled_ns_per_transfer => Bound::Host,
            Some(_) => Bound::Late,
        };
        let units = [loopback::Unit::Copy, loopback::Unit::Compute]
            .into_iter()
            .map(|unit| (unit, &device.units[unit as usize]))
            .filter(|(_, c)| c.descriptors > 0)
            .map(|(unit, c)| UnitTiming {
                unit: match unit {
                    loopback::Unit::Copy => "copy",
                    loopback::Unit::Compute => "compute",
                },
                busy_ns: c.busy_ns,
                modelled_ns: c.modelled_ns,
                ratio: ratio(c.busy_ns, c.modelled_ns),
            })
            .collect();
        Timing {
            busy_ns: device.busy_ns,
            modelled_ns: device.modelled_ns,
            ratio: ratio_all,
            within_5_percent: within,
            bound,
            engine_work_ns_per_transfer,
            modelled_ns_per_transfer,
            placement,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            load_average: load_average(),
            units,
        }
    }

    /// The verdict, for humans.
    pub(super) fn verdict(&self) -> String {
        let work = micros(self.engine_work_ns_per_transfer);
        let modelled = micros(self.modelled_ns_per_transfer);
        let load = self
            .load_average
            .map_or_else(String::new, |l| format!(", load average {l:.1}"));
        match self.bound {
            Bound::Model => "within 5 %: the device ran as modelled".to_owned(),
            Bound::Host => format!(
                "MORE than 5 % apart: the host is the bound (the engine's own work, {work} a \
                 transfer on host buffers, exceeds the modelled {modelled}); try larger \
                 --size or a slower cost model"
            ),
            Bound::Late => format!(
                "MORE than 5 % apart, not for the engine's work ({work} a transfer on host \
                 buffers fits in the modelled {modelled}): its thread was not running when \
                 modelled waits ended, the host's {} CPUs being busy ({}{load}); {}",
                self.cpus,
                if self.placement.engine_cpu.is_some() {
                    "other processes on the engine's CPU"
                } else {
                    "the engine shares them with this demo's host threads"
                },
                if self.placement.engine_cpu.is_some() {
                    "run it on an idle machine or another --engine-cpu"
                } else {
                    "leave the engine a CPU of its own (no --no-pin)"
                },
            ),
            Bound::Unmodelled => {
                "nothing modelled (zero-cost model): busy is the engine's work at host speed"
                    .to_owned()
            }
        }
    }
}

/// The one-minute load average, from `/proc/loadavg` (none if unreadable).
fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// How much of a modelled run the engine's own work at host speed would take: one transfer's
/// device work (a copy in, the compute pass, a copy out, as the engine runs them) timed on
/// host buffers, the median of a few, in nanoseconds. An estimate made in this run, to tell a
/// host that cannot keep up with the model from one that runs the engine late.
pub(super) fn engine_work_per_transfer(size: usize) -> Result<u64, DemoError> {
    const RUNS: usize = 9;
    let mut source = vec![0u8; size];
    input(1, &mut source)?;
    let (mut slot, mut computed, mut destination) =
        (vec![0u8; size], vec![0u8; size], vec![0u8; size]);
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        slot.copy_from_slice(&source);
        expected(&slot, &mut computed)?;
        destination.copy_from_slice(&computed);
        times.push(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
        std::hint::black_box(&destination);
    }
    times.sort_unstable();
    Ok(times[RUNS / 2])
}
