//! Allocating buffers from a pool (one, or many all or nothing) and freeing them back into it
//! (one, or many all or nothing).

use std::collections::HashSet;

use udma::pool::{self, Buffer};

use super::local::{hold_pool, with_local, Held};
use super::tables::{
    lock_buffer, never_pinned, pin_pool, pool_device, udma_buffer, udma_pool, BufferEntry,
    HostBuffer, PoolEntry, State, BUFFERS, POOLS,
};
use crate::abi;
use crate::error::{call, lib, udma_status, Fail};
use crate::handle::{self, Key, Kind, MAX_LIVE};

#[inline(always)]
fn alloc_one(p: &PoolEntry, len: u64) -> Result<HostBuffer, Fail> {
    if len == 0 {
        return Err(out_of_range(p, len));
    }
    // A length above the pool's largest block fails in the pool (`TooLarge`), off the fast
    // path; the message is made in `alloc_failed`.
    match p.pool.alloc(usize::try_from(len).unwrap_or(usize::MAX)) {
        // SAFETY: only the lifetime changes; the pool outlives the buffer as `HostBuffer`
        // says. The buffer goes into a slot that names its pool (`entry`) before the caller
        // leaves the section it reads `p` in (or is dropped inside it), so
        // `udma_pool_destroy` either waits for it or counts it.
        Ok(b) => Ok(unsafe { std::mem::transmute::<Buffer<'_>, HostBuffer>(b) }),
        Err(e) => Err(alloc_failed(p, len, e)),
    }
}

#[cold]
#[inline(never)]
fn out_of_range(p: &PoolEntry, len: u64) -> Fail {
    Fail::invalid(format!(
        "len {len} is out of range for the pool on {}: ask for 1 to {} bytes",
        p.device,
        p.pool.max_len()
    ))
}

#[cold]
#[inline(never)]
fn alloc_failed(p: &PoolEntry, len: u64, error: pool::Error) -> Fail {
    if len > p.pool.max_len() as u64 {
        return out_of_range(p, len);
    }
    lib(error).context(&p.device)
}

/// Fills the claimed buffer slot `index` with `buffer` of pool `pool`, field by field (built
/// whole and copied in, the entry went through the stack, a store-forwarding stall).
#[inline(always)]
fn fill_buffer(index: u32, pool: Key, buffer: HostBuffer) -> Result<Key, Fail> {
    let init = |p: *mut BufferEntry| {
        // SAFETY: `p` points to the slot's (uninitialised) entry, ours to write.
        unsafe {
            (&raw mut (*p).pool).write(pool);
            (&raw mut (*p).state).write(State::Host(buffer));
        }
    };
    // SAFETY: `init` initialises both fields of the entry.
    unsafe { BUFFERS.fill_with(index, init) }
}

/// `count` buffers of `len` bytes from the held pool, each in a buffer slot: all or nothing.
fn alloc_into_slots(held: &Held, len: u64, count: usize) -> Result<Vec<Key>, Fail> {
    if count > MAX_LIVE {
        return Err(Fail::invalid(format!(
            "count {count} is above {MAX_LIVE}, the most live buffer handles"
        )));
    }
    // More buffers than the pool has blocks of that length can never be had: refused before
    // anything is sized by the count.
    let pool = &held.entry().pool;
    let block = usize::try_from(len)
        .unwrap_or(usize::MAX)
        .max(udma::pool::MIN_ALIGN);
    let blocks = pool.arena_len() / block;
    if count > blocks {
        return Err(Fail::new(
            udma_status::UDMA_ERR_EXHAUSTED,
            format!(
                "{count} buffers of {len} bytes are more than the pool's {} bytes can hold \
                 ({blocks} at most): create a larger pool or allocate fewer",
                pool.arena_len()
            ),
        ));
    }
    let mut made = Vec::with_capacity(count);
    for i in 0..count {
        let b = alloc_one(held.entry(), len)
            .map_err(|fail| fail.context(format!("buffer {i} of {count}")))?;
        made.push(b);
    }
    let local = held.local();
    let mut keys: Vec<Key> = Vec::with_capacity(count);
    for b in made.drain(..) {
        match BUFFERS
            .claim(local)
            .and_then(|index| fill_buffer(index, held.key, b))
        {
            Ok(k) => keys.push(k),
            Err(fail) => {
                for k in keys {
                    if let Ok(g) = BUFFERS.lock(k, k.value(Kind::Buffer), never_pinned) {
                        drop(g.remove(local));
                    }
                }
                return Err(fail);
            }
        }
    }
    Ok(keys)
}

/// Allocates a buffer of `len` bytes (1 to the pool's `max_len`). No system call and no lock
/// on the fast path.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a length out of range; `UDMA_ERR_EXHAUSTED` when
/// nothing is free (after waiting, with `wait_us`).
///
/// # Safety
/// `buffer` points to a writable `udma_buffer *`.
#[no_mangle]
pub unsafe extern "C" fn udma_pool_alloc(
    pool: *const udma_pool,
    len: u64,
    buffer: *mut *mut udma_buffer,
) -> udma_status {
    call("udma_pool_alloc", || {
        let out = abi::out(buffer, "buffer")?;
        let held = hold_pool(pool)?;
        let b = alloc_one(held.entry(), len)?;
        let index = BUFFERS.claim(held.local())?;
        // Filled while the pool is held: `udma_pool_destroy` waits for it, then counts it.
        let key = fill_buffer(index, held.key, b)?;
        drop(held);
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(key.to_ptr(Kind::Buffer)) };
        Ok(())
    })
}

/// Allocates `count` buffers of `len` bytes each into `buffers[0..count]`: all or nothing
/// (on an error no buffer is allocated and `buffers` is untouched).
///
/// Errors: as `udma_pool_alloc`; `UDMA_ERR_INVALID_ARGUMENT` for a count above 2^24 (the
/// most live buffer handles).
///
/// # Safety
/// `buffers` points to `count` writable `udma_buffer *`.
#[no_mangle]
pub unsafe extern "C" fn udma_pool_alloc_bulk(
    pool: *const udma_pool,
    len: u64,
    count: usize,
    buffers: *mut *mut udma_buffer,
) -> udma_status {
    call("udma_pool_alloc_bulk", || {
        let out = abi::out(buffers, "buffers")?;
        let held = hold_pool(pool)?;
        // Filled while the pool is held, as in `udma_pool_alloc`.
        let keys = alloc_into_slots(&held, len, count)?;
        drop(held);
        for (i, key) in keys.into_iter().enumerate() {
            // SAFETY: `i < count`, and `count` entries are writable per this function's
            // contract.
            unsafe { out.add(i).write(key.to_ptr(Kind::Buffer)) };
        }
        Ok(())
    })
}

/// Checks that `b` (the handle `value`) may be freed into the pool `pool` (decoded as `key`).
#[inline(always)]
fn freeable(b: &BufferEntry, key: Key, pool: *const udma_pool, value: u64) -> Result<(), Fail> {
    if matches!(b.state, State::Host(_)) && b.pool == key {
        return Ok(());
    }
    not_freeable(b, key, pool, value)
}

#[cold]
#[inline(never)]
fn not_freeable(b: &BufferEntry, key: Key, pool: *const udma_pool, value: u64) -> Result<(), Fail> {
    if let State::Queued(q) = &b.state {
        return Err(Fail::new(
            udma_status::UDMA_ERR_BUSY,
            format!(
                "buffer {value:#x} (IOVA {:#x}) is in {}, which the device owns until its \
                 completion: wait for it (udma_queue_wait, udma_queue_poll), which hands the \
                 buffer back, then free it",
                q.iova, q.name
            ),
        ));
    }
    if b.pool != key {
        // Not its pool: a live pool of another, or no pool at all.
        drop(POOLS.pin(key, pool.addr() as u64)?);
        return Err(Fail::invalid(format!(
            "buffer {value:#x} belongs to another pool (on {}): free it into its own pool",
            pool_device(b.pool)
        )));
    }
    Ok(())
}

/// Frees a buffer back into its pool. The handle is invalid from then on.
///
/// Errors: `UDMA_ERR_INVALID_HANDLE` for a buffer freed already (or not a buffer);
/// `UDMA_ERR_BUSY` for a buffer in a queue (the device owns it until its completion);
/// `UDMA_ERR_INVALID_ARGUMENT` for a buffer of another pool.
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_pool_free(
    pool: *const udma_pool,
    buffer: *mut udma_buffer,
) -> udma_status {
    call("udma_pool_free", || {
        let key = handle::decode(Kind::Pool, pool)?;
        let value = buffer.addr() as u64;
        let mut b = lock_buffer(buffer)?;
        b.with(|b| freeable(b, key, pool, value))?;
        // The buffer goes back into its pool here, while its slot is locked (a destroy of the
        // pool counting buffers waits for the lock, then sees the slot free).
        let index = b.discard_with(|b| match b.state {
            State::Host(buffer) => drop(buffer),
            State::Queued(q) => drop(q),
        });
        with_local(|local| BUFFERS.release(index, local));
        Ok(())
    })
}

/// Frees `count` buffers: all or nothing (if any one cannot be freed, none is, and the
/// message names its index).
///
/// Errors: as `udma_pool_free`; `UDMA_ERR_INVALID_ARGUMENT` for a buffer listed twice.
///
/// # Safety
/// `buffers` points to `count` readable `udma_buffer *`.
#[no_mangle]
pub unsafe extern "C" fn udma_pool_free_bulk(
    pool: *const udma_pool,
    buffers: *const *mut udma_buffer,
    count: usize,
) -> udma_status {
    call("udma_pool_free_bulk", || {
        if buffers.is_null() && count > 0 {
            return Err(Fail::null("buffers"));
        }
        // At most MAX_LIVE buffer handles exist, each listed once: a longer list is wrong,
        // refused before anything is sized by it.
        if count > handle::MAX_LIVE {
            return Err(Fail::invalid(format!(
                "count is {count}, more buffers than can be alive at once ({})",
                handle::MAX_LIVE
            )));
        }
        let p = pin_pool(pool)?;
        let list: &[*mut udma_buffer] = if count == 0 {
            &[]
        } else {
            // SAFETY: non-null, `count` readable entries per this function's contract.
            unsafe { std::slice::from_raw_parts(buffers, count) }
        };
        let mut keys = Vec::with_capacity(count);
        let mut seen = HashSet::with_capacity(count);
        for (i, &ptr) in list.iter().enumerate() {
            let key = handle::decode(Kind::Buffer, ptr)
                .map_err(|f| f.context(format!("buffers[{i}]")))?;
            if !seen.insert(key) {
                return Err(Fail::invalid(format!(
                    "buffers[{i}]: buffer {:#x} is listed twice",
                    ptr.addr()
                )));
            }
            keys.push(key);
        }
        // Locked in slot order, whatever the caller's: two calls on overlapping lists never
        // wait for each other in a cycle.
        let mut order: Vec<usize> = (0..count).collect();
        order.sort_by_key(|&i| keys[i].index());
        let mut guards: Vec<Option<crate::slots::Guard<'static, BufferEntry>>> =
            (0..count).map(|_| None).collect();
        for &i in &order {
            let g = BUFFERS
                .lock(keys[i], list[i].addr() as u64, never_pinned)
                .map_err(|f| f.context(format!("buffers[{i}]")))?;
            guards[i] = Some(g);
        }
        for (i, g) in guards.iter_mut().enumerate() {
            if let Some(g) = g {
                g.with(|b| freeable(b, p.key(), pool, list[i].addr() as u64))
                    .map_err(|f| f.context(format!("buffers[{i}]")))?;
            }
        }
        with_local(|local| {
            for g in guards.into_iter().flatten() {
                drop(g.remove(local));
            }
        });
        Ok(())
    })
}
