//! [`Queue`]: the host side of one hardware queue pair — submitting descriptors with the buffers
//! they name, one doorbell per batch, and taking completions back with those buffers. This file
//! has the queue, its completions and its shutdown; the submitting methods are in `submit.rs`.
//!
//! # Ownership
//!
//! [`Queue::push`] moves the payload (the buffers the descriptor names) into the in-flight table
//! under a command id, which it writes into the descriptor; the device copies that id into the
//! completion, and reaping it hands the payload back in a [`Done`]. Until then the host cannot
//! read, reuse or drop it. A queue dropped with commands in flight first collects what the
//! device finished, then asks the device to stop ([`Quiesce`]) and, only if that fails or there
//! is no way to ask, leaks the payloads and the ring memory on purpose (counted in [`leaks`]):
//! freeing memory a device may still write is the one thing it never does.
//!
//! A queue for a device that completes in submission order ([`Config::with_in_order`]) trusts
//! a completion only if it names the oldest command in flight: anything else (a lost, doubled
//! or wrong-id completion) is an error, hands nothing out, and faults the queue — it takes no
//! more submissions and reads no more of the CQ, since no entry after a broken one can be
//! trusted. Recovery is the device's: reset or stop it, then [`Queue::shutdown`] hands every
//! payload back.
//!
//! # Orderings (host side; the device side is in `device.rs`)
//!
//! | host does | then | pairs with (device) |
//! |---|---|---|
//! | writes SQ entries | `fence(Release)`, SQ tail doorbell | doorbell read, `fence(Acquire)`, entries read |
//! | reads SQ head write-back | `fence(Acquire)`, reuses those slots | entries read, `fence(Release)`, head written |
//! | reads a CQ entry's phase word, sees it flipped | `fence(Acquire)`, reads the entry | entry written, `fence(Release)`, phase word written |
//! | reads consumed CQ entries | `fence(Release)`, CQ head doorbell | doorbell read, `fence(Acquire)`, slots overwritten |
//! | sets the interrupt flag | `fence(SeqCst)`, reads the CQ phase | phase written, `fence(SeqCst)`, flag read |
//!
//! The last row is a store-load (Dekker) pair: with a SeqCst fence on each side, at least one
//! side sees the other's store, so either the host sees the completion before it sleeps or the
//! device sees the flag and raises the interrupt. No wake-up is lost.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};
use std::time::Duration;

use super::entries::Entries;
use super::index;
use super::submit::{Sq, SqTail};
use super::{Completion, DoorbellValue, Doorbells, Error, Layout, Memory, Submission};
use crate::irq::EventFd;
use crate::sync::{fence, Ordering};

/// How a queue is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    depth: u32,
    id: u16,
    context: u32,
    spin: Duration,
    doorbell: DoorbellValue,
    part_align: usize,
    in_order: bool,
}

impl Config {
    /// A queue pair of `depth` entries (a power of two, 2 to 32768), id 0, context 0, waits
    /// that spin up to 20 µs before sleeping on the interrupt, counter doorbells
    /// ([`DoorbellValue::Counter`]) and the layout of [`Layout::new`].
    pub fn new(depth: u32) -> Config {
        Config {
            depth,
            id: 0,
            context: 0,
            spin: Duration::from_micros(20),
            doorbell: DoorbellValue::Counter,
            part_align: 128,
            in_order: false,
        }
    }

    /// For a device that completes the queue's commands in the order they were submitted (the
    /// loopback device's queues, which [`device::open_queue`](crate::device::open_queue)
    /// opens with it on): every completion must then name the oldest command in flight. A
    /// completion that names another id — a later command's (the oldest's completion was
    /// lost), one completed already (a duplicate) or any other — is an error naming the queue,
    /// the id expected and the id received ([`Error::LostCompletion`],
    /// [`Error::DuplicateCompletion`], [`Error::WrongCommand`]), no payload is handed out for
    /// it, and the queue is faulted ([`Error::Faulted`]) until it is shut down. Command ids are
    /// then reused oldest-freed first, so an id is handed out again only after every other
    /// free one: a duplicate completion can never name the oldest command in flight.
    /// [`Queue::explain`] turns a wait's timeout into the oldest command's id and whether the
    /// device read it. Off (the default), completions may come in any order (NVMe) and an id
    /// not in flight is [`Error::UnknownCommand`].
    pub fn with_in_order(mut self, in_order: bool) -> Config {
        self.in_order = in_order;
        self
    }

