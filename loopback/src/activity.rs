//! Activity records: what each unit of the device ran and when, as the device saw it — the
//! loopback NPU's trace unit, which writes one fixed-size [`Record`] per descriptor a unit
//! completes into a buffer in host memory, and the host's side of it: reading those records
//! safely ([`Reader`]) and owning the buffer ([`Log`]).
//!
//! # The device's side
//!
//! The host programs the activity block of the register map
//! ([`regs::ActivityRegs`](crate::regs::ActivityRegs)): the buffer's IOVA, the records per unit
//! (a power of two, `N`), and `ENABLE`. Unit `u` ([`Unit`] order: the copy engine, then the
//! compute unit) owns the ring of `N` records at `base + u * N * 64`. For its `n`-th completed
//! descriptor (counting from 0 since the enable) it writes the 64 bytes of the record into slot
//! `n % N` through its own translation of host addresses, as it writes completions (an unmapped
//! ring faults the recording, never a stray write), then publishes its `written` register
//! `= n + 1` with a Release store, and only then writes the descriptor's completion: a host
//! that has seen a completion finds its record. Without `ENABLE` a unit pays one predictable
//! branch per descriptor for all this.
//!
//! # The record (64 bytes, little-endian)
//!
//! | offset | field | |
//! |---|---|---|
//! | 0x00 | `start_ns` u64 | when the descriptor's work began, `CLOCK_MONOTONIC` ns: with a cost model the modelled start, else the measured one |
//! | 0x08 | `end_ns` u64 | when it ended (the modelled end, or the measured one); a unit's records never overlap: `end_ns <=` the next record's `start_ns` |
//! | 0x10 | `bytes` u64 | DMA bytes for the copies and fills (twice `len` for a device-to-device copy), compute bytes for `Compute`, `Layer`, `Compact` ([`Cost`](crate::Cost)); 0 for a failed descriptor |
//! | 0x18 | `sram_touched` u64 | compute bytes the SRAM model applied to (0 without it) |
//! | 0x20 | `sram_missed` u64 | of them, those missed and refilled at the DRAM rate |
//! | 0x28 | `context` u32 | the queue's context |
//! | 0x2c | `sequence` u32 | `n` (its low 32 bits): the record's number in its unit |
//! | 0x30 | `queue` u16 | the queue |
//! | 0x32 | `command` u16 | the command id its completion carries ([`POSTED`](userdma::ring::POSTED) for a posted descriptor) |
//! | 0x34 | `status` u16 | the [`StatusCode`] it completed with |
//! | 0x36 | `opcode` u8 | the descriptor's [`Opcode`] (as read: any value for `BadOpcode`) |
//! | 0x37 | `unit` u8 | the [`Unit`] that ran it |
//! | 0x38 | `flags` u32 | [`Flags`]: bit 0 `SWITCHED`, it made its unit switch context (what the unit's `context_switches` counter counts) |
//! | 0x3c | `reserved` u32 | 0 |
//!
//! Timestamps are `CLOCK_MONOTONIC` nanoseconds, which every process of the machine shares
//! (the device in a process of its own too): a unit converts its `Instant`s through an
//! [`Anchor`] taken when it took the enable, and the host puts its own on the same clock with
//! [`monotonic_ns`].
//!
//! # The host's side
//!
//! The records are device-written memory, read like a seqlock ([`Reader`]): read a unit's
//! `written` count (Acquire), copy the new records out (relaxed 64-bit atomic loads: the device
//! stores them as relaxed 64-bit atomic words, so a copy racing a rewrite is torn, never
//! undefined), `fence(Acquire)`, read the count again. The unit began overwriting slot `i % N` (for record `i + N`) only after
//! it had published `written = i + N` (its record writes follow a `fence(Release)` after that
//! store), so a record whose `i + N` is at most the second count may be torn: it is counted
//! **lost**, as are the records overwritten before they were read. (So a reader keeps up with
//! `N - 1` records in flight: at a whole ring behind, the oldest record's slot is the one the
//! device writes next.) Every record that is not is
//! checked ([`Record::check`]); one that fails (a buggy or hostile device) is counted **bad**
//! and skipped. No value the device writes can make the host panic or read outside the
//! buffer. [`Log`] owns a buffer mapped into the device's DMA space, programs the device and
//! drains it with a [`Reader`]; dropping it stops the device's records before the buffer is
//! unmapped.

