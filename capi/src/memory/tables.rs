//! The pool and buffer handle tables: the opaque `udma_pool` and `udma_buffer`, what their
//! slots hold (a pool; a buffer on the host or in a queue), the tables themselves, and
//! looking a handle up in them.

use std::sync::{Arc, Mutex};

use udma::pool::{Buffer, Pool};

use crate::error::{udma_status, Fail};
use crate::handle::{self, Key, Kind};
use crate::quiesce::Quiesce;
use crate::slots::{Pin, Table};

/// A buffer pool over memory mapped once into a device's DMA space, made by
/// `udma_pool_create`, destroyed by `udma_pool_destroy` once every buffer is freed.
#[derive(Debug)]
pub struct udma_pool {
    _opaque: [u8; 0],
}

/// One buffer from a pool: a host address, an IOVA and a length. Made by `udma_pool_alloc`,
/// freed by `udma_pool_free`.
#[derive(Debug)]
pub struct udma_buffer {
    _opaque: [u8; 0],
}

pub(crate) struct PoolEntry {
    pub(super) pool: Arc<Pool>,
    pub(super) device: String,
    /// The DMA space its memory is mapped into (its device's): a queue takes buffers of
    /// pools of its own space only. Held, so no other space reuses its address meanwhile.
    pub(super) space: Arc<dyn udma::dma::Space>,
}

/// A buffer out of a C pool. Its `'static` is a promise `udma_pool_destroy` keeps, not a
/// fact: the pool it borrows (in its [`PoolEntry`]'s `Arc`) is dropped only once no buffer
/// slot names the pool, and a buffer is dropped only in its slot or in a queue's command,
/// whose slot says `Queued` meanwhile; a buffer a queue leaks keeps its pool forever
/// ([`forget_queued`]). Never handed out by reference outside this crate.
pub(crate) type HostBuffer = Buffer<'static>;

/// Where a buffer is.
pub(crate) enum State {
    /// On the host: the caller's.
    Host(HostBuffer),
    /// In a queue: the device's until the completion. Boxed, so that a slot holds two words
    /// and an allocation writes only those.
    Queued(Box<Queued>),
}

/// A buffer in a queue: which queue, and what its info and messages say of the buffer (the
/// buffer itself travels with its command).
pub(crate) struct Queued {
    /// The queue's handle value.
    pub(super) queue: u64,
    pub(super) name: String,
    pub(super) host: usize,
    pub(super) iova: u64,
    pub(super) len: u64,
    pub(super) capacity: u64,
}

/// A buffer slot's value. Kept small: an allocation writes it, a free drops it, both in the
/// slot, and nothing else is copied on those paths.
pub(crate) struct BufferEntry {
    /// Its pool's slot: the pool is not destroyed while this entry lives.
    pub(super) pool: Key,
    pub(crate) state: State,
}

// A buffer slot's value is the key and the state's two words (and the state's tag, in the
// buffer's spare bits or beside it): an allocation writes no more.
const _: () = assert!(size_of::<Option<BufferEntry>>() <= 32);

pub(super) static POOLS: Table<PoolEntry> = Table::new(Kind::Pool);
pub(super) static BUFFERS: Table<BufferEntry> = Table::new(Kind::Buffer);
/// The sections of allocations reading a pool's slot (see the module docs).
pub(super) static SECTIONS: Quiesce = Quiesce::new();
/// Pools with buffers that queues leaked (the device could not be stopped): their destroy
/// leaks the pool's memory, so a leaked buffer never borrows a freed pool.
static FORGOTTEN: Mutex<Vec<Key>> = Mutex::new(Vec::new());

pub(super) fn forgotten() -> std::sync::MutexGuard<'static, Vec<Key>> {
    // A panic while it was held left it consistent: each change is one push or removal.
    FORGOTTEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A buffer slot is never pinned (buffers are only locked), so locking one is never busy.
pub(super) fn never_pinned(pins: u64) -> Fail {
    Fail::new(
        udma_status::UDMA_ERR_INTERNAL,
        format!("a buffer slot has {pins} pins (a bug in userdma; please report it)"),
    )
}

/// Locks the buffer `ptr` names.
#[inline(always)]
pub(super) fn lock_buffer(
    ptr: *const udma_buffer,
) -> Result<crate::slots::Guard<'static, BufferEntry>, Fail> {
    let key = handle::decode(Kind::Buffer, ptr)?;
    BUFFERS.lock(key, ptr.addr() as u64, never_pinned)
}

/// Pins the pool `ptr` names.
#[inline(always)]
pub(super) fn pin_pool(ptr: *const udma_pool) -> Result<Pin<'static, PoolEntry>, Fail> {
    let key = handle::decode(Kind::Pool, ptr)?;
    POOLS.pin(key, ptr.addr() as u64)
}

/// The device name of the live pool `key` (for messages).
pub(super) fn pool_device(key: Key) -> String {
    POOLS
        .pin(key, key.value(Kind::Pool))
        .map_or_else(|_| "?".into(), |p| p.with(|e| e.device.clone()))
}

/// How many buffer handles of the pool `key` are alive (on the host or in queues).
pub(super) fn buffers_of(key: Key) -> u64 {
    BUFFERS.count(|b| b.pool == key)
}
