//! The NVMe controller registers in BAR0 (NVM Express Base Specification, "Controller
//! Registers"): a layout struct that gives the offsets, typed values for CAP, CC, CSTS and AQA,
//! and the doorbell arithmetic.
//!
//! | offset | register | here |
//! |---|---|---|
//! | 0x00 | CAP, controller capabilities (64 bits, read as two 32-bit halves) | [`Cap`] |
//! | 0x08 | VS, version | [`VS`] |
//! | 0x14 | CC, controller configuration | [`Cc`] |
//! | 0x1c | CSTS, controller status | [`Csts`] |
//! | 0x24 | AQA, admin queue attributes | [`Aqa`] |
//! | 0x28 | ASQ, admin submission queue base (64 bits, written low half first) | [`ASQ`] |
//! | 0x30 | ACQ, admin completion queue base | [`ACQ`] |
//! | 0x1000 + (2y) × (4 << CAP.DSTRD) | SQ y tail doorbell | [`Cap::sq_tail_doorbell`] |
//! | 0x1000 + (2y + 1) × (4 << CAP.DSTRD) | CQ y head doorbell | [`Cap::cq_head_doorbell`] |
//!
//! 64-bit registers are accessed as two 32-bit halves, low first, as Linux's driver does
//! (`lo_hi_readq`/`lo_hi_writeq`): every controller accepts that, not every one accepts a single
//! 64-bit access.

use std::mem::offset_of;
use std::time::Duration;

use static_assertions::const_assert_eq;
use userdma::mmio::{self, DynBlock, Field, ReadOnly, ReadWrite, Value};

/// The register block's layout, for its offsets (never instantiated).
#[repr(C)]
#[allow(dead_code)] // only its field offsets are used
pub(crate) struct Regs {
    cap: u64,
    vs: u32,
    intms: u32,
    intmc: u32,
    cc: u32,
    reserved: u32,
    csts: u32,
    nssr: u32,
    aqa: u32,
    asq: u64,
    acq: u64,
}

const_assert_eq!(offset_of!(Regs, cap), 0x00);
const_assert_eq!(offset_of!(Regs, vs), 0x08);
const_assert_eq!(offset_of!(Regs, intms), 0x0c);
const_assert_eq!(offset_of!(Regs, intmc), 0x10);
const_assert_eq!(offset_of!(Regs, cc), 0x14);
const_assert_eq!(offset_of!(Regs, csts), 0x1c);
const_assert_eq!(offset_of!(Regs, nssr), 0x20);
const_assert_eq!(offset_of!(Regs, aqa), 0x24);
const_assert_eq!(offset_of!(Regs, asq), 0x28);
const_assert_eq!(offset_of!(Regs, acq), 0x30);

/// CAP, low half.
pub(crate) const CAP_LO: Field<u32, ReadOnly> = Field::new(offset_of!(Regs, cap));
/// CAP, high half.
pub(crate) const CAP_HI: Field<u32, ReadOnly> = Field::new(offset_of!(Regs, cap) + 4);
/// VS: major (31:16), minor (15:8), tertiary (7:0) version.
pub(crate) const VS: Field<u32, ReadOnly> = Field::new(offset_of!(Regs, vs));
/// CC.
pub(crate) const CC: Field<Cc, ReadWrite> = Field::new(offset_of!(Regs, cc));
/// CSTS.
pub(crate) const CSTS: Field<Csts, ReadOnly> = Field::new(offset_of!(Regs, csts));
/// AQA.
pub(crate) const AQA: Field<Aqa, ReadWrite> = Field::new(offset_of!(Regs, aqa));
/// ASQ (low half; the high half follows).
pub(crate) const ASQ: Field<u32, ReadWrite> = Field::new(offset_of!(Regs, asq));
/// ACQ (low half; the high half follows).
pub(crate) const ACQ: Field<u32, ReadWrite> = Field::new(offset_of!(Regs, acq));

/// Where the doorbells start.
pub(crate) const DOORBELL_BASE: usize = 0x1000;

/// The memory page size the driver uses (CC.MPS = 0: 4 KiB), which is also the PRP page size.
pub(crate) const PAGE: usize = 4096;

/// CAP: what the controller can do (read-only, 64 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cap(pub(crate) u64);

impl Cap {
    /// Reads CAP (low half, then high half).
    pub(crate) fn read(bar: &DynBlock) -> Result<Cap, mmio::Error> {
        let lo = bar.get(CAP_LO)?;
        let hi = bar.get(CAP_HI)?;
        Ok(Cap(u64::from(lo) | (u64::from(hi) << 32)))
    }

    fn bits(self, low: u32, count: u32) -> u64 {
        (self.0 >> low) & ((1 << count) - 1)
    }

    /// MQES + 1: the most entries an I/O queue may have.
    pub(crate) fn max_queue_entries(self) -> u32 {
        // 16 bits, 0-based: at most 65536.
        self.bits(0, 16) as u32 + 1
    }

    /// TO: the worst-case time for CSTS.RDY to follow CC.EN, in units of 500 ms.
    pub(crate) fn ready_timeout(self) -> Duration {
        Duration::from_millis(self.bits(24, 8) * 500)
    }

