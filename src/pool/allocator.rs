//! [`Pool`]: the offset allocator wrapped around one DMA mapping.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use super::arena::{Arena, Block, Failure};
use super::buffer::Buffer;
use super::cache::{self, OwnedSlot};
use super::geometry::{class_of, Geometry};
use super::lease::Leases;
use super::meta::Meta;
use super::{Config, Error, Stats, MIN_ALIGN};
use crate::dma::Mapping;
use crate::sync::AtomicU32;

/// Offset -> IOVA translation of the arena, precomputed at creation so the fast path never asks
/// the mapping.
#[derive(Debug)]
enum Iovas {
    /// The arena is one IOVA range starting here.
    Linear(u64),
    /// Per chunk (each chunk is IOVA-contiguous; consecutive chunks need not be).
    Chunks { shift: u32, iovas: Box<[u64]> },
}

/// A buffer pool over a region mapped into a device's DMA address space (see the
/// [module documentation](super) for the design).
///
/// The pool owns the [`Mapping`]: it is mapped once, before the pool exists, and unmapped when
/// the pool is dropped and every [`OwnedBuffer`](super::OwnedBuffer) is back (unless buffers
/// were forgotten: see `Drop`); allocating and freeing make no system call and no heap
/// allocation. `Pool` is `Send + Sync`: share it by reference (scoped threads) or `Arc`;
/// buffers borrow it, owned buffers keep what they need of it alive.
///
/// A `Pool` is a handle to the pool's state, which lives in its own allocation: the state
/// outlives the handle while owned buffers are out, and is freed by whichever comes last, the
/// handle's drop or the last owned buffer's (the `lease` module).
pub struct Pool {
    /// The state. Made by `Box::into_raw`; freed by the last of this handle and the owned
    /// buffers (see `Drop`).
    core: NonNull<Core>,
    // Copies of the state's hot fields, one pointer hop closer for the allocation fast path.
    /// The arena's id (what thread caches key on).
    id: u64,
    /// Number of size classes.
    classes: usize,
}

/// The pool's state: what its buffers reach (they point here, with their size class in the
/// low bits of the pointer). 128-byte aligned: its read-mostly fields have their cache lines
/// to themselves, and a buffer keeps its size class in the low bits of its pointer to it.
#[repr(align(128))]
pub(crate) struct Core {
    /// The arena's id (what thread caches key on).
    id: u64,
    /// Who frees this state: the pool handle, or the last owned buffer after it. Next to the
    /// fields every free reads (an owned free reads whether it is retired).
    leases: Leases,
    /// The arena's waiter count (see `Arena::waiters`).
    waiters: NonNull<AtomicU32>,
    /// Dropped by `Drop` before the mapping: it drains thread caches into metadata that may
    /// live in `mapping`.
    arena: ManuallyDrop<Box<Arena>>,
    /// Host address of arena offset 0.
    base: NonNull<u8>,
    iovas: Iovas,
    /// Offset of the arena in the mapping (nonzero for a shared pool: the metadata comes first).
    arena_offset: usize,
    config: Config,
    shared: bool,
    /// Unmapped by `Drop`, or leaked if buffers are still out.
    mapping: ManuallyDrop<Mapping>,
}

/// Mappings leaked by pools dropped while buffers were still out, in this process. A plain std
/// atomic on purpose: a process-wide count, not part of any modelled algorithm.
static LEAKED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times, in this process, a [`Pool`] was dropped while some of its buffers were
/// still out and therefore left its mapping mapped (see [`Pool`]'s `Drop`).
pub fn leaked_mappings() -> u64 {
    // Relaxed: a statistic; it orders nothing.
    LEAKED.load(std::sync::atomic::Ordering::Relaxed)
}

