//! The edu engine's queue ([`EduQueue`]): ops in, completions out, both in order, through
//! edu's one DMA engine.
//!
//! Each op is checked when it is pushed ([`job_of`]: its addresses against the arenas and host
//! pools the engine handed out and edu's DMA mask) and becomes a [`Job`]: a copy of `len` bytes
//! from IOVA `src` to IOVA `dst`, or a status to complete with. A flush hands the queued jobs
//! to the engine and starts the first transfer; from then on every call that looks at the
//! queue (`poll`, `wait`, `flush`, the interrupt checks) moves it on: a transfer that has
//! ended is acknowledged, and the next one is started at once. A copy goes a chunk of up to
//! [`edu::MAX_TRANSFER`] bytes at a time, each chunk in two transfers through the start of
//! edu's buffer ([`next_chunk`]): host memory into the buffer, then the buffer out to host
//! memory. A job whose last chunk is out completes, with its tag; the next job starts.
//!
//! **Several queues.** An engine with more than one queue ([`super::EduEngine::with_queues`])
//! has them take turns: a copy takes edu's engine and buffer before its first transfer and
//! gives them back when its last one has ended (or the queue stops); a queue whose next copy
//! finds them taken waits, its job announced, until the other's copy is across.
//!
//! **Waiting.** With an interrupt (the engine has an MSI vector and the queue was opened with
//! `Wait::Interrupt`), every transfer asks edu for its interrupt, `wait` sleeps on the
//! vector's eventfd and the queue offers itself to `ring::wait_any` (the streams driver sleeps
//! on it beside other devices' queues); otherwise `wait` looks at the engine every
//! millisecond. Either way a transfer counts as ended when edu's command register says so, so
//! a late or lost interrupt costs time, not a completion; the engine counts the interrupts for
//! the caller to compare with the transfers.
//!
//! **Stopping.** A transfer under way cannot be cancelled: `shutdown` (and a drop) wait until
//! it has ended, so once they return edu touches none of the buffers; the job it belonged to
//! and every one after it are aborted. A reset of the engine stops the queue: its next call
//! fails with `ring::Error::Faulted`, and its owner shuts it down.
//!
//! Nothing here allocates after [`EduQueue::open`]: the job lists hold `depth` entries each.

use std::collections::VecDeque;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use userdma::ring;
use userdma_infer::accel::{Completion, HostSpan, Op, Queue, QueueSpec, Stopped};

use super::{driver, Shared, BEYOND_MASK, OUTSIDE_ARENA, UNKNOWN_HOST_BUFFER, UNSUPPORTED};
use crate::edu::{self, Direction, Engine, Transfer};

/// How long `wait` sleeps on the interrupt before it looks at the engine anyway (a lost
/// interrupt costs this much, once).
const IRQ_SLICE: Duration = Duration::from_millis(200);
/// How often `wait` looks at the engine when it has no interrupt to sleep on.
const POLL_INTERVAL: Duration = Duration::from_millis(1);

/// What an op comes to on edu.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Job {
    /// `len` bytes from IOVA `src` to IOVA `dst`, through edu's buffer.
    Copy {
        /// Where the bytes are (host memory, by IOVA).
        src: u64,
        /// Where they go.
        dst: u64,
        /// How many.
        len: u64,
    },
    /// Nothing reaches edu: the op completes with `status`, `result` naming the address.
    Refuse {
        /// The completion's status.
        status: u32,
        /// The completion's result: the address that was refused (0 for an op edu cannot run).
        result: u64,
    },
}

/// The job of `op`: a copy when both its sides pass (`arena_holds(at, len)`: the bytes lie in
/// one live arena; `host_holds(span)`: the span lies in a host pool of the engine) and both
/// lie below edu's DMA mask; the status otherwise. Model steps and waits on other queues are
/// [`UNSUPPORTED`].
pub(crate) fn job_of(
    op: &Op,
    arena_holds: impl Fn(u64, u64) -> bool,
    host_holds: impl Fn(&HostSpan) -> bool,
) -> Job {
    let refuse = |status, result| Job::Refuse { status, result };
    let (src, dst, len, arena, host) = match *op {
        Op::ToDevice { from, to } => (from.iova.raw(), to, from.len, to, from),
        Op::ToHost { from, to } => (from, to.iova.raw(), to.len, from, to),
        Op::Step { .. } | Op::After { .. } => return refuse(UNSUPPORTED, 0),
    };
    if len == 0 {
        return Job::Copy { src, dst, len };
    }
    if !arena_holds(arena, len) {
        return refuse(OUTSIDE_ARENA, arena);
    }
    if !host_holds(&host) {
        return refuse(UNKNOWN_HOST_BUFFER, host.iova.raw());
    }
    for at in [src, dst] {
        if at
            .checked_add(len - 1)
            .is_none_or(|last| last >> edu::DMA_MASK_BITS != 0)
        {
            return refuse(BEYOND_MASK, at);
        }
    }
    Job::Copy { src, dst, len }
}

