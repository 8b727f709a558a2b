//! Memory: regions mapped into a device's DMA space (`udma_mapping`), buffer pools
//! (`udma_pool`) and their buffers (`udma_buffer`).
//!
//! A buffer handle names a slot that holds either the buffer (on the host: the caller may read
//! and write it, free it, submit it) or the queue it was submitted to (the device owns it: it
//! cannot be freed, read or written through the library until its completion hands it back,
//! under the same handle).
//!
//! Buffers and pools are in lock-free handle tables ([`crate::slots`]). An allocation takes
//! no lock and no atomic read-modify-write: it reads the pool's slot inside a quiescence
//! section ([`crate::quiesce`]: a store to this thread's record) and fills a buffer slot from
//! this thread's own list of free ones. A free is one compare-and-swap, on the buffer's slot.
//! A buffer holds its pool by a plain reference ([`HostBuffer`]); `udma_pool_destroy` keeps
//! that reference valid: it locks the pool's slot, waits out the allocations in progress, and
//! removes the pool only if no buffer slot names it.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::ffi::c_void;
use std::ptr::null;
use std::sync::{Arc, Mutex};

use udma::dma;
use udma::memory::PageSize;
use udma::pool::{self, Buffer, Pool};
use udma::runtime::Runtime;

use crate::abi;
use crate::device::{device, udma_device};
use crate::error::{call, lib, udma_status, Fail};
use crate::handle::{self, Key, Kind, Registry, MAX_LIVE};
use crate::quiesce::{Quiesce, Record};
use crate::slots::{LocalList, Pin, Table};

/// `udma_memory_map`'s and `udma_pool_options`' page size.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_page_size {
    /// The CPU's base pages (4 KiB): no hugepages needed, IOVA-contiguous per page only.
    UDMA_PAGE_BASE = 0,
    /// 2 MiB hugepages (reserve them first: `userdma hugepages`).
    UDMA_PAGE_2M = 1,
    /// 1 GiB hugepages.
    UDMA_PAGE_1G = 2,
}

fn page_size(raw: u32) -> Result<PageSize, Fail> {
    match raw {
        0 => Ok(PageSize::Base),
        1 => Ok(PageSize::Huge2M),
        2 => Ok(PageSize::Huge1G),
        other => Err(Fail::invalid(format!(
            "page size {other} is not a udma_page_size (UDMA_PAGE_BASE 0, UDMA_PAGE_2M 1, \
             UDMA_PAGE_1G 2)"
        ))),
    }
}

fn bytes(raw: u64, what: &str) -> Result<usize, Fail> {
    if raw == 0 {
        return Err(Fail::invalid(format!(
            "{what} is 0: ask for at least one byte"
        )));
    }
    usize::try_from(raw).map_err(|_| Fail::invalid(format!("{what} {raw} is too large")))
}

// ---- mappings --------------------------------------------------------------------------

/// Pinned host memory mapped into a device's DMA space, made by `udma_memory_map`, destroyed
/// (unmapped) by `udma_mapping_destroy`.
#[derive(Debug)]
pub struct udma_mapping {
    _opaque: [u8; 0],
}

struct MappingEntry {
    mapping: dma::Mapping,
    device: String,
}

static MAPPINGS: Registry<Arc<MappingEntry>> = Registry::new(Kind::Mapping);

/// A mapping's addresses.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_mapping_info {
    /// `sizeof(udma_mapping_info)`.
    pub size: usize,
    /// The host address of byte 0 (the device writes this memory: treat it as volatile).
    pub host: *mut c_void,
    /// Its length in bytes (the request rounded up to whole pages).
    pub len: u64,
    /// The IOVA (device address) of byte 0.
    pub iova: u64,
    /// Bytes from byte 0 that are contiguous in IOVA space (the whole length on hugepages
    /// or behind an IOMMU; at least one page). `udma_mapping_iova` gives the IOVA of any byte.
    pub contiguous: u64,
}

// SAFETY: `repr(C)`, a pointer and integers, 8 * 5 = 40 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_mapping_info {
    const NAME: &'static str = "udma_mapping_info";
}

