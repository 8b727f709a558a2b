//! [`Pool`]: the offset allocator wrapped around one DMA mapping.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use super::arena::{Arena, ArenaBox, Block, Failure};
use super::buffer::Buffer;
use super::cache;
use super::geometry::{class_of, Geometry};
use super::lease::Leases;
use super::meta::Meta;
use super::state::{Core, Iovas};
use super::{Config, Error, Stats, MIN_ALIGN};
use crate::dma::Mapping;

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
        let arena = Arena::create(g, meta, slots, true, config.timeout(), false);
        Pool::assemble(arena, mapping, start, config, false)
    }

    /// Wraps an arena around `mapping` at `arena_offset`, checking alignment and contiguity.
    pub(super) fn assemble(
        arena: ArenaBox,
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
