//! A unit acting on the host's register writes: the device's `control` (reset, together with
//! the other unit), activity records on and off, its queues started, stopped and faulted under
//! the owners lock, and the interrupt masks.

use std::mem::size_of;
use std::time::Duration;

use super::{publish, qf, Active, CounterRegs, Totals, Unit};
use crate::cost::Clock;
use crate::regs::{self, Control, Fault, QueueControl, QueueStatus, Unit as UnitId};
use crate::sram::WorkingSet;
use userdma::ring::{self, Command, DeviceQueue, Doorbells, Layout, Memory, Status};

/// How long a unit waiting at the reset rendezvous sleeps between looks at the shutdown flag.
const RENDEZVOUS_POLL: Duration = Duration::from_millis(1);

impl<'a> Unit<'a> {
    /// Acts on the control registers: reset, fault programmes, queues to start or stop, masks.
    pub(super) fn control(&mut self) {
        let control = Control::from_bits_retain(self.file.get32(regs::CONTROL.offset()));
        if control.contains(Control::RESET) {
            self.reset();
        }
        self.activity_control();
        if self.id == UnitId::Copy {
            self.fault_control();
        }
        let mut owners = self.owners();
        for q in 0..self.queues.len() {
            let control = QueueControl::from_bits_retain(self.file.get32(qf(regs::Q_CONTROL, q)));
            let status = QueueStatus::from_bits_retain(self.file.get32(qf(regs::Q_STATUS, q)));
            let enable = control.contains(QueueControl::ENABLE);
            match owners[q] {
                Some(owner) if owner == self.id && !enable => {
                    self.drop_queue(q);
                    owners[q] = None;
                    self.file.set32(qf(regs::Q_FAULT, q), Fault::None as u32);
                    self.file.set32(qf(regs::Q_STATUS, q), 0);
                }
                // This unit's queue, still enabled, or the other unit's.
                Some(_) => {}
                None if enable && !status.contains(QueueStatus::FAULT) => {
                    match UnitId::from_raw(self.file.get32(qf(regs::Q_UNIT, q))) {
                        Some(unit) if unit == self.id => {
                            if self.start(q) {
                                owners[q] = Some(self.id);
                            }
                        }
                        Some(_) => {}
                        None => self.set_fault(q, Fault::BadUnit),
                    }
                }
                None if !enable && !status.is_empty() => {
                    // A faulted queue the host acknowledged.
                    self.file.set32(qf(regs::Q_FAULT, q), Fault::None as u32);
                    self.file.set32(qf(regs::Q_STATUS, q), 0);
                }
                None => {}
            }
        }
        drop(owners);
        self.deliver_unmasked();
    }

    /// Writes `fault` into queue `q`'s registers (the caller holds the owners lock and has
    /// torn the queue down).
    // Inlined into its callers as it is without the `tracing` feature: what the feature adds
    // is a call to the cold `report_fault`.
    #[cfg_attr(feature = "tracing", inline(always))]
    fn set_fault(&self, q: usize, fault: Fault) {
        #[cfg(feature = "tracing")]
        report_fault(q, fault, self.id);
        self.file.set32(qf(regs::Q_FAULT, q), fault as u32);
        self.file
            .set32(qf(regs::Q_STATUS, q), QueueStatus::FAULT.bits());
    }

    /// Stops this unit's queue `q` on `fault` (from the serving path).
    // Out of line as it is without the `tracing` feature (where the inliner leaves it so), so
    // the feature leaves the units' loop, its caller, laid out as it is without it.
    #[cfg_attr(feature = "tracing", inline(never))]
    pub(super) fn fault(&mut self, q: usize, fault: Fault) {
        let mut owners = self.owners();
        self.drop_queue(q);
        owners[q] = None;
        self.set_fault(q, fault);
    }

