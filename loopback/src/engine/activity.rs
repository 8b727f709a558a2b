//! A unit's activity records (the trace unit: [`regs::ActivityRegs`], the record format in
//! [`activity`](crate::activity)): taking the host's enable and disable, and writing one record
//! per completed descriptor into the unit's own ring of the host's buffer, through its own
//! translation of host addresses.
//!
//! While records are off a unit keeps no [`Recorder`] (`Unit::recorder` is `None`), and the
//! serving loop's whole cost is the one branch on it per descriptor. While they are on, each
//! record is: a look at the translation table's generation (one atomic load; a new translation
//! of the ring only when the table changed), `fence(Release)`, eight relaxed 64-bit atomic
//! stores and the Release store of the unit's `written` count.

use std::ptr::NonNull;
use std::time::Instant;

use super::Unit;
use crate::activity::{valid_records, Anchor, Record, RECORD_BYTES};
use crate::bar::RegisterFile;
use crate::ops::{Span, Translate};
use crate::regs::{
    self, activity_field, ActivityControl, ActivityFault, ActivityStatus, Unit as UnitId,
};
use crate::sync::{fence, AtomicU64, Ordering};
use crate::u64_of;

/// A unit's activity recording while it is on: its ring of the host's buffer and its count.
#[derive(Debug)]
pub(super) struct Recorder {
    /// The unit's ring (`records * 64` bytes), kept mapped while the recorder holds it.
    ring: Span,
    /// The ring's first IOVA.
    iova: u64,
    /// The table generation `ring` was translated in.
    generation: u64,
    /// Records in the ring, minus 1 (a power of two minus 1: the slot mask).
    mask: u64,
    /// Records written since the enable (the `written` register's value).
    written: u64,
    /// The offset of the unit's `written` register.
    written_reg: usize,
    /// Converts the unit's `Instant`s to `CLOCK_MONOTONIC` nanoseconds.
    anchor: Anchor,
}

impl Recorder {
    /// The recorder of `unit` over its ring of the buffer the registers describe, or why it
    /// cannot have one.
    fn start(
        file: &RegisterFile,
        table: &dyn Translate,
        unit: UnitId,
    ) -> Result<Recorder, ActivityFault> {
        let base = file.get64(regs::ACTIVITY_BUFFER.offset());
        let records = file.get32(regs::ACTIVITY_RECORDS.offset());
        if !valid_records(records) {
            return Err(ActivityFault::BadRecords);
        }
        if base % u64_of(RECORD_BYTES) != 0 {
            return Err(ActivityFault::Misaligned);
        }
        // At most 2^20 * 64 bytes per ring: fits.
        let len = records as usize * RECORD_BYTES;
        let iova = u64_of(len)
            .checked_mul(u64::from(unit as u32))
            .and_then(|offset| base.checked_add(offset))
            .ok_or(ActivityFault::Unmapped)?;
        let generation = table.generation();
        let ring = translate(table, iova, len)?;
        Ok(Recorder {
            ring,
            iova,
            generation,
            mask: u64::from(records) - 1,
            written: 0,
            written_reg: activity_field(regs::ACTIVITY_WRITTEN, unit).offset(),
            anchor: Anchor::now(),
        })
    }

    /// `at` in `CLOCK_MONOTONIC` nanoseconds.
    #[inline]
    pub(super) fn ns(&self, at: Instant) -> u64 {
        self.anchor.ns(at)
    }

