//! [`Config`]: how a [`Queue`](super::Queue) is set up — its depth, id and context, how its
//! waits spin, what its doorbells carry, how its ring memory is laid out, and whether its
//! completions must come in submission order.

use std::time::Duration;

use crate::ring::{Completion, DoorbellValue, Error, Layout, Submission};

/// How a queue is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub(super) depth: u32,
    pub(super) id: u16,
    pub(super) context: u32,
    pub(super) spin: Duration,
    pub(super) doorbell: DoorbellValue,
    part_align: usize,
    pub(super) in_order: bool,
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
    /// [`Queue::explain`](super::Queue::explain) turns a wait's timeout into the oldest
    /// command's id and whether the device read it. Off (the default), completions may come in
    /// any order (NVMe) and an id not in flight is [`Error::UnknownCommand`].
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
