//! NVMe commands: the 64-byte submission queue entry ([`Sqe`]) and the 16-byte completion queue
//! entry ([`Cqe`]) as plain data the ring carries, the commands this driver sends, the status a
//! completion carries, and the Identify data it reads.

use std::fmt;
use std::mem::{offset_of, size_of};

use static_assertions::const_assert_eq;
use userdma::ring::{Completion, Submission};
use userdma::zerocopy::{FromBytes, Immutable, IntoBytes};

#[cfg(target_endian = "big")]
compile_error!("NVMe structures are little-endian; this driver lays them out in host order");

/// Admin command opcodes.
pub(crate) mod admin {
    /// Delete I/O Submission Queue.
    pub(crate) const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue.
    pub(crate) const CREATE_IO_SQ: u8 = 0x01;
    /// Delete I/O Completion Queue.
    pub(crate) const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue.
    pub(crate) const CREATE_IO_CQ: u8 = 0x05;
    /// Identify.
    pub(crate) const IDENTIFY: u8 = 0x06;
    /// Set Features.
    pub(crate) const SET_FEATURES: u8 = 0x09;
}

/// NVM command set opcodes.
pub(crate) mod nvm {
    /// Flush.
    pub(crate) const FLUSH: u8 = 0x00;
    /// Write.
    pub(crate) const WRITE: u8 = 0x01;
    /// Read.
    pub(crate) const READ: u8 = 0x02;
}

/// Identify CNS values.
pub(crate) mod cns {
    /// The namespace data structure of the NSID given.
    pub(crate) const NAMESPACE: u32 = 0x00;
    /// The controller data structure.
    pub(crate) const CONTROLLER: u32 = 0x01;
}

/// Feature identifier of Number of Queues.
const FEATURE_NUMBER_OF_QUEUES: u32 = 0x07;

/// A submission queue entry (common command format).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
#[zerocopy(crate = "userdma::zerocopy")]
pub(crate) struct Sqe {
    /// CDW0 bits 7:0.
    pub(crate) opcode: u8,
    /// CDW0 bits 15:8: fused operation, PRP or SGL (0: PRPs, not fused).
    pub(crate) flags: u8,
    /// CDW0 bits 31:16: the command identifier (set by the queue).
    pub(crate) command_id: u16,
    /// Namespace identifier.
    pub(crate) nsid: u32,
    /// CDW2.
    pub(crate) cdw2: u32,
    /// CDW3.
    pub(crate) cdw3: u32,
    /// Metadata pointer.
    pub(crate) mptr: u64,
    /// PRP entry 1: the first data page (with an offset).
    pub(crate) prp1: u64,
    /// PRP entry 2: the second page, or the address of a PRP list.
    pub(crate) prp2: u64,
    /// CDW10 to CDW15: command specific.
    pub(crate) cdw: [u32; 6],
}

const_assert_eq!(size_of::<Sqe>(), 64);
const_assert_eq!(offset_of!(Sqe, opcode), 0);
const_assert_eq!(offset_of!(Sqe, flags), 1);
const_assert_eq!(offset_of!(Sqe, command_id), 2);
const_assert_eq!(offset_of!(Sqe, nsid), 4);
const_assert_eq!(offset_of!(Sqe, cdw2), 8);
const_assert_eq!(offset_of!(Sqe, cdw3), 12);
const_assert_eq!(offset_of!(Sqe, mptr), 16);
const_assert_eq!(offset_of!(Sqe, prp1), 24);
const_assert_eq!(offset_of!(Sqe, prp2), 32);
const_assert_eq!(offset_of!(Sqe, cdw), 40);

impl Submission for Sqe {
    fn command_id(&self) -> u16 {
        self.command_id
    }
    fn set_command_id(&mut self, id: u16) {
        self.command_id = id;
    }
}

/// The data pointer of a command: PRP1 and PRP2 as built by `prp::data_pointer`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DataPointer {
    /// PRP1.
    pub(crate) prp1: u64,
    /// PRP2 (0 when unused).
    pub(crate) prp2: u64,
}

impl Sqe {
    fn with(opcode: u8, nsid: u32, data: DataPointer) -> Sqe {
        Sqe {
            opcode,
            nsid,
            prp1: data.prp1,
            prp2: data.prp2,
            ..Sqe::default()
        }
    }

