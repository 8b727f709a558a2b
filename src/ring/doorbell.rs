//! A queue pair's doorbells in the register BAR: [`Doorbells`] (the two registers, with a
//! plain-memory fast path and the release fences that order the rings' memory before them) and
//! [`DoorbellValue`] (what a doorbell write carries).

use super::index;
use super::Error;
use crate::mmio::{self, DynBlock, RawRegister};
use crate::sync::{fence, Ordering};

/// What the host writes into the doorbells (set with
/// [`Config::with_doorbell`](super::Config::with_doorbell)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DoorbellValue {
    /// The free-running 32-bit counter: the SQ tail doorbell carries the number of entries ever
    /// written, the CQ head doorbell the number ever consumed (both wrap at 2^32). A full SQ
    /// (`depth` entries) is told apart from an empty one. The loopback device's format.
    #[default]
    Counter,
    /// The counter modulo the depth: a slot index `0..depth` (NVMe's SQ tail and CQ head
    /// doorbells). Since a slot cannot tell a full ring from an empty one, the host keeps at
    /// most `depth - 1` entries in the SQ, and the device must keep at most `depth - 1` in the
    /// CQ (NVMe's rule for both). The queue writes the doorbells only when it has something to
    /// announce: a device's doorbells start at 0 when it creates the queue.
    Slot,
}

impl DoorbellValue {
    /// The value written for `counter` on a ring of `depth` entries (a power of two).
    #[inline]
    pub(crate) fn encode(self, counter: u32, depth: u32) -> u32 {
        match self {
            DoorbellValue::Counter => counter,
            DoorbellValue::Slot => index::slot(counter, depth),
        }
    }

    /// Slots kept empty on a ring announced with this value (see [`DoorbellValue::Slot`]).
    #[inline]
    pub(crate) fn reserve(self) -> u32 {
        match self {
            DoorbellValue::Counter => 0,
            DoorbellValue::Slot => 1,
        }
    }
}

/// A queue pair's two doorbell registers, 32 bits each, in a register block: the SQ tail (the
/// host writes the counter of its next submission entry) and the CQ head (the host writes the
/// counter of its next completion entry). The device reads both. Cheap to clone.
///
/// When the block's backend serves a doorbell by plain memory (a mapped BAR,
/// [`mmio::Direct`]; shared memory, [`mmio::Shared`]), its [`RawRegister`] is resolved once, in
/// [`Doorbells::new`], and each ring is one store (a read one load): no bounds check and no
/// call through the backend. Other backends ([`mmio::FileBacked`], [`mmio::Recording`]) get
/// every access through [`mmio::Block`], as before.
#[derive(Clone, Debug)]
pub struct Doorbells {
    /// Keeps the registers alive: `sq` and `cq` are valid while the backend is.
    block: DynBlock,
    sq_tail: usize,
    cq_head: usize,
    /// The SQ tail doorbell, if the backend serves it by one memory access.
    sq: Option<RawRegister>,
    /// The CQ head doorbell, if the backend serves it by one memory access.
    cq: Option<RawRegister>,
}

impl Doorbells {
    /// The doorbells at `sq_tail` and `cq_head` in `block`: two distinct, 4-aligned 32-bit
    /// registers inside it.
    pub fn new(block: DynBlock, sq_tail: usize, cq_head: usize) -> Result<Doorbells, Error> {
        let mut raw = [None, None];
        for (offset, raw) in [sq_tail, cq_head].into_iter().zip(&mut raw) {
            mmio::check(offset, mmio::Width::U32, block.len())
                .and_then(|()| {
                    if (block.base() + offset) % 4 == 0 {
                        Ok(())
                    } else {
                        Err(mmio::Error::Misaligned {
                            offset,
                            width: mmio::Width::U32,
                        })
                    }
                })
                .and_then(|()| block.raw_register(offset, mmio::Width::U32))
                .map(|register| *raw = register.filter(is_doorbell))
                .map_err(|source| Error::DoorbellOffset { offset, source })?;
        }
        if sq_tail == cq_head {
            return Err(Error::SameDoorbell { offset: sq_tail });
        }
        let [sq, cq] = raw;
        Ok(Doorbells {
            block,
            sq_tail,
            cq_head,
            sq,
            cq,
        })
    }

    /// The register block.
    pub fn block(&self) -> &DynBlock {
        &self.block
    }

    /// The SQ tail doorbell's offset in the block.
    pub fn sq_tail_offset(&self) -> usize {
        self.sq_tail
    }

    /// The CQ head doorbell's offset in the block.
    pub fn cq_head_offset(&self) -> usize {
        self.cq_head
    }

