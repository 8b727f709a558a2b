//! [`Slice`]: a bounds-checked `{ptr, len, lifetime}` handle to memory a device can read and
//! write, with volatile accessors. A device (or the loopback device's thread, or another process)
//! writes this memory behind the compiler's back, so a `&[u8]` to it would be undefined
//! behaviour; every access here is a volatile load or store of a plain-old-data value, or a
//! volatile copy to or from an ordinary buffer.

use std::marker::PhantomData;
use std::mem::{align_of, size_of};
use std::ptr::{self, NonNull};

use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::Error;
use crate::memory::Region;

/// Plain-old-data: a value that can be read from and written to device-visible memory as bytes.
///
/// Implemented for every type that `zerocopy` proves has no padding bytes, no invalid bit
/// patterns and no interior mutability: integers, arrays of them, and `#[repr(C)]` structs that
/// derive [`FromBytes`](zerocopy::FromBytes), [`IntoBytes`](zerocopy::IntoBytes) and
/// [`Immutable`](zerocopy::Immutable) (the derives refuse a struct with padding or a field that
/// is not itself plain data, at compile time). No `unsafe impl` is needed, or possible:
///
/// ```
/// use userdma::zerocopy::{FromBytes, Immutable, IntoBytes};
///
/// #[derive(Clone, Copy, FromBytes, IntoBytes, Immutable)]
/// #[zerocopy(crate = "userdma::zerocopy")]
/// #[repr(C)]
/// struct Descriptor {
///     addr: u64,
///     len: u32,
///     id: u16,
///     flags: u16,
/// }
///
/// fn takes_pod<T: userdma::dma::Pod>() {}
/// takes_pod::<Descriptor>();
/// ```
///
/// (`#[zerocopy(crate = ...)]` lets a crate use the `zerocopy` this crate re-exports; one that
/// depends on `zerocopy` 0.8 itself can leave it out.)
pub trait Pod: FromBytes + IntoBytes + Immutable + Copy + Send + Sync + 'static {}

impl<T: FromBytes + IntoBytes + Immutable + Copy + Send + Sync + 'static> Pod for T {}

/// A view of `len` bytes of device-visible memory, valid for `'a`, accessed only by volatile
/// loads and stores. Copying the handle is cheap; it never owns the memory.
#[derive(Debug, Clone, Copy)]
pub struct Slice<'a> {
    ptr: NonNull<u8>,
    len: usize,
    /// The memory is shared and mutable behind our back, like `&'a [Cell<u8>]`.
    _memory: PhantomData<&'a [std::cell::Cell<u8>]>,
}

// SAFETY: a Slice is a pointer and a length into memory that stays mapped for 'a; every access
// through it is a volatile load or store, never a reference, so using it from several threads is
// the same as a device and the CPU sharing the memory: racy in content (callers order accesses
// with their own protocol, e.g. ring indices with fences) but never undefined behaviour in Rust's
// sense, as no `&`/`&mut` to the bytes ever exists.
unsafe impl Send for Slice<'_> {}
// SAFETY: as for Send: `&Slice` only allows the same volatile accesses.
unsafe impl Sync for Slice<'_> {}

