//! A queue's interrupt for the caller's own event loop: its eventfd, arming and disarming it.

use std::ffi::c_int;
use std::os::fd::AsRawFd;

use super::lifecycle::{udma_queue, with_queue};
use crate::abi;
use crate::error::{call, lib, udma_status, Fail};

/// The queue's interrupt eventfd (borrowed: valid until the queue is destroyed; do not close
/// it), for the caller's own epoll loop: `udma_queue_arm`, then sleep until the fd is
/// readable (unless `arm` said a completion is ready), then `udma_queue_disarm` and
/// `udma_queue_poll`.
///
/// Errors: `UDMA_ERR_UNSUPPORTED` for a queue made with `UDMA_QUEUE_POLL`.
///
/// # Safety
/// `fd` points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_interrupt_fd(
    queue: *const udma_queue,
    fd: *mut c_int,
) -> udma_status {
    call("udma_queue_interrupt_fd", || {
        let out = abi::out(fd, "fd")?;
        let raw = with_queue(queue, |_, q| {
            q.interrupt().map(|i| i.as_raw_fd()).ok_or_else(|| {
                Fail::new(
                    udma_status::UDMA_ERR_UNSUPPORTED,
                    "the queue was made with UDMA_QUEUE_POLL: it has no interrupt",
                )
            })
        })?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(raw) };
        Ok(())
    })
}

/// Asks the device to raise the queue's interrupt for its next completion (draining stale
/// signals first). `*ready` says a completion is there already: do not sleep then.
///
/// # Safety
/// `ready` points to a writable `bool`.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_arm(queue: *mut udma_queue, ready: *mut bool) -> udma_status {
    call("udma_queue_arm", || {
        let out = abi::out(ready, "ready")?;
        let got = with_queue(queue, |_, q| q.arm_interrupt().map_err(lib))?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(got) };
        Ok(())
    })
}

/// Stops the device raising the queue's interrupt (after a wake-up).
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_queue_disarm(queue: *mut udma_queue) -> udma_status {
    call("udma_queue_disarm", || {
        with_queue(queue, |_, q| {
            q.disarm_interrupt();
            Ok(())
        })
    })
}
