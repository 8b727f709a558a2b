//! The table: slots in segments made when first needed, claiming a free index (the caller's
//! list first), filling its slot, giving the index back, and dropping what is left.

use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::null_mut;

use super::{free, generation, live, LocalList, Slot, BATCH, LIVE};
use crate::error::{udma_status, Fail};
use crate::handle::{Key, Kind, MAX_LIVE};
use crate::sync::{AtomicPtr, AtomicU64, Mutex, MutexGuard, Ordering, UnsafeCell};

pub(super) struct Grow {
    /// Slots made.
    pub(super) len: u32,
    /// Free indices not in any caller's list.
    free: Vec<u32>,
}

/// Slots of one kind of handle, in `S` segments of `2^B` slots. See the module docs. Both
/// are constants, so that a lookup shifts and masks by immediates and a table is made at
/// compile time (a `static`, with no lazy initialisation to check on every call); the
/// defaults give [`MAX_LIVE`] slots, 4096 a segment, and tests use small ones.
pub(crate) struct Table<T, const B: u32 = 12, const S: usize = { MAX_LIVE >> 12 }> {
    pub(super) kind: Kind,
    /// Each null or the first of `2^B` slots (a leaked `Box<[Slot<T>]>`).
    segments: [AtomicPtr<Slot<T>>; S],
    grow: Mutex<Grow>,
    _values: PhantomData<*const T>,
}

// SAFETY: the table owns its values (moved in by `insert`, out by `remove`), so sending it
// sends them: `T: Send`.
unsafe impl<T: Send, const B: u32, const S: usize> Send for Table<T, B, S> {}
// SAFETY: through a shared table, values move between threads (inserted on one, removed or
// locked on another: `T: Send`) and are read by several at once while pinned (`T: Sync`);
// every access is ordered by the slot's state (the module docs).
unsafe impl<T: Send + Sync, const B: u32, const S: usize> Sync for Table<T, B, S> {}

impl<T, const B: u32, const S: usize> Table<T, B, S> {
    /// An empty table for `kind`.
    #[cfg(not(loom))]
    pub(crate) const fn new(kind: Kind) -> Self {
        Table {
            kind,
            segments: [const { AtomicPtr::new(null_mut()) }; S],
            grow: Mutex::new(Grow {
                len: 0,
                free: Vec::new(),
            }),
            _values: PhantomData,
        }
    }

    /// An empty table for `kind` (loom's atomics and mutexes are made at run time).
    #[cfg(loom)]
    pub(crate) fn new(kind: Kind) -> Self {
        Table {
            kind,
            segments: std::array::from_fn(|_| AtomicPtr::new(null_mut())),
            grow: Mutex::new(Grow {
                len: 0,
                free: Vec::new(),
            }),
            _values: PhantomData,
        }
    }

    pub(super) fn lock_grow(&self) -> MutexGuard<'_, Grow> {
        // A panic while it was held left it consistent: each change is one push, pop or add.
        self.grow
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[inline]
    pub(super) fn slot(&self, index: u32) -> Option<&Slot<T>> {
        let segment = self.segments.get((index >> B) as usize)?;
        // Acquire: pairs with the Release store in `new_slot` that published the segment, so
        // its slots' initialisation happens before this lookup uses them.
        let first = segment.load(Ordering::Acquire);
        if first.is_null() {
            return None;
        }
        let at = (index & ((1 << B) - 1)) as usize;
        // SAFETY: a non-null segment pointer is the first of `2^B` slots made by
        // `new_slot` and freed only when the table drops (which `&self` rules out); `at` is
        // below `2^B`.
        Some(unsafe { &*first.add(at) })
    }

    pub(super) fn exhausted(&self) -> Fail {
        Fail::new(
            udma_status::UDMA_ERR_EXHAUSTED,
            format!(
                "{} live {} handles, the most the library keeps: free or destroy some first",
                self.segments.len() << B,
                self.kind.name()
            ),
        )
    }

