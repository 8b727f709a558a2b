//! The loopback device's register map (BAR 0), opcodes, completion status codes and queue fault
//! codes, and the activity-record block ([`ActivityRegs`], the record format in
//! [`activity`](crate::activity)): the contract an SDK programs against. Every layout is a `#[repr(C)]` struct whose
//! offsets are asserted below; the [`Field`] constants are derived from them with `offset_of!`.

use std::mem::{offset_of, size_of};

use userdma::mmio::{Field, ReadOnly, ReadWrite, WriteOnly};

mod bits;
mod codes;

pub use self::bits::{
    ActivityControl, ActivityStatus, Control, DeviceStatus, FaultControl, QueueControl, QueueStatus,
};
pub use self::codes::{ActivityFault, Fault, Opcode, StatusCode, Unit};

/// The value of the [`ID`] register: `"UDLB"` in little-endian ASCII.
pub const DEVICE_ID: u32 = u32::from_le_bytes(*b"UDLB");
/// The value of the [`VERSION`] register: the version of this register map. Version 2 moved
/// the doorbells out of the queues' blocks into their own ([`DOORBELL_BASE`]).
pub const VERSION_2: u32 = 2;
/// BAR index of the register block.
pub const REGISTER_BAR: usize = 0;
/// BAR index of the device memory (a 64-bit BAR after the 64-bit register BAR, as on hardware).
pub const MEMORY_BAR: usize = 2;
/// Size in bytes of the register BAR.
pub const REGISTER_BAR_SIZE: usize = 0x1000;
/// Offset of queue 0's register block; queue `q`'s is `QUEUE_BASE + q * QUEUE_STRIDE`.
pub const QUEUE_BASE: usize = 0x100;
/// Bytes between two queues' register blocks.
pub const QUEUE_STRIDE: usize = size_of::<QueueRegs>();
/// The most queues the register map has room for (one interrupt bit each in a 32-bit register).
pub const MAX_QUEUES: u16 = 32;

/// The global registers, at offset 0 of BAR 0. Never instantiated: it gives the offsets.
#[repr(C)]
#[derive(Debug)]
#[allow(dead_code)] // A layout description: the fields are read through `offset_of!` only.
pub struct GlobalRegs {
    /// RO: [`DEVICE_ID`].
    pub id: u32,
    /// RO: [`VERSION_2`].
    pub version: u32,
    /// RO: number of queues (each with an interrupt vector of the same index).
    pub queues: u32,
    /// RO: [`DeviceStatus`].
    pub status: u32,
    /// WO: [`Control`]; the device clears it once it has acted.
    pub control: u32,
    /// RO: resets completed since the device started.
    pub reset_count: u32,
    /// RO: width of the device's DMA mask in bits.
    pub dma_mask_bits: u32,
    /// RO: the largest queue depth the device accepts.
    pub max_depth: u32,
    /// RO: size of the device memory (BAR 2) in bytes.
    pub memory_size: u64,
    /// RO: bit `q` set: vector `q` is masked.
    pub irq_mask: u32,
    /// WO: write 1s to mask those vectors (NVMe's INTMS).
    pub irq_mask_set: u32,
    /// WO: write 1s to unmask those vectors (NVMe's INTMC); a pending vector fires at once.
    pub irq_mask_clear: u32,
    /// RO: bit `q` set: vector `q` was raised while masked and fires when unmasked.
    pub irq_pending: u32,
    /// RO: descriptors the copy engine executed (successful or not). This and the next five
    /// are the copy engine's block ([`UnitRegs`]).
    pub descriptors: u64,
    /// RO: bytes moved or computed by the copy engine's successful descriptors.
    pub bytes: u64,
    /// RO: times the copy engine moved from one context to another.
    pub context_switches: u64,
    /// RO: the copy engine's descriptors completed with an error status.
    pub errors: u64,
    /// RO: nanoseconds the copy engine spent executing descriptors (including modelled
    /// time). With a cost model it grows before each completion; with
    /// [`Cost::zero`](super::Cost::zero), once per burst, after the burst's completions.
    pub busy_ns: u64,
    /// RO: interrupts the copy engine raised (eventfd signals).
    pub interrupts: u64,
    /// RO: nanoseconds of modelled time the cost model charged the copy engine's
    /// descriptors: beside [`GlobalRegs::busy_ns`] (the measured time), it shows whether the
    /// modelled device held (the two agree when the host-speed work is shorter than the model).
    pub modelled_ns: u64,
    /// RO: the compute unit's counters; the seven counters above are the copy engine's. Each
    /// unit writes only its own block; the device's totals are the sums of the two
    /// ([`Loopback::counters`](super::Loopback::counters) adds them up).
    pub compute: UnitRegs,
    _reserved: [u32; 22],
}

