//! Stopping a queue: asking its device to stop ([`Quiesce`]), noticing the device gone
//! ([`Presence`]), [`Queue::shutdown`] and drop, and what is leaked, on purpose, when a device
//! cannot be stopped ([`leaks`]).

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};
use std::time::Duration;

use super::{Done, Queue};
use crate::ring::{Completion, Error, Submission};

/// What a device offers to stop working on a queue: implemented by devices (the loopback
/// device; a VFIO driver that can disable a queue or reset the function).
pub trait Quiesce: Send {
    /// Makes the device stop reading and writing queue `queue`'s ring memory and every buffer
    /// its descriptors name, waiting up to `timeout` for it to have stopped. `Ok` only once the
    /// device will touch none of it again.
    fn quiesce(&mut self, queue: u16, timeout: Duration) -> io::Result<()>;
}

/// Whether the device behind a queue is still there: implemented by a device's event source
/// ([`device::Source`](crate::device::Source)), given to a queue with [`Queue::set_presence`].
/// Once it says gone, the device can no longer touch the queue's memory or its buffers (the
/// source reports the removal only after the device was stopped or cut off from memory), so a
/// queue stops waiting and hands its payloads back on [`Queue::shutdown`].
pub trait Presence: Send + Sync + fmt::Debug {
    /// Whether the device is gone (removed, or asked back by the kernel).
    fn is_gone(&self) -> bool;
}

/// A boxed hook (`Box<dyn Quiesce>`, chosen at run time) is a hook.
impl<Q: Quiesce + ?Sized> Quiesce for Box<Q> {
    fn quiesce(&mut self, queue: u16, timeout: Duration) -> io::Result<()> {
        (**self).quiesce(queue, timeout)
    }
}

/// What queues have leaked so far in this process: each leaked queue keeps its ring memory
/// mapped and its in-flight payloads alive forever, because the device could not be stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leaks {
    /// Queues whose ring memory was leaked.
    pub queues: u64,
    /// In-flight payloads leaked with them.
    pub payloads: u64,
}

// Process-wide statistics, updated Relaxed (nothing is synchronised through them). std's
// atomics: a static cannot hold loom's, and loom does not model these.
static LEAKED_QUEUES: StdAtomicU64 = StdAtomicU64::new(0);
static LEAKED_PAYLOADS: StdAtomicU64 = StdAtomicU64::new(0);

/// What queues have leaked so far in this process (see [`Leaks`]).
pub fn leaks() -> Leaks {
    Leaks {
        queues: LEAKED_QUEUES.load(StdOrdering::Relaxed),
        payloads: LEAKED_PAYLOADS.load(StdOrdering::Relaxed),
    }
}

/// The outcome of [`Queue::shutdown`].
#[derive(Debug)]
pub struct Shutdown<C, T> {
    /// Commands that completed, in completion order.
    pub completed: Vec<Done<C, T>>,
    /// Commands the device was stopped before completing: their ids and payloads, safe to reuse
    /// (the device no longer touches them).
    pub aborted: Vec<(u16, T)>,
}

/// How long a queue dropped with work in flight gives its device to stop.
pub const DROP_QUIESCE_TIMEOUT: Duration = Duration::from_secs(1);

impl<D: Submission, C: Completion, T: Send> Queue<D, C, T> {
    /// Shutdown's [`Queue::collect`]: moves the CQ's completions into `pending` up to the
    /// first entry the queue cannot take (a protocol error, or a faulted queue), which faults
    /// the queue. Returns whether it did: the CQ is not read again.
    fn collect_trusted(&mut self) -> bool {
        if self.faulted {
            return true;
        }
        loop {
            match self.take_cq() {
                Ok(Some(done)) => self.cq.pending.push_back(done),
                Ok(None) => break,
                Err(_) => {
                    self.fault();
                    return true;
                }
            }
        }
        // A CQ head doorbell that cannot be written leaves the device short of room, which
        // the stop that follows makes moot.
        let _ = self.announce_cq();
        false
    }

    /// Payloads of entries pushed but never announced: the device cannot have seen them
    /// (it reads only up to the SQ tail doorbell), so they are safe to hand back.
    fn take_unannounced(&mut self) -> Vec<(u16, T)> {
        let mut taken = Vec::new();
        while self.sq.tail.unflushed() > 0 {
            self.sq.tail.unwrite();
            let desc: D = self
                .memory
                .read_entry(self.layout.sq_entry(self.sq.tail.next()));
            let id = desc.command_id();
            if let Some(payload) = self
                .payloads
                .slots
                .get_mut(usize::from(id))
                .and_then(Option::take)
            {
                // The device never saw it: its id may come back first.
                self.payloads.free_ids.push_back(id);
                if self
                    .payloads
                    .order
                    .back()
                    .is_some_and(|&(newest, _)| newest == id)
                {
                    self.payloads.order.pop_back();
                }
                taken.push((id, payload));
            }
        }
        taken
    }

