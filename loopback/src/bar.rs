//! The loopback device's BARs as memory: the register file (BAR 0) in a small shared memfd that
//! host and engine (thread or process) both map, with the doorbell wake-up protocol, and the
//! device memory (BAR 2) in another. Both are reached by the host through [`mmio`] backends,
//! as real BARs are.
//!
//! # The wake-up protocol
//!
//! After the register BAR, the register file holds a private page the host cannot reach through
//! the BAR: `WAKE_SEQ` (a counter), `SLEEPING` (a flag), `SHUTDOWN`, and `CONTROL_SEQ` (bumped,
//! before the wake-up, by every host write that is not a doorbell, so the engine re-reads its
//! control registers only when one changed). Every host write to a writable register is
//! followed by `WAKE_SEQ.fetch_add(1, SeqCst)` and, if `SLEEPING` reads 1,
//! a `FUTEX_WAKE` on `WAKE_SEQ`. An idle engine stores `SLEEPING = 1` (SeqCst), reads `WAKE_SEQ`
//! once more (SeqCst) and, if it did not move, sleeps with `FUTEX_WAIT(WAKE_SEQ, seen)`. The two
//! SeqCst pairs form a Dekker handshake — either the host sees `SLEEPING` and wakes the engine,
//! or the engine sees the new `WAKE_SEQ` and does not sleep — and `FUTEX_WAIT` itself re-checks
//! the value in the kernel, so no doorbell is lost, and a host that rings while the engine is
//! busy makes no system call. The futex is shared (not `_PRIVATE`), so it works across
//! processes mapping the same memfd. The handshake's steps are [`wake::Words`], which loom
//! checks (`src/wake/loom_tests.rs`); [`RegisterFile::notify`] and [`RegisterFile::sleep`] run
//! them on the register file's words.
//!
//! The device has two units ([`Unit`]), each its own thread, and each has its own `WAKE_SEQ`
//! and `SLEEPING` pair (the copy engine's at the start of the page, the compute unit's on a
//! cache line of its own), so each sleeps on its own futex. A doorbell wakes only the unit that
//! serves its queue: the unit that starts a queue records itself in the queue's `OWNER` word
//! (before it acknowledges the enable, so every doorbell the host rings after seeing
//! `ENABLED` finds it); every other host write (control registers, enables, masks) and a
//! shutdown wake both. A unit that completes descriptors another unit's `Wait` is waiting for
//! wakes that unit the same way ([`RegisterFile::notify`]), so the waiting unit can sleep.

use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::Arc;

use super::regs::{self, host_writable, Unit, REGISTER_BAR_SIZE};
use super::shim;
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::wake::{self, Futex};
use crate::Error as LoopbackError;
use userdma::device::Error;
use userdma::memory::{Backing, PageSize, Region};
use userdma::mmio::{self, Direct, Width};

/// Offset of the private page (after the BAR).
const PRIVATE: usize = REGISTER_BAR_SIZE;
/// The copy engine's wake-up words: host writes so far (the futex word), then `SLEEPING` (1
/// while the unit sleeps or is about to) 4 bytes after it; the compute unit's pair is
/// `UNIT_WAKE_STRIDE` bytes further.
const WAKE_SEQ: usize = PRIVATE;
/// `SLEEPING` is this far after its unit's `WAKE_SEQ`.
const SLEEPING: usize = 4;
/// Bytes between two units' wake-up words (the compute unit's on a cache line of its own).
const UNIT_WAKE_STRIDE: usize = 128;
/// Queue `q`'s `OWNER` word (the [`Unit`] serving it, as its raw value) is at `OWNER + 4 * q`.
const OWNER: usize = PRIVATE + 256;
/// 1 once the engine must stop.
const SHUTDOWN: usize = PRIVATE + 8;
/// 1 once the device was removed ([`Loopback::remove`](super::Loopback::remove)): the host's
/// BARs then read all-ones and drop writes, as a PCIe device's do once it is gone.
const REMOVED: usize = PRIVATE + 12;
/// Host writes to registers other than the doorbells so far. On a cache line of its own: the
/// engine reads it after every descriptor, and the host bumps `WAKE_SEQ` on every doorbell.
const CONTROL_SEQ: usize = PRIVATE + 64;
/// Queue `q`'s injected-fault counters (eight u64: the sum, then kind 1 to 7) are at
/// `INJECTED + INJECTED_STRIDE * q`; the host sees the selected queue's through the
/// `fault_injected` window of the BAR ([`regs::FaultRegs`]).
const INJECTED: usize = PRIVATE + 0x800;
/// Bytes of one queue's injected-fault counters.
const INJECTED_STRIDE: usize = 64;
/// Bytes of the register file: the BAR and the private page.
const FILE_LEN: usize = 2 * REGISTER_BAR_SIZE;

