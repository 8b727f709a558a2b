//! Waiting for completions: busy-polling ([`Queue::poll_one`]), blocking with an adaptive spin
//! then sleep on the queue's interrupt ([`Queue::wait`]), a `Future` that any executor can drive
//! ([`Queue::next_completion`]), and one thread waiting on many queues ([`wait_any`]).
//!
//! Sleeping is safe against lost wake-ups: the host drains the eventfd, sets the interrupt flag
//! in ring memory, issues a SeqCst fence and looks at the CQ once more before it sleeps; the
//! device writes the completion, issues a SeqCst fence and then reads the flag (see the orderings
//! table in `queue.rs`). The flag is cleared again once the host is awake, so a host that is
//! busy-polling costs the device no system calls.

use std::time::{Duration, Instant};

use super::{Completion, Done, Error, Queue, Rejected, Submission};
use crate::irq;
use crate::sync::{fence, hint, Ordering};

/// How often (in spin iterations) a spinning wait looks at the clock.
const CLOCK_EVERY: u32 = 64;

/// How long to sleep at a time when what is awaited may be an SQ head write-back, which raises
/// no interrupt: a millisecond, or `left` (`None`: no deadline) if less.
pub(super) fn head_slice(left: Option<Duration>) -> Duration {
    const SLICE: Duration = Duration::from_millis(1);
    left.map_or(SLICE, |left| left.min(SLICE))
}

