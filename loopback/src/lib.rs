//! The software loopback device: a device with the hardware contract, so code written against
//! it runs unchanged on a real one, and tests and SDK CI need no accelerator.
//!
//! # What it is
//!
//! - **BAR 0, registers** ([`regs`]): identity, device status and reset, interrupt mask and
//!   pending bits, counters, and per queue the ring's IOVA, depth, context, enable/status, fault
//!   code and the SQ tail / CQ head doorbells. It is shared memory reached through an
//!   [`mmio`](userdma::mmio) backend, as a mapped BAR is: reads are loads, writes are stores, and
//!   writes to read-only registers are dropped.
//! - **BAR 2, device memory** (the "NPU DRAM", [`Config::memory_size`] bytes), reached by the
//!   host through [`mmio`](userdma::mmio) (volatile accesses) or [`Loopback::device_memory`].
//! - **Two units that run concurrently** ([`Unit`]): a DMA (copy) engine and a compute unit,
//!   each its own thread (of this process, or of a separate device process: [`Mode`]), each
//!   serving only the queues assigned to it (the queue's `unit` register, set with
//!   [`NpuFormat::unit`] or [`Loopback::open_queue_on`]; the copy engine by default), with its
//!   own modelled clock, its own context-switch tracking and its own counters. A unit reads
//!   descriptors ([`ring::Command`](userdma::ring::Command)) from the SQ in host memory by IOVA, translates every host
//!   address through the device's own table ([`dma::SoftIommu`](userdma::dma::SoftIommu): the device reaches only what
//!   was mapped into [`Device::dma_space`](userdma::device::Device::dma_space)), executes the [`Opcode`] (any opcode runs on either
//!   unit), and writes a [`ring::Status`](userdma::ring::Status) completion whose code is a [`StatusCode`]. Every field is
//!   checked before anything is touched; a malformed descriptor gets an error completion (and
//!   is counted), never a stray access. So copies on a copy queue overlap computes on a
//!   compute queue, as on an NPU; [`Opcode::Wait`] orders a queue after another's
//!   completions. Both units reach device memory through raw pointers; two units touching the
//!   same bytes at the same time is the host's ordering bug (as on hardware), which `Wait`
//!   is there to prevent.
//! - **Interrupts**: one eventfd per queue, signalled when the host armed the ring's interrupt
//!   flag and the vector is not masked (a masked vector is remembered as pending and fires when
//!   unmasked). Queues opened with [`Wait::Poll`] never arm it: pure polling.
//! - **Activity records** ([`activity`]): while the host has them on, each unit writes a
//!   64-byte record of every descriptor it completes (its start and end on the device's
//!   clock, queue, command, context, opcode, status, bytes, whether it switched context, its
//!   SRAM misses) into its ring of a host buffer, as a hardware trace unit does;
//!   [`activity::Log`] owns such a buffer and reads it safely. Off, they cost the units one
//!   predictable branch per descriptor.
//! - **A cost model** ([`Cost`]): DMA bandwidth, per-descriptor overhead, compute rate and a
//!   context-switch penalty, charged per unit on the unit's own clock, with counters of
//!   descriptors, bytes, switches, errors, busy time and interrupts per unit ([`Counters`],
//!   summed over the units, and [`Counters::units`]; also readable as registers), so the
//!   host can compute each unit's utilisation from its busy time.
//!
//! # Register map (BAR 0, 4 KiB)
//!
//! | offset | register | access | meaning |
//! |---|---|---|---|
//! | 0x00 | `id` | RO | `0x424c4455` ("UDLB") |
//! | 0x04 | `version` | RO | 2 (version 1 had the doorbells in the queues' blocks) |
//! | 0x08 | `queues` | RO | queues (= interrupt vectors) |
//! | 0x0c | `status` | RO | bit 0 `READY`: the engine runs |
//! | 0x10 | `control` | WO | bit 0 `RESET`; self-clearing |
//! | 0x14 | `reset_count` | RO | resets completed |
//! | 0x18 | `dma_mask_bits` | RO | the DMA mask width |
//! | 0x1c | `max_depth` | RO | largest queue depth |
//! | 0x20 | `memory_size` | RO, 64 | bytes of device memory (BAR 2) |
//! | 0x28 | `irq_mask` | RO | bit q: vector q masked |
//! | 0x2c | `irq_mask_set` | WO | write 1s to mask |
//! | 0x30 | `irq_mask_clear` | WO | write 1s to unmask (a pending vector fires) |
//! | 0x34 | `irq_pending` | RO | bit q: raised while masked |
//! | 0x38..0x68 | `descriptors`, `bytes`, `context_switches`, `errors`, `busy_ns`, `interrupts` | RO, 64 | the copy engine's counters |
//! | 0x68..0x98 | the same six | RO, 64 | the compute unit's counters (the device's are the sums) |
//! | 0x100 + 0x60·q | queue q's block: | | |
//! | +0x00 | `ring_base` | RW, 64 | IOVA of the ring memory ([`ring::Layout`](userdma::ring::Layout) for `Command`/`Status` at `depth`); 64-byte aligned |
//! | +0x08 | `depth` | RW | entries per ring |
//! | +0x0c | `context` | RW | the context every descriptor must name |
//! | +0x10 | `control` | RW | bit 0 `ENABLE` |
//! | +0x14 | `status` | RO | bit 0 `ENABLED` (acknowledges enable and stop), bit 1 `FAULT` |
//! | +0x18 | reserved | | reads 0 (version 1's doorbells) |
//! | +0x20 | `fault` | RO | a [`Fault`] code |
//! | +0x24 | `unit` | RW | the [`Unit`] serving the queue: 0 copy engine, 1 compute unit (read at enable; others fault it) |
//! | +0x28 | `completed` | RO, 64 | descriptors executed |
//! | +0x30 | `errors` | RO, 64 | error completions |
//! | +0x38 | `ws_private` | RW, 64 | bytes of the context's private working set in device SRAM (read at enable) |
//! | +0x40 | `ws_shared` | RW, 64 | bytes of the working set shared with the queues of the same `share_key` |
//! | +0x48 | `share_key` | RW | the key of `ws_shared` (0: not shared) |
//! | +0x50 | `sram_hits` | RO, 64 | bytes of compute descriptors served from SRAM |
//! | +0x58 | `sram_touched` | RO, 64 | bytes compute descriptors touched with a working set declared |
//! | 0xd00 | `fault_queue` | RW | fault injection ([`fault`]): the queue the registers below program and show |
//! | 0xd04 | `fault_kinds` | RW | bit k: [`fault::Kind`] k may be injected |
//! | 0xd08 | `fault_count` | RW | trigger: the next N descriptors |
//! | 0xd0c | `fault_rate` | RW | trigger: each descriptor with probability rate / 2^32 |
//! | 0xd10 | `fault_seed` | RW, 64 | seed of the trigger's generator |
//! | 0xd18 | `fault_delay_us` | RW | the delay of `Slow` |
//! | 0xd1c | `fault_control` | WO | bit 0 `APPLY` (program `fault_queue`), bit 1 `CLEAR`; self-clearing |
//! | 0xd20 | `fault_applied` | RO | `fault_control` writes acted on |
//! | 0xd28..0xd68 | `fault_injected` | RO, 64 ×8 | faults injected into `fault_queue`: the sum, then kinds 1 to 7 (kept across resets) |
//! | 0xe00 | `activity_buffer` | RW, 64 | activity records ([`activity`]): IOVA of the buffer, 64-byte aligned; unit u's ring of `activity_records` records of 64 bytes at `+ u · records · 64` |
//! | 0xe08 | `activity_records` | RW | records per unit: a power of two, 1 to 2^20 |
//! | 0xe0c | `activity_control` | RW | bit 0 `ENABLE` (read with the two above when the units take it) |
//! | 0xe10 + 0x10·u | `activity_written` | RO, 64 | records unit u wrote since it took the enable (record n in slot n mod records), stored with Release after the record's bytes and before the descriptor's completion |
//! | 0xe18 + 0x10·u | `activity_status` | RO | unit u: bit 0 `ENABLED` (acknowledges enable and stop), bit 1 `FAULT` |
//! | 0xe1c + 0x10·u | `activity_fault` | RO | an [`ActivityFault`](regs::ActivityFault) code while `FAULT` is set |
//! | 0xf00 + 8·q | `sq_tail` | WO | queue q's SQ tail doorbell |
//! | 0xf04 + 8·q | `cq_head` | WO | queue q's CQ head doorbell |
//!
//! The doorbells have a block of their own, apart from the queues' blocks: the host writes them
//! on every submission and reap, and the device writes a queue's `completed` on every
//! descriptor; in one cache line, each doorbell would take the line from the device's core
//! and its next count take it back.
//!
//! Bringing a queue up: write `ring_base`, `depth`, `context`, `unit`, then `control = ENABLE`; the
//! device answers `status = ENABLED`, or `FAULT` with a code. Stopping it: `control = 0`; once
//! `status` reads 0 the device touches none of the queue's memory again (this is the
//! [`ring::Quiesce`](userdma::ring::Quiesce) hook). [`Loopback::open_queue`] does both for a [`ring::Queue`](userdma::ring::Queue).
//!
//! # Opcodes
//!
//! See [`Opcode`]: `Nop`, `ToDevice` (host → device memory), `ToHost` (device memory → host),
//! `DeviceCopy`, `Fill`, `Compute` (per 32-bit word `(w ^ args[0]) + args[1]`, result the
//! sum of the words written), the deterministic transform tests use to see data pass through
//! the device, and `Wait` (until another queue's completed counter reaches a target: the
//! queue holding it serves nothing after it meanwhile, every other queue goes on, and the
//! data the other queue's unit wrote before those completions is visible after it).
//! Two opcodes let a model run on the device layer by layer, deterministic and checkable on
//! the host: `Layer` (one output tensor mixed from up to three input tensors) and `Compact`
//! (the records whose score passes a threshold, packed); [`reference`](mod@reference)
//! computes on the host exactly what they and `Compute` write. Status codes and the order in
//! which fields are checked: [`StatusCode`].
//!
//! # Waking the engine
//!
//! A unit never polls when idle: after `idle_spin` without work it sleeps on its own futex in
//! the register file, and every host register write that concerns it (a doorbell of one of its
//! queues, any control write) bumps its counter there and wakes it only if it sleeps (the
//! handshake is in `bar.rs`). A busy unit costs the host no system call per doorbell. While it
//! spins it looks at that counter after every pause and yields its core now and then, so a
//! host thread sharing the core is not starved. A unit whose queue holds an unsatisfied `Wait`
//! idles the same way; the other unit wakes it when it completes descriptors.
//!
//! # What a descriptor costs the engine
//!
//! With [`Cost::zero`], a descriptor is: the checks, one translation (the engine keeps the
//! mapping it resolved last and looks again only when the table changed, so a run of
//! descriptors into one mapping takes no lock), the copy itself (`ptr::copy_nonoverlapping`
//! between the translated host address and device memory, what a DMA engine does), plain
//! stores of the counters and the completion, and a peek at the interrupt flag; the clock is
//! read at the two ends of a burst (the busy counter grows once per burst; with a cost model,
//! which must time each descriptor, once per descriptor) and the `fence(SeqCst)` of the
//! interrupt handshake is paid once per burst. The next entry's cache lines are prefetched
//! while one executes, and the word the engine checks for control writes after every
//! descriptor sits on a cache line of its own, away from the one every doorbell bumps.
//!
//! [`Config::engine_cpu`] pins the engine (both units' threads, or the device process) to one
//! CPU.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use userdma_loopback::{Config, Cost, Descriptor, Loopback, Wait};
//! use userdma::device::Device;
//! use userdma::dma::DeviceOffset;
//! use userdma::memory::PageSize;
//! use userdma::ring;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Arc::new(Loopback::new(Config::default().cost(Cost::zero()))?);
//! let host = userdma::runtime::map_memory(device.dma_space().as_ref(), 64 << 10, PageSize::Base)?;
//! host.slice().write_from(0, b"hello, device")?;
//!
//! let mut queue = device.open_queue::<()>(ring::Config::new(64), Wait::Interrupt)?;
//! let iova = host.iova(0).expect("mapped");
//! let to_device = Descriptor::to_device(iova, DeviceOffset(0x100), 13).build();
//! queue.submit(to_device, ())?;
//! let done = queue.wait(Some(Duration::from_secs(5)))?;
//! assert!(done.entry.is_success());
//! let mut back = [0u8; 13];
//! device.device_memory().read_into(0x100, &mut back)?;
//! assert_eq!(&back, b"hello, device");
//! # Ok(())
//! # }
//! ```

