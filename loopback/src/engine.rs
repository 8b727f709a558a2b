//! The device's two units: the loops that play the device. A DMA (copy) engine and a compute
//! unit ([`Unit`]), each its own thread — of the host process, or of the device process — each
//! serving only the queues assigned to it (the queue's `unit` register, read at enable), with
//! its own modelled clock, its own "last context" (a context switch is counted per unit: the
//! unit takes a descriptor of another context than its own previous one) and its own counter
//! block. So a copy queue and a compute queue overlap, as an NPU's copy and compute queues
//! do; any opcode runs on either unit (the unit only decides which thread and clock executes
//! it). They reach the host only through the register file, the device memory and the
//! translation table they are given.
//!
//! Each turn a unit handles register changes (reset, its queues enabled and stopped, interrupt
//! masks), then serves one burst of up to `max_burst` descriptors from its next queue with
//! work (round robin), completing them in order, writing the SQ head back once per burst and
//! raising the queue's interrupt if the host armed it. With nothing to do it spins for
//! `idle_spin`, then sleeps on its own futex in the register file until the host writes a
//! register that concerns it (see `bar.rs`).
//!
//! # What the units share
//!
//! - **Queue ownership**: which unit serves each queue, decided under one lock ([`Shared`]) by
//!   the unit that starts it; only the owner stops it, tears it down or faults it, and a
//!   queue with an invalid `unit` register is faulted ([`Fault::BadUnit`]) by whichever unit
//!   sees it first.
//! - **Counters**: each unit has its own block of counter registers ([`regs::UnitRegs`]),
//!   written with plain stores by that unit only; the host sums the two. Atomic
//!   read-modify-writes of one shared block would cost a locked instruction per counter per
//!   descriptor and move the counter lines between the two cores.
//! - **Interrupts**: the vectors are per queue; both units raise them. Setting a pending bit
//!   and taking the unmasked pending bits are single atomic read-modify-writes of
//!   `irq_pending`, so a vector raised by one unit while the other delivers is never lost nor
//!   delivered twice.
//! - **Reset**: done once, by the copy engine, after the compute unit has torn down its own
//!   queues and parked; the compute unit resumes once the reset is complete. On shutdown each
//!   unit tears down its own queues; the device reports stopped after both have.
//! - **Device memory**: both units access it through raw pointers (never references). Two
//!   units touching the same bytes concurrently is the host's ordering bug, as on hardware:
//!   the host orders them with [`Opcode::Wait`](regs::Opcode::Wait).
//!
//! # Waits
//!
//! A `Wait` whose target is not reached stays at the head of its queue (the queue serves
//! nothing after it); the unit re-checks it every time it comes round to that queue and
//! otherwise serves its other queues and idles as usual. Before re-checking, the waiting unit
//! raises its `waiting` flag; a unit that completed descriptors checks the other unit's flag
//! after its burst and, if set, bumps that unit's wake counter and wakes it (a Dekker handshake
//! through two `fence(SeqCst)`s, explained at [`Unit::check_wait`] and [`wake_waiter`]).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bar::{DeviceBar, RegisterFile};
use super::cost::{Clock, Cost, Work, TIMER_SLACK_NS};
use super::fault::{Kind, Programme};
use super::ops::{self, Dram, Host, Outcome, Plan, Span, Translate};
use super::regs::{
    self, Control, DeviceStatus, Fault, FaultControl, QueueControl, QueueStatus, StatusCode,
    Unit as UnitId,
};
use super::shim;
use super::sram::{Sram, WorkingSet};
use crate::sync::{AtomicBool, AtomicU32, Condvar, Mutex, Ordering};
use crate::u64_of;
use crate::wake;
use userdma::mmio::{Block, Field};
use userdma::ring::{self, Command, DeviceQueue, Doorbells, Layout, Memory, Status, POSTED};