    /// Starts serving queue `q` from its registers; whether it started (else it is faulted).
    /// The caller holds the owners lock.
    fn start(&mut self, q: usize) -> bool {
        let base = self.file.get64(qf(regs::Q_RING_BASE, q));
        let depth = self.file.get32(qf(regs::Q_DEPTH, q));
        let context = self.file.get32(qf(regs::Q_CONTEXT, q));
        let fault = |unit: &Self, fault| {
            unit.set_fault(q, fault);
            false
        };
        if depth > self.settings.max_depth {
            return fault(self, Fault::BadDepth);
        }
        let Ok(layout) = Layout::new::<Command, Status>(depth) else {
            return fault(self, Fault::BadDepth);
        };
        if base % ring::ALIGN as u64 != 0 {
            return fault(self, Fault::RingMisaligned);
        }
        let Some(span) = self.host.table().translate(base, layout.size()) else {
            return fault(self, Fault::RingUnmapped);
        };
        // SAFETY: the span is `layout.size()` bytes of one mapping, IOVA-contiguous (a
        // translation never spans two pieces), readable and writable; `Active` keeps the span,
        // so the memory stays mapped while the device queue (dropped first) uses it. Ring
        // memory is accessed by host and device only through atomics and volatile accesses.
        let memory = unsafe { Memory::from_raw(span.as_ptr(), span.len(), base) };
        let Ok(memory) = memory else {
            return fault(self, Fault::RingMisaligned);
        };
        let doorbells = Doorbells::new(
            self.doorbell_block.clone(),
            qf(regs::Q_SQ_TAIL, q),
            qf(regs::Q_CQ_HEAD, q),
        );
        let peek = memory.clone();
        // `q < MAX_QUEUES`, so it fits a u16; the doorbells are distinct registers in the BAR.
        let queue = doorbells
            .and_then(|doorbells| DeviceQueue::new(q as u16, depth, memory, doorbells, None));
        let Ok(queue) = queue else {
            return fault(self, Fault::BadDepth);
        };
        // The queue's counters go on from their registers (another unit may have served the
        // queue before; a reset zeroed them).
        self.queue_totals[q] = (
            self.file.get64(qf(regs::Q_COMPLETED, q)),
            self.file.get64(qf(regs::Q_ERRORS, q)),
        );
        let working_set = WorkingSet {
            queue: q as u16,
            private: self.file.get64(qf(regs::Q_WS_PRIVATE, q)),
            shared: self.file.get64(qf(regs::Q_WS_SHARED, q)),
            key: self.file.get32(qf(regs::Q_SHARE_KEY, q)),
        };
        let sram = (
            self.file.get64(qf(regs::Q_SRAM_HITS, q)),
            self.file.get64(qf(regs::Q_SRAM_TOUCHED, q)),
        );
        self.queues[q] = Some(Active {
            queue,
            memory: peek,
            context,
            working_set,
            sram,
            blocked: None,
            stalled: false,
            _ring: span,
        });
        // Before ENABLED: the host rings only after seeing it, and its doorbells must wake
        // this unit.
        self.file.set_owner(q, self.id);
        self.file.set32(qf(regs::Q_FAULT, q), Fault::None as u32);
        self.file
            .set32(qf(regs::Q_STATUS, q), QueueStatus::ENABLED.bits());
        true
    }

    /// Resets the device (see [`Control::RESET`]), together with the other unit: each tears
    /// down its own queues and zeroes its own state; the compute unit then parks, and the copy
    /// engine, once it has parked, zeroes the registers and the device memory, clears `control`
    /// and counts the reset, which releases the compute unit. Neither unit serves anything
    /// meanwhile, and neither touches host memory after its queues are torn down.
    fn reset(&mut self) {
        for q in 0..self.queues.len() {
            self.drop_queue(q);
        }
        self.totals = Totals::default();
        self.queue_totals.iter_mut().for_each(|t| *t = (0, 0));
        self.clock = Clock::new();
        self.sram.clear();
        self.last_context = None;
        self.next_queue = 0;
        // Records off: this unit writes none after this (the copy engine zeroes the block).
        self.recorder = None;
        let shared = self.shared;
        let mut state = shared
            .reset
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.id == UnitId::Compute {
            state.parked += 1;
            let ticket = state.parked;
            shared.reset_moved.notify_all();
            while state.done < ticket && !self.file.shutting_down() {
                state = shared
                    .reset_moved
                    .wait_timeout(state, RENDEZVOUS_POLL)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
            }
            return;
        }
        while state.parked <= state.done {
            if self.file.shutting_down() {
                return;
            }
            state = shared
                .reset_moved
                .wait_timeout(state, RENDEZVOUS_POLL)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
        self.owners().iter_mut().for_each(|o| *o = None);
        for q in 0..self.queues.len() {
            for offset in (0..regs::QUEUE_STRIDE).step_by(4) {
                self.file
                    .set32(regs::QUEUE_BASE + q * regs::QUEUE_STRIDE + offset, 0);
            }
            for offset in (0..regs::DOORBELL_STRIDE).step_by(4) {
                self.file
                    .set32(regs::DOORBELL_BASE + q * regs::DOORBELL_STRIDE + offset, 0);
            }
        }
        self.file.set32(regs::IRQ_MASK.offset(), 0);
        self.file.set32(regs::IRQ_PENDING.offset(), 0);
        // Activity records off, counts zeroed: the host programs them again.
        for offset in (0..size_of::<regs::ActivityRegs>()).step_by(4) {
            self.file.set32(regs::ACTIVITY_BASE + offset, 0);
        }
        // SAFETY: the device memory is `len` writable bytes the engine owns; no queue is served
        // now (the compute unit is parked), so nothing else of the engine touches it.
        unsafe { std::ptr::write_bytes(self.dram.ptr.as_ptr(), 0, self.dram.len) };
        for unit in UnitId::ALL {
            publish(self.file, CounterRegs::of(unit), &Totals::default());
        }
        self.file.set32(regs::CONTROL.offset(), 0);
        self.reset_count = self.reset_count.wrapping_add(1);
        self.file
            .set32(regs::RESET_COUNT.offset(), self.reset_count);
        state.done = state.parked;
        shared.reset_moved.notify_all();
    }
}

/// Reports a queue the device faulted (the `tracing` feature): out of line, so that the units'
/// loop, into which the callers are inlined, is laid out as without the feature.
#[cfg(feature = "tracing")]
#[cold]
#[inline(never)]
fn report_fault(queue: usize, fault: Fault, unit: UnitId) {
    tracing::warn!(queue, fault = ?fault, unit = ?unit, "queue faulted by the device");
}