    /// Writes `record` (its `sequence` set here) into the next slot and publishes it in the
    /// unit's `written` register; the ring's fault when it is no longer mapped (nothing is
    /// written then).
    #[inline]
    pub(super) fn write(
        &mut self,
        table: &dyn Translate,
        file: &RegisterFile,
        mut record: Record,
    ) -> Result<(), ActivityFault> {
        // Acquire (inside `generation`): a table unchanged since the translation still maps
        // the ring; a changed one is looked at again.
        if table.generation() != self.generation {
            self.retranslate(table)?;
        }
        // The low 32 bits on purpose (the field's width).
        record.sequence = self.written as u32;
        // `mask < 2^20`: fits.
        let at = (self.written & self.mask) as usize * RECORD_BYTES;
        let ring: NonNull<u8> = self.ring.as_ptr();
        // Release: the host's reader copies a slot and then re-reads `written` after a
        // `fence(Acquire)` (activity::Reader); this fence orders the store of
        // `written = self.written` (the previous record's publication, which says this slot
        // is being overwritten) before the stores below, so a reader that copied any byte of
        // this record finds the count that tells it the copy may be torn.
        fence(Ordering::Release);
        for (k, word) in record.to_words().into_iter().enumerate() {
            // SAFETY: `at + 64 <= ring.len()` (slot `written & mask < records`, the ring
            // `records * 64` bytes of one mapping, kept mapped by the span while this
            // reference lives: only for this store), and `at + 8 * k` is 8-aligned (`start`
            // checked the ring's address is 64-aligned). The host reads the buffer with
            // 64-bit atomic loads (activity::Reader) and touches it otherwise only before the
            // enable and after the disable (ordered by those registers), so the word is
            // accessed atomically whenever this store may race: an atomic reference to it is
            // sound, as the register file's are.
            let slot = unsafe { AtomicU64::from_ptr(ring.as_ptr().add(at + 8 * k).cast()) };
            // Relaxed: ordered by the fence above and the Release store of the count below
            // (the seqlock's writer side); a reader never relies on one word alone.
            slot.store(word, Ordering::Relaxed);
        }
        self.written += 1;
        // Release (in `set64`): after the record's bytes; a host that reads the count with
        // Acquire sees every record it counts.
        file.set64(self.written_reg, self.written);
        Ok(())
    }

    /// Translates the ring again (the table changed: it may have been unmapped).
    #[cold]
    #[inline(never)]
    fn retranslate(&mut self, table: &dyn Translate) -> Result<(), ActivityFault> {
        let generation = table.generation();
        let len = self.ring.len();
        // Drop the old span first: it may be the last hold on an unmapped region.
        self.ring = translate(table, self.iova, len)?;
        self.generation = generation;
        Ok(())
    }
}

/// The ring of `len` bytes at `iova`, checked to be device-writable and 64-byte aligned.
fn translate(table: &dyn Translate, iova: u64, len: usize) -> Result<Span, ActivityFault> {
    let ring = table.translate(iova, len).ok_or(ActivityFault::Unmapped)?;
    if !ring.device_writes() {
        return Err(ActivityFault::NotWritable);
    }
    if ring.as_ptr().as_ptr() as usize % RECORD_BYTES != 0 {
        // The host memory behind a 64-aligned IOVA is not (a table that maps at an offset):
        // the records' 64-bit stores need alignment.
        return Err(ActivityFault::Misaligned);
    }
    Ok(ring)
}

/// Stops unit `unit`'s records on `fault`: its status says so, until the host clears
/// `ENABLE`.
#[cold]
#[inline(never)]
pub(super) fn report_fault(file: &RegisterFile, unit: UnitId, fault: ActivityFault) {
    file.set32(
        activity_field(regs::ACTIVITY_FAULT, unit).offset(),
        fault as u32,
    );
    // Release (in `set32`): after the fault code, which the host reads once it sees this.
    file.set32(
        activity_field(regs::ACTIVITY_STATUS, unit).offset(),
        ActivityStatus::FAULT.bits(),
    );
}

impl Unit<'_> {
    /// Acts on the activity block's `control`: takes an enable (a recorder over this unit's
    /// ring, its count zeroed, then `ENABLED`; or `FAULT`), or a disable (the recorder
    /// dropped, then the status cleared: after that this unit writes no record byte).
    pub(super) fn activity_control(&mut self) {
        let f = self.file;
        let control = ActivityControl::from_bits_retain(f.get32(regs::ACTIVITY_CONTROL.offset()));
        let status_reg = activity_field(regs::ACTIVITY_STATUS, self.id).offset();
        let status = ActivityStatus::from_bits_retain(f.get32(status_reg));
        let enable = control.contains(ActivityControl::ENABLE);
        if enable && status.is_empty() {
            match Recorder::start(f, self.host.table(), self.id) {
                Ok(recorder) => {
                    f.set64(recorder.written_reg, 0);
                    f.set32(activity_field(regs::ACTIVITY_FAULT, self.id).offset(), 0);
                    self.recorder = Some(recorder);
                    // Release (in `set32`): after the zeroed count.
                    f.set32(status_reg, ActivityStatus::ENABLED.bits());
                }
                Err(fault) => report_fault(f, self.id, fault),
            }
        } else if !enable && !status.is_empty() {
            self.recorder = None;
            f.set32(activity_field(regs::ACTIVITY_FAULT, self.id).offset(), 0);
            // Release (in `set32`): every record this unit wrote (on this thread, before)
            // is visible to a host that sees the status cleared, and none follows.
            f.set32(status_reg, 0);
        }
    }
}
