//! Pools (`udma_pool`): how to make one (`udma_pool_options`), making one over fresh memory
//! mapped into a device's DMA space, and destroying it once every buffer is back.

use udma::pool;
use udma::runtime::Runtime;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::tables::{buffers_of, forgotten, pool_device, udma_pool, PoolEntry, POOLS, SECTIONS};
use super::{bytes, page_size};
use crate::abi;
use crate::device::{device, udma_device};
use crate::error::{call, udma_status, Fail};
use crate::handle::{self, Kind};

/// How to make a pool. Zero is the default for every field but `bytes`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_pool_options {
    /// `sizeof(udma_pool_options)`.
    pub size: usize,
    /// Bytes of memory for the pool (required): mapped once, carved into buffers.
    pub bytes: u64,
    /// A `udma_page_size`; 0: base pages.
    pub page_size: u32,
    /// When nothing is free: 0 fails at once with `UDMA_ERR_EXHAUSTED`; otherwise waits up to
    /// this many microseconds for a buffer to be freed first.
    pub wait_us: u32,
    /// 0 (the layout the device's DMA alignment calls for), `UDMA_POOL_COLOURED` or
    /// `UDMA_POOL_PAGE_ALIGNED`.
    pub flags: u32,
    /// Zero.
    pub reserved: u32,
}

/// `udma_pool_options.flags`: cache colouring. Buffers of 4 KiB and up (where it costs at
/// most one block in 16 of a chunk) are placed `size + 256` bytes apart instead of `size`, so
/// that their first cache lines spread over the CPU's cache sets: faster when the CPU touches
/// many buffers in a row (filling a bulk allocation, reading a burst's headers). Those buffers
/// are then aligned to 256 bytes, not to their size. Without a flag a pool is coloured when its
/// device takes 256-byte aligned buffers (the loopback NPU) and page aligned otherwise; this
/// flag on a device that needs more than 256 bytes is `UDMA_ERR_INVALID_ARGUMENT`.
pub const UDMA_POOL_COLOURED: u32 = 1;

/// `udma_pool_options.flags`: no cache colouring, whatever the device allows: every buffer
/// aligned to its size class (4 KiB buffers to a page), for buffers that must be page aligned
/// (a file opened with `O_DIRECT`, page lists) on a device that would take less.
pub const UDMA_POOL_PAGE_ALIGNED: u32 = 2;

abi::sized!(udma_pool_options);

/// Makes a pool over `options->bytes` of fresh memory mapped into the device's DMA space.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for 0 bytes, too few for a pool, or a bad page size;
/// as `udma_memory_map` otherwise.
///
/// # Safety
/// `options` points to `options->size` readable bytes; `pool` to a writable `udma_pool *`.
#[no_mangle]
pub unsafe extern "C" fn udma_pool_create(
    device: *const udma_device,
    options: *const udma_pool_options,
    pool: *mut *mut udma_pool,
) -> udma_status {
    call("udma_pool_create", || {
        let out = abi::out(pool, "pool")?;
        // SAFETY: per this function's contract.
        let o = unsafe { abi::read(options, "options", udma_pool_options::default())? };
        let d = self::device(device)?;
        let len = bytes(o.bytes, "options->bytes")?;
        let page = page_size(o.page_size)?;
        if o.flags & !(UDMA_POOL_COLOURED | UDMA_POOL_PAGE_ALIGNED) != 0 {
            return Err(Fail::invalid(format!(
                "options->flags {:#x} has bits that are not UDMA_POOL_* flags",
                o.flags
            )));
        }
        if o.flags & UDMA_POOL_COLOURED != 0 && o.flags & UDMA_POOL_PAGE_ALIGNED != 0 {
            return Err(Fail::invalid(
                "options->flags asks for both UDMA_POOL_COLOURED and UDMA_POOL_PAGE_ALIGNED: \
                 pick one, or neither for the device's layout",
            ));
        }
        if o.reserved != 0 {
            return Err(Fail::invalid(format!(
                "options->reserved is {:#x}: set it to 0",
                o.reserved
            )));
        }
        let mut config = Runtime::pool_config(page);
        if o.flags & UDMA_POOL_COLOURED != 0 {
            config = config.colouring(true);
        } else if o.flags & UDMA_POOL_PAGE_ALIGNED != 0 {
            config = config.colouring(false);
        }
        if o.wait_us != 0 {
            let wait = std::time::Duration::from_micros(u64::from(o.wait_us));
            config = config.exhaustion(pool::Exhaustion::Wait(wait));
        }
        let made = d.runtime.pool_with(len, page, config);
        let made = made.map_err(|e| Fail::from(e).context(&d.name))?;
        let key = POOLS.insert(
            PoolEntry {
                pool: made,
                device: d.name.clone(),
                space: std::sync::Arc::clone(d.runtime.dma_space()),
            },
            None,
        )?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(key.to_ptr(Kind::Pool)) };
        Ok(())
    })
}

/// Destroys a pool. Every buffer of it must be freed first (a buffer in a queue comes back
/// with its completion, or with `udma_queue_destroy`). Allocations from the pool in progress
/// on other threads are waited for; one that starts meanwhile either finishes first (and
/// destroy reports its buffer) or fails with `UDMA_ERR_INVALID_HANDLE`.
///
/// Errors: `UDMA_ERR_BUSY` while buffers are out (the message says how many) or another call
/// holds the pool (stats, a bulk free, a free into the wrong pool).
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_pool_destroy(pool: *mut udma_pool) -> udma_status {
    call("udma_pool_destroy", || {
        let key = handle::decode(Kind::Pool, pool)?;
        let value = pool.addr() as u64;
        let calls = |n: u64| {
            Fail::new(
                udma_status::UDMA_ERR_BUSY,
                format!(
                    "the pool on {} has {n} calls on it in progress on other threads: \
                     destroy it once they return",
                    pool_device(key)
                ),
            )
        };
        let mut guard = POOLS.lock(key, value, calls)?;
        // Locked: allocations that start from now on see it and wait (`hold_pool_slow`);
        // those already inside a section finish first.
        SECTIONS.wait_out(value)?;
        let out = buffers_of(key);
        if out > 0 {
            let device = guard.with(|e| e.device.clone());
            return Err(Fail::new(
                udma_status::UDMA_ERR_BUSY,
                format!(
                    "the pool on {device} has {out} buffers out (on the host or in queues): \
                     free them first (udma_pool_free)"
                ),
            ));
        }
        let PoolEntry {
            pool,
            device,
            space,
        } = guard.remove(None);
        let mut leaked = forgotten();
        if let Some(at) = leaked.iter().position(|&k| k == key) {
            leaked.swap_remove(at);
            // Buffers of it stay in commands a queue leaked: so does its memory.
            std::mem::forget(pool);
        } else {
            drop(pool);
        }
        drop((device, space));
        Ok(())
    })
}
