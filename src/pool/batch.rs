//! [`Batch`]: up to `N` buffers of one pool and one size class, allocated and freed as one.
//!
//! What a batch stores is what the thread cache stores: block units (`u32`), plus, once for
//! all of them, the pool, the size class and the length. Allocating `n` copies `n` units off
//! the top of this thread's magazine with one thread-local lookup (DPDK's `rte_mempool` does
//! the same with pointers out of its per-lcore cache); freeing copies them back. Nothing is
//! done per buffer: no handle is built or pushed, and no buffer's pool is checked, because the
//! batch's type says which pool (`'pool`) and its construction which class — a buffer enters a
//! batch only by being allocated into it, or through [`Batch::push`], which checks that one
//! buffer once. So a block in a batch can be freed only once (the batch owns it; taking it out
//! with [`Batch::pop`] moves it) and only into its own pool and class.
//!
//! A batch is a plain value (for `N = 32`: 160 bytes, no heap), so it can be handed to another
//! thread whole, through a channel or an SPSC ring, and freed there as one.

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::ptr::NonNull;

use super::allocator::Pool;
use super::arena::Block;
use super::buffer::Buffer;
use super::geometry::{class_of, Geometry};
use super::Error;
use crate::dma::Slice;

/// Up to `N` buffers of `len` bytes each, of one size class of one [`Pool`], owned together:
/// allocated with one copy out of this thread's cache ([`Pool::alloc_batch`],
/// [`Batch::fill`]) and freed with one copy back ([`Batch::free`], or dropping the batch, on
/// any thread).
///
/// Every buffer of a batch has the batch's length ([`Batch::buffer_len`]). Read and write the
/// buffers through [`Batch::get`] / [`Batch::iter`] (each a [`Buffer`] view, borrowed from the
/// batch), take one out with [`Batch::pop`] or all with `into_iter`, and add one allocated
/// elsewhere with [`Batch::push`].
///
/// A whole batch (`N` buffers: [`Pool::alloc_batch`] of `N`, [`Batch::fill`] of `N` into an
/// empty batch, [`Batch::free`] or drop of a full one) moves as one fixed-size array between
/// the thread cache and the batch, when the cache holds `N` blocks or has room for them: no
/// loop, and a value the compiler builds straight where the batch lives, so a batch made by
/// `alloc_batch` each round costs what a batch kept and refilled does. Other counts go
/// through a loop over the units (and a call, for the free). Both shapes are timed in
/// `cargo bench --bench pool` (`pool_batch`, made each round; `pool_refill`, kept).
///
/// ```
/// # use std::sync::Arc;
/// # use userdma::dma::{SoftIommu, Space};
/// # use userdma::memory::{PageSize, Region};
/// # use userdma::pool::{Batch, Config, Pool};
/// # let region = Region::builder(4 << 20).page_size(PageSize::Base).build()?;
/// # let pool = Pool::new(SoftIommu::new(48)?.map(Arc::new(region))?, Config::default())?;
/// let mut batch = Batch::<32>::new(&pool, 4096)?;
/// for round in 0..4u64 {
///     batch.fill(32)?;
///     for buffer in batch.iter() {
///         buffer.slice().write(0, round)?;
///     }
///     batch.free();
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Batch<'pool, const N: usize = 32> {
    pool: &'pool Pool,
    /// `Buffer::tagged` of every buffer of the batch: the pool's address plus the class.
    tagged: *const u8,
    class: u32,
    len: u32,
    count: u32,
    units: [u32; N],
}

