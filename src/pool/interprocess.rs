//! Pools whose metadata lives at the start of a shareable region: created by one process,
//! opened by others, all allocating from the same lists.
//!
//! ```text
//!   region (memfd / hugetlbfs file, mapped by every process)
//!   +--------+---------------------------------------------+----------------------------+
//!   | Header | globals, classes, buddy, depot, link table  | arena: buffers ...         |
//!   +--------+---------------------------------------------+----------------------------+
//!   0                                                      arena_offset (aligned)
//! ```
//!
//! The header records the configuration and the layout; the creator zeroes and initializes the
//! metadata, then publishes it by storing `READY` with Release ordering, which an opener reads
//! with Acquire before touching anything else. Every process computes the same table layout
//! from the recorded geometry and checks that it fits below `arena_offset`.

use std::mem::size_of;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::allocator::{aligned_start, Pool};
use super::arena::Arena;
use super::geometry::Geometry;
use super::meta::{Layout, Meta};
use super::{Config, Error, Exhaustion};
use crate::dma::Mapping;

/// "udmapool", little-endian.
const MAGIC: u64 = u64::from_le_bytes(*b"udmapool");
/// Layout version; bump on any change to the metadata's types or order.
const VERSION: u32 = 5;
/// Header state: being initialized.
const INITIALIZING: u32 = 1;
/// Header state: ready to open.
const READY: u32 = 2;

/// The first bytes of a shared pool's region. Atomics, because another process reads them.
#[repr(C)]
#[derive(Debug)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    state: AtomicU32,
    region_len: AtomicU64,
    arena_offset: AtomicU64,
    arena_len: AtomicU64,
    meta_len: AtomicU64,
    max_class: AtomicU64,
    chunk_size: AtomicU64,
    thread_cache: AtomicU64,
    thread_cache_bytes: AtomicU64,
    max_threads: AtomicU64,
    magazines: AtomicU64,
    /// [`Config::colouring`]: 1 on, 0 off.
    colouring: AtomicU64,
}

/// The header at the start of `mapping`.
fn header(mapping: &Mapping) -> Result<&Header, Error> {
    if mapping.len() < size_of::<Header>() {
        return Err(Error::ArenaTooSmall {
            len: 0,
            needed: size_of::<Header>() as u64,
        });
    }
    let ptr = mapping.as_ptr().cast::<Header>();
    // SAFETY: the mapping is page-aligned (so aligned for `Header`), at least a header long,
    // and lives as long as the borrow of `mapping`; the header is made of atomics valid for any
    // bytes, and every process accesses it only through them.
    Ok(unsafe { ptr.as_ref() })
}

/// Converts a header value back to `usize`.
fn size(field: &'static str, value: u64) -> Result<usize, Error> {
    usize::try_from(value).map_err(|_| Error::Incompatible {
        field,
        found: value,
        ours: 0,
    })
}

impl Pool {
    /// A pool whose metadata lives at the start of `mapping`'s region, so that other processes
    /// mapping the same file can [`Pool::open_shared`] it. Whatever the region held is
    /// overwritten.
    ///
    /// # Errors
    /// [`Error::NotShareable`] if the region has no file descriptor, and the errors of
    /// [`Pool::new`].
    pub fn create_shared(mapping: Mapping, config: Config) -> Result<Pool, Error> {
        #[cfg(feature = "tracing")]
        let _span = super::allocator::span("create shared", &mapping, &config);
        if mapping.region().fd().is_none() {
            return Err(Error::NotShareable);
        }
        let region_len = mapping.len() as u64;
        // Sizes the tables for the whole region (an upper bound) and validates the config.
        let upper = Geometry::new(region_len, &config)?;
        let meta_len = Layout::new(&upper, size_of::<Header>()).len;
        let align = config.chunk_size.max(config.max_class);
        let start = aligned_start(&mapping, meta_len, align, config.chunk_size).ok_or(
            Error::ArenaTooSmall {
                len: 0,
                needed: (meta_len + align) as u64,
            },
        )?;
        let g = Geometry::new(region_len - start as u64, &config)?;
        let slots = Arena::slots_for(&g)?;
        let layout = Layout::new(&g, size_of::<Header>());
        let base = mapping.as_ptr();
        // SAFETY: `layout.len <= meta_len <= start < mapping.len()`: the metadata area is inside
        // the mapping, and no reference to it exists yet (the header is borrowed below).
        unsafe { base.as_ptr().write_bytes(0, layout.len) };
        let head = header(&mapping)?;
        // Relaxed stores: published by the Release store of READY below.
        head.state.store(INITIALIZING, Ordering::Relaxed);
        head.version.store(VERSION, Ordering::Relaxed);
        head.region_len.store(region_len, Ordering::Relaxed);
        head.arena_offset.store(start as u64, Ordering::Relaxed);
        head.arena_len.store(g.len, Ordering::Relaxed);
        head.meta_len.store(layout.len as u64, Ordering::Relaxed);
        head.max_class
            .store(config.max_class as u64, Ordering::Relaxed);
        head.chunk_size
            .store(config.chunk_size as u64, Ordering::Relaxed);
        head.thread_cache
            .store(config.thread_cache as u64, Ordering::Relaxed);
        head.thread_cache_bytes
            .store(config.thread_cache_bytes as u64, Ordering::Relaxed);
        head.max_threads
            .store(config.max_threads as u64, Ordering::Relaxed);
        head.magazines
            .store(config.magazines as u64, Ordering::Relaxed);
        head.colouring
            .store(u64::from(config.colouring_enabled()), Ordering::Relaxed);
        head.magic.store(MAGIC, Ordering::Relaxed);
        let base = NonNull::from(head).cast::<u8>();
        // SAFETY: `base` is the page-aligned start of the mapping, which holds `layout.len`
        // bytes of zeroed metadata and outlives the arena (the pool drops the arena first);
        // every process accesses them only as atomics.
        let meta = unsafe { Meta::place(&g, base, &layout) };
        let arena = Arena::create(g, meta, slots, true, config.timeout(), true);
        // Release: pairs with the Acquire load in `open_shared`; an opener that sees READY sees
        // the header and the initialized metadata.
        head.state.store(READY, Ordering::Release);
        Pool::assemble(arena, mapping, start, config, true)
    }

