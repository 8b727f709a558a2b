//! [`Buffer`]: one block of a pool, with its host address and IOVA, returned on drop.

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use super::allocator::Pool;
use super::arena::{Block, TAG_LARGE};
use super::state::Core;
use super::Error;
use crate::dma::{Iova, Slice};

/// A DMA buffer from a [`Pool`]: `len` bytes (of `capacity`) at a host address and an IOVA,
/// aligned to at least [`MIN_ALIGN`](super::MIN_ALIGN) and to its size class.
///
/// It borrows its pool, is `Send`, and goes back to the pool when dropped, on any thread. The
/// device may read and write its memory, so it never lends `&[u8]`: copy in and out with
/// [`Buffer::write`] / [`Buffer::read`], or use the volatile [`Slice`] from [`Buffer::slice`].
pub struct Buffer<'pool> {
    /// The address of the pool's state (`Core`), with the block's tag (its size class, or
    /// `TAG_LARGE | order`; see `Block::tag`) added in the low bits, which are zero because a
    /// `Core` is aligned to [`TAG_MASK`]` + 1` bytes.
    tagged: *const u8,
    /// The block's unit (offset / 256) in the low half, the length in the high half. Host
    /// address, IOVA and capacity derive from the unit. Two words per buffer, moved as a pair
    /// of registers, keep rings and batches of buffers cheap, and the class in the tag spares
    /// the free path any lookup.
    word: u64,
    pool: PhantomData<&'pool Pool>,
}

/// Mask of the low address bits a buffer uses for its tag.
const TAG_MASK: usize = 127;

// Two words: passed and moved in registers.
const _: () = assert!(std::mem::size_of::<Buffer<'static>>() == 16);
// The tag fits below the pool's alignment (and inside the pool: its size is a multiple of it),
// and every tag fits the mask.
const _: () = assert!(std::mem::align_of::<Core>() > TAG_MASK);
const _: () = assert!((TAG_LARGE as usize) * 2 - 1 <= TAG_MASK);

// SAFETY: the buffer owns its block exclusively until dropped; its memory is only reached
// through raw pointers and volatile accesses; the tagged pointer stands for a `&'pool Core`,
// which is Send because `Core: Sync`. Dropping it
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
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("offset", &self.offset())
            .finish()
    }
}

impl<'pool> Buffer<'pool> {
    /// A buffer for `block` of `pool`, `len` bytes long.
    #[inline(always)]
    pub(super) fn new(pool: &'pool Pool, block: Block, len: u32) -> Self {
        let tag = block.tag();
        // `wrapping_add` keeps the pointer's provenance (the state's allocation, which the
        // last owned buffer may free through it); the sum stays inside the `Core` (tag <=
        // TAG_MASK < its size and alignment).
        let tagged = pool
            .core_ptr()
            .as_ptr()
            .cast_const()
            .cast::<u8>()
            .wrapping_add(tag as usize);
        Self {
            tagged,
            word: u64::from(block.unit()) | (u64::from(len) << 32),
            pool: PhantomData,
        }
    }

    /// The block's unit.
    #[inline(always)]
    fn unit(&self) -> u32 {
        // The low half of our own packed word.
        self.word as u32
    }

    /// The buffer's tag (see `Block::tag`).
    #[inline(always)]
    fn tag(&self) -> u32 {
        // At most TAG_MASK: fits.
        (self.tagged as usize & TAG_MASK) as u32
    }

    /// The state of the pool this buffer returns to, with the provenance of its allocation.
    #[inline(always)]
    pub(super) fn core_ptr(&self) -> NonNull<Core> {
        let base = self.tagged.wrapping_sub(self.tagged as usize & TAG_MASK);
        // SAFETY: `new` tagged a pointer to a `Core` (never null); removing the tag gives it
        // back.
        unsafe { NonNull::new_unchecked(base.cast::<Core>().cast_mut()) }
    }

    /// The state of the pool this buffer returns to.
    #[inline(always)]
    pub(super) fn core(&self) -> &Core {
        // SAFETY: the address `new` tagged, with its provenance: the state of a pool whose
        // handle is borrowed for 'pool, which this buffer's lifetime is bound to (or, for an
        // owned buffer's, kept alive by its lease until the owned buffer's drop): valid for
        // this borrow of `self`.
        unsafe { self.core_ptr().as_ref() }
    }

    /// Whether this buffer belongs to `pool` (returns to it when dropped).
    #[inline]
    pub fn is_from(&self, pool: &Pool) -> bool {
        self.core_ptr() == pool.core_ptr()
    }

    /// The mapping of the pool this buffer belongs to.
    pub fn mapping(&self) -> &crate::dma::Mapping {
        self.core().mapping()
    }

    /// The two words of the buffer (`tagged`, `word`), for `Buffer::from_words`.
    #[inline(always)]
    pub(super) fn words(&self) -> (*const u8, u64) {
        (self.tagged, self.word)
    }