// The size the module docs give: what a ring slot of batches holds.
const _: () = assert!(std::mem::size_of::<Batch<'static, 32>>() == 160);

// SAFETY: the batch owns its blocks exclusively, like a `Buffer` (which is Send): freeing them
// on another thread goes through that thread's cache, which is correct for any thread. The
// tagged pointer stands for the `&'pool Pool` next to it (`Pool: Sync`).
unsafe impl<const N: usize> Send for Batch<'_, N> {}
// SAFETY: `&Batch` only reads the fields and hands out `Buffer` views, which are Sync.
unsafe impl<const N: usize> Sync for Batch<'_, N> {}

impl<const N: usize> fmt::Debug for Batch<'_, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("len", &self.len())
            .field("capacity", &N)
            .field("buffer_len", &self.buffer_len())
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Allocates `count` buffers of `len` bytes (at most the largest size class) as one batch:
    /// one thread-cache lookup and one copy when the cache holds them, which is the common
    /// case (a fixed-size copy when `count` is `N`: see [`Batch`]). All or nothing.
    ///
    /// # Errors
    /// [`Error::Unbatchable`] above the largest size class, [`Error::BatchFull`] if `count`
    /// exceeds `N`, otherwise as [`Pool::alloc`].
    #[inline(always)]
    pub fn alloc_batch<const N: usize>(
        &self,
        len: usize,
        count: usize,
    ) -> Result<Batch<'_, N>, Error> {
        let class = Batch::<N>::class_for(self, len)?;
        if count == N {
            // The whole batch from this thread's cache as one array value: built where the
            // result goes, with no loop and no copy of a filled array into the batch.
            if let Some(units) = self.alloc_array::<N>(class) {
                return Ok(Batch::from_units(self, class, len, N as u32, units));
            }
        }
        // Any other count, or a cache holding fewer: filled as a bare array, made a batch only
        // once it holds the blocks. The array has no destructor, so the error path drops no
        // batch, and the compiler builds the result with one 160-byte copy fewer than
        // `Batch::empty` + `Batch::fill` would.
        let mut units = [0u32; N];
        let Some(out) = units.get_mut(..count) else {
            return Err(Error::BatchFull { count, room: N });
        };
        self.alloc_units(class, out, len)?;
        // `count <= N <= 2^16`.
        Ok(Batch::from_units(self, class, len, count as u32, units))
    }
}

impl<'pool, const N: usize> Batch<'pool, N> {
    /// Batches hold at most 65536 buffers (their counts are `u32`s, and a batch is a value).
    const SIZE_OK: () = assert!(N <= 1 << 16, "a batch holds at most 65536 buffers");

    /// An empty batch for buffers of `len` bytes of `pool`.
    ///
    /// # Errors
    /// [`Error::Unbatchable`] if `len` is above the pool's largest size class (such buffers
    /// are whole chunks of the buddy allocator, allocated one by one).
    #[inline(always)]
    pub fn new(pool: &'pool Pool, len: usize) -> Result<Self, Error> {
        let class = Self::class_for(pool, len)?;
        Ok(Self::empty(pool, class, len))
    }

    /// The size class of a batch of `len`-byte buffers of `pool`.
    #[inline(always)]
    fn class_for(pool: &Pool, len: usize) -> Result<usize, Error> {
        #[allow(clippy::let_unit_value)]
        let () = Self::SIZE_OK;
        let class = class_of(len);
        if class >= pool.classes() {
            return Err(Error::Unbatchable {
                len,
                max_class: pool.config().largest_class(),
            });
        }
        Ok(class)
    }

    /// An empty batch of class `class` (below `pool.classes()`, which fits `len`).
    #[inline(always)]
    fn empty(pool: &'pool Pool, class: usize, len: usize) -> Self {
        Self::from_units(pool, class, len, 0, [0; N])
    }

    /// A batch of class `class` (below `pool.classes()`, which fits `len`) holding the first
    /// `count` of `units`, blocks of that class the caller allocated.
    #[inline(always)]
    fn from_units(
        pool: &'pool Pool,
        class: usize,
        len: usize,
        count: u32,
        units: [u32; N],
    ) -> Self {
        // The tag and pointer every buffer of this class of `pool` carries; `class` is below
        // the pool's classes, and `len` (at most the class size) fits a `u32`.
        let tagged = Buffer::new(pool, Block::small(0, class), 0).tagged_and_forget();
        Self {
            pool,
            tagged,
            class: class as u32,
            len: len as u32,
            count,
            units,
        }
    }

