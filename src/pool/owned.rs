//! [`OwnedBuffer`]: a pool buffer with no lifetime parameter, which keeps its pool alive.
//!
//! A [`Buffer<'pool>`](Buffer) borrows its pool, so whatever holds one (a queue's in-flight
//! payloads, a pipeline's slots, a C handle) is tied to a borrow: a struct that owns a pool and
//! its queues would be self-referential. An `OwnedBuffer` holds an `Arc<Pool>` instead: it is
//! `'static` and `Send`, goes back to the pool when dropped on any thread, and the pool (and
//! the mapping under it) lives until the last of its owned buffers and handles is gone.
//!
//! The price is the reference count: one uncontended atomic increment on allocation and one
//! decrement on free, on a cache line shared by every thread that allocates or frees from the
//! pool. `benches/pool.rs` measures both kinds in the same run; the borrowed [`Buffer`] stays
//! the fastest path where a borrow fits (a thread that owns its work, scoped threads).

use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

use super::allocator::Pool;
use super::buffer::Buffer;
use super::Error;
use crate::dma::{Iova, Slice};

/// A DMA buffer that owns a reference to its [`Pool`]: `'static`, `Send`, and back to the pool
/// when dropped on any thread; the pool lives until its last owned buffer and handle are gone.
///
/// It never lends `&[u8]` to its memory: copy in and out with [`OwnedBuffer::write`] /
/// [`OwnedBuffer::read`], or use the volatile [`Slice`] from [`OwnedBuffer::slice`].
pub struct OwnedBuffer {
    /// The block. Its `'static` is a promise this type keeps, not a fact: the pool lives as
    /// long as `pool` below, which is dropped after it (see `Drop`). Never handed out as
    /// `&Buffer<'static>` (that would let a caller keep `Buffer::pool`'s reference past us).
    buffer: ManuallyDrop<Buffer<'static>>,
    pool: Arc<Pool>,
}

impl fmt::Debug for OwnedBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.buffer, f)
    }
}

impl Pool {
    /// Allocates an [`OwnedBuffer`] of `len` bytes from the pool behind `self`: as
    /// [`Pool::alloc`], plus one reference-count increment.
    ///
    /// # Errors
    /// As [`Pool::alloc`].
    // Always inlined, as `Pool::alloc` (see there).
    #[inline(always)]
    pub fn alloc_owned(self: &Arc<Self>, len: usize) -> Result<OwnedBuffer, Error> {
        let buffer = self.alloc(len)?;
        // SAFETY: only the lifetime changes. The pool `buffer` borrows is the one `self`
        // points to, kept alive by the `Arc` clone stored next to it, which `OwnedBuffer`
        // drops only after the buffer (its `Drop`); the `'static` buffer is never handed out
        // by reference (see the field's comment), so no `&'static Pool` escapes.
        let buffer = unsafe { std::mem::transmute::<Buffer<'_>, Buffer<'static>>(buffer) };
        Ok(OwnedBuffer {
            buffer: ManuallyDrop::new(buffer),
            pool: Arc::clone(self),
        })
    }
}

impl OwnedBuffer {
    /// The buffer, borrowed for as long as `self` is: everything [`Buffer`] offers that reads
    /// or copies (its lifetime is tied to this borrow, not to the pool).
    #[inline(always)]
    pub fn as_buffer(&self) -> &Buffer<'_> {
        &self.buffer
    }

    /// The pool this buffer returns to.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
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
    // Always inlined, as `Buffer`'s drop.
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: dropped once, here, and not used after; the pool it frees into is alive:
        // `self.pool` is dropped after this body returns.
        unsafe { ManuallyDrop::drop(&mut self.buffer) };
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::Arc;

    use crate::dma::{SoftIommu, Space};
    use crate::memory::{PageSize, Region};
    use crate::pool::{Config, Pool};

    fn pool() -> Arc<Pool> {
        let region = Region::builder(4 << 20)
            .page_size(PageSize::Base)
            .lock(false)
            .build()
            .expect("4 MiB");
        let mapping = SoftIommu::new(48)
            .expect("space")
            .map(Arc::new(region))
            .expect("mapped");
        Arc::new(Pool::new(mapping, Config::default()).expect("pool"))
    }

    #[test]
    fn an_owned_buffer_outlives_every_other_handle_of_its_pool() {
        let pool = pool();
        let buffer = pool.alloc_owned(4096).expect("buffer");
        buffer.write(0, b"still here").expect("write");
        let weak = Arc::downgrade(&pool);
        drop(pool);
        // The buffer keeps the pool (and its mapping) alive on another thread.
        let buffer = std::thread::spawn(move || {
            let mut back = [0u8; 10];
            buffer.read(0, &mut back).expect("read");
            assert_eq!(&back, b"still here");
            buffer
        })
        .join()
        .expect("thread");
        assert!(weak.upgrade().is_some());
        assert!(buffer.as_buffer().pool().stats().arena_bytes > 0);
        drop(buffer);
        assert!(weak.upgrade().is_none(), "the last buffer drops the pool");
    }

    #[test]
    fn owned_buffers_report_the_same_addresses_as_borrowed_ones() {
        let pool = pool();
        let mut owned = pool.alloc_owned(1000).expect("buffer");
        assert_eq!(owned.len(), 1000);
        assert_eq!(owned.iova(), owned.as_buffer().iova());
        assert_eq!(owned.iova_at(0), Some(owned.iova()));
        assert!(owned.capacity() >= 1000);
        owned.set_len(10).expect("shorter");
        assert_eq!(owned.slice().len(), 10);
        assert!(owned.set_len(owned.capacity() + 1).is_err());
        assert!(owned.write(8, b"abc").is_err(), "past the length");
        let iova = owned.iova();
        drop(owned);
        // The block went back to this thread's cache: the next one of its class reuses it.
        assert_eq!(pool.alloc_owned(1000).expect("again").iova(), iova);
    }
}
