//! [`Log`]: an activity buffer the host owns — host memory mapped into the device's DMA space,
//! the device programmed to write its records there, and a [`Reader`] draining them — which
//! stops the device's records before it lets the memory go.

use std::sync::Arc;

use userdma::device::Device;
use userdma::dma::Mapping;
use userdma::memory::PageSize;

use super::{buffer_bytes, Drained, Reader, Record};
use crate::error::Error as LoopbackError;
use crate::regs::Unit;
use crate::Loopback;

/// The device's activity records into a buffer this value owns. Dropping it stops the records
/// and then unmaps the buffer (or leaks it, if the device does not acknowledge the stop: it
/// may still write there). One log per device: the registers it programs are the device's.
#[derive(Debug)]
pub struct Log {
    device: Arc<Loopback>,
    /// The buffer (`None` once given up: stopped or leaked).
    buffer: Option<Mapping>,
    reader: Reader,
    /// Records lost across a reset (written and not drained before it), reported by the next
    /// drain.
    lost_in_reset: u64,
}

impl Log {
    /// Maps a buffer of `records_per_unit` records per unit into `device`'s DMA space and starts
    /// the device's records into it.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for a `records_per_unit` that is not a power of
    /// two from 1 to [`MAX_ACTIVITY_RECORDS`](crate::regs::MAX_ACTIVITY_RECORDS); no memory or
    /// IOVA space for the buffer; the device's errors from
    /// [`Loopback::enable_activity`].
    pub fn start(device: Arc<Loopback>, records_per_unit: u32) -> Result<Log, userdma::Error> {
        let reader = Reader::new(records_per_unit)?;
        let bytes = buffer_bytes(records_per_unit).ok_or(LoopbackError::Config {
            field: "activity records per unit",
            value: u64::from(records_per_unit),
            expected: "a power of two from 1 to 1048576",
        })?;
        let buffer =
            userdma::runtime::map_memory(device.dma_space().as_ref(), bytes, PageSize::Base)?;
        let iova = buffer.iova(0).ok_or_else(|| userdma::Error::Unsupported {
            device: device.identity().to_string(),
            what: "IOVA for the activity buffer",
            hint: "its DMA space gave the mapping none; the loopback device's always does",
        })?;
        // On failure the mapping drops here: the device refused it or never took it, so it
        // writes nothing there.
        device.enable_activity(iova, records_per_unit)?;
        Ok(Log {
            device,
            buffer: Some(buffer),
            reader,
            lost_in_reset: 0,
        })
    }

    /// Records per unit.
    pub fn records_per_unit(&self) -> u32 {
        self.reader.records_per_unit()
    }

    /// The device.
    pub fn device(&self) -> &Arc<Loopback> {
        &self.device
    }

    /// Hands every record written since the last drain to `out`, oldest first per unit (the
    /// copy engine's, then the compute unit's), and counts the lost and the bad
    /// ([`Reader::drain`]). Allocates nothing. A removed device, whose counts cannot be read,
    /// hands out nothing.
    pub fn drain(&mut self, out: &mut dyn FnMut(&Record)) -> Drained {
        let mut drained = Drained {
            lost: std::mem::take(&mut self.lost_in_reset),
            ..Drained::default()
        };
        let Some(buffer) = self.buffer.as_ref() else {
            return drained;
        };
        let device = &self.device;
        let mut written = |unit: Unit| -> Option<u64> {
            // A removed device's registers read all-ones: no count at all.
            if device.events.is_removed() {
                return None;
            }
            device.activity_written(unit).ok()
        };
        drained.add(self.reader.drain(buffer.slice(), &mut written, out));
        drained
    }

    /// Before a device reset: counts the records written and not drained as lost (the reset
    /// stops the records and zeroes the counts; the next drain reports them).
    pub fn note_reset(&mut self) {
        for unit in Unit::ALL {
            if let Ok(written) = self.device.activity_written(unit) {
                let unread = written.saturating_sub(self.reader.next(unit));
                self.lost_in_reset = self.lost_in_reset.saturating_add(unread);
            }
        }
    }

    /// After a device reset (which turned the records off): starts them again into the same
    /// buffer, the reader from record 0.
    ///
    /// # Errors
    /// The device's errors from [`Loopback::enable_activity`]; a log whose buffer was given up.
    pub fn restart(&mut self) -> Result<(), userdma::Error> {
        let iova = self
            .buffer
            .as_ref()
            .and_then(|b| b.iova(0))
            .ok_or(LoopbackError::Stopped { exit: None })?;
        self.device
            .enable_activity(iova, self.reader.records_per_unit())?;
        self.reader.restart();
        Ok(())
    }

    /// Stops the device's records and unmaps the buffer.
    ///
    /// # Errors
    /// The device did not acknowledge the stop: the buffer is leaked (the device may still
    /// write it).
    pub fn stop(mut self) -> Result<(), userdma::Error> {
        self.give_up().map_err(Into::into)
    }

    /// Stops the records, then unmaps the buffer, or leaks it if the device did not stop.
    fn give_up(&mut self) -> Result<(), userdma::device::Error> {
        let Some(buffer) = self.buffer.take() else {
            return Ok(());
        };
        match self.device.disable_activity() {
            Ok(()) => {
                drop(buffer);
                Ok(())
            }
            Err(err) => {
                // The device may still write the buffer: it must never be unmapped and reused.
                std::mem::forget(buffer);
                Err(err)
            }
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        // A failure leaked the buffer; there is no one to report it to.
        let _ = self.give_up();
    }
}