    /// Host: announces SQ entries up to `tail`.
    #[inline]
    pub(crate) fn ring_sq(&self, queue: u16, tail: u32) -> Result<(), Error> {
        // Release: every SQ entry the host wrote before this doorbell is visible to a device that
        // sees the new tail (pairs with the fence(Acquire) in `DeviceQueue::fetch`). On x86-64
        // this is a compiler barrier only: stores are not reordered with stores, and a BAR
        // mapped uncached drains them in order, so the entries (write-back memory, coherent DMA)
        // reach the device before the doorbell does; no sfence is needed unless the BAR is
        // write-combining. On aarch64 a `dmb ishst` is not enough for a device: see below.
        fence(Ordering::Release);
        #[cfg(all(target_arch = "aarch64", not(loom)))]
        dma_write_barrier();
        if let Some(register) = &self.sq {
            // SAFETY: `new` took it from `self.block`'s backend for a 32-bit register, and
            // `self.block` (holding that backend) lives as long as `self`.
            unsafe { register.write_u32(tail) };
            return Ok(());
        }
        self.write_block(self.sq_tail, tail, queue, "SQ tail")
    }

    /// Host: tells the device the CQ entries before `head` were consumed.
    #[inline]
    pub(crate) fn ring_cq(&self, queue: u16, head: u32) -> Result<(), Error> {
        // Release: the host's reads of the consumed entries come before the device can see the
        // slots as free and overwrite them (pairs with the fence(Acquire) in
        // `DeviceQueue::cq_room`).
        fence(Ordering::Release);
        if let Some(register) = &self.cq {
            // SAFETY: as in `ring_sq`: a 32-bit register of `self.block`, which lives.
            unsafe { register.write_u32(head) };
            return Ok(());
        }
        self.write_block(self.cq_head, head, queue, "CQ head")
    }

    /// A doorbell write through the block's backend (a register not served by plain memory:
    /// a `pwrite` on a VFIO region, say). Out of line and cold: the hot paths ring registers
    /// by a plain store, and keeping this call out of them keeps their loops' registers free.
    #[cold]
    #[inline(never)]
    fn write_block(
        &self,
        offset: usize,
        value: u32,
        queue: u16,
        which: &'static str,
    ) -> Result<(), Error> {
        self.block
            .write::<u32>(offset, value)
            .map_err(|source| Error::Doorbell {
                queue,
                which,
                source,
            })
    }

    /// A doorbell read through the block's backend (see [`Doorbells::write_block`]).
    #[cold]
    #[inline(never)]
    fn read_block(&self, offset: usize, queue: u16, which: &'static str) -> Result<u32, Error> {
        self.block
            .read::<u32>(offset)
            .map_err(|source| Error::Doorbell {
                queue,
                which,
                source,
            })
    }

    /// Device: the SQ tail the host announced.
    #[inline]
    pub(crate) fn read_sq_tail(&self, queue: u16) -> Result<u32, Error> {
        if let Some(register) = &self.sq {
            // SAFETY: as in `ring_sq`: a 32-bit register of `self.block`, which lives.
            return Ok(unsafe { register.read_u32() });
        }
        self.read_block(self.sq_tail, queue, "SQ tail")
    }

    /// Device: the CQ head the host announced.
    #[inline]
    pub(crate) fn read_cq_head(&self, queue: u16) -> Result<u32, Error> {
        if let Some(register) = &self.cq {
            // SAFETY: as in `ring_sq`: a 32-bit register of `self.block`, which lives.
            return Ok(unsafe { register.read_u32() });
        }
        self.read_block(self.cq_head, queue, "CQ head")
    }
}

/// Whether a register handed out for a doorbell is one the fast path may use: 32 bits wide
/// and 4-aligned (what the backends promise; checked again here, since the accesses rely on
/// it). Anything else keeps the checked path through the block.
fn is_doorbell(register: &RawRegister) -> bool {
    register.width() == mmio::Width::U32 && register.as_ptr().as_ptr() as usize % 4 == 0
}

/// aarch64: order normal-memory stores before a device write (Linux's `dma_wmb()`): the
/// outer-shareable store barrier, which `fence(Release)` (inner-shareable) does not give.
#[cfg(all(target_arch = "aarch64", not(loom)))]
#[inline]
fn dma_write_barrier() {
    // SAFETY: a barrier instruction: no memory operands, no effect but ordering.
    unsafe { std::arch::asm!("dmb oshst", options(nostack, preserves_flags)) };
}

#[cfg(all(test, not(loom)))]
mod doorbell_tests {
    use std::ptr::NonNull;

    use super::*;
    use crate::mmio::{Access, Block, Direct, Op, Recording, Shared, Width};

    #[test]
    fn recording_backend_sees_every_doorbell_access() {
        let bar = Recording::new(Shared::new(64));
        let doorbells = Doorbells::new(Block::new(bar.clone()).erase(), 8, 16).unwrap();
        assert!(
            doorbells.sq.is_none() && doorbells.cq.is_none(),
            "no fast path"
        );
        doorbells.ring_sq(0, 5).unwrap();
        doorbells.ring_cq(0, 3).unwrap();
        assert_eq!(doorbells.read_sq_tail(0).unwrap(), 5);
        assert_eq!(doorbells.read_cq_head(0).unwrap(), 3);
        let access = |op, offset, value| Access {
            op,
            offset,
            width: Width::U32,
            value,
        };
        assert_eq!(
            bar.take_log(),
            [
                access(Op::Write, 8, 5),
                access(Op::Write, 16, 3),
                access(Op::Read, 8, 5),
                access(Op::Read, 16, 3),
            ]
        );
    }

