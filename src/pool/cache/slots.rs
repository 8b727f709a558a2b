//! A pool's cache slots: [`Slots`], all of them in one mapping, and [`SlotRef`], one of them
//! held by the thread that claimed it, which keeps the mapping alive after the pool is gone.

#![allow(clippy::wildcard_imports)] // the cache module's constants and imports

#[cfg(not(loom))]
use std::ptr::NonNull;

use super::*;

/// A pool's cache slots, all unclaimed, in one allocation that lives as long as the pool or any
/// thread that holds one of them (see [`SlotRef`]).
pub(crate) struct Slots {
    /// The slots' memory: an anonymous mapping, zero-filled by the kernel page by page as it
    /// is first touched (an allocator's zeroed allocation of this alignment would write every
    /// byte), unmapped when dropped (nothing in a slot owns anything). `None` for no slots.
    #[cfg(not(loom))]
    pub(super) _map: Option<memmap2::MmapRaw>,
    /// The first of `len` slots, at the start of `_map` (dangling when `len` is 0).
    #[cfg(not(loom))]
    pub(super) first: NonNull<Slot>,
    /// How many slots (not under loom, where `slots` knows).
    #[cfg(not(loom))]
    pub(super) len: usize,
    #[cfg(loom)]
    pub(super) slots: Box<[Slot]>,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("len", &self.as_slice().len())
            .finish_non_exhaustive()
    }
}

// SAFETY: `Slots` owns its mapping and only hands out `&Slot`s, which are `Sync`; it holds no
// thread-bound data (the raw pointer is into the mapping it owns).
unsafe impl Send for Slots {}
// SAFETY: as above: `&Slots` gives only `&Slot`s, and `Slot` is `Sync`.
unsafe impl Sync for Slots {}

// Unclaimed is all-zero: a slot is made by zeroing its memory.
const _: () = assert!(FREE == 0);

impl Slots {
    /// `n` unclaimed slots, each with empty magazines that have no room yet.
    ///
    /// Made as zero-filled memory, which is every field's starting value (`FREE`, zero
    /// counters, empty magazines with capacity zero), so nothing is written: a slot's pages
    /// (about 47 KiB of magazines per slot) take memory only once its thread uses a class
    /// (`OwnedSlot::enable`).
    ///
    /// # Errors
    /// The mapping could not be made (address space or map count exhausted).
    #[cfg(not(loom))]
    pub(crate) fn new(n: usize) -> std::io::Result<Self> {
        let size = std::mem::size_of::<Slot>()
            .checked_mul(n)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        if size == 0 {
            return Ok(Self {
                _map: None,
                first: NonNull::dangling(),
                len: 0,
            });
        }
        let map = memmap2::MmapRaw::from(memmap2::MmapOptions::new().len(size).map_anon()?);
        // Page-aligned, and a slot's alignment (64) divides a page.
        const _: () = assert!(std::mem::align_of::<Slot>() <= 4096);
        let Some(first) = NonNull::new(map.as_mut_ptr().cast::<Slot>()) else {
            unreachable!("a mapping is never at address 0");
        };
        Ok(Self {
            _map: Some(map),
            first,
            len: n,
        })
    }

    /// `n` unclaimed slots (loom's atomics and cells carry model state, so each is built).
    #[cfg(loom)]
    pub(crate) fn new(n: usize) -> std::io::Result<Self> {
        let slots: Box<[Slot]> = (0..n)
            .map(|_| Slot {
                state: AtomicU32::new(FREE),
                busy: AtomicU32::new(0),
                classes: std::array::from_fn(|_| ClassCache::new()),
            })
            .collect();
        Ok(Self { slots })
    }

    /// The slots.
    pub(crate) fn as_slice(&self) -> &[Slot] {
        #[cfg(not(loom))]
        // SAFETY: `first` points to `len` slots at the start of `_map`, which this value owns
        // (a dangling pointer for none): the mapping is `len * size_of::<Slot>()` bytes,
        // page-aligned (so aligned for `Slot`), and zero-filled where never written, and zero
        // is a valid value of every field of a slot (atomics, `FREE` being 0; `u32`s in an
        // `UnsafeCell`). Slots are only ever changed through those atomics and cells, never
        // through a `&mut`, so shared references to them are sound for as long as `self`
        // lives, which keeps the mapping.
        unsafe {
            std::slice::from_raw_parts(self.first.as_ptr(), self.len)
        }
        #[cfg(loom)]
        &self.slots
    }

    /// The slots, one by one.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, Slot> {
        self.as_slice().iter()
    }
}

/// One slot of a pool's [`Slots`], held by the thread that claimed it: it keeps the slots alive
/// (after the pool is gone too, until the thread has released it).
#[derive(Debug)]
pub(crate) struct SlotRef {
    pub(super) slots: Arc<Slots>,
    pub(super) index: usize,
}

impl std::ops::Deref for SlotRef {
    type Target = Slot;
    fn deref(&self) -> &Slot {
        &self.slots.as_slice()[self.index]
    }
}

impl SlotRef {
    /// Claims a free slot of `slots` for the calling thread: a handle that keeps every slot
    /// alive.
    pub(crate) fn claim(slots: &Arc<Slots>) -> Option<Self> {
        let index = slots.iter().position(Slot::claim)?;
        Some(Self {
            slots: Arc::clone(slots),
            index,
        })
    }
}
