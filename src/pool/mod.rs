//! The buffer pool: DMA buffers carved from a region mapped once into a device's address space.
//!
//! ```text
//!   Pool::new(mapping)                      one dma::Mapping, mapped once; no syscalls after this
//!     alloc(len) --class_of(len)-->  thread cache (magazine)   hit: a few loads and stores
//!                                      | empty: refill a batch      ^ full: flush half
//!                                      v                            |
//!                                    shared level per class: depot of magazines, block list
//!                                      | empty: carve a slab        (lock-free, tagged CAS)
//!                                      v
//!                                    buddy allocator over chunks  <-- requests above max_class
//!   Buffer { host ptr, IOVA, len, capacity }  --Drop, any thread-->  back to the thread cache
//! ```
//!
//! # Design
//!
//! **An offset allocator at the core.** Everything below [`Pool`] works on byte offsets into an
//! arena `[0, len)` and knows nothing of pointers, IOVAs or mappings; [`Pool`] turns an offset
//! into a [`Buffer`] carrying the host pointer and IOVA at the edge. The metadata (list heads,
//! links, counters) is offsets and indices in atomics, so it can live in memory shared with
//! another process.
//!
//! **Size classes.** Powers of two from 256 B (the DMA alignment every buffer honours) to
//! [`Config::max_class`] (1 MiB by default). The class of a request is computed from
//! `leading_zeros`, with no division or table. A class's blocks come from *slabs* of
//! `max(chunk, block)` bytes taken from the buddy allocator, so every block is aligned to its
//! size and never straddles a chunk (a hugepage, by default): it is IOVA-contiguous even when
//! the mapping is only contiguous per page. Alignment is that of the IOVA (what the device
//! sees): the pool starts its arena where the mapping's IOVA is aligned to the larger of chunk
//! and largest class; the host address shares the IOVA's alignment up to the page size. A slab
//! stays with its class once carved.
//!
//! **Cache colouring** ([`Config::colouring`], off by default) carves the classes from 4 KiB up
//! `size + 256` bytes apart, so that their buffers' first cache lines do not all fall into one
//! L1 set; those buffers are then aligned to 256 bytes, not to their size (see the `geometry`
//! module).
//!
//! **Large buffers.** Requests above the largest class get `2^k` whole chunks from a buddy
//! allocator that splits and merges ([`LargeStats`] counts both). Its free lists are guarded by
//! a spin lock in the metadata (a word, so it works across processes); it is only taken for
//! large buffers and for new slabs.
//!
//! **Thread caches.** Each thread keeps, per pool and class, a magazine of up to
//! [`Config::thread_cache`] blocks (fewer for big classes, bounded by
//! [`Config::thread_cache_bytes`]). Alloc pops, free pushes: one thread-local lookup, a compare,
//! and plain loads and stores — no atomic read-modify-write, no lock, no division. An empty
//! magazine refills half its capacity from the shared level; a full one flushes half back.
//! A thread's slot reserves a 512-entry magazine for every class (about 47 KiB of address
//! space), made as zero-filled pages that take memory only where the thread uses a class.
//! The thread-local state is a small table of `(pool id, slot)` entries; the slots themselves
//! are owned by the pool (a fixed number, [`Config::max_threads`]). A thread's caches go back to
//! the shared lists when the thread exits (a thread-local destructor); a pool dropped while
//! threads still hold cache slots drains them and marks them dead, and a state word on each slot
//! makes a thread exiting concurrently flush into a live pool or not at all. Pool ids are never
//! reused, so a dead entry can never be mistaken for a live pool. See the `cache` module.
//!
//! **Shared lists.** Per class, a lock-free depot of full magazines (a batch of up to 256 blocks
//! moves with one CAS and the magazine's own cache lines) and a lock-free list of single blocks, both tagged Treiber stacks whose
//! head packs a 32-bit generation tag next to a 32-bit index: the ABA defence is written next to
//! each CAS in the `stack` module. No `Mutex` on alloc or free.
//!
//! **Buffers.** A [`Buffer`] borrows its pool (`Buffer<'pool>`), which is what makes the free
//! path free of reference counting: it is `Send`, returns itself to the pool on `Drop` from any
//! thread, and the borrow checker guarantees the pool outlives it. It is two words (the address
//! of the pool's state with the block's size class, or buddy order, in its low 7 bits — the
//! state is 128-byte aligned — and `offset / 256 | len << 32`), so it moves in registers, and
//! freeing it needs no lookup; its host address, IOVA and capacity are computed from the
//! offset and the class. A buffer is at most 4 GiB − 1 bytes. It never hands out `&[u8]` to
//! its memory (the device writes it behind Rust's back): data moves through copies and
//! volatile accesses ([`Buffer::write`], [`Buffer::read`], [`Buffer::slice`]).
//! [`Pool::alloc_bulk`] and [`Pool::free_bulk`] move whole batches with one thread-cache
//! lookup.
//!
//! **Owned buffers.** An [`OwnedBuffer`] ([`Pool::alloc_owned`]) has no lifetime: it is what a
//! queue, a pipeline or a C handle keeps. A [`Pool`] is a handle to the pool's state, which
//! lives in its own allocation; the state is freed by the last of the handle and the owned
//! buffers, with no reference count per buffer: each thread counts the owned buffers it
//! allocates and frees in its own cache (in the magazine's length word, stored with the
//! length), and the handle's drop sums the counts once, after a handshake with the frees
//! under way (asymmetric barriers, as the reclaim below; the `lease` module has the protocol
//! and loom the model). So an owned buffer costs what a borrowed one does across cores, and on
//! one thread the free's busy mark and retirement check more (about 0.2 ns, 1.05x a borrowed
//! get + put in `benches/pool.rs`'s tightest loop, 0.85x DPDK's).
//!
//! **Exhaustion.** An allocation fails only when no block of its class is free anywhere in the
//! process: not on the shared level, not still to be carved, and not in any thread's cache.
//! When the shared level is dry, the allocating thread *reclaims*: it takes the class's cached
//! blocks from every thread's cache, busy or idle (see the `cache` module; the owners' fast
//! paths pay one load per pop for it, and the reclaimer a `membarrier`). A small pool (device
//! memory, a 32-bit DMA window) therefore needs no room for every thread's cache.
//! [`Exhaustion::Fail`] then returns [`Error::Exhausted`] at once; [`Exhaustion::Wait`] sleeps
//! on a futex in the metadata (so a free in another process wakes it too) until a buffer is
//! freed or the timeout passes: a free on any thread of this process that finds a waiter hands
//! its cached blocks of the class to the shared level and wakes it, and a waiter re-checks
//! every millisecond on its own for frees in other processes. In a pool shared between
//! processes, blocks cached by *another process's* threads are not reclaimed: they come back
//! when that process's caches flush (a full cache, thread exit, `flush_thread_cache`).
//!
//! **Dropping a pool with buffers out.** Owned buffers out keep the pool's state, and its
//! mapping, until the last one is back (above). The borrow checker makes a [`Buffer`] outlive
//! its pool impossible, except through `mem::forget` — which is what a ring does on purpose
//! when a device never quiesced and may still write the buffers it was given. A pool whose
//! state goes while any of its buffers (allocated in this process) is out does not unmap its
//! memory: it leaks the mapping deliberately (still mapped, pinned and DMA-mapped until the
//! process exits), counts it in [`leaked_mappings`], and logs nothing. A forgotten owned
//! buffer keeps the whole state until the process exits, as a leaked reference count would.
//!
//! **Statistics** per class and for large buffers ([`Stats`]) are relaxed counters readable at
//! any time; the `stats` module says how exact they are.
//!
//! **Sharing between processes.** [`Pool::create_shared`] puts the metadata at the start of a
//! shareable region (memfd or hugetlbfs, see [`Region::fd`](crate::memory::Region::fd)) behind a
//! versioned header; another process maps the same file, builds its own [`Mapping`] and calls
//! [`Pool::open_shared`], then allocates from the same lists. Thread caches are per process.
//! A process that dies holding buffers, cached blocks or the buddy lock leaves them held: the
//! processes sharing a pool must exit cleanly (dropping the pool flushes the process's caches).
//!
//! ```no_run
//! use userdma::pool::{Config, Pool};
//! # fn demo(mapping: userdma::dma::Mapping) -> Result<(), userdma::pool::Error> {
//! let pool = Pool::new(mapping, Config::default())?;
//! let buffer = pool.alloc(4096)?;
//! buffer.write(0, b"payload")?;
//! println!("device address {:#x}, {} bytes", buffer.iova(), buffer.len());
//! drop(buffer); // back to this thread's cache: no syscall, no lock
//! # Ok(())
//! # }
//! ```

