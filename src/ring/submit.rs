//! The submission half of [`Queue`]: writing descriptors into the SQ (one, a burst, with or
//! without a payload), ringing the SQ tail doorbell, the queue's submission state ([`Sq`]) and
//! the host's SQ tail bookkeeping ([`SqTail`]). The orderings are listed with the rest of the
//! host side in `queue.rs`.

use super::entries::Entries;
use super::index;
use super::queue::{Queue, Rejected};
use super::{Completion, Error, Submission, POSTED};
use crate::sync::{fence, Ordering};

/// The submission state of a [`Queue`]: the SQ's entries, the tail bookkeeping, and the device's
/// head with the limit the host may write up to from it. What a submission reads and writes.
pub(super) struct Sq<D> {
    /// The SQ's entries in the queue's memory.
    pub(super) entries: Entries<D>,
    /// The SQ tail: announced, written since, and the doorbell count.
    pub(super) tail: SqTail,
    /// What the SQ tail doorbell carries of a counter: all of it, or its slot.
    pub(super) doorbell_mask: u32,
    /// The device's SQ head, as last read from the write-back (or reported by a completion).
    pub(super) head: u32,
    /// The SQ counter the host may write up to (see `index::sq_limit`), from that head.
    pub(super) limit: u32,
    /// SQ slots always kept empty (1 when a slot value cannot tell full from empty).
    pub(super) reserve: u32,
    /// The SQ head comes from completions ([`Completion::sq_head`]), not the write-back word.
    pub(super) head_from_cq: bool,
}

/// The host's SQ tail, packed so that posting a descriptor and ringing for it in one call
/// ([`Queue::post_and_flush`]) costs the queue's own memory one store: one word holds the
/// counter of the next entry to write, the entries written since the last doorbell and the
/// doorbells rung (modulo 2^16; the high parts of the 64-bit totals move once every 2^16
/// doorbells or 2^32 entries and live apart). That call is then three stores (entry, doorbell,
/// this word), as many as an SPSC queue's push makes (rtrb: the slot, the shared tail and the
/// producer's own copy of it): every store more waits behind the doorbell's cache-line
/// transfer when a busy device polls it, and on this path stores are what the time is made of.
///
/// The fields are placed so that what a producer loop carries from one call to the next is
/// short: the word is stored at the end of a call and loaded at the start of the next, and
/// the compiler cannot keep it in a register across the entry and doorbell stores (raw
/// pointers it cannot tell apart from the queue), so the time between that load and that
/// store bounds the rate of a tight loop. Posting one entry and ringing for it is one add and
/// one mask (the tail counter moves in the top bits, a doorbell's carry out of its count lands
/// in the unflushed bits, which the mask clears); the fields read elsewhere (the tail counter
/// for the entry's slot and the doorbell value) branch off that path.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SqTail {
    /// Bits 32..64: the counter of the next entry to write; bits 16..32: entries written
    /// since the last doorbell (at most the depth, 2^15); bits 0..16: doorbells rung, modulo
    /// 2^16.
    word: u64,
    /// Times the tail counter wrapped past 2^32 (forwards, less backwards).
    tail_wraps: u64,
    /// Times the doorbell count wrapped past 2^16.
    doorbell_wraps: u64,
    /// Entries written but handed back unannounced (see `Queue::take_unannounced`).
    discarded: u64,
}

impl SqTail {
    /// One entry written and not announced yet, in `word`.
    const ENTRY: u64 = (1 << 32) | (1 << 16);
    /// One entry written, in `word`'s tail counter.
    const TAIL: u64 = 1 << 32;
    /// `word`'s unflushed count.
    const UNFLUSHED: u64 = 0xffff << 16;

    /// The SQ tail counter last announced.
    #[inline]
    pub(super) fn announced(&self) -> u32 {
        self.next().wrapping_sub(self.unflushed())
    }

    /// Entries written since the last doorbell.
    #[inline]
    pub(super) fn unflushed(&self) -> u32 {
        u32::from((self.word >> 16) as u16)
    }

