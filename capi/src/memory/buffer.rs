//! A buffer's state and addresses (`udma_buffer_info`), and reading and writing a buffer that
//! is on the host.

use std::ffi::c_void;

use super::tables::{lock_buffer, udma_buffer, HostBuffer, State};
use crate::abi;
use crate::error::{call, lib, udma_status, Fail};
use crate::handle::Kind;

/// Where a buffer is (`udma_buffer_info.state`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_buffer_state {
    /// On the host: read it, write it, submit it, free it.
    UDMA_BUFFER_HOST = 0,
    /// In a queue: the device's until its completion; not to be touched.
    UDMA_BUFFER_IN_QUEUE = 1,
}

/// A buffer's addresses (`udma_buffer_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_buffer_info {
    /// `sizeof(udma_buffer_info)`.
    pub size: usize,
    /// The host address of byte 0. Read and write it only while `state` is
    /// `UDMA_BUFFER_HOST`: the device may write it while it is in a queue.
    pub host: *mut c_void,
    /// The IOVA (device address) of byte 0; the buffer is contiguous in IOVA space.
    pub iova: u64,
    /// The length asked for.
    pub len: u64,
    /// Bytes it can hold (its block size).
    pub capacity: u64,
    /// A `udma_buffer_state`.
    pub state: u32,
    /// Zero.
    pub reserved: u32,
}

// SAFETY: `repr(C)`, a raw pointer (any bit pattern is a valid raw pointer value) and
// integers, 8 * 5 + 4 + 4 = 48 bytes with no padding.
unsafe impl abi::Bytes for udma_buffer_info {}
abi::sized!(udma_buffer_info);

/// The buffer's host address, IOVA, length and state.
///
/// # Safety
/// `info` points to `info->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_buffer_get_info(
    buffer: *const udma_buffer,
    info: *mut udma_buffer_info,
) -> udma_status {
    call("udma_buffer_get_info", || {
        let value = lock_buffer(buffer)?.with(|b| match &b.state {
            State::Host(owned) => udma_buffer_info {
                size: 0,
                host: owned.as_ptr().as_ptr().cast(),
                iova: owned.iova().raw(),
                len: owned.len() as u64,
                capacity: owned.capacity() as u64,
                state: udma_buffer_state::UDMA_BUFFER_HOST as u32,
                reserved: 0,
            },
            State::Queued(q) => udma_buffer_info {
                size: 0,
                host: std::ptr::with_exposed_provenance_mut(q.host),
                iova: q.iova,
                len: q.len,
                capacity: q.capacity,
                state: udma_buffer_state::UDMA_BUFFER_IN_QUEUE as u32,
                reserved: 0,
            },
        });
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", value) }
    })
}

/// Runs `f` on a buffer that is on the host (`UDMA_ERR_BUSY` for one in a queue).
pub(crate) fn with_host_buffer<R>(
    buffer: *const udma_buffer,
    f: impl FnOnce(&HostBuffer) -> Result<R, Fail>,
) -> Result<R, Fail> {
    on_host(buffer, f)
}

/// Runs `f` on a buffer that is on the host.
fn on_host<R>(
    buffer: *const udma_buffer,
    f: impl FnOnce(&HostBuffer) -> Result<R, Fail>,
) -> Result<R, Fail> {
    let mut guard = lock_buffer(buffer)?;
    let key = guard.key();
    guard.with(|b| match &b.state {
        State::Host(owned) => f(owned),
        State::Queued(q) => Err(Fail::new(
            udma_status::UDMA_ERR_BUSY,
            format!(
                "buffer {:#x} (IOVA {:#x}) is in {}: the device owns it until its \
                 completion hands it back",
                key.value(Kind::Buffer),
                q.iova,
                q.name
            ),
        )),
    })
}

fn range(owned: &HostBuffer, offset: u64, len: usize) -> Result<usize, Fail> {
    let end = offset.checked_add(len as u64);
    match end {
        Some(end) if end <= owned.len() as u64 => Ok(offset as usize),
        _ => Err(Fail::invalid(format!(
            "{len} bytes at offset {offset} run past the buffer's {} bytes (IOVA {:#x})",
            owned.len(),
            owned.iova().raw()
        ))),
    }
}

/// Copies `len` bytes from `src` into the buffer at `offset`.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a range past the buffer's length; `UDMA_ERR_BUSY`
/// for a buffer in a queue.
///
/// # Safety
/// `src` points to `len` readable bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn udma_buffer_write(
    buffer: *const udma_buffer,
    offset: u64,
    src: *const c_void,
    len: usize,
) -> udma_status {
    call("udma_buffer_write", || {
        if src.is_null() && len > 0 {
            return Err(Fail::null("src"));
        }
        on_host(buffer, |owned| {
            let at = range(owned, offset, len)?;
            if len == 0 {
                return Ok(());
            }
            // SAFETY: non-null, `len` readable bytes per this function's contract.
            let bytes = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) };
            owned.write(at, bytes).map_err(lib)
        })
    })
}

/// Copies `len` bytes of the buffer at `offset` into `dst`.
///
/// Errors: as `udma_buffer_write`.
///
/// # Safety
/// `dst` points to `len` writable bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn udma_buffer_read(
    buffer: *const udma_buffer,
    offset: u64,
    dst: *mut c_void,
    len: usize,
) -> udma_status {
    call("udma_buffer_read", || {
        if dst.is_null() && len > 0 {
            return Err(Fail::null("dst"));
        }
        on_host(buffer, |owned| {
            let at = range(owned, offset, len)?;
            if len == 0 {
                return Ok(());
            }
            // SAFETY: non-null, `len` writable bytes per this function's contract; not
            // aliased by the buffer (the pool's memory is not the caller's `dst`... unless the
            // caller passes the buffer's own host address, which `read` copies through
            // volatile loads into it byte-wise: still defined).
            let bytes = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
            owned.read(at, bytes).map_err(lib)
        })
    })
}