    #[test]
    fn shared_doorbells_are_one_atomic_access_that_lands() {
        let bar = Shared::new(256);
        // A window at 64: the registers are at 64 + 8 and 64 + 132 in the backend.
        let block = Block::new(bar.clone()).erase().window(64, 192).unwrap();
        let doorbells = Doorbells::new(block, 8, 132).unwrap();
        let (sq, cq) = (doorbells.sq.unwrap(), doorbells.cq.unwrap());
        assert!(sq.is_atomic() && cq.is_atomic());
        let regs = Block::new(bar);
        doorbells.ring_sq(0, 0xdead_beef).unwrap();
        doorbells.ring_cq(0, 77).unwrap();
        assert_eq!(regs.read::<u32>(72).unwrap(), 0xdead_beef);
        assert_eq!(regs.read::<u32>(196).unwrap(), 77);
        // The device side reads what the backend holds.
        regs.write::<u32>(72, 9).unwrap();
        regs.write::<u32>(196, 10).unwrap();
        assert_eq!(doorbells.read_sq_tail(0).unwrap(), 9);
        assert_eq!(doorbells.read_cq_head(0).unwrap(), 10);
        // Nothing else was touched.
        for offset in (0..256).step_by(4).filter(|o| ![72, 196].contains(o)) {
            assert_eq!(regs.read::<u32>(offset).unwrap(), 0, "offset {offset}");
        }
    }

    #[test]
    fn direct_doorbells_are_one_volatile_access_that_lands() {
        let backing = Box::into_raw(Box::new([0u64; 8]));
        let ptr = NonNull::new(backing.cast::<u8>()).unwrap();
        {
            // SAFETY: `backing` stays allocated until after `doorbells` and every clone of the
            // backend are dropped (end of this block) and is not referenced meanwhile.
            let bar = unsafe { Direct::new(ptr, 64) }.unwrap();
            let doorbells = Doorbells::new(Block::new(bar.clone()).erase(), 4, 40).unwrap();
            let (sq, cq) = (doorbells.sq.unwrap(), doorbells.cq.unwrap());
            assert!(!sq.is_atomic() && !cq.is_atomic());
            assert_eq!(sq.as_ptr().as_ptr() as usize, ptr.as_ptr() as usize + 4);
            assert_eq!(cq.as_ptr().as_ptr() as usize, ptr.as_ptr() as usize + 40);
            doorbells.ring_sq(0, 0x1234_5678).unwrap();
            doorbells.ring_cq(0, 0x9abc_def0).unwrap();
            let regs = Block::new(bar);
            assert_eq!(regs.read::<u32>(4).unwrap(), 0x1234_5678);
            assert_eq!(regs.read::<u32>(40).unwrap(), 0x9abc_def0);
            regs.write::<u32>(4, 1).unwrap();
            regs.write::<u32>(40, 2).unwrap();
            assert_eq!(doorbells.read_sq_tail(0).unwrap(), 1);
            assert_eq!(doorbells.read_cq_head(0).unwrap(), 2);
        }
        // SAFETY: from `Box::into_raw` above; nothing uses the pointer any more.
        let words = unsafe { Box::from_raw(backing) };
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let word_at =
            |o: usize| u32::from_ne_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        assert_eq!(word_at(4), 1);
        assert_eq!(word_at(40), 2);
        for offset in (0..64).step_by(4).filter(|o| ![4, 40].contains(o)) {
            assert_eq!(word_at(offset), 0, "offset {offset}");
        }
    }

    #[test]
    fn bad_doorbell_offsets_are_errors() {
        let block = Block::new(Shared::new(64)).erase();
        assert!(matches!(
            Doorbells::new(block.clone(), 62, 0),
            Err(Error::DoorbellOffset { offset: 62, .. })
        ));
        assert!(matches!(
            Doorbells::new(block.clone(), 0, 6),
            Err(Error::DoorbellOffset { offset: 6, .. })
        ));
        // A window at a base that is not 4-aligned: no offset in it is aligned both in the
        // window and in the backend.
        let odd = Block::new(Shared::new(64)).erase().window(2, 32).unwrap();
        assert!(matches!(
            Doorbells::new(odd.clone(), 0, 4),
            Err(Error::DoorbellOffset { offset: 0, .. })
        ));
        assert!(matches!(
            Doorbells::new(odd, 4, 8),
            Err(Error::DoorbellOffset { offset: 4, .. })
        ));
        assert!(matches!(
            Doorbells::new(block, 8, 8),
            Err(Error::SameDoorbell { offset: 8 })
        ));
    }
}
