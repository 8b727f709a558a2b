//! Fault injection in the units: the copy engine programs a queue's injection when the host
//! writes the fault block's `control`; the unit serving the queue takes a copy of its programme
//! for each burst (only when `armed` says there is one), decides which descriptors it hits, and
//! writes the programme's state back after the burst.

use super::Unit;
use crate::fault::{Kind, Programme};
use crate::regs::{self, FaultControl};
use crate::sync::{AtomicU32, Ordering};
use userdma::ring::{Command, DeviceQueue, Status, POSTED};

impl<'a> Unit<'a> {
    /// Acts on a write of the fault block's `control` (the copy engine only): programs or
    /// clears the selected queue's injection, then acknowledges (`applied` moves).
    pub(super) fn fault_control(&mut self) {
        let f = self.file;
        let control = FaultControl::from_bits_retain(f.get32(regs::FAULT_CONTROL.offset()));
        if control.is_empty() {
            return;
        }
        let q = f.get32(regs::FAULT_QUEUE.offset()) as usize;
        let applied = f.get32(regs::FAULT_APPLIED.offset()).wrapping_add(1);
        if q < self.queues.len() {
            let programme = if control.contains(FaultControl::APPLY) {
                Programme::new(
                    f.get32(regs::FAULT_KINDS.offset()),
                    f.get32(regs::FAULT_COUNT.offset()),
                    f.get32(regs::FAULT_RATE.offset()),
                    f.get64(regs::FAULT_SEED.offset()),
                    f.get32(regs::FAULT_DELAY_US.offset()),
                    applied,
                )
            } else {
                None
            };
            let mut faults = self.faults();
            faults[q] = programme;
            set_armed(&self.shared.armed, q, programme.is_some());
        }
        f.set32(regs::FAULT_CONTROL.offset(), 0);
        // Release (in `set32`): after the programme and its `armed` bit, so a host that saw
        // the acknowledgement and then rings the queue's doorbell has the serving unit (which
        // reads `armed` after the doorbell, with Acquire) see the programme.
        f.set32(regs::FAULT_APPLIED.offset(), applied);
    }

    /// The fault programmes, locked (a poisoned lock is still consistent: every change under
    /// it is a single store).
    fn faults(&self) -> std::sync::MutexGuard<'a, Vec<Option<Programme>>> {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queue `q`'s programme for a burst (a copy), if `armed` says it has one.
    #[cold]
    #[inline(never)]
    pub(super) fn programme(&self, q: usize) -> Option<Programme> {
        self.faults()[q]
    }

    /// Writes back the state a burst moved in queue `q`'s programme, unless the host
    /// programmed the queue anew meanwhile; a programme that can hit nothing more is removed.
    #[cold]
    #[inline(never)]
    pub(super) fn keep_programme(&self, q: usize, programme: Programme) {
        let mut faults = self.faults();
        if faults[q].is_some_and(|p| p.generation == programme.generation) {
            let spent = programme.is_spent();
            faults[q] = (!spent).then_some(programme);
            set_armed(&self.shared.armed, q, !spent);
        }
    }
}

/// Whether `programme` hits the next descriptor (`next`, as peeked) and with what, given
/// `room` CQ entries free: never a posted descriptor (no completion to misbehave with), and
/// [`Kind::CompleteTwice`] only with room for both completions (otherwise nothing, and a
/// count trigger is not used up).
#[inline]
pub(super) fn inject(programme: &mut Programme, next: Option<Command>, room: u32) -> Option<Kind> {
    if next?.command_id == POSTED {
        return None;
    }
    let kind = programme.decide()?;
    if kind == Kind::CompleteTwice && room < 2 {
        programme.refund();
        return None;
    }
    Some(kind)
}

/// The command id a [`Kind::WrongId`] completion names, the descriptor just taken being the
/// wrong one's: the newest announced command's when at least two are announced after it (an
/// id in flight that is not the next one, which a lost completion would name), else the
/// queue's depth (no command of the queue has it).
#[inline]
pub(super) fn wrong_id(queue: &DeviceQueue<Command, Status>) -> u16 {
    let after = queue.available();
    let newest = (after >= 2)
        .then(|| queue.peek(after - 1))
        .flatten()
        .map(|c| c.command_id)
        .filter(|&id| id != POSTED);
    // The depth is at most `MAX_DEPTH` (2^15): it fits.
    newest.unwrap_or(queue.layout().depth() as u16)
}

/// Sets or clears queue `q`'s bit in `armed` (under the programmes' lock).
fn set_armed(armed: &AtomicU32, q: usize, on: bool) {
    // Release: after the programme stored under the lock (a unit that reads the bit with
    // Acquire and then locks sees it anyway; the ordering keeps the snapshot honest even
    // before the lock).
    if on {
        armed.fetch_or(1 << q, Ordering::Release);
    } else {
        armed.fetch_and(!(1 << q), Ordering::Release);
    }
}