/// One unit's counters ([`Unit`]): the copy engine's at [`DESCRIPTORS`] (offset 0x38), the
/// compute unit's [`UNIT_STRIDE`] bytes further ([`GlobalRegs::compute`]; see
/// [`unit_field`]). Never instantiated.
#[repr(C)]
#[derive(Debug)]
#[allow(dead_code)] // A layout description: the fields are read through `offset_of!` only.
pub struct UnitRegs {
    /// RO: descriptors the unit executed (successful or not).
    pub descriptors: u64,
    /// RO: bytes moved or computed by the unit's successful descriptors.
    pub bytes: u64,
    /// RO: times the unit took a descriptor of another context than its previous one.
    pub context_switches: u64,
    /// RO: the unit's descriptors completed with an error status.
    pub errors: u64,
    /// RO: nanoseconds the unit spent executing descriptors (as [`GlobalRegs::busy_ns`]).
    pub busy_ns: u64,
    /// RO: interrupts the unit raised.
    pub interrupts: u64,
    /// RO: modelled nanoseconds charged to the unit's descriptors (as
    /// [`GlobalRegs::modelled_ns`]).
    pub modelled_ns: u64,
}

/// One queue's registers, at `QUEUE_BASE + q * QUEUE_STRIDE`. Never instantiated.
#[repr(C)]
#[derive(Debug)]
#[allow(dead_code)] // A layout description: the fields are read through `offset_of!` only.
pub struct QueueRegs {
    /// RW: IOVA of the queue's ring memory, laid out as
    /// [`ring::Layout`](userdma::ring::Layout) for [`Command`](userdma::ring::Command) /
    /// [`Status`](userdma::ring::Status) at [`QueueRegs::depth`] entries; 64-byte aligned.
    pub ring_base: u64,
    /// RW: entries per ring (a power of two, 2 to [`GlobalRegs::max_depth`]).
    pub depth: u32,
    /// RW: the context every descriptor of this queue must name.
    pub context: u32,
    /// RW: [`QueueControl`]. Set `ENABLE` after programming the other registers; clear it to
    /// stop the queue (the device acknowledges by clearing [`QueueStatus::ENABLED`]).
    pub control: u32,
    /// RO: [`QueueStatus`].
    pub status: u32,
    /// Reserved, reads 0: the doorbells were here in version 1; they are in their own block
    /// now ([`DoorbellRegs`]), away from the counters the device writes on every descriptor.
    _reserved0: [u32; 2],
    /// RO: [`Fault`] code while [`QueueStatus::FAULT`] is set.
    pub fault: u32,
    /// RW: the [`Unit`] that serves the queue (0: the copy engine, 1: the compute unit),
    /// read when the queue is enabled; any other value faults it with [`Fault::BadUnit`].
    pub unit: u32,
    /// RO: descriptors of this queue executed.
    pub completed: u64,
    /// RO: descriptors of this queue completed with an error status.
    pub errors: u64,
    /// RW: bytes of the queue's context's private working set in device SRAM (its hot
    /// activations), read when the queue is enabled; 0 with [`QueueRegs::ws_shared`] 0: the
    /// context declares none and the SRAM model leaves it alone (see
    /// [`Cost::sram_bytes`](super::Cost::sram_bytes)).
    pub ws_private: u64,
    /// RW: bytes of the working set shared with every queue of the same
    /// [`QueueRegs::share_key`] (the weights of one model), read when the queue is enabled.
    pub ws_shared: u64,
    /// RW: the share key of [`QueueRegs::ws_shared`]; 0: not shared (counted as private).
    pub share_key: u32,
    _reserved1: u32,
    /// RO: bytes of this queue's compute descriptors served from SRAM (resident).
    pub sram_hits: u64,
    /// RO: bytes this queue's compute descriptors touched while it declared a working set;
    /// `sram_hits / sram_touched` is the context's SRAM hit rate.
    pub sram_touched: u64,
}

/// Offset of the fault-injection block ([`FaultRegs`]), after the last queue's registers.
pub const FAULT_BASE: usize = 0xd00;

