//! [`Entries`]: a ring part (the SQ or the CQ) as a typed array of entries in a [`Memory`],
//! checked once when made, so that each access on the hot paths is a mask and one plain (or
//! volatile) store or load. The raw accesses by offset, with their per-access checks, are
//! [`Memory`]'s (`memory.rs`); under `cfg(loom)` these views go through them.

use std::mem::size_of;

#[cfg(not(loom))]
use super::memory::load_once;
use super::memory::outside;
use super::Memory;
use crate::dma::Pod;

/// A ring part as an array of a power of two of `T` entries in a [`Memory`], checked (inside
/// the memory, aligned for `T`) once when made: entry `counter & (count - 1)` is then always
/// inside, so writing or reading one is a mask and a store or load, with none of the
/// per-access range checks of [`Memory::write_entry`]. Holds the memory alive (a clone of it).
#[derive(Clone, Debug)]
pub(crate) struct Entries<T> {
    /// Read under loom; otherwise held for the owner that keeps the entries mapped.
    #[cfg_attr(not(loom), allow(dead_code))]
    memory: Memory,
    #[cfg(loom)]
    offset: usize,
    #[cfg(not(loom))]
    first: std::ptr::NonNull<T>,
    mask: u32,
    _entries: std::marker::PhantomData<fn() -> T>,
}

// SAFETY: as for `Memory`, which this is a typed view of (the pointer is into the memory it
// holds, accessed only through raw pointers).
#[cfg(not(loom))]
unsafe impl<T> Send for Entries<T> {}
// SAFETY: as for Send.
#[cfg(not(loom))]
unsafe impl<T> Sync for Entries<T> {}

impl<T: Pod> Entries<T> {
    /// The `count` entries (a power of two) of `T` from byte `offset` of `memory`. Panics if
    /// they are not all inside it or the first is misaligned for `T`: the caller's offsets come
    /// from a [`Layout`](super::Layout) already checked against the memory, so that is a bug.
    pub(crate) fn new(memory: &Memory, offset: usize, count: u32) -> Entries<T> {
        assert!(
            count.is_power_of_two(),
            "{count} entries: not a power of two"
        );
        let bytes = (count as usize).checked_mul(size_of::<T>());
        let Some(bytes) = bytes else {
            outside(offset, usize::MAX, memory.len());
        };
        memory.check(offset, bytes);
        #[cfg(not(loom))]
        let first = {
            let first = memory.as_ptr().as_ptr().wrapping_add(offset).cast::<T>();
            // Aligned for `T`, and for the chunks `read_once` loads by (the size is a multiple
            // of the chunk, so then every entry is).
            if !first.is_aligned() || first as usize % Memory::chunk::<T>() != 0 {
                outside(offset, size_of::<T>(), memory.len());
            }
            // SAFETY: a pointer into the memory (`check` put `offset` inside), not null.
            unsafe { std::ptr::NonNull::new_unchecked(first) }
        };
        Entries {
            memory: memory.clone(),
            #[cfg(loom)]
            offset,
            #[cfg(not(loom))]
            first,
            mask: count - 1,
            _entries: std::marker::PhantomData,
        }
    }

    /// Writes `value` into the entry of counter `counter`, as [`Memory::write_entry`] with no
    /// `skip` does: a plain store of the whole value, in a slot no one else touches until the
    /// doorbell that follows.
    #[inline]
    pub(crate) fn write(&self, counter: u32, value: T) {
        self.store(counter & self.mask, value);
    }

    /// Stores `value` into entry `index`, which must be below the count (the callers mask a
    /// counter, or stay inside a run they bounded by it).
    #[inline(always)]
    fn store(&self, index: u32, value: T) {
        assert_index(index, self.mask);
        #[cfg(not(loom))]
        // SAFETY: `index <= mask < count` (checked above, in debug builds; the callers keep
        // it so), and `new` checked that the `count` entries from `first` are inside the
        // memory (mapped, writable, kept alive by `self.memory`) and that `first` is aligned
        // for `T`, so each entry is (the size is a multiple of the alignment); a raw pointer,
        // no reference made. No one else reads or writes the entry meanwhile, as for
        // `Memory::write_entry`.
        unsafe {
            self.first.as_ptr().add(index as usize).write(value)
        };
        #[cfg(loom)]
        self.memory
            .write_entry(self.offset + index as usize * size_of::<T>(), &value, None);
    }

    /// Loads entry `index`, which must be below the count, with a plain load (see
    /// [`Entries::read_from`]).
    #[inline(always)]
    fn load(&self, index: u32) -> T {
        assert_index(index, self.mask);
        #[cfg(not(loom))]
        // SAFETY: as in `store`: inside the memory and aligned; a raw pointer, no reference
        // made; nobody writes the entry meanwhile (see `read_from`), so a plain load is not a
        // data race.
        return unsafe { self.first.as_ptr().add(index as usize).read() };
        #[cfg(loom)]
        self.memory
            .read_entry(self.offset + index as usize * size_of::<T>())
    }