/// How the engine is set up (the parts of the device configuration it needs).
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) queues: u16,
    pub(super) max_depth: u32,
    pub(super) dma_mask_bits: u32,
    pub(super) cost: Cost,
    pub(super) max_burst: u32,
    pub(super) idle_spin: Duration,
    /// The CPU to run on, if pinned (both units' threads).
    pub(super) cpu: Option<u32>,
    /// Fault injections programmed before the engine starts, by queue
    /// ([`Config::inject`](super::Config::inject)).
    pub(super) faults: Vec<(u16, Programme)>,
}

/// The device side of the loopback device: what its two units are made of.
#[derive(Debug)]
pub(super) struct Engine {
    settings: Settings,
    file: Arc<RegisterFile>,
    dram: Dram,
    table: Arc<dyn Translate>,
    irqs: Vec<OwnedFd>,
}

// SAFETY: the only non-Send field is `dram`'s pointer, into device memory that the caller of
// `Engine::new` keeps mapped for the engine's life; it is used only by the units, through raw
// pointers.
unsafe impl Send for Engine {}

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
        Engine {
            settings,
            file,
            dram,
            table,
            irqs,
        }
    }

    /// Runs both units until the register file asks for shutdown: the compute unit on a new
    /// thread (which inherits this thread's CPU affinity), the copy engine on this one.
    pub(super) fn run(mut self) {
        identify(&self.file, &self.settings, self.dram);
        let mut programmes = vec![None; usize::from(self.settings.queues)];
        let mut armed = 0u32;
        for &(q, programme) in &self.settings.faults {
            if let Some(slot) = programmes.get_mut(usize::from(q)) {
                *slot = Some(programme);
                armed |= 1 << q;
            }
        }
        let shared = Shared {
            faults: Mutex::new(programmes),
            armed: AtomicU32::new(armed),
            owners: Mutex::new(vec![None; usize::from(self.settings.queues)]),
            reset: Mutex::new(ResetState::default()),
            reset_moved: Condvar::new(),
            waiting: [AtomicBool::new(false), AtomicBool::new(false)],
            fds: std::mem::take(&mut self.irqs),
        };
        let copy = Unit::new(UnitId::Copy, &self, &shared);
        let compute = Unit::new(UnitId::Compute, &self, &shared);
        std::thread::scope(|scope| {
            let spawned = std::thread::Builder::new()
                .name("loopback-compute".into())
                .spawn_scoped(scope, move || compute.run());
            if spawned.is_err() {
                // Without its compute unit the device never reports READY: the host's start
                // times out and the device is dropped.
                return;
            }
            copy.run();
            // A panic in the compute unit has been reported on its thread already.
        });
        self.file.set32(regs::STATUS.offset(), 0);
    }
}

/// Writes the read-only identification registers.
fn identify(f: &RegisterFile, settings: &Settings, dram: Dram) {
    f.set32(regs::ID.offset(), regs::DEVICE_ID);
    f.set32(regs::VERSION.offset(), regs::VERSION_1);
    f.set32(regs::QUEUES.offset(), u32::from(settings.queues));
    f.set32(regs::DMA_MASK_BITS.offset(), settings.dma_mask_bits);
    f.set32(regs::MAX_DEPTH.offset(), settings.max_depth);
    f.set64(regs::MEMORY_SIZE.offset(), u64_of(dram.len));
}

/// What the two units share (in the engine's process, never the host's).
#[derive(Debug)]
struct Shared {
    /// The unit serving each queue. Queues start, stop and fault under this lock, so two
    /// units never both serve a queue, whatever the host writes meanwhile.
    owners: Mutex<Vec<Option<UnitId>>>,
    /// The reset rendezvous (see [`Unit::reset`]).
    reset: Mutex<ResetState>,
    reset_moved: Condvar,
    /// Per unit: it has a `Wait` pending (the other unit wakes it after completing).
    waiting: [AtomicBool; 2],
    /// One interrupt eventfd per queue.
    fds: Vec<OwnedFd>,
    /// Each queue's fault injection, if one is programmed (see `fault.rs`). Changed by the
    /// copy engine when the host programs one; its state (count left, generator) written back
    /// by the unit serving the queue after each burst that used it.
    faults: Mutex<Vec<Option<Programme>>>,
    /// Bit `q`: queue `q` has a programme in `faults`. Changed only under that lock; read once
    /// per burst by the serving unit (the hot path's one branch for fault injection).
    armed: AtomicU32,
}

