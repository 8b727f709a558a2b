//! Taking completions back: reading the CQ (the phase flip, then the entry behind
//! `fence(Acquire)`), checking the command id (in order, on an in-order queue), handing the
//! payload back, moving the SQ head a completion reports, and the CQ head doorbell.

use super::{Done, Queue};
use crate::ring::{index, Completion, Error, Submission};
use crate::sync::{fence, Ordering};

impl<D: Submission, C: Completion, T: Send> Queue<D, C, T> {
    /// Whether a completion is waiting (reaped earlier, or in the CQ).
    #[inline]
    pub fn is_ready(&self) -> bool {
        !self.cq.pending.is_empty() || self.cq_ready() || self.is_gone()
    }

    /// Whether the CQ entry at the head has the current phase.
    #[inline]
    pub(crate) fn cq_ready(&self) -> bool {
        let word = self
            .memory
            .load_u32(self.layout.cq_phase_word(self.cq.head));
        self.layout.is_current(word, self.cq.head)
    }

    /// Takes the CQ entry at the head, if the device wrote it, without a doorbell.
    #[inline]
    pub(super) fn take_cq(&mut self) -> Result<Option<Done<C, T>>, Error> {
        if self.faulted {
            return Err(Error::Faulted { queue: self.id });
        }
        if !self.cq_ready() {
            return Ok(None);
        }
        // Acquire: the entry's other words, written before the device's fence(Release) and
        // phase store, are read only after the phase flip was seen (pairs with the
        // fence(Release) in `DeviceQueue::complete`).
        fence(Ordering::Acquire);
        let entry: C = self.memory.read_entry(self.layout.cq_entry(self.cq.head));
        self.cq.head = self.cq.head.wrapping_add(1);
        let id = entry.command_id();
        if self.payloads.in_order {
            match self.payloads.order.front() {
                Some(&(oldest, _)) if oldest == id => {
                    self.payloads.order.pop_front();
                    self.payloads.last_done = Some(id);
                }
                _ => return Err(self.out_of_order(id)),
            }
        }
        let payload = self
            .payloads
            .slots
            .get_mut(usize::from(id))
            .and_then(Option::take)
            .ok_or(Error::UnknownCommand { queue: self.id, id })?;
        self.payloads.free(id);
        self.stats.completed += 1;
        let done = Done { id, entry, payload };
        // A format without the SQ head in its completions returns `None` here at compile time.
        if let Some(slot) = entry.sq_head() {
            if self.sq.head_from_cq {
                if let Err(error) = self.head_from(slot) {
                    // The command did complete: hand it out next, after the error.
                    self.cq.pending.push_back(done);
                    return Err(error);
                }
            }
        }
        Ok(Some(done))
    }

    /// A completion naming `got` on an in-order queue whose oldest command in flight is
    /// another: faults the queue (nothing is handed out, nothing more submitted) and says how
    /// the id differs. The payload `got` names, if it is in flight, stays in the queue: the
    /// device may still be working on that command.
    #[cold]
    #[inline(never)]
    fn out_of_order(&mut self, got: u16) -> Error {
        self.fault();
        let order = &self.payloads.order;
        let expected = order.front().map(|&(id, _)| id);
        let queue = self.id;
        let error = match (expected, order.iter().position(|&(id, _)| id == got)) {
            (Some(expected), Some(1)) => Error::LostCompletion {
                queue,
                expected,
                got,
            },
            (_, None) if self.payloads.last_done == Some(got) => Error::DuplicateCompletion {
                queue,
                expected,
                got,
            },
            _ => Error::WrongCommand {
                queue,
                expected,
                got,
            },
        };
        #[cfg(feature = "tracing")]
        tracing::warn!(queue, error = %error, "ring protocol error: queue faulted");
        error
    }

