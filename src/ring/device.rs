//! [`DeviceQueue`]: the device's side of a queue pair, for the loopback device's engine thread
//! and for tests that play the device. It touches ring memory through volatile and atomic
//! accesses (and the plain loads of [`DeviceQueue::pop_burst`], which the fences below make
//! race-free), and registers only through `mmio`, as hardware would.
//!
//! # Orderings (device side; the host side is in `queue.rs`)
//!
//! | device does | then | pairs with (host) |
//! |---|---|---|
//! | reads the SQ tail doorbell | `fence(Acquire)`, reads entries | entries written, `fence(Release)`, doorbell |
//! | reads entries | `fence(Release)`, writes the SQ head back | head read, `fence(Acquire)`, slots reused |
//! | wrote the SQ head back | `fence(Release)`, writes a completion's phase word | phase read, `fence(Acquire)`, head read (the slot is free) |
//! | reads the CQ head doorbell | `fence(Acquire)`, overwrites consumed slots | entries read, `fence(Release)`, doorbell |
//! | writes a CQ entry but its phase word | `fence(Release)`, writes the phase word | phase read, `fence(Acquire)`, entry read |
//! | wrote completions | `fence(SeqCst)`, reads the interrupt flag | flag set, `fence(SeqCst)`, phase read |

use std::marker::PhantomData;
use std::mem::size_of;

use super::entries::Entries;
use super::index;
use super::{Completion, DoorbellValue, Doorbells, Error, Layout, Memory, Submission};
use crate::irq::EventFd;
use crate::sync::{fence, Ordering};

/// The cache line [`DeviceQueue::complete_held`] fills before it writes.
const LINE: usize = 64;

/// The most completions [`DeviceQueue::complete_held`] holds at once (three 16-byte entries
/// and the fourth that ends their line; 8-byte entries are written half a line at a time).
const HELD_MAX: usize = 4;

/// The device side of one queue pair: reads the submissions the host announced, writes
/// completions with the phase bit, writes the SQ head back, and raises the interrupt when the
/// host asked for it.
#[derive(Debug)]
pub struct DeviceQueue<D: Submission, C: Completion> {
    id: u16,
    layout: Layout,
    memory: Memory,
    /// The SQ's entries in `memory`.
    sq: Entries<D>,
    doorbells: Doorbells,
    /// What the host's doorbell writes carry.
    doorbell: DoorbellValue,
    interrupt: Option<EventFd>,
    /// Counter of the next SQ entry to read.
    sq_head: u32,
    /// The SQ tail the host last announced.
    sq_tail: u32,
    /// The SQ head last written back.
    sq_released: u32,
    /// Counter of the next CQ entry to write.
    cq_tail: u32,
    /// The CQ head the host last announced.
    cq_head: u32,
    /// Completions held back to be written with the rest of their CQ cache line
    /// ([`DeviceQueue::complete_held`]): the first `held_len`, written from `cq_tail` on.
    /// In the struct, not on the heap: no cache line more per completion.
    held: [C; HELD_MAX],
    /// How many are held (below `hold_limit`).
    held_len: usize,
    /// Entries written at once at most: a cache line's worth, at most `HELD_MAX`.
    hold_limit: usize,
    _entries: PhantomData<(D, C)>,
}

impl<D: Submission, C: Completion> DeviceQueue<D, C> {
    /// The device's view of queue `id` of `depth` entries in `memory` (as the host laid it out,
    /// per [`Layout::new`]), reading `doorbells`, signalling `interrupt`. Make it after the host
    /// made its [`Queue`](super::Queue), which zeroes the ring.
    pub fn new(
        id: u16,
        depth: u32,
        memory: Memory,
        doorbells: Doorbells,
        interrupt: Option<EventFd>,
    ) -> Result<Self, Error> {
        let layout = Layout::new::<D, C>(depth)?;
        layout.check_memory(&memory)?;
        Ok(DeviceQueue {
            id,
            sq: Entries::new(&memory, layout.sq_offset(), depth),
            layout,
            memory,
            doorbells,
            doorbell: DoorbellValue::Counter,
            interrupt,
            sq_head: 0,
            sq_tail: 0,
            sq_released: 0,
            cq_tail: 0,
            cq_head: 0,
            held: [C::new_zeroed(); HELD_MAX],
            held_len: 0,
            hold_limit: (LINE / size_of::<C>()).min(HELD_MAX),
            _entries: PhantomData,
        })
    }