/// The fault-injection registers, at [`FAULT_BASE`] (see [`fault`](super::fault)). A window:
/// `queue` selects the queue the programme registers are applied to and the `injected`
/// counters show. Never instantiated.
#[repr(C)]
#[derive(Debug)]
#[allow(dead_code)] // A layout description: the fields are read through `offset_of!` only.
pub struct FaultRegs {
    /// RW: the queue the next `control` write programs and `injected` shows.
    pub queue: u32,
    /// RW: bit `k` set: [`Kind`](super::fault::Kind) `k` may be injected (one is drawn per
    /// hit when several are set).
    pub kinds: u32,
    /// RW: trigger: the next `count` descriptors of the queue are hit.
    pub count: u32,
    /// RW: trigger (once `count` is used up, or with `count` 0): each descriptor is hit with
    /// probability `rate / 2^32`.
    pub rate: u32,
    /// RW: the seed of the generator that draws the rate's hits and the kinds.
    pub seed: u64,
    /// RW: microseconds [`Kind::Slow`](super::fault::Kind::Slow) delays a descriptor by.
    pub delay_us: u32,
    /// WO: [`FaultControl`]: `APPLY` programs queue `queue` with the registers above
    /// (replacing its programme), `CLEAR` removes its programme; the device clears it once it
    /// has acted.
    pub control: u32,
    /// RO: `control` writes the device has acted on (the host waits for it to move).
    pub applied: u32,
    _reserved: u32,
    /// RO: faults injected into queue `queue` so far, by kind: element `k` for kind `k`,
    /// element 0 their sum. Kept across resets.
    pub injected: [u64; 8],
}

const _: () = {
    assert!(offset_of!(FaultRegs, queue) == 0x00);
    assert!(offset_of!(FaultRegs, kinds) == 0x04);
    assert!(offset_of!(FaultRegs, count) == 0x08);
    assert!(offset_of!(FaultRegs, rate) == 0x0c);
    assert!(offset_of!(FaultRegs, seed) == 0x10);
    assert!(offset_of!(FaultRegs, delay_us) == 0x18);
    assert!(offset_of!(FaultRegs, control) == 0x1c);
    assert!(offset_of!(FaultRegs, applied) == 0x20);
    assert!(offset_of!(FaultRegs, injected) == 0x28);
    assert!(size_of::<FaultRegs>() == 0x68);
    assert!(QUEUE_BASE + MAX_QUEUES as usize * QUEUE_STRIDE <= FAULT_BASE);
    assert!(FAULT_BASE + size_of::<FaultRegs>() <= REGISTER_BAR_SIZE);
};

