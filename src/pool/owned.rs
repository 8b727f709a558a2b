//! [`OwnedBuffer`]: a pool buffer with no lifetime parameter, which keeps its pool alive.
//!
//! A [`Buffer<'pool>`](Buffer) borrows its pool, so whatever holds one (a queue's in-flight
//! payloads, a pipeline's slots, a C handle) is tied to a borrow: a struct that owns a pool and
//! its queues would be self-referential. An `OwnedBuffer` holds a lease on the pool's state
//! instead: it is `'static` and `Send`, goes back to the pool when dropped on any thread, and
//! the pool's state (and the mapping under it) lives until the last of its owned buffers and
//! its handle is gone.
//!
//! The lease costs what the thread cache already does: a count in the length word of the
//! allocating and the freeing thread's own magazine, stored with the length, and on free a
//! busy mark around the retirement check (the `lease` module), with no read-modify-write and
//! no cache line shared between threads. `benches/pool.rs` measures both kinds in the same
//! run: owned 1.05x borrowed on one thread on one machine, 1.14x (0.34 ns more per get + put)
//! on another; across cores the same within noise.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use super::allocator::Pool;
use super::arena::Block;
use super::buffer::Buffer;
use super::cache;
use super::geometry::class_of;
use super::state::Core;
use super::Error;
use crate::dma::{Iova, Mapping, Slice};

/// A DMA buffer that holds a lease on its [`Pool`]'s state: `'static`, `Send`, and back to the
/// pool when dropped on any thread; the pool's state lives until its handle and its last
/// owned buffer are gone.
///
/// It never lends `&[u8]` to its memory: copy in and out with [`OwnedBuffer::write`] /
/// [`OwnedBuffer::read`], or use the volatile [`Slice`] from [`OwnedBuffer::slice`].
pub struct OwnedBuffer {
    /// The block. Its `'static` is a promise this type keeps, not a fact: the pool's state
    /// lives as long as this buffer's lease, which `Drop` gives back. Never handed out as
    /// `&Buffer<'static>` (only with the lifetime of a borrow of `self`).
    buffer: ManuallyDrop<Buffer<'static>>,
}

impl fmt::Debug for OwnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.buffer, f)
    }
}

impl Pool {
    /// Allocates an [`OwnedBuffer`] of `len` bytes: as [`Pool::alloc`], plus one count in this
    /// thread's cache of its class (in the same store as the pop).
    ///
    /// # Errors
    /// As [`Pool::alloc`].
    // Always inlined, as `Pool::alloc` (see there).
    #[inline(always)]
    pub fn alloc_owned(&self, len: usize) -> Result<OwnedBuffer, Error> {
        let c = class_of(len);
        if c < self.classes() {
            let popped = cache::with_fast_slot(self.id(), |mine| mine.pop_owned(c));
            if let Some(Some(unit)) = popped {
                // `len` fits a class, so a `u32`.
                return Ok(OwnedBuffer::lease(Buffer::new(
                    self,
                    Block::small(unit, c),
                    len as u32,
                )));
            }
        }
        self.alloc_owned_slow(len)
    }

    #[cold]
    fn alloc_owned_slow(&self, len: usize) -> Result<OwnedBuffer, Error> {
        let buffer = self.alloc(len)?;
        self.core()
            .count_owned_alloc(buffer.small().map_or(0, |(c, _)| c));
        Ok(OwnedBuffer::lease(buffer))
    }
}

impl OwnedBuffer {
    /// The owned form of `buffer`, whose allocation was counted as an owned one.
    #[inline(always)]
    fn lease(buffer: Buffer<'_>) -> Self {
        // SAFETY: only the lifetime changes. The pool's state `buffer` points to stays alive
        // while this lease is out (counted in its thread's slot: the handle's drop then leaves
        // the state to the last owned buffer, `lease` module); the `'static` buffer is never
        // handed out by reference except reborrowed for a borrow of `self`.
        let buffer = unsafe { std::mem::transmute::<Buffer<'_>, Buffer<'static>>(buffer) };
        OwnedBuffer {
            buffer: ManuallyDrop::new(buffer),
        }
    }