    /// Reads the doorbells as carrying `doorbell` (what the host's queue was configured with,
    /// [`Config::with_doorbell`](super::Config::with_doorbell)). With
    /// [`DoorbellValue::Slot`] the device keeps at most `depth - 1` entries in the CQ, so a
    /// CQ head slot is never ambiguous.
    pub fn with_doorbell(mut self, doorbell: DoorbellValue) -> Self {
        self.doorbell = doorbell;
        self
    }

    /// The queue id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Reads the SQ tail doorbell and returns how many announced entries are unread. A tail
    /// that moved backwards or more than the depth ahead is the host's error.
    #[inline]
    pub fn fetch(&mut self) -> Result<u32, Error> {
        let depth = self.layout.depth();
        let value = self.doorbells.read_sq_tail(self.id)?;
        // Acquire: the entries the host wrote before ringing are read after this (pairs with
        // the fence(Release) in `Doorbells::ring_sq`).
        fence(Ordering::Acquire);
        self.memory.tsan_acquire(self.layout.sq_entry(0));
        // The host keeps `reserve` slots empty: with slot values, at most `depth - 1` entries.
        let limit = self
            .sq_released
            .wrapping_add(depth - self.doorbell.reserve());
        let tail = self.decode(value, self.sq_tail);
        if !tail.is_some_and(|tail| index::advance_ok(self.sq_tail, tail, limit)) {
            return Err(Error::HostSqTail {
                queue: self.id,
                tail: value,
                old: self.sq_tail,
                head: self.sq_released,
            });
        }
        if let Some(tail) = tail {
            self.sq_tail = tail;
        }
        Ok(self.available())
    }

    /// The counter a doorbell `value` stands for, given the last counter `old` read from it:
    /// the value itself, or for a slot (`None` if not one) the first counter at or after `old`
    /// with that slot.
    #[inline]
    fn decode(&self, value: u32, old: u32) -> Option<u32> {
        let depth = self.layout.depth();
        match self.doorbell {
            DoorbellValue::Counter => Some(value),
            DoorbellValue::Slot if value < depth => Some(index::counter_of_slot(old, value, depth)),
            DoorbellValue::Slot => None,
        }
    }

    /// Announced entries not read yet (as of the last [`DeviceQueue::fetch`]).
    #[inline]
    pub fn available(&self) -> u32 {
        index::used(self.sq_tail, self.sq_head)
    }

    /// The announced entry `n` places after the next one [`DeviceQueue::pop`] would return
    /// (copied out, not consumed), if there is one (as of the last [`DeviceQueue::fetch`]):
    /// for a device model that decides about an entry before it takes it, or looks ahead.
    #[inline]
    pub fn peek(&self, n: u32) -> Option<D> {
        if n >= self.available() {
            return None;
        }
        Some(self.sq.read_once(self.sq_head.wrapping_add(n)))
    }

    /// The next announced entry (copied out), if any. Its slot stays the device's until
    /// [`DeviceQueue::release`].
    #[inline]
    pub fn pop(&mut self) -> Option<D> {
        if self.sq_head == self.sq_tail {
            return None;
        }
        let entry = self.sq.read_once(self.sq_head);
        self.sq_head = self.sq_head.wrapping_add(1);
        if self.sq_head != self.sq_tail {
            self.sq.prefetch_new_lines(self.sq_head);
        }
        Some(entry)
    }

    /// Reads up to `max` announced entries (as of the last [`DeviceQueue::fetch`]) in order,
    /// handing each (copied out) to `f`, and returns how many: the burst form of
    /// [`DeviceQueue::pop`], with the range checked once, when the queue was made, instead of
    /// per entry. Their slots stay the device's until [`DeviceQueue::release`].
    ///
    /// The run is read with plain loads, which the compiler may widen and vectorise with what
    /// `f` does; `pop` reads each entry with volatile loads, exactly once. A device model that
    /// checks an entry before acting on it and must not trust the host to leave announced
    /// entries alone (a host in another process, say) uses `pop`, as the loopback engine does:
    /// an entry loaded twice could differ between the check and the use.
    #[inline]
    pub fn pop_burst(&mut self, max: u32, f: impl FnMut(D)) -> u32 {
        let count = self.available().min(max);
        if count == 0 {
            return 0;
        }
        self.sq.read_from(self.sq_head, count, f);
        self.sq_head = self.sq_head.wrapping_add(count);
        count
    }

