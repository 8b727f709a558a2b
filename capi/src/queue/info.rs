//! What a queue and its completions say: the queue's counters (`udma_queue_info`) and the
//! name of a completion's device status.

use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::lifecycle::{udma_queue, with_queue};
use crate::abi;
use crate::error::{call, cstr, udma_status};

/// A queue's state (`udma_queue_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable)]
pub struct udma_queue_info {
    /// `sizeof(udma_queue_info)`.
    pub size: usize,
    /// Ops submitted.
    pub submitted: u64,
    /// Completions taken.
    pub completed: u64,
    /// Ops in flight (submitted, completion not taken).
    pub in_flight: u32,
    /// Entries per ring.
    pub depth: u32,
    /// The device's queue index.
    pub index: u32,
    /// Zero.
    pub reserved: u32,
}

abi::sized!(udma_queue_info);

/// The queue's counters.
///
/// # Safety
/// `info` points to `info->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_get_info(
    queue: *const udma_queue,
    info: *mut udma_queue_info,
) -> udma_status {
    call("udma_queue_get_info", || {
        let value = with_queue(queue, |_, q| {
            let s = q.stats();
            Ok(udma_queue_info {
                size: 0,
                submitted: s.submitted,
                completed: s.completed,
                in_flight: q.in_flight() as u32,
                depth: q.depth(),
                index: u32::from(q.id()),
                reserved: 0,
            })
        })?;
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", value) }
    })
}

/// The name of a completion's device status (`"host-unmapped"`), a static string.
#[no_mangle]
pub extern "C" fn udma_op_status_name(status: u32) -> *const std::ffi::c_char {
    op_status(status).as_ptr()
}

/// The name of a completion's device status.
pub(crate) fn op_status(status: u32) -> &'static std::ffi::CStr {
    match status {
        0 => cstr(b"success\0"),
        1 => cstr(b"bad-opcode\0"),
        2 => cstr(b"bad-flags\0"),
        3 => cstr(b"bad-context\0"),
        4 => cstr(b"bad-args\0"),
        5 => cstr(b"bad-length\0"),
        6 => cstr(b"address-overflow\0"),
        7 => cstr(b"misaligned\0"),
        8 => cstr(b"device-out-of-bounds\0"),
        9 => cstr(b"host-unmapped\0"),
        10 => cstr(b"overlap\0"),
        _ => cstr(b"unknown\0"),
    }
}