impl<'a> Slice<'a> {
    /// A slice over `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay mapped, readable and writable for `'a`, and no Rust reference
    /// (`&`/`&mut`) to any of those bytes may exist during `'a` (only raw-pointer, volatile or
    /// atomic accesses, by this process, the device or other processes).
    pub unsafe fn from_raw_parts(ptr: NonNull<u8>, len: usize) -> Slice<'a> {
        Slice {
            ptr,
            len,
            _memory: PhantomData,
        }
    }

    /// The whole of `region`.
    pub fn from_region(region: &'a Region) -> Slice<'a> {
        // SAFETY: the region owns its mapping and keeps it mapped, readable and writable while
        // borrowed for 'a; it never hands out references to its bytes.
        unsafe { Slice::from_raw_parts(region.as_ptr(), region.len()) }
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte, as a raw pointer (for handing to the kernel, e.g. as an io_uring buffer).
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Checks that `offset..offset + len` is inside the slice; returns a pointer to `offset`.
    fn at(&self, offset: usize, len: usize) -> Result<NonNull<u8>, Error> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                // SAFETY: `offset <= end <= self.len`, so the result is inside (or one past) the
                // slice's allocation, and not null because `self.ptr` is not.
                Ok(unsafe { self.ptr.add(offset) })
            }
            _ => Err(Error::OutOfBounds {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// The `len` bytes at `offset`.
    pub fn subslice(&self, offset: usize, len: usize) -> Result<Slice<'a>, Error> {
        let ptr = self.at(offset, len)?;
        Ok(Slice {
            ptr,
            len,
            _memory: PhantomData,
        })
    }

    /// The bytes before and after `mid`.
    pub fn split_at(&self, mid: usize) -> Result<(Slice<'a>, Slice<'a>), Error> {
        let head = self.subslice(0, mid)?;
        let tail = self.subslice(mid, self.len - mid)?;
        Ok((head, tail))
    }

    /// Checks bounds and alignment for a `T` at `offset`.
    fn at_aligned<T>(&self, offset: usize) -> Result<NonNull<T>, Error> {
        let ptr = self.at(offset, size_of::<T>())?;
        if ptr.as_ptr() as usize % align_of::<T>() != 0 {
            return Err(Error::Misaligned {
                offset,
                align: align_of::<T>(),
            });
        }
        Ok(ptr.cast())
    }

    /// Reads a `T` at `offset` with one volatile load (`offset` must be aligned for `T`).
    pub fn read<T: Pod>(&self, offset: usize) -> Result<T, Error> {
        let ptr = self.at_aligned::<T>(offset)?;
        // SAFETY: `at_aligned` checked that the `T` lies inside the slice, which is mapped and
        // readable for 'a, and that it is aligned; `T: Pod` makes any bytes a valid value.
        Ok(unsafe { ptr::read_volatile(ptr.as_ptr()) })
    }

    /// Writes a `T` at `offset` with one volatile store (`offset` must be aligned for `T`).
    pub fn write<T: Pod>(&self, offset: usize, value: T) -> Result<(), Error> {
        let ptr = self.at_aligned::<T>(offset)?;
        // SAFETY: `at_aligned` checked that the `T` lies inside the slice, which is mapped and
        // writable for 'a, and that it is aligned; no reference to these bytes exists.
        unsafe { ptr::write_volatile(ptr.as_ptr(), value) };
        Ok(())
    }

    /// Copies `dst.len()` bytes at `offset` out into `dst` (volatile loads, 8 bytes at a time
    /// where aligned).
    pub fn read_into(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        let src = self.at(offset, dst.len())?;
        // SAFETY: `at` checked that `dst.len()` bytes from `src` are inside the slice; `dst` is an
        // ordinary buffer of that length, distinct from device memory (it is a `&mut`).
        unsafe { copy_out(src.as_ptr(), dst) };
        Ok(())
    }

    /// Copies `src` in at `offset` (volatile stores, 8 bytes at a time where aligned).
    pub fn write_from(&self, offset: usize, src: &[u8]) -> Result<(), Error> {
        let dst = self.at(offset, src.len())?;
        // SAFETY: `at` checked that `src.len()` bytes from `dst` are inside the slice; `src` is an
        // ordinary buffer, which cannot be device memory (references to it never exist).
        unsafe { copy_in(src, dst.as_ptr()) };
        Ok(())
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        let word = u64::from_ne_bytes([byte; 8]);
        let base = self.ptr.as_ptr();
        let mut i = 0;
        while i < self.len {
            // SAFETY: `i < self.len`, so `base + i` is inside the slice; word stores are used only
            // when aligned and wholly inside.
            unsafe {
                let at = base.add(i);
                if at as usize % 8 == 0 && self.len - i >= 8 {
                    ptr::write_volatile(at.cast::<u64>(), word);
                    i += 8;
                } else {
                    ptr::write_volatile(at, byte);
                    i += 1;
                }
            }
        }
    }
}

/// Volatile copy of `dst.len()` bytes from `src` into `dst`.
///
/// # Safety
/// `src..src + dst.len()` must be mapped and readable, and must not overlap `dst`.
unsafe fn copy_out(src: *const u8, dst: &mut [u8]) {
    let len = dst.len();
    let mut i = 0;
    while i < len {
        // SAFETY: `i < len`, so `src + i` is inside the readable range the caller vouched for;
        // the 8-byte load is used only when aligned and wholly inside it.
        unsafe {
            let at = src.add(i);
            if at as usize % 8 == 0 && len - i >= 8 {
                let word = ptr::read_volatile(at.cast::<u64>());
                dst[i..i + 8].copy_from_slice(&word.to_ne_bytes());
                i += 8;
            } else {
                dst[i] = ptr::read_volatile(at);
                i += 1;
            }
        }
    }
}

/// Volatile copy of `src` to `dst..dst + src.len()`.
///
/// # Safety
/// `dst..dst + src.len()` must be mapped and writable, not overlap `src`, and not be referenced.
unsafe fn copy_in(src: &[u8], dst: *mut u8) {
    let len = src.len();
    let mut i = 0;
    while i < len {
        // SAFETY: `i < len`, so `dst + i` is inside the writable range the caller vouched for;
        // the 8-byte store is used only when aligned and wholly inside it.
        unsafe {
            let at = dst.add(i);
            if at as usize % 8 == 0 && len - i >= 8 {
                let mut word = [0u8; 8];
                word.copy_from_slice(&src[i..i + 8]);
                ptr::write_volatile(at.cast::<u64>(), u64::from_ne_bytes(word));
                i += 8;
            } else {
                ptr::write_volatile(at, src[i]);
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ordinary buffer standing in for device memory.
    fn with_slice(len: usize, f: impl FnOnce(Slice<'_>)) {
        let mut backing = vec![0u64; len.div_ceil(8)];
        let ptr = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `backing` outlives the slice and is not referenced while `f` runs.
        let slice = unsafe { Slice::from_raw_parts(ptr, len) };
        f(slice);
        drop(backing);
    }

    #[test]
    fn pod_values_round_trip() {
        with_slice(64, |s| {
            s.write(0, 0x1122_3344_5566_7788u64).unwrap();
            s.write(8, 0xabcdu16).unwrap();
            s.write(12, -5i32).unwrap();
            s.write(16, [1u8, 2, 3, 4]).unwrap();
            assert_eq!(s.read::<u64>(0).unwrap(), 0x1122_3344_5566_7788);
            assert_eq!(s.read::<u16>(8).unwrap(), 0xabcd);
            assert_eq!(s.read::<i32>(12).unwrap(), -5);
            assert_eq!(s.read::<[u8; 4]>(16).unwrap(), [1, 2, 3, 4]);
            assert_eq!(s.read::<u8>(0).unwrap(), 0x88);
        });
    }

    #[test]
    fn bounds_and_alignment_are_errors() {
        with_slice(16, |s| {
            assert!(matches!(
                s.read::<u64>(12),
                Err(Error::OutOfBounds {
                    offset: 12,
                    len: 8,
                    size: 16
                })
            ));
            assert!(matches!(
                s.write(usize::MAX, 1u8),
                Err(Error::OutOfBounds { .. })
            ));
            assert!(matches!(
                s.read::<u32>(2),
                Err(Error::Misaligned {
                    offset: 2,
                    align: 4
                })
            ));
            assert!(s.subslice(8, 9).is_err());
            assert!(s.split_at(17).is_err());
        });
    }

    #[test]
    fn copies_cover_unaligned_heads_and_tails() {
        with_slice(64, |s| {
            let data: Vec<u8> = (0..37).collect();
            s.write_from(3, &data).unwrap();
            let mut back = vec![0u8; 37];
            s.read_into(3, &mut back).unwrap();
            assert_eq!(back, data);
            assert_eq!(s.read::<u8>(2).unwrap(), 0);
            assert_eq!(s.read::<u8>(40).unwrap(), 0);
            let mut too_long = vec![0u8; 62];
            assert!(s.read_into(3, &mut too_long).is_err());
        });
    }

    #[test]
    fn subslices_address_the_same_memory() {
        with_slice(32, |s| {
            let (head, tail) = s.split_at(8).unwrap();
            assert_eq!((head.len(), tail.len()), (8, 24));
            tail.write(0, 7u64).unwrap();
            assert_eq!(s.read::<u64>(8).unwrap(), 7);
            let inner = tail.subslice(8, 8).unwrap();
            inner.fill(0xee);
            assert_eq!(s.read::<u64>(16).unwrap(), u64::from_ne_bytes([0xee; 8]));
            assert_eq!(s.read::<u64>(24).unwrap(), 0);
            let odd = s.subslice(1, 5).unwrap();
            odd.fill(1);
            assert_eq!(s.read::<u8>(0).unwrap(), 0);
            assert_eq!(s.read::<u8>(5).unwrap(), 1);
            assert_eq!(s.read::<u8>(6).unwrap(), 0);
        });
    }
}