    /// The counter of the next entry to write.
    #[inline]
    pub(super) fn next(&self) -> u32 {
        (self.word >> 32) as u32
    }

    /// Counts `count` more entries written. The queue never has more than its depth (at most
    /// 2^15) written past the device's head, so the unflushed count cannot spill into the
    /// tail counter.
    #[inline]
    pub(super) fn wrote(&mut self, count: u32) {
        debug_assert!(self.unflushed() + count <= 1 << 15);
        let (word, wrapped) = self.word.overflowing_add(u64::from(count) * Self::ENTRY);
        // A branch, not an add of the carry: the count is stored only when it moves, once
        // every 2^32 entries, not on every post.
        if wrapped {
            self.tail_wraps += 1;
        }
        self.word = word;
    }

    /// Takes back the newest unannounced entry (one must be there).
    pub(super) fn unwrite(&mut self) {
        debug_assert!(self.unflushed() > 0);
        let (word, wrapped) = self.word.overflowing_sub(Self::ENTRY);
        if wrapped {
            self.tail_wraps -= 1;
        }
        self.word = word;
        self.discarded += 1;
    }

    /// Records a doorbell that announced every entry written.
    #[inline]
    pub(super) fn rang(&mut self) {
        self.wrote_and_rang(0);
    }

    /// Records `count` more entries written and a doorbell that announced them with every
    /// entry written before: [`SqTail::wrote`] then [`SqTail::rang`], in one add and one mask,
    /// stored once.
    #[inline]
    pub(super) fn wrote_and_rang(&mut self, count: u32) {
        debug_assert!(self.unflushed() + count <= 1 << 15);
        // The tail counter moves by `count` (a carry out of bit 63 is its wrap) and the
        // doorbell count by one; a carry out of the doorbell count goes into the unflushed
        // bits (at most 2^15 + 1 there: nothing reaches the tail counter), which are cleared.
        let (word, wrapped) = self.word.overflowing_add(u64::from(count) * Self::TAIL + 1);
        if wrapped {
            self.tail_wraps += 1;
        }
        if word as u16 == 0 {
            self.doorbell_wraps += 1;
        }
        self.word = word & !Self::UNFLUSHED;
    }

    /// Tests: as if the tail counter had been announced up to `tail` by `doorbells` doorbells
    /// (counters started near their wrap).
    #[cfg(test)]
    pub(super) fn at(tail: u32, doorbells: u16) -> SqTail {
        SqTail {
            word: (u64::from(tail) << 32) | u64::from(doorbells),
            ..SqTail::default()
        }
    }

    /// Doorbells rung.
    pub(super) fn doorbells(&self) -> u64 {
        (self.doorbell_wraps << 16) | (self.word & 0xffff)
    }

    /// SQ entries written, taken back or not (the tail counter starts at 0).
    pub(super) fn entries(&self) -> u64 {
        ((self.tail_wraps << 32) | u64::from(self.next())) + self.discarded
    }
}

impl<D: Submission, C: Completion, T: Send> Queue<D, C, T> {
    /// Entries written since the last doorbell (waiting for [`Queue::flush`]).
    pub fn unflushed(&self) -> u32 {
        self.sq.tail.unflushed()
    }

    /// Free SQ slots, for a caller that wants `wanted` of them before it writes (a burst that
    /// should go to the device whole, under one doorbell). The count the queue keeps is
    /// returned when it is at least `wanted`; only below that is the device's head read again
    /// (a cache-line transfer), so a producer waiting for room spins here cheaply. Posted
    /// descriptors need only SQ slots; commands also need command ids ([`Queue::in_flight`]).
    #[inline]
    pub fn room(&mut self, wanted: u32) -> Result<u32, Error> {
        let room = index::room(self.sq.tail.next(), self.sq.limit, self.layout.depth());
        if room >= wanted {
            return Ok(room);
        }
        self.sq_room_refreshed()
    }