    /// Identify `cns` (of namespace `nsid`) into the 4 KiB page at `page`.
    pub(crate) fn identify(cns: u32, nsid: u32, page: u64) -> Sqe {
        let mut sqe = Sqe::with(
            admin::IDENTIFY,
            nsid,
            DataPointer {
                prp1: page,
                prp2: 0,
            },
        );
        sqe.cdw[0] = cns;
        sqe
    }

    /// Set Features, Number of Queues: ask for `sqs` I/O submission and `cqs` completion queues
    /// (1 to 65535 each).
    pub(crate) fn set_queue_count(sqs: u16, cqs: u16) -> Sqe {
        let mut sqe = Sqe::with(admin::SET_FEATURES, 0, DataPointer::default());
        sqe.cdw[0] = FEATURE_NUMBER_OF_QUEUES;
        sqe.cdw[1] = (u32::from(cqs.saturating_sub(1)) << 16) | u32::from(sqs.saturating_sub(1));
        sqe
    }

    /// Create I/O Completion Queue `qid` of `entries` (2 to 65536) at `iova` (physically
    /// contiguous), interrupts enabled on MSI-X vector `vector`.
    pub(crate) fn create_io_cq(qid: u16, entries: u32, iova: u64, vector: u16) -> Sqe {
        let mut sqe = Sqe::with(
            admin::CREATE_IO_CQ,
            0,
            DataPointer {
                prp1: iova,
                prp2: 0,
            },
        );
        sqe.cdw[0] = (entries.saturating_sub(1) << 16) | u32::from(qid);
        // IV (31:16), IEN (bit 1), PC (bit 0).
        sqe.cdw[1] = (u32::from(vector) << 16) | 0b10 | 0b01;
        sqe
    }

    /// Create I/O Submission Queue `qid` of `entries` at `iova`, completing on CQ `cqid`.
    pub(crate) fn create_io_sq(qid: u16, entries: u32, iova: u64, cqid: u16) -> Sqe {
        let mut sqe = Sqe::with(
            admin::CREATE_IO_SQ,
            0,
            DataPointer {
                prp1: iova,
                prp2: 0,
            },
        );
        sqe.cdw[0] = (entries.saturating_sub(1) << 16) | u32::from(qid);
        // CQID (31:16), QPRIO (2:1) medium... ignored under round robin, PC (bit 0).
        sqe.cdw[1] = (u32::from(cqid) << 16) | 0b01;
        sqe
    }

    /// Delete I/O Submission Queue `qid`.
    pub(crate) fn delete_io_sq(qid: u16) -> Sqe {
        let mut sqe = Sqe::with(admin::DELETE_IO_SQ, 0, DataPointer::default());
        sqe.cdw[0] = u32::from(qid);
        sqe
    }

    /// Delete I/O Completion Queue `qid`.
    pub(crate) fn delete_io_cq(qid: u16) -> Sqe {
        let mut sqe = Sqe::with(admin::DELETE_IO_CQ, 0, DataPointer::default());
        sqe.cdw[0] = u32::from(qid);
        sqe
    }

    /// Read or Write (`opcode`) of `blocks` logical blocks (1 to 65536) from `slba` of namespace
    /// `nsid`, data at `data`. `None` for a block count out of range.
    pub(crate) fn rw(
        opcode: u8,
        nsid: u32,
        slba: u64,
        blocks: u32,
        data: DataPointer,
    ) -> Option<Sqe> {
        if !(1..=65536).contains(&blocks) {
            return None;
        }
        let mut sqe = Sqe::with(opcode, nsid, data);
        // Truncation is the point: SLBA is split across CDW10 (low) and CDW11 (high).
        sqe.cdw[0] = slba as u32;
        sqe.cdw[1] = (slba >> 32) as u32;
        // NLB, 0-based, in bits 15:0.
        sqe.cdw[2] = blocks - 1;
        Some(sqe)
    }

    /// Flush namespace `nsid`.
    pub(crate) fn flush(nsid: u32) -> Sqe {
        Sqe::with(nvm::FLUSH, nsid, DataPointer::default())
    }
}