/// The bytes of the chunk that starts `done` bytes into a copy of `len`: the rest, at most
/// [`edu::MAX_TRANSFER`] (0 once the copy is across).
pub(crate) fn next_chunk(len: u64, done: u64) -> usize {
    let left = len.saturating_sub(done);
    usize::try_from(left).map_or(edu::MAX_TRANSFER, |left| left.min(edu::MAX_TRANSFER))
}

/// The transfers edu runs for a copy of `len` bytes: two per chunk.
pub(crate) fn transfers_for(len: u64) -> u64 {
    2 * len.div_ceil(edu::MAX_TRANSFER as u64)
}

/// A pushed op: its job, its tag, its command id.
#[derive(Debug, Clone, Copy)]
struct Entry {
    job: Job,
    tag: u64,
    command: u16,
}

/// A queue of an edu engine: see the module docs.
#[derive(Debug)]
pub(crate) struct EduQueue {
    id: u16,
    depth: usize,
    shared: Arc<Shared>,
    /// The engine's reset count when the queue was opened.
    resets: u64,
    /// Transfers end with edu's interrupt, and waits sleep on it.
    interrupt: bool,
    /// Pushed, not yet announced.
    queued: VecDeque<Entry>,
    /// Announced, not yet completed; the first one's transfers are under way.
    announced: VecDeque<Entry>,
    /// Completed, not yet handed back.
    done: VecDeque<Completion>,
    /// Bytes of the first announced job that are across.
    across: u64,
    /// Bytes of its current chunk that sit in edu's buffer, waiting for the second transfer.
    staged: Option<usize>,
    /// The transfer edu runs for the queue.
    transfer: Option<Transfer>,
    command: u16,
}

impl EduQueue {
    /// Queue `spec` over `shared` (the engine checked the id, unit and depth and marked the
    /// queue open). With `interrupt`, transfers end with edu's MSI and waits sleep on it.
    pub(super) fn open(shared: Arc<Shared>, spec: QueueSpec, interrupt: bool) -> EduQueue {
        let depth = spec.depth as usize;
        EduQueue {
            id: spec.id,
            depth,
            // Acquire: pairs with the Release of `reset`; a reset before this open does not
            // stop the queue.
            resets: shared.resets.load(Ordering::Acquire),
            shared,
            interrupt,
            queued: VecDeque::with_capacity(depth),
            announced: VecDeque::with_capacity(depth),
            done: VecDeque::with_capacity(depth),
            across: 0,
            staged: None,
            transfer: None,
            command: 0,
        }
    }

    fn in_flight(&self) -> usize {
        self.queued.len() + self.announced.len() + self.done.len()
    }

    /// Fails when the device is gone or the engine was reset since the queue was opened.
    fn check(&self) -> Result<(), userdma_infer::Error> {
        if self.shared.removed() {
            return Err(self.removed());
        }
        // Acquire: pairs with the Release of `EduEngine::reset`.
        if self.shared.resets.load(Ordering::Acquire) != self.resets {
            return Err(userdma::Error::from(ring::Error::Faulted { queue: self.id }).into());
        }
        Ok(())
    }

