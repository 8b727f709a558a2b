//! [`Memory`]: the device-visible memory a ring lives in — host pointer, length and the IOVA the
//! device uses — and, with its typed views (`Entries`, in `entries.rs`), the only code that
//! touches it.
//!
//! Entries are copied in and out through raw pointers, never through a reference: read with
//! volatile loads as wide as the entry's slots are aligned, written with volatile stores
//! (completions, whose phase word goes last) or, for submission entries, with a plain store of
//! the whole entry into a slot nobody else touches until the doorbell (whose release fence
//! orders it, for the compiler as for the CPU). The words another side polls (a CQ entry's phase word, the SQ head the device
//! writes back, the interrupt flag) are accessed as atomics, so that host and device (the
//! loopback engine is another thread) never race in the sense of the Rust memory model; a
//! relaxed atomic load or store is the same single instruction a volatile one is.
//!
//! Under `cfg(loom)` the memory is an array of loom atomics instead, accessed with the same
//! functions, so the ring's protocol is model-checked as written.

use std::mem::size_of;

use super::Error;
use crate::dma::Pod;
#[cfg(loom)]
use crate::sync::Arc;
use crate::sync::AtomicU32;
#[cfg(loom)]
use crate::sync::Ordering;

/// The alignment [`Memory`] must have, in host and IOVA space: a cache line.
pub const ALIGN: usize = 64;

/// What keeps the memory mapped: held, never read.
#[cfg(not(loom))]
#[derive(Clone, Debug)]
#[allow(dead_code)] // The fields are kept for their Drop (unmapping) only.
enum Owner {
    /// The caller, per [`Memory::from_raw`]'s contract.
    Caller,
    /// A DMA mapping (host side).
    Mapping(std::sync::Arc<crate::dma::Mapping>),
    /// A loopback translation (device side).
    Window(crate::dma::Window),
}

/// A piece of device-visible memory for a ring: `len` bytes at a host address, seen by the
/// device at `iova`. Cheap to clone (clones share the owner that keeps it mapped).
///
/// Made from a [`dma::Mapping`](crate::dma::Mapping) (or a part of one) on the host side, from a
/// loopback [`dma::Window`](crate::dma::Window) on the device side, or from raw parts.
#[derive(Clone, Debug)]
pub struct Memory {
    #[cfg(not(loom))]
    ptr: std::ptr::NonNull<u8>,
    #[cfg(not(loom))]
    _owner: Owner,
    #[cfg(loom)]
    words: Arc<Vec<AtomicU32>>,
    len: usize,
    iova: u64,
}

// SAFETY: a Memory is a pointer to device-visible memory that stays mapped while it lives (its
// owner, or the `from_raw` contract) and is only accessed by volatile and atomic operations
// through raw pointers, never references: sharing it between threads is what DMA memory is
// (host and device access it concurrently), and the ring orders those accesses with atomics and
// fences. The owners (`Arc<Mapping>`, `Window`) are Send and Sync themselves.
#[cfg(not(loom))]
unsafe impl Send for Memory {}
// SAFETY: as for Send.
#[cfg(not(loom))]
unsafe impl Sync for Memory {}

impl Memory {
    #[cfg(not(loom))]
    fn check_alignment(addr: usize, iova: u64) -> Result<(), Error> {
        if addr % ALIGN != 0 || iova % ALIGN as u64 != 0 {
            return Err(Error::MisalignedMemory {
                addr,
                iova,
                align: ALIGN,
            });
        }
        Ok(())
    }

    /// The `len` bytes at `ptr`, which the device reaches at `iova`; both must be aligned to
    /// [`ALIGN`] (an `Err` otherwise).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be mapped, readable and writable, and IOVA-contiguous (the device
    /// sees byte `i` at `iova + i`). It must stay so while the returned value or any clone of it
    /// lives, and longer if a queue over it leaked on drop (see [`leaks`](super::leaks)): then
    /// for the rest of the process, since the device may still write it. No Rust reference
    /// (`&`/`&mut`) to those bytes may exist meanwhile.
    #[cfg(not(loom))]
    pub unsafe fn from_raw(
        ptr: std::ptr::NonNull<u8>,
        len: usize,
        iova: u64,
    ) -> Result<Memory, Error> {
        Memory::check_alignment(ptr.as_ptr() as usize, iova)?;
        let fits = u64::try_from(len)
            .ok()
            .and_then(|len| iova.checked_add(len))
            .is_some();
        if !fits || len == 0 {
            return Err(Error::MemoryRange {
                offset: 0,
                len,
                size: len,
            });
        }
        Ok(Memory {
            ptr,
            _owner: Owner::Caller,
            len,
            iova,
        })
    }