const _: () = {
    assert!(offset_of!(GlobalRegs, id) == 0x00);
    assert!(offset_of!(GlobalRegs, version) == 0x04);
    assert!(offset_of!(GlobalRegs, queues) == 0x08);
    assert!(offset_of!(GlobalRegs, status) == 0x0c);
    assert!(offset_of!(GlobalRegs, control) == 0x10);
    assert!(offset_of!(GlobalRegs, reset_count) == 0x14);
    assert!(offset_of!(GlobalRegs, dma_mask_bits) == 0x18);
    assert!(offset_of!(GlobalRegs, max_depth) == 0x1c);
    assert!(offset_of!(GlobalRegs, memory_size) == 0x20);
    assert!(offset_of!(GlobalRegs, irq_mask) == 0x28);
    assert!(offset_of!(GlobalRegs, irq_mask_set) == 0x2c);
    assert!(offset_of!(GlobalRegs, irq_mask_clear) == 0x30);
    assert!(offset_of!(GlobalRegs, irq_pending) == 0x34);
    assert!(offset_of!(GlobalRegs, descriptors) == 0x38);
    assert!(offset_of!(GlobalRegs, bytes) == 0x40);
    assert!(offset_of!(GlobalRegs, context_switches) == 0x48);
    assert!(offset_of!(GlobalRegs, errors) == 0x50);
    assert!(offset_of!(GlobalRegs, busy_ns) == 0x58);
    assert!(offset_of!(GlobalRegs, interrupts) == 0x60);
    assert!(offset_of!(GlobalRegs, modelled_ns) == 0x68);
    assert!(offset_of!(GlobalRegs, compute) == 0x70);
    assert!(size_of::<GlobalRegs>() == QUEUE_BASE);
    assert!(size_of::<UnitRegs>() == UNIT_STRIDE);
    assert!(offset_of!(GlobalRegs, descriptors) + UNIT_STRIDE == offset_of!(GlobalRegs, compute));
    assert!(
        offset_of!(GlobalRegs, interrupts) - offset_of!(GlobalRegs, descriptors)
            == offset_of!(UnitRegs, interrupts)
    );
    assert!(
        offset_of!(GlobalRegs, modelled_ns) - offset_of!(GlobalRegs, descriptors)
            == offset_of!(UnitRegs, modelled_ns)
    );

    assert!(offset_of!(QueueRegs, ring_base) == 0x00);
    assert!(offset_of!(QueueRegs, depth) == 0x08);
    assert!(offset_of!(QueueRegs, context) == 0x0c);
    assert!(offset_of!(QueueRegs, control) == 0x10);
    assert!(offset_of!(QueueRegs, status) == 0x14);
    assert!(offset_of!(QueueRegs, _reserved0) == 0x18);
    assert!(offset_of!(QueueRegs, fault) == 0x20);
    assert!(offset_of!(QueueRegs, unit) == 0x24);
    assert!(offset_of!(QueueRegs, completed) == 0x28);
    assert!(offset_of!(QueueRegs, errors) == 0x30);
    assert!(offset_of!(QueueRegs, ws_private) == 0x38);
    assert!(offset_of!(QueueRegs, ws_shared) == 0x40);
    assert!(offset_of!(QueueRegs, share_key) == 0x48);
    assert!(offset_of!(QueueRegs, sram_hits) == 0x50);
    assert!(offset_of!(QueueRegs, sram_touched) == 0x58);
    assert!(size_of::<QueueRegs>() == 0x60);

    assert!(QUEUE_BASE + MAX_QUEUES as usize * QUEUE_STRIDE <= REGISTER_BAR_SIZE);
};

/// [`GlobalRegs::id`].
pub const ID: Field<u32, ReadOnly> = Field::new(offset_of!(GlobalRegs, id));
/// [`GlobalRegs::version`].
pub const VERSION: Field<u32, ReadOnly> = Field::new(offset_of!(GlobalRegs, version));
/// [`GlobalRegs::queues`].
pub const QUEUES: Field<u32, ReadOnly> = Field::new(offset_of!(GlobalRegs, queues));
/// [`GlobalRegs::status`].
pub const STATUS: Field<DeviceStatus, ReadOnly> = Field::new(offset_of!(GlobalRegs, status));
/// [`GlobalRegs::control`].
pub const CONTROL: Field<Control, WriteOnly> = Field::new(offset_of!(GlobalRegs, control));
/// [`GlobalRegs::reset_count`].
pub const RESET_COUNT: Field<u32, ReadOnly> = Field::new(offset_of!(GlobalRegs, reset_count));
/// [`GlobalRegs::dma_mask_bits`].
pub const DMA_MASK_BITS: Field<u32, ReadOnly> = Field::new(offset_of!(GlobalRegs, dma_mask_bits));
/// [`GlobalRegs::max_depth`].
pub const MAX_DEPTH: Field<u32, ReadOnly> = Field::new(offset_of!(GlobalRegs, max_depth));
/// [`GlobalRegs::memory_size`].
pub const MEMORY_SIZE: Field<u64, ReadOnly> = Field::new(offset_of!(GlobalRegs, memory_size));
/// [`GlobalRegs::irq_mask`].
pub const IRQ_MASK: Field<u32, ReadOnly> = Field::new(offset_of!(GlobalRegs, irq_mask));
/// [`GlobalRegs::irq_mask_set`].
pub const IRQ_MASK_SET: Field<u32, WriteOnly> = Field::new(offset_of!(GlobalRegs, irq_mask_set));
/// [`GlobalRegs::irq_mask_clear`].
pub const IRQ_MASK_CLEAR: Field<u32, WriteOnly> =
    Field::new(offset_of!(GlobalRegs, irq_mask_clear));
/// [`GlobalRegs::irq_pending`].
pub const IRQ_PENDING: Field<u32, ReadOnly> = Field::new(offset_of!(GlobalRegs, irq_pending));
/// [`GlobalRegs::descriptors`].
pub const DESCRIPTORS: Field<u64, ReadOnly> = Field::new(offset_of!(GlobalRegs, descriptors));
/// [`GlobalRegs::bytes`].
pub const BYTES: Field<u64, ReadOnly> = Field::new(offset_of!(GlobalRegs, bytes));
/// [`GlobalRegs::context_switches`].
pub const CONTEXT_SWITCHES: Field<u64, ReadOnly> =
    Field::new(offset_of!(GlobalRegs, context_switches));