/// The reset rendezvous: resets the compute unit has parked for, and resets done.
#[derive(Debug, Default)]
struct ResetState {
    parked: u64,
    done: u64,
}

/// How long a unit waiting at the reset rendezvous sleeps between looks at the shutdown flag.
const RENDEZVOUS_POLL: Duration = Duration::from_millis(1);

/// A queue a unit serves. Field order matters: the device queue (which accesses the ring)
/// drops before the span that keeps the ring mapped.
#[derive(Debug)]
struct Active {
    queue: DeviceQueue<Command, Status>,
    /// The ring memory again, to peek at the host's interrupt flag without a fence.
    memory: Memory,
    context: u32,
    /// The working set its context declared (read when it started).
    working_set: WorkingSet,
    /// Bytes its compute descriptors were served from SRAM, and touched (mirrored into its
    /// `sram_hits` and `sram_touched` registers).
    sram: (u64, u64),
    /// A `Wait` taken from the SQ whose target is not reached yet: the queue's next
    /// descriptor (its slot already released; this is the engine's copy).
    blocked: Option<Command>,
    /// An injected stall: the queue is served no more until it is torn down.
    stalled: bool,
    _ring: Span,
}

/// A unit's own running totals, mirrored into its counter registers.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    descriptors: u64,
    bytes: u64,
    switches: u64,
    errors: u64,
    busy_ns: u64,
    interrupts: u64,
    modelled_ns: u64,
}

/// The offsets of a unit's counter registers.
#[derive(Debug, Clone, Copy)]
struct CounterRegs {
    descriptors: usize,
    bytes: usize,
    switches: usize,
    errors: usize,
    busy_ns: usize,
    interrupts: usize,
    modelled_ns: usize,
}

impl CounterRegs {
    fn of(unit: UnitId) -> CounterRegs {
        let at =
            |field: Field<u64, userdma::mmio::ReadOnly>| regs::unit_field(field, unit).offset();
        CounterRegs {
            descriptors: at(regs::DESCRIPTORS),
            bytes: at(regs::BYTES),
            switches: at(regs::CONTEXT_SWITCHES),
            errors: at(regs::ERRORS),
            busy_ns: at(regs::BUSY_NS),
            interrupts: at(regs::INTERRUPTS),
            modelled_ns: at(regs::MODELLED_NS),
        }
    }
}

/// What a `Wait` found.
enum Waited {
    /// The target is reached: the counter value seen.
    Done(u64),
    /// Not yet.
    Pending,
    /// It names its own queue or no queue.
    Bad,
}

/// One unit: its thread's state.
#[derive(Debug)]
struct Unit<'a> {
    id: UnitId,
    settings: &'a Settings,
    file: &'a RegisterFile,
    shared: &'a Shared,
    doorbell_block: userdma::mmio::DynBlock,
    dram: Dram,
    host: Host,
    queues: Vec<Option<Active>>,
    /// Per-queue (completed, errors) of the queues this unit serves (read from the registers
    /// when it starts one).
    queue_totals: Vec<(u64, u64)>,
    totals: Totals,
    counters: CounterRegs,
    clock: Clock,
    /// The device SRAM as this unit's compute sees it.
    sram: Sram,
    last_context: Option<u32>,
    next_queue: usize,
    /// Queues of this unit with a pending `Wait`.
    blocked: u32,
    reset_count: u32,
}

