//! Descriptor rings: submission and completion queues in DMA memory, doorbells, completions and
//! the ownership of in-flight buffers.
//!
//! A hardware queue pair is a submission ring (SQ) the host writes descriptors into and a
//! completion ring (CQ) the device writes completions into, both in [`Memory`] the device
//! reaches by IOVA (a [`dma::Mapping`](crate::dma::Mapping) or part of one), two doorbell
//! registers in the device's BAR ([`Doorbells`], written through [`mmio`]), and an
//! interrupt vector (an [`irq::EventFd`]). A device has several, each with
//! its own id, context and vector.
//!
//! - The host side is [`Queue`]: [`Queue::push`] moves a payload (the buffers a descriptor
//!   names) into the queue and writes the descriptor; [`Queue::flush`] rings the SQ doorbell
//!   once for the batch ([`Queue::push_burst`] / [`Queue::post_burst`] write a whole burst;
//!   [`Queue::submit`] and [`Queue::post_and_flush`] write one descriptor and ring for it in one
//!   call); completions come back, with their payloads, from [`Queue::poll_one`] /
//!   [`Queue::reap`] (busy-poll), [`Queue::wait`] (spin, then sleep on the interrupt),
//!   [`Queue::next_completion`] (a future for any executor), or [`wait_any`] over many queues.
//! - The device side is [`DeviceQueue`]: what the loopback device's engine (or a test playing
//!   the device) uses to read submissions, write completions and raise the interrupt.
//!
//! The protocol: free-running 32-bit counters on both sides ([`MAX_DEPTH`] bounds the depth);
//! the host announces its SQ tail by doorbell, the device writes its SQ head back into ring
//! memory; the device marks each completion with a phase bit that flips on every pass over the
//! CQ, so the host finds new completions without reading a device register, and announces its
//! CQ head by doorbell. Every fence is listed, with what it pairs with, in `queue.rs` (host) and
//! `device.rs` (device); loom checks them (`RUSTFLAGS="--cfg loom" cargo test --release --lib
//! ring::`).
//!
//! # Device formats
//!
//! The defaults are the loopback device's format. A device with NVMe's queue-pair format is
//! driven by the same [`Queue`], configured:
//!
//! - [`Config::with_doorbell`]`(`[`DoorbellValue::Slot`]`)`: the SQ tail and CQ head doorbells
//!   carry slot indices `0..depth` instead of free-running counters; the SQ then never holds
//!   more than `depth - 1` entries (a device keeps the CQ to `depth - 1` too).
//! - a completion type whose [`Completion::sq_head`] returns the SQ head slot of the entry
//!   (NVMe: dword 2, bits 15:0): the queue then takes the SQ head from completions and never
//!   reads the write-back word, so the device writes nothing into ring memory but CQ entries.
//! - [`Config::with_part_align`]`(4096)` (and [`Layout::with_align`] to size the memory): the SQ
//!   and the CQ each start on a page, at `memory.iova() + layout.sq_offset()` and
//!   `memory.iova() + layout.cq_offset()`, the addresses to program (ASQ/ACQ, or the Create
//!   I/O SQ/CQ commands); the queue's own words (the interrupt flag) come after the CQ.
//! - [`Config::with_id`] for the queue id; the interrupt eventfd (an MSI-X vector) is given to
//!   [`Queue::new`] as for any device, and [`Queue::wait`] / [`Queue::next_completion`] work
//!   unchanged.
//!
//! ```
//! use std::sync::Arc;
//! use userdma::dma::{SoftIommu, Space};
//! use userdma::memory::{PageSize, Region};
//! use userdma::mmio::{Block, Shared};
//! use userdma::ring::{Command, Config, DeviceQueue, Doorbells, Layout, Memory, Queue, Status};
//!
//! # fn main() -> Result<(), userdma::ring::Error> {
//! let space = SoftIommu::new(48).expect("a 48-bit loopback space");
//! let region = Region::builder(64 << 10).page_size(PageSize::Base).lock(false).build();
//! let mapping = Arc::new(space.map(Arc::new(region.expect("64 KiB"))).expect("mapped"));
//! let layout = Layout::new::<Command, Status>(64)?;
//! let memory = Memory::from_mapping(mapping, 0, layout.size())?;
//! let bar = Block::new(Shared::new(4096)).erase();
//! let doorbells = Doorbells::new(bar, 0x0, 0x40)?;
//!
//! let mut queue: Queue<Command, Status, Vec<u8>> =
//!     Queue::new(Config::new(64), memory.clone(), doorbells.clone(), None)?;
//! // The device side (normally the loopback device's engine thread).
//! let mut device = DeviceQueue::<Command, Status>::new(0, 64, memory, doorbells, None)?;
//!
//! let id = queue.submit(Command { opcode: 1, ..Command::default() }, vec![1, 2, 3])?;
//! assert_eq!(device.fetch()?, 1);
//! let command = device.pop().expect("announced");
//! device.release();
//! device.complete(Status::new(command.command_id, 0, 42))?;
//!
//! let done = queue.poll_one()?.expect("completed");
//! assert_eq!((done.id, done.entry.result, done.payload), (id, 42, vec![1, 2, 3]));
//! # Ok(())
//! # }
//! ```

