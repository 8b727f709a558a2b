//! Completions (`udma_completion`): taking one without waiting, waiting for one, and
//! sleeping until one of many queues has one.

use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use udma::{irq, ring};

use super::lifecycle::{udma_queue, with_queue, Flight, QUEUES};
use crate::abi;
use crate::device::timeout;
use crate::error::{call, lib, udma_status, Fail};
use crate::handle::Kind;
use crate::memory::{self, udma_buffer};

/// A finished op (`udma_queue_poll`, `udma_queue_wait`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_completion {
    /// `sizeof(udma_completion)`.
    pub size: usize,
    /// The op's `user_data`.
    pub user_data: u64,
    /// The op's buffer, on the host again (NULL if it had none).
    pub buffer: *mut udma_buffer,
    /// The op's result (`UDMA_OP_COMPUTE`: the sum; an error: the address at fault).
    pub result: u64,
    /// The device's status: 0 success; otherwise the loopback device's code
    /// (`udma_op_status_name` names it).
    pub status: u32,
    /// The command id the queue gave the op.
    pub command_id: u32,
}

// SAFETY: `repr(C)`, integers and a raw pointer (any bit pattern is a valid raw pointer
// value), 8 * 4 + 4 + 4 = 40 bytes with no padding.
unsafe impl abi::Bytes for udma_completion {}
abi::sized!(udma_completion);

fn complete(done: ring::Done<ring::Status, Flight>) -> udma_completion {
    let buffer = done.payload.buffer.map(|(key, owned)| {
        memory::give_back(key, owned);
        key.to_ptr(Kind::Buffer)
    });
    udma_completion {
        size: 0,
        user_data: done.payload.user_data,
        buffer: buffer.unwrap_or(std::ptr::null_mut()),
        result: done.entry.result,
        status: u32::from(done.entry.code()),
        command_id: u32::from(done.id),
    }
}

/// Takes one completion if there is one, without waiting: `*ready` says whether
/// `*completion` was filled. Its buffer is back on the host.
///
/// # Safety
/// `completion` points to `completion->size` writable bytes; `ready` to a writable `bool`.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_poll(
    queue: *mut udma_queue,
    completion: *mut udma_completion,
    ready: *mut bool,
) -> udma_status {
    call("udma_queue_poll", || {
        let ready = abi::out(ready, "ready")?;
        abi::out(completion, "completion")?;
        // Checked before taking anything, so a bad struct loses no completion.
        // SAFETY: per this function's contract.
        unsafe { abi::write(completion, "completion", empty())? };
        let done = with_queue(queue, |_, q| q.poll_one().map_err(lib))?;
        let got = done.is_some();
        if let Some(done) = done {
            // SAFETY: per this function's contract (checked above).
            unsafe { abi::write(completion, "completion", complete(done))? };
        }
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { ready.write(got) };
        Ok(())
    })
}

fn empty() -> udma_completion {
    udma_completion {
        size: 0,
        user_data: 0,
        buffer: std::ptr::null_mut(),
        result: 0,
        status: 0,
        command_id: 0,
    }
}

/// Waits up to `timeout_ns` nanoseconds (`UDMA_TIMEOUT_INFINITE`: forever) for a completion
/// and takes it.
///
/// Errors: `UDMA_ERR_TIMEOUT` when the time is up (the message says how many ops are in
/// flight).
///
/// # Safety
/// `completion` points to `completion->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_wait(
    queue: *mut udma_queue,
    timeout_ns: u64,
    completion: *mut udma_completion,
) -> udma_status {
    call("udma_queue_wait", || {
        // SAFETY: per this function's contract.
        unsafe { abi::write(completion, "completion", empty())? };
        let done = with_queue(queue, |_, q| q.wait(timeout(timeout_ns)).map_err(lib))?;
        // SAFETY: per this function's contract (checked above).
        unsafe { abi::write(completion, "completion", complete(done)) }
    })
}

/// The most queues `udma_queue_wait_any` takes.
const MAX_WAIT_ANY: usize = 4096;