/// Maps `bytes` of fresh pinned memory (rounded up to whole pages of `page_size`, a
/// `udma_page_size`) into the device's DMA space, on the device's NUMA node when it has one.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for 0 bytes or a bad page size; `UDMA_ERR_EXHAUSTED`
/// for too few hugepages (the message says how many to reserve) or IOVA space;
/// `UDMA_ERR_REFUSED` for the memory-lock limit.
///
/// # Safety
/// `mapping` points to a writable `udma_mapping *`.
#[no_mangle]
pub unsafe extern "C" fn udma_memory_map(
    device: *const udma_device,
    bytes: u64,
    page_size: u32,
    mapping: *mut *mut udma_mapping,
) -> udma_status {
    call("udma_memory_map", || {
        let out = abi::out(mapping, "mapping")?;
        let d = self::device(device)?;
        let len = self::bytes(bytes, "bytes")?;
        let page = self::page_size(page_size)?;
        let m = d
            .runtime
            .map_memory(len, page)
            .map_err(|e| Fail::from(e).context(&d.name))?;
        let key = MAPPINGS.insert(Arc::new(MappingEntry {
            mapping: m,
            device: d.name.clone(),
        }))?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(key.to_ptr(Kind::Mapping)) };
        Ok(())
    })
}

/// The mapping's host address, length and IOVA.
///
/// # Safety
/// `info` points to `info->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_mapping_get_info(
    mapping: *const udma_mapping,
    info: *mut udma_mapping_info,
) -> udma_status {
    call("udma_mapping_get_info", || {
        let m = MAPPINGS.with(mapping, |_, m| Ok(Arc::clone(m)))?;
        let value = udma_mapping_info {
            size: 0,
            host: m.mapping.as_ptr().as_ptr().cast(),
            len: m.mapping.len() as u64,
            iova: m.mapping.iova(0).map_or(0, |i| i.raw()),
            contiguous: m.mapping.contiguous_len(0) as u64,
        };
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", value) }
    })
}

/// The IOVA of byte `offset` of the mapping, and how many bytes from there are contiguous in
/// IOVA space (`contiguous` may be NULL).
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset past the end.
///
/// # Safety
/// `iova` points to a writable `uint64_t`; `contiguous` is NULL or does.
#[no_mangle]
pub unsafe extern "C" fn udma_mapping_iova(
    mapping: *const udma_mapping,
    offset: u64,
    iova: *mut u64,
    contiguous: *mut u64,
) -> udma_status {
    call("udma_mapping_iova", || {
        let out = abi::out(iova, "iova")?;
        let m = MAPPINGS.with(mapping, |_, m| Ok(Arc::clone(m)))?;
        let at = usize::try_from(offset)
            .ok()
            .and_then(|o| m.mapping.iova(o).map(|i| (o, i)));
        let Some((o, i)) = at else {
            return Err(Fail::invalid(format!(
                "offset {offset} is past the end of the {}-byte mapping on {}",
                m.mapping.len(),
                m.device
            )));
        };
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(i.raw()) };
        if !contiguous.is_null() {
            // SAFETY: non-null; writable per this function's contract.
            unsafe { contiguous.write(m.mapping.contiguous_len(o) as u64) };
        }
        Ok(())
    })
}

/// Unmaps the memory from the device's DMA space and frees it. The device must not be
/// using it any more (this library submits only pool buffers, which a mapping is not).
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_mapping_destroy(mapping: *mut udma_mapping) -> udma_status {
    call("udma_mapping_destroy", || {
        drop(MAPPINGS.remove_if(mapping, |_| Ok(()))?);
        Ok(())
    })
}

// ---- pools -----------------------------------------------------------------------------

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
    pool: Arc<Pool>,
    device: String,
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
    queue: u64,
    name: String,
    host: usize,
    iova: u64,
    len: u64,
    capacity: u64,
}

/// A buffer slot's value. Kept small: an allocation writes it, a free drops it, both in the
/// slot, and nothing else is copied on those paths.
pub(crate) struct BufferEntry {
    /// Its pool's slot: the pool is not destroyed while this entry lives.
    pool: Key,
    pub(crate) state: State,
}

// A buffer slot's value is the key and the state's two words (and the state's tag, in the
// buffer's spare bits or beside it): an allocation writes no more.
const _: () = assert!(size_of::<Option<BufferEntry>>() <= 32);

static POOLS: Table<PoolEntry> = Table::new(Kind::Pool);
static BUFFERS: Table<BufferEntry> = Table::new(Kind::Buffer);
/// The sections of allocations reading a pool's slot (see the module docs).
static SECTIONS: Quiesce = Quiesce::new();
/// Pools with buffers that queues leaked (the device could not be stopped): their destroy
/// leaks the pool's memory, so a leaked buffer never borrows a freed pool.
static FORGOTTEN: Mutex<Vec<Key>> = Mutex::new(Vec::new());