    /// Copies out the entry of counter `counter` in volatile loads, each byte loaded once (as
    /// [`Memory::read_entry`] does, without its range check: the entries were checked when
    /// this view was made). For a reader that checks an entry before acting on it and must not
    /// have it loaded again from memory someone else might be writing.
    #[inline]
    pub(crate) fn read_once(&self, counter: u32) -> T {
        let index = counter & self.mask;
        #[cfg(not(loom))]
        // SAFETY: `index < count`, and `new` checked that the `count` entries from `first` are
        // inside the memory (mapped, kept alive by `self.memory`) and that `first` is aligned
        // to the chunk `load_once` loads by, so every entry is (its size is a multiple of it).
        unsafe {
            load_once(self.first.as_ptr().add(index as usize).cast::<u8>())
        }
        #[cfg(loom)]
        self.memory
            .read_entry(self.offset + index as usize * size_of::<T>())
    }

    /// A hint that the entry of counter `counter` will be read soon: starts loading the cache
    /// lines it reaches that the entry before it does not, so a reader going through small
    /// entries one by one asks for each line once (eight 8-byte entries share a line) and a
    /// 64-byte entry's line is asked for with each. No effect on what any access returns.
    #[inline]
    pub(crate) fn prefetch_new_lines(&self, counter: u32) {
        #[cfg(all(not(loom), target_arch = "x86_64"))]
        {
            let index = (counter & self.mask) as usize;
            let size = size_of::<T>();
            let first = self.first.as_ptr().cast::<i8>();
            let start = first.addr() + index * size;
            for line in new_lines(start, size, index == 0) {
                let at = (line * LINE).max(start);
                // The address as an offset from the ring's pointer, keeping its provenance
                // (no integer-to-pointer cast: Miri runs with strict provenance).
                let at = first.wrapping_add(at - first.addr());
                // SAFETY: a prefetch is a hint with no architectural effect; the address is
                // inside the entry, which is inside the mapped memory anyway.
                unsafe {
                    core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at)
                };
            }
        }
        #[cfg(any(loom, not(target_arch = "x86_64")))]
        let _ = counter;
    }

    /// Writes up to `max` entries (at most all of them) from counter `counter` on, as
    /// [`Entries::write`] does, taking each from `next` until it returns `None` and going on
    /// from the first entry after the last. Returns how many were written.
    #[inline]
    pub(crate) fn write_from(
        &self,
        counter: u32,
        max: u32,
        mut next: impl FnMut() -> Option<T>,
    ) -> u32 {
        let count = self.mask + 1;
        let max = max.min(count);
        let index = counter & self.mask;
        // Up to the last entry, then from the first.
        let run = max.min(count - index);
        let written = self.write_run(index, run, &mut next);
        if written < run || run == max {
            return written;
        }
        written + self.write_run(0, max - run, &mut next)
    }

    /// Copies out the `count` entries (at most all of them) from counter `counter` on, handing
    /// each to `f`, going on from the first entry after the last, with plain loads, not the
    /// volatile ones of [`Memory::read_entry`]. The caller reads entries nobody writes
    /// meanwhile: SQ entries the host announced, which it does not touch again until the device
    /// hands their slots back (it writes only past the tail it announced, and the doorbell's
    /// release and acquire fences order its stores before these loads), so plain loads do not
    /// race; they leave the compiler free to load as wide as it likes and to vectorise what `f`
    /// does over the run. What they give up is the guarantee that a value is fetched once: a
    /// device model that checks an entry and must not have it read again from memory a
    /// misbehaving host might still be writing reads with `read_entry` (the loopback engine
    /// does).
    #[inline]
    pub(crate) fn read_from(&self, counter: u32, count: u32, mut f: impl FnMut(T)) {
        let all = self.mask + 1;
        let count = count.min(all);
        let index = counter & self.mask;
        // Up to the last entry, then from the first.
        let run = count.min(all - index);
        self.read_run(index, run, &mut f);
        self.read_run(0, count - run, &mut f);
    }

    /// Reads the `len` entries from entry `index` on (`index + len` at most the count).
    #[inline(always)]
    fn read_run(&self, index: u32, len: u32, f: &mut impl FnMut(T)) {
        for k in index..index + len {
            f(self.load(k));
        }
    }

    /// Writes up to `len` entries from entry `index` on (`index + len` at most the count).
    #[inline(always)]
    fn write_run(&self, index: u32, len: u32, next: &mut impl FnMut() -> Option<T>) -> u32 {
        let mut written = 0;
        while written < len {
            let Some(value) = next() else { break };
            self.store(index + written, value);
            written += 1;
        }
        written
    }
}

/// Bytes in a cache line, for prefetching.
const LINE: usize = 64;

/// The cache lines (address / [`LINE`]) that an entry of `size` bytes at address `start`
/// reaches and the entry just before it (ending at `start - 1`) does not; `first`: the entry
/// is the ring's first, with no entry before it.
#[cfg_attr(any(loom, not(target_arch = "x86_64")), allow(dead_code))]
pub(super) fn new_lines(start: usize, size: usize, first: bool) -> std::ops::RangeInclusive<usize> {
    let last = (start + size - 1) / LINE;
    let from = if first {
        start / LINE
    } else {
        (start - 1) / LINE + 1
    };
    from..=last
}

/// Debug builds: entry `index` of an [`Entries`] is below its count (`mask + 1`).
#[inline(always)]
fn assert_index(index: u32, mask: u32) {
    debug_assert!(index <= mask, "entry {index} of {}", u64::from(mask) + 1);
}