    /// Allocates `count` more buffers into the batch. All or nothing.
    ///
    /// # Errors
    /// [`Error::BatchFull`] if fewer than `count` places are left, otherwise as
    /// [`Pool::alloc`].
    #[inline(always)]
    pub fn fill(&mut self, count: usize) -> Result<(), Error> {
        let held = self.count as usize;
        // A whole batch into an empty one: one fixed-size copy (see `Pool::alloc_batch`).
        if held == 0 && count == N {
            if let Some(units) = self.pool.alloc_array::<N>(self.class as usize) {
                self.units = units;
                self.count = N as u32;
                return Ok(());
            }
        }
        let Some(out) = self.units.get_mut(held..held + count) else {
            return Err(Error::BatchFull {
                count,
                room: N - held,
            });
        };
        self.pool
            .alloc_units(self.class as usize, out, self.len as usize)?;
        // `held + count <= N <= 2^16`.
        self.count = (held + count) as u32;
        Ok(())
    }

    /// Frees every buffer of the batch (one copy into this thread's cache when it has room);
    /// the batch stays, empty, for [`Batch::fill`] or [`Batch::push`].
    #[inline(always)]
    pub fn free(&mut self) {
        let held = self.count as usize;
        // Emptied before the blocks go back: whatever happens below, none is freed twice.
        self.count = 0;
        // A full batch: one fixed-size copy into this thread's cache when it has room.
        if held == N && self.pool.free_array(self.class as usize, &self.units) {
            return;
        }
        self.free_some(held);
    }

    /// Frees the first `held` units: [`Batch::free`] of a partial batch, or of a full one the
    /// thread cache had no room for. Out of line, so that the whole-batch path inlined into
    /// every caller (and into the batch's drop) stays a few instructions.
    #[inline(never)]
    fn free_some(&self, held: usize) {
        if let Some(units) = self.units.get(..held) {
            self.pool.free_units(self.class as usize, units);
        }
    }

    /// Buffers in the batch.
    #[inline]
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the batch holds no buffer.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Buffers the batch can hold: `N`.
    pub fn capacity(&self) -> usize {
        N
    }

    /// The length of each of the batch's buffers.
    #[inline]
    pub fn buffer_len(&self) -> usize {
        self.len as usize
    }

    /// The pool the batch's buffers belong to.
    pub fn pool(&self) -> &'pool Pool {
        self.pool
    }

    /// A view of buffer `i` (below [`Batch::len`]), borrowed from the batch.
    #[inline]
    pub fn get(&self, i: usize) -> Option<Entry<'_, 'pool>> {
        let unit = *self.units.get(..self.count as usize)?.get(i)?;
        Some(self.entry(unit))
    }

    /// Views of the batch's buffers, in order.
    #[inline]
    pub fn iter(&self) -> Iter<'_, 'pool> {
        Iter {
            units: self.units[..self.count as usize].iter(),
            tagged: self.tagged,
            base: self.pool.host_of(0),
            len: self.len,
            _batch: PhantomData,
        }
    }

    #[inline(always)]
    fn entry(&self, unit: u32) -> Entry<'_, 'pool> {
        Entry {
            buffer: ManuallyDrop::new(Buffer::from_parts(self.tagged, unit, self.len)),
            host: self.pool.host_of(unit),
            _batch: PhantomData,
        }
    }

    /// Adds `buffer` (of this batch's pool and size class: one check, for this buffer) at the
    /// end; its length becomes the batch's. Gives it back if it is of another pool or class, or
    /// if the batch is full.
    ///
    /// # Errors
    /// The buffer itself, untouched, when it cannot join the batch.
    #[inline]
    pub fn push(&mut self, buffer: Buffer<'pool>) -> Result<(), Buffer<'pool>> {
        let held = self.count as usize;
        if buffer.tagged() != self.tagged || held >= N {
            return Err(buffer);
        }
        self.units[held] = buffer.into_unit();
        self.count += 1;
        Ok(())
    }

    /// Takes the last buffer out of the batch.
    #[inline]
    pub fn pop(&mut self) -> Option<Buffer<'pool>> {
        let last = self.count.checked_sub(1)?;
        self.count = last;
        let unit = self.units[last as usize];
        Some(Buffer::from_parts(self.tagged, unit, self.len))
    }
}

impl<const N: usize> Drop for Batch<'_, N> {
    #[inline(always)]
    fn drop(&mut self) {
        self.free();
    }
}

impl<'pool, const N: usize> IntoIterator for Batch<'pool, N> {
    type Item = Buffer<'pool>;
    type IntoIter = IntoIter<'pool, N>;