    /// Whether completions must come in submission order ([`Config::with_in_order`]).
    pub fn in_order(&self) -> bool {
        self.in_order
    }

    /// What the SQ tail and CQ head doorbell writes carry: the free-running counter
    /// ([`DoorbellValue::Counter`], the default) or the counter modulo the depth
    /// ([`DoorbellValue::Slot`], NVMe; the SQ then holds at most `depth - 1` entries).
    pub fn with_doorbell(mut self, doorbell: DoorbellValue) -> Config {
        self.doorbell = doorbell;
        self
    }

    /// Lays the ring memory out per [`Layout::with_align`] with `part_align` (e.g. 4096 for
    /// NVMe, whose SQ and CQ bases must be page aligned) instead of [`Layout::new`].
    pub fn with_part_align(mut self, part_align: usize) -> Config {
        self.part_align = part_align;
        self
    }

    /// The queue's id on its device (which doorbells and vector it uses).
    pub fn with_id(mut self, id: u16) -> Config {
        self.id = id;
        self
    }

    /// The device context the queue's work runs in (an address space, a process, a model).
    pub fn with_context(mut self, context: u32) -> Config {
        self.context = context;
        self
    }

    /// The longest a wait spins before sleeping on the interrupt (it adapts below that).
    pub fn with_spin(mut self, spin: Duration) -> Config {
        self.spin = spin;
        self
    }

    /// Entries per ring.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The queue id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The context id.
    pub fn context(&self) -> u32 {
        self.context
    }

    /// The longest spin before sleeping.
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// What the doorbells carry.
    pub fn doorbell(&self) -> DoorbellValue {
        self.doorbell
    }

    /// The alignment asked of the SQ's and the CQ's start (see [`Config::with_part_align`]).
    pub fn part_align(&self) -> usize {
        self.part_align
    }

    /// The layout a queue made with this configuration uses, for entry types `D` and `C`: how
    /// much ring memory to allocate, and where the SQ and the CQ are in it.
    pub fn layout<D: Submission, C: Completion>(&self) -> Result<Layout, Error> {
        Layout::with_align::<D, C>(self.depth, self.part_align)
    }
}

/// A finished command: its id, the completion entry the device wrote, and the payload given at
/// submission, handed back.
#[derive(Debug)]
pub struct Done<C, T> {
    /// The command id.
    pub id: u16,
    /// The completion entry.
    pub entry: C,
    /// The payload (buffers) that was in flight.
    pub payload: T,
}

/// A submission the queue did not take, with what was given, handed back.
pub struct Rejected<D, T> {
    /// Why.
    pub error: Error,
    /// The descriptor, unchanged.
    pub descriptor: D,
    /// The payload, unchanged.
    pub payload: T,
}

impl<D, T> fmt::Debug for Rejected<D, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<D, T> fmt::Display for Rejected<D, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "submission rejected: {}", self.error)
    }
}

impl<D, T> std::error::Error for Rejected<D, T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<D, T> From<Rejected<D, T>> for Error {
    /// The error alone (the descriptor and payload are dropped: nothing was queued).
    fn from(rejected: Rejected<D, T>) -> Error {
        rejected.error
    }
}

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

/// What a queue has done. Host-only counters (the queue is used by one thread).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Commands submitted (with a payload, expecting a completion).
    pub submitted: u64,
    /// Posted descriptors (no completion).
    pub posted: u64,
    /// Completions reaped.
    pub completed: u64,
    /// SQ tail doorbell writes.
    pub sq_doorbells: u64,
    /// CQ head doorbell writes.
    pub cq_doorbells: u64,
    /// Submissions refused because the SQ or the command ids were exhausted.
    pub full: u64,
    /// Waits that slept on the interrupt (the rest were satisfied while spinning).
    pub sleeps: u64,
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