    /// DSTRD: doorbells are `4 << DSTRD` bytes apart.
    pub(crate) fn doorbell_stride(self) -> usize {
        4 << self.bits(32, 4)
    }

    /// CSS bit 0: the NVM command set is supported.
    pub(crate) fn supports_nvm(self) -> bool {
        self.bits(37, 1) == 1
    }

    /// MPSMIN: the smallest memory page size, in bytes.
    pub(crate) fn min_page(self) -> u64 {
        1 << (12 + self.bits(48, 4))
    }

    /// MPSMAX: the largest memory page size, in bytes.
    pub(crate) fn max_page(self) -> u64 {
        1 << (12 + self.bits(52, 4))
    }

    /// The offset in BAR0 of SQ `qid`'s tail doorbell (`None` if it overflows).
    pub(crate) fn sq_tail_doorbell(self, qid: u16) -> Option<usize> {
        let index = usize::from(qid).checked_mul(2)?;
        DOORBELL_BASE.checked_add(index.checked_mul(self.doorbell_stride())?)
    }

    /// The offset in BAR0 of CQ `qid`'s head doorbell (`None` if it overflows).
    pub(crate) fn cq_head_doorbell(self, qid: u16) -> Option<usize> {
        let index = usize::from(qid).checked_mul(2)?.checked_add(1)?;
        DOORBELL_BASE.checked_add(index.checked_mul(self.doorbell_stride())?)
    }
}

/// CC.SHN: the shutdown notification the host gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Every value the field takes is named; the driver itself only ever asks for a normal shutdown.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Shutdown {
    /// No notification.
    None = 0b00,
    /// Normal shutdown.
    Normal = 0b01,
    /// Abrupt shutdown.
    Abrupt = 0b10,
}

/// CC: how the host configures the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Cc(pub(crate) u32);

impl Cc {
    const EN: u32 = 1 << 0;
    const CSS_SHIFT: u32 = 4;
    const MPS_SHIFT: u32 = 7;
    const AMS_SHIFT: u32 = 11;
    const SHN_SHIFT: u32 = 14;
    const SHN_MASK: u32 = 0b11 << Self::SHN_SHIFT;
    const IOSQES_SHIFT: u32 = 16;
    const IOCQES_SHIFT: u32 = 20;

    /// The configuration this driver uses, not yet enabled: NVM command set (CSS 0), 4 KiB
    /// pages (MPS 0), round-robin arbitration (AMS 0), I/O SQ entries of 2^6 = 64 bytes and
    /// CQ entries of 2^4 = 16 bytes.
    pub(crate) fn nvm() -> Cc {
        Cc((6 << Self::IOSQES_SHIFT) | (4 << Self::IOCQES_SHIFT))
            .with_field(Self::CSS_SHIFT, 0b111, 0)
            .with_field(Self::MPS_SHIFT, 0b1111, 0)
            .with_field(Self::AMS_SHIFT, 0b111, 0)
    }

    fn with_field(self, shift: u32, mask: u32, value: u32) -> Cc {
        Cc((self.0 & !(mask << shift)) | ((value & mask) << shift))
    }

    /// EN.
    pub(crate) fn enabled(self) -> bool {
        self.0 & Self::EN != 0
    }

    /// With EN set or cleared.
    pub(crate) fn with_enable(self, on: bool) -> Cc {
        Cc(if on {
            self.0 | Self::EN
        } else {
            self.0 & !Self::EN
        })
    }

    /// With SHN set to `shn`.
    pub(crate) fn with_shutdown(self, shn: Shutdown) -> Cc {
        Cc((self.0 & !Self::SHN_MASK) | ((shn as u32) << Self::SHN_SHIFT))
    }
}

impl Value for Cc {
    type Raw = u32;
    fn from_raw(raw: u32) -> Cc {
        Cc(raw)
    }
    fn to_raw(self) -> u32 {
        self.0
    }
}

bitflags::bitflags! {
    /// CSTS: the controller's status (SHST is a two-bit field: see [`Csts::shutdown_status`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) struct Csts: u32 {
        /// RDY: the controller is ready to process commands.
        const RDY = 1 << 0;
        /// CFS: controller fatal status.
        const CFS = 1 << 1;
        /// SHST bit 0.
        const SHST0 = 1 << 2;
        /// SHST bit 1.
        const SHST1 = 1 << 3;
        /// NSSRO: an NVM subsystem reset occurred.
        const NSSRO = 1 << 4;
        /// PP: processing paused.
        const PP = 1 << 5;
    }
}

/// CSTS.SHST: where a shutdown is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ShutdownStatus {
    /// Normal operation, no shutdown requested.
    Normal,
    /// Shutdown processing is under way.
    Occurring,
    /// Shutdown processing is complete.
    Complete,
    /// The reserved value 0b11.
    Reserved,
}

impl Csts {
    /// SHST.
    pub(crate) fn shutdown_status(self) -> ShutdownStatus {
        match (self.bits() >> 2) & 0b11 {
            0b00 => ShutdownStatus::Normal,
            0b01 => ShutdownStatus::Occurring,
            0b10 => ShutdownStatus::Complete,
            _ => ShutdownStatus::Reserved,
        }
    }
}

