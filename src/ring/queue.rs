//! [`Queue`]: the host side of one hardware queue pair — submitting descriptors with the buffers
//! they name, one doorbell per batch, and taking completions back with those buffers. This file
//! has the queue, its state and what it hands out; its configuration is in `queue/config.rs`,
//! taking completions in `queue/complete.rs`, stopping it in `queue/shutdown.rs`, and the
//! submitting methods in `submit.rs`.
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
use std::marker::PhantomData;
use std::time::Duration;

use super::entries::Entries;
use super::submit::{Sq, SqTail};
use super::{Completion, DoorbellValue, Doorbells, Error, Layout, Memory, Submission};
use crate::irq::EventFd;

mod complete;
mod config;
mod shutdown;

pub use self::config::Config;
pub use self::shutdown::{leaks, Leaks, Presence, Quiesce, Shutdown, DROP_QUIESCE_TIMEOUT};

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
        let head_from_cq = C::new_zeroed().sq_head().is_some();
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
        #[cfg(feature = "tracing")]
        tracing::debug!(
            queue = id,
            depth,
            ring_iova = %memory.iova(),
            ring_bytes = layout.size(),
            in_order = config.in_order,
            interrupt = interrupt.is_some(),
            "ring created"
        );
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
}
