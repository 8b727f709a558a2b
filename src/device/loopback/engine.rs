//! The DMA engine: the loop that plays the device. It runs on a thread of the host process or in
//! the device process, and reaches the host only through the register file, the device memory
//! and the translation table it is given.
//!
//! Each turn it handles register changes (reset, queues enabled and stopped, interrupt masks),
//! then serves one burst of up to `max_burst` descriptors from the next queue with work (round
//! robin), completing them in order, writing the SQ head back once per burst and raising the
//! queue's interrupt if the host armed it. With nothing to do it spins for `idle_spin`, then
//! sleeps on the register file's futex until the host writes a register (see `bar.rs`).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bar::{DeviceBar, RegisterFile};
use super::cost::{Clock, Cost};
use super::ops::{self, Dram, Host, Span, Translate};
use super::regs::{self, Code, Control, DeviceStatus, Fault, QueueControl, QueueStatus};
use super::shim;
use crate::memory::u64_of;
use crate::mmio::{Block, Field};
use crate::ring::{self, Command, DeviceQueue, Doorbells, Layout, Memory, Status, POSTED};

/// How the engine is set up (the parts of the device configuration it needs).
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) queues: u16,
    pub(super) max_depth: u32,
    pub(super) dma_mask_bits: u32,
    pub(super) cost: Cost,
    pub(super) max_burst: u32,
    pub(super) idle_spin: Duration,
    /// The CPU to run on, if pinned.
    pub(super) cpu: Option<u32>,
}

/// A queue the engine serves. Field order matters: the device queue (which accesses the ring)
/// drops before the span that keeps the ring mapped.
#[derive(Debug)]
struct Active {
    queue: DeviceQueue<Command, Status>,
    /// The ring memory again, to peek at the host's interrupt flag without a fence.
    memory: Memory,
    context: u32,
    _ring: Span,
}

/// The engine's own running totals, mirrored into the counter registers.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    descriptors: u64,
    bytes: u64,
    switches: u64,
    errors: u64,
    busy_ns: u64,
}

/// The device side of the loopback device.
#[derive(Debug)]
pub(super) struct Engine {
    settings: Settings,
    file: Arc<RegisterFile>,
    doorbell_block: crate::mmio::DynBlock,
    dram: Dram,
    host: Host,
    vectors: Vectors,
    queues: Vec<Option<Active>>,
    /// Per-queue (completed, errors).
    queue_totals: Vec<(u64, u64)>,
    totals: Totals,
    clock: Clock,
    last_context: Option<u32>,
    next_queue: usize,
    reset_count: u32,
}

// SAFETY: the only non-Send field is `dram`'s pointer, into device memory that the caller of
// `Engine::new` keeps mapped for the engine's life; the engine is the only user of that pointer
// on its thread.
unsafe impl Send for Engine {}

/// Writes the device-wide counters into their registers.
fn publish(file: &RegisterFile, totals: &Totals, interrupts: u64) {
    file.set64(regs::DESCRIPTORS.offset(), totals.descriptors);
    file.set64(regs::BYTES.offset(), totals.bytes);
    file.set64(regs::CONTEXT_SWITCHES.offset(), totals.switches);
    file.set64(regs::ERRORS.offset(), totals.errors);
    file.set64(regs::BUSY_NS.offset(), totals.busy_ns);
    file.set64(regs::INTERRUPTS.offset(), interrupts);
}

/// The register `field` of queue `q` (in range: `q < queues <= MAX_QUEUES`).
fn qf<V, A>(field: Field<V, A>, q: usize) -> usize {
    field.offset() + q * regs::QUEUE_STRIDE
}

impl Engine {
    /// An engine over `file`, device memory `dram` (which must stay mapped while the engine
    /// lives: the caller keeps its region), host memory through `table`, and one interrupt
    /// eventfd per queue.
    pub(super) fn new(
        settings: Settings,
        file: Arc<RegisterFile>,
        dram: Dram,
        table: Arc<dyn Translate>,
        irqs: Vec<OwnedFd>,
    ) -> Engine {
        let queues = usize::from(settings.queues);
        let doorbell_block = Block::new(DeviceBar::new(Arc::clone(&file))).erase();
        Engine {
            settings,
            file: Arc::clone(&file),
            doorbell_block,
            dram,
            host: Host::new(table),
            vectors: Vectors {
                file: Arc::clone(&file),
                fds: irqs,
                raised: 0,
            },
            queues: (0..queues).map(|_| None).collect(),
            queue_totals: vec![(0, 0); queues],
            totals: Totals::default(),
            clock: Clock::new(),
            last_context: None,
            next_queue: 0,
            reset_count: 0,
        }
    }