impl Drop for Pool {
    /// Retires the pool: frees its state now if no owned buffer is out, else leaves that to
    /// the last owned buffer's drop (the `lease` module says how the two never both, or
    /// neither, do it).
    fn drop(&mut self) {
        // SAFETY: `core` came from `Box::into_raw` and is freed only by the last of this
        // handle and the owned buffers, which `retire` decides: nobody has freed it yet (an
        // owned buffer frees it only after this retirement counted it).
        let last = unsafe { self.core.as_ref() }.retire();
        if last {
            // SAFETY: `retire` says nothing else holds or will reach the state: no owned
            // buffer is out, no borrow of this handle is alive (we are in its drop), and no
            // free is in progress (it waited for them). No reference to it is alive here.
            drop(unsafe { Box::from_raw(self.core.as_ptr()) });
        }
    }
}

impl Drop for Core {
    /// Drains the thread caches and unmaps the mapping (which DMA-unmaps and unpins it).
    ///
    /// If buffers of this pool are still out — possible only by `mem::forget`-ing a
    /// [`Buffer`], e.g. a ring that gives up buffers a device never released — the device may
    /// still write them, so the pool leaks its mapping on purpose: the memory stays mapped,
    /// pinned and in the device's address space until the process exits, and
    /// [`leaked_mappings`] counts it.
    /// Nothing is logged. Buffers allocated by other processes of a shared pool are theirs to
    /// account for: only this process's buffers count here.
    fn drop(&mut self) {
        // Slots first, through `&Arena`: a thread exiting right now may be flushing its slot
        // into the arena (see `Arena::retire_slots`).
        self.arena.retire_slots();
        let out = self.arena.blocks_out();
        // SAFETY: dropped once, here; `self.arena` is not used after this line.
        unsafe { ManuallyDrop::drop(&mut self.arena) };
        // SAFETY: taken once, here; `self.mapping` is not used after this line.
        let mapping = unsafe { ManuallyDrop::take(&mut self.mapping) };
        if out == 0 {
            drop(mapping);
        } else {
            // Relaxed: a statistic.
            LEAKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            crate::memory::keep_until_exit(mapping);
        }
    }
}

// SAFETY: `base` points into `mapping`, which the pool owns and which is Send; the arena is made
// of atomics and of cache slots whose unsynchronized parts are only touched by their owning
// thread (see the `cache` module). Nothing in a pool is tied to the thread that made it.
unsafe impl Send for Core {}
// SAFETY: every `&self` method either touches the arena's atomics, the calling thread's own
// cache slot, or reads immutable fields; buffer memory is only reached through raw pointers and
// volatile accesses by the buffer that owns it.
unsafe impl Sync for Core {}
// SAFETY: a handle is a pointer to a `Core` (Send + Sync) that it keeps alive, and copies of
// two of its immutable fields; which thread drops it does not matter (`Drop` synchronizes
// with the owned buffers' frees on any thread through `Leases`).
unsafe impl Send for Pool {}
// SAFETY: `&Pool` only reaches the `Core` through `&Core` (Sync) and reads the copies.
unsafe impl Sync for Pool {}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = self.core();
        f.debug_struct("Pool")
            .field("arena_offset", &core.arena_offset)
            .field("arena_len", &core.arena.geometry().len)
            .field("shared", &core.shared)
            .field("config", &core.config)
            .finish_non_exhaustive()
    }
}

/// Where the arena starts: the smallest offset `>= from` at which the IOVA is aligned to
/// `align` when the mapping is one IOVA range from there on, else the next multiple of `chunk`
/// (each chunk's alignment is then checked by [`Pool::assemble`]). Host addresses follow the
/// IOVA within a page, so they share its alignment up to the page size.
pub(super) fn aligned_start(
    mapping: &Mapping,
    from: usize,
    align: usize,
    chunk: usize,
) -> Option<usize> {
    let iova = mapping.iova(from)?.raw();
    let start = if mapping.contiguous_len(from) == mapping.len() - from {
        // `align` is a power of two: the distance up to the next multiple.
        let skip = iova.wrapping_neg() & (align as u64 - 1);
        from.checked_add(usize::try_from(skip).ok()?)?
    } else {
        from.checked_next_multiple_of(chunk)?
    };
    (start < mapping.len()).then_some(start)
}

