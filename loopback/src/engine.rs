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
//!   queue with an invalid `unit` register is faulted
//!   ([`Fault::BadUnit`](regs::Fault::BadUnit)) by whichever unit sees it first.
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
//! through two `fence(SeqCst)`s, explained at [`Unit::check_wait`] and
//! [`wake_waiter`](serve::wake_waiter)).

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bar::{DeviceBar, RegisterFile};
use super::cost::{Clock, Cost, TIMER_SLACK_NS};
use super::fault::Programme;
use super::ops::{Dram, Host, Span, Translate};
use super::regs::{self, DeviceStatus, Unit as UnitId};
use super::shim;
use super::sram::{Sram, WorkingSet};
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Condvar, Mutex, Ordering};
use crate::u64_of;
use userdma::mmio::{Block, Field};
use userdma::ring::{Command, DeviceQueue, Memory, Status};

mod activity;
mod control;
mod faults;
mod interrupts;
mod serve;

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
            finished: Finished::new(usize::from(self.settings.queues)),
        };
        let copy = Unit::new(UnitId::Copy, &self, &shared);
        let compute = Unit::new(UnitId::Compute, &self, &shared);
        // The compute unit's events sit in this thread's span, under its subscriber.
        #[cfg(feature = "tracing")]
        let traced = crate::traced::Carried::new(tracing::Span::current());
        std::thread::scope(|scope| {
            let spawned = std::thread::Builder::new()
                .name("loopback-compute".into())
                .spawn_scoped(scope, move || {
                    #[cfg(feature = "tracing")]
                    let _traced = traced.enter();
                    compute.run()
                });
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
    f.set32(regs::VERSION.offset(), regs::VERSION_2);
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
    /// With a cost model: when the modelled device finished each queue's recent descriptors,
    /// so a `Wait` on another unit's queue starts no earlier, in modelled time, than the
    /// completion it waited for ([`Shared::finished_at`]).
    finished: Finished,
}

/// Per queue, the modelled end of its last [`DUE_SLOTS`] completed descriptors, in
/// nanoseconds since `epoch`: descriptor number `c` (from 1, as `Q_COMPLETED` counts) in slot
/// `(c - 1) % DUE_SLOTS` of the queue's row. Written by the unit serving the queue before it
/// publishes `c` (a Release store), read by the other unit after an Acquire load of the
/// counter showed `c`.
#[derive(Debug)]
struct Finished {
    epoch: Instant,
    slots: Box<[AtomicU64]>,
}

/// Completions a queue's row of [`Finished`] remembers.
const DUE_SLOTS: u64 = 64;

impl Finished {
    fn new(queues: usize) -> Finished {
        Finished {
            epoch: Instant::now(),
            slots: (0..queues * DUE_SLOTS as usize)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    fn slot(&self, queue: usize, count: u64) -> Option<&AtomicU64> {
        let i = queue.checked_mul(DUE_SLOTS as usize)?
            + usize::try_from(count.checked_sub(1)? % DUE_SLOTS).ok()?;
        self.slots.get(i)
    }

    /// Notes that descriptor number `count` of `queue` ends at `due` (modelled). Before the
    /// counter store that publishes `count`.
    fn note(&self, queue: usize, count: u64, due: Instant) {
        if let Some(slot) = self.slot(queue, count) {
            // Relaxed: published by the Release store of the completed counter that follows
            // (see the type's docs).
            slot.store(
                nanos(due.saturating_duration_since(self.epoch)),
                Ordering::Relaxed,
            );
        }
    }
}

impl Shared {
    /// When descriptor number `target` of `queue` ended in modelled time, if still known:
    /// called after an Acquire load of `queue`'s completed counter read `seen >= target`.
    /// `completed` reads the counter again: the slot is trusted only if the serving unit
    /// cannot have overwritten it meanwhile (it writes the slot of `now + 1` at most before
    /// publishing it).
    fn finished_at(
        &self,
        queue: usize,
        target: u64,
        completed: impl Fn() -> u64,
    ) -> Option<Instant> {
        let slot = self.finished.slot(queue, target)?;
        // Relaxed: the caller's Acquire load of the counter ordered this after the Release
        // store that published `target` (and the slot's write before it).
        let ns = slot.load(Ordering::Relaxed);
        // The re-read: a unit at most one descriptor past `now` wrote no slot beyond `now + 1`.
        let now = completed();
        (now.saturating_sub(target) < DUE_SLOTS - 1)
            .then(|| self.finished.epoch + Duration::from_nanos(ns))
    }
}

/// The reset rendezvous: resets the compute unit has parked for, and resets done.
#[derive(Debug, Default)]
struct ResetState {
    parked: u64,
    done: u64,
}

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
    /// Its activity records, while the host has them on (see `engine/activity.rs`).
    recorder: Option<activity::Recorder>,
}

// SAFETY: the only non-Send field is `dram`'s pointer, into device memory the engine's owner
// keeps mapped while the engine runs (the units are scoped threads of `Engine::run`); each unit
// uses it only through raw-pointer copies, never references.
unsafe impl Send for Unit<'_> {}

/// The register `field` of queue `q` (in range: `q < queues <= MAX_QUEUES`).
fn qf<V, A>(field: Field<V, A>, q: usize) -> usize {
    field.offset() + q * regs::queue_stride(field)
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
            recorder: None,
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

/// `time` in whole nanoseconds, saturating.
#[inline]
fn nanos(time: Duration) -> u64 {
    u64::try_from(time.as_nanos()).unwrap_or(u64::MAX)
}