    /// Reads the device's SQ head write-back (or, when completions carry the SQ head, takes
    /// the head the last one reported) and recomputes how far the host may write.
    pub(super) fn refresh_sq_head(&mut self) -> Result<(), Error> {
        if self.faulted {
            // The limit stays pinned at the tail: nothing more is submitted.
            return Err(Error::Faulted { queue: self.id });
        }
        if self.sq.head_from_cq {
            let layout = &self.layout;
            self.sq.limit = index::sq_limit(
                self.sq.head,
                self.sq.tail.next(),
                layout.depth(),
                layout.sq_per_line(),
                self.sq.reserve,
            );
            return Ok(());
        }
        let head = self.memory.load_u32(self.layout.sq_head_offset());
        // Acquire: the device's reads of the entries before `head` happen before the host
        // overwrites those slots (pairs with the fence(Release) in `DeviceQueue::release`).
        fence(Ordering::Acquire);
        let announced = self.sq.tail.announced();
        if !index::advance_ok(self.sq.head, head, announced) {
            return Err(Error::DeviceSqHead {
                queue: self.id,
                head,
                old: self.sq.head,
                tail: announced,
            });
        }
        self.sq.head = head;
        let layout = &self.layout;
        self.sq.limit = index::sq_limit(
            head,
            self.sq.tail.next(),
            layout.depth(),
            layout.sq_per_line(),
            self.sq.reserve,
        );
        Ok(())
    }

    /// Free SQ slots, re-reading the device's head only when the cached one says none.
    #[inline]
    pub(super) fn sq_room(&mut self) -> Result<u32, Error> {
        let room = index::room(self.sq.tail.next(), self.sq.limit, self.layout.depth());
        if room > 0 {
            return Ok(room);
        }
        self.sq_room_refreshed()
    }

    /// [`Queue::sq_room`] after reading the write-back: the uncommon path.
    #[cold]
    #[inline(never)]
    fn sq_room_refreshed(&mut self) -> Result<u32, Error> {
        self.refresh_sq_head()?;
        Ok(index::room(
            self.sq.tail.next(),
            self.sq.limit,
            self.layout.depth(),
        ))
    }

    /// Why a submission cannot be queued, given the room found (an error, no SQ slot, or, for
    /// a command that needs one, no free command id); counted in the stats.
    #[cold]
    #[inline(never)]
    fn refusal(&mut self, room: Result<u32, Error>, id: bool) -> Error {
        match room {
            Err(error) => error,
            Ok(0) => {
                self.stats.full += 1;
                Error::Full {
                    queue: self.id,
                    depth: self.depth(),
                }
            }
            Ok(_) => {
                debug_assert!(id);
                self.stats.full += 1;
                Error::NoCommandId {
                    queue: self.id,
                    in_flight: self.in_flight(),
                }
            }
        }
    }

    /// Whether there is an SQ slot to write, from the kept limit: the hot path's check, in
    /// registers. When there is none, [`Queue::slot_or_refusal`] (out of line) reads the
    /// device's head again.
    #[inline]
    fn has_slot(&self) -> bool {
        index::room(self.sq.tail.next(), self.sq.limit, self.layout.depth()) > 0
    }

    /// The uncommon path of a single-entry submission with no slot by the kept limit: reads the
    /// device's head again, and refuses (counted) if there is still no slot, or, for a command
    /// (`id`), no free command id.
    #[cold]
    #[inline(never)]
    fn slot_or_refusal(&mut self, id: bool) -> Result<(), Error> {
        let room = self.sq_room_refreshed();
        if matches!(room, Ok(1..)) {
            return Ok(());
        }
        Err(self.refusal(room, id))
    }

    /// Writes `desc` into the next SQ slot (the caller checked there is one).
    #[inline]
    fn write_sq(&mut self, desc: D) {
        self.sq.entries.write(self.sq.tail.next(), desc);
        self.sq.tail.wrote(1);
    }