/// Enters the span of making a pool over `mapping` with `config`, `how` (the `tracing`
/// feature; docs/tracing-events.md).
#[cfg(feature = "tracing")]
pub(super) fn span(
    how: &'static str,
    mapping: &Mapping,
    config: &Config,
) -> tracing::span::EnteredSpan {
    tracing::debug_span!(
        "pool.new",
        how,
        bytes = mapping.len(),
        iova = %mapping.iova(0).unwrap_or(crate::dma::Iova(0)),
        chunk_size = config.chunk_size,
        max_class = config.max_class
    )
    .entered()
}

impl Pool {
    /// A pool over all of `mapping`, with its metadata on the heap.
    ///
    /// # Errors
    /// [`Error::Config`] for an out-of-range setting, [`Error::ArenaTooSmall`] /
    /// [`Error::ArenaTooLarge`] for the mapping's size, [`Error::Misaligned`] /
    /// [`Error::NotContiguous`] if the mapping cannot give aligned, IOVA-contiguous chunks.
    pub fn new(mapping: Mapping, config: Config) -> Result<Pool, Error> {
        #[cfg(feature = "tracing")]
        let _span = span("private", &mapping, &config);
        let len = mapping.len() as u64;
        // Validates the configuration before it is used for alignment arithmetic.
        Geometry::new(len, &config)?;
        let align = config.chunk_size.max(config.max_class);
        let start =
            aligned_start(&mapping, 0, align, config.chunk_size).ok_or(Error::ArenaTooSmall {
                len: 0,
                needed: align as u64,
            })?;
        let g = Geometry::new(len - start as u64, &config)?;
        let slots = Arena::slots_for(&g)?;
        let meta = Meta::heap(&g);
        let arena = Arena::new(g, meta, slots, true, config.timeout(), false);
        Pool::assemble(arena, mapping, start, config, false)
    }

    /// Wraps an arena around `mapping` at `arena_offset`, checking alignment and contiguity.
    pub(super) fn assemble(
        arena: Box<Arena>,
        mapping: Mapping,
        arena_offset: usize,
        config: Config,
        shared: bool,
    ) -> Result<Pool, Error> {
        let g = arena.geometry();
        let chunk = g.chunk_size() as usize;
        let len = g.len as usize;
        let align = config.chunk_size.max(config.max_class) as u64;
        let host = mapping.as_ptr().as_ptr() as u64 + arena_offset as u64;
        // Every buffer's host address is a multiple of MIN_ALIGN (`host_of` relies on it).
        if host % MIN_ALIGN as u64 != 0 {
            return Err(Error::Misaligned {
                host,
                iova: mapping.iova(arena_offset).map_or(0, |iova| iova.raw()),
                align: MIN_ALIGN as u64,
            });
        }
        let first = mapping
            .iova(arena_offset)
            .ok_or(Error::ArenaTooSmall {
                len: 0,
                needed: align,
            })?
            .raw();
        let iovas = if mapping.contiguous_len(arena_offset) >= len {
            if first % align != 0 {
                return Err(Error::Misaligned {
                    host,
                    iova: first,
                    align,
                });
            }
            Iovas::Linear(first)
        } else {
            if config.max_class > chunk {
                return Err(Error::NotContiguous {
                    offset: arena_offset,
                    chunk: config.max_class,
                });
            }
            let mut iovas = Vec::with_capacity(g.chunks as usize);
            for i in 0..g.chunks as usize {
                let offset = arena_offset + i * chunk;
                let iova = mapping
                    .iova(offset)
                    .ok_or(Error::NotContiguous { offset, chunk })?
                    .raw();
                if mapping.contiguous_len(offset) < chunk {
                    return Err(Error::NotContiguous { offset, chunk });
                }
                if iova % chunk as u64 != 0 {
                    return Err(Error::Misaligned {
                        host,
                        iova,
                        align: chunk as u64,
                    });
                }
                iovas.push(iova);
            }
            Iovas::Chunks {
                shift: g.chunk_shift,
                iovas: iovas.into_boxed_slice(),
            }
        };
        // SAFETY: `arena_offset < mapping.len()` (checked by the callers via `aligned_start` or
        // the header), so the result is inside the mapping and not null.
        let base = unsafe { mapping.as_ptr().add(arena_offset) };
        #[cfg(feature = "tracing")]
        tracing::debug!(
            pool = arena.id(),
            arena_bytes = len,
            arena_offset,
            chunks = g.chunks,
            classes = g.classes,
            shared,
            "pool ready"
        );
        let id = arena.id();
        let classes = arena.geometry().classes;
        let core = Box::new(Core {
            id,
            waiters: arena.waiters(),
            arena: ManuallyDrop::new(arena),
            base,
            iovas,
            arena_offset,
            config,
            shared,
            leases: Leases::new(),
            mapping: ManuallyDrop::new(mapping),
        });
        Ok(Pool {
            core: NonNull::from(Box::leak(core)),
            id,
            classes,
        })
    }