/// The host side of one hardware queue pair (a submission ring, a completion ring, their
/// doorbells and an interrupt vector) with descriptors `D`, completions `C` and in-flight
/// payloads `T`. Used by one thread at a time (`&mut self`); `Send` to move between threads.
pub struct Queue<D: Submission, C: Completion, T: Send> {
    pub(super) id: u16,
    pub(super) context: u32,
    pub(super) layout: Layout,
    pub(super) memory: Memory,
    pub(super) doorbells: Doorbells,
    /// What the doorbell writes carry.
    pub(super) doorbell: DoorbellValue,
    pub(super) interrupt: Option<std::sync::Arc<EventFd>>,
    pub(super) quiesce: Option<Box<dyn Quiesce>>,
    /// Whether the device is still there ([`Queue::set_presence`]).
    pub(super) presence: Option<std::sync::Arc<dyn Presence>>,
    /// The submission state: the SQ, its tail and how far the host may write (`submit.rs`).
    pub(super) sq: Sq<D>,
    /// The completion state: the CQ head, completions set aside, and the waits for them.
    pub(super) cq: Cq<C, T>,
    /// The in-flight state: payloads by command id and the free ids.
    pub(super) payloads: InFlight<T>,
    pub(super) stats: Stats,
    /// `shutdown` has already settled everything; drop does nothing more.
    pub(super) closed: bool,
    /// A completion broke the in-order protocol: the queue takes and hands out nothing more
    /// (its SQ limit is pinned at the tail, so submissions reach the cold refusal path).
    pub(super) faulted: bool,
    pub(super) _entries: PhantomData<(D, C)>,
}

/// The completion state of a [`Queue`]: where the host is in the CQ, what it has announced, the
/// completions it reaped early, and how it waits for more (`wait.rs`).
pub(super) struct Cq<C, T> {
    /// Counter of the next CQ entry to read.
    pub(super) head: u32,
    /// The CQ head last written to the doorbell.
    pub(super) announced: u32,
    /// Completions reaped while waiting for room, handed out first.
    pub(super) pending: VecDeque<Done<C, T>>,
    /// The interrupt flag is set in ring memory.
    pub(super) armed: bool,
    /// The current spin budget of a wait, adapted between 0 and `max_spin`.
    pub(super) spin: Duration,
    /// The longest a wait spins ([`Config::spin`]).
    pub(super) max_spin: Duration,
    /// This queue's key with the interrupt reactor (futures).
    #[cfg(not(loom))]
    pub(super) reactor_key: u64,
}

/// The in-flight state of a [`Queue`]: the payload of every command submitted and not yet
/// reaped, under its command id, and the ids free for the next ones.
pub(super) struct InFlight<T> {
    /// In-flight payloads by command id.
    pub(super) slots: Box<[Option<T>]>,
    /// Free command ids, taken from the back: a stack (freed ids pushed at the back), or, on
    /// an in-order queue, a FIFO (freed ids pushed at the front), so an id comes back only
    /// after every other free one.
    pub(super) free_ids: VecDeque<u16>,
    /// In-order queue: the commands in flight in submission order (id, SQ counter).
    pub(super) order: VecDeque<(u16, u32)>,
    /// In-order queue: the id of the last completion handed out.
    pub(super) last_done: Option<u16>,
    /// Completions must come in submission order ([`Config::with_in_order`]).
    pub(super) in_order: bool,
}

impl<T> InFlight<T> {
    /// Frees `id` after its completion (see `free_ids`).
    #[inline]
    fn free(&mut self, id: u16) {
        if self.in_order {
            self.free_ids.push_front(id);
        } else {
            self.free_ids.push_back(id);
        }
    }
}

impl<D: Submission, C: Completion, T: Send> fmt::Debug for Queue<D, C, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("id", &self.id)
            .field("context", &self.context)
            .field("layout", &self.layout)
            .field("iova", &format_args!("{:#x}", self.memory.iova()))
            .field("sq_tail", &self.sq.tail.next())
            .field("sq_head", &self.sq.head)
            .field("cq_head", &self.cq.head)
            .field("in_flight", &self.in_flight())
            .field("stats", &self.stats)
            .field("in_order", &self.payloads.in_order)
            .field("faulted", &self.faulted)
            .finish_non_exhaustive()
    }
}