    /// Opens the pool another process created with [`Pool::create_shared`] in the region behind
    /// `mapping` (this process's mapping of the same file, same length). The configuration is
    /// the creator's; `exhaustion` is this process's own policy.
    ///
    /// # Errors
    /// [`Error::NotAPool`], [`Error::Version`] or [`Error::Incompatible`] if the region does not
    /// hold a compatible, initialized pool of this length, and the errors of [`Pool::new`].
    pub fn open_shared(mapping: Mapping, exhaustion: Exhaustion) -> Result<Pool, Error> {
        let head = header(&mapping)?;
        // Acquire: pairs with the Release store of READY in `create_shared`.
        let state = head.state.load(Ordering::Acquire);
        let magic = head.magic.load(Ordering::Relaxed);
        if magic != MAGIC || state != READY {
            return Err(Error::NotAPool { found: magic });
        }
        let version = head.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(Error::Version {
                found: version,
                expected: VERSION,
            });
        }
        let read =
            |field: &'static str, word: &AtomicU64| size(field, word.load(Ordering::Relaxed));
        let region_len = head.region_len.load(Ordering::Relaxed);
        if region_len != mapping.len() as u64 {
            return Err(Error::Incompatible {
                field: "region_len",
                found: region_len,
                ours: mapping.len() as u64,
            });
        }
        let colouring = match head.colouring.load(Ordering::Relaxed) {
            0 => false,
            1 => true,
            other => {
                return Err(Error::Incompatible {
                    field: "colouring",
                    found: other,
                    ours: 1,
                })
            }
        };
        let config = Config {
            max_class: read("max_class", &head.max_class)?,
            chunk_size: read("chunk_size", &head.chunk_size)?,
            thread_cache: read("thread_cache", &head.thread_cache)?,
            thread_cache_bytes: read("thread_cache_bytes", &head.thread_cache_bytes)?,
            max_threads: read("max_threads", &head.max_threads)?,
            magazines: read("magazines", &head.magazines)?,
            exhaustion,
            // The layout the header says; the alignment that chose it is not kept (and not
            // needed: the layout is what the geometry follows).
            colouring: Some(colouring),
            dma_alignment: None,
        };
        let start = read("arena_offset", &head.arena_offset)?;
        let arena_len = head.arena_len.load(Ordering::Relaxed);
        let g = Geometry::new(arena_len, &config)?;
        let layout = Layout::new(&g, size_of::<Header>());
        let fits = g.len == arena_len
            && layout.len <= start
            && start
                .checked_add(arena_len as usize)
                .is_some_and(|end| end <= mapping.len());
        if !fits {
            return Err(Error::Incompatible {
                field: "arena_offset",
                found: start as u64,
                ours: layout.len as u64,
            });
        }
        let base = NonNull::from(head).cast::<u8>();
        // SAFETY: as in `create_shared`: the layout (recomputed from the same geometry) fits
        // below the arena, inside the mapping, which outlives the arena; the creator
        // initialized it before publishing READY, which we acquired.
        let meta = unsafe { Meta::place(&g, base, &layout) };
        let slots = Arena::slots_for(&g)?;
        let arena = Arena::create(g, meta, slots, false, config.timeout(), true);
        Pool::assemble(arena, mapping, start, config, true)
    }
}