fn forgotten() -> std::sync::MutexGuard<'static, Vec<Key>> {
    // A panic while it was held left it consistent: each change is one push or removal.
    FORGOTTEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// This thread's part: its free buffer slots (most allocations and frees take an index from
/// here and give one back, without the table's lock) and its quiescence record. No `Drop`, so
/// reaching it costs no check of whether the thread is ending: its [`Keeper`] gives the list
/// and the record back when it does.
struct Local {
    slots: LocalList,
    /// The record's address: null before the thread's first allocation and once it ends.
    record: Cell<*const Record>,
    /// [`FRESH`], [`KEPT`] or [`ENDED`].
    state: Cell<u8>,
}

/// No keeper registered yet: neither the list nor a record has been used.
const FRESH: u8 = 0;
/// The thread's keeper is registered: the list may hold indices.
const KEPT: u8 = 1;
/// The keeper ran (the thread is ending): the table's own list serves from now on.
const ENDED: u8 = 2;

/// Gives the thread's free slots and its record back when the thread ends.
struct Keeper {
    record: RefCell<Option<Arc<Record>>>,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        LOCAL.with(|l| {
            l.state.set(ENDED);
            l.record.set(null());
            BUFFERS.return_list(&l.slots);
        });
        if let Some(record) = self.record.get_mut().take() {
            Quiesce::release(&record);
        }
    }
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            slots: LocalList::new(),
            record: Cell::new(null()),
            state: Cell::new(FRESH),
        }
    };
    static KEEPER: Keeper = const { Keeper { record: RefCell::new(None) } };
}

impl Local {
    /// This thread's free slots: `None` once the thread is ending.
    #[inline(always)]
    fn list(&self) -> Option<&LocalList> {
        if self.state.get() == KEPT {
            Some(&self.slots)
        } else {
            self.keep()
        }
    }

    /// Registers the keeper (its first use does) unless the thread is ending.
    #[cold]
    #[inline(never)]
    fn keep(&self) -> Option<&LocalList> {
        if self.state.get() == FRESH {
            let state = if KEEPER.try_with(|_| ()).is_ok() {
                KEPT
            } else {
                ENDED
            };
            self.state.set(state);
        }
        (self.state.get() == KEPT).then_some(&self.slots)
    }

    /// This thread's quiescence record, registered at its first use; `None` once the thread
    /// is ending. While it is `Some`, [`Local::slots`] is the thread's list too.
    #[inline(always)]
    fn record(&self) -> Option<&'static Record> {
        let r = self.record.get();
        if r.is_null() {
            return self.register();
        }
        // SAFETY: non-null: the address of the record the keeper holds (an `Arc`, so the
        // record does not move), which lives as long as the registry (never freed: the
        // registry keeps a clone); nulled when the keeper gives it back.
        Some(unsafe { &*r })
    }

    #[cold]
    #[inline(never)]
    fn register(&self) -> Option<&'static Record> {
        self.keep()?;
        let r = KEEPER
            .try_with(|k| {
                let mut slot = k.record.try_borrow_mut().ok()?;
                let record = slot.get_or_insert_with(|| SECTIONS.register());
                Some(Arc::as_ptr(record))
            })
            .ok()
            .flatten()?;
        self.record.set(r);
        // SAFETY: as in `record`.
        Some(unsafe { &*r })
    }
}

/// A pool held for one call: read inside this thread's section (left when this is dropped,
/// a panic's unwinding included), or pinned (the slow path). Not `Send` (its raw pointers):
/// it holds this thread's section and free-slot list.
struct Held {
    key: Key,
    entry: *const PoolEntry,
    /// This thread's free buffer slots, or null (the table's own list serves).
    local: *const LocalList,
    section: Option<&'static Record>,
    _pin: Option<Pin<'static, PoolEntry>>,
}

impl Held {
    /// The pool's entry.
    #[inline(always)]
    fn entry(&self) -> &PoolEntry {
        // SAFETY: read inside the section `self` holds (left only when it drops; the entry's
        // remover waits for that) or pinned by `self._pin`; either way the entry stays as
        // long as `self`.
        unsafe { &*self.entry }
    }

    /// This thread's free buffer slots, if it may use them.
    #[inline(always)]
    fn local(&self) -> Option<&LocalList> {
        // SAFETY: null, or this thread's list, which lives as long as the thread (its
        // thread-local has no destructor), so longer than this call's `Held`.
        unsafe { self.local.as_ref() }
    }
}