impl<D: Submission, C: Completion, T: Send> Queue<D, C, T> {
    /// A queue pair in `memory` (laid out per [`Config::layout`]: [`Layout::new`], or
    /// [`Layout::with_align`] after [`Config::with_part_align`]), ringing `doorbells`, woken by
    /// `interrupt` (`None`: waits busy-poll). Zeroes the ring memory, and with counter doorbells
    /// writes 0 to both doorbells: create the queue before the device starts serving it. With
    /// slot doorbells ([`DoorbellValue::Slot`]) nothing is written to them until there is
    /// something to announce (a device's doorbells start at 0 when it creates the queue).
    pub fn new(
        config: Config,
        memory: Memory,
        doorbells: Doorbells,
        interrupt: Option<EventFd>,
    ) -> Result<Self, Error> {
        let layout = config.layout::<D, C>()?;
        layout.check_memory(&memory)?;
        memory.zero(0, layout.size());
        let id = config.id;
        if config.doorbell == DoorbellValue::Counter {
            doorbells.ring_sq(id, 0)?;
            doorbells.ring_cq(id, 0)?;
        }
        // SAFETY: `C: Pod`, so the all-zero bytes are a valid `C`.
        let zeroed: C = unsafe { std::mem::zeroed() };
        let head_from_cq = zeroed.sq_head().is_some();
        let reserve = if head_from_cq {
            1
        } else {
            config.doorbell.reserve()
        };
        let depth = config.depth;
        let slots: Box<[Option<T>]> = (0..depth).map(|_| None).collect();
        // Ids are handed out lowest first; `depth <= 2^15`, so each fits in a u16.
        let free_ids: VecDeque<u16> = (0..depth).rev().map(|i| i as u16).collect();
        let order = if config.in_order {
            VecDeque::with_capacity(depth as usize)
        } else {
            VecDeque::new()
        };
        Ok(Queue {
            id,
            context: config.context,
            sq: Sq {
                entries: Entries::new(&memory, layout.sq_offset(), depth),
                tail: SqTail::default(),
                doorbell_mask: config.doorbell.encode(u32::MAX, depth),
                head: 0,
                limit: depth - reserve,
                reserve,
                head_from_cq,
            },
            layout,
            memory,
            doorbells,
            doorbell: config.doorbell,
            interrupt: interrupt.map(std::sync::Arc::new),
            quiesce: None,
            presence: None,
            cq: Cq {
                head: 0,
                announced: 0,
                pending: VecDeque::with_capacity(depth as usize),
                armed: false,
                spin: config.spin,
                max_spin: config.spin,
                #[cfg(not(loom))]
                reactor_key: crate::irq::reactor::next_key(),
            },
            payloads: InFlight {
                slots,
                free_ids,
                order,
                last_done: None,
                in_order: config.in_order,
            },
            stats: Stats::default(),
            closed: false,
            faulted: false,
            _entries: PhantomData,
        })
    }

    /// How to stop the device if the queue is dropped (or shut down) with work in flight.
    pub fn set_quiesce(&mut self, quiesce: impl Quiesce + 'static) {
        self.quiesce = Some(Box::new(quiesce));
    }

    /// Watches `presence`: once it says the device is gone, waits and polls that find no
    /// completion fail with [`Error::Removed`] instead of waiting for one that will never come,
    /// and [`Queue::shutdown`] stops at once, handing every in-flight payload back.
    pub fn set_presence(&mut self, presence: std::sync::Arc<dyn Presence>) {
        self.presence = Some(presence);
    }

    /// Whether the device behind the queue is gone ([`Queue::set_presence`]).
    #[inline]
    pub fn is_gone(&self) -> bool {
        self.presence.as_ref().is_some_and(|p| p.is_gone())
    }

    /// The error of a queue whose device is gone.
    pub(super) fn removed(&self) -> Error {
        Error::Removed {
            queue: self.id,
            in_flight: self.in_flight(),
        }
    }

    /// The queue id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The device context.
    pub fn context(&self) -> u32 {
        self.context
    }

    /// Entries per ring.
    pub fn depth(&self) -> u32 {
        self.layout.depth()
    }