    /// Queues a command without ringing the doorbell: moves `payload` into the in-flight table,
    /// writes its id into `desc` and `desc` into the SQ. Returns the command id. Nothing is
    /// queued on error, and both are handed back.
    #[inline]
    pub fn push(&mut self, mut desc: D, payload: T) -> Result<u16, Rejected<D, T>> {
        let id = self.take_command(&mut desc, payload)?;
        self.write_sq(desc);
        Ok(id)
    }

    /// The first half of [`Queue::push`]: checks there is an SQ slot and a command id, moves
    /// `payload` into the in-flight table under that id and writes the id into `desc`, which the
    /// caller then writes into the SQ. Nothing is taken on error, and both are handed back.
    #[inline]
    fn take_command(&mut self, desc: &mut D, payload: T) -> Result<u16, Rejected<D, T>> {
        let room = self.sq_room();
        let id = match (&room, self.payloads.free_ids.back()) {
            (Ok(1..), Some(&id)) => id,
            _ => {
                let error = self.refusal(room, true);
                return Err(Rejected {
                    error,
                    descriptor: *desc,
                    payload,
                });
            }
        };
        self.payloads.free_ids.pop_back();
        desc.set_command_id(id);
        self.payloads.slots[usize::from(id)] = Some(payload);
        if self.payloads.in_order {
            // The caller writes it at the tail next.
            self.payloads.order.push_back((id, self.sq.tail.next()));
        }
        self.stats.submitted += 1;
        Ok(id)
    }

    /// Queues a descriptor that gets no completion (command id [`POSTED`]), without ringing
    /// the doorbell: a command that names no host memory (a fence, a context switch, a doorbell
    /// to another engine). Its SQ slot is free again once the device has read it.
    ///
    /// # Safety
    /// Any host memory the descriptor names must stay valid and unreferenced until the caller
    /// knows, by other means, that the device is done with it: no completion will say so, and
    /// the queue holds nothing for it.
    #[inline]
    pub unsafe fn post(&mut self, mut desc: D) -> Result<(), Rejected<D, ()>> {
        if !self.has_slot() {
            if let Err(error) = self.slot_or_refusal(false) {
                return Err(Rejected {
                    error,
                    descriptor: desc,
                    payload: (),
                });
            }
        }
        desc.set_command_id(POSTED);
        self.write_sq(desc);
        Ok(())
    }

    /// Queues as many commands from `items` as there are SQ slots and command ids for, without
    /// ringing the doorbell (one [`Queue::flush`] for the burst): the burst form of
    /// [`Queue::push`], with the queue's state held in registers across the burst. Takes an
    /// item from `items` only when it can queue it, so what is left stays in the iterator.
    /// Returns how many were queued (0 when the ring or the ids are exhausted).
    #[inline]
    pub fn push_burst<I: Iterator<Item = (D, T)>>(&mut self, items: &mut I) -> Result<u32, Error> {
        let room = self.sq_room()?;
        let ids = u32::try_from(self.payloads.free_ids.len()).unwrap_or(u32::MAX);
        let max = room.min(ids);
        if max == 0 {
            let error = self.refusal(Ok(room), true);
            if matches!(error, Error::Full { .. } | Error::NoCommandId { .. }) {
                return Ok(0);
            }
            return Err(error);
        }
        let tail = self.sq.tail.next();
        let payloads = &mut self.payloads;
        let mut at = tail;
        let count = self.sq.entries.write_from(tail, max, || {
            // `max <= free_ids.len()`: an id is there; the item is taken only then.
            let id = *payloads.free_ids.back()?;
            let (mut desc, payload) = items.next()?;
            payloads.free_ids.pop_back();
            desc.set_command_id(id);
            payloads.slots[usize::from(id)] = Some(payload);
            if payloads.in_order {
                payloads.order.push_back((id, at));
            }
            at = at.wrapping_add(1);
            Some(desc)
        });
        self.sq.tail.wrote(count);
        self.stats.submitted += u64::from(count);
        Ok(count)
    }