#[cfg(not(loom))]
pub mod activity;
#[cfg(not(loom))]
mod bar;
#[cfg(not(loom))]
mod config;
#[cfg(not(loom))]
mod cost;
#[cfg(not(loom))]
mod descriptor;
#[cfg(not(loom))]
mod engine;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
pub mod fault;
#[cfg(not(loom))]
mod ops;
#[cfg(not(loom))]
mod process;
#[cfg(not(loom))]
pub mod reference;
#[cfg(not(loom))]
pub mod regs;
#[cfg(not(loom))]
mod shim;
#[cfg(not(loom))]
mod sram;
#[cfg(all(feature = "tracing", not(loom)))]
mod traced;

#[cfg(not(loom))]
pub use self::config::{Config, Counters, Mode, QueueCounters, UnitCounters};
#[cfg(not(loom))]
pub use self::cost::{Cost, Work};
#[cfg(not(loom))]
pub use self::descriptor::{BuildError, Descriptor, LoopbackStatus};
#[cfg(not(loom))]
pub use self::error::Error;
#[cfg(not(loom))]
pub use self::process::{serve_process, Program, SOCKET_ENV};
#[cfg(not(loom))]
pub use self::regs::{Fault, Opcode, StatusCode, Unit};
#[cfg(not(loom))]
pub use userdma::device::Wait;
#[cfg(not(loom))]
mod npu;