// SAFETY: the only non-Send field is `dram`'s pointer, into device memory the engine's owner
// keeps mapped while the engine runs (the units are scoped threads of `Engine::run`); each unit
// uses it only through raw-pointer copies, never references.
unsafe impl Send for Unit<'_> {}

/// The register `field` of queue `q` (in range: `q < queues <= MAX_QUEUES`).
fn qf<V, A>(field: Field<V, A>, q: usize) -> usize {
    field.offset() + q * regs::QUEUE_STRIDE
}

impl<'a> Unit<'a> {
    fn new(id: UnitId, engine: &'a Engine, shared: &'a Shared) -> Unit<'a> {
        let queues = usize::from(engine.settings.queues);
        let doorbell_block = Block::new(DeviceBar::new(Arc::clone(&engine.file))).erase();
        Unit {
            id,
            settings: &engine.settings,
            file: &engine.file,
            shared,
            doorbell_block,
            dram: engine.dram,
            host: Host::new(Arc::clone(&engine.table)),
            queues: (0..queues).map(|_| None).collect(),
            queue_totals: vec![(0, 0); queues],
            totals: Totals::default(),
            counters: CounterRegs::of(id),
            clock: Clock::new(),
            sram: Sram::new(engine.settings.cost.sram_bytes),
            last_context: None,
            next_queue: 0,
            blocked: 0,
            reset_count: 0,
        }
    }

    /// Runs until the register file asks for shutdown.
    fn run(mut self) {
        if !self.settings.cost.is_zero() {
            // Best effort: with the default slack a modelled wait ends up to 50 µs late.
            let _ = shim::set_timer_slack(TIMER_SLACK_NS);
        }
        // Acquire (here and in the loop): pairs with the host's increments after its register
        // writes, so the registers read afterwards include those writes.
        let mut control = self.file.control_seq().load(Ordering::Acquire);
        self.control();
        if self.id == UnitId::Copy {
            self.file
                .set32(regs::STATUS.offset(), DeviceStatus::READY.bits());
        }
        loop {
            if self.file.shutting_down() {
                break;
            }
            let seen = self.file.wake_seq(self.id).load(Ordering::Acquire);
            let now = self.file.control_seq().load(Ordering::Acquire);
            if now != control {
                control = now;
                self.control();
            }
            if self.serve(control) {
                continue;
            }
            self.idle(seen);
        }
        // Every queue of this unit stops: nothing of the host's is touched after this.
        for q in 0..self.queues.len() {
            self.drop_queue(q);
        }
    }

    /// Waits for a write for this unit: spins up to `idle_spin`, then sleeps.
    fn idle(&self, seen: u32) {
        let start = Instant::now();
        loop {
            // The doorbell is looked at after every pause (a load of a line this core holds
            // until the host writes it: no traffic), the clock only every 64.
            for _ in 0..64 {
                // Relaxed: only a hint to stop spinning; the run loop re-reads with Acquire.
                if self.file.wake_seq(self.id).load(Ordering::Relaxed) != seen {
                    return;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= self.settings.idle_spin {
                break;
            }
            // Give the core away if a thread waits for it (the host thread that will ring
            // the doorbell, or the other unit, may share it); an immediate return otherwise.
            std::thread::yield_now();
        }
        self.file.sleep(self.id, seen);
    }

    /// The queue owners, locked (a poisoned lock is still consistent: every change under it
    /// is a single store).
    fn owners(&self) -> std::sync::MutexGuard<'a, Vec<Option<UnitId>>> {
        self.shared
            .owners
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tears down this unit's queue `q`, if it serves it (a pending `Wait` is released).
    fn drop_queue(&mut self, q: usize) {
        if let Some(active) = self.queues[q].take() {
            if active.blocked.is_some() {
                self.blocked -= 1;
            }
        }
    }

    /// Acts on the control registers: reset, fault programmes, queues to start or stop, masks.
    fn control(&mut self) {
        let control = Control::from_bits_retain(self.file.get32(regs::CONTROL.offset()));
        if control.contains(Control::RESET) {
            self.reset();
        }
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

    /// Acts on a write of the fault block's `control` (the copy engine only): programs or
    /// clears the selected queue's injection, then acknowledges (`applied` moves).
    fn fault_control(&mut self) {
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
    fn programme(&self, q: usize) -> Option<Programme> {
        self.faults()[q]
    }

    /// Writes back the state a burst moved in queue `q`'s programme, unless the host
    /// programmed the queue anew meanwhile; a programme that can hit nothing more is removed.
    #[cold]
    #[inline(never)]
    fn keep_programme(&self, q: usize, programme: Programme) {
        let mut faults = self.faults();
        if faults[q].is_some_and(|p| p.generation == programme.generation) {
            let spent = programme.is_spent();
            faults[q] = (!spent).then_some(programme);
            set_armed(&self.shared.armed, q, !spent);
        }
    }

    /// Writes `fault` into queue `q`'s registers (the caller holds the owners lock and has
    /// torn the queue down).
    fn set_fault(&self, q: usize, fault: Fault) {
        self.file.set32(qf(regs::Q_FAULT, q), fault as u32);
        self.file
            .set32(qf(regs::Q_STATUS, q), QueueStatus::FAULT.bits());
    }

    /// Stops this unit's queue `q` on `fault` (from the serving path).
    fn fault(&mut self, q: usize, fault: Fault) {
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
        }
        self.file.set32(regs::IRQ_MASK.offset(), 0);
        self.file.set32(regs::IRQ_PENDING.offset(), 0);
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

    /// Serves one burst from this unit's next queue with work. Returns whether anything was
    /// done.
    fn serve(&mut self, seen: u32) -> bool {
        if self.blocked == 0 && self.shared.waiting[self.id as usize].load(Ordering::Relaxed) {
            // Relaxed: no Wait of this unit is pending, so no completion needs to wake it.
            self.shared.waiting[self.id as usize].store(false, Ordering::Relaxed);
        }
        let count = self.queues.len();
        for k in 0..count {
            let q = (self.next_queue + k) % count;
            if self.queues[q].is_none() {
                continue;
            }
            if self.burst(q, seen) > 0 {
                self.next_queue = (q + 1) % count;
                wake_waiter(self.file, self.shared, self.id);
                return true;
            }
        }
        false
    }

    /// Evaluates a `Wait` of queue `own` for queue `queue`'s completed counter to reach
    /// `target`.
    fn check_wait(
        file: &RegisterFile,
        shared: &Shared,
        id: UnitId,
        queues: usize,
        own: usize,
        queue: u64,
        target: u64,
    ) -> Waited {
        let Some(queue) = usize::try_from(queue)
            .ok()
            .filter(|&q| q < queues && q != own)
        else {
            return Waited::Bad;
        };
        // The waiting side of the handshake in `wake_waiter` (`wake::check_progress`: this
        // unit's flag, fence(SeqCst), then the counter). Its Acquire load of the counter pairs
        // with the Release store of it (in `set64`) by the unit that completed those
        // descriptors, after their writes to device memory: this queue's later descriptors see
        // that data.
        let counter = file.u64(qf(regs::Q_COMPLETED, queue));
        let seen = wake::check_progress(&shared.waiting[id as usize], counter);
        if seen >= target {
            Waited::Done(seen)
        } else {
            Waited::Pending
        }
    }

    /// Executes up to `max_burst` descriptors of queue `q`, fewer if the host writes a control
    /// register meanwhile (`seen` is the control counter the run loop last acted on) or a
    /// `Wait` is not satisfied. Returns how many completed.
    ///
    /// Each completion is written after the counters that include it (a host that sees it sees
    /// them), the busy time of the zero-cost model aside: that is read once for the whole burst
    /// and added after it. Interrupts: after each completion the unit peeks at the ring's
    /// interrupt flag (a plain load, no fence) and raises the vector if the host armed it; once
    /// per burst, if completions were written since the last interrupt, it checks the flag
    /// behind the `fence(SeqCst)` of the wake-up protocol ([`DeviceQueue::interrupt`]), so a
    /// host that armed while the peek could not see it yet is woken at the end of the burst at
    /// the latest. A host that busy-polls leaves the flag clear and costs no fence per descriptor.
    fn burst(&mut self, q: usize, seen: u32) -> u32 {
        let Some(active) = self.queues[q].as_mut() else {
            return 0;
        };
        if active.stalled {
            return 0;
        }
        match active.queue.fetch() {
            Ok(0) if active.blocked.is_none() => return 0,
            Ok(_) => {}
            Err(_) => {
                self.fault(q, Fault::BadSqTail);
                return 0;
            }
        }
        // The burst's snapshot of the fault programme: without one, fault injection costs
        // this load and the branches on `programme` below, always taken the same way.
        // Acquire: read after the doorbell (fetch) and pairs with the Release of `applied` in
        // `fault_control` (through the host, which rings only after seeing it): a programme
        // the host waited for is seen by the burst its doorbell starts.
        let mut programme = if self.shared.armed.load(Ordering::Acquire) & (1 << q) != 0 {
            self.programme(q)
        } else {
            None
        };
        let Some(active) = self.queues[q].as_mut() else {
            return 0;
        };
        let cost = self.settings.cost;
        let timed = !cost.is_zero();
        let file = self.file;
        let c = self.counters;
        let queues = usize::from(self.settings.queues);
        let flag = active.queue.layout().interrupt_offset();
        let mut done = 0u32;
        let mut fault = None;
        // Completions written since the last interrupt raised.
        let mut unsignalled = false;
        let (mut completed, mut errors) = self.queue_totals[q];
        // With a cost model, one clock read per descriptor, and the modelled time is waited
        // for. The first descriptor's modelled time runs from the start of the burst; each
        // later one's from the modelled end of the previous (it was waiting in the ring, so a
        // device would have started it then), so a late wake-up of this thread delays one
        // completion but costs the modelled device no throughput. Measured busy time runs from
        // clock read to clock read. With no cost model, the burst's time is read once at each
        // end and added to the busy counter after the burst.
        let burst_began = Instant::now();
        let mut began = burst_began;
        let mut modelled_from = burst_began;
        while done < self.settings.max_burst {
            let room = match active.queue.cq_room() {
                Ok(0) => break,
                Ok(room) => room,
                Err(_) => {
                    fault = Some(Fault::BadCqHead);
                    break;
                }
            };
            let was_blocked = active.blocked.is_some();
            let injected = match programme.as_mut() {
                None => None,
                Some(_) if was_blocked => None,
                Some(p) => inject(p, active.queue.peek(0), room),
            };
            if let Some(kind) = injected {
                file.count_injected(q, kind as u32);
                if kind == Kind::Stall {
                    // Before the descriptor is read: the SQ head stays in front of it.
                    active.stalled = true;
                    break;
                }
            }
            let Some(command) = active.blocked.take().or_else(|| active.queue.pop()) else {
                break;
            };
            let mut fence = false;
            let checked = match injected {
                None => ops::check(&command, active.context, u64_of(self.dram.len)),
                Some(kind) => {
                    if let (Kind::Slow, Some(p)) = (kind, programme.as_ref()) {
                        Clock::wait_until(Instant::now() + p.delay);
                    }
                    let mut seen = command;
                    if kind == Kind::CorruptDescriptor {
                        // The descriptor as a corrupted read delivers it: the context tag
                        // no longer matches, so the checks reject it before anything is
                        // touched.
                        seen.context ^= 1 << 31;
                    }
                    match ops::check(&seen, active.context, u64_of(self.dram.len)) {
                        Ok(_) if kind == Kind::ErrorStatus => Err((StatusCode::Injected, 0)),
                        checked => checked,
                    }
                }
            };
            let outcome = match checked {
                Err((code, result)) => Outcome::failed(code, result),
                Ok(Plan::Wait { queue, target }) => {
                    match Unit::check_wait(file, self.shared, self.id, queues, q, queue, target) {
                        Waited::Done(seen) => {
                            if was_blocked {
                                self.blocked -= 1;
                            }
                            fence = true;
                            Outcome {
                                code: StatusCode::Success,
                                result: seen,
                                bytes: 0,
                                dma_bytes: 0,
                                compute_bytes: 0,
                            }
                        }
                        Waited::Bad => Outcome::failed(StatusCode::BadArgs, 0),
                        Waited::Pending => {
                            if !was_blocked {
                                self.blocked += 1;
                            }
                            active.blocked = Some(command);
                            break;
                        }
                    }
                }
                Ok(plan) => ops::run(plan, self.dram, &mut self.host),
            };
            let switch = self.last_context.is_some_and(|c| c != active.context);
            self.last_context = Some(active.context);
            let t = &mut self.totals;
            if timed {
                let mut work = Work {
                    dma_bytes: outcome.dma_bytes,
                    compute_bytes: outcome.compute_bytes,
                    missed_bytes: 0,
                    switch,
                    fence,
                };
                if outcome.compute_bytes > 0 {
                    if let Some(touch) = self.sram.touch(active.working_set, outcome.compute_bytes)
                    {
                        work.missed_bytes = touch.missed;
                        let (hits, touched) = &mut active.sram;
                        *hits += touch.hits;
                        *touched += outcome.compute_bytes;
                        file.set64(qf(regs::Q_SRAM_HITS, q), *hits);
                        file.set64(qf(regs::Q_SRAM_TOUCHED, q), *touched);
                    }
                }
                let modelled = cost.charge_work(work);
                t.modelled_ns = t.modelled_ns.saturating_add(nanos(modelled));
                file.set64(c.modelled_ns, t.modelled_ns);
                let due = self.clock.charge(modelled_from, modelled);
                Clock::wait_until(due);
                let ended = Instant::now();
                t.busy_ns = t.busy_ns.saturating_add(nanos(ended.duration_since(began)));
                began = ended;
                modelled_from = due;
                file.set64(c.busy_ns, t.busy_ns);
            }
            t.descriptors += 1;
            t.switches += u64::from(switch);
            completed += 1;
            // The counters this descriptor moved (the interrupt count is published when one
            // is raised): plain stores into this unit's own block, no more per descriptor
            // than needed.
            file.set64(c.descriptors, t.descriptors);
            if switch {
                file.set64(c.switches, t.switches);
            }
            if outcome.code == StatusCode::Success {
                t.bytes += outcome.bytes;
                file.set64(c.bytes, t.bytes);
            } else {
                t.errors += 1;
                errors += 1;
                file.set64(c.errors, t.errors);
                file.set64(qf(regs::Q_ERRORS, q), errors);
            }
            // Release (in `set64`): after this descriptor's writes to device memory, so a
            // `Wait` on this queue that reads the new count (Acquire) sees them.
            file.set64(qf(regs::Q_COMPLETED, q), completed);
            if timed {
                wake_waiter(file, self.shared, self.id);
            }
            done += 1;
            if command.command_id != POSTED && injected != Some(Kind::DropCompletion) {
                let id = match injected {
                    Some(Kind::WrongId) => wrong_id(&active.queue),
                    _ => command.command_id,
                };
                let mut status = Status::new(id, outcome.code as u16, outcome.result);
                // `q < MAX_QUEUES`: fits.
                status.queue_id = q as u16;
                // Room was checked above (for two when the completion is to be written
                // twice); failing here means the host moved its CQ head impossibly.
                let times = if injected == Some(Kind::CompleteTwice) {
                    2
                } else {
                    1
                };
                if (0..times).any(|_| active.queue.complete(status).is_err()) {
                    fault = Some(Fault::BadCqHead);
                    break;
                }
                unsignalled = true;
                // The peek: a hint only, no ordering (the fenced check below is the one that
                // cannot miss).
                if active.memory.load_u32(flag) != 0 && matches!(active.queue.interrupt(), Ok(true))
                {
                    raise(file, self.shared, &mut self.totals, c, q);
                    unsignalled = false;
                }
            }
            // Relaxed: only a hint to end the burst early; the run loop reads it with Acquire
            // and acts on the registers (a stop request is honoured one descriptor later).
            if file.control_seq().load(Ordering::Relaxed) != seen {
                break;
            }
        }
        if !timed && done > 0 {
            let t = &mut self.totals;
            t.busy_ns = t
                .busy_ns
                .saturating_add(nanos(Instant::now().duration_since(burst_began)));
            file.set64(c.busy_ns, t.busy_ns);
        }
        if unsignalled && matches!(active.queue.interrupt(), Ok(true)) {
            raise(file, self.shared, &mut self.totals, c, q);
        }
        active.queue.release();
        self.queue_totals[q] = (completed, errors);
        if let Some(programme) = programme {
            self.keep_programme(q, programme);
        }
        if let Some(fault) = fault {
            self.fault(q, fault);
        }
        done
    }

    /// Raises every pending vector that is no longer masked.
    fn deliver_unmasked(&mut self) {
        deliver_unmasked(self.file, self.shared, &mut self.totals, self.counters);
    }
}

/// Whether `programme` hits the next descriptor (`next`, as peeked) and with what, given
/// `room` CQ entries free: never a posted descriptor (no completion to misbehave with), and
/// [`Kind::CompleteTwice`] only with room for both completions (otherwise nothing, and a
/// count trigger is not used up).
fn inject(programme: &mut Programme, next: Option<Command>, room: u32) -> Option<Kind> {
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
fn wrong_id(queue: &DeviceQueue<Command, Status>) -> u16 {
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

/// After unit `id` completed descriptors: wakes the other unit if it has a `Wait` pending (its
/// target may be one of those completions). Called once per burst, and with a cost model after
/// every descriptor (so a long burst of modelled time does not hold back the waiting unit).
///
/// The handshake with [`Unit::check_wait`] ([`wake::waiter_raised`], which loom checks): this
/// unit stored its completed counters (Release) and then runs `fence(SeqCst)` before loading
/// the other's `waiting` flag; the waiting unit stores its flag and runs `fence(SeqCst)` before
/// loading the counter. Of two SeqCst fences one precedes the other in the single total order,
/// so either this load sees the flag (and the other unit is woken: its wake counter moves after
/// it read the value it sleeps on), or the other unit's counter load sees the new count (and
/// the Wait completes without sleeping).
fn wake_waiter(file: &RegisterFile, shared: &Shared, id: UnitId) {
    let other = match id {
        UnitId::Copy => UnitId::Compute,
        UnitId::Compute => UnitId::Copy,
    };
    if wake::waiter_raised(&shared.waiting[other as usize]) {
        file.notify(other);
    }
}

/// Writes a unit's counters into its registers.
fn publish(file: &RegisterFile, c: CounterRegs, totals: &Totals) {
    file.set64(c.descriptors, totals.descriptors);
    file.set64(c.bytes, totals.bytes);
    file.set64(c.switches, totals.switches);
    file.set64(c.errors, totals.errors);
    file.set64(c.busy_ns, totals.busy_ns);
    file.set64(c.interrupts, totals.interrupts);
    file.set64(c.modelled_ns, totals.modelled_ns);
}

/// Signals vector `q`'s eventfd, counting it first in the raising unit's counters (a host
/// woken by it sees the count).
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
fn raise(file: &RegisterFile, shared: &Shared, totals: &mut Totals, c: CounterRegs, q: usize) {
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

/// `time` in whole nanoseconds, saturating.
fn nanos(time: Duration) -> u64 {
    u64::try_from(time.as_nanos()).unwrap_or(u64::MAX)
}