const _: () = {
    assert!(WAKE_SEQ + UNIT_WAKE_STRIDE + SLEEPING < OWNER);
    assert!(OWNER + 4 * regs::MAX_QUEUES as usize <= INJECTED);
    assert!(INJECTED + INJECTED_STRIDE * regs::MAX_QUEUES as usize <= FILE_LEN);
    assert!(INJECTED_STRIDE == 8 * 8);
};

/// Bytes of a region of `len` bytes of base pages (rounded up to the page size).
pub(super) fn base_pages(len: usize) -> Option<usize> {
    let page = PageSize::Base.bytes();
    len.checked_next_multiple_of(page)
}

/// A shared, memfd-backed region of `len` base pages, unlocked (the device's own memory is not
/// DMA memory: it needs no pinning, and locking it would count against RLIMIT_MEMLOCK), bound to
/// NUMA node `node` when there is one.
pub(super) fn shared_region(
    what: &'static str,
    len: usize,
    node: Option<u32>,
) -> Result<Region, Error> {
    let len = base_pages(len).ok_or(LoopbackError::Config {
        field: what,
        value: len as u64,
        expected: "a size that rounds up to whole pages",
    })?;
    Region::builder(len)
        .page_size(PageSize::Base)
        .memfd()
        .lock(false)
        .node(node)
        .build()
        .map_err(|source| Error::Memory { what, len, source })
}

/// Maps `len` bytes of a memfd a peer passed (`page_size` pages), unlocked.
pub(super) fn map_fd(
    what: &'static str,
    fd: OwnedFd,
    len: usize,
    page_size: PageSize,
) -> Result<Region, Error> {
    Region::builder(len)
        .page_size(page_size)
        .backing(Backing::Fd(fd))
        .lock(false)
        .build()
        .map_err(|source| Error::Memory { what, len, source })
}

/// The register file: BAR 0 and the private page, in shared memory accessed only atomically.
#[derive(Debug)]
pub(super) struct RegisterFile {
    region: Region,
}

impl RegisterFile {
    /// A zeroed register file in a new memfd.
    pub(super) fn new() -> Result<RegisterFile, Error> {
        Ok(RegisterFile {
            region: shared_region("register file", FILE_LEN, None)?,
        })
    }

    /// The register file a parent created, from its memfd (in the device process).
    pub(super) fn from_fd(fd: OwnedFd) -> Result<RegisterFile, Error> {
        let len = base_pages(FILE_LEN).unwrap_or(FILE_LEN);
        Ok(RegisterFile {
            region: map_fd("register file", fd, len, PageSize::Base)?,
        })
    }

    /// The memfd, to pass to the device process.
    pub(super) fn region(&self) -> &Region {
        &self.region
    }

    /// A pointer to byte `offset`, which must be inside the file and aligned to `align`.
    fn at(&self, offset: usize, align: usize) -> NonNull<u8> {
        assert!(
            offset % align == 0 && offset + align <= FILE_LEN,
            "register file access at {offset:#x}"
        );
        // SAFETY: `offset + align <= FILE_LEN <= region.len()`: inside the mapping.
        unsafe { self.region.as_ptr().add(offset) }
    }