/// `n` as a `u64` (lossless: `usize` is at most 64 bits on every target this builds for).
#[cfg(not(loom))]
pub(crate) const fn u64_of(n: usize) -> u64 {
    n as u64
}

#[cfg(not(loom))]
mod runtime;
mod sync;
// A `--cfg loom` build leaves out the register file and the engine that use the handshakes:
// only their loom models (tests) need them there.
#[cfg(any(not(loom), test))]
mod wake;

#[cfg(not(loom))]
pub use self::npu::{Loopback, NpuFormat, Queue};
#[cfg(not(loom))]
pub use self::runtime::LoopbackRuntime;

/// A loopback device's failure as the driver's device error ([`userdma::device::Error::Backend`],
/// with the code [`Error::code`] gives), so `?` turns one into the other.
#[cfg(not(loom))]
impl From<Error> for userdma::device::Error {
    fn from(e: Error) -> userdma::device::Error {
        userdma::device::Error::Backend(userdma::device::Backend::new(e.code(), e))
    }
}

/// A loopback device's failure as the driver's error (through
/// [`userdma::device::Error::Backend`]).
#[cfg(not(loom))]
impl From<Error> for userdma::Error {
    fn from(e: Error) -> userdma::Error {
        userdma::Error::Device(e.into())
    }
}