    /// Faults the queue: no completion is read and no submission taken from now on (the SQ
    /// limit pinned at the tail sends every submission to the cold path, which refuses it).
    pub(super) fn fault(&mut self) {
        self.faulted = true;
        self.sq.limit = self.sq.tail.next();
    }

    /// Moves the SQ head to the slot a completion reported: the first counter at or after the
    /// current head with that slot, which must not pass the announced tail. Reading the entry
    /// after the phase flip (the fence(Acquire) in `take_cq`) is what makes the slots before it
    /// free to overwrite: the device read them before it wrote the completion (its
    /// fence(Release) before the phase store). The SQ never holds `depth` entries here, so the
    /// slot names one counter.
    #[inline]
    fn head_from(&mut self, slot: u16) -> Result<(), Error> {
        let depth = self.layout.depth();
        let head = index::counter_of_slot(self.sq.head, u32::from(slot), depth);
        let announced = self.sq.tail.announced();
        if u32::from(slot) >= depth || !index::advance_ok(self.sq.head, head, announced) {
            return Err(Error::CompletionSqHead {
                queue: self.id,
                slot,
                old: index::slot(self.sq.head, depth),
                tail: index::slot(announced, depth),
                depth,
            });
        }
        self.sq.head = head;
        Ok(())
    }

    /// Rings the CQ head doorbell if entries were consumed since the last one.
    #[inline]
    pub(crate) fn announce_cq(&mut self) -> Result<(), Error> {
        if self.cq.head == self.cq.announced {
            return Ok(());
        }
        let value = self.doorbell.encode(self.cq.head, self.layout.depth());
        // The release of the doorbell's fence, for ThreadSanitizer: the CQ head's key is the
        // CQ's first byte (crate::sync::tsan_release).
        self.memory.tsan_release(self.layout.cq_entry(0));
        self.doorbells.ring_cq(self.id, value)?;
        self.cq.announced = self.cq.head;
        self.stats.cq_doorbells += 1;
        Ok(())
    }

    /// Takes one completion, if there is one, without waiting. Rings the CQ head doorbell when
    /// the CQ has nothing more, or half of it was consumed unannounced (so a loop of `poll_one`
    /// costs one doorbell per batch, like [`Queue::reap`]).
    #[inline]
    pub fn poll_one(&mut self) -> Result<Option<Done<C, T>>, Error> {
        if let Some(done) = self.cq.pending.pop_front() {
            return Ok(Some(done));
        }
        let taken = self.take_cq();
        let unannounced = index::used(self.cq.head, self.cq.announced);
        if unannounced > 0 && (unannounced >= self.depth() / 2 || !self.cq_ready()) {
            self.announce_cq()?;
        }
        match taken {
            // Nothing more will come from a device that is gone.
            Ok(None) if self.is_gone() => Err(self.removed()),
            taken => taken,
        }
    }

    /// Takes up to `max` completions, giving each to `f`, then rings the CQ head doorbell once.
    /// Returns how many. A completion naming an id that is not in flight is an error (after
    /// the doorbell for the ones before it).
    pub fn reap(&mut self, max: usize, mut f: impl FnMut(Done<C, T>)) -> Result<usize, Error> {
        let mut count = 0;
        while count < max {
            if let Some(done) = self.cq.pending.pop_front() {
                f(done);
                count += 1;
                continue;
            }
            match self.take_cq() {
                Ok(Some(done)) => {
                    f(done);
                    count += 1;
                }
                Ok(None) => {
                    if count == 0 && self.is_gone() {
                        return Err(self.removed());
                    }
                    break;
                }
                Err(err) => {
                    self.announce_cq()?;
                    return Err(err);
                }
            }
        }
        self.announce_cq()?;
        Ok(count)
    }

    /// Moves every completion in the CQ into `pending` (to make room while waiting).
    pub(crate) fn collect(&mut self) -> Result<(), Error> {
        while let Some(done) = self.take_cq()? {
            self.cq.pending.push_back(done);
        }
        self.announce_cq()
    }
}