/// The time left until `deadline` (`None`: no deadline), zero once passed.
fn left(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

impl<D: Submission, C: Completion, T: Send> Queue<D, C, T> {
    /// Asks the device to raise the interrupt for its next completion (sets the flag in ring
    /// memory, after draining the eventfd of stale signals). Returns whether a completion is
    /// waiting already, in which case do not sleep. Pair with [`Queue::disarm_interrupt`] once
    /// awake; use it directly only to sleep on several queues (see [`wait_any`]).
    pub fn arm_interrupt(&mut self) -> Result<bool, Error> {
        if let Some(irq) = &self.interrupt {
            irq.try_read().map_err(|source| Error::Interrupt {
                queue: self.id,
                source,
            })?;
        }
        self.memory.store_u32(self.layout.interrupt_offset(), 1);
        self.cq.armed = true;
        // SeqCst: a store-load barrier. Either this thread sees the device's phase store below,
        // or the device, after its own SeqCst fence, sees the flag stored above and raises the
        // interrupt (pairs with the fence(SeqCst) in `DeviceQueue::interrupt`).
        fence(Ordering::SeqCst);
        Ok(self.is_ready())
    }

    /// Clears the interrupt flag: the device stops raising the interrupt (a late one is
    /// harmless, the next arm drains it).
    pub fn disarm_interrupt(&mut self) {
        if self.cq.armed {
            // Relaxed: no data is published by clearing the flag; a device that still sees it
            // set raises one spurious interrupt.
            self.memory.store_u32(self.layout.interrupt_offset(), 0);
            self.cq.armed = false;
        }
    }

    /// Waits up to `timeout` (`None`: forever) until a completion is ready, without taking it:
    /// spins up to the adaptive spin budget, then sleeps on the interrupt eventfd (without one,
    /// keeps polling and yields the CPU). `Error::Timeout` when the time is up.
    pub fn wait_ready(&mut self, timeout: Option<Duration>) -> Result<(), Error> {
        if !self.cq.pending.is_empty() {
            return Ok(());
        }
        self.wait_cq(timeout)
    }

    /// Waits for the CQ (not `pending`) to have an entry.
    pub(super) fn wait_cq(&mut self, timeout: Option<Duration>) -> Result<(), Error> {
        if self.cq_ready() {
            return Ok(());
        }
        // The device may be waiting for CQ room the host has freed but not announced.
        self.announce_cq()?;
        let start = Instant::now();
        let deadline = timeout.and_then(|t| start.checked_add(t));
        let spin = timeout.map_or(self.cq.spin, |t| t.min(self.cq.spin));
        let mut spins = 0u32;
        loop {
            if self.cq_ready() {
                self.spin_succeeded(start.elapsed());
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            if spins % CLOCK_EVERY == 0 {
                if self.is_gone() {
                    return Err(self.removed());
                }
                if start.elapsed() >= spin {
                    break;
                }
            }
            hint::spin_loop();
        }
        let Some(irq) = self.interrupt.clone() else {
            // No interrupt: poll, letting other threads run.
            loop {
                if self.cq_ready() {
                    return Ok(());
                }
                if self.is_gone() {
                    return Err(self.removed());
                }
                if left(deadline) == Some(Duration::ZERO) {
                    return Err(self.timeout(start));
                }
                std::thread::yield_now();
            }
        };
        self.stats.sleeps += 1;
        loop {
            if self.arm_interrupt()? {
                self.disarm_interrupt();
                self.woke(start.elapsed());
                return Ok(());
            }
            let remaining = left(deadline);
            if remaining == Some(Duration::ZERO) {
                self.disarm_interrupt();
                return Err(self.timeout(start));
            }
            let woken = irq.wait_readable(remaining);
            self.disarm_interrupt();
            woken.map_err(|source| Error::Interrupt {
                queue: self.id,
                source,
            })?;
            if self.cq_ready() {
                self.woke(start.elapsed());
                return Ok(());
            }
            if self.is_gone() {
                // The removal signals every vector of the device.
                return Err(self.removed());
            }
            // A stale or spurious signal: arm again (which drains it) and sleep for the rest.
        }
    }

    fn timeout(&self, start: Instant) -> Error {
        self.overdue(start.elapsed())
    }

    /// The error a wait that saw nothing complete for `waited` ends with
    /// ([`Error::Timeout`]), for a driver that keeps its own deadline: one that sleeps on
    /// several queues at once ([`wait_any`](super::wait_any)) and finds this one's commands
    /// overdue.
    pub fn overdue(&self, waited: Duration) -> Error {
        Error::Timeout {
            queue: self.id,
            waited,
            in_flight: self.in_flight(),
            oldest: self.oldest_in_flight(),
        }
    }

    /// A completion arrived while spinning after `waited`: spin at least twice that next time.
    fn spin_succeeded(&mut self, waited: Duration) {
        self.cq.spin = self
            .cq
            .spin
            .max(waited.saturating_mul(2))
            .min(self.cq.max_spin);
    }

    /// A completion arrived only after sleeping, `waited` after the wait began. If that was
    /// within the spin limit, spinning would have caught it: spin that long next time. If not,
    /// halve the spin budget: spinning did not pay.
    fn woke(&mut self, waited: Duration) {
        if waited < self.cq.max_spin {
            self.spin_succeeded(waited);
        } else {
            self.cq.spin /= 2;
        }
    }

    /// Waits up to `timeout` (`None`: forever) for a completion and takes it (see
    /// [`Queue::wait_ready`]).
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<Done<C, T>, Error> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if let Some(done) = self.poll_one()? {
                return Ok(done);
            }
            self.wait_ready(left(deadline).or(timeout.filter(|_| deadline.is_none())))?;
        }
    }

    /// [`Queue::push`], waiting up to `timeout` (`None`: forever) for room when the SQ or the
    /// command ids are exhausted. While it waits it flushes what is queued (the device cannot
    /// free room it was not told about) and reaps completions, which later polls hand out
    /// first. Does not ring the doorbell for this command: [`Queue::flush`] after the batch.
    pub fn push_wait(
        &mut self,
        desc: D,
        payload: T,
        timeout: Option<Duration>,
    ) -> Result<u16, Rejected<D, T>> {
        let start = Instant::now();
        let deadline = timeout.and_then(|t| start.checked_add(t));
        let (mut desc, mut payload) = (desc, payload);
        loop {
            let rejected = match self.push(desc, payload) {
                Ok(id) => return Ok(id),
                Err(rejected) => rejected,
            };
            if !matches!(
                rejected.error,
                Error::Full { .. } | Error::NoCommandId { .. }
            ) {
                return Err(rejected);
            }
            let Rejected {
                descriptor,
                payload: given,
                ..
            } = rejected;
            (desc, payload) = (descriptor, given);
            let step = self.flush().and_then(|()| self.collect());
            if let Err(error) = step {
                return Err(Rejected {
                    error,
                    descriptor: desc,
                    payload,
                });
            }
            if !self.cq.pending.is_empty() {
                // Ids were freed; SQ room comes back with the device's head write-back.
                continue;
            }
            let remaining = left(deadline);
            if remaining == Some(Duration::ZERO) {
                let error = self.timeout(start);
                return Err(Rejected {
                    error,
                    descriptor: desc,
                    payload,
                });
            }
            // Room comes back with completions (interrupt) or SQ head write-backs (no
            // interrupt): wait for the former in slices short enough to notice the latter.
            let slice = head_slice(remaining);
            match self.wait_cq(Some(slice)) {
                Ok(()) | Err(Error::Timeout { .. }) => {}
                Err(error) => {
                    return Err(Rejected {
                        error,
                        descriptor: desc,
                        payload,
                    })
                }
            }
        }
    }

    /// A future of the next completion, for any executor (tokio, `futures::executor`, ...):
    /// ready at once if one is waiting; otherwise it arms the interrupt and has the crate's
    /// interrupt thread wake the task when the eventfd fires. A queue without an interrupt
    /// gives a future that polls (it wakes itself each time it is pending).
    #[cfg(not(loom))]
    pub fn next_completion(&mut self) -> NextCompletion<'_, D, C, T> {
        NextCompletion {
            queue: self,
            registered: false,
        }
    }
}