    /// The buffer, borrowed for as long as `self` is: everything [`Buffer`] offers that reads
    /// or copies (its lifetime is tied to this borrow, not to the pool).
    #[inline(always)]
    pub fn as_buffer(&self) -> &Buffer<'_> {
        &self.buffer
    }

    /// Whether this buffer belongs to `pool` (returns to it when dropped).
    #[inline]
    pub fn is_from(&self, pool: &Pool) -> bool {
        self.buffer.is_from(pool)
    }

    /// The mapping of the pool this buffer belongs to (alive as long as the buffer).
    pub fn mapping(&self) -> &Mapping {
        self.buffer.mapping()
    }

    /// Offset of the first byte in the pool's mapping.
    pub fn offset(&self) -> usize {
        self.buffer.offset()
    }

    /// The host address of the first byte. A raw pointer: never make a reference from it.
    #[inline]
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.buffer.as_ptr()
    }

    /// The address the device uses for the first byte.
    #[inline]
    pub fn iova(&self) -> Iova {
        self.buffer.iova()
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// Bytes the buffer can hold: its block size.
    pub fn capacity(&self) -> usize {
        self.buffer.capacity()
    }

    /// Sets the length (at most the capacity).
    ///
    /// # Errors
    /// [`Error::Length`] if `len` exceeds it.
    pub fn set_len(&mut self, len: usize) -> Result<(), Error> {
        self.buffer.set_len(len)
    }

    /// The IOVA of byte `offset` (below the capacity).
    pub fn iova_at(&self, offset: usize) -> Option<Iova> {
        self.buffer.iova_at(offset)
    }

    /// A volatile view of the buffer's `len` bytes.
    pub fn slice(&self) -> Slice<'_> {
        self.buffer.slice()
    }

    /// Copies `src` into the buffer at `offset` (volatile stores).
    ///
    /// # Errors
    /// [`Error::Access`] if `offset + src.len()` exceeds the length.
    #[inline]
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), Error> {
        self.buffer.write(offset, src)
    }

    /// Copies `dst.len()` bytes at `offset` out of the buffer (volatile loads).
    ///
    /// # Errors
    /// [`Error::Access`] if `offset + dst.len()` exceeds the length.
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        self.buffer.read(offset, dst)
    }
}

impl Drop for OwnedBuffer {
    // Always inlined, as `Buffer`'s drop: the fast half only; the rest is one call.
    #[inline(always)]
    fn drop(&mut self) {
        let core = self.buffer.core_ptr();
        if let Some((c, unit)) = self.buffer.small() {
            // SAFETY: this buffer's lease keeps the state alive until a free gives it back;
            // the reference lives for this call only.
            if unsafe { core.as_ref() }.free_owned_cached(c, unit) {
                return;
            }
        }
        // SAFETY: the lease is still out (the fast half did nothing).
        unsafe { free_owned_slow(self.buffer.words()) };
    }
}