    /// The 32-bit word at `offset` (4-aligned, inside the file) as an atomic.
    pub(super) fn u32(&self, offset: usize) -> &AtomicU32 {
        let ptr = self.at(offset, 4);
        // SAFETY: the word is inside the mapping (checked by `at`), 4-aligned (the region is
        // page-aligned, `offset` a multiple of 4), and stays mapped while `self` is borrowed.
        // Every access to the register file, in this process and the device process, is atomic
        // (this type is its only accessor), so a shared atomic reference is sound.
        unsafe { AtomicU32::from_ptr(ptr.as_ptr().cast()) }
    }

    /// The 64-bit word at `offset` (8-aligned, inside the file) as an atomic.
    pub(super) fn u64(&self, offset: usize) -> &AtomicU64 {
        let ptr = self.at(offset, 8);
        // SAFETY: as in `u32`, for an 8-aligned 64-bit word. Mixed-width atomic accesses to the
        // same bytes (a 64-bit register written as two 32-bit halves) are what a 32-bit bus
        // does; x86-64 and aarch64 keep each access single-copy atomic.
        unsafe { AtomicU64::from_ptr(ptr.as_ptr().cast()) }
    }

    /// Engine: reads a 32-bit register.
    pub(super) fn get32(&self, offset: usize) -> u32 {
        // Acquire: pairs with the host's Release store of the register (MMIO ordering: what the
        // host wrote before it, e.g. ring memory, is visible after).
        self.u32(offset).load(Ordering::Acquire)
    }

    /// Engine: writes a 32-bit register.
    pub(super) fn set32(&self, offset: usize, value: u32) {
        // Release: what the engine wrote before (completions, counters) is visible to a host
        // that reads this register (pairs with the Acquire in `HostBar::read`).
        self.u32(offset).store(value, Ordering::Release);
    }

    /// Engine: reads a 64-bit register.
    pub(super) fn get64(&self, offset: usize) -> u64 {
        // Acquire: as in `get32`.
        self.u64(offset).load(Ordering::Acquire)
    }

    /// Engine: writes a 64-bit register.
    pub(super) fn set64(&self, offset: usize, value: u64) {
        // Release: as in `set32`.
        self.u64(offset).store(value, Ordering::Release);
    }

    /// `unit`'s wake-up counter (host writes that concern it, and completions it waits for).
    pub(super) fn wake_seq(&self, unit: Unit) -> &AtomicU32 {
        self.u32(WAKE_SEQ + unit as usize * UNIT_WAKE_STRIDE)
    }

    /// `unit`'s sleeping flag.
    fn sleeping(&self, unit: Unit) -> &AtomicU32 {
        self.u32(WAKE_SEQ + unit as usize * UNIT_WAKE_STRIDE + SLEEPING)
    }

    /// Engine: records that `unit` serves queue `q` (`q < MAX_QUEUES`), so its doorbells wake it.
    pub(super) fn set_owner(&self, q: usize, unit: Unit) {
        // Release: stored before the queue's ENABLED status (also Release); a host that saw
        // ENABLED (Acquire) and rings reads this owner or a later one in `owner`.
        self.u32(OWNER + 4 * q)
            .store(unit as u32, Ordering::Release);
    }

    /// The unit serving queue `q` (`q < MAX_QUEUES`), the copy engine if none recorded.
    fn owner(&self, q: usize) -> Unit {
        // Acquire: pairs with the Release store in `set_owner`.
        Unit::from_raw(self.u32(OWNER + 4 * q).load(Ordering::Acquire)).unwrap_or(Unit::Copy)
    }