/// The future of [`Queue::next_completion`].
#[cfg(not(loom))]
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct NextCompletion<'a, D: Submission, C: Completion, T: Send> {
    queue: &'a mut Queue<D, C, T>,
    registered: bool,
}

#[cfg(not(loom))]
impl<D: Submission, C: Completion, T: Send> std::future::Future for NextCompletion<'_, D, C, T> {
    type Output = Result<Done<C, T>, Error>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let this = self.get_mut();
        let queue = &mut *this.queue;
        let ready = |queue: &mut Queue<D, C, T>| {
            queue.disarm_interrupt();
            match queue.poll_one() {
                Ok(Some(done)) => Some(Ok(done)),
                Ok(None) => None,
                Err(err) => Some(Err(err)),
            }
        };
        if queue.is_ready() {
            if let Some(result) = ready(queue) {
                return Poll::Ready(result);
            }
        }
        if let Err(err) = queue.announce_cq() {
            return Poll::Ready(Err(err));
        }
        let Some(irq) = queue.interrupt.clone() else {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        };
        match queue.arm_interrupt() {
            Err(err) => return Poll::Ready(Err(err)),
            Ok(true) => {
                if let Some(result) = ready(queue) {
                    return Poll::Ready(result);
                }
            }
            Ok(false) => {}
        }
        let id = queue.id;
        let registered = crate::irq::reactor::global()
            .and_then(|reactor| reactor.register(queue.cq.reactor_key, irq, cx.waker().clone()));
        if let Err(source) = registered {
            return Poll::Ready(Err(Error::Interrupt { queue: id, source }));
        }
        this.registered = true;
        Poll::Pending
    }
}

#[cfg(not(loom))]
impl<D: Submission, C: Completion, T: Send> Drop for NextCompletion<'_, D, C, T> {
    fn drop(&mut self) {
        if self.registered {
            if let Ok(reactor) = crate::irq::reactor::global() {
                reactor.cancel(self.queue.cq.reactor_key);
            }
        }
        self.queue.disarm_interrupt();
    }
}

/// A queue one thread can sleep on together with others (see [`wait_any`]); implemented by
/// every [`Queue`], whatever its types.
pub trait Waitable {
    /// [`Queue::arm_interrupt`].
    fn arm_interrupt(&mut self) -> Result<bool, Error>;
    /// [`Queue::disarm_interrupt`].
    fn disarm_interrupt(&mut self);
    /// [`Queue::is_ready`].
    fn is_ready(&self) -> bool;
}

impl<D: Submission, C: Completion, T: Send> Waitable for Queue<D, C, T> {
    fn arm_interrupt(&mut self) -> Result<bool, Error> {
        Queue::arm_interrupt(self)
    }
    fn disarm_interrupt(&mut self) {
        Queue::disarm_interrupt(self)
    }
    fn is_ready(&self) -> bool {
        Queue::is_ready(self)
    }
}

/// Sleeps until at least one of `queues` has a completion, or `timeout` passes, and fills
/// `ready` with the indices of those that have one (empty on timeout). `waiter` must watch each
/// queue's interrupt eventfd ([`Queue::interrupt`]); tokens are not interpreted (every queue is
/// looked at after a wake-up), so any tokens do.
pub fn wait_any(
    waiter: &mut irq::Waiter,
    queues: &mut [&mut dyn Waitable],
    timeout: Option<Duration>,
    ready: &mut Vec<usize>,
) -> Result<(), Error> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    ready.clear();
    loop {
        ready.extend(
            queues
                .iter()
                .enumerate()
                .filter(|(_, queue)| queue.is_ready())
                .map(|(i, _)| i),
        );
        if !ready.is_empty() {
            return Ok(());
        }
        let mut armed = Ok(false);
        for queue in queues.iter_mut() {
            armed = queue.arm_interrupt();
            if !matches!(armed, Ok(false)) {
                break;
            }
        }
        let slept = match armed {
            Ok(false) => waiter
                .wait(left(deadline).or(timeout.filter(|_| deadline.is_none())))
                .map(|_| ())
                .map_err(|source| Error::WaitMany { source }),
            Ok(true) => Ok(()),
            Err(err) => Err(err),
        };
        for queue in queues.iter_mut() {
            queue.disarm_interrupt();
        }
        slept?;
        ready.extend(
            queues
                .iter()
                .enumerate()
                .filter(|(_, queue)| queue.is_ready())
                .map(|(i, _)| i),
        );
        if !ready.is_empty() || left(deadline) == Some(Duration::ZERO) {
            return Ok(());
        }
    }
}