    /// Queues as many descriptors from `descs` as there are SQ slots for, as posted descriptors
    /// (see [`Queue::post`]), without ringing the doorbell: the burst form of `post`. Takes a
    /// descriptor from `descs` only when it can queue it, so what is left stays in the iterator.
    /// Returns how many were queued (0 when the ring is full). Descriptors made by the iterator
    /// (a `map` over the burst) go straight from registers into the ring.
    ///
    /// # Safety
    /// As for [`Queue::post`], for every descriptor queued.
    #[inline]
    pub unsafe fn post_burst<I: Iterator<Item = D>>(
        &mut self,
        descs: &mut I,
    ) -> Result<u32, Error> {
        let room = self.sq_room()?;
        if room == 0 {
            self.stats.full += 1;
            return Ok(0);
        }
        let tail = self.sq.tail.next();
        let count = self.sq.entries.write_from(tail, room, || {
            let mut desc = descs.next()?;
            desc.set_command_id(POSTED);
            Some(desc)
        });
        self.sq.tail.wrote(count);
        Ok(count)
    }

    /// Rings the SQ doorbell once for everything queued since the last flush (nothing if
    /// nothing was). If the write fails, the entries stay queued and the next flush retries.
    #[inline]
    pub fn flush(&mut self) -> Result<(), Error> {
        if self.sq.tail.unflushed() == 0 {
            return Ok(());
        }
        // The release of the doorbell's fence, for ThreadSanitizer (crate::sync::tsan_release).
        self.memory.tsan_release(self.layout.sq_entry(0));
        self.doorbells
            .ring_sq(self.id, self.sq.tail.next() & self.sq.doorbell_mask)?;
        self.sq.tail.rang();
        Ok(())
    }

    /// [`Queue::post`] then [`Queue::flush`], in one call: queues a descriptor that gets no
    /// completion and rings the doorbell for it and for anything queued before it. The queue's
    /// own bookkeeping is one store after the doorbell (where `post` and `flush` make one
    /// each), so a producer that announces every descriptor alone pays three stores for it:
    /// the entry, the doorbell and that one. Errors as [`Queue::submit`]'s: when the SQ is full
    /// ([`Error::Full`]) nothing was queued (the caller still has its copy of `desc`); when the
    /// doorbell write failed ([`Error::Doorbell`]) the descriptor stays queued, as after
    /// `post`, and the next flush announces it.
    ///
    /// # Safety
    /// As for [`Queue::post`].
    #[inline]
    pub unsafe fn post_and_flush(&mut self, mut desc: D) -> Result<(), Error> {
        if !self.has_slot() {
            self.slot_or_refusal(false)?;
        }
        desc.set_command_id(POSTED);
        self.write_and_ring(desc)
    }

    /// Writes `desc` into the next SQ slot (the caller checked there is one) and rings the
    /// doorbell for it and everything queued before it, with the queue's bookkeeping stored
    /// once, after the doorbell. If the doorbell write fails, the entry stays queued.
    #[inline]
    fn write_and_ring(&mut self, desc: D) -> Result<(), Error> {
        let tail = self.sq.tail.next();
        self.sq.entries.write(tail, desc);
        // As in `flush`.
        self.memory.tsan_release(self.layout.sq_entry(0));
        match self
            .doorbells
            .ring_sq(self.id, tail.wrapping_add(1) & self.sq.doorbell_mask)
        {
            Ok(()) => {
                self.sq.tail.wrote_and_rang(1);
                Ok(())
            }
            Err(error) => {
                self.sq.tail.wrote(1);
                Err(error)
            }
        }
    }

    /// [`Queue::push`] then [`Queue::flush`], in one call (with the bookkeeping of
    /// [`Queue::post_and_flush`]): one command, one doorbell for it and anything queued before.
    /// If the push fails the payload is dropped (use `push` to get it back); if the doorbell
    /// fails, the command stays queued (in flight) and the next flush announces it.
    #[inline]
    pub fn submit(&mut self, mut desc: D, payload: T) -> Result<u16, Error> {
        let id = self.take_command(&mut desc, payload)?;
        self.write_and_ring(desc)?;
        Ok(id)
    }
}