use crate::dma::Mapping;
use std::time::Duration;

mod allocator;
mod arena;
mod batch;
mod buddy;
mod buffer;
mod cache;
mod central;
mod geometry;
#[cfg(not(loom))]
mod interprocess;
mod lease;
mod meta;
mod owned;
mod stack;
mod state;
mod stats;
mod wait;

#[cfg(all(test, loom))]
mod loom_tests;

pub use self::allocator::Pool;
pub use self::batch::{Batch, Entry, IntoIter, Iter};
pub use self::buffer::Buffer;
pub use self::owned::OwnedBuffer;
pub use self::state::leaked_mappings;
pub use self::stats::{ClassStats, LargeStats, Stats};

/// Every buffer's IOVA and host address are aligned to at least this many bytes (and, unless
/// [`Config::colouring`] colours its class, each size class's IOVA to its size).
pub const MIN_ALIGN: usize = geometry::MIN_BLOCK;

/// What an allocation does when nothing is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Exhaustion {
    /// Return [`Error::Exhausted`] at once.
    #[default]
    Fail,
    /// Wait up to this long for a buffer to be freed, then return [`Error::Exhausted`].
    Wait(Duration),
}

/// How a pool carves its region. Built with chained setters from [`Config::default`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    max_class: usize,
    chunk_size: usize,
    thread_cache: usize,
    thread_cache_bytes: usize,
    max_threads: usize,
    magazines: usize,
    exhaustion: Exhaustion,
    /// `None`: follow `dma_alignment` (coloured where the device takes 256-byte alignment).
    colouring: Option<bool>,
    /// `None`: a base page ([`Config::dma_alignment`]).
    dma_alignment: Option<usize>,
}

