//! Frames from C: submit by the buffers' offsets, take completions without waiting or with a
//! timeout (`udma_owner_submit`, `udma_owner_poll`, `udma_owner_wait`).

use crate::abi;
use crate::device::timeout;
use crate::error::{call, udma_status};

use userdma_owner::Span;

use super::{completion, fail, udma_owner_client, udma_owner_completion, with_client, Pending};

/// Submits a frame of `stream`: the device reads the input at `input_offset` of the client's
/// pool and writes the result at `result_offset` (offsets of buffers from `udma_owner_alloc`,
/// at least the stream's `input_bytes` and `result_bytes` long). Its completion carries `tag`;
/// give each frame in flight its own tag (the library matches a completion to its
/// submission by stream and tag to know when its buffers are free). No system call while the
/// owner is busy. A stream this client did not declare, an offset that is no buffer of
/// `udma_owner_alloc`'s (never allocated, freed, or inside one) or a buffer shorter than the
/// stream needs is not an error here: the frame completes with `UDMA_OWNER_STATUS_REFUSED`,
/// nothing read or written. The input and the result may be the same buffer.
///
/// Errors: `UDMA_ERR_BUSY` when the client has its limit of frames in flight (take
/// completions first); `UDMA_ERR_NOT_FOUND` after the owner went away.
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_owner_submit(
    client: *mut udma_owner_client,
    stream: u32,
    input_offset: u64,
    result_offset: u64,
    tag: u64,
) -> udma_status {
    call("udma_owner_submit", || {
        with_client(client, |state| {
            // The owner cannot tell which buffer an offset starts nor how long it is: the
            // buffers this library gave out and has not freed are the ones named, by this
            // table; the client refuses the others, and those too short, before sending.
            let known = |offset: u64| {
                state.buffers.get(&offset).map(|b| Span {
                    offset,
                    len: b.len() as u64,
                })
            };
            let (input, result) = (known(input_offset), known(result_offset));
            let spans = state.spans(stream, input, result);
            state
                .client
                .submit_spans(stream, input, result, tag)
                .map_err(fail)?;
            state.pending.push(Pending { stream, tag, spans });
            Ok(())
        })
    })
}

/// Takes one completion if there is one, without waiting: `*ready` says whether
/// `*completion` was filled. Costs no system call when one is there.
///
/// Errors: `UDMA_ERR_NOT_FOUND` once the owner went away and nothing more will complete (the
/// message says so; disconnect, and connect again once it is back).
///
/// # Safety
/// `completion` points to `completion->size` writable bytes; `ready` to a writable `bool`.
#[no_mangle]
pub unsafe extern "C" fn udma_owner_poll(
    client: *mut udma_owner_client,
    completion: *mut udma_owner_completion,
    ready: *mut bool,
) -> udma_status {
    call("udma_owner_poll", || {
        let ready = abi::out(ready, "ready")?;
        // Checked before taking anything, so a bad struct loses no completion.
        // SAFETY: per this function's contract.
        unsafe { abi::write(completion, "completion", udma_owner_completion::default())? };
        let done = with_client(client, |state| {
            if let Some(c) = state.client.poll() {
                state.completed(&c);
                return Ok(Some(c));
            }
            // Nothing: look at the socket once, so a program that only polls learns that the
            // owner left.
            state.take_events()?;
            if state.client.is_gone() {
                return Err(fail(userdma_owner::Error::Gone {
                    why: "nothing more will complete",
                }));
            }
            Ok(None)
        })?;
        if let Some(c) = &done {
            // SAFETY: per this function's contract (checked above).
            unsafe { abi::write(completion, "completion", self::completion(c))? };
        }
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { ready.write(done.is_some()) };
        Ok(())
    })
}

/// Waits up to `timeout_ns` nanoseconds (`UDMA_TIMEOUT_INFINITE`: forever) for a completion
/// and takes it. Sleeps only when nothing has completed. Events the owner sends meanwhile
/// are kept for `udma_owner_next_event`.
///
/// Errors: `UDMA_ERR_TIMEOUT` when the time is up; `UDMA_ERR_NOT_FOUND` when the owner went
/// away (the message says "the device owner closed the connection"): frames in flight never
/// complete; disconnect, and connect again once it is back.
///
/// # Safety
/// `completion` points to `completion->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_owner_wait(
    client: *mut udma_owner_client,
    timeout_ns: u64,
    completion: *mut udma_owner_completion,
) -> udma_status {
    call("udma_owner_wait", || {
        // SAFETY: per this function's contract.
        unsafe { abi::write(completion, "completion", udma_owner_completion::default())? };
        let c = with_client(client, |state| {
            let c = state.client.wait(timeout(timeout_ns)).map_err(fail)?;
            state.completed(&c);
            Ok(c)
        })?;
        // SAFETY: per this function's contract (checked above).
        unsafe { abi::write(completion, "completion", self::completion(&c)) }
    })
}