    /// Nothing of the queue is in the device's hands: no command in flight, every announced SQ
    /// entry read.
    fn quiet(&mut self) -> bool {
        self.refresh_sq_head().is_ok()
            && self.in_flight() == 0
            && self.sq.head == self.sq.tail.announced()
    }

    /// Keeps the ring memory and every in-flight payload alive forever, and counts it.
    fn leak(&mut self) -> usize {
        let mut count = 0u64;
        for slot in self.payloads.slots.iter_mut() {
            if let Some(payload) = slot.take() {
                crate::memory::keep_until_exit(payload);
                count += 1;
            }
        }
        // The device may still write the rings: their memory must never be unmapped.
        crate::memory::keep_until_exit(self.memory.clone());
        LEAKED_QUEUES.fetch_add(1, StdOrdering::Relaxed);
        LEAKED_PAYLOADS.fetch_add(count, StdOrdering::Relaxed);
        self.closed = true;
        #[cfg(feature = "tracing")]
        tracing::error!(
            queue = self.id,
            leaked = count,
            "the device did not stop the queue: its buffers and ring memory are leaked"
        );
        count as usize
    }

    /// Stops the queue: announces what is queued, waits up to `timeout` for every command to
    /// complete and returns the completions. If some are still in flight then, asks the device
    /// to stop ([`Quiesce`], with the same timeout) and hands back their payloads as aborted.
    /// If the device cannot be stopped, the payloads and ring memory are leaked (see [`leaks`])
    /// and the error says how many.
    ///
    /// A queue faulted by a protocol error ([`Error::Faulted`]), or one whose CQ holds an entry
    /// it cannot take, reads no more of the CQ (nothing after a broken completion can be
    /// trusted): it hands back what it took before, asks the device to stop and hands every
    /// other payload back as aborted. After [`Device::reset`](crate::device::Device::reset)
    /// (the device touches nothing any more), `shutdown(Duration::ZERO)` does this at once.
    pub fn shutdown(mut self, timeout: Duration) -> Result<Shutdown<C, T>, Error> {
        let deadline = std::time::Instant::now().checked_add(timeout);
        let mut completed = Vec::new();
        // A faulted queue announces nothing more: what is unannounced the device never saw.
        let mut aborted = if self.faulted || self.flush().is_err() {
            self.take_unannounced()
        } else {
            Vec::new()
        };
        loop {
            if self.collect_trusted() {
                completed.extend(self.cq.pending.drain(..));
                break;
            }
            completed.extend(self.cq.pending.drain(..));
            if self.quiet() {
                self.closed = true;
                return Ok(Shutdown { completed, aborted });
            }
            if self.is_gone() {
                // Nothing more will complete: stop the queue now.
                break;
            }
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            if left == Some(Duration::ZERO) {
                break;
            }
            // With nothing in flight, all that is left is the device's SQ head write-back,
            // which raises no interrupt: wait in slices short enough to notice it (as
            // `push_wait` does), not for a completion that will not come.
            let wait = if self.in_flight() == 0 {
                Some(crate::ring::wait::head_slice(left))
            } else {
                left
            };
            match self.wait_ready(wait) {
                Ok(()) | Err(Error::Timeout { .. } | Error::Removed { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        let in_flight = self.in_flight();
        let result = match self.quiesce.as_mut() {
            Some(quiesce) => quiesce.quiesce(self.id, timeout),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no Quiesce given (Queue::set_quiesce)",
            )),
        };
        match result {
            Ok(()) => {
                // Stopped: what it completed meanwhile is in the CQ (up to a broken entry);
                // the rest is aborted.
                self.collect_trusted();
                completed.extend(self.cq.pending.drain(..));
                for (id, slot) in self.payloads.slots.iter_mut().enumerate() {
                    if let Some(payload) = slot.take() {
                        aborted.push((id as u16, payload));
                    }
                }
                self.payloads.order.clear();
                self.closed = true;
                Ok(Shutdown { completed, aborted })
            }
            Err(source) => {
                let leaked = self.leak();
                Err(Error::Quiesce {
                    queue: self.id,
                    in_flight,
                    leaked,
                    source,
                })
            }
        }
    }
}

impl<D: Submission, C: Completion, T: Send> Drop for Queue<D, C, T> {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        // Entries the device never heard of are simply dropped.
        drop(self.take_unannounced());
        // Whatever the device finished is handed back (and dropped here).
        let _ = self.collect();
        self.cq.pending.clear();
        if self.quiet() {
            return;
        }
        let stopped = match self.quiesce.as_mut() {
            Some(quiesce) => quiesce.quiesce(self.id, DROP_QUIESCE_TIMEOUT).is_ok(),
            None => false,
        };
        if !stopped {
            self.leak();
        }
        // Stopped: the payloads drop with the queue; the device no longer touches them.
    }
}