/// The DMA alignment a pool assumes when nobody states one ([`Config::dma_alignment`]): a base
/// page, what a device that takes page lists (NVMe PRPs) or direct I/O needs.
pub const DEFAULT_DMA_ALIGNMENT: usize = 4096;

impl Default for Config {
    /// 1 MiB largest class, 2 MiB chunks, 512-block thread caches of at most 2 MiB per class,
    /// 64 cache slots, 512 depot magazines, fail on exhaustion; the layout follows the DMA
    /// alignment, a base page unless stated (so no cache colouring: see
    /// [`Config::dma_alignment`]; [`Runtime::pool`](crate::Runtime::pool) states the device's).
    ///
    /// Under Miri (`scripts/miri.sh`, tests only) 4 cache slots and 16 depot magazines: their
    /// tables are made element by element, which the interpreter does ~10^4 times slower.
    fn default() -> Self {
        Self {
            max_class: 1 << 20,
            chunk_size: 2 << 20,
            thread_cache: 512,
            thread_cache_bytes: 2 << 20,
            max_threads: if cfg!(miri) { 4 } else { 64 },
            magazines: if cfg!(miri) { 16 } else { 512 },
            exhaustion: Exhaustion::Fail,
            colouring: None,
            dma_alignment: None,
        }
    }
}

impl Config {
    /// The largest size class (a power of two, 256 B ..= 1 GiB); larger requests are served by
    /// the buddy allocator in whole chunks.
    #[must_use]
    pub fn max_class(mut self, bytes: usize) -> Self {
        self.max_class = bytes;
        self
    }

    /// The buddy allocator's unit and the size of a slab (a power of two, 256 B ..= 1 GiB).
    /// Every chunk of the mapping must be IOVA-contiguous, so on a mapping that is contiguous
    /// only per page this is at most the page size.
    #[must_use]
    pub fn chunk_size(mut self, bytes: usize) -> Self {
        self.chunk_size = bytes;
        self
    }