use std::mem::{offset_of, size_of};
use std::sync::OnceLock;
use std::time::Instant;

use crate::regs::{Opcode, StatusCode, Unit, MAX_ACTIVITY_RECORDS, MAX_QUEUES};
use crate::shim;

mod log;
mod reader;

pub use self::log::Log;
pub use self::reader::{Drained, Reader};

/// Bytes of one record.
pub const RECORD_BYTES: usize = 64;

/// One descriptor as a unit ran it: the device's activity record (the layout is in the module
/// docs). Fields hold raw values as the device wrote them; [`Record::check`] says whether
/// they make sense.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Record {
    /// When the work began, `CLOCK_MONOTONIC` nanoseconds.
    pub start_ns: u64,
    /// When it ended, `CLOCK_MONOTONIC` nanoseconds.
    pub end_ns: u64,
    /// DMA bytes (copies, fills) or compute bytes (`Compute`, `Layer`, `Compact`).
    pub bytes: u64,
    /// Compute bytes the SRAM model applied to.
    pub sram_touched: u64,
    /// Of `sram_touched`, the bytes missed (refilled at the DRAM rate).
    pub sram_missed: u64,
    /// The queue's context.
    pub context: u32,
    /// The record's number in its unit since the enable (low 32 bits).
    pub sequence: u32,
    /// The queue.
    pub queue: u16,
    /// The command id of its completion.
    pub command: u16,
    /// The raw [`StatusCode`].
    pub status: u16,
    /// The raw [`Opcode`].
    pub opcode: u8,
    /// The raw [`Unit`].
    pub unit: u8,
    /// Raw [`Flags`].
    pub flags: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = {
    assert!(offset_of!(Record, start_ns) == 0x00);
    assert!(offset_of!(Record, end_ns) == 0x08);
    assert!(offset_of!(Record, bytes) == 0x10);
    assert!(offset_of!(Record, sram_touched) == 0x18);
    assert!(offset_of!(Record, sram_missed) == 0x20);
    assert!(offset_of!(Record, context) == 0x28);
    assert!(offset_of!(Record, sequence) == 0x2c);
    assert!(offset_of!(Record, queue) == 0x30);
    assert!(offset_of!(Record, command) == 0x32);
    assert!(offset_of!(Record, status) == 0x34);
    assert!(offset_of!(Record, opcode) == 0x36);
    assert!(offset_of!(Record, unit) == 0x37);
    assert!(offset_of!(Record, flags) == 0x38);
    assert!(offset_of!(Record, reserved) == 0x3c);
    assert!(size_of::<Record>() == RECORD_BYTES);
    // The records of a ring are 64-byte aligned (the buffer is): a record is whole cache lines.
    assert!(RECORD_BYTES % 8 == 0);
};

bitflags::bitflags! {
    /// [`Record::flags`].
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Flags: u32 {
        /// The descriptor made its unit switch context: the unit's previous descriptor was of
        /// another context (exactly what its `context_switches` counter counts).
        const SWITCHED = 1 << 0;
    }
}

/// What is wrong with a record ([`Record::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Defect {
    /// Its `unit` is not the unit whose ring holds it.
    #[error("the record names unit {found}, in unit {expected}'s ring")]
    Unit {
        /// The raw unit in the record.
        found: u8,
        /// The ring's unit.
        expected: u8,
    },
    /// Its `sequence` is not its number in the unit (a stale or misplaced record).
    #[error(
        "the record's sequence is {found}, expected {expected} (its slot holds another record)"
    )]
    Sequence {
        /// The sequence in the record.
        found: u32,
        /// The record's number (low 32 bits).
        expected: u32,
    },
    /// Its `status` is not a [`StatusCode`].
    #[error("the record's status {0} is not a status code")]
    Status(u16),
    /// Its `opcode` is not an [`Opcode`], and its status is not `BadOpcode`.
    #[error("the record's opcode {0} is not an opcode (and its status is not BadOpcode)")]
    Opcode(u8),
    /// Its `queue` is past the register map's queues.
    #[error("the record's queue {0} is past the device's queues")]
    Queue(u16),
    /// Its `flags` have bits [`Flags`] does not define.
    #[error("the record's flags {0:#x} have undefined bits")]
    Flags(u32),
    /// Its `reserved` word is not zero.
    #[error("the record's reserved word is {0:#x}, not zero")]
    Reserved(u32),
    /// It ends before it starts.
    #[error("the record ends ({end_ns} ns) before it starts ({start_ns} ns)")]
    Time {
        /// Its start.
        start_ns: u64,
        /// Its end.
        end_ns: u64,
    },
    /// It missed more SRAM bytes than it touched.
    #[error("the record missed {missed} SRAM bytes of {touched} touched")]
    Sram {
        /// Bytes touched.
        touched: u64,
        /// Bytes missed.
        missed: u64,
    },
}

