//! The fake controller's commands: the admin set the driver uses (Identify, Set Features for
//! the number of queues, Create and Delete I/O queues), PRP lists, and reads and writes of the
//! namespace.

use userdma::dma::Iova;

use super::{
    Cq, Device, Sq, Status, BLOCKS, DATA_TRANSFER, INVALID_CQ, INVALID_FIELD, INVALID_NAMESPACE,
    INVALID_OPCODE, INVALID_QID, INVALID_SIZE, INVALID_VECTOR, LBA_RANGE, LBA_SIZE, OK, VECTORS,
};
use crate::command::{Sqe, IDENTIFY_LEN};
use crate::regs::PAGE;

impl Device {
    pub(super) fn admin(&mut self, sqe: &Sqe) -> (Status, u32) {
        let qid = (sqe.cdw[0] & 0xffff) as u16;
        let size = (sqe.cdw[0] >> 16) + 1;
        match sqe.opcode {
            0x06 => self.identify(sqe),
            0x09 if sqe.cdw[0] & 0xff == 0x07 => (OK, 0),
            0x05 => {
                let vector = (sqe.cdw[1] >> 16) as u16;
                if qid == 0 || self.cqs.contains_key(&qid) {
                    (INVALID_QID, 0)
                } else if !(2..=64).contains(&size) {
                    (INVALID_SIZE, 0)
                } else if usize::from(vector) >= VECTORS || sqe.cdw[1] & 0b10 == 0 {
                    (INVALID_VECTOR, 0)
                } else if sqe.prp1 % PAGE as u64 != 0 || sqe.cdw[1] & 1 == 0 {
                    (INVALID_FIELD, 0)
                } else {
                    let cq = Cq {
                        base: sqe.prp1,
                        size,
                        tail: 0,
                        phase: true,
                        vector,
                    };
                    self.cqs.insert(qid, cq);
                    (OK, 0)
                }
            }
            0x01 => {
                let cqid = (sqe.cdw[1] >> 16) as u16;
                if qid == 0 || self.sqs.contains_key(&qid) {
                    (INVALID_QID, 0)
                } else if !self.cqs.contains_key(&cqid) || cqid == 0 {
                    (INVALID_CQ, 0)
                } else if !(2..=64).contains(&size) {
                    (INVALID_SIZE, 0)
                } else if sqe.prp1 % PAGE as u64 != 0 || sqe.cdw[1] & 1 == 0 {
                    (INVALID_FIELD, 0)
                } else {
                    let sq = Sq {
                        base: sqe.prp1,
                        size,
                        head: 0,
                        cqid,
                    };
                    self.sqs.insert(qid, sq);
                    (OK, 0)
                }
            }
            0x00 => match self.sqs.remove(&qid).filter(|_| qid != 0) {
                Some(_) => (OK, 0),
                None => (INVALID_QID, 0),
            },
            0x04 => {
                if qid == 0 || self.sqs.values().any(|sq| sq.cqid == qid) {
                    (INVALID_QID, 0)
                } else {
                    match self.cqs.remove(&qid) {
                        Some(_) => (OK, 0),
                        None => (INVALID_QID, 0),
                    }
                }
            }
            _ => (INVALID_OPCODE, 0),
        }
    }

    fn identify(&mut self, sqe: &Sqe) -> (Status, u32) {
        let mut data = vec![0_u8; IDENTIFY_LEN];
        match sqe.cdw[0] & 0xff {
            0x01 => {
                data[0..2].copy_from_slice(&0x1b36_u16.to_le_bytes());
                data[4..24].copy_from_slice(b"fake0               ");
                data[24..64].copy_from_slice(b"userdma fake NVMe controller            ");
                data[64..72].copy_from_slice(b"1.0     ");
                data[77] = 5; // 128 KiB
                data[512] = 0x66;
                data[513] = 0x44;
                data[516..520].copy_from_slice(&1_u32.to_le_bytes());
            }
            0x00 if sqe.nsid == 1 => {
                data[0..8].copy_from_slice(&BLOCKS.to_le_bytes());
                data[8..16].copy_from_slice(&BLOCKS.to_le_bytes());
                data[128..132].copy_from_slice(&(9_u32 << 16).to_le_bytes());
            }
            0x00 => return (INVALID_NAMESPACE, 0),
            _ => return (INVALID_FIELD, 0),
        }
        if sqe.prp1 % 4 != 0 {
            return (INVALID_FIELD, 0);
        }
        match self.window(sqe.prp1, IDENTIFY_LEN) {
            Some(window) => {
                window.slice().write_from(0, &data).expect("identify data");
                (OK, 0)
            }
            None => (DATA_TRANSFER, 0),
        }
    }

    /// The (IOVA, length) pieces of `len` bytes described by PRP1/PRP2.
    fn prps(&mut self, sqe: &Sqe, len: usize) -> Option<Vec<(u64, usize)>> {
        let offset = (sqe.prp1 % PAGE as u64) as usize;
        if offset % 4 != 0 {
            return None;
        }
        let first = len.min(PAGE - offset);
        let mut pieces = vec![(sqe.prp1, first)];
        let mut left = len - first;
        if left == 0 {
            return Some(pieces);
        }
        if offset != 0 {
            self.seen.lock().expect("seen").in_page += 1;
        }
        let pages = left.div_ceil(PAGE);
        let entries: Vec<u64> = if pages == 1 {
            vec![sqe.prp2]
        } else {
            self.seen.lock().expect("seen").prp_lists += 1;
            if sqe.prp2 % 8 != 0 || pages > PAGE / 8 {
                return None;
            }
            let window = self.window(sqe.prp2, pages * 8)?;
            let mut bytes = vec![0_u8; pages * 8];
            window.slice().read_into(0, &mut bytes).ok()?;
            bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect()
        };
        for entry in entries {
            if entry % PAGE as u64 != 0 {
                return None;
            }
            let n = left.min(PAGE);
            pieces.push((entry, n));
            left -= n;
        }
        Some(pieces)
    }

    pub(super) fn io(&mut self, sqe: &Sqe) -> (Status, u32) {
        match sqe.opcode {
            0x00 => return (OK, 0),
            0x01 | 0x02 => {}
            _ => return (INVALID_OPCODE, 0),
        }
        if sqe.nsid != 1 {
            return (INVALID_NAMESPACE, 0);
        }
        let slba = u64::from(sqe.cdw[0]) | (u64::from(sqe.cdw[1]) << 32);
        let blocks = u64::from(sqe.cdw[2] & 0xffff) + 1;
        if slba.checked_add(blocks).is_none_or(|end| end > BLOCKS) {
            return (LBA_RANGE, 0);
        }
        let len = blocks as usize * LBA_SIZE;
        let Some(pieces) = self.prps(sqe, len) else {
            return (INVALID_FIELD, 0);
        };
        let mut disk = self.disk.lock().expect("disk");
        let mut at = slba as usize * LBA_SIZE;
        for (iova, n) in pieces {
            let Some(window) = self.space.translate(Iova(iova), n) else {
                return (DATA_TRANSFER, 0);
            };
            let slice = window.slice();
            if sqe.opcode == 0x01 {
                slice
                    .read_into(0, &mut disk[at..at + n])
                    .expect("write data");
            } else if !self.faults.empty_reads {
                let mut data = disk[at..at + n].to_vec();
                if self.faults.corrupt_reads {
                    data[0] ^= 0x10;
                }
                slice.write_from(0, &data).expect("read data");
            }
            at += n;
        }
        (OK, 0)
    }
}
