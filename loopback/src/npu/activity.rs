//! The host programming the device's activity records (the register block
//! [`regs::ActivityRegs`]): enabling them into a buffer, stopping them, and reading the units'
//! counts. [`activity::Log`](crate::activity::Log) does all of it around a buffer it owns.

use userdma::device::Error as DeviceError;
use userdma::dma::Iova;

use crate::activity::valid_records;
use crate::error::Error as LoopbackError;
use crate::regs::{self, activity_field, ActivityControl, ActivityFault, ActivityStatus, Unit};
use crate::Loopback;

impl Loopback {
    /// Starts the units' activity records into the buffer at `buffer` (host memory mapped
    /// into the device's DMA space, device-writable, 64-byte aligned, both units' rings of
    /// `records_per_unit` records in one mapping:
    /// [`activity::buffer_bytes`](crate::activity::buffer_bytes)); returns once both units
    /// write records, their counts at 0. Records that were on are stopped first (and their
    /// counts start again).
    ///
    /// # Errors
    /// [`Error::Config`](LoopbackError::Config) for a `records_per_unit` that is not a power of
    /// two from 1 to [`MAX_ACTIVITY_RECORDS`](regs::MAX_ACTIVITY_RECORDS);
    /// [`Error::ActivityFault`](LoopbackError::ActivityFault) when a unit refused the buffer
    /// (records are then off); [`DeviceError::Removed`] and [`DeviceError::Timeout`].
    pub fn enable_activity(&self, buffer: Iova, records_per_unit: u32) -> Result<(), DeviceError> {
        self.check_present()?;
        if !valid_records(records_per_unit) {
            return Err(LoopbackError::Config {
                field: "activity records per unit",
                value: u64::from(records_per_unit),
                expected: "a power of two from 1 to 1048576",
            }
            .into());
        }
        self.disable_activity()?;
        self.set(regs::ACTIVITY_BUFFER, buffer.raw())?;
        self.set(regs::ACTIVITY_RECORDS, records_per_unit)?;
        self.set(regs::ACTIVITY_CONTROL, ActivityControl::ENABLE)?;
        self.wait_for("enable activity records", self.config.ack_timeout, |d| {
            Unit::ALL.iter().try_fold(true, |all, &unit| {
                Ok(all
                    && !d
                        .get(activity_field(regs::ACTIVITY_STATUS, unit))?
                        .is_empty())
            })
        })?;
        for unit in Unit::ALL {
            let status = self.get(activity_field(regs::ACTIVITY_STATUS, unit))?;
            if status.contains(ActivityStatus::FAULT) {
                let raw = self.get(activity_field(regs::ACTIVITY_FAULT, unit))?;
                let fault = ActivityFault::from_raw(raw).unwrap_or(ActivityFault::None);
                // Off again (acknowledging the fault), then the unit's reason.
                self.disable_activity()?;
                return Err(LoopbackError::ActivityFault { unit, fault }.into());
            }
        }
        Ok(())
    }

    /// Stops the units' activity records: returns once neither unit writes records any more,
    /// so the buffer may be unmapped (also after a fault, which it acknowledges). Nothing to
    /// do on a removed device (its engine stopped).
    ///
    /// # Errors
    /// [`DeviceError::Timeout`] when a unit does not acknowledge in the device's
    /// [`ack_timeout`](crate::Config::ack_timeout): it may still write the buffer, which must
    /// then be leaked, not unmapped.
    pub fn disable_activity(&self) -> Result<(), DeviceError> {
        if self.events.is_removed() {
            return Ok(());
        }
        self.set(regs::ACTIVITY_CONTROL, ActivityControl::empty())?;
        let stopped = self.wait_for("stop activity records", self.config.ack_timeout, |d| {
            Unit::ALL.iter().try_fold(true, |all, &unit| {
                Ok(all
                    && d.get(activity_field(regs::ACTIVITY_STATUS, unit))?
                        .is_empty())
            })
        });
        match stopped {
            // A stopped engine writes nothing any more.
            Err(e) if matches!(LoopbackError::of(&e), Some(LoopbackError::Stopped { .. })) => {
                Ok(())
            }
            other => other,
        }
    }

    /// Records `unit` has written since it took the enable (its
    /// [`ACTIVITY_WRITTEN`](regs::ACTIVITY_WRITTEN) register).
    ///
    /// # Errors
    /// Register access errors.
    pub fn activity_written(&self, unit: Unit) -> Result<u64, DeviceError> {
        self.get(activity_field(regs::ACTIVITY_WRITTEN, unit))
    }

    /// `unit`'s activity status, and its fault code while it reports one.
    ///
    /// # Errors
    /// Register access errors.
    pub fn activity_status(
        &self,
        unit: Unit,
    ) -> Result<(ActivityStatus, Option<ActivityFault>), DeviceError> {
        let status = self.get(activity_field(regs::ACTIVITY_STATUS, unit))?;
        let fault = if status.contains(ActivityStatus::FAULT) {
            ActivityFault::from_raw(self.get(activity_field(regs::ACTIVITY_FAULT, unit))?)
        } else {
            None
        };
        Ok((status, fault))
    }
}
