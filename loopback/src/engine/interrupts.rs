//! A unit's interrupts: a vector raised when unmasked, marked pending in `irq_pending` while
//! masked, and delivered once unmasked, by either unit, each pending bit exactly once.

use std::os::fd::AsFd;

use super::{CounterRegs, Shared, Totals, Unit};
use crate::bar::RegisterFile;
use crate::regs;
use crate::shim;
use crate::sync::Ordering;

impl Unit<'_> {
    /// Raises every pending vector that is no longer masked.
    pub(super) fn deliver_unmasked(&mut self) {
        deliver_unmasked(self.file, self.shared, &mut self.totals, self.counters);
    }
}

/// Signals vector `q`'s eventfd, counting it first in the raising unit's counters (a host
/// woken by it sees the count).
#[inline]
fn signal(file: &RegisterFile, shared: &Shared, totals: &mut Totals, c: CounterRegs, q: usize) {
    if let Some(fd) = shared.fds.get(q) {
        totals.interrupts += 1;
        file.set64(c.interrupts, totals.interrupts);
        // A failed eventfd write (the host closed its end) loses an interrupt the host no
        // longer waits for; there is nobody to report it to. An eventfd write is atomic, so
        // both units may signal the same vector.
        let _ = shim::eventfd_signal(fd.as_fd());
    }
}

/// Raises vector `q`, or marks it pending if masked.
#[inline]
pub(super) fn raise(
    file: &RegisterFile,
    shared: &Shared,
    totals: &mut Totals,
    c: CounterRegs,
    q: usize,
) {
    let bit = 1u32 << q;
    if file.get32(regs::IRQ_MASK.offset()) & bit == 0 {
        signal(file, shared, totals, c, q);
        return;
    }
    let pending = file.u32(regs::IRQ_PENDING.offset());
    // AcqRel: a read-modify-write of a register the host reads (Release), after the mask read
    // (Acquire). Both units set bits with it and take them with the `fetch_and` in
    // `deliver_unmasked`: each bit set is delivered exactly once.
    pending.fetch_or(bit, Ordering::AcqRel);
    // The host may have unmasked between the two reads: deliver now if so.
    deliver_unmasked(file, shared, totals, c);
}

/// Raises every pending vector that is no longer masked (by either unit).
#[inline]
fn deliver_unmasked(file: &RegisterFile, shared: &Shared, totals: &mut Totals, c: CounterRegs) {
    let mask = file.get32(regs::IRQ_MASK.offset());
    // Relaxed: a cheap look first, so the common case (nothing pending) writes nothing.
    if file.u32(regs::IRQ_PENDING.offset()).load(Ordering::Relaxed) & !mask == 0 {
        return;
    }
    // AcqRel: takes the unmasked pending bits in one read-modify-write (Acquire: after the
    // mask read; Release: the host reading `irq_pending` sees them gone after the signals'
    // counts), so two units delivering at once never deliver a bit twice nor lose one set
    // meanwhile by the other.
    let before = file
        .u32(regs::IRQ_PENDING.offset())
        .fetch_and(mask, Ordering::AcqRel);
    let deliver = before & !mask;
    for q in 0..shared.fds.len() {
        if deliver & (1 << q) != 0 {
            signal(file, shared, totals, c, q);
        }
    }
}
