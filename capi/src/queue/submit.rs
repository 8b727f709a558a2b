//! Submitting ops: checking one, moving its buffer into the queue, queueing its descriptor,
//! and ringing the doorbell (at once, or once for a batch with `udma_queue_flush`).

use super::lifecycle::{udma_queue, with_queue, Flight};
use super::op::{descriptor, udma_op};
use crate::abi;
use crate::error::{call, lib, udma_status, Fail};
use crate::memory;

/// Checks and queues one op; `ring` also rings the doorbell.
///
/// # Safety
/// `op` is NULL or points to `op->size` readable bytes.
unsafe fn submit(queue: *mut udma_queue, op: *const udma_op, ring: bool) -> Result<(), Fail> {
    // SAFETY: per the caller's contract.
    let op = unsafe { abi::read(op, "op", udma_op::default())? };
    with_queue(queue, |entry, q| {
        // A removed device runs nothing: the op would sit in the queue until its destroy.
        if entry.device.runtime.device().is_removed() {
            return Err(Fail::new(
                udma_status::UDMA_ERR_REMOVED,
                format!(
                    "{} was removed: nothing queued; destroy the queue (the buffers it holds \
                     come back with udma_queue_destroy)",
                    entry.name
                ),
            ));
        }
        let wants_buffer = matches!(op.opcode, 1 | 2);
        let taken = match (wants_buffer, op.buffer.is_null()) {
            (true, true) => {
                return Err(Fail::invalid("op->buffer is NULL: the op moves host bytes"))
            }
            (false, false) => {
                return Err(Fail::invalid(
                    "op->buffer is set for an op that names no host memory: leave it NULL",
                ))
            }
            (true, false) => Some(memory::take_for_queue(
                op.buffer,
                op.buffer_offset,
                op.len,
                entry.handle,
                &entry.name,
                entry.device.runtime.dma_space(),
            )?),
            (false, true) => None,
        };
        let built = descriptor(&op, taken.as_ref().map(|t| t.2));
        let (desc, flight) = match built {
            Ok(desc) => (
                desc,
                Flight {
                    buffer: taken.map(|(k, b, _)| (k, b)),
                    user_data: op.user_data,
                },
            ),
            Err(fail) => {
                if let Some((key, buffer, _)) = taken {
                    memory::give_back(key, buffer);
                }
                return Err(fail);
            }
        };
        match q.push(desc.build(), flight) {
            Ok(_) => {}
            Err(rejected) => {
                if let Some((key, buffer)) = rejected.payload.buffer {
                    memory::give_back(key, buffer);
                }
                return Err(lib(rejected.error));
            }
        }
        if ring {
            q.flush().map_err(lib)?;
        }
        Ok(())
    })
}

/// Submits one op and rings the doorbell. Its buffer (if any) moves into the queue.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a bad opcode or argument, a buffer range past its
/// end, a buffer of a pool on another device than the queue's (its IOVA would name other
/// memory there), or a buffer missing or superfluous; `UDMA_ERR_BUSY` for a buffer in a queue
/// already, or whose pool another thread is destroying; `UDMA_ERR_REMOVED` once the device is
/// removed; `UDMA_ERR_EXHAUSTED` when the ring is full (take completions first). On an error nothing
/// was queued and the buffer stays the caller's.
///
/// # Safety
/// `op` points to `op->size` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_submit(
    queue: *mut udma_queue,
    op: *const udma_op,
) -> udma_status {
    // SAFETY: per this function's contract.
    call("udma_queue_submit", || unsafe { submit(queue, op, true) })
}

/// Queues one op without ringing the doorbell (`udma_queue_flush` rings it once for a batch).
///
/// # Safety
/// `op` points to `op->size` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_push(
    queue: *mut udma_queue,
    op: *const udma_op,
) -> udma_status {
    // SAFETY: per this function's contract.
    call("udma_queue_push", || unsafe { submit(queue, op, false) })
}

/// Rings the doorbell once for everything pushed since the last flush.
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_queue_flush(queue: *mut udma_queue) -> udma_status {
    call("udma_queue_flush", || {
        with_queue(queue, |_, q| q.flush().map_err(lib))
    })
}