    /// Writes the SQ head back: the host may reuse the slots of every entry popped so far.
    #[inline]
    pub fn release(&mut self) {
        if self.sq_released == self.sq_head {
            return;
        }
        // Release: the reads of those entries happen before the host can see their slots free
        // and overwrite them (pairs with the fence(Acquire) in `Queue::refresh_sq_head`).
        fence(Ordering::Release);
        self.memory
            .store_u32(self.layout.sq_head_offset(), self.sq_head);
        self.sq_released = self.sq_head;
    }

    /// Free CQ slots (less the completions held back, [`DeviceQueue::complete_held`]),
    /// re-reading the CQ head doorbell only when the cached head says none.
    #[inline]
    pub fn cq_room(&mut self) -> Result<u32, Error> {
        // Fewer than a line's worth are held.
        let held = self.held_len as u32;
        Ok(self.free_slots(held)?.saturating_sub(held))
    }

    /// CQ slots free past the written tail, re-reading the CQ head doorbell only when the
    /// cached head says at most `needed`.
    #[inline]
    fn free_slots(&mut self, needed: u32) -> Result<u32, Error> {
        // With slot values the CQ holds at most `depth - 1` entries, so a head slot is never
        // ambiguous (the host cannot consume `depth` entries between two announcements).
        let usable = self.layout.depth() - self.doorbell.reserve();
        let room = index::free(self.cq_tail, self.cq_head, usable);
        if room > needed {
            return Ok(room);
        }
        let value = self.doorbells.read_cq_head(self.id)?;
        // Acquire: the host's reads of the entries it consumed happen before they are
        // overwritten (pairs with the fence(Release) in `Doorbells::ring_cq`).
        fence(Ordering::Acquire);
        self.memory.tsan_acquire(self.layout.cq_entry(0));
        let head = self.decode(value, self.cq_head);
        let Some(head) = head.filter(|&head| index::advance_ok(self.cq_head, head, self.cq_tail))
        else {
            return Err(Error::HostCqHead {
                queue: self.id,
                head: value,
                old: self.cq_head,
                tail: self.cq_tail,
            });
        };
        self.cq_head = head;
        Ok(index::free(self.cq_tail, self.cq_head, usable))
    }

    /// Writes `entry` as the next completion, with the phase bit of its pass over the ring: all
    /// of it but the phase word, a `fence(Release)`, then the phase word, so a host that sees
    /// the new phase sees the whole entry. `Error::CqFull` if the host has not consumed room.
    ///
    /// The SQ head is written back first ([`DeviceQueue::release`]) when entries were popped
    /// since the last write-back: a host that holds a completion finds the slot of the command
    /// it completes, and of every entry popped before it, free (as NVMe carries the SQ head in
    /// each completion). Without that a host that took every completion of a full ring could
    /// still find it full until the device's next write-back.
    ///
    /// Completions held back ([`DeviceQueue::complete_held`]) are written first, in order.
    #[inline]
    pub fn complete(&mut self, entry: C) -> Result<(), Error> {
        self.flush_held()?;
        if self.free_slots(0)? == 0 {
            return Err(self.cq_full());
        }
        self.write(entry);
        Ok(())
    }

    /// The error of a full CQ.
    fn cq_full(&self) -> Error {
        Error::CqFull {
            queue: self.id,
            depth: self.layout.depth(),
        }
    }

    /// Writes `entry` as the next completion (the caller checked the room, and nothing is
    /// held): the SQ head written back, the entry but its phase word, a `fence(Release)`, the
    /// phase word.
    #[inline]
    fn write(&mut self, entry: C) {
        // Ordered before the phase store below by its fence(Release): the host that reads the
        // phase (then fence(Acquire)) and then the write-back word sees this head or a later one.
        self.release();
        let offset = self.layout.cq_entry(self.cq_tail);
        let phase_at = self.layout.phase_word();
        let word = self
            .layout
            .with_phase(Memory::word_of(&entry, phase_at), self.cq_tail);
        self.memory.write_entry(offset, &entry, Some(phase_at));
        // Release: the rest of the entry is visible before the phase flip that publishes it
        // (pairs with the fence(Acquire) in `Queue::take_cq`).
        fence(Ordering::Release);
        self.memory.store_u32(offset + phase_at, word);
        self.cq_tail = self.cq_tail.wrapping_add(1);
    }