    /// `len` bytes at `offset` of a DMA mapping (host side). The range must be IOVA-contiguous
    /// and aligned to [`ALIGN`] in host and IOVA space. Holds the mapping alive.
    #[cfg(not(loom))]
    pub fn from_mapping(
        mapping: std::sync::Arc<crate::dma::Mapping>,
        offset: usize,
        len: usize,
    ) -> Result<Memory, Error> {
        let size = mapping.len();
        let end = offset.checked_add(len);
        if end.is_none_or(|end| end > size) || len == 0 {
            return Err(Error::MemoryRange { offset, len, size });
        }
        if mapping.contiguous_len(offset) < len {
            return Err(Error::NotContiguous {
                offset,
                len,
                contiguous: mapping.contiguous_len(offset),
            });
        }
        let iova = mapping
            .iova(offset)
            .ok_or(Error::MemoryRange { offset, len, size })?
            .raw();
        // SAFETY: `offset < size` (checked above), so the pointer stays inside the mapping.
        let ptr = unsafe { mapping.as_ptr().add(offset) };
        Memory::check_alignment(ptr.as_ptr() as usize, iova)?;
        Ok(Memory {
            ptr,
            _owner: Owner::Mapping(mapping),
            len,
            iova,
        })
    }

    /// The memory behind a loopback device's translation of `iova` (device side): all of
    /// `window`. Holds the window (and so the memory) alive.
    #[cfg(not(loom))]
    pub fn from_window(
        window: crate::dma::Window,
        iova: crate::dma::Iova,
    ) -> Result<Memory, Error> {
        let iova = iova.raw();
        let ptr = window.as_ptr();
        Memory::check_alignment(ptr.as_ptr() as usize, iova)?;
        Ok(Memory {
            ptr,
            len: window.len(),
            _owner: Owner::Window(window),
            iova,
        })
    }

    /// Zeroed, simulated memory for loom models.
    #[cfg(all(loom, test))]
    pub(crate) fn simulated(len: usize, iova: u64) -> Memory {
        let words: Vec<AtomicU32> = (0..len.div_ceil(4)).map(|_| AtomicU32::new(0)).collect();
        Memory {
            words: Arc::new(words),
            len,
            iova,
        }
    }