impl Drop for Held {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(record) = self.section {
            Quiesce::exit(record);
        }
    }
}

/// Holds the live pool `ptr` names for one call: inside a section on the fast path; pinned,
/// after waiting for a destroy in progress to decide, on the slow one (a thread being torn
/// down, a pool whose slot is locked, a bad handle).
#[inline(always)]
fn hold_pool(ptr: *const udma_pool) -> Result<Held, Fail> {
    let key = handle::decode(Kind::Pool, ptr)?;
    let value = ptr.addr() as u64;
    // (`try_with`, not `with`: the same for a thread-local without `Drop`, but inlined.)
    let fast = LOCAL.try_with(|l| {
        let record = l.record()?;
        SECTIONS.enter(record, value);
        // SAFETY: inside the section for this pool's handle value, which the `Held` made
        // here leaves when it drops, after its last read of the entry; `udma_pool_destroy`
        // locks the pool's slot and waits the sections out before it removes the entry.
        match unsafe { POOLS.peek_ptr(key) } {
            Some(entry) => Some(Held {
                key,
                entry,
                local: &l.slots,
                section: Some(record),
                _pin: None,
            }),
            None => {
                Quiesce::exit(record);
                None
            }
        }
    });
    match fast {
        Ok(Some(held)) => Ok(held),
        _ => hold_pool_slow(key, value),
    }
}

#[cold]
#[inline(never)]
fn hold_pool_slow(key: Key, value: u64) -> Result<Held, Fail> {
    // A destroy in progress holds the slot locked: it either removes the pool (the pin then
    // fails: stale) or gives up (the pin succeeds).
    let pin = POOLS.pin_unlocked(key, value)?;
    let entry = pin.with(std::ptr::from_ref);
    Ok(Held {
        key,
        entry,
        local: null(),
        section: None,
        _pin: Some(pin),
    })
}

/// Runs `f` with this thread's free buffer slots (none while the thread is being torn down:
/// then the table's own list serves).
#[inline(always)]
fn with_local<R>(f: impl FnOnce(Option<&LocalList>) -> R) -> R {
    let mut f = Some(f);
    match LOCAL.try_with(|l| (f.take().expect("taken once"))(l.list())) {
        Ok(done) => done,
        Err(_) => (f.take().expect("not taken"))(None),
    }
}

/// A buffer slot is never pinned (buffers are only locked), so locking one is never busy.
fn never_pinned(pins: u64) -> Fail {
    Fail::new(
        udma_status::UDMA_ERR_INTERNAL,
        format!("a buffer slot has {pins} pins (a bug in userdma; please report it)"),
    )
}

/// Locks the buffer `ptr` names.
#[inline(always)]
fn lock_buffer(ptr: *const udma_buffer) -> Result<crate::slots::Guard<'static, BufferEntry>, Fail> {
    let key = handle::decode(Kind::Buffer, ptr)?;
    BUFFERS.lock(key, ptr.addr() as u64, never_pinned)
}

/// Pins the pool `ptr` names.
#[inline(always)]
fn pin_pool(ptr: *const udma_pool) -> Result<Pin<'static, PoolEntry>, Fail> {
    let key = handle::decode(Kind::Pool, ptr)?;
    POOLS.pin(key, ptr.addr() as u64)
}

/// The device name of the live pool `key` (for messages).
fn pool_device(key: Key) -> String {
    POOLS
        .pin(key, key.value(Kind::Pool))
        .map_or_else(|_| "?".into(), |p| p.with(|e| e.device.clone()))
}

/// How to make a pool. Zero is the default for every field but `bytes`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
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
    /// `UDMA_POOL_COLOURED` or 0.
    pub flags: u32,
    /// Zero.
    pub reserved: u32,
}

/// `udma_pool_options.flags`: cache colouring. Buffers of 4 KiB and up (where it costs at
/// most one block in 16 of a chunk) are placed `size + 256` bytes apart instead of `size`, so
/// that their first cache lines spread over the CPU's cache sets: faster when the CPU touches
/// many buffers in a row (filling a bulk allocation, reading a burst's headers). Those buffers
/// are then aligned to 256 bytes, not to their size.
pub const UDMA_POOL_COLOURED: u32 = 1;

// SAFETY: `repr(C)`, integers only, 8 + 8 + 4 * 4 = 32 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_pool_options {
    const NAME: &'static str = "udma_pool_options";
}