    /// The pool's state, alive as long as this handle.
    #[inline(always)]
    pub(super) fn core(&self) -> &Core {
        // SAFETY: made by `Box::leak` in `assemble`, freed only when this handle is dropped or
        // later (`Drop`), so alive for any borrow of `self`.
        unsafe { self.core.as_ref() }
    }

    /// The pool's state as the pointer buffers keep (with the provenance of its allocation,
    /// which the last owned buffer may need to free it).
    #[inline(always)]
    pub(super) fn core_ptr(&self) -> NonNull<Core> {
        self.core
    }

    /// Allocates a buffer of `len` bytes (capacity: `len` rounded up to its size class, or to
    /// whole chunks above the largest class). Allocating from this thread's cache makes no
    /// system call, takes no lock and allocates no heap memory.
    ///
    /// # Errors
    /// [`Error::Exhausted`] if nothing is free (after waiting, with [`super::Exhaustion::Wait`]),
    /// [`Error::TooLarge`] if no block of the pool can ever be that large.
    // Always inlined, as DPDK's `rte_mempool_get` is: the fast path is a few loads and stores
    // (the slow path is a call). Left to the inliner's weighing, whether a call is inlined
    // depends on how many copies of the caller there are: with four copies of the bench's
    // get + put loop, `OwnedBuffer`'s `#[inline]` drop and the bench's `#[inline]` wrapper
    // of this call went out of line (`benches/pool.rs`, get + put 4.2 -> 4.8 ns, owned
    // 14.5 -> 29 ns).
    #[inline(always)]
    pub fn alloc(&self, len: usize) -> Result<Buffer<'_>, Error> {
        let c = class_of(len);
        if c < self.classes {
            if let Some(unit) = cache::fast_pop(self.id, c) {
                return Ok(self.buffer(Block::small(unit, c), len));
            }
        }
        self.alloc_slow(len)
    }

    #[cold]
    fn alloc_slow(&self, len: usize) -> Result<Buffer<'_>, Error> {
        if len > self.max_len() {
            return Err(self.core().error(Failure::TooLarge, len));
        }
        match self.core().arena.alloc(len) {
            Ok(block) => Ok(self.buffer(block, len)),
            Err(failure) => Err(self.core().error(failure, len)),
        }
    }

    /// Allocates `count` buffers of `len` bytes each, appended to `out`, with one thread-cache
    /// lookup for the batch. All or nothing: on error, `out` is as it was. No heap allocation if
    /// `out` has room for `count` more.
    ///
    /// # Errors
    /// As [`Pool::alloc`]; [`Error::Exhausted`] at once for more buffers than the arena could
    /// ever hold.
    pub fn alloc_bulk<'a>(
        &'a self,
        len: usize,
        count: usize,
        out: &mut Vec<Buffer<'a>>,
    ) -> Result<(), Error> {
        if len > self.max_len() {
            return Err(self.core().error(Failure::TooLarge, len));
        }
        // More buffers than the arena has blocks can never be had: refused before `out` is
        // grown for them (and `out` grows fallibly: no abort for a count the host cannot hold).
        let blocks = self.arena_len() / len.max(MIN_ALIGN);
        if count > blocks || out.try_reserve(count).is_err() {
            return Err(self.core().error(Failure::Exhausted, len));
        }
        let before = out.len();
        let result = self
            .core()
            .arena
            .alloc_bulk(len, count, |block| out.push(self.buffer(block, len)));
        match result {
            Ok(()) => Ok(()),
            Err(failure) => {
                // Dropping the partial batch frees it.
                out.truncate(before);
                Err(self.core().error(failure, len))
            }
        }
    }

    /// Frees a batch of buffers with one thread-cache lookup (dropping them one by one is
    /// equivalent, slightly slower). Buffers of another pool are simply dropped.
    pub fn free_bulk<'a>(&'a self, buffers: impl IntoIterator<Item = Buffer<'a>>) {
        self.core()
            .arena
            .free_bulk(buffers.into_iter().filter_map(|buffer| {
                if buffer.is_from(self) {
                    Some(buffer.into_block())
                } else {
                    drop(buffer);
                    None
                }
            }));
    }

    /// The number of size classes (a [`Batch`](super::Batch) holds blocks of one of them).
    #[inline(always)]
    pub(super) fn classes(&self) -> usize {
        self.classes
    }

    /// The arena's id (what thread caches key on).
    #[inline(always)]
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// Fills `out` with blocks of class `c < classes()`, all or nothing (see
    /// `Arena::alloc_units`); `len` is only for the error.
    #[inline(always)]
    pub(super) fn alloc_units(&self, c: usize, out: &mut [u32], len: usize) -> Result<(), Error> {
        let done = cache::with_fast_slot(self.id, |mine| mine.pop_into(c, out)).unwrap_or(0);
        if done == out.len() {
            return Ok(());
        }
        self.core()
            .arena
            .alloc_units_slow(c, out, done)
            .map_err(|failure| self.core().error(failure, len))
    }

    /// `N` blocks of class `c` from this thread's cache in one fixed-size copy, if it holds that
    /// many; `None` (and nothing taken) otherwise.
    #[inline(always)]
    pub(super) fn alloc_array<const N: usize>(&self, c: usize) -> Option<[u32; N]> {
        cache::fast_pop_array(self.id, c)
    }

    /// Frees the `N` blocks of class `c` in `units` into this thread's cache in one fixed-size
    /// copy, if its magazine has room for all of them and nobody waits for a buffer; `false`
    /// (and nothing freed) otherwise.
    #[inline(always)]
    pub(super) fn free_array<const N: usize>(&self, c: usize, units: &[u32; N]) -> bool {
        let cached = cache::fast_push_array(self.id, c, units);
        if cached && cache::someone_waits_after_push(self.core().waiters()) {
            self.core().arena.hand_over(c);
        }
        cached
    }

    /// Frees `units`, blocks of class `c` of this pool owned by the caller (see
    /// `Arena::free_units`).
    #[inline(always)]
    pub(super) fn free_units(&self, c: usize, units: &[u32]) {
        let done = cache::with_fast_slot(self.id, |mine| mine.push_from(c, units)).unwrap_or(0);
        if done > 0 && cache::someone_waits_after_push(self.core().waiters()) {
            self.core().arena.hand_over(c);
        }
        if done < units.len() {
            self.core().arena.free_units_slow(c, &units[done..]);
        }
    }

    /// Wraps a block of this pool; `len <= max_len() <= u32::MAX` (checked by the callers, or
    /// implied by a size class).
    #[inline(always)]
    fn buffer(&self, block: Block, len: usize) -> Buffer<'_> {
        Buffer::new(self, block, len as u32)
    }

    /// The largest `len` [`Pool::alloc`] can ever satisfy: the largest buddy block, and at most
    /// `u32::MAX` (a buffer records its length in 32 bits, which keeps it 16 bytes).
    #[inline]
    pub fn max_len(&self) -> usize {
        self.core().max_len()
    }

    /// A snapshot of the statistics, taken without stopping traffic (see [`Stats`] for how
    /// exact it is).
    pub fn stats(&self) -> Stats {
        self.core().arena.stats()
    }

    /// Buffers this process allocated and has not freed yet (small and large): what a trace
    /// samples. Allocates nothing (unlike [`Pool::stats`]); while other threads allocate and
    /// free, a count of that moment give or take their calls in progress.
    pub fn buffers_out(&self) -> u64 {
        self.core().arena.blocks_out()
    }

    /// Returns the calling thread's cached blocks to the shared lists and gives up its cache
    /// slot (the next operation on this thread claims one again). Threads do this on exit by
    /// themselves.
    pub fn flush_thread_cache(&self) {
        self.core().arena.flush_current_thread();
    }

    /// The mapping the pool carves.
    pub fn mapping(&self) -> &Mapping {
        &self.core().mapping
    }

    /// Offset in the mapping of the first byte buffers are carved from.
    pub fn arena_offset(&self) -> usize {
        self.core().arena_offset
    }

    /// Bytes buffers are carved from.
    pub fn arena_len(&self) -> usize {
        self.core().arena.geometry().len as usize
    }

    /// The configuration (for an opened shared pool: the creator's, with this process's
    /// exhaustion policy).
    pub fn config(&self) -> &Config {
        &self.core().config
    }

    /// Whether the size class serving `len`-byte requests is cache-coloured
    /// ([`Config::colouring`]): its buffers are then `size + 256` bytes apart and aligned to
    /// [`MIN_ALIGN`](super::MIN_ALIGN) bytes, not to their size. `false` for lengths above the
    /// largest class (whole chunks from the buddy allocator).
    pub fn is_coloured(&self, len: usize) -> bool {
        let g = self.core().arena.geometry();
        let c = class_of(len);
        c < g.classes && g.class[c].stride_inverse != 0
    }

    /// Whether the pool's metadata lives in the region, shared with other processes.
    pub fn is_shared(&self) -> bool {
        self.core().shared
    }

    /// Host address of block `unit` (for a [`Batch`](super::Batch)).
    #[inline(always)]
    pub(super) fn host_of(&self, unit: u32) -> NonNull<u8> {
        self.core().host_of(unit)
    }
}