    /// The `len` bytes at `offset` (a multiple of [`ALIGN`]): e.g. one queue's part of a
    /// mapping that holds several.
    pub fn sub(&self, offset: usize, len: usize) -> Result<Memory, Error> {
        let size = self.len;
        match offset.checked_add(len) {
            Some(end) if end <= size && len > 0 && offset % ALIGN == 0 => {}
            _ => return Err(Error::MemoryRange { offset, len, size }),
        }
        let iova = u64::try_from(offset)
            .ok()
            .and_then(|offset| self.iova.checked_add(offset))
            .ok_or(Error::MemoryRange { offset, len, size })?;
        let mut sub = self.clone();
        sub.len = len;
        sub.iova = iova;
        #[cfg(not(loom))]
        {
            // SAFETY: `offset + len <= self.len`, so the pointer stays inside this memory.
            sub.ptr = unsafe { self.ptr.add(offset) };
        }
        #[cfg(loom)]
        {
            let words: Vec<AtomicU32> = (0..len.div_ceil(4)).map(|_| AtomicU32::new(0)).collect();
            // Loom models use whole memories only; a sub-range is fresh memory of that size.
            sub.words = Arc::new(words);
        }
        Ok(sub)
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the memory has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The IOVA of the first byte: where the device finds it.
    pub fn iova(&self) -> crate::dma::Iova {
        crate::dma::Iova(self.iova)
    }

    /// The host address of the first byte (raw: never make a reference from it).
    #[cfg(not(loom))]
    pub fn as_ptr(&self) -> std::ptr::NonNull<u8> {
        self.ptr
    }

    /// Panics unless `offset..offset + bytes` is inside the memory and `offset` is 4-aligned.
    /// Offsets come from a [`Layout`](super::Layout) checked against this memory when the queue
    /// was made, so this fails only on a bug in this module; it keeps the raw accesses sound
    /// even then.
    #[inline]
    pub(super) fn check(&self, offset: usize, bytes: usize) {
        let inside =
            offset % 4 == 0 && offset.checked_add(bytes).is_some_and(|end| end <= self.len);
        if !inside {
            outside(offset, bytes, self.len);
        }
    }

    /// The word at `offset` as an atomic, for `f`.
    #[inline]
    fn with_atomic<R>(&self, offset: usize, f: impl FnOnce(&AtomicU32) -> R) -> R {
        self.check(offset, 4);
        #[cfg(not(loom))]
        {
            // SAFETY: `check` put the word inside the memory, which is mapped, writable and
            // 4-aligned there (the base is ALIGN-aligned, `offset` a multiple of 4), and stays
            // mapped while `self` lives. Every concurrent access to this word (the other side's)
            // is atomic too, so the shared atomic reference, which lives only for `f`, is sound.
            let atomic = unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast()) };
            f(atomic)
        }
        #[cfg(loom)]
        {
            f(&self.words[offset / 4])
        }
    }

    /// Tells ThreadSanitizer of the release a `fence(Release)` next to this call makes, keyed
    /// by byte `offset` of this memory (`crate::sync::tsan_release`); nothing in other builds.
    #[inline(always)]
    pub(crate) fn tsan_release(&self, offset: usize) {
        #[cfg(not(loom))]
        crate::sync::tsan_release(self.ptr.as_ptr().wrapping_add(offset));
        #[cfg(loom)]
        let _ = offset;
    }

    /// The acquire of a `fence(Acquire)` next to this call, on the key of
    /// [`Memory::tsan_release`].
    #[inline(always)]
    pub(crate) fn tsan_acquire(&self, offset: usize) {
        #[cfg(not(loom))]
        crate::sync::tsan_acquire(self.ptr.as_ptr().wrapping_add(offset));
        #[cfg(loom)]
        let _ = offset;
    }

    /// Atomically loads the word at `offset`, with no ordering: callers fence (a device
    /// simulated in software peeking at a ring word, as the loopback NPU's engine does).
    #[inline]
    pub fn load_u32(&self, offset: usize) -> u32 {
        // Relaxed: the ring places explicit fences around the words it polls (see queue.rs);
        // Acquire under ThreadSanitizer (see `WORD_LOAD`).
        self.with_atomic(offset, |word| word.load(crate::sync::WORD_LOAD))
    }

    /// Atomically stores `value` at `offset`, with no ordering: callers fence.
    #[inline]
    pub(crate) fn store_u32(&self, offset: usize, value: u32) {
        // Relaxed: as in `load_u32`; Release under ThreadSanitizer.
        self.with_atomic(offset, |word| word.store(value, crate::sync::WORD_STORE));
    }

    /// Loom only: a relaxed load of the word at `offset`, standing for a volatile load of a
    /// word no one writes meanwhile (the protocol's fences order the writer's stores before it,
    /// which is what loom checks).
    #[cfg(loom)]
    #[inline]
    fn read_word(&self, offset: usize) -> u32 {
        self.words[offset / 4].load(Ordering::Relaxed)
    }

    /// A plain (volatile) store of the word at `offset`; only where no one reads it meanwhile.
    #[inline]
    fn write_word(&self, offset: usize, value: u32) {
        #[cfg(not(loom))]
        {
            // SAFETY: as in `read_word`, for a writable mapping.
            unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(offset).cast::<u32>(), value) }
        }
        #[cfg(loom)]
        {
            // Relaxed: loom checks that the protocol's fences order it.
            self.words[offset / 4].store(value, Ordering::Relaxed);
        }
    }

    /// How many bytes the copy of an entry of `size` bytes at ring offset `offset` moves at
    /// once at byte `at` of the entry: 16 (x86-64) or 8 where the address is aligned for it and
    /// the access does not cover byte `skip`, 4 otherwise (and always under loom). Wide
    /// accesses matter: a descriptor copied in 4-byte stores fills the store buffer four times
    /// as fast while the CPU waits to own the ring's cache lines.
    #[inline(always)]
    fn step(&self, offset: usize, at: usize, size: usize, skip: Option<usize>) -> usize {
        #[cfg(loom)]
        {
            let _ = (offset, at, size, skip);
            4
        }
        #[cfg(not(loom))]
        {
            let addr = (self.ptr.as_ptr() as usize).wrapping_add(offset + at);
            let left = size - at;
            let covers = |len: usize| skip.is_some_and(|s| s >= at && s < at + len);
            if cfg!(target_arch = "x86_64") && left >= 16 && addr % 16 == 0 && !covers(16) {
                16
            } else if left >= 8 && addr % 8 == 0 && !covers(8) {
                8
            } else {
                4
            }
        }
    }

    /// Loom only: copies the word at ring offset `offset` to `dst`.
    ///
    /// # Safety
    /// `dst` is valid for 4 bytes of writes.
    #[cfg(loom)]
    #[inline(always)]
    unsafe fn load_into(&self, offset: usize, dst: *mut u8, n: usize) {
        debug_assert_eq!(n, 4, "steps are 4 bytes under loom");
        // SAFETY: per the contract, `dst` is writable for 4 bytes.
        unsafe { dst.cast::<u32>().write_unaligned(self.read_word(offset)) };
    }

    /// Copies `n` (4, 8 or 16) bytes from `src` to ring offset `offset` with one volatile store.
    ///
    /// # Safety
    /// As for `load_into`, with `src` readable for `n` bytes.
    #[inline(always)]
    unsafe fn store_from(&self, offset: usize, src: *const u8, n: usize) {
        #[cfg(not(loom))]
        {
            // SAFETY: per the contract: in bounds, aligned for the type written, `src`
            // readable (maybe unaligned); volatile through a raw pointer.
            unsafe {
                let dst = self.ptr.as_ptr().add(offset);
                match n {
                    #[cfg(target_arch = "x86_64")]
                    16 => {
                        use std::arch::x86_64::__m128i;
                        let chunk = src.cast::<__m128i>().read_unaligned();
                        std::ptr::write_volatile(dst.cast::<__m128i>(), chunk);
                    }
                    8 => std::ptr::write_volatile(
                        dst.cast::<u64>(),
                        src.cast::<u64>().read_unaligned(),
                    ),
                    _ => self.write_word(offset, src.cast::<u32>().read_unaligned()),
                }
            }
        }
        #[cfg(loom)]
        {
            let _ = n;
            // SAFETY: per the contract, `src` is readable for 4 bytes.
            self.write_word(offset, unsafe { src.cast::<u32>().read_unaligned() });
        }
    }

    /// Copies the entry at `offset` out. One volatile load of the whole `T`, which the compiler
    /// splits by field (so no load is wider than the stores that wrote it); under loom, word by
    /// word. `T`'s size is a multiple of 4 and its alignment at most [`ALIGN`] (checked by
    /// [`Layout`](super::Layout)), and `offset` a multiple of its size from an aligned base.
    #[inline]
    pub(crate) fn read_entry<T: Pod>(&self, offset: usize) -> T {
        let size = size_of::<T>();
        self.check(offset, size);
        #[cfg(not(loom))]
        {
            let src = self.ptr.as_ptr().wrapping_add(offset);
            if src as usize % Memory::chunk::<T>() != 0 {
                outside(offset, size, self.len);
            }
            // SAFETY: `check` put the entry inside the mapped memory, the test above that it
            // is aligned to the chunk size.
            unsafe { load_once(src) }
        }
        #[cfg(loom)]
        {
            let mut value = T::new_zeroed();
            let dst = value.as_mut_bytes().as_mut_ptr();
            let mut at = 0;
            while at < size {
                let n = self.step(offset, at, size, None);
                // SAFETY: `check` put the whole entry inside the memory; `step` keeps `at + n <=
                // size`; `dst + at` has `n` bytes of `value`.
                unsafe { self.load_into(offset + at, dst.add(at), n) };
                at += n;
            }
            value
        }
    }

    /// Copies `value` in at `offset`. With no `skip` (a submission entry, in a slot no one else
    /// touches until the host rings the doorbell, whose `fence(Release)` orders these stores
    /// before it, for the compiler too): a plain store of the whole value through a raw
    /// pointer, which the compiler makes as few and as wide stores as it can, built in
    /// registers. Fewer, wider stores matter: while the CPU waits to own a ring line that the
    /// device just read, every store waits in the store buffer behind it, and a descriptor of
    /// one 8-byte store leaves room for three times as many descriptors in flight as one of
    /// three narrower stores (and a value reloaded wider than it was just stored stalls on
    /// store forwarding until the buffer drains, which is why this is left to the compiler
    /// rather than copied in fixed chunks). With `skip`:
    /// 16-, 8- or 4-byte volatile stores where aligned, leaving out the 4-byte word at byte
    /// `skip` of the entry (the phase word, which the caller stores last). Under loom, word by
    /// word.
    #[inline]
    pub(crate) fn write_entry<T: Pod>(&self, offset: usize, value: &T, skip: Option<usize>) {
        let size = size_of::<T>();
        self.check(offset, size);
        #[cfg(not(loom))]
        if skip.is_none() {
            let dst = self.ptr.as_ptr().wrapping_add(offset).cast::<T>();
            if !dst.is_aligned() {
                outside(offset, size, self.len);
            }
            // SAFETY: `check` put the entry inside the mapped, writable memory, the test above
            // that it is aligned for `T`; a raw pointer, no reference made. No one else reads
            // or writes the entry meanwhile: a plain store is not a data race (see above).
            unsafe { dst.write(*value) };
            return;
        }
        let src = (value as *const T).cast::<u8>();
        let mut at = 0;
        while at < size {
            let n = self.step(offset, at, size, skip);
            if skip != Some(at) || n != 4 {
                // SAFETY: `check` put the whole entry inside the memory; `step` keeps `at + n <=
                // size` and the ring address aligned to `n`; `src + at` has `n` readable bytes
                // of `value`.
                unsafe { self.store_from(offset + at, src.add(at), n) };
            }
            at += n;
        }
    }

    /// The widest access (16 on x86-64, 8 or 4 bytes) that divides both `T`'s size and
    /// [`ALIGN`]: every entry slot, at a multiple of the size from an `ALIGN`-aligned base, is
    /// aligned to it. A constant for each `T`.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(super) const fn chunk<T>() -> usize {
        let size = size_of::<T>();
        if cfg!(target_arch = "x86_64") && size % 16 == 0 {
            16
        } else if size % 8 == 0 {
            8
        } else {
            4
        }
    }

    /// The word at byte `at` of `value` (a multiple of 4 inside it).
    pub(crate) fn word_of<T: Pod>(value: &T, at: usize) -> u32 {
        assert!(at % 4 == 0 && at + 4 <= size_of::<T>());
        let word = &value.as_bytes()[at..at + 4];
        u32::from_ne_bytes([word[0], word[1], word[2], word[3]])
    }

    /// Zeroes `len` bytes at `offset` (both multiples of 4).
    pub(crate) fn zero(&self, offset: usize, len: usize) {
        self.check(offset, len);
        for i in 0..len / 4 {
            self.write_word(offset + 4 * i, 0);
        }
    }
}