    /// The batch's buffers as owned [`Buffer`]s, in order; those not taken are freed with the
    /// iterator.
    fn into_iter(self) -> IntoIter<'pool, N> {
        IntoIter {
            batch: self,
            next: 0,
        }
    }
}

/// A view of one buffer of a [`Batch`]: the [`Buffer`] API by `Deref`, for as long as the
/// batch is borrowed. Dropping it frees nothing.
pub struct Entry<'b, 'pool> {
    buffer: ManuallyDrop<Buffer<'pool>>,
    /// The buffer's host address, computed once by the iterator from a base it read once (the
    /// buffer's own `as_ptr` reads the pool's base again for every buffer: a store through
    /// one buffer's slice might, as far as the compiler knows, have changed it).
    host: NonNull<u8>,
    _batch: PhantomData<&'b ()>,
}

impl Entry<'_, '_> {
    /// [`Buffer::as_ptr`], without reading the pool.
    #[inline(always)]
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.host
    }

    /// [`Buffer::slice`], without reading the pool.
    #[inline(always)]
    pub fn slice(&self) -> Slice<'_> {
        // SAFETY: `host` is the buffer's host address (`Pool::host_of` of its unit), and the
        // buffer, which the batch owns for as long as this view borrows it, owns `capacity >=
        // len` bytes there, inside the pool's mapping; as for `Buffer::slice`.
        unsafe { Slice::from_raw_parts(self.host, self.buffer.len()) }
    }
}

impl<'pool> Deref for Entry<'_, 'pool> {
    type Target = Buffer<'pool>;
    #[inline(always)]
    fn deref(&self) -> &Buffer<'pool> {
        &self.buffer
    }
}

impl fmt::Debug for Entry<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.buffer, f)
    }
}

/// The buffers of a [`Batch`] as [`Entry`] views ([`Batch::iter`]).
#[derive(Debug)]
pub struct Iter<'b, 'pool> {
    units: std::slice::Iter<'b, u32>,
    tagged: *const u8,
    /// The host address of unit 0.
    base: NonNull<u8>,
    len: u32,
    _batch: PhantomData<&'b Batch<'pool>>,
}

impl<'b, 'pool> Iterator for Iter<'b, 'pool> {
    type Item = Entry<'b, 'pool>;

    #[inline(always)]
    fn next(&mut self) -> Option<Entry<'b, 'pool>> {
        let &unit = self.units.next()?;
        // SAFETY: `unit` is a block of the batch's pool, so its offset from the host address
        // of unit 0 stays inside the pool's mapping (as in `Pool::host_of`).
        let host = unsafe { self.base.add(Geometry::offset(unit) as usize) };
        Some(Entry {
            buffer: ManuallyDrop::new(Buffer::from_parts(self.tagged, unit, self.len)),
            host,
            _batch: PhantomData,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.units.size_hint()
    }
}

impl ExactSizeIterator for Iter<'_, '_> {}

/// The buffers of a [`Batch`] as owned [`Buffer`]s (`into_iter`).
#[derive(Debug)]
pub struct IntoIter<'pool, const N: usize> {
    batch: Batch<'pool, N>,
    next: usize,
}

impl<'pool, const N: usize> Iterator for IntoIter<'pool, N> {
    type Item = Buffer<'pool>;

    #[inline]
    fn next(&mut self) -> Option<Buffer<'pool>> {
        let batch = &self.batch;
        let &unit = batch.units[..batch.count as usize].get(self.next)?;
        self.next += 1;
        Some(Buffer::from_parts(batch.tagged, unit, batch.len))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.batch.count as usize - self.next;
        (left, Some(left))
    }
}

impl<const N: usize> ExactSizeIterator for IntoIter<'_, N> {}

impl<const N: usize> Drop for IntoIter<'_, N> {
    fn drop(&mut self) {
        // The buffers handed out are the caller's now: free only the rest.
        let batch = &mut self.batch;
        let (held, next) = (batch.count as usize, self.next);
        batch.units.copy_within(next..held, 0);
        batch.count = (held - next) as u32;
        // `batch` is dropped next, freeing those.
    }
}