    /// Runs until the register file asks for shutdown.
    pub(super) fn run(mut self) {
        self.identify();
        // Acquire (here and in the loop): pairs with the host's increments after its register
        // writes, so the registers read afterwards include those writes.
        let mut control = self.file.control_seq().load(crate::sync::Ordering::Acquire);
        self.control();
        self.file
            .set32(regs::STATUS.offset(), DeviceStatus::READY.bits());
        loop {
            if self.file.shutting_down() {
                break;
            }
            let seen = self.file.wake_seq().load(crate::sync::Ordering::Acquire);
            let now = self.file.control_seq().load(crate::sync::Ordering::Acquire);
            if now != control {
                control = now;
                self.control();
            }
            if self.serve(control) {
                continue;
            }
            self.idle(seen);
        }
        // Every queue stops: nothing of the host's is touched after this.
        for slot in &mut self.queues {
            *slot = None;
        }
        self.file.set32(regs::STATUS.offset(), 0);
    }

    /// Writes the read-only identification registers.
    fn identify(&self) {
        let f = &self.file;
        f.set32(regs::ID.offset(), regs::DEVICE_ID);
        f.set32(regs::VERSION.offset(), regs::VERSION_1);
        f.set32(regs::QUEUES.offset(), u32::from(self.settings.queues));
        f.set32(regs::DMA_MASK_BITS.offset(), self.settings.dma_mask_bits);
        f.set32(regs::MAX_DEPTH.offset(), self.settings.max_depth);
        f.set64(regs::MEMORY_SIZE.offset(), u64_of(self.dram.len));
    }

