//! The device's own counters in the owner's stats ([`crate::proto::Msg::DeviceStats`]): the
//! engine ([`userdma_infer::accel::Accelerator`]) runs frames and does not count its units'
//! time; the device's driver does, and the owner is given a way to read them
//! ([`super::Config::counters`]).

use std::sync::Arc;

use userdma_loopback::{Loopback, Unit, UnitCounters};

use crate::proto::{DeviceCounters, UnitFigures};

/// Reads the device's own counters: its units' busy time, descriptors and context switches,
/// its SRAM hits.
pub trait CounterSource: Send + Sync + std::fmt::Debug {
    /// The counters now (`None`: they cannot be read now; the stats answer says so).
    fn read(&self) -> Option<DeviceCounters>;
}

/// The loopback NPU's counters, from its registers (`userdma serve` gives them its owner).
#[derive(Debug, Clone)]
pub struct LoopbackCounters(Arc<Loopback>);

impl LoopbackCounters {
    /// The counters of `device`.
    pub fn new(device: Arc<Loopback>) -> LoopbackCounters {
        LoopbackCounters(device)
    }
}

impl CounterSource for LoopbackCounters {
    fn read(&self) -> Option<DeviceCounters> {
        // A device that stopped (or was removed) has no registers to read: none.
        let c = self.0.counters().ok()?;
        let unit = |u: &UnitCounters| UnitFigures {
            busy_ns: u.busy_ns,
            descriptors: u.descriptors,
            bytes: u.bytes,
            context_switches: u.context_switches,
            errors: u.errors,
        };
        let sum = |f: fn(&userdma_loopback::QueueCounters) -> u64| {
            c.queues.iter().map(f).fold(0u64, u64::saturating_add)
        };
        Some(DeviceCounters {
            copy: unit(&c.units[Unit::Copy as usize]),
            compute: unit(&c.units[Unit::Compute as usize]),
            sram_hits: sum(|q| q.sram_hits),
            sram_touched: sum(|q| q.sram_touched),
        })
    }
}