use std::io;
use std::time::Duration;

mod device;
mod doorbell;
mod entries;
mod index;
mod layout;
mod memory;
mod queue;
mod submit;
mod types;
mod wait;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

pub use self::device::DeviceQueue;
pub use self::doorbell::{DoorbellValue, Doorbells};
pub use self::index::MAX_DEPTH;
pub use self::layout::Layout;
pub use self::memory::{Memory, ALIGN};
pub use self::queue::{
    leaks, Config, Done, Leaks, Presence, Queue, Quiesce, Rejected, Shutdown, Stats,
    DROP_QUIESCE_TIMEOUT,
};
pub use self::types::{Command, Status};
#[cfg(not(loom))]
pub use self::wait::NextCompletion;
pub use self::wait::{wait_any, Waitable};
pub use crate::dma::Pod;

use crate::{irq, mmio};

/// The command id of a posted descriptor ([`Queue::post`]): no completion, no payload.
pub const POSTED: u16 = u16::MAX;

/// A submission entry type: plain data the device reads, with a 16-bit command id field that
/// the queue fills in and the device copies into the completion.
pub trait Submission: Pod {
    /// The command id field.
    fn command_id(&self) -> u16;
    /// Sets the command id field.
    fn set_command_id(&mut self, id: u16);
}

/// A completion entry type: plain data the device writes, naming the command it completes and
/// carrying the phase bit in one aligned 32-bit word, which the device writes last.
pub trait Completion: Pod {
    /// Byte offset in the entry of the 32-bit word that holds the phase bit (a multiple of 4).
    const PHASE_WORD: usize;
    /// The phase bit within that word (exactly one bit set).
    const PHASE_BIT: u32;
    /// The id of the command completed.
    fn command_id(&self) -> u16;

    /// The SQ head the entry reports, as a slot index `0..depth` (NVMe: completion dword 2,
    /// bits 15:0): the slot of the next SQ entry the device will read, so every entry before it
    /// may be reused. `None` (the default) for formats where the device writes the SQ head back
    /// into ring memory instead ([`Layout::sq_head_offset`]).
    ///
    /// A format either always carries the SQ head or never does: a queue asks a zeroed entry
    /// when it is made. When it does, the queue takes the SQ head only from completions (each
    /// one moves it forward, the slot converted to the queue's counter across the ring's wrap),
    /// never reads the write-back word, and keeps at most `depth - 1` entries in the SQ, so a
    /// slot is never ambiguous. A posted descriptor's slot is then free only once a later
    /// completion reports the head past it.
    fn sq_head(&self) -> Option<u16> {
        None
    }
}