/// [`GlobalRegs::errors`].
pub const ERRORS: Field<u64, ReadOnly> = Field::new(offset_of!(GlobalRegs, errors));
/// [`GlobalRegs::busy_ns`].
pub const BUSY_NS: Field<u64, ReadOnly> = Field::new(offset_of!(GlobalRegs, busy_ns));
/// [`GlobalRegs::interrupts`].
pub const INTERRUPTS: Field<u64, ReadOnly> = Field::new(offset_of!(GlobalRegs, interrupts));
/// [`GlobalRegs::modelled_ns`] (the copy engine's; see [`unit_field`]).
pub const MODELLED_NS: Field<u64, ReadOnly> = Field::new(offset_of!(GlobalRegs, modelled_ns));

/// Bytes between two units' counter blocks ([`UnitRegs`]).
pub const UNIT_STRIDE: usize = size_of::<UnitRegs>();

/// Unit `unit`'s copy of the counter register `field` (one of [`DESCRIPTORS`], [`BYTES`],
/// [`CONTEXT_SWITCHES`], [`ERRORS`], [`BUSY_NS`], [`INTERRUPTS`], which are the copy
/// engine's).
pub const fn unit_field<V, A>(field: Field<V, A>, unit: Unit) -> Field<V, A> {
    Field::new(field.offset() + unit as usize * UNIT_STRIDE)
}

/// Per-queue registers: `Q_*.at(q, QUEUE_STRIDE)` is queue `q`'s (see [`queue_field`]).
const fn q<V, A>(offset: usize) -> Field<V, A> {
    Field::new(QUEUE_BASE + offset)
}

/// Queue 0's [`QueueRegs::ring_base`].
pub const Q_RING_BASE: Field<u64, ReadWrite> = q(offset_of!(QueueRegs, ring_base));
/// Queue 0's [`QueueRegs::depth`].
pub const Q_DEPTH: Field<u32, ReadWrite> = q(offset_of!(QueueRegs, depth));
/// Queue 0's [`QueueRegs::context`].
pub const Q_CONTEXT: Field<u32, ReadWrite> = q(offset_of!(QueueRegs, context));
/// Queue 0's [`QueueRegs::control`].
pub const Q_CONTROL: Field<QueueControl, ReadWrite> = q(offset_of!(QueueRegs, control));
/// Queue 0's [`QueueRegs::status`].
pub const Q_STATUS: Field<QueueStatus, ReadOnly> = q(offset_of!(QueueRegs, status));
/// Queue 0's [`DoorbellRegs::sq_tail`] (a doorbell: [`queue_field`] steps it by
/// [`DOORBELL_STRIDE`]).
pub const Q_SQ_TAIL: Field<u32, WriteOnly> =
    Field::new(DOORBELL_BASE + offset_of!(DoorbellRegs, sq_tail));
/// Queue 0's [`DoorbellRegs::cq_head`] (as [`Q_SQ_TAIL`]).
pub const Q_CQ_HEAD: Field<u32, WriteOnly> =
    Field::new(DOORBELL_BASE + offset_of!(DoorbellRegs, cq_head));
/// Queue 0's [`QueueRegs::fault`].
pub const Q_FAULT: Field<u32, ReadOnly> = q(offset_of!(QueueRegs, fault));
/// Queue 0's [`QueueRegs::unit`].
pub const Q_UNIT: Field<u32, ReadWrite> = q(offset_of!(QueueRegs, unit));
/// Queue 0's [`QueueRegs::completed`].
pub const Q_COMPLETED: Field<u64, ReadOnly> = q(offset_of!(QueueRegs, completed));
/// Queue 0's [`QueueRegs::errors`].
pub const Q_ERRORS: Field<u64, ReadOnly> = q(offset_of!(QueueRegs, errors));
/// [`QueueRegs::ws_private`].
pub const Q_WS_PRIVATE: Field<u64, ReadWrite> = q(offset_of!(QueueRegs, ws_private));
/// [`QueueRegs::ws_shared`].
pub const Q_WS_SHARED: Field<u64, ReadWrite> = q(offset_of!(QueueRegs, ws_shared));
/// [`QueueRegs::share_key`].
pub const Q_SHARE_KEY: Field<u32, ReadWrite> = q(offset_of!(QueueRegs, share_key));
/// [`QueueRegs::sram_hits`].
pub const Q_SRAM_HITS: Field<u64, ReadOnly> = q(offset_of!(QueueRegs, sram_hits));
/// [`QueueRegs::sram_touched`].
pub const Q_SRAM_TOUCHED: Field<u64, ReadOnly> = q(offset_of!(QueueRegs, sram_touched));