/// Copies the `T` at `src` out in volatile loads of [`Memory::chunk`] bytes (one 8-byte load
/// for an 8-byte descriptor, four 16-byte loads for a 64-byte one). The entry is not being
/// written meanwhile (the protocol's fences order the writer's stores before), so the width of
/// the loads does not matter for what they see, only for how many there are.
///
/// # Safety
/// `src..src + size_of::<T>()` is inside mapped ring memory that lives, and `src` is aligned
/// to `Memory::chunk::<T>()`.
#[cfg(not(loom))]
#[inline(always)]
pub(super) unsafe fn load_once<T: Pod>(src: *const u8) -> T {
    let size = size_of::<T>();
    let chunk = Memory::chunk::<T>();
    let mut value = std::mem::MaybeUninit::<T>::uninit();
    let dst = value.as_mut_ptr().cast::<u8>();
    let mut at = 0;
    while at < size {
        // SAFETY: per the contract, `src + at` is inside the memory and aligned to `chunk`,
        // which divides the size (so `at + chunk <= size`); `dst + at` has `chunk` writable
        // bytes of `value` (unaligned writes); volatile loads through raw pointers.
        unsafe {
            let src = src.add(at);
            match chunk {
                #[cfg(target_arch = "x86_64")]
                16 => {
                    use std::arch::x86_64::__m128i;
                    let v = std::ptr::read_volatile(src.cast::<__m128i>());
                    dst.add(at).cast::<__m128i>().write_unaligned(v);
                }
                8 => {
                    let v = std::ptr::read_volatile(src.cast::<u64>());
                    dst.add(at).cast::<u64>().write_unaligned(v);
                }
                _ => {
                    let v = std::ptr::read_volatile(src.cast::<u32>());
                    dst.add(at).cast::<u32>().write_unaligned(v);
                }
            }
        }
        at += chunk;
    }
    // SAFETY: the chunks tile the value (the size is a multiple of `chunk`), so every byte was
    // written, and `T: Pod` accepts any bytes.
    unsafe { value.assume_init() }
}

/// The panic of a ring memory access outside the memory or misaligned: a bug in this module or
/// in `entries.rs` (offsets come from a checked layout). Cold and out of line, so the checks
/// cost the hot paths a compare and a branch, not the panic's arguments.
#[cold]
#[inline(never)]
#[track_caller]
pub(super) fn outside(offset: usize, bytes: usize, len: usize) -> ! {
    panic!(
        "ring memory access of {bytes} bytes at {offset:#x} outside {len:#x} bytes or misaligned"
    )
}