/// Sleeps until one of `queues[0..count]` has a completion, or `timeout_ns` passes, and sets
/// `*ready` to the index of one that has (take it with `udma_queue_poll`).
///
/// Errors: `UDMA_ERR_TIMEOUT` when none has one in time; `UDMA_ERR_INVALID_ARGUMENT` for a
/// queue listed twice, `count` 0 or above 4096; `UDMA_ERR_UNSUPPORTED` for a queue made with
/// `UDMA_QUEUE_POLL` (no interrupt to sleep on).
///
/// # Safety
/// `queues` points to `count` readable `udma_queue *`; `ready` to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_wait_any(
    queues: *const *mut udma_queue,
    count: usize,
    timeout_ns: u64,
    ready: *mut usize,
) -> udma_status {
    call("udma_queue_wait_any", || {
        let out = abi::out(ready, "ready")?;
        if queues.is_null() {
            return Err(Fail::null("queues"));
        }
        if count == 0 {
            return Err(Fail::invalid("count is 0: pass at least one queue"));
        }
        if count > MAX_WAIT_ANY {
            return Err(Fail::invalid(format!(
                "count is {count}: wait on at most {MAX_WAIT_ANY} queues at once"
            )));
        }
        // SAFETY: non-null, `count` readable entries per this function's contract.
        let list = unsafe { std::slice::from_raw_parts(queues, count) };
        let mut entries = Vec::with_capacity(count);
        for (i, &ptr) in list.iter().enumerate() {
            let e = QUEUES
                .with(ptr, |_, q| Ok(Arc::clone(q)))
                .map_err(|f| f.context(format!("queues[{i}]")))?;
            entries.push((i, e));
        }
        // Lock in one global order (by address), whatever the caller's order; a queue listed
        // twice is next to itself in that order.
        let mut order: Vec<usize> = (0..count).collect();
        order.sort_by_key(|&i| (Arc::as_ptr(&entries[i].1).addr(), i));
        if let Some(pair) = order
            .windows(2)
            .find(|w| Arc::ptr_eq(&entries[w[0]].1, &entries[w[1]].1))
        {
            return Err(Fail::invalid(format!(
                "queues[{}] is listed twice (also queues[{}])",
                pair[1], pair[0]
            )));
        }
        let mut guards: Vec<Option<MutexGuard<'_, _>>> = (0..count).map(|_| None).collect();
        for &i in &order {
            guards[i] = Some(entries[i].1.lock());
        }
        let mut waiter = irq::Waiter::with_epoll().map_err(lib)?;
        let mut waitables: Vec<&mut dyn ring::Waitable> = Vec::with_capacity(count);
        for (i, guard) in guards.iter_mut().enumerate() {
            let name = &entries[i].1.name;
            let q = guard
                .as_mut()
                .and_then(|g| g.as_mut())
                .ok_or_else(|| Fail::handle(format!("queues[{i}] ({name}) was destroyed")))?;
            let irq = q.interrupt().ok_or_else(|| {
                Fail::new(
                    udma_status::UDMA_ERR_UNSUPPORTED,
                    format!(
                        "queues[{i}] ({name}) was made with UDMA_QUEUE_POLL: it has no \
                         interrupt to sleep on (poll it instead)"
                    ),
                )
            })?;
            waiter.add(irq, i as u64).map_err(lib)?;
            waitables.push(q);
        }
        let mut found = Vec::with_capacity(count);
        ring::wait_any(&mut waiter, &mut waitables, timeout(timeout_ns), &mut found)
            .map_err(lib)?;
        let Some(&first) = found.first() else {
            return Err(Fail::new(
                udma_status::UDMA_ERR_TIMEOUT,
                format!(
                    "none of the {count} queues completed anything within {:?}: check that \
                     ops were submitted (and flushed) to them",
                    Duration::from_nanos(timeout_ns)
                ),
            ));
        };
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(first) };
        Ok(())
    })
}