/// A register of the fault block.
const fn fault<V, A>(offset: usize) -> Field<V, A> {
    Field::new(FAULT_BASE + offset)
}

/// [`FaultRegs::queue`].
pub const FAULT_QUEUE: Field<u32, ReadWrite> = fault(offset_of!(FaultRegs, queue));
/// [`FaultRegs::kinds`].
pub const FAULT_KINDS: Field<u32, ReadWrite> = fault(offset_of!(FaultRegs, kinds));
/// [`FaultRegs::count`].
pub const FAULT_COUNT: Field<u32, ReadWrite> = fault(offset_of!(FaultRegs, count));
/// [`FaultRegs::rate`].
pub const FAULT_RATE: Field<u32, ReadWrite> = fault(offset_of!(FaultRegs, rate));
/// [`FaultRegs::seed`].
pub const FAULT_SEED: Field<u64, ReadWrite> = fault(offset_of!(FaultRegs, seed));
/// [`FaultRegs::delay_us`].
pub const FAULT_DELAY_US: Field<u32, ReadWrite> = fault(offset_of!(FaultRegs, delay_us));
/// [`FaultRegs::control`].
pub const FAULT_CONTROL: Field<FaultControl, WriteOnly> = fault(offset_of!(FaultRegs, control));
/// [`FaultRegs::applied`].
pub const FAULT_APPLIED: Field<u32, ReadOnly> = fault(offset_of!(FaultRegs, applied));
/// [`FaultRegs::injected`]`[0]`, the sum over the kinds.
pub const FAULT_INJECTED: Field<u64, ReadOnly> = fault(offset_of!(FaultRegs, injected));

/// [`FaultRegs::injected`] of `kind`.
pub const fn fault_injected(kind: super::fault::Kind) -> Field<u64, ReadOnly> {
    Field::new(FAULT_INJECTED.offset() + 8 * kind as usize)
}

/// Queue `queue`'s copy of the per-queue register `field` (one of the `Q_*` constants: a
/// doorbell in the doorbell block, any other in the queue's block). `None` past
/// [`MAX_QUEUES`].
pub const fn queue_field<V, A>(field: Field<V, A>, queue: u16) -> Option<Field<V, A>> {
    if queue >= MAX_QUEUES {
        return None;
    }
    field.at(queue as usize, queue_stride(field))
}

/// Bytes between two queues' copies of the per-queue register `field`: [`DOORBELL_STRIDE`]
/// for a doorbell, [`QUEUE_STRIDE`] for the others.
pub const fn queue_stride<V, A>(field: Field<V, A>) -> usize {
    if field.offset() >= DOORBELL_BASE {
        DOORBELL_STRIDE
    } else {
        QUEUE_STRIDE
    }
}

/// Offset of the doorbell block ([`DoorbellRegs`] per queue), after the activity block.
pub const DOORBELL_BASE: usize = 0xf00;
/// Bytes between two queues' doorbells.
pub const DOORBELL_STRIDE: usize = size_of::<DoorbellRegs>();

/// One queue's doorbells, at `DOORBELL_BASE + q * DOORBELL_STRIDE`: the two registers the
/// host writes while a queue runs, in a block of their own (as NVMe's are, from 0x1000),
/// so that no cache line holds both a register the host writes on every submission or reap
/// and one the device writes on every descriptor ([`QueueRegs::completed`]): with them in
/// one line, each doorbell took the line from the device's core and its next count took it
/// back (version 1 had them in [`QueueRegs`]). Never instantiated.
#[repr(C)]
#[derive(Debug)]
#[allow(dead_code)] // A layout description: the fields are read through `offset_of!` only.
pub struct DoorbellRegs {
    /// WO: SQ tail doorbell (free-running counter of the next entry the host writes).
    pub sq_tail: u32,
    /// WO: CQ head doorbell (free-running counter of the next completion the host reads).
    pub cq_head: u32,
}