impl Core {
    /// The count of threads waiting for a free block, which every cached free reads after its
    /// push (`cache::someone_waits_after_push`).
    #[inline(always)]
    fn waiters(&self) -> &AtomicU32 {
        // SAFETY: `waiters` points into the arena's metadata, alive as long as `self`.
        unsafe { self.waiters.as_ref() }
    }

    /// Host address of block `unit` (for [`Buffer::as_ptr`]).
    #[inline(always)]
    pub(super) fn host_of(&self, unit: u32) -> NonNull<u8> {
        // SAFETY: `assemble` refused a base that is not a multiple of MIN_ALIGN. Telling the
        // compiler so lets it drop the alignment checks of `Slice::read`/`write` at offsets
        // it can see are aligned (every unit offset is a multiple of MIN_ALIGN too).
        unsafe { std::hint::assert_unchecked(self.base.as_ptr() as usize % MIN_ALIGN == 0) };
        // SAFETY: `unit` is a block of this arena, so its offset is below the arena length, and
        // the arena lies inside the mapping: the result is inside it too.
        unsafe { self.base.add(Geometry::offset(unit) as usize) }
    }

    /// IOVA of block `unit` (for [`Buffer::iova`]).
    #[inline(always)]
    pub(super) fn iova_of(&self, unit: u32) -> u64 {
        let offset = Geometry::offset(unit);
        match &self.iovas {
            Iovas::Linear(first) => first + offset,
            Iovas::Chunks { shift, iovas } => {
                let chunk = iovas.get((offset >> shift) as usize).copied().unwrap_or(0);
                chunk + (offset & ((1 << shift) - 1))
            }
        }
    }