    /// Where the parts are in ring memory.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The ring memory (its IOVA is what the device is given).
    pub fn memory(&self) -> &Memory {
        &self.memory
    }

    /// The doorbells.
    pub fn doorbells(&self) -> &Doorbells {
        &self.doorbells
    }

    /// The interrupt eventfd, if the queue has one (register it with an
    /// [`irq::Waiter`](crate::irq::Waiter) to wait on several queues).
    pub fn interrupt(&self) -> Option<&EventFd> {
        self.interrupt.as_deref()
    }

    /// Commands whose payloads the queue holds (submitted, not yet reaped).
    pub fn in_flight(&self) -> usize {
        self.payloads.slots.len() - self.payloads.free_ids.len()
    }

    /// What the queue has done.
    pub fn stats(&self) -> Stats {
        let mut stats = self.stats;
        stats.sq_doorbells = self.sq.tail.doorbells();
        // Every SQ entry written is a command or a posted descriptor.
        stats.posted = self.sq.tail.entries().saturating_sub(stats.submitted);
        stats
    }

    /// What the doorbells carry.
    pub fn doorbell(&self) -> DoorbellValue {
        self.doorbell
    }

    /// Whether the queue takes the SQ head from completions ([`Completion::sq_head`]) rather
    /// than from the write-back word in ring memory.
    pub fn sq_head_from_completions(&self) -> bool {
        self.sq.head_from_cq
    }

    /// Whether completions must come in submission order ([`Config::with_in_order`]).
    pub fn in_order(&self) -> bool {
        self.payloads.in_order
    }

    /// Whether the queue is faulted by a protocol error ([`Error::Faulted`]): it takes no
    /// more work; shut it down once the device is reset or stopped.
    pub fn is_faulted(&self) -> bool {
        self.faulted
    }

    /// The oldest command in flight, on an in-order queue ([`Config::with_in_order`]): the
    /// one the next completion must name. `None` otherwise, or with nothing in flight.
    pub fn oldest_in_flight(&self) -> Option<u16> {
        self.payloads.order.front().map(|&(id, _)| id)
    }

    /// Says more about `error` where the queue knows more: an [`Error::Timeout`] on an
    /// in-order queue with commands in flight becomes [`Error::Stalled`], naming the oldest
    /// command and whether the device read it (its SQ head is past it: its completion was
    /// lost) or not (the queue is stalled). Any other error is returned unchanged.
    pub fn explain(&mut self, error: Error) -> Error {
        let Error::Timeout {
            queue,
            waited,
            in_flight,
            oldest,
        } = error
        else {
            return error;
        };
        let Some(&(id, at)) = self.payloads.order.front() else {
            return Error::Timeout {
                queue,
                waited,
                in_flight,
                oldest,
            };
        };
        // Best effort: an impossible write-back leaves the head where it was.
        let _ = self.refresh_sq_head();
        let past = self.sq.head.wrapping_sub(at) as i32;
        Error::Stalled {
            queue,
            id,
            waited,
            in_flight,
            read: past > 0,
        }
    }

    /// Whether a completion is waiting (reaped earlier, or in the CQ).
    #[inline]
    pub fn is_ready(&self) -> bool {
        !self.cq.pending.is_empty() || self.cq_ready() || self.is_gone()
    }

    /// Whether the CQ entry at the head has the current phase.
    #[inline]
    pub(super) fn cq_ready(&self) -> bool {
        let word = self
            .memory
            .load_u32(self.layout.cq_phase_word(self.cq.head));
        self.layout.is_current(word, self.cq.head)
    }

    /// Takes the CQ entry at the head, if the device wrote it, without a doorbell.
    #[inline]
    fn take_cq(&mut self) -> Result<Option<Done<C, T>>, Error> {
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
        match (expected, order.iter().position(|&(id, _)| id == got)) {
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
        }
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
    pub(super) fn announce_cq(&mut self) -> Result<(), Error> {
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
    pub(super) fn collect(&mut self) -> Result<(), Error> {
        while let Some(done) = self.take_cq()? {
            self.cq.pending.push_back(done);
        }
        self.announce_cq()
    }

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
                Some(super::wait::head_slice(left))
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