/// A snapshot of a pool's counters (`udma_pool_get_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct udma_pool_stats {
    /// `sizeof(udma_pool_stats)`.
    pub size: usize,
    /// Bytes buffers are carved from.
    pub arena_bytes: u64,
    /// The pool's chunk (slab) size.
    pub chunk_bytes: u64,
    /// The largest length `udma_pool_alloc` can ever satisfy.
    pub max_len: u64,
    /// Allocations, all sizes (this process).
    pub allocs: u64,
    /// Frees, all sizes (this process).
    pub frees: u64,
    /// Buffers in use now: `allocs - frees`.
    pub in_use: u64,
    /// Allocations served from the thread's cache.
    pub cache_hits: u64,
    /// Allocations above the largest size class (whole chunks).
    pub large_allocs: u64,
    /// Bytes held by such large buffers now.
    pub large_in_use_bytes: u64,
    /// Buffer handles of this pool alive now (on the host or in a queue), and calls holding
    /// the pool on other threads (stats, bulk frees): what makes `udma_pool_destroy` busy.
    pub handles: u64,
}

// SAFETY: `repr(C)`, integers only, 8 * 11 = 88 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_pool_stats {
    const NAME: &'static str = "udma_pool_stats";
}

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

// SAFETY: `repr(C)`, a pointer and integers, 8 * 5 + 4 + 4 = 48 bytes with no padding, `size`
// first.
unsafe impl abi::Sized for udma_buffer_info {
    const NAME: &'static str = "udma_buffer_info";
}

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
        if o.flags & !UDMA_POOL_COLOURED != 0 {
            return Err(Fail::invalid(format!(
                "options->flags {:#x} has bits that are not UDMA_POOL_* flags",
                o.flags
            )));
        }
        if o.reserved != 0 {
            return Err(Fail::invalid(format!(
                "options->reserved is {:#x}: set it to 0",
                o.reserved
            )));
        }
        let mut config = Runtime::pool_config(page).colouring(o.flags & UDMA_POOL_COLOURED != 0);
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
        let PoolEntry { pool, device } = guard.remove(None);
        let mut leaked = forgotten();
        if let Some(at) = leaked.iter().position(|&k| k == key) {
            leaked.swap_remove(at);
            // Buffers of it stay in commands a queue leaked: so does its memory.
            std::mem::forget(pool);
        } else {
            drop(pool);
        }
        drop(device);
        Ok(())
    })
}

/// How many buffer handles of the pool `key` are alive (on the host or in queues).
fn buffers_of(key: Key) -> u64 {
    BUFFERS.count(|b| b.pool == key)
}

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

/// A snapshot of the pool's counters.
///
/// # Safety
/// `stats` points to `stats->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_pool_get_stats(
    pool: *const udma_pool,
    stats: *mut udma_pool_stats,
) -> udma_status {
    call("udma_pool_get_stats", || {
        let pin = pin_pool(pool)?;
        // The buffers out, and other calls holding the pool (every pin but this call's).
        let handles = buffers_of(pin.key()) + pin.count().saturating_sub(1);
        pin.with(|p| {
            let s = p.pool.stats();
            let sum = |f: fn(&pool::ClassStats) -> u64| s.classes.iter().map(f).sum::<u64>();
            let large_live = s.large.allocs.saturating_sub(s.large.frees);
            let value = udma_pool_stats {
                size: 0,
                arena_bytes: s.arena_bytes,
                chunk_bytes: s.chunk_bytes,
                max_len: p.pool.max_len() as u64,
                allocs: sum(|c| c.allocs) + s.large.allocs,
                frees: sum(|c| c.frees) + s.large.frees,
                in_use: sum(|c| c.in_use) + large_live,
                cache_hits: sum(|c| c.cache_hits),
                large_allocs: s.large.allocs,
                large_in_use_bytes: s.large.in_use_bytes,
                handles,
            };
            // SAFETY: per this function's contract.
            unsafe { abi::write(stats, "stats", value) }
        })
    })
}

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

// ---- for the queue module ------------------------------------------------------------------

/// Takes the buffer `ptr` out of its slot for queue `queue` (named `name`), checking that it
/// is on the host and that `[offset, offset + len)` lies inside it; returns its key, its
/// buffer and the IOVA of `offset`.
pub(crate) fn take_for_queue(
    ptr: *const udma_buffer,
    offset: u64,
    len: u64,
    queue: u64,
    name: &str,
) -> Result<(Key, HostBuffer, u64), Fail> {
    let mut guard = lock_buffer(ptr)?;
    let key = guard.key();
    guard.with(|b| {
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