/// What went wrong in this module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A depth that is not a power of two from 2 to [`MAX_DEPTH`].
    #[error("queue depth {depth} is not possible: use a power of two from 2 to {max}")]
    InvalidDepth {
        /// The depth given.
        depth: u32,
        /// The largest depth.
        max: u32,
    },

    /// An entry type the ring cannot carry.
    #[error("the {kind} entry type ({size} bytes) cannot be used: {reason}")]
    EntryType {
        /// `"submission"` or `"completion"`.
        kind: &'static str,
        /// Its size.
        size: usize,
        /// What is wrong.
        reason: &'static str,
    },

    /// Ring memory not aligned in host or IOVA space.
    #[error("ring memory at host {addr:#x}, IOVA {iova:#x} is not {align}-byte aligned in both: allocate ring memory at page boundaries")]
    MisalignedMemory {
        /// The host address.
        addr: usize,
        /// The IOVA.
        iova: u64,
        /// The alignment needed.
        align: usize,
    },

    /// A memory range outside the mapping (or empty, or a sub-range not at an aligned offset).
    #[error("{len} bytes at offset {offset:#x} are not a valid ring memory range of a {size:#x}-byte mapping (nonempty, inside, at a multiple of 64)")]
    MemoryRange {
        /// The offset.
        offset: usize,
        /// The length.
        len: usize,
        /// The size of what it is cut from.
        size: usize,
    },

    /// A memory range the device cannot reach with one IOVA range.
    #[error("{len} bytes at offset {offset:#x} of the mapping are not IOVA-contiguous (only {contiguous} are): use hugepages or a smaller queue")]
    NotContiguous {
        /// The offset.
        offset: usize,
        /// The length.
        len: usize,
        /// How many bytes from `offset` are contiguous.
        contiguous: usize,
    },

    /// A part alignment [`Layout::with_align`] cannot use.
    #[error("a ring part alignment of {align} bytes is not possible: use a power of two from {min} to {max}")]
    InvalidAlign {
        /// The alignment given.
        align: usize,
        /// The smallest.
        min: usize,
        /// The largest.
        max: usize,
    },

    /// Ring memory whose IOVA is not aligned as the layout's parts need.
    #[error("ring memory at IOVA {iova:#x} is not {align}-byte aligned, as the device needs the SQ and CQ bases: allocate ring memory at {align}-byte boundaries")]
    PartAlign {
        /// The memory's IOVA.
        iova: u64,
        /// The alignment needed.
        align: usize,
    },

    /// Ring memory too small for the layout.
    #[error("ring memory of {len} bytes is too small for a queue of depth {depth}, which needs {needed}")]
    MemoryTooSmall {
        /// The memory's length.
        len: usize,
        /// Bytes needed.
        needed: usize,
        /// The depth.
        depth: u32,
    },

    /// A doorbell register offset that does not fit the register block.
    #[error("doorbell register at offset {offset:#x} cannot be used")]
    DoorbellOffset {
        /// The offset.
        offset: usize,
        /// Why.
        #[source]
        source: mmio::Error,
    },

    /// The SQ and CQ doorbells given at the same offset.
    #[error("the SQ tail and CQ head doorbells are both at offset {offset:#x}: they must be two registers")]
    SameDoorbell {
        /// The offset.
        offset: usize,
    },

    /// A doorbell register access failed.
    #[error("queue {queue}: accessing the {which} doorbell failed")]
    Doorbell {
        /// The queue.
        queue: u16,
        /// Which doorbell.
        which: &'static str,
        /// The register access error.
        #[source]
        source: mmio::Error,
    },

    /// The submission ring is full.
    #[error("queue {queue}: all {depth} submission slots are in use: wait for completions (Queue::push_wait) or use a deeper queue")]
    Full {
        /// The queue.
        queue: u16,
        /// Its depth.
        depth: u32,
    },

    /// Every command id is in flight.
    #[error("queue {queue}: all {in_flight} command ids are in flight: reap completions first (Queue::push_wait waits for them)")]
    NoCommandId {
        /// The queue.
        queue: u16,
        /// Commands in flight.
        in_flight: usize,
    },

    /// A completion names a command that is not in flight: the device misbehaved.
    #[error("queue {queue}: the device completed command id {id}, which is not in flight (duplicate or corrupt completion)")]
    UnknownCommand {
        /// The queue.
        queue: u16,
        /// The id in the completion.
        id: u16,
    },

    /// In-order queue ([`Config::with_in_order`]): the completion of the oldest command in
    /// flight is missing; the next command's arrived instead.
    #[error("queue {queue}: the device completed command id {got}, the next command after id {expected}, which is the oldest in flight: the completion of id {expected} was lost. The queue is faulted: reset the device, shut the queue down (Queue::shutdown hands every payload back) and open a new one")]
    LostCompletion {
        /// The queue.
        queue: u16,
        /// The id expected: the oldest in flight.
        expected: u16,
        /// The id in the completion.
        got: u16,
    },

    /// In-order queue: a second completion of a command whose completion was taken already.
    #[error("queue {queue}: the device completed command id {got} a second time (expected {}): a duplicate completion. The queue is faulted: reset the device, shut the queue down (Queue::shutdown hands every payload back) and open a new one", expected_id(*expected))]
    DuplicateCompletion {
        /// The queue.
        queue: u16,
        /// The id expected: the oldest in flight, if any.
        expected: Option<u16>,
        /// The id in the completion (completed just before).
        got: u16,
    },

    /// In-order queue: a completion naming another command than the oldest in flight (a
    /// later one, or one not in flight).
    #[error("queue {queue}: the device completed command id {got} (expected {}): a completion with a wrong command id. The queue is faulted: reset the device, shut the queue down (Queue::shutdown hands every payload back) and open a new one", expected_id(*expected))]
    WrongCommand {
        /// The queue.
        queue: u16,
        /// The id expected: the oldest in flight, if any.
        expected: Option<u16>,
        /// The id in the completion.
        got: u16,
    },

    /// The queue met a protocol error earlier (a completion it could not trust) and takes no
    /// more work.
    #[error("queue {queue} is faulted: the device broke the completion protocol earlier (see that error), so it takes no more submissions and hands out no more completions. Reset the device, shut the queue down (Queue::shutdown hands every payload back) and open a new one")]
    Faulted {
        /// The queue.
        queue: u16,
    },

    /// In-order queue: a wait ran out with the oldest command uncompleted
    /// ([`Queue::explain`] of an [`Error::Timeout`]).
    #[error("queue {queue}: command id {id}, the oldest of {in_flight} in flight, got no completion within {waited:?}: the device {}. Reset the device, shut the queue down (Queue::shutdown hands every payload back) and open a new one", if *read { "read it and wrote no completion (a lost completion)" } else { "has not read it (the queue is stalled)" })]
    Stalled {
        /// The queue.
        queue: u16,
        /// The oldest command in flight.
        id: u16,
        /// How long the wait waited.
        waited: Duration,
        /// Commands in flight.
        in_flight: usize,
        /// Whether the device has read the command (its SQ head is past it).
        read: bool,
    },

    /// The device wrote back an impossible SQ head.
    #[error("queue {queue}: the device wrote SQ head {head}, outside {old}..={tail} (previous head to announced tail)")]
    DeviceSqHead {
        /// The queue.
        queue: u16,
        /// The head read.
        head: u32,
        /// The previous head.
        old: u32,
        /// The announced tail.
        tail: u32,
    },

    /// A completion reported an impossible SQ head slot.
    #[error("queue {queue}: a completion reported SQ head slot {slot}, outside slots {old}..={tail} of {depth} (previous head to announced tail)")]
    CompletionSqHead {
        /// The queue.
        queue: u16,
        /// The slot reported.
        slot: u16,
        /// The previous head's slot.
        old: u32,
        /// The announced tail's slot.
        tail: u32,
        /// The depth.
        depth: u32,
    },

    /// Device side: the host rang an impossible SQ tail.
    #[error("queue {queue}: the host rang SQ tail {tail}, outside {old}..={head}+depth")]
    HostSqTail {
        /// The queue.
        queue: u16,
        /// The tail read.
        tail: u32,
        /// The previous tail.
        old: u32,
        /// The head last written back.
        head: u32,
    },

    /// Device side: the host rang an impossible CQ head.
    #[error("queue {queue}: the host rang CQ head {head}, outside {old}..={tail}")]
    HostCqHead {
        /// The queue.
        queue: u16,
        /// The head read.
        head: u32,
        /// The previous head.
        old: u32,
        /// The device's CQ tail.
        tail: u32,
    },

    /// Device side: no room in the completion ring.
    #[error("queue {queue}: the completion ring's {depth} entries are all unconsumed: the host must reap")]
    CqFull {
        /// The queue.
        queue: u16,
        /// Its depth.
        depth: u32,
    },

    /// A wait ran out of time.
    #[error("queue {queue}: no completion within {waited:?} ({in_flight} commands in flight{})", oldest_hint(*.oldest))]
    Timeout {
        /// The queue.
        queue: u16,
        /// How long it waited.
        waited: Duration,
        /// Commands in flight.
        in_flight: usize,
        /// The oldest command in flight, on an in-order queue (the one the device owes):
        /// [`Queue::explain`] says whether the device read it.
        oldest: Option<u16>,
    },

    /// The device behind the queue was removed (or the kernel asked for it back): nothing more
    /// will complete.
    #[error("queue {queue}: the device was removed ({in_flight} commands in flight): shut the queue down (`Queue::shutdown`) to get their buffers back, and open the device again once it is back")]
    Removed {
        /// The queue.
        queue: u16,
        /// Commands in flight.
        in_flight: usize,
    },

    /// The queue's interrupt eventfd failed.
    #[error("queue {queue}: the interrupt eventfd failed")]
    Interrupt {
        /// The queue.
        queue: u16,
        /// The eventfd error.
        #[source]
        source: irq::Error,
    },

    /// Waiting on several queues failed.
    #[error("waiting on several queues' interrupts failed")]
    WaitMany {
        /// The waiter's error.
        #[source]
        source: irq::Error,
    },

    /// The device could not be stopped with work in flight: the payloads and the ring memory
    /// were leaked on purpose.
    #[error("queue {queue}: {in_flight} commands were still in flight and the device could not be stopped; {leaked} payloads and the ring memory are leaked so the device cannot write freed memory")]
    Quiesce {
        /// The queue.
        queue: u16,
        /// Commands in flight.
        in_flight: usize,
        /// Payloads leaked.
        leaked: usize,
        /// Why stopping failed.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code); a wrapped module error gives
    /// its own. Exhaustive: a new variant must be given its code here.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::InvalidDepth { .. }
            | Error::EntryType { .. }
            | Error::MisalignedMemory { .. }
            | Error::MemoryRange { .. }
            | Error::NotContiguous { .. }
            | Error::InvalidAlign { .. }
            | Error::PartAlign { .. }
            | Error::MemoryTooSmall { .. }
            | Error::DoorbellOffset { .. }
            | Error::SameDoorbell { .. } => Code::InvalidArgument,
            Error::Full { .. } | Error::NoCommandId { .. } | Error::CqFull { .. } => {
                Code::Exhausted
            }
            Error::Timeout { .. } | Error::Stalled { .. } => Code::Timeout,
            Error::Removed { .. } => Code::Removed,
            Error::UnknownCommand { .. }
            | Error::LostCompletion { .. }
            | Error::DuplicateCompletion { .. }
            | Error::WrongCommand { .. }
            | Error::Faulted { .. }
            | Error::DeviceSqHead { .. }
            | Error::CompletionSqHead { .. }
            | Error::HostSqTail { .. }
            | Error::HostCqHead { .. } => Code::Device,
            // The device did not stop when asked, with commands in flight.
            Error::Quiesce { .. } => Code::Device,
            Error::Doorbell { source, .. } => source.code(),
            Error::Interrupt { source, .. } | Error::WaitMany { source } => source.code(),
        }
    }
}

/// "id N" or "none in flight", for messages.
fn expected_id(id: Option<u16>) -> String {
    id.map_or_else(
        || "no command, none is in flight".to_owned(),
        |id| format!("id {id}"),
    )
}

/// The part of a timeout's message that names the oldest command in flight.
fn oldest_hint(oldest: Option<u16>) -> String {
    oldest.map_or_else(String::new, |id| format!(", the oldest is command {id}"))
}