    #[cold]
    fn error(&self, failure: Failure, len: usize) -> Error {
        match failure {
            Failure::Exhausted => Error::Exhausted {
                len,
                waited: self.config.timeout().unwrap_or_default(),
            },
            Failure::TooLarge => Error::TooLarge {
                len,
                max: self.max_len() as u64,
            },
        }
    }

    /// Capacity in bytes of `block` (for [`Buffer::capacity`]).
    pub(super) fn capacity_of(&self, block: Block) -> usize {
        // At most the arena length, which fits a `usize`.
        block.size(self.arena.geometry()) as usize
    }

    /// Frees a buffer's block (its `Drop`).
    #[inline(always)]
    pub(super) fn free_block(&self, block: Block) {
        let mut cached = false;
        if let Some(c) = block.class() {
            cached = cache::fast_push(self.id, c, block.unit());
            if cached && !cache::someone_waits_after_push(self.waiters()) {
                return;
            }
        }
        self.free_slow(block, cached);
    }

    /// A free that the cache did not take, or that it took while a thread waits for a block
    /// (`cached`): one out-of-line call from the fast path for both, so the path a `Buffer`'s
    /// drop inlines stays small.
    #[cold]
    fn free_slow(&self, block: Block, cached: bool) {
        match block.class() {
            Some(c) if cached => self.arena.hand_over(c),
            _ => self.arena.free(block),
        }
    }