/// The slow half of an owned buffer's free (see `Leases::free_uncached`), out of line so that
/// a drop inlines only the fast half (with all of it, the drop glue of an `OwnedBuffer` went
/// out of line: a call per free, 6.1 instead of 4.2 ns for a get + put in `benches/pool.rs`).
/// Frees the pool's state after the last owned buffer of a retired pool.
///
/// Takes the buffer's two words rather than its block and state: decoding them here keeps
/// that out of the drop too.
///
/// # Safety
/// `words` are those of an owned buffer being dropped whose lease is still out.
#[cold]
#[inline(never)]
unsafe fn free_owned_slow(words: (*const u8, u64)) {
    let buffer = Buffer::from_words(words);
    let core: NonNull<Core> = buffer.core_ptr();
    let block = buffer.block();
    let last = {
        // SAFETY: the lease keeps the state alive until the call below gives it back; the
        // reference ends with this block.
        let state = unsafe { core.as_ref() };
        state.free_owned_uncached(block)
    };
    if last {
        // SAFETY: the last lease of a retired pool: no handle, no other owned buffer and no
        // free under way reaches the state any more (`Leases::free_uncached`), and no
        // reference to it is alive. `core` has the provenance of the state's allocation
        // (`Buffer::new` tagged the handle's pointer from `Box::leak`).
        drop(unsafe { Box::from_raw(core.as_ptr()) });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::{Arc, Barrier, Weak};

    use crate::dma::{SoftIommu, Space};
    use crate::memory::{PageSize, Region};
    use crate::pool::{Config, Pool};

    /// Bytes of the tests' regions: 16 MiB, 1 MiB under Miri (where making a pool costs in
    /// proportion: a page-table entry and chunk metadata per piece, interpreted).
    const REGION: usize = if cfg!(miri) { 1 << 20 } else { 16 << 20 };

    /// Above the largest class: a whole-chunk (buddy) buffer.
    const LARGE: usize = if cfg!(miri) { 128 << 10 } else { 3 << 20 };

    /// A pool over `REGION` bytes of base pages (under Miri with 64 KiB chunks and classes up
    /// to 32 KiB), and a weak reference to its region: alive exactly as long as the pool's
    /// state (which owns the only mapping of it).
    fn pool_with(config: Config) -> (Arc<Pool>, Weak<Region>) {
        let config = if cfg!(miri) {
            config.chunk_size(64 << 10).max_class(32 << 10)
        } else {
            config
        };
        let region = Arc::new(
            Region::builder(REGION)
                .page_size(PageSize::Base)
                .lock(false)
                .build()
                .expect("a region"),
        );
        let weak = Arc::downgrade(&region);
        let mapping = SoftIommu::new(48)
            .expect("space")
            .map(region)
            .expect("mapped");
        (Arc::new(Pool::new(mapping, config).expect("pool")), weak)
    }

    fn pool() -> (Arc<Pool>, Weak<Region>) {
        pool_with(Config::default())
    }

    #[test]
    fn an_owned_buffer_outlives_every_handle_of_its_pool() {
        let (pool, region) = pool();
        let buffer = pool.alloc_owned(4096).expect("buffer");
        buffer.write(0, b"still here").expect("write");
        let big = pool.alloc_owned(LARGE).expect("a large buffer");
        drop(pool);
        // The buffer keeps the pool's state (and its mapping) alive on another thread.
        let buffer = std::thread::spawn(move || {
            let mut back = [0u8; 10];
            buffer.read(0, &mut back).expect("read");
            assert_eq!(&back, b"still here");
            buffer
        })
        .join()
        .expect("thread");
        assert!(region.upgrade().is_some());
        assert_eq!(buffer.mapping().len(), REGION);
        drop(buffer);
        assert!(region.upgrade().is_some(), "one buffer is still out");
        drop(big);
        assert!(region.upgrade().is_none(), "the last buffer frees the pool");
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: the paths of the other owned tests again (the state freed by the handle, the slow path's counts); kept out for CI time"
    )]
    fn a_pool_with_nothing_out_is_freed_by_its_handle() {
        let (pool, region) = pool();
        let owned: Vec<_> = (0..100)
            .map(|_| pool.alloc_owned(1000).expect("buffer"))
            .collect();
        let moved: Vec<_> = (0..100)
            .map(|_| pool.alloc_owned(1000).expect("buffer"))
            .collect();
        // Freed on another thread: its slot counts them back.
        std::thread::spawn(move || drop(moved))
            .join()
            .expect("thread");
        drop(owned);
        assert_eq!(pool.buffers_out(), 0);
        drop(pool);
        assert!(region.upgrade().is_none());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: thousands of buffers; the counts' paths are in the other owned tests; kept out for CI time"
    )]
    fn leases_stay_counted_through_refills_flushes_and_a_thread_exit() {
        let (pool, region) = pool();
        // On a thread that then exits, its slot drained and released with its counts in it:
        // more buffers than a magazine holds (refills, counted on the slow path) and a large
        // one (no class of its own).
        let mut theirs = std::thread::scope(|s| {
            s.spawn(|| {
                let mut buffers: Vec<_> = (0..1500)
                    .map(|_| pool.alloc_owned(4096).expect("buffer"))
                    .collect();
                buffers.push(pool.alloc_owned(LARGE).expect("a large buffer"));
                buffers
            })
            .join()
            .expect("thread")
        });
        // More than a magazine holds freed on this thread (flushes), and some more allocated.
        let rest = theirs.split_off(700);
        drop(theirs);
        let ours: Vec<_> = (0..600)
            .map(|_| pool.alloc_owned(2048).expect("buffer"))
            .collect();
        assert_eq!(pool.buffers_out(), 801 + 600);
        drop(pool);
        assert!(region.upgrade().is_some(), "1401 buffers are out");
        drop(ours);
        assert!(region.upgrade().is_some(), "801 buffers are out");
        std::thread::spawn(move || drop(rest))
            .join()
            .expect("thread");
        assert!(region.upgrade().is_none(), "the last buffer frees the pool");
    }

    #[test]
    fn leases_stay_counted_through_batches_of_their_class() {
        let (pool, region) = pool();
        // Leased here: this thread's cache of the 4 KiB class counts them.
        let owned: Vec<_> = (0..40)
            .map(|_| pool.alloc_owned(4096).expect("buffer"))
            .collect();
        // Batches of that class through the same cache, whole (the array paths) and not (the
        // slice paths): the length word moves by many at a time.
        for n in [32, 20, 32, 7] {
            drop(pool.alloc_batch::<32>(4096, n).expect("a batch"));
        }
        drop(pool);
        assert!(region.upgrade().is_some(), "40 buffers are out");
        std::thread::spawn(move || drop(owned))
            .join()
            .expect("thread");
        assert!(region.upgrade().is_none(), "the last buffer frees the pool");
    }

    /// Owned buffers a test never drops: as good as forgotten (`mem::forget`), but reachable
    /// from here, so that the leak checkers (LeakSanitizer, Miri's) do not report the pool's
    /// state they keep on purpose.
    static NEVER_DROPPED: std::sync::Mutex<Vec<super::OwnedBuffer>> =
        std::sync::Mutex::new(Vec::new());

    #[test]
    fn a_forgotten_owned_buffer_keeps_the_pool_alive() {
        let (pool, region) = pool();
        NEVER_DROPPED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(pool.alloc_owned(4096).expect("buffer"));
        drop(pool.alloc_owned(4096).expect("buffer"));
        drop(pool);
        // As a leaked reference count did: the memory stays mapped until the process exits.
        assert!(region.upgrade().is_some());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: the paths of the other owned tests again (the state freed by the handle, the slow path's counts); kept out for CI time"
    )]
    fn threads_without_a_cache_slot_count_their_leases_too() {
        // One slot: the first thread to use the pool takes it, the others run uncached.
        let (pool, region) = pool_with(Config::default().max_threads(1));
        let mine = pool.alloc_owned(4096).expect("buffer");
        let theirs = std::thread::scope(|s| {
            s.spawn(|| {
                let theirs: Vec<_> = (0..8)
                    .map(|_| pool.alloc_owned(4096).expect("buffer"))
                    .collect();
                // Some of this thread's buffers freed here, uncached.
                theirs.into_iter().skip(3).collect::<Vec<_>>()
            })
            .join()
            .expect("thread")
        });
        drop(mine);
        drop(pool);
        assert!(region.upgrade().is_some(), "five buffers are out");
        std::thread::spawn(move || drop(theirs))
            .join()
            .expect("thread");
        assert!(region.upgrade().is_none());
    }

    #[test]
    fn frees_racing_the_handles_drop_free_the_pool_once() {
        // Each round: buffers out on three threads, which free them while the last handle is
        // dropped. Whoever comes last frees the pool, exactly once, and never while a free
        // still uses it (ASan and Miri check the second).
        // Fewer rounds where each costs more: interpreted, or instrumented.
        let rounds = if cfg!(miri) {
            1
        } else if cfg!(any(
            userdma_sanitize = "address",
            userdma_sanitize = "thread"
        )) {
            40
        } else {
            200
        };
        for round in 0..rounds {
            let config = Config::default().max_threads(if round % 2 == 0 { 64 } else { 2 });
            let (pool, region) = pool_with(config);
            let start = Arc::new(Barrier::new(4));
            let threads: Vec<_> = (0..3)
                .map(|t| {
                    let buffers: Vec<_> = (0..if cfg!(miri) { 4 } else { 16 })
                        .map(|i| pool.alloc_owned(256 << ((i + t) % 6)).expect("buffer"))
                        .collect();
                    let start = Arc::clone(&start);
                    std::thread::spawn(move || {
                        start.wait();
                        for buffer in buffers {
                            drop(buffer);
                            std::hint::spin_loop();
                        }
                    })
                })
                .collect();
            start.wait();
            drop(pool);
            for thread in threads {
                thread.join().expect("thread");
            }
            assert!(region.upgrade().is_none(), "round {round}");
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: the paths of the other owned tests again (the state freed by the handle, the slow path's counts); kept out for CI time"
    )]
    fn owned_buffers_report_the_same_addresses_as_borrowed_ones() {
        let (pool, _) = pool();
        let mut owned = pool.alloc_owned(1000).expect("buffer");
        assert!(owned.is_from(&pool));
        assert_eq!(owned.len(), 1000);
        assert_eq!(owned.iova(), owned.as_buffer().iova());
        assert_eq!(owned.iova_at(0), Some(owned.iova()));
        assert_eq!(owned.offset(), owned.as_buffer().offset());
        assert!(owned.capacity() >= 1000);
        owned.set_len(10).expect("shorter");
        assert_eq!(owned.slice().len(), 10);
        assert!(owned.set_len(owned.capacity() + 1).is_err());
        assert!(owned.write(8, b"abc").is_err(), "past the length");
        let iova = owned.iova();
        drop(owned);
        // The block went back to this thread's cache: the next one of its class reuses it.
        assert_eq!(pool.alloc_owned(1000).expect("again").iova(), iova);
        let (other, _) = self::pool();
        assert!(!other.alloc_owned(1000).expect("buffer").is_from(&pool));
    }
}