    /// Waits for a host write: spins up to `idle_spin`, then sleeps.
    fn idle(&self, seen: u32) {
        let start = Instant::now();
        loop {
            // The doorbell is looked at after every pause (a load of a line this core holds
            // until the host writes it: no traffic), the clock only every 64.
            for _ in 0..64 {
                // Relaxed: only a hint to stop spinning; the run loop re-reads with Acquire.
                if self.file.wake_seq().load(crate::sync::Ordering::Relaxed) != seen {
                    return;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= self.settings.idle_spin {
                break;
            }
            // Give the core away if a thread waits for it (the host thread that will ring
            // the doorbell may share it); an immediate return otherwise.
            std::thread::yield_now();
        }
        self.file.sleep(seen);
    }

    /// Acts on the control registers: reset, queues to start or stop, masks.
    fn control(&mut self) {
        let control = Control::from_bits_retain(self.file.get32(regs::CONTROL.offset()));
        if control.contains(Control::RESET) {
            self.reset();
        }
        for q in 0..self.queues.len() {
            let control = QueueControl::from_bits_retain(self.file.get32(qf(regs::Q_CONTROL, q)));
            let status = QueueStatus::from_bits_retain(self.file.get32(qf(regs::Q_STATUS, q)));
            let enable = control.contains(QueueControl::ENABLE);
            if enable && self.queues[q].is_none() && !status.contains(QueueStatus::FAULT) {
                self.start(q);
            } else if !enable && (self.queues[q].is_some() || !status.is_empty()) {
                self.queues[q] = None;
                self.file.set32(qf(regs::Q_FAULT, q), Fault::None as u32);
                self.file.set32(qf(regs::Q_STATUS, q), 0);
            }
        }
        self.vectors.deliver_unmasked();
    }

    /// Stops queue `q` on `fault`.
    fn fault(&mut self, q: usize, fault: Fault) {
        self.queues[q] = None;
        self.file.set32(qf(regs::Q_FAULT, q), fault as u32);
        self.file
            .set32(qf(regs::Q_STATUS, q), QueueStatus::FAULT.bits());
    }

    /// Starts serving queue `q` from its registers.
    fn start(&mut self, q: usize) {
        let base = self.file.get64(qf(regs::Q_RING_BASE, q));
        let depth = self.file.get32(qf(regs::Q_DEPTH, q));
        let context = self.file.get32(qf(regs::Q_CONTEXT, q));
        if depth > self.settings.max_depth {
            return self.fault(q, Fault::BadDepth);
        }
        let Ok(layout) = Layout::new::<Command, Status>(depth) else {
            return self.fault(q, Fault::BadDepth);
        };
        if base % ring::ALIGN as u64 != 0 {
            return self.fault(q, Fault::RingMisaligned);
        }
        let Some(span) = self.host.table().translate(base, layout.size()) else {
            return self.fault(q, Fault::RingUnmapped);
        };
        // SAFETY: the span is `layout.size()` bytes of one mapping, IOVA-contiguous (a
        // translation never spans two pieces), readable and writable; `Active` keeps the span,
        // so the memory stays mapped while the device queue (dropped first) uses it. Ring
        // memory is accessed by host and device only through atomics and volatile accesses.
        let memory = unsafe { Memory::from_raw(span.as_ptr(), span.len(), base) };
        let Ok(memory) = memory else {
            return self.fault(q, Fault::RingMisaligned);
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
            return self.fault(q, Fault::BadDepth);
        };
        self.queues[q] = Some(Active {
            queue,
            memory: peek,
            context,
            _ring: span,
        });
        self.file.set32(qf(regs::Q_FAULT, q), Fault::None as u32);
        self.file
            .set32(qf(regs::Q_STATUS, q), QueueStatus::ENABLED.bits());
    }

    /// Resets the device (see [`Control::RESET`]).
    fn reset(&mut self) {
        for slot in &mut self.queues {
            *slot = None;
        }
        for q in 0..self.queues.len() {
            for offset in (0..regs::QUEUE_STRIDE).step_by(4) {
                self.file
                    .set32(regs::QUEUE_BASE + q * regs::QUEUE_STRIDE + offset, 0);
            }
        }
        self.file.set32(regs::IRQ_MASK.offset(), 0);
        self.file.set32(regs::IRQ_PENDING.offset(), 0);
        // SAFETY: the device memory is `len` writable bytes the engine owns; no queue is served
        // now, so nothing else of the engine touches it.
        unsafe { std::ptr::write_bytes(self.dram.ptr.as_ptr(), 0, self.dram.len) };
        self.totals = Totals::default();
        self.vectors.raised = 0;
        self.queue_totals.iter_mut().for_each(|t| *t = (0, 0));
        self.clock = Clock::new();
        self.last_context = None;
        self.publish();
        self.file.set32(regs::CONTROL.offset(), 0);
        self.reset_count = self.reset_count.wrapping_add(1);
        self.file
            .set32(regs::RESET_COUNT.offset(), self.reset_count);
    }

    /// Writes the counters into their registers.
    fn publish(&self) {
        publish(&self.file, &self.totals, self.vectors.raised);
    }

    /// Serves one burst from the next queue with work. Returns whether anything was done.
    fn serve(&mut self, seen: u32) -> bool {
        let count = self.queues.len();
        for k in 0..count {
            let q = (self.next_queue + k) % count;
            if self.queues[q].is_none() {
                continue;
            }
            if self.burst(q, seen) > 0 {
                self.next_queue = (q + 1) % count;
                return true;
            }
        }
        false
    }

    /// Executes up to `max_burst` descriptors of queue `q`, fewer if the host writes a control
    /// register meanwhile (`seen` is the control counter the run loop last acted on). Returns
    /// how many.
    ///
    /// Each completion is written after the counters that include it (a host that sees it sees
    /// them), the busy time of the zero-cost model aside: that is read once for the whole burst
    /// and added after it. Interrupts: after each completion the engine peeks at the ring's
    /// interrupt flag (a plain load, no fence) and raises the vector if the host armed it; once
    /// per burst, if completions were written since the last interrupt, it checks the flag
    /// behind the `fence(SeqCst)` of the wake-up protocol ([`DeviceQueue::interrupt`]), so a
    /// host that armed while the peek could not see it yet is woken at the end of the burst at
    /// the latest. A host that busy-polls leaves the flag clear and costs no fence per descriptor.
    fn burst(&mut self, q: usize, seen: u32) -> u32 {
        let Some(active) = self.queues[q].as_mut() else {
            return 0;
        };
        match active.queue.fetch() {
            Ok(0) => return 0,
            Ok(_) => {}
            Err(_) => {
                self.fault(q, Fault::BadSqTail);
                return 0;
            }
        }
        let cost = self.settings.cost;
        let timed = !cost.is_zero();
        let file = &*self.file;
        let flag = active.queue.layout().interrupt_offset();
        let mut done = 0u32;
        let mut fault = None;
        // Completions written since the last interrupt raised.
        let mut unsignalled = false;
        let (mut completed, mut errors) = self.queue_totals[q];
        // With a cost model, one clock read per descriptor: each one's time runs from the end
        // of the previous, and the modelled time is waited for. With none, the burst's time is
        // read once at each end and added to the busy counter after the burst.
        let burst_began = Instant::now();
        let mut began = burst_began;
        while done < self.settings.max_burst {
            match active.queue.cq_room() {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => {
                    fault = Some(Fault::BadCqHead);
                    break;
                }
            }
            let Some(command) = active.queue.pop() else {
                break;
            };
            let outcome = ops::execute(&command, active.context, self.dram, &mut self.host);
            let switch = self.last_context.is_some_and(|c| c != active.context);
            self.last_context = Some(active.context);
            let t = &mut self.totals;
            if timed {
                let modelled = cost.charge(outcome.dma_bytes, outcome.compute_bytes, switch);
                Clock::wait_until(self.clock.charge(began, modelled));
                let ended = Instant::now();
                t.busy_ns = t.busy_ns.saturating_add(nanos(ended.duration_since(began)));
                began = ended;
                file.set64(regs::BUSY_NS.offset(), t.busy_ns);
            }
            t.descriptors += 1;
            t.switches += u64::from(switch);
            completed += 1;
            // The counters this descriptor moved (the interrupt count is published when one
            // is raised): plain stores, no more per descriptor than needed.
            file.set64(regs::DESCRIPTORS.offset(), t.descriptors);
            if switch {
                file.set64(regs::CONTEXT_SWITCHES.offset(), t.switches);
            }
            if outcome.code == Code::Success {
                t.bytes += outcome.bytes;
                file.set64(regs::BYTES.offset(), t.bytes);
            } else {
                t.errors += 1;
                errors += 1;
                file.set64(regs::ERRORS.offset(), t.errors);
                file.set64(qf(regs::Q_ERRORS, q), errors);
            }
            file.set64(qf(regs::Q_COMPLETED, q), completed);
            done += 1;
            if command.command_id != POSTED {
                let mut status =
                    Status::new(command.command_id, outcome.code as u16, outcome.result);
                // `q < MAX_QUEUES`: fits.
                status.queue_id = q as u16;
                // Room was checked above; failing here means the host moved its CQ head
                // impossibly.
                if active.queue.complete(status).is_err() {
                    fault = Some(Fault::BadCqHead);
                    break;
                }
                unsignalled = true;
                // The peek: a hint only, no ordering (the fenced check below is the one that
                // cannot miss).
                if active.memory.load_u32(flag) != 0 && matches!(active.queue.interrupt(), Ok(true))
                {
                    self.vectors.raise(q);
                    unsignalled = false;
                }
            }
            // Relaxed: only a hint to end the burst early; the run loop reads it with Acquire
            // and acts on the registers (a stop request is honoured one descriptor later).
            if file.control_seq().load(crate::sync::Ordering::Relaxed) != seen {
                break;
            }
        }
        if !timed && done > 0 {
            let t = &mut self.totals;
            t.busy_ns = t
                .busy_ns
                .saturating_add(nanos(Instant::now().duration_since(burst_began)));
            file.set64(regs::BUSY_NS.offset(), t.busy_ns);
        }
        if unsignalled && matches!(active.queue.interrupt(), Ok(true)) {
            self.vectors.raise(q);
        }
        active.queue.release();
        self.queue_totals[q] = (completed, errors);
        if let Some(fault) = fault {
            self.fault(q, fault);
        }
        done
    }
}

/// `time` in whole nanoseconds, saturating.
fn nanos(time: Duration) -> u64 {
    u64::try_from(time.as_nanos()).unwrap_or(u64::MAX)
}

/// The interrupt vectors: one eventfd per queue, the mask and pending registers.
#[derive(Debug)]
struct Vectors {
    file: Arc<RegisterFile>,
    fds: Vec<OwnedFd>,
    /// Interrupts raised (eventfd signals).
    raised: u64,
}

impl Vectors {
    /// Signals vector `q`'s eventfd, counting it first (a host woken by it sees the count).
    fn signal(&mut self, q: usize) {
        if let Some(fd) = self.fds.get(q) {
            self.raised += 1;
            self.file.set64(regs::INTERRUPTS.offset(), self.raised);
            // A failed eventfd write (the host closed its end) loses an interrupt the host no
            // longer waits for; there is nobody to report it to.
            let _ = shim::eventfd_signal(fd.as_fd());
        }
    }

    /// Raises vector `q`, or marks it pending if masked.
    fn raise(&mut self, q: usize) {
        let bit = 1u32 << q;
        if self.file.get32(regs::IRQ_MASK.offset()) & bit == 0 {
            self.signal(q);
            return;
        }
        let pending = self.file.u32(regs::IRQ_PENDING.offset());
        // AcqRel: a read-modify-write of a register the host reads (Release), after the mask
        // read (Acquire). The engine is the only writer of this register.
        pending.fetch_or(bit, crate::sync::Ordering::AcqRel);
        // The host may have unmasked between the two reads: deliver now if so.
        self.deliver_unmasked();
    }

    /// Raises every pending vector that is no longer masked.
    fn deliver_unmasked(&mut self) {
        let mask = self.file.get32(regs::IRQ_MASK.offset());
        let pending = self.file.get32(regs::IRQ_PENDING.offset());
        let deliver = pending & !mask;
        if deliver == 0 {
            return;
        }
        self.file.set32(regs::IRQ_PENDING.offset(), pending & mask);
        for q in 0..self.fds.len() {
            if deliver & (1 << q) != 0 {
                self.signal(q);
            }
        }
    }
}