const _: () = {
    assert!(offset_of!(DoorbellRegs, sq_tail) == 0x0);
    assert!(offset_of!(DoorbellRegs, cq_head) == 0x4);
    assert!(size_of::<DoorbellRegs>() == 0x8);
    // Line-aligned, after the activity block, inside the BAR.
    assert!(DOORBELL_BASE % 64 == 0);
    assert!(ACTIVITY_BASE + size_of::<ActivityRegs>() <= DOORBELL_BASE);
    assert!(DOORBELL_BASE + MAX_QUEUES as usize * DOORBELL_STRIDE <= REGISTER_BAR_SIZE);
};

/// Offset of the activity-record block ([`ActivityRegs`]), after the fault block.
pub const ACTIVITY_BASE: usize = 0xe00;

/// The most records per unit the activity buffer may hold (64 MiB per unit).
pub const MAX_ACTIVITY_RECORDS: u32 = 1 << 20;

/// The activity-record registers, at [`ACTIVITY_BASE`]: the device's trace unit. While enabled,
/// each unit writes one [`activity::Record`](crate::activity::Record) (64 bytes) per descriptor
/// it completes into its own ring of the host's activity buffer, through its own translation
/// of host addresses (as it writes completions): unit `u`'s ring is the `records` records at
/// `base + u * records * 64`, and record number `n` of the unit (counting from 0 since it was
/// enabled) goes to slot `n % records`. A unit writes the record's bytes, then publishes
/// [`ActivityUnitRegs::written`] `= n + 1` (a Release store), before the descriptor's
/// completion. Never instantiated.
///
/// Programming: with `control` 0 (and both units' `status` 0), write `base` and `records`,
/// then `control = ENABLE`; each unit answers in its own `status`: `ENABLED` (its `written`
/// zeroed), or `FAULT` with an [`ActivityFault`] code. Stopping: `control = 0`; once both
/// units' `status` read 0 the device writes no more record bytes, and the buffer may be
/// unmapped. A unit that cannot translate its ring any more (the host unmapped it while
/// enabled) stops writing records and reports `FAULT` with [`ActivityFault::Unmapped`]; the
/// host acknowledges a fault by clearing `control`. A device reset disables recording and
/// zeroes every register of the block: the host programs it again.
#[repr(C)]
#[derive(Debug)]
#[allow(dead_code)] // A layout description: the fields are read through `offset_of!` only.
pub struct ActivityRegs {
    /// RW: IOVA of the activity buffer, 64-byte aligned, `2 * records * 64` bytes (the units'
    /// rings one after the other), read when the units take the enable; each unit's ring must
    /// lie inside one device-writable mapping.
    pub base: u64,
    /// RW: records per unit: a power of two from 1 to [`MAX_ACTIVITY_RECORDS`], read with
    /// `base`.
    pub records: u32,
    /// RW: [`ActivityControl`].
    pub control: u32,
    /// RO: the copy engine's block, then the compute unit's ([`Unit`] order).
    pub units: [ActivityUnitRegs; 2],
}

/// One unit's activity registers ([`ActivityRegs::units`]). Never instantiated.
#[repr(C)]
#[derive(Debug)]
#[allow(dead_code)] // A layout description: the fields are read through `offset_of!` only.
pub struct ActivityUnitRegs {
    /// RO: records the unit has written since it took the enable (free-running; record `n`
    /// is in slot `n % records`). Stored with Release after the record's bytes: a host that
    /// reads `n` (Acquire) sees records `0..n` written, the oldest overwritten once `n`
    /// passes `records`.
    pub written: u64,
    /// RO: [`ActivityStatus`] of the unit.
    pub status: u32,
    /// RO: [`ActivityFault`] code while [`ActivityStatus::FAULT`] is set.
    pub fault: u32,
}

