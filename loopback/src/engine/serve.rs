//! A unit serving its queues: one burst at a time from the next queue with work (round
//! robin), each descriptor checked, run, charged to the cost model, counted and completed in
//! order; `Wait`s evaluated, and the other unit woken when a `Wait` of it may be satisfied;
//! each completed descriptor's activity record written first while the host has them on.

use std::time::Instant;

use super::activity::report_fault;
use super::faults::{inject, wrong_id};
use super::interrupts::raise;
use super::{nanos, qf, Shared, Unit};
use crate::activity::{Flags, Record};
use crate::bar::RegisterFile;
use crate::cost::{Clock, Work};
use crate::fault::Kind;
use crate::ops::{self, Outcome, Plan};
use crate::regs::{self, Fault, StatusCode, Unit as UnitId};
use crate::sync::Ordering;
use crate::u64_of;
use crate::wake;
use userdma::ring::{Status, POSTED};

/// What a `Wait` found.
enum Waited {
    /// The target is reached: the counter value seen.
    Done(u64),
    /// Not yet.
    Pending,
    /// It names its own queue or no queue.
    Bad,
}

impl Unit<'_> {
    /// Serves one burst from this unit's next queue with work. Returns whether anything was
    /// done.
    pub(super) fn serve(&mut self, seen: u32) -> bool {
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
    /// behind the `fence(SeqCst)` of the wake-up protocol
    /// ([`DeviceQueue::interrupt`](userdma::ring::DeviceQueue::interrupt)), so a host that armed
    /// while the peek could not see it yet is woken at the end of the burst at the latest. A
    /// host that busy-polls leaves the flag clear and costs no fence per descriptor.
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
        // Whether completions may be held back for their CQ line (see below).
        let hold = !timed && programme.is_none();
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
        // Without a cost model, where the next activity record starts: the previous one's
        // end (or the burst's start), so a unit's records never overlap and no clock is read
        // for them while records are off.
        let mut record_from = burst_began;
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
                            // In modelled time the wait ends no earlier than the completion
                            // it waited for: this unit's modelled clock may be behind the
                            // other's (it charges from the end of its previous descriptor).
                            if timed {
                                let awaited = usize::try_from(queue).unwrap_or(usize::MAX);
                                let counter = file.u64(qf(regs::Q_COMPLETED, awaited));
                                let completed = || {
                                    // Acquire: as the check's load (`check_progress`).
                                    counter.load(Ordering::Acquire)
                                };
                                if let Some(at) =
                                    self.shared.finished_at(awaited, target, completed)
                                {
                                    modelled_from = modelled_from.max(at);
                                }
                            }
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
            // The SRAM model's bytes touched and missed, for the activity record.
            let mut sram = (0u64, 0u64);
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
                        sram = (outcome.compute_bytes, touch.missed);
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
            if let (true, Some((_, due))) = (timed, self.clock.last()) {
                self.shared.finished.note(q, completed, due);
            }
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
            // Its activity record, before its completion (a host that saw the completion finds
            // the record). With records off, this branch is all they cost.
            if let Some(recorder) = self.recorder.as_mut() {
                let (start, end) = match (timed, self.clock.last()) {
                    // The modelled span the clock just charged.
                    (true, Some(span)) => span,
                    _ => (record_from, Instant::now()),
                };
                record_from = end;
                let command_id = match injected {
                    Some(Kind::WrongId) => wrong_id(&active.queue),
                    _ => command.command_id,
                };
                let flags = if switch {
                    Flags::SWITCHED
                } else {
                    Flags::empty()
                };
                let record = Record {
                    start_ns: recorder.ns(start),
                    end_ns: recorder.ns(end),
                    bytes: outcome.dma_bytes.saturating_add(outcome.compute_bytes),
                    sram_touched: sram.0,
                    sram_missed: sram.1,
                    context: active.context,
                    sequence: 0,
                    // `q < MAX_QUEUES`: fits.
                    queue: q as u16,
                    command: command_id,
                    status: outcome.code as u16,
                    opcode: command.opcode,
                    // 0 or 1: fits.
                    unit: self.id as u8,
                    flags: flags.bits(),
                    reserved: 0,
                };
                if let Err(fault) = recorder.write(self.host.table(), file, record) {
                    self.recorder = None;
                    report_fault(file, self.id, fault);
                }
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
                // Held back to be written a CQ line at a time while the next descriptor is
                // read and runs at once (no modelled time, no fault programme, the burst goes
                // on): a polling host reads the line the next completion goes to, and each
                // write would wait for it to come back (`DeviceQueue::complete_held`).
                let more = hold
                    && done < self.settings.max_burst
                    && active.queue.available() > 0
                    // Relaxed: as the check at the end of the loop.
                    && file.control_seq().load(Ordering::Relaxed) == seen;
                let mut written = 0;
                for _ in 0..times {
                    match active.queue.complete_held(status, more) {
                        Ok(n) => written += n,
                        Err(_) => {
                            fault = Some(Fault::BadCqHead);
                            break;
                        }
                    }
                }
                if fault.is_some() {
                    break;
                }
                if written > 0 {
                    unsignalled = true;
                    // The peek: a hint only, no ordering (the fenced check below is the one
                    // that cannot miss).
                    if active.memory.load_u32(flag) != 0
                        && matches!(active.queue.interrupt(), Ok(true))
                    {
                        raise(file, self.shared, &mut self.totals, c, q);
                        unsignalled = false;
                    }
                }
            }
            // Relaxed: only a hint to end the burst early; the run loop reads it with Acquire
            // and acts on the registers (a stop request is honoured one descriptor later).
            if file.control_seq().load(Ordering::Relaxed) != seen {
                break;
            }
        }
        // What was held is written before the burst ends, whatever ended it.
        match active.queue.flush_held() {
            Ok(0) => {}
            Ok(_) => unsignalled = true,
            Err(_) => fault = fault.or(Some(Fault::BadCqHead)),
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
pub(super) fn wake_waiter(file: &RegisterFile, shared: &Shared, id: UnitId) {
    let other = match id {
        UnitId::Copy => UnitId::Compute,
        UnitId::Compute => UnitId::Copy,
    };
    if wake::waiter_raised(&shared.waiting[other as usize]) {
        file.notify(other);
    }
}