/// A completion queue entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
#[zerocopy(crate = "userdma::zerocopy")]
pub(crate) struct Cqe {
    /// DW0: command specific result.
    pub(crate) result: u32,
    /// DW1: reserved / command specific.
    pub(crate) dw1: u32,
    /// DW2 bits 15:0: the SQ head when the entry was posted (a slot index).
    pub(crate) sq_head: u16,
    /// DW2 bits 31:16: the submission queue the command came from.
    pub(crate) sq_id: u16,
    /// DW3 bits 15:0: the command identifier.
    pub(crate) command_id: u16,
    /// DW3 bits 31:16: bit 0 the phase tag, bits 15:1 the status field.
    pub(crate) status: u16,
}

const_assert_eq!(size_of::<Cqe>(), 16);
const_assert_eq!(offset_of!(Cqe, result), 0);
const_assert_eq!(offset_of!(Cqe, dw1), 4);
const_assert_eq!(offset_of!(Cqe, sq_head), 8);
const_assert_eq!(offset_of!(Cqe, sq_id), 10);
const_assert_eq!(offset_of!(Cqe, command_id), 12);
const_assert_eq!(offset_of!(Cqe, status), 14);

impl Completion for Cqe {
    /// DW3 (byte 12): the command id and the status with the phase tag.
    const PHASE_WORD: usize = 12;
    /// DW3 bit 16: the phase tag (bit 0 of `status` on this little-endian host).
    const PHASE_BIT: u32 = 1 << 16;

    fn command_id(&self) -> u16 {
        self.command_id
    }

    /// The controller reports its SQ head in every completion; the ring takes it from there.
    fn sq_head(&self) -> Option<u16> {
        Some(self.sq_head)
    }
}

impl Cqe {
    /// The status field (the phase tag removed).
    pub(crate) fn status(&self) -> Status {
        Status(self.status >> 1)
    }
}

/// The status field of a completion: SC (7:0), SCT (10:8), CRD (12:11), M (13), DNR (14).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Status(pub(crate) u16);

impl Status {
    /// Status code.
    pub(crate) fn code(self) -> u8 {
        // The low byte, by definition.
        (self.0 & 0xff) as u8
    }

    /// Status code type.
    pub(crate) fn code_type(self) -> u8 {
        // Three bits.
        ((self.0 >> 8) & 0b111) as u8
    }