    /// This configuration with its chunk and largest class lowered to `mapping`'s page size
    /// when the mapping is IOVA-contiguous only in pieces: base pages in a physical-address
    /// space (UIO, no-IOMMU VFIO), where each page is contiguous and page-aligned but
    /// neighbours seldom are, or an IOMMU mapping scattered over several IOVA ranges. Unchanged
    /// for a mapping contiguous over its whole length. [`Runtime::pool`](crate::runtime::Runtime::pool)
    /// applies it; buffers larger than a chunk then come from the buddy allocator in whole
    /// pages, contiguous per page ([`Buffer::contiguous_len`], [`Buffer::iova_at`]).
    #[must_use]
    pub fn fit_to(mut self, mapping: &Mapping) -> Self {
        if mapping.contiguous_len(0) >= mapping.len() {
            return self;
        }
        let page = mapping.region().page_size().bytes();
        self.chunk_size = self.chunk_size.min(page);
        self.max_class = self.max_class.min(page);
        self
    }

    /// Blocks each thread caches per class (0 or 1: no thread caches; at most 512; 512 by
    /// default, bounded by [`Config::thread_cache_bytes`]). A thread moves half of it at a time
    /// to or from the shared level, so the more it caches, the less often a thread that frees
    /// what another allocates (a pipeline across cores) goes there.
    #[must_use]
    pub fn thread_cache(mut self, blocks: usize) -> Self {
        self.thread_cache = blocks;
        self
    }

    /// Bytes each thread caches per class at most (each class caches at least two blocks when
    /// caching is on).
    #[must_use]
    pub fn thread_cache_bytes(mut self, bytes: usize) -> Self {
        self.thread_cache_bytes = bytes;
        self
    }

    /// Threads (per process) that get a cache; further threads run uncached (correct, slower).
    /// Each reserves about 47 KiB of address space when the pool is made, which takes memory
    /// only once a thread claims it, and then only for the classes that thread uses.
    #[must_use]
    pub fn max_threads(mut self, threads: usize) -> Self {
        self.max_threads = threads;
        self
    }

    /// Depot magazines (each moves one batch between thread caches in one step).
    #[must_use]
    pub fn magazines(mut self, magazines: usize) -> Self {
        self.magazines = magazines;
        self
    }

    /// What an allocation does when nothing is free.
    #[must_use]
    pub fn exhaustion(mut self, exhaustion: Exhaustion) -> Self {
        self.exhaustion = exhaustion;
        self
    }

    /// Cache colouring: blocks of the classes from 4 KiB up are placed `size + 256` bytes apart in
    /// their slab instead of `size`, so that consecutive buffers start at up to 16 different
    /// offsets within a page and their first cache lines spread over the CPU's cache sets. Without
    /// it every such buffer starts on a page boundary, and touching the first line of more than 8
    /// of them in a row (filling a batch, reading a burst's headers) misses the L1 cache on each:
    /// DPDK's mempool spreads its objects the same way (a 64-byte header before each). The price:
    /// buffers of those classes are aligned to 256 bytes ([`MIN_ALIGN`]) rather than to their size,
    /// and a slab holds fewer of them (in a 2 MiB chunk, 481 of 4 KiB instead of 512, 31 of 64 KiB
    /// instead of 32). A class is coloured only if it is smaller than a chunk and colouring costs
    /// its slab at most one block in 16 (a 4 KiB class needs chunks of 64 KiB or more); the others
    /// stay as they are. [`Pool::is_coloured`] says which are. Leave it off for buffers that must
    /// be page-aligned: direct I/O through staging (the `userdma-infer` package's `stage`) on a file that needs 4 KiB
    /// alignment (the stager refuses such a buffer with the alignment it needs), or a device that
    /// takes page-sized, page-aligned data pointers (NVMe PRPs).
    ///
    /// Unless set, colouring follows [`Config::dma_alignment`]: on when the device takes buffers
    /// aligned to [`MIN_ALIGN`] (256 bytes), off otherwise. Turning it on with a stated alignment
    /// above that (a device that needs more) is refused when the pool is made
    /// ([`Error::Config`], field `dma_alignment`).
    #[must_use]
    pub fn colouring(mut self, on: bool) -> Self {
        self.colouring = Some(on);
        self
    }

