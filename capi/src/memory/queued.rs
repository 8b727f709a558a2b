//! Buffers lent to queues (for the queue module): taking a buffer out of its slot for a
//! submission, giving it back at its completion, forgetting what a queue leaked.

use std::sync::Arc;

use udma::dma::Space;

use super::tables::{
    forgotten, lock_buffer, never_pinned, udma_buffer, HostBuffer, Queued, State, BUFFERS, POOLS,
};
use crate::error::{udma_status, Fail};
use crate::handle::{Key, Kind};

/// Whether the pool `pool` (of buffer `buffer`) maps into `space`, the DMA space of queue
/// `name`: `UDMA_ERR_INVALID_ARGUMENT` if not. The pool is pinned without waiting: its slot
/// is locked only by its destroy, which waits for this buffer's lock (held by the caller) and
/// then fails, the buffer being out; meanwhile the submission is refused as busy.
fn same_space(pool: Key, space: &Arc<dyn Space>, buffer: Key, name: &str) -> Result<(), Fail> {
    let value = pool.value(Kind::Pool);
    let pinned = POOLS.pin(pool, value).map_err(|_| {
        Fail::new(
            udma_status::UDMA_ERR_BUSY,
            format!(
                "buffer {:#x}'s pool {value:#x} is being destroyed on another thread: submit \
                 once that call has returned",
                buffer.value(Kind::Buffer)
            ),
        )
    })?;
    // The device's name is read (and copied) only for the error.
    if pinned.with(|e| std::ptr::addr_eq(Arc::as_ptr(&e.space), Arc::as_ptr(space))) {
        return Ok(());
    }
    let device = pinned.with(|e| e.device.clone());
    Err(Fail::invalid(format!(
        "buffer {:#x} is of pool {value:#x}, on another device ({device}) than {name}: its \
         IOVA would name other memory there; allocate it from a pool of the queue's device",
        buffer.value(Kind::Buffer)
    )))
}

/// Takes the buffer `ptr` out of its slot for queue `queue` (named `name`, on DMA space
/// `space`), checking that it is on the host, of a pool mapped into `space` (an IOVA of
/// another device's space names other memory on this one), and that `[offset, offset + len)`
/// lies inside it; returns its key, its buffer and the IOVA of `offset`.
pub(crate) fn take_for_queue(
    ptr: *const udma_buffer,
    offset: u64,
    len: u64,
    queue: u64,
    name: &str,
    space: &Arc<dyn Space>,
) -> Result<(Key, HostBuffer, u64), Fail> {
    let mut guard = lock_buffer(ptr)?;
    let key = guard.key();
    guard.with(|b| {
        same_space(b.pool, space, key, name)?;
        let owned = match &b.state {
            State::Host(owned) => owned,
            State::Queued(q) => {
                return Err(Fail::new(
                    udma_status::UDMA_ERR_BUSY,
                    format!(
                        "buffer {:#x} is in {} already: submit it again after its completion",
                        key.value(Kind::Buffer),
                        q.name
                    ),
                ))
            }
        };
        let end = offset.checked_add(len);
        let iova = match end {
            Some(end) if end <= owned.len() as u64 => owned.iova_at(offset as usize),
            _ => None,
        };
        let Some(iova) = iova else {
            return Err(Fail::invalid(format!(
                "{len} bytes at offset {offset} run past buffer {:#x}'s {} bytes (IOVA {:#x})",
                key.value(Kind::Buffer),
                owned.len(),
                owned.iova().raw()
            )));
        };
        let queued = State::Queued(Box::new(Queued {
            queue,
            name: name.to_owned(),
            host: owned.as_ptr().as_ptr().expose_provenance(),
            iova: owned.iova().raw(),
            len: owned.len() as u64,
            capacity: owned.capacity() as u64,
        }));
        let State::Host(owned) = std::mem::replace(&mut b.state, queued) else {
            unreachable!()
        };
        Ok((key, owned, iova.raw()))
    })
}

/// Puts a buffer back on the host, under its handle (a completion, a refused submission).
pub(crate) fn give_back(key: Key, buffer: HostBuffer) {
    // The slot is live: a buffer in a queue cannot be freed (only forgotten, with its queue).
    match BUFFERS.lock(key, key.value(Kind::Buffer), never_pinned) {
        Ok(mut b) => b.with(|b| b.state = State::Host(buffer)),
        // Not reached; if it were, the slot no longer names the pool, which may be gone:
        // leak the buffer rather than free it into freed memory.
        Err(_) => std::mem::forget(buffer),
    }
}

/// Forgets the buffers queue `queue` held when the device could not be stopped: their
/// memory stays with the device (leaked on purpose), their handles become invalid.
pub(crate) fn forget_queued(queue: u64) {
    for key in BUFFERS.live() {
        let Ok(mut b) = BUFFERS.lock(key, key.value(Kind::Buffer), never_pinned) else {
            continue;
        };
        if b.with(|b| matches!(&b.state, State::Queued(q) if q.queue == queue)) {
            // The buffer stays in the leaked command and borrows its pool: its destroy is
            // to keep the pool's memory. Noted before the slot goes, so a destroy counting
            // buffers (which waits for this slot's lock) sees the note once it sees the slot
            // free.
            let pool = b.with(|b| b.pool);
            forgotten().push(pool);
            drop(b.remove(None));
        }
    }
}
