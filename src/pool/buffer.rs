//! [`Buffer`]: one block of a pool, with its host address and IOVA, returned on drop.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use super::arena::Block;
use super::handle::Pool;
use super::Error;
use crate::dma::Slice;

/// A DMA buffer from a [`Pool`]: `len` bytes (of `capacity`) at a host address and an IOVA,
/// aligned to at least [`MIN_ALIGN`](super::MIN_ALIGN) and to its size class.
///
/// It borrows its pool, is `Send`, and goes back to the pool when dropped, on any thread. The
/// device may read and write its memory, so it never lends `&[u8]`: copy in and out with
/// [`Buffer::write`] / [`Buffer::read`], or use the volatile [`Slice`] from [`Buffer::slice`].
pub struct Buffer<'pool> {
    pool: &'pool Pool,
    /// Where the block is and its class; host address and IOVA derive from it (24 bytes per
    /// buffer instead of 40 keeps rings and batches of buffers small).
    block: Block,
    len: usize,
}

// SAFETY: the buffer owns its block exclusively until dropped; its memory is only reached
// through raw pointers and volatile accesses; `&Pool` is Send because `Pool: Sync`. Dropping it
// on another thread returns the block through that thread's cache, which is correct for any
// thread.
unsafe impl Send for Buffer<'_> {}
// SAFETY: `&Buffer` only allows volatile reads and writes (like `dma::Slice`, which is Sync) and
// reading immutable fields.
unsafe impl Sync for Buffer<'_> {}

impl fmt::Debug for Buffer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("iova", &format_args!("{:#x}", self.iova()))
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("offset", &self.offset())
            .finish()
    }
}

impl<'pool> Buffer<'pool> {
    #[inline(always)]
    pub(super) fn new(pool: &'pool Pool, block: Block, len: usize) -> Self {
        Self { pool, block, len }
    }

    /// The pool this buffer returns to.
    pub fn pool(&self) -> &'pool Pool {
        self.pool
    }

    /// The host address of the first byte. A raw pointer: never make a reference from it.
    #[inline]
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.pool.host_of(self.block)
    }

    /// The address the device uses for the first byte.
    #[inline]
    pub fn iova(&self) -> u64 {
        self.pool.iova_of(self.block)
    }

    /// Length in bytes (what was asked for, or set with [`Buffer::set_len`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the buffer can hold: its block size.
    pub fn capacity(&self) -> usize {
        self.pool.capacity_of(&self.block)
    }

    /// Sets the length (at most the capacity).
    ///
    /// # Errors
    /// [`Error::Length`] if `len > capacity`.
    pub fn set_len(&mut self, len: usize) -> Result<(), Error> {
        let capacity = self.capacity();
        if len > capacity {
            return Err(Error::Length { len, capacity });
        }
        self.len = len;
        Ok(())
    }

    /// Offset of the first byte in the pool's mapping.
    pub fn offset(&self) -> usize {
        self.pool.mapping_offset(self.block.offset())
    }

    /// Bytes from the start that are IOVA-contiguous (the capacity, except for large buffers on
    /// a mapping that is only contiguous per chunk).
    pub fn contiguous_len(&self) -> usize {
        self.pool
            .mapping()
            .contiguous_len(self.offset())
            .min(self.capacity())
    }

    /// The IOVA of byte `offset` (below the capacity) of the buffer.
    pub fn iova_at(&self, offset: usize) -> Option<u64> {
        if offset >= self.capacity() {
            return None;
        }
        self.pool.mapping().iova(self.offset().checked_add(offset)?)
    }

    /// A volatile view of the buffer's `len` bytes.
    pub fn slice(&self) -> Slice<'_> {
        // SAFETY: the block is `capacity >= len` bytes inside the pool's mapping, which stays
        // mapped while the pool (borrowed for 'pool, outliving this borrow) lives; this buffer
        // owns the block exclusively, and the pool never makes references to buffer memory.
        unsafe { Slice::from_raw_parts(self.as_ptr(), self.len) }
    }

    /// Copies `src` into the buffer at `offset` (volatile stores).
    ///
    /// # Errors
    /// [`Error::Access`] if `offset + src.len()` exceeds the length.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), Error> {
        Ok(self.slice().write_from(offset, src)?)
    }

    /// Copies `dst.len()` bytes at `offset` out of the buffer (volatile loads).
    ///
    /// # Errors
    /// [`Error::Access`] if `offset + dst.len()` exceeds the length.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        Ok(self.slice().read_into(offset, dst)?)
    }

    /// Gives up the buffer without freeing its block (for the pool's bulk free).
    pub(super) fn into_block(self) -> Block {
        ManuallyDrop::new(self).block
    }
}

impl Drop for Buffer<'_> {
    #[inline]
    fn drop(&mut self) {
        self.pool.free_block(self.block);
    }
}