    /// Do Not Retry.
    pub(crate) fn do_not_retry(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    /// Whether the command succeeded (SCT 0, SC 0).
    pub(crate) fn is_success(self) -> bool {
        self.code() == 0 && self.code_type() == 0
    }

    /// A name for the common codes.
    fn name(self) -> &'static str {
        match (self.code_type(), self.code()) {
            (0, 0x00) => "successful completion",
            (0, 0x01) => "invalid command opcode",
            (0, 0x02) => "invalid field in command",
            (0, 0x04) => "data transfer error",
            (0, 0x06) => "internal error",
            (0, 0x0b) => "invalid namespace or format",
            (0, 0x13) => "PRP offset invalid",
            (0, 0x80) => "LBA out of range",
            (0, 0x81) => "capacity exceeded",
            (1, 0x00) => "completion queue invalid",
            (1, 0x01) => "invalid queue identifier",
            (1, 0x02) => "invalid queue size",
            (1, 0x08) => "invalid interrupt vector",
            (1, 0x0c) => "invalid queue deletion",
            (2, 0x80) => "write fault",
            (2, 0x81) => "unrecovered read error",
            (2, 0x86) => "access denied",
            (0, _) => "generic command status",
            (1, _) => "command specific status",
            (2, _) => "media and data integrity error",
            (3, _) => "path related status",
            _ => "vendor specific or reserved status",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (SCT {}, SC {:#04x}{})",
            self.name(),
            self.code_type(),
            self.code(),
            if self.do_not_retry() { ", DNR" } else { "" }
        )
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Status({:#06x}: {self})", self.0)
    }
}

/// What went wrong reading Identify data.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// FLBAS names a format past the ones the namespace has.
    #[error("namespace {nsid}: FLBAS selects LBA format {index}, but the namespace has {count}: the Identify Namespace data is inconsistent")]
    Format {
        /// The namespace.
        nsid: u32,
        /// The format selected.
        index: usize,
        /// Formats the namespace has.
        count: usize,
    },
    /// An LBA data size this driver cannot use.
    #[error("namespace {nsid}: LBA data size 2^{lbads} bytes is not usable (want 512 B to 64 KiB): format the namespace with another LBA format")]
    LbaSize {
        /// The namespace.
        nsid: u32,
        /// The LBADS exponent.
        lbads: u8,
    },
    /// The namespace is inactive or empty.
    #[error("namespace {nsid} has no blocks (NSZE 0): is it attached to this controller?")]
    Empty {
        /// The namespace.
        nsid: u32,
    },
}

/// Size of an Identify data structure.
pub(crate) const IDENTIFY_LEN: usize = 4096;

/// The fields of Identify Controller this driver uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ControllerId {
    /// PCI vendor id.
    pub(crate) vendor: u16,
    /// Serial number.
    pub(crate) serial: String,
    /// Model number.
    pub(crate) model: String,
    /// Firmware revision.
    pub(crate) firmware: String,
    /// MDTS: the largest transfer is 2^mdts minimum pages (0: no limit).
    pub(crate) mdts: u8,
    /// Number of namespaces.
    pub(crate) namespaces: u32,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .trim_end_matches([' ', '\0'])
        .to_owned()
}

fn le_u16(data: &[u8; IDENTIFY_LEN], at: usize) -> u16 {
    u16::from_le_bytes([data[at], data[at + 1]])
}

fn le_u32(data: &[u8; IDENTIFY_LEN], at: usize) -> u32 {
    let mut bytes = [0; 4];
    bytes.copy_from_slice(&data[at..at + 4]);
    u32::from_le_bytes(bytes)
}

fn le_u64(data: &[u8; IDENTIFY_LEN], at: usize) -> u64 {
    let mut bytes = [0; 8];
    bytes.copy_from_slice(&data[at..at + 8]);
    u64::from_le_bytes(bytes)
}

impl ControllerId {
    /// Reads the Identify Controller data structure.
    pub(crate) fn parse(data: &[u8; IDENTIFY_LEN]) -> ControllerId {
        ControllerId {
            vendor: le_u16(data, 0),
            serial: text(&data[4..24]),
            model: text(&data[24..64]),
            firmware: text(&data[64..72]),
            mdts: data[77],
            namespaces: le_u32(data, 516),
        }
    }

    /// The largest transfer in bytes, given the minimum page size (`None`: no limit).
    pub(crate) fn max_transfer(&self, min_page: u64) -> Option<u64> {
        if self.mdts == 0 {
            return None;
        }
        1_u64
            .checked_shl(u32::from(self.mdts))?
            .checked_mul(min_page)
    }
}

/// The fields of Identify Namespace this driver uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NamespaceId {
    /// NSZE: size in logical blocks.
    pub(crate) blocks: u64,
    /// NCAP: capacity in logical blocks.
    pub(crate) capacity: u64,
    /// The LBA data size of the format in use, in bytes.
    pub(crate) lba_size: u32,
    /// Metadata bytes per block of the format in use.
    pub(crate) metadata: u16,
    /// Which LBA format is in use.
    pub(crate) format: usize,
}

impl NamespaceId {
    /// Reads the Identify Namespace data structure of namespace `nsid`.
    pub(crate) fn parse(nsid: u32, data: &[u8; IDENTIFY_LEN]) -> Result<NamespaceId, Error> {
        let blocks = le_u64(data, 0);
        if blocks == 0 {
            return Err(Error::Empty { nsid });
        }
        // NLBAF is 0-based; FLBAS bits 3:0 are the low bits of the index, bits 6:5 the high
        // bits (NVMe 2.0, for more than 16 formats).
        let count = usize::from(data[25]) + 1;
        let flbas = data[26];
        let index = usize::from(flbas & 0x0f) | (usize::from((flbas >> 5) & 0b11) << 4);
        if index >= count || index >= 64 {
            return Err(Error::Format { nsid, index, count });
        }
        let lbaf = le_u32(data, 128 + 4 * index);
        // LBADS: bits 23:16, an exponent.
        let lbads = ((lbaf >> 16) & 0xff) as u8;
        if !(9..=16).contains(&lbads) {
            return Err(Error::LbaSize { nsid, lbads });
        }
        Ok(NamespaceId {
            blocks,
            capacity: le_u64(data, 8),
            lba_size: 1 << lbads,
            metadata: (lbaf & 0xffff) as u16,
            format: index,
        })
    }
}

#[cfg(test)]
mod tests;
