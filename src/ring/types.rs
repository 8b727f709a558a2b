//! The crate's own entry formats: [`Command`], a 64-byte descriptor, and [`Status`], a
//! 16-byte completion in the NVMe shape (phase bit in bit 0 of the last 16-bit word). The
//! loopback device speaks them; a real device brings its own types.

use std::mem::{offset_of, size_of};

use super::{Completion, Submission};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// A 64-byte submission entry: an operation on up to two IOVA ranges in one device context.
/// Field meanings beyond the layout belong to the device (the loopback device documents its
/// opcodes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct Command {
    /// The operation.
    pub opcode: u8,
    /// Operation flags.
    pub flags: u8,
    /// The command id (set by the queue on submission).
    pub command_id: u16,
    /// The device context it runs in.
    pub context: u32,
    /// Source IOVA.
    pub src: u64,
    /// Destination IOVA.
    pub dst: u64,
    /// Length in bytes.
    pub len: u64,
    /// Operation-specific arguments.
    pub args: [u64; 4],
}

const _: () = {
    assert!(size_of::<Command>() == 64);
    assert!(offset_of!(Command, opcode) == 0);
    assert!(offset_of!(Command, flags) == 1);
    assert!(offset_of!(Command, command_id) == 2);
    assert!(offset_of!(Command, context) == 4);
    assert!(offset_of!(Command, src) == 8);
    assert!(offset_of!(Command, dst) == 16);
    assert!(offset_of!(Command, len) == 24);
    assert!(offset_of!(Command, args) == 32);
};

impl Submission for Command {
    fn command_id(&self) -> u16 {
        self.command_id
    }
    fn set_command_id(&mut self, id: u16) {
        self.command_id = id;
    }
}

/// A 16-byte completion entry, laid out like NVMe's: a result, the SQ head and queue id, the
/// command id, and a status word whose bit 0 is the phase and bits 1..16 the status code
/// (0: success).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct Status {
    /// Operation-specific result.
    pub result: u64,
    /// The SQ head when the entry was written (informational; the queue uses the write-back).
    pub sq_head: u16,
    /// The queue id.
    pub queue_id: u16,
    /// The id of the command completed.
    pub command_id: u16,
    /// Bit 0: the phase (set by the ring); bits 1..16: the status code.
    pub status: u16,
}

const _: () = {
    assert!(size_of::<Status>() == 16);
    assert!(offset_of!(Status, result) == 0);
    assert!(offset_of!(Status, sq_head) == 8);
    assert!(offset_of!(Status, queue_id) == 10);
    assert!(offset_of!(Status, command_id) == 12);
    assert!(offset_of!(Status, status) == 14);
};

impl Status {
    /// A completion of `command_id` with status `code` (0: success; 15 bits) and `result`.
    pub fn new(command_id: u16, code: u16, result: u64) -> Status {
        Status {
            result,
            sq_head: 0,
            queue_id: 0,
            command_id,
            status: code << 1,
        }
    }

    /// The status code (0: success).
    pub fn code(&self) -> u16 {
        self.status >> 1
    }

    /// Whether the command succeeded.
    pub fn is_success(&self) -> bool {
        self.code() == 0
    }
}

impl Completion for Status {
    /// The 32-bit word at byte 12 holds `command_id` and `status`.
    const PHASE_WORD: usize = 12;
    /// Bit 0 of `status`, which is the high half of that word on a little-endian host.
    const PHASE_BIT: u32 = if cfg!(target_endian = "little") {
        1 << 16
    } else {
        1
    };

    fn command_id(&self) -> u16 {
        self.command_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::Memory;

    #[test]
    fn phase_bit_is_bit_zero_of_status() {
        let mut status = Status::new(7, 3, 99);
        status.status |= 1;
        let word = Memory::word_of(&status, Status::PHASE_WORD);
        assert_eq!(word & Status::PHASE_BIT, Status::PHASE_BIT);
        assert_eq!(
            word & !Status::PHASE_BIT,
            Memory::word_of(&Status::new(7, 3, 99), 12)
        );
        assert_eq!(status.code(), 3);
        assert!(!status.is_success());
        assert!(Status::new(1, 0, 0).is_success());
    }
}