    /// The buffer whose words are `words` (from [`Buffer::words`] of a buffer given up
    /// since, e.g. an owned buffer being dropped).
    #[inline(always)]
    pub(super) fn from_words((tagged, word): (*const u8, u64)) -> ManuallyDrop<Self> {
        ManuallyDrop::new(Self {
            tagged,
            word,
            pool: PhantomData,
        })
    }

    /// The size class and unit of a small block (`None` for a large one).
    #[inline(always)]
    pub(super) fn small(&self) -> Option<(usize, u32)> {
        let tag = self.tag();
        (tag & TAG_LARGE == 0).then_some((tag as usize, self.unit()))
    }

    /// The block, rebuilt from the unit and the tag.
    #[inline(always)]
    pub(super) fn block(&self) -> Block {
        Block::from_tag(self.unit(), self.tag())
    }

    /// The host address of the first byte. A raw pointer: never make a reference from it.
    #[inline]
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.core().host_of(self.unit())
    }

    /// The address the device uses for the first byte.
    #[inline]
    pub fn iova(&self) -> Iova {
        Iova(self.core().iova_of(self.unit()))
    }

    /// Length in bytes (what was asked for, or set with [`Buffer::set_len`]).
    #[inline]
    pub fn len(&self) -> usize {
        // The high half of our own packed word: a `u32`, which fits every `usize` we build for.
        (self.word >> 32) as usize
    }

    /// Whether the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the buffer can hold: its block size.
    pub fn capacity(&self) -> usize {
        self.core().capacity_of(self.block())
    }

    /// Sets the length (at most the capacity, and at most `u32::MAX`).
    ///
    /// # Errors
    /// [`Error::Length`] if `len` exceeds either.
    pub fn set_len(&mut self, len: usize) -> Result<(), Error> {
        let capacity = self.capacity();
        match u32::try_from(len) {
            Ok(short) if len <= capacity => {
                self.word = u64::from(self.unit()) | (u64::from(short) << 32);
                Ok(())
            }
            _ => Err(Error::Length { len, capacity }),
        }
    }

    /// Offset of the first byte in the pool's mapping.
    pub fn offset(&self) -> usize {
        self.core().mapping_offset(self.unit())
    }

    /// Bytes from the start that are IOVA-contiguous (the capacity, except for large buffers on
    /// a mapping that is only contiguous per chunk).
    pub fn contiguous_len(&self) -> usize {
        self.core()
            .mapping()
            .contiguous_len(self.offset())
            .min(self.capacity())
    }

    /// The IOVA of byte `offset` (below the capacity) of the buffer.
    pub fn iova_at(&self, offset: usize) -> Option<Iova> {
        if offset >= self.capacity() {
            return None;
        }
        self.core()
            .mapping()
            .iova(self.offset().checked_add(offset)?)
    }

    /// A volatile view of the buffer's `len` bytes.
    pub fn slice(&self) -> Slice<'_> {
        // SAFETY: the block is `capacity >= len` bytes inside the pool's mapping, which stays
        // mapped while the pool (borrowed for 'pool, outliving this borrow) lives; this buffer
        // owns the block exclusively, and the pool never makes references to buffer memory.
        unsafe { Slice::from_raw_parts(self.as_ptr(), self.len()) }
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

    /// The buffer's tagged pool pointer (pool and size class, or buddy order, in one word):
    /// equal for two buffers exactly when they share pool and kind.
    #[inline(always)]
    pub(super) fn tagged(&self) -> *const u8 {
        self.tagged
    }

    /// A buffer of class `class` at `unit` of `pool`, built from the parts a
    /// [`Batch`](super::Batch) keeps: `tagged` is `Buffer::tagged` of a buffer of that pool and
    /// class, and `len` at most the class size.
    #[inline(always)]
    pub(super) fn from_parts(tagged: *const u8, unit: u32, len: u32) -> Self {
        Self {
            tagged,
            word: u64::from(unit) | (u64::from(len) << 32),
            pool: PhantomData,
        }
    }

    /// Gives up a buffer that owns no block (built to learn its tag) and returns its tagged
    /// pointer.
    #[inline(always)]
    pub(super) fn tagged_and_forget(self) -> *const u8 {
        ManuallyDrop::new(self).tagged
    }

    /// Gives up the buffer without freeing its block; returns its unit (for a batch).
    #[inline(always)]
    pub(super) fn into_unit(self) -> u32 {
        ManuallyDrop::new(self).unit()
    }

    /// Gives up the buffer without freeing its block (for the pool's bulk free).
    #[inline(always)]
    pub(super) fn into_block(self) -> Block {
        ManuallyDrop::new(self).block()
    }
}

impl Drop for Buffer<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.core().free_block(self.block());
    }
}