    /// Takes edu's engine and buffer for this queue's copy, or says they are another's.
    fn take_engine(&self) -> bool {
        let me = u32::from(self.id) + 1;
        // Acquire: pairs with the Release of the queue that gave them back (its transfers
        // ended before).
        match self
            .shared
            .holder
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => true,
            Err(holder) => holder == me,
        }
    }

    /// Gives edu's engine and buffer back, if this queue holds them.
    fn give_engine(&self) {
        let me = u32::from(self.id) + 1;
        // Release: this queue's transfers ended before the next holder starts one.
        let _ = self
            .shared
            .holder
            .compare_exchange(me, 0, Ordering::Release, Ordering::Relaxed);
    }

    /// Whether this queue could start a copy now (nobody else's copy holds edu).
    fn engine_free(&self) -> bool {
        let holder = self.shared.holder.load(Ordering::Relaxed);
        holder == 0 || holder == u32::from(self.id) + 1
    }

    fn removed(&self) -> userdma_infer::Error {
        userdma::Error::from(ring::Error::Removed {
            queue: self.id,
            in_flight: self.in_flight(),
        })
        .into()
    }

    /// Moves the jobs on: acknowledges a transfer that has ended and starts the next one,
    /// completing every job whose bytes are across (or that was refused) on the way. Returns
    /// with a transfer under way, with no job left, or with a copy waiting for another
    /// queue's to be across.
    fn advance(&mut self) -> Result<(), userdma_infer::Error> {
        loop {
            if let Some(transfer) = self.transfer {
                match self
                    .shared
                    .edu
                    .engine()
                    .map_err(|f| driver(self.id, "read edu's DMA command register", f))?
                {
                    Engine::Running => return Ok(()),
                    Engine::Gone => return Err(self.removed()),
                    Engine::Idle => {
                        // Acquire: the bytes the transfer wrote are read (by a later
                        // transfer's start, by the host) after the load that saw it end;
                        // pairs with the device's writes before it cleared the start bit.
                        fence(Ordering::Acquire);
                        self.transfer = None;
                        self.ended(transfer)?;
                    }
                }
            }
            let Some(entry) = self.announced.front().copied() else {
                return Ok(());
            };
            match entry.job {
                Job::Refuse { status, result } => self.complete(status, result),
                Job::Copy { src, dst, len } => {
                    if let Some(chunk) = self.staged {
                        return self.start(Direction::FromDevice, dst + self.across, chunk);
                    }
                    match next_chunk(len, self.across) {
                        0 => self.complete(0, 0),
                        // Another queue's copy holds edu: this one waits its turn.
                        _ if !self.take_engine() => return Ok(()),
                        chunk => return self.start(Direction::ToDevice, src + self.across, chunk),
                    }
                }
            }
        }
    }

    /// Starts a transfer of `len` bytes between `addr` and the start of edu's buffer.
    fn start(
        &mut self,
        direction: Direction,
        addr: u64,
        len: usize,
    ) -> Result<(), userdma_infer::Error> {
        let transfer = self
            .shared
            .edu
            .start(direction, addr, 0, len, self.interrupt)
            .map_err(|f| driver(self.id, "start a transfer of edu's DMA engine", f))?;
        self.transfer = Some(transfer);
        Ok(())
    }

    /// What follows the end of `transfer`: its interrupt acknowledged, the counts, and the
    /// chunk staged in edu's buffer (after the first transfer) or across (after the second).
    fn ended(&mut self, transfer: Transfer) -> Result<(), userdma_infer::Error> {
        if self.interrupt {
            // The MSI itself is counted where the eventfd is read; edu keeps the status bit
            // until it is acknowledged.
            self.shared
                .edu
                .ack_irq(edu::IRQ_DMA)
                .map_err(|f| driver(self.id, "acknowledge edu's DMA interrupt", f))?;
        }
        let counters = &self.shared.counters;
        let seen = u64::try_from(transfer.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: statistics; nothing is published through them.
        counters.transfers.fetch_add(1, Ordering::Relaxed);
        counters.seen_ns.fetch_add(seen, Ordering::Relaxed);
        match transfer.direction {
            Direction::ToDevice => self.staged = Some(transfer.len),
            Direction::FromDevice => {
                self.staged = None;
                self.across += transfer.len as u64;
                counters
                    .bytes
                    .fetch_add(transfer.len as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Completes the first announced job with `status` and `result`.
    fn complete(&mut self, status: u32, result: u64) {
        if let Some(entry) = self.announced.pop_front() {
            self.done.push_back(Completion {
                tag: entry.tag,
                status,
                result,
                queue: self.id,
                command: entry.command,
            });
        }
        self.across = 0;
        self.staged = None;
        self.give_engine();
    }

    /// Waits until the transfer under way (if any) has ended, so that edu touches no buffer of
    /// the queue any more: at once for a device that is gone. Forgets the transfer either way
    /// (after a failure the caller leaks the buffers). Then gives edu back to the other
    /// queues; after a failure it keeps it, as a transfer may still run.
    fn quiesce(&mut self) -> Result<(), userdma_infer::Error> {
        if self.transfer.take().is_some() {
            self.shared
                .wait_idle(self.id, "finish its DMA transfer for a queue's shutdown")?;
        }
        self.give_engine();
        Ok(())
    }

    /// Whether a call would make progress now: a completion to hand back, or a job edu is not
    /// working on (a refused one, the next after a transfer that has ended, a copy that can
    /// take edu).
    fn ready(&self) -> bool {
        if !self.done.is_empty() {
            return true;
        }
        match (self.transfer, self.announced.front()) {
            // A register that cannot be read is for `poll` to report.
            (Some(_), _) => !matches!(self.shared.edu.engine(), Ok(Engine::Running)),
            (None, None) => false,
            (None, Some(entry)) => match entry.job {
                Job::Refuse { .. } => true,
                Job::Copy { .. } => self.engine_free(),
            },
        }
    }
}

impl Queue for EduQueue {
    fn id(&self) -> u16 {
        self.id
    }

    fn push(&mut self, op: Op, tag: u64) -> Result<(), userdma_infer::Error> {
        self.check()?;
        if self.in_flight() >= self.depth {
            return Err(userdma::Error::from(ring::Error::Full {
                queue: self.id,
                depth: self.depth as u32,
            })
            .into());
        }
        let known = &self.shared.known;
        let job = job_of(
            &op,
            |at, len| known.holds_arena(at, len),
            |span| known.holds_host(span),
        );
        self.queued.push_back(Entry {
            job,
            tag,
            command: self.command,
        });
        self.command = self.command.wrapping_add(1);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), userdma_infer::Error> {
        self.check()?;
        // No allocation: `announced` holds `depth` entries, and the queue never has more.
        self.announced.extend(self.queued.drain(..));
        self.advance()
    }

    fn poll(&mut self) -> Result<Option<Completion>, userdma_infer::Error> {
        self.check()?;
        self.advance()?;
        Ok(self.done.pop_front())
    }

    fn wait(&mut self, timeout: Duration) -> Result<Completion, userdma_infer::Error> {
        let start = Instant::now();
        loop {
            if let Some(done) = self.poll()? {
                return Ok(done);
            }
            let waited = start.elapsed();
            if waited >= timeout || (self.transfer.is_none() && self.announced.is_empty()) {
                // Out of time, or nothing under way nor waiting for edu: nothing will come.
                return Err(self.overdue(waited));
            }
            let left = (timeout - waited).min(IRQ_SLICE);
            // A copy waiting for another queue's has no interrupt of its own to sleep on.
            match (
                &self.shared.vector,
                self.interrupt && self.transfer.is_some(),
            ) {
                (Some(vector), true) => {
                    let fired = vector.wait(Some(left)).map_err(|source| {
                        userdma::Error::from(ring::Error::Interrupt {
                            queue: self.id,
                            source,
                        })
                    })?;
                    // Relaxed: a statistic.
                    let interrupts = &self.shared.counters.interrupts;
                    interrupts.fetch_add(fired.unwrap_or(0), Ordering::Relaxed);
                }
                _ => thread::sleep(POLL_INTERVAL.min(left)),
            }
        }
    }

    fn waitable(&mut self) -> Option<&mut dyn ring::Waitable> {
        if !self.interrupt || self.ready() {
            // No interrupt to sleep on, or work to do right now: poll instead.
            return None;
        }
        Some(self)
    }

    fn interrupt(&self) -> Option<&userdma::irq::EventFd> {
        self.shared.vector.as_ref().filter(|_| self.interrupt)
    }

    fn overdue(&self, waited: Duration) -> userdma_infer::Error {
        userdma::Error::from(ring::Error::Timeout {
            queue: self.id,
            waited,
            in_flight: self.in_flight(),
            oldest: self.announced.front().map(|e| e.command),
        })
        .into()
    }

    fn shutdown(mut self: Box<Self>) -> Result<Stopped, userdma_infer::Error> {
        self.quiesce()?;
        // The job under way and every one after it never finished: aborted.
        let aborted = self
            .announced
            .drain(..)
            .chain(self.queued.drain(..))
            .map(|e| e.tag)
            .collect();
        Ok(Stopped {
            completed: self.done.drain(..).collect(),
            aborted,
        })
    }
}

impl ring::Waitable for EduQueue {
    /// Takes the interrupts the eventfd holds (so that the sleep that follows is woken by a
    /// new one only), then says whether there is work already. The order makes a wake-up
    /// impossible to miss: edu clears the start bit before it raises the MSI, so a transfer
    /// seen running here signals the eventfd after this drain.
    fn arm_interrupt(&mut self) -> Result<bool, ring::Error> {
        self.shared
            .drain_interrupts()
            .map_err(|source| ring::Error::Interrupt {
                queue: self.id,
                source,
            })?;
        Ok(self.ready())
    }

    fn disarm_interrupt(&mut self) {}

    fn is_ready(&self) -> bool {
        self.ready()
    }
}

impl Drop for EduQueue {
    fn drop(&mut self) {
        // A queue dropped with a transfer under way (not shut down) still waits for it; a
        // failure here leaves nothing to hand back.
        let _ = self.quiesce();
        // Release: the next open of this id (Acquire) sees this queue done with edu.
        self.shared
            .open
            .fetch_and(!(1_u32 << self.id), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::ptr::NonNull;

    use userdma::dma::Iova;
    use userdma_infer::pipeline::Step;

    use super::*;

    fn span(iova: u64, len: u64) -> HostSpan {
        HostSpan {
            iova: Iova(iova),
            ptr: NonNull::dangling(),
            len,
        }
    }

    #[test]
    fn chunks_cover_a_copy_in_edu_sized_pieces() {
        for len in [1, 4094, 4095, 4096, 8190, 8191, 6000, 100_000] {
            let (mut done, mut chunks) = (0, 0);
            loop {
                let chunk = next_chunk(len, done);
                if chunk == 0 {
                    break;
                }
                assert!(chunk <= edu::MAX_TRANSFER, "{len}: {chunk}");
                done += chunk as u64;
                chunks += 1;
            }
            assert_eq!(done, len);
            assert_eq!(2 * chunks, transfers_for(len), "{len}");
        }
        assert_eq!(transfers_for(2048), 2);
        assert_eq!(transfers_for(6000), 4);
        assert_eq!(transfers_for(0), 0);
        assert_eq!(next_chunk(10, 20), 0);
    }

    #[test]
    fn a_copy_passes_only_when_both_sides_are_known_and_below_the_mask() {
        let arena = |at: u64, len: u64| at >= 0x10_0000 && at + len <= 0x10_2000;
        let host = |s: &HostSpan| s.iova.raw() >= 0x20_0000;
        let to = Op::ToDevice {
            from: span(0x20_0000, 0x800),
            to: 0x10_0000,
        };
        assert_eq!(
            job_of(&to, arena, host),
            Job::Copy {
                src: 0x20_0000,
                dst: 0x10_0000,
                len: 0x800
            }
        );
        let back = Op::ToHost {
            from: 0x10_1000,
            to: span(0x30_0000, 0x1000),
        };
        assert_eq!(
            job_of(&back, arena, host),
            Job::Copy {
                src: 0x10_1000,
                dst: 0x30_0000,
                len: 0x1000
            }
        );
        let past_arena = Op::ToHost {
            from: 0x10_1800,
            to: span(0x30_0000, 0x1000),
        };
        assert_eq!(
            job_of(&past_arena, arena, host),
            Job::Refuse {
                status: OUTSIDE_ARENA,
                result: 0x10_1800
            }
        );
        let stranger = Op::ToDevice {
            from: span(0x1000, 0x10),
            to: 0x10_0000,
        };
        assert_eq!(
            job_of(&stranger, arena, host),
            Job::Refuse {
                status: UNKNOWN_HOST_BUFFER,
                result: 0x1000
            }
        );
        let high = Op::ToDevice {
            from: span((1 << 28) - 0x10, 0x20),
            to: 0x10_0000,
        };
        assert_eq!(
            job_of(&high, arena, host),
            Job::Refuse {
                status: BEYOND_MASK,
                result: (1 << 28) - 0x10
            }
        );
        // The last byte just below the mask is fine.
        let top = Op::ToDevice {
            from: span((1 << 28) - 0x20, 0x20),
            to: 0x10_0000,
        };
        assert!(matches!(job_of(&top, arena, host), Job::Copy { .. }));
    }

    #[test]
    fn steps_and_waits_are_unsupported_and_nothing_is_looked_up_for_them() {
        let never = |_: u64, _: u64| -> bool { panic!("no arena lookup") };
        let never_host = |_: &HostSpan| -> bool { panic!("no host lookup") };
        let step = Op::Step {
            arena: 0,
            step: Step::Compute {
                src: 0,
                dst: 4,
                len: 4,
                xor: 1,
                add: 2,
            },
        };
        let after = Op::After { queue: 1, count: 3 };
        for op in [step, after] {
            assert_eq!(
                job_of(&op, never, never_host),
                Job::Refuse {
                    status: UNSUPPORTED,
                    result: 0
                }
            );
        }
        let empty = Op::ToDevice {
            from: span(0, 0),
            to: 0,
        };
        assert_eq!(
            job_of(&empty, never, never_host),
            Job::Copy {
                src: 0,
                dst: 0,
                len: 0
            }
        );
    }
}