/// Copies the `N` bytes at `at` of a record's bytes.
fn field<const N: usize>(bytes: &[u8; RECORD_BYTES], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    // `at + N <= RECORD_BYTES` for every field (the layout assertions above).
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

impl Record {
    /// The record as the device writes it: its fields at their offsets, little-endian.
    pub fn to_bytes(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        put(offset_of!(Record, start_ns), &self.start_ns.to_le_bytes());
        put(offset_of!(Record, end_ns), &self.end_ns.to_le_bytes());
        put(offset_of!(Record, bytes), &self.bytes.to_le_bytes());
        put(
            offset_of!(Record, sram_touched),
            &self.sram_touched.to_le_bytes(),
        );
        put(
            offset_of!(Record, sram_missed),
            &self.sram_missed.to_le_bytes(),
        );
        put(offset_of!(Record, context), &self.context.to_le_bytes());
        put(offset_of!(Record, sequence), &self.sequence.to_le_bytes());
        put(offset_of!(Record, queue), &self.queue.to_le_bytes());
        put(offset_of!(Record, command), &self.command.to_le_bytes());
        put(offset_of!(Record, status), &self.status.to_le_bytes());
        put(offset_of!(Record, opcode), &[self.opcode]);
        put(offset_of!(Record, unit), &[self.unit]);
        put(offset_of!(Record, flags), &self.flags.to_le_bytes());
        put(offset_of!(Record, reserved), &self.reserved.to_le_bytes());
        b
    }

    /// The record in `bytes` (as [`Record::to_bytes`] lays it out). Any bytes make a record;
    /// [`Record::check`] says whether it makes sense.
    pub fn from_bytes(bytes: &[u8; RECORD_BYTES]) -> Record {
        Record {
            start_ns: u64::from_le_bytes(field(bytes, offset_of!(Record, start_ns))),
            end_ns: u64::from_le_bytes(field(bytes, offset_of!(Record, end_ns))),
            bytes: u64::from_le_bytes(field(bytes, offset_of!(Record, bytes))),
            sram_touched: u64::from_le_bytes(field(bytes, offset_of!(Record, sram_touched))),
            sram_missed: u64::from_le_bytes(field(bytes, offset_of!(Record, sram_missed))),
            context: u32::from_le_bytes(field(bytes, offset_of!(Record, context))),
            sequence: u32::from_le_bytes(field(bytes, offset_of!(Record, sequence))),
            queue: u16::from_le_bytes(field(bytes, offset_of!(Record, queue))),
            command: u16::from_le_bytes(field(bytes, offset_of!(Record, command))),
            status: u16::from_le_bytes(field(bytes, offset_of!(Record, status))),
            opcode: bytes[offset_of!(Record, opcode)],
            unit: bytes[offset_of!(Record, unit)],
            flags: u32::from_le_bytes(field(bytes, offset_of!(Record, flags))),
            reserved: u32::from_le_bytes(field(bytes, offset_of!(Record, reserved))),
        }
    }

    /// The record as the eight 64-bit words the device stores (native-endian words holding
    /// [`Record::to_bytes`]'s bytes in memory order).
    pub(crate) fn to_words(self) -> [u64; RECORD_BYTES / 8] {
        let bytes = self.to_bytes();
        let mut words = [0u64; RECORD_BYTES / 8];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            *word = u64::from_ne_bytes(w);
        }
        words
    }

    /// Whether the record makes sense as record number `index` of `unit`'s ring: its unit and
    /// sequence match, its codes are the device's, its flags and reserved word hold nothing
    /// undefined, it does not end before it starts, and it missed no more SRAM bytes than it
    /// touched.
    ///
    /// # Errors
    /// The first [`Defect`] found, in the order above.
    pub fn check(&self, unit: Unit, index: u64) -> Result<(), Defect> {
        // `Unit` values are 0 and 1: they fit a byte.
        let expected = unit as u8;
        if self.unit != expected {
            return Err(Defect::Unit {
                found: self.unit,
                expected,
            });
        }
        // The low 32 bits on purpose (the field's width).
        let sequence = index as u32;
        if self.sequence != sequence {
            return Err(Defect::Sequence {
                found: self.sequence,
                expected: sequence,
            });
        }
        let status = StatusCode::from_raw(self.status).ok_or(Defect::Status(self.status))?;
        if Opcode::from_raw(self.opcode).is_none() && status != StatusCode::BadOpcode {
            return Err(Defect::Opcode(self.opcode));
        }
        if self.queue >= MAX_QUEUES {
            return Err(Defect::Queue(self.queue));
        }
        if Flags::from_bits(self.flags).is_none() {
            return Err(Defect::Flags(self.flags));
        }
        if self.reserved != 0 {
            return Err(Defect::Reserved(self.reserved));
        }
        if self.end_ns < self.start_ns {
            return Err(Defect::Time {
                start_ns: self.start_ns,
                end_ns: self.end_ns,
            });
        }
        if self.sram_missed > self.sram_touched {
            return Err(Defect::Sram {
                touched: self.sram_touched,
                missed: self.sram_missed,
            });
        }
        Ok(())
    }

    /// The unit that ran it, if the field names one.
    pub fn unit(&self) -> Option<Unit> {
        Unit::from_raw(u32::from(self.unit))
    }

    /// The opcode, if the field is one.
    pub fn opcode(&self) -> Option<Opcode> {
        Opcode::from_raw(self.opcode)
    }

    /// The status code, if the field is one.
    pub fn status_code(&self) -> Option<StatusCode> {
        StatusCode::from_raw(self.status)
    }

    /// Whether it made its unit switch context ([`Flags::SWITCHED`]).
    pub fn switched(&self) -> bool {
        Flags::from_bits_retain(self.flags).contains(Flags::SWITCHED)
    }

    /// Its duration in nanoseconds (0 if it ends before it starts).
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// Whether `records` is a valid number of records per unit: a power of two from 1 to
/// [`MAX_ACTIVITY_RECORDS`].
pub fn valid_records(records: u32) -> bool {
    records.is_power_of_two() && records <= MAX_ACTIVITY_RECORDS
}

/// Bytes of the activity buffer for `records` records per unit (both units' rings), `None`
/// unless `records` is valid ([`valid_records`]).
pub fn buffer_bytes(records: u32) -> Option<usize> {
    if !valid_records(records) {
        return None;
    }
    // At most 2 * 2^20 * 64 = 2^27 bytes: fits every usize this builds for.
    Some(Unit::ALL.len() * records as usize * RECORD_BYTES)
}

/// A pair of readings of the same moment: an `Instant` and `CLOCK_MONOTONIC`, so later
/// `Instant`s convert to `CLOCK_MONOTONIC` nanoseconds ([`Anchor::ns`]) without a system call.
/// (On Linux an `Instant` is `CLOCK_MONOTONIC` itself; the pair makes that an explicit
/// conversion, exact to the few nanoseconds between the two readings.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    instant: Instant,
    monotonic_ns: u64,
}

impl Anchor {
    /// Reads both clocks, back to back. A `clock_gettime` that fails (it does not on Linux)
    /// anchors at 0: the times then count from now.
    pub fn now() -> Anchor {
        let instant = Instant::now();
        let monotonic_ns = shim::monotonic_ns().unwrap_or(0);
        Anchor {
            instant,
            monotonic_ns,
        }
    }

    /// `at` in `CLOCK_MONOTONIC` nanoseconds (saturating at 0 and `u64::MAX`).
    pub fn ns(&self, at: Instant) -> u64 {
        let nanos = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        match at.checked_duration_since(self.instant) {
            Some(after) => self.monotonic_ns.saturating_add(nanos(after)),
            None => self
                .monotonic_ns
                .saturating_sub(nanos(self.instant.duration_since(at))),
        }
    }
}

/// `at` in `CLOCK_MONOTONIC` nanoseconds, through an [`Anchor`] this process takes once, on
/// first use: the clock of the activity records' timestamps, for the host's own `Instant`s.
pub fn monotonic_ns(at: Instant) -> u64 {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(Anchor::now).ns(at)
}

#[cfg(test)]
mod tests;