    /// Whether the pool's classes are coloured: as set with [`Config::colouring`], else whether
    /// the DMA alignment allows it (at most [`MIN_ALIGN`]).
    pub fn colouring_enabled(&self) -> bool {
        self.colouring
            .unwrap_or(self.dma_alignment_bytes() <= MIN_ALIGN)
    }

    /// The alignment, in bytes, the device needs of a buffer's start (a power of two from 1 to
    /// 1 GiB): the device the pool's memory is mapped for states it
    /// ([`Device::dma_alignment`](crate::device::Device::dma_alignment): the loopback NPU
    /// 256 bytes, a device that takes page lists such as NVMe a base page), and
    /// [`Runtime::pool`](crate::Runtime::pool) passes it on. It decides the default layout:
    /// at most 256 bytes, the classes from 4 KiB up are cache-coloured (faster: see
    /// [`Config::colouring`]); more, every class is aligned to its size (page aligned from
    /// 4 KiB up). Unset: [`DEFAULT_DMA_ALIGNMENT`], a base page. Buffers of classes smaller
    /// than the alignment are aligned to their size only.
    #[must_use]
    pub fn dma_alignment(mut self, bytes: usize) -> Self {
        self.dma_alignment = Some(bytes);
        self
    }

    /// The DMA alignment in bytes ([`Config::dma_alignment`]; a base page unless set).
    pub fn dma_alignment_bytes(&self) -> usize {
        self.dma_alignment.unwrap_or(DEFAULT_DMA_ALIGNMENT)
    }

    /// Whether a DMA alignment was set ([`Config::dma_alignment`]).
    pub fn dma_alignment_set(&self) -> Option<usize> {
        self.dma_alignment
    }

    /// The largest size class in bytes.
    pub fn largest_class(&self) -> usize {
        self.max_class
    }

    /// How many buffers of `len` bytes a thread's cache holds at most (the size class's
    /// magazine; it moves half that many at a time to or from the shared level). 0 when
    /// thread caches are off or `len` is above the largest class.
    pub fn thread_cache_blocks(&self, len: usize) -> usize {
        if self.thread_cache < 2 || len > self.max_class {
            return 0;
        }
        // The class is below the number of classes (`len` is at most the largest class).
        let shift = geometry::MIN_SHIFT + geometry::class_of(len) as u32;
        (self.thread_cache_bytes >> shift)
            .max(2)
            .min(self.thread_cache)
    }

    /// The chunk size in bytes.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk_size
    }

    /// The exhaustion policy.
    pub fn exhaustion_policy(&self) -> Exhaustion {
        self.exhaustion
    }

    fn timeout(&self) -> Option<Duration> {
        match self.exhaustion {
            Exhaustion::Fail => None,
            Exhaustion::Wait(timeout) => Some(timeout),
        }
    }
}