impl Value for Csts {
    type Raw = u32;
    fn from_raw(raw: u32) -> Csts {
        Csts::from_bits_retain(raw)
    }
    fn to_raw(self) -> u32 {
        self.bits()
    }
}

/// AQA: the admin queues' sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Aqa(pub(crate) u32);

impl Aqa {
    /// Admin SQ and CQ of `entries` each (2 to 4096).
    pub(crate) fn new(entries: u32) -> Option<Aqa> {
        if !(2..=4096).contains(&entries) {
            return None;
        }
        let zero_based = entries - 1;
        Some(Aqa(zero_based | (zero_based << 16)))
    }
}

impl Value for Aqa {
    type Raw = u32;
    fn from_raw(raw: u32) -> Aqa {
        Aqa(raw)
    }
    fn to_raw(self) -> u32 {
        self.0
    }
}

/// Writes a 64-bit register as two 32-bit halves, low first.
pub(crate) fn write_u64(
    bar: &DynBlock,
    low: Field<u32, ReadWrite>,
    value: u64,
) -> Result<(), mmio::Error> {
    let high = Field::<u32, ReadWrite>::new(low.offset() + 4);
    // Truncation is the point: the two halves.
    bar.set(low, value as u32)?;
    bar.set(high, (value >> 32) as u32)
}

/// VS as `major.minor.tertiary`.
pub(crate) fn version(vs: u32) -> (u32, u32, u32) {
    (vs >> 16, (vs >> 8) & 0xff, vs & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CAP like QEMU's emulated controller's: MQES 0x7ff, CQR, TO 15, DSTRD 0, CSS bits 0
    /// (NVM) and 2, MPSMIN 0, MPSMAX 4.
    const QEMU_CAP: u64 = 0x0040_00a0_0f01_07ff;

    #[test]
    fn cap_fields_decode() {
        let cap = Cap(QEMU_CAP);
        assert_eq!(cap.max_queue_entries(), 2048);
        assert_eq!(cap.ready_timeout(), Duration::from_millis(7500));
        assert_eq!(cap.doorbell_stride(), 4);
        assert!(cap.supports_nvm());
        assert_eq!(cap.min_page(), 4096);
        assert_eq!(cap.max_page(), 65536);
    }

    #[test]
    fn doorbells_follow_the_stride() {
        let cap = Cap(0);
        assert_eq!(cap.sq_tail_doorbell(0), Some(0x1000));
        assert_eq!(cap.cq_head_doorbell(0), Some(0x1004));
        assert_eq!(cap.sq_tail_doorbell(1), Some(0x1008));
        assert_eq!(cap.cq_head_doorbell(1), Some(0x100c));
        // DSTRD 2: 16 bytes apart.
        let wide = Cap(2 << 32);
        assert_eq!(wide.doorbell_stride(), 16);
        assert_eq!(wide.sq_tail_doorbell(1), Some(0x1020));
        assert_eq!(wide.cq_head_doorbell(1), Some(0x1030));
        // DSTRD 15 with the largest queue id still fits a usize on 64-bit hosts.
        assert!(Cap(15 << 32).cq_head_doorbell(u16::MAX).is_some());
    }

    #[test]
    fn cc_encodes_the_driver_configuration() {
        let cc = Cc::nvm();
        assert_eq!(cc.0, 0x0046_0000);
        assert!(!cc.enabled());
        assert_eq!(cc.with_enable(true).0, 0x0046_0001);
        assert!(cc.with_enable(true).enabled());
        assert_eq!(cc.with_enable(true).with_enable(false), cc);
        assert_eq!(
            cc.with_enable(true).with_shutdown(Shutdown::Normal).0,
            0x0046_4001
        );
        assert_eq!(
            cc.with_shutdown(Shutdown::Abrupt)
                .with_shutdown(Shutdown::None),
            cc
        );
    }

    #[test]
    fn csts_shutdown_status() {
        assert_eq!(
            Csts::from_raw(0b0001).shutdown_status(),
            ShutdownStatus::Normal
        );
        assert_eq!(
            Csts::from_raw(0b0101).shutdown_status(),
            ShutdownStatus::Occurring
        );
        assert_eq!(
            Csts::from_raw(0b1001).shutdown_status(),
            ShutdownStatus::Complete
        );
        assert_eq!(
            Csts::from_raw(0b1100).shutdown_status(),
            ShutdownStatus::Reserved
        );
        assert!(Csts::from_raw(0b10).contains(Csts::CFS));
    }

    #[test]
    fn aqa_sizes_are_zero_based() {
        assert_eq!(Aqa::new(32), Some(Aqa(0x001f_001f)));
        assert_eq!(Aqa::new(4096), Some(Aqa(0x0fff_0fff)));
        assert_eq!(Aqa::new(1), None);
        assert_eq!(Aqa::new(4097), None);
    }

    #[test]
    fn version_splits() {
        assert_eq!(version(0x0001_0400), (1, 4, 0));
        assert_eq!(version(0x0002_0001), (2, 0, 1));
    }
}