    /// Makes slot `grow.len` (and its segment, if it is the segment's first).
    fn new_slot(&self, grow: &mut Grow) -> Result<u32, Fail> {
        let index = grow.len;
        let segment = (index >> B) as usize;
        if segment >= self.segments.len() {
            return Err(self.exhausted());
        }
        if index & ((1 << B) - 1) == 0 {
            let slots: Box<[Slot<T>]> = (0..1u32 << B)
                .map(|_| Slot {
                    state: AtomicU64::new(free(1)),
                    value: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect();
            let first = Box::into_raw(slots).cast::<Slot<T>>();
            // Release: the slots' initialisation happens before every lookup that loads
            // the pointer (Acquire in `slot`).
            self.segments[segment].store(first, Ordering::Release);
        }
        grow.len += 1;
        Ok(index)
    }

    /// A free index: from `local`, refilled from the table's list, or a new slot. The hot
    /// paths claim and [`Table::fill`] apart, so that the value is written once, straight
    /// into its slot, not moved through the thread-local access first.
    ///
    /// # Errors
    /// `UDMA_ERR_EXHAUSTED` when every slot is live.
    #[inline]
    pub(crate) fn claim(&self, local: Option<&LocalList>) -> Result<u32, Fail> {
        match local.and_then(LocalList::pop) {
            Some(index) => Ok(index),
            None => self.claim_slow(local),
        }
    }

    #[cold]
    #[inline(never)]
    fn claim_slow(&self, local: Option<&LocalList>) -> Result<u32, Fail> {
        let mut grow = self.lock_grow();
        if let Some(local) = local {
            let at = grow.free.len().saturating_sub(BATCH);
            for index in grow.free.drain(at..) {
                local.push(index);
            }
            if let Some(index) = local.pop() {
                return Ok(index);
            }
        } else if let Some(index) = grow.free.pop() {
            return Ok(index);
        }
        self.new_slot(&mut grow)
    }

    /// Stores `value` in the slot `index` (claimed by [`Table::claim`] and not filled
    /// since) and returns its key.
    ///
    /// # Errors
    /// `UDMA_ERR_INTERNAL` if the index has no slot (a claimed index always has one); the
    /// value is dropped.
    #[inline]
    pub(crate) fn fill(&self, index: u32, value: T) -> Result<Key, Fail> {
        // SAFETY: `write` initialises the whole value.
        unsafe { self.fill_with(index, |p| p.write(value)) }
    }

    /// As [`Table::fill`], with the value written in place by `init` (field by field, say,
    /// rather than built elsewhere and copied in).
    ///
    /// # Safety
    /// `init` initialises the whole `T` it is given a pointer to (it is not called if the
    /// index has no slot). If it panics, the slot stays free and its index is lost.
    #[inline(always)]
    pub(crate) unsafe fn fill_with(
        &self,
        index: u32,
        init: impl FnOnce(*mut T),
    ) -> Result<Key, Fail> {
        let Some(slot) = self.slot(index) else {
            return Err(self.unmade(index));
        };
        // Relaxed: the slot is free and its index ours alone. Its state was last written by
        // the `remove` or `discard` that freed it (or `new_slot`), which happens before our
        // claim through the free lists (the same thread's list, or the table's mutex).
        let generation = generation(slot.state.load(Ordering::Relaxed));
        // The slot is free and its index claimed by us alone, so no caller reads or writes
        // its value (lockers, pinners and peekers refuse a slot that is not LIVE) until the
        // Release store below publishes it. A free slot's value is uninitialised (its remover
        // moved or dropped it): writing it drops nothing.
        slot.value.with_mut(|v| init(v.cast::<T>()));
        // Release: the value's write happens before the reads of every caller that locks or
        // pins the slot (their Acquire CAS reads this store or a later one).
        slot.state.store(live(generation), Ordering::Release);
        Ok(Key::new(index, generation))
    }

    #[cold]
    fn unmade(&self, index: u32) -> Fail {
        Fail::new(
            udma_status::UDMA_ERR_INTERNAL,
            format!(
                "{} slot {index} was claimed but has no segment",
                self.kind.name()
            ),
        )
    }

    /// Returns a free index: to `local` (spilling a batch to the table's list when it holds
    /// two), or to the table's list.
    #[inline]
    pub(crate) fn release(&self, index: u32, local: Option<&LocalList>) {
        match local {
            Some(local) if local.len() + 1 < 2 * BATCH => {
                local.push(index);
            }
            local => self.release_slow(index, local),
        }
    }

    #[cold]
    #[inline(never)]
    fn release_slow(&self, index: u32, local: Option<&LocalList>) {
        let mut grow = self.lock_grow();
        match local {
            Some(local) => {
                if !local.push(index) {
                    grow.free.push(index);
                }
                if local.len() >= 2 * BATCH {
                    local.drain_into(BATCH, &mut grow.free);
                }
            }
            None => grow.free.push(index),
        }
    }

    /// Gives a caller's whole list back to the table (a thread that ends).
    pub(crate) fn return_list(&self, local: &LocalList) {
        if local.len() > 0 {
            local.drain_into(2 * BATCH, &mut self.lock_grow().free);
        }
    }

    /// Stores `value` in a free slot (its index from `local` first) and returns its key.
    ///
    /// # Errors
    /// `UDMA_ERR_EXHAUSTED` when every slot is live.
    pub(crate) fn insert(&self, value: T, local: Option<&LocalList>) -> Result<Key, Fail> {
        let index = self.claim(local)?;
        self.fill(index, value)
    }
}

impl<T, const B: u32, const S: usize> Drop for Table<T, B, S> {
    fn drop(&mut self) {
        let count = 1usize << B;
        for segment in self.segments.iter() {
            let first = segment.load(Ordering::Acquire);
            if !first.is_null() {
                // SAFETY: made by `new_slot` from a `Box<[Slot<T>]>` of `count` slots, and
                // dropped once, here (`&mut self`: nothing borrows a slot).
                let slots =
                    unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(first, count)) };
                for slot in slots.iter() {
                    if slot.state.load(Ordering::Acquire) & LIVE != 0 {
                        // SAFETY: LIVE: initialised, and dropped once, here (`&mut self`: no
                        // guard or pin is out).
                        slot.value.with_mut(|v| unsafe { (*v).assume_init_drop() });
                    }
                }
                drop(slots);
            }
        }
    }
}