    /// Engine: counts one fault of raw kind `kind` (1 to 7) injected into queue `q`
    /// (`q < MAX_QUEUES`).
    pub(super) fn count_injected(&self, q: usize, kind: u32) {
        for slot in [0, kind as usize] {
            // Release: the count is published before the completion (or the silence) the
            // fault made, so a host that saw that effect and then reads the counter (Acquire,
            // through the window) finds the fault counted. Only the unit serving the queue
            // counts into it; the read-modify-write keeps the count whole even so.
            self.u64(INJECTED + INJECTED_STRIDE * q + 8 * slot)
                .fetch_add(1, Ordering::Release);
        }
    }

    /// Host writes to registers other than the doorbells (the engine re-reads its control
    /// registers when this moves).
    pub(super) fn control_seq(&self) -> &AtomicU32 {
        self.u32(CONTROL_SEQ)
    }

    /// Host: tells the engine a control register (not a doorbell) changed, and wakes both
    /// units.
    pub(super) fn notify_control(&self) {
        // Release: pairs with the units' Acquire loads of CONTROL_SEQ; the register written
        // before is visible once the new count is.
        self.control_seq().fetch_add(1, Ordering::Release);
        self.notify_all();
    }

    /// Wakes both units.
    pub(super) fn notify_all(&self) {
        for unit in Unit::ALL {
            self.notify(unit);
        }
    }

    /// `unit`'s wake-up words (`WAKE_SEQ` and `SLEEPING`).
    fn words(&self, unit: Unit) -> wake::Words<'_> {
        wake::Words::new(self.wake_seq(unit), self.sleeping(unit))
    }

    /// Tells `unit` something changed (a host register write, or a completion it may wait
    /// for), waking it if it sleeps: the waker's half of the handshake ([`wake::Words::notify`],
    /// where its orderings are explained; see the module docs).
    pub(super) fn notify(&self, unit: Unit) {
        self.words(unit).notify(&SharedFutex);
    }

    /// Engine: `unit` sleeps until a write for it after `seen` (or a shutdown), unless one
    /// happened: the sleeper's half of the handshake ([`wake::Words::sleep`]). Only `unit`'s
    /// own thread calls this, so its flag has one writer.
    pub(super) fn sleep(&self, unit: Unit, seen: u32) {
        self.words(unit)
            .sleep(seen, || self.shutting_down(), &SharedFutex);
    }

    /// Asks the engine to stop, waking both units.
    pub(super) fn request_shutdown(&self) {
        // Release: nothing is published by it, but the units' Acquire loads then see every
        // register write made before the shutdown (they stop after them).
        self.u32(SHUTDOWN).store(1, Ordering::Release);
        // A unit in the middle of a burst ends it after the descriptor it is executing, as it
        // does for any control write: without this a burst of modelled descriptors (tens of
        // milliseconds each) ran to its end before the unit looked at SHUTDOWN, so a removal
        // or a reset let the device finish work the host was about to be told was lost.
        // Release: as `notify_control`.
        self.control_seq().fetch_add(1, Ordering::Release);
        self.notify_all();
    }

    /// Marks the device removed (after its engine stopped): the host's BARs read all-ones
    /// from now on and drop writes.
    pub(super) fn set_removed(&self) {
        // Release: pairs with the Acquire load in `removed`; nothing else is published.
        self.u32(REMOVED).store(1, Ordering::Release);
    }

    /// Whether the device was removed.
    pub(super) fn removed(&self) -> bool {
        // Acquire: pairs with the Release store in `set_removed`.
        self.u32(REMOVED).load(Ordering::Acquire) != 0
    }

    /// Whether the engine must stop.
    pub(super) fn shutting_down(&self) -> bool {
        // Acquire: pairs with the Release store in `request_shutdown`.
        self.u32(SHUTDOWN).load(Ordering::Acquire) != 0
    }
}

/// The kernel's futex on words of the register file: shared (not `_PRIVATE`), since the device
/// process maps the same memfd; no timeout.
#[derive(Debug, Clone, Copy)]
struct SharedFutex;