const _: () = {
    assert!(offset_of!(ActivityRegs, base) == 0x00);
    assert!(offset_of!(ActivityRegs, records) == 0x08);
    assert!(offset_of!(ActivityRegs, control) == 0x0c);
    assert!(offset_of!(ActivityRegs, units) == 0x10);
    assert!(offset_of!(ActivityUnitRegs, written) == 0x00);
    assert!(offset_of!(ActivityUnitRegs, status) == 0x08);
    assert!(offset_of!(ActivityUnitRegs, fault) == 0x0c);
    assert!(size_of::<ActivityUnitRegs>() == ACTIVITY_UNIT_STRIDE);
    assert!(size_of::<ActivityRegs>() == 0x30);
    assert!(FAULT_BASE + size_of::<FaultRegs>() <= ACTIVITY_BASE);
    assert!(ACTIVITY_BASE + size_of::<ActivityRegs>() <= REGISTER_BAR_SIZE);
    // Each 64-bit register is 8-aligned (the register file's atomics need it).
    assert!((ACTIVITY_BASE + offset_of!(ActivityRegs, base)) % 8 == 0);
    assert!((ACTIVITY_BASE + offset_of!(ActivityRegs, units)) % 8 == 0);
    assert!(ACTIVITY_UNIT_STRIDE % 8 == 0);
};

/// Bytes between two units' [`ActivityUnitRegs`].
pub const ACTIVITY_UNIT_STRIDE: usize = 0x10;

/// A register of the activity block.
const fn activity<V, A>(offset: usize) -> Field<V, A> {
    Field::new(ACTIVITY_BASE + offset)
}

/// [`ActivityRegs::base`].
pub const ACTIVITY_BUFFER: Field<u64, ReadWrite> = activity(offset_of!(ActivityRegs, base));
/// [`ActivityRegs::records`].
pub const ACTIVITY_RECORDS: Field<u32, ReadWrite> = activity(offset_of!(ActivityRegs, records));
/// [`ActivityRegs::control`].
pub const ACTIVITY_CONTROL: Field<ActivityControl, ReadWrite> =
    activity(offset_of!(ActivityRegs, control));
/// The copy engine's [`ActivityUnitRegs::written`] (see [`activity_field`]).
pub const ACTIVITY_WRITTEN: Field<u64, ReadOnly> =
    activity(offset_of!(ActivityRegs, units) + offset_of!(ActivityUnitRegs, written));
/// The copy engine's [`ActivityUnitRegs::status`] (see [`activity_field`]).
pub const ACTIVITY_STATUS: Field<ActivityStatus, ReadOnly> =
    activity(offset_of!(ActivityRegs, units) + offset_of!(ActivityUnitRegs, status));
/// The copy engine's [`ActivityUnitRegs::fault`] (see [`activity_field`]).
pub const ACTIVITY_FAULT: Field<u32, ReadOnly> =
    activity(offset_of!(ActivityRegs, units) + offset_of!(ActivityUnitRegs, fault));

/// Unit `unit`'s copy of the per-unit activity register `field` (one of
/// [`ACTIVITY_WRITTEN`], [`ACTIVITY_STATUS`], [`ACTIVITY_FAULT`], which are the copy
/// engine's).
pub const fn activity_field<V, A>(field: Field<V, A>, unit: Unit) -> Field<V, A> {
    Field::new(field.offset() + unit as usize * ACTIVITY_UNIT_STRIDE)
}

/// Whether the host may write the register at byte `offset` of BAR 0 (writes elsewhere are
/// dropped, as a device ignores writes to read-only registers).
pub(super) fn host_writable(offset: usize) -> bool {
    match offset {
        o if o == CONTROL.offset() => true,
        o if o == IRQ_MASK_SET.offset() || o == IRQ_MASK_CLEAR.offset() => true,
        // The fault programme and its control, not `applied` nor the counters.
        o if (FAULT_BASE..FAULT_APPLIED.offset()).contains(&o) => true,
        // The activity buffer, its size and its control, not the units' registers.
        o if (ACTIVITY_BASE..ACTIVITY_BASE + offset_of!(ActivityRegs, units)).contains(&o) => true,
        // Both doorbells of every queue.
        o if (DOORBELL_BASE..DOORBELL_BASE + MAX_QUEUES as usize * DOORBELL_STRIDE)
            .contains(&o) =>
        {
            o % 4 == 0
        }
        o if (QUEUE_BASE..QUEUE_BASE + MAX_QUEUES as usize * QUEUE_STRIDE).contains(&o) => {
            let within = (o - QUEUE_BASE) % QUEUE_STRIDE;
            // ring_base (either half), depth, context and control precede status.
            within < offset_of!(QueueRegs, status)
                || within == offset_of!(QueueRegs, unit)
                || (offset_of!(QueueRegs, ws_private)..offset_of!(QueueRegs, sram_hits))
                    .contains(&within)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