/// Errors of the pool module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is out of range.
    #[error("pool configuration: {field} = {value} is out of range (expected {expected})")]
    Config {
        /// The setter's name.
        field: &'static str,
        /// The value given.
        value: u64,
        /// What is accepted.
        expected: &'static str,
    },
    /// The mapping leaves less than one slab for buffers.
    #[error(
        "the region leaves {len} bytes for buffers, less than one slab of {needed} bytes: map a \
         larger region, or lower chunk_size / max_class"
    )]
    ArenaTooSmall {
        /// Bytes available for buffers.
        len: u64,
        /// Bytes needed.
        needed: u64,
    },
    /// The mapping is larger than a pool can index.
    #[error("the region leaves {len} bytes for buffers; a pool manages at most {max}: split it")]
    ArenaTooLarge {
        /// Bytes available for buffers.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The mapping's IOVAs cannot be aligned to what the pool promises its buffers.
    #[error(
        "the mapping's IOVA {iova:#x} (host address {host:#x}) is not aligned to {align:#x}: \
         lower max_class / chunk_size to at most the mapping's page size"
    )]
    Misaligned {
        /// Host address of the arena (or of the offending chunk's arena).
        host: u64,
        /// The offending IOVA.
        iova: u64,
        /// The alignment needed (the larger of chunk size and largest class, or the chunk size).
        align: u64,
    },
    /// A chunk of the mapping is not IOVA-contiguous.
    #[error(
        "the mapping is not IOVA-contiguous over the {chunk}-byte chunk at offset {offset:#x}: \
         lower chunk_size to the mapping's page size"
    )]
    NotContiguous {
        /// Offset of the chunk in the mapping.
        offset: usize,
        /// The chunk size.
        chunk: usize,
    },
    /// No buffer of the requested size is free (after waiting, if configured).
    #[error(
        "no {len}-byte buffer free in the pool (waited {waited:?}): free buffers, raise the \
         wait, or create the pool over a larger region"
    )]
    Exhausted {
        /// Bytes requested.
        len: usize,
        /// How long the allocation waited (zero with `Exhaustion::Fail`).
        waited: Duration,
    },
    /// The request is larger than any block the pool can ever hold.
    #[error("a {len}-byte buffer is larger than the pool's largest block ({max} bytes)")]
    TooLarge {
        /// Bytes requested.
        len: usize,
        /// The largest block of the arena.
        max: u64,
    },
    /// A [`Batch`] for buffers above the largest size class (those are whole chunks of the
    /// buddy allocator, allocated one at a time).
    #[error(
        "a batch holds buffers of one size class, at most {max_class} bytes; {len} bytes is \
         above it: allocate such buffers one by one"
    )]
    Unbatchable {
        /// Bytes requested per buffer.
        len: usize,
        /// The pool's largest size class.
        max_class: usize,
    },
    /// More buffers asked of a [`Batch`] than it has room for.
    #[error("{count} more buffers do not fit the batch: room for {room}")]
    BatchFull {
        /// Buffers asked for.
        count: usize,
        /// Places left in the batch.
        room: usize,
    },
    /// `Buffer::set_len` beyond the capacity.
    #[error("buffer length {len} exceeds its capacity {capacity}")]
    Length {
        /// Length asked for.
        len: usize,
        /// The buffer's capacity.
        capacity: usize,
    },
    /// The memory of the pool's thread-cache slots could not be mapped.
    #[error(
        "cannot map the thread caches of {threads} threads: {source} (lower max_threads, or \
         raise the address-space or map-count limit)"
    )]
    CacheSlots {
        /// `Config::max_threads`.
        threads: usize,
        /// The mapping's failure.
        #[source]
        source: std::io::Error,
    },
    /// A shared pool needs a region another process can map.
    #[error(
        "a shared pool needs a shareable region (memfd or hugetlbfs file): build it with \
         memory::Region::builder(..).memfd()"
    )]
    NotShareable,
    /// The region does not start with a pool header.
    #[error(
        "the region holds no initialized pool (magic {found:#018x}): create it with \
         Pool::create_shared first"
    )]
    NotAPool {
        /// The first 8 bytes found.
        found: u64,
    },
    /// The region's pool was made by an incompatible version of this library.
    #[error("the region's pool has layout version {found}, this library reads version {expected}")]
    Version {
        /// Version found in the header.
        found: u32,
        /// Version this library writes.
        expected: u32,
    },
    /// The region's pool header disagrees with this mapping.
    #[error(
        "the region's pool header says {field} = {found}, but this mapping gives {ours}: map \
         the same file with the same length"
    )]
    Incompatible {
        /// Header field.
        field: &'static str,
        /// Value in the header.
        found: u64,
        /// Value from this mapping.
        ours: u64,
    },
    /// Reading or writing buffer memory out of bounds.
    #[error("buffer access out of bounds")]
    Access(#[source] crate::dma::Error),
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::Config { .. }
            | Error::ArenaTooSmall { .. }
            | Error::ArenaTooLarge { .. }
            | Error::Misaligned { .. }
            | Error::NotContiguous { .. }
            | Error::Length { .. }
            | Error::TooLarge { .. }
            | Error::Unbatchable { .. }
            | Error::BatchFull { .. } => Code::InvalidArgument,
            Error::Exhausted { .. } => Code::Exhausted,
            Error::NotShareable
            | Error::NotAPool { .. }
            | Error::Version { .. }
            | Error::Incompatible { .. } => Code::Unsupported,
            Error::CacheSlots { .. } => Code::System,
            Error::Access(e) => e.code(),
        }
    }
}

impl From<crate::dma::Error> for Error {
    fn from(source: crate::dma::Error) -> Self {
        Error::Access(source)
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