impl Futex for SharedFutex {
    fn wait(&self, word: &AtomicU32, expected: u32) {
        shim::futex_wait(word, expected, None);
    }

    fn wake(&self, word: &AtomicU32) {
        shim::futex_wake(word);
    }
}

/// Reads a register of `width` at `offset` of the BAR (already bounds- and alignment-checked).
fn read(file: &RegisterFile, offset: usize, width: Width) -> u64 {
    match width {
        Width::U64 => file.get64(offset),
        Width::U32 => u64::from(file.get32(offset)),
        Width::U8 | Width::U16 => {
            let word = file.get32(offset & !3);
            (u64::from(word) >> shift(offset, width)) & width.max()
        }
    }
}

/// The shift, in its containing word, of the `width`-byte register at byte `offset`.
fn shift(offset: usize, width: Width) -> u32 {
    let byte = (offset % 4) as u32;
    if cfg!(target_endian = "little") {
        8 * byte
    } else {
        8 * (4 - byte - width.bytes() as u32)
    }
}

/// Writes a register of `width` at `offset` (already checked), as one atomic access; sub-word
/// writes merge into their word with a compare-exchange.
fn write(file: &RegisterFile, offset: usize, width: Width, value: u64) {
    match width {
        Width::U64 => file.set64(offset, value),
        // Truncation to the register width on purpose.
        Width::U32 => file.set32(offset, value as u32),
        Width::U8 | Width::U16 => {
            let shift = shift(offset, width);
            let mask = (width.max() as u32) << shift;
            let bits = ((value & width.max()) as u32) << shift;
            // AcqRel on success: Release as for a store, Acquire as for a load (it is both);
            // Relaxed on failure: the value is only the next guess.
            let _ =
                file.u32(offset & !3)
                    .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |word| {
                        Some((word & !mask) | bits)
                    });
        }
    }
}

/// The host's view of BAR 0: reads are atomic loads; writes to registers the host may write are
/// atomic stores followed by the engine wake-up, `irq_mask_set` / `irq_mask_clear` set and clear
/// bits of `irq_mask`, and writes to read-only registers are dropped, as a device drops them.
#[derive(Clone, Debug)]
pub(super) struct HostBar {
    file: Arc<RegisterFile>,
}

impl HostBar {
    pub(super) fn new(file: Arc<RegisterFile>) -> HostBar {
        HostBar { file }
    }
}

/// Whether `offset` is a doorbell (SQ tail or CQ head).
fn is_doorbell(offset: usize) -> bool {
    let start = regs::DOORBELL_BASE;
    let end = start + usize::from(regs::MAX_QUEUES) * regs::DOORBELL_STRIDE;
    (start..end).contains(&offset) && offset % 4 == 0
}

impl mmio::Backend for HostBar {
    fn len(&self) -> usize {
        REGISTER_BAR_SIZE
    }

    fn read(&self, offset: usize, width: Width) -> Result<u64, mmio::Error> {
        mmio::check(offset, width, REGISTER_BAR_SIZE)?;
        if self.file.removed() {
            return Ok(width.max());
        }
        let window = regs::FAULT_INJECTED.offset();
        if (window..window + INJECTED_STRIDE).contains(&offset) {
            // The selected queue's counters (none past the last queue: zeros).
            let q = self.file.get32(regs::FAULT_QUEUE.offset()) as usize;
            if q >= usize::from(regs::MAX_QUEUES) {
                return Ok(0);
            }
            let at = INJECTED + INJECTED_STRIDE * q + (offset - window);
            return Ok(read(&self.file, at, width));
        }
        Ok(read(&self.file, offset, width))
    }