    /// The mapping offset of block `unit`.
    pub(super) fn mapping_offset(&self, unit: u32) -> usize {
        self.arena_offset + Geometry::offset(unit) as usize
    }

    /// The largest `len` an allocation can ever satisfy (see [`Pool::max_len`]).
    #[inline]
    pub(super) fn max_len(&self) -> usize {
        let g = self.arena.geometry();
        (g.chunk_size() << g.max_order).min(u64::from(u32::MAX)) as usize
    }

    /// The mapping the pool carves.
    pub(super) fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// The fast half of an owned buffer's free (its `Drop`), for a small block (`unit` of
    /// class `c`): on this thread's slot of a live pool with room in its magazine, into it
    /// (handing the class over, inside the handshake, if a thread waits for a block), and
    /// `true`; otherwise nothing, and `false` (the caller then runs `free_owned_uncached`).
    #[inline(always)]
    pub(super) fn free_owned_cached(&self, c: usize, unit: u32) -> bool {
        let Some(slot) = cache::fast_slot(self.id) else {
            return false;
        };
        // SAFETY: a slot in this thread's fast table was claimed by this thread and is kept
        // alive by its table, which nothing below touches (as `cache::with_fast_slot`).
        let mine = unsafe { OwnedSlot::new(slot.as_ref()) };
        self.leases
            .free_cached(mine, move |mine| {
                // SAFETY: `c` is the class in a small buffer's tag, which `Buffer::new` took
                // from a block of this pool's classes (at most `MAX_CLASSES`), and which
                // nothing else writes (the buffer's fields are private).
                if !unsafe { mine.push_in(c, unit) } {
                    return None;
                }
                if cache::someone_waits_after_push(self.waiters()) {
                    self.hand_over(c);
                }
                Some(())
            })
            .is_some()
    }

    /// A thread waits for a block of class `c`: hands this thread's cached ones over.
    #[cold]
    #[inline(never)]
    fn hand_over(&self, c: usize) {
        self.arena.hand_over(c);
    }

    /// The slow half of an owned buffer's free: `Leases::free_uncached` over this pool.
    /// Returns whether the caller frees this state now.
    pub(super) fn free_owned_uncached(&self, block: Block) -> bool {
        self.leases.free_uncached(
            || self.free_block(block),
            || self.arena.free_uncached(block),
        )
    }

    /// Counts an owned allocation this thread made on its slow path (its slot's count if it
    /// has one at hand, else the shared one).
    #[cold]
    pub(super) fn count_owned_alloc(&self) {
        if cache::with_fast_slot(self.id, |mine| mine.count_owned_alloc()).is_none() {
            self.leases.count_direct(1);
        }
    }

    /// The handle's drop: whether it frees this state now (see `Leases::retire`).
    fn retire(&self) -> bool {
        self.leases.retire(self.arena.slots())
    }
}