    /// Completes `entry` as [`DeviceQueue::complete`] does, or, when `more` says the device has
    /// further work at hand (its next descriptors are read and runnable), holds it back to be
    /// written with the next completions of its CQ cache line. Returns how many completions it
    /// wrote (0: held; then [`DeviceQueue::flush_held`] must follow before the device stops
    /// working on this queue, e.g. at the end of a burst).
    ///
    /// A host that polls the CQ reads the line the device writes next: one completion at a
    /// time, each write finds the line in the host's cache and waits for it to come back (a
    /// cross-core round trip). A line at a time, that is once per line; it pays where those
    /// round trips are slow and descriptors short (the loopback's 4 KiB copies on the
    /// development VM's slow cross-core state: 0.21 -> 0.31 of memcpy; unchanged in its fast
    /// state and at 64 KiB, `docs/memory-and-rings.md`). The price is latency: a completion is
    /// seen when its line is written, after the descriptors that follow it on the line (at
    /// most three for [`Status`](super::Status)), so a device holds completions only while it
    /// keeps running, never across a wait.
    ///
    /// # Errors
    /// As [`DeviceQueue::complete`]; nothing is held or written then.
    #[inline]
    pub fn complete_held(&mut self, entry: C, more: bool) -> Result<usize, Error> {
        if self.cq_room()? == 0 {
            return Err(self.cq_full());
        }
        let held = self.held_len;
        let at = self.layout.cq_entry(self.cq_tail.wrapping_add(held as u32));
        let ends_line = (at + size_of::<C>()) % LINE == 0;
        let write_now = held + 1 >= self.hold_limit || ends_line || !more;
        if write_now && held == 0 {
            // Nothing held: as `complete`, without its second room check.
            self.write(entry);
            return Ok(1);
        }
        self.held[held] = entry;
        self.held_len = held + 1;
        if write_now {
            self.flush_held()
        } else {
            Ok(0)
        }
    }

    /// Writes the completions [`DeviceQueue::complete_held`] held back, in order (the entries
    /// but their phase words, one `fence(Release)`, then the phase words), and returns how
    /// many.
    ///
    /// # Errors
    /// `Error::CqFull` and the CQ head errors of [`DeviceQueue::complete`] (the held entries
    /// had room when they were held, so only a host that moved its CQ head impossibly causes
    /// one); the held entries are dropped then.
    pub fn flush_held(&mut self) -> Result<usize, Error> {
        let count = self.held_len;
        if count == 0 {
            return Ok(0);
        }
        // `count` is at most a line's worth of entries.
        if self.free_slots(count as u32 - 1)? < count as u32 {
            self.held_len = 0;
            return Err(self.cq_full());
        }
        // As in `complete`: the SQ head write-back before any phase store.
        self.release();
        let phase_at = self.layout.phase_word();
        for (k, entry) in self.held[..count].iter().enumerate() {
            let offset = self.layout.cq_entry(self.cq_tail.wrapping_add(k as u32));
            self.memory.write_entry(offset, entry, Some(phase_at));
        }
        // Release: every entry's other words are visible before any phase flip that publishes
        // one (pairs with the fence(Acquire) in `Queue::take_cq`).
        fence(Ordering::Release);
        for entry in &self.held[..count] {
            let offset = self.layout.cq_entry(self.cq_tail);
            let word = self
                .layout
                .with_phase(Memory::word_of(entry, phase_at), self.cq_tail);
            self.memory.store_u32(offset + phase_at, word);
            self.cq_tail = self.cq_tail.wrapping_add(1);
        }
        self.held_len = 0;
        Ok(count)
    }

    /// Whether the host asked for an interrupt, after the completions written so far: if so,
    /// signals the eventfd (when there is one) and returns `true`. Call once per batch of
    /// completions.
    #[inline]
    pub fn interrupt(&mut self) -> Result<bool, Error> {
        // SeqCst: the store-load barrier of the wake-up protocol: the phase stores above are
        // ordered before the flag load below (pairs with the fence(SeqCst) in
        // `Queue::arm_interrupt`).
        fence(Ordering::SeqCst);
        if self.memory.load_u32(self.layout.interrupt_offset()) == 0 {
            return Ok(false);
        }
        if let Some(irq) = &self.interrupt {
            irq.signal().map_err(|source| Error::Interrupt {
                queue: self.id,
                source,
            })?;
        }
        Ok(true)
    }
}