    fn write(&self, offset: usize, width: Width, value: u64) -> Result<(), mmio::Error> {
        mmio::check(offset, width, REGISTER_BAR_SIZE)?;
        if !host_writable(offset) || self.file.removed() {
            return Ok(());
        }
        let mask_set = regs::IRQ_MASK_SET.offset();
        let mask_clear = regs::IRQ_MASK_CLEAR.offset();
        let mask = self.file.u32(regs::IRQ_MASK.offset());
        // Truncation: the mask registers are 32 bits wide.
        let bits = (value & width.max()) as u32;
        match offset {
            // AcqRel: a read-modify-write of a register (Release as for a store, Acquire as
            // for a load).
            o if o == mask_set && width == Width::U32 => {
                mask.fetch_or(bits, Ordering::AcqRel);
            }
            o if o == mask_clear && width == Width::U32 => {
                mask.fetch_and(!bits, Ordering::AcqRel);
            }
            o if o == mask_set || o == mask_clear => return Ok(()),
            o if is_doorbell(o) => {
                write(&self.file, o, width, value);
                // A doorbell only wakes the unit serving its queue; it does not make it re-read
                // its control registers (nor end a burst).
                let q = (o - regs::DOORBELL_BASE) / regs::DOORBELL_STRIDE;
                self.file.notify(self.file.owner(q));
                return Ok(());
            }
            o => write(&self.file, o, width, value),
        }
        self.file.notify_control();
        Ok(())
    }
}

/// The engine's view of BAR 0 (for the ring's `DeviceQueue`, which reads the doorbells): plain
/// atomic accesses, no filtering, no wake-up.
#[derive(Clone, Debug)]
pub(super) struct DeviceBar {
    file: Arc<RegisterFile>,
}

impl DeviceBar {
    pub(super) fn new(file: Arc<RegisterFile>) -> DeviceBar {
        DeviceBar { file }
    }
}

impl mmio::Backend for DeviceBar {
    fn len(&self) -> usize {
        REGISTER_BAR_SIZE
    }

    fn read(&self, offset: usize, width: Width) -> Result<u64, mmio::Error> {
        mmio::check(offset, width, REGISTER_BAR_SIZE)?;
        Ok(read(&self.file, offset, width))
    }

    fn write(&self, offset: usize, width: Width, value: u64) -> Result<(), mmio::Error> {
        mmio::check(offset, width, REGISTER_BAR_SIZE)?;
        write(&self.file, offset, width, value);
        Ok(())
    }
}

/// BAR 2, the device memory, as the host reaches it: volatile accesses of exactly the register
/// width ([`Direct`]) to the shared memfd the engine reads and writes. Holds the mapping.
#[derive(Clone, Debug)]
pub(super) struct MemoryBar {
    direct: Direct,
    /// Whether the device was removed (all-ones, writes dropped).
    file: Arc<RegisterFile>,
    _region: Arc<Region>,
}

impl MemoryBar {
    pub(super) fn new(region: Arc<Region>, file: Arc<RegisterFile>) -> Result<MemoryBar, Error> {
        // SAFETY: the region's mapping is readable and writable and stays mapped while this
        // value (which holds the region) or any clone lives; nothing makes references to device
        // memory: the engine uses raw-pointer copies, the host this backend and volatile slices.
        let direct = unsafe { Direct::new(region.as_ptr(), region.len()) }
            .map_err(|source| Error::Register { offset: 0, source })?;
        Ok(MemoryBar {
            direct,
            file,
            _region: region,
        })
    }
}

impl mmio::Backend for MemoryBar {
    fn len(&self) -> usize {
        self.direct.len()
    }

    fn read(&self, offset: usize, width: Width) -> Result<u64, mmio::Error> {
        let value = self.direct.read(offset, width)?;
        Ok(if self.file.removed() {
            width.max()
        } else {
            value
        })
    }

    fn write(&self, offset: usize, width: Width, value: u64) -> Result<(), mmio::Error> {
        if self.file.removed() {
            // Bounds are still checked: a bad offset is the caller's bug, removed or not.
            return self.direct.read(offset, width).map(|_| ());
        }
        self.direct.write(offset, width, value)
    }
}

#[cfg(test)]
mod tests;
