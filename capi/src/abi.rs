//! Structs that may grow: each starts with `size_t size`, the `sizeof` the caller was built
//! with. The library reads (or writes) only that many bytes, so a program built against an
//! older, smaller version of a struct keeps working: fields it does not have take their
//! defaults. A larger size (a newer header than this library) is accepted when the bytes this
//! library does not know are zero (the new fields at their defaults), and refused otherwise
//! (`UDMA_ERR_UNSUPPORTED`: the caller asked for something this version cannot do).

use std::mem::size_of;

use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::error::{udma_status, Fail};

/// A `#[repr(C)]` struct that can be filled from the caller's bytes and copied out as bytes.
///
/// Two ways in, which never overlap (rustc checks it):
/// - the structs of integers, floats and integer arrays derive `zerocopy`'s `FromBytes`,
///   `IntoBytes` and `Immutable` and get `Bytes` from the blanket impl below: the derives
///   prove the contract at compile time (a padding byte or a field type with invalid bit
///   patterns fails the build);
/// - the structs holding raw pointers or function pointers cannot derive them (`zerocopy`
///   does not make pointers from bytes), so each implements `Bytes` by hand, with its proof.
///
/// # Safety
/// Every byte pattern must be a valid value of the type (it is filled from bytes the caller
/// wrote), and it must have no padding bytes (they would be read as initialised, and copied
/// out to the caller).
pub(crate) unsafe trait Bytes: Copy {}

// SAFETY: `FromBytes` proves every byte pattern is a valid `T`, `IntoBytes` that `T` has no
// padding bytes: `Bytes`'s contract. (`Immutable`, no interior mutability, is not part of it:
// it is asked so that every such struct can also be viewed as `&[u8]` through `zerocopy`.)
unsafe impl<T: FromBytes + IntoBytes + Immutable + Copy> Bytes for T {}

/// A struct that may grow: `#[repr(C)]`, [`Bytes`], and its first field is `size: usize`, the
/// `sizeof` the caller was built with ([`read()`] and [`write()`] take it from the first word).
///
/// Implement it with [`sized!`], which also checks at compile time that `size` is a `usize`
/// at offset 0.
pub(crate) trait Sized: Bytes {
    /// The C name, for messages.
    const NAME: &'static str;
}

/// `impl Sized for $t`, named as C names it, with a compile-time check that `$t` starts with
/// `size: usize`.
macro_rules! sized {
    ($t:ident) => {
        impl $crate::abi::Sized for $t {
            const NAME: &'static str = stringify!($t);
        }
        const _: () = {
            assert!(
                ::std::mem::offset_of!($t, size) == 0,
                concat!(stringify!($t), ": `size` must be the first field")
            );
            // `size` is a `usize` (no integer coerces to one).
            let _: fn(&$t) -> usize = |s| s.size;
        };
    };
}
pub(crate) use sized;

/// The largest `size` a caller's struct may declare: every struct of the header is far
/// smaller, and a later version's grows by fields, not kilobytes.
const MAX_STRUCT: usize = 4096;

/// The size a caller's struct at `ptr` declares (`what`: the parameter, for messages).
///
/// # Safety
/// `ptr` is NULL or points to at least `size_of::<usize>()` readable bytes.
pub(crate) unsafe fn declared<T>(ptr: *const T, what: &str, name: &str) -> Result<usize, Fail> {
    if ptr.is_null() {
        return Err(Fail::null(what));
    }
    // SAFETY: non-null, and the caller's promise: the first field is readable. Unaligned read:
    // C aligns it, but a misaligned pointer must not be undefined behaviour here.
    let size = unsafe { ptr.cast::<usize>().read_unaligned() };
    // Above `MAX_STRUCT` no version of any of these structs is that large: a size no memory
    // has is refused before a slice is made of it.
    if !(size_of::<usize>()..=MAX_STRUCT).contains(&size) {
        return Err(Fail::invalid(format!(
            "{what}->size is {size}: set it to sizeof({name}) (it is {} in this library)",
            size_of::<T>()
        )));
    }
    Ok(size)
}

/// Reads the caller's struct at `ptr` over `defaults`: the first `min(size, sizeof)` bytes
/// come from the caller, the rest are the defaults'.
///
/// # Safety
/// `ptr` is NULL or points to `ptr->size` readable bytes.
pub(crate) unsafe fn read<T: Sized>(ptr: *const T, what: &str, defaults: T) -> Result<T, Fail> {
    // SAFETY: as promised by our caller.
    let size = unsafe { declared(ptr, what, T::NAME)? };
    let ours = size_of::<T>();
    if size > ours {
        // SAFETY: the caller declared `size` readable bytes at `ptr`.
        let extra = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>().add(ours), size - ours) };
        if let Some(at) = extra.iter().position(|&b| b != 0) {
            return Err(Fail::new(
                udma_status::UDMA_ERR_UNSUPPORTED,
                format!(
                    "{what} is a {}-byte {} with byte {} set, but this library (version {}) \
                     knows its first {ours} bytes only: link the library of the header you \
                     compiled against, or leave the newer fields zero",
                    size,
                    T::NAME,
                    ours + at,
                    env!("CARGO_PKG_VERSION")
                ),
            ));
        }
    }
    let mut value = defaults;
    // SAFETY: `min(size, ours)` bytes are readable at `ptr` (the caller's promise) and
    // writable in `value`; any byte pattern is a valid `T` (`Sized`'s contract); the regions
    // are distinct (`value` is a local).
    unsafe {
        std::ptr::copy_nonoverlapping(
            ptr.cast::<u8>(),
            (std::ptr::addr_of_mut!(value)).cast::<u8>(),
            size.min(ours),
        );
    }
    Ok(value)
}

/// Writes `value` into the caller's struct at `out`: its first `min(size, sizeof)` bytes,
/// keeping the caller's `size`.
///
/// # Safety
/// `out` is NULL or points to `out->size` writable bytes.
pub(crate) unsafe fn write<T: Sized>(out: *mut T, what: &str, value: T) -> Result<(), Fail> {
    // SAFETY: as promised by our caller.
    let size = unsafe { declared(out.cast_const(), what, T::NAME)? };
    let skip = size_of::<usize>();
    let len = size.min(size_of::<T>()) - skip;
    // SAFETY: `skip + len <= size` bytes are writable at `out` (the caller's promise) and
    // readable in `value` (`len + skip <= size_of::<T>()`); distinct regions.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (std::ptr::addr_of!(value)).cast::<u8>().add(skip),
            out.cast::<u8>().add(skip),
            len,
        );
    }
    Ok(())
}

/// Checks an out-parameter for NULL.
pub(crate) fn out<T>(ptr: *mut T, what: &str) -> Result<*mut T, Fail> {
    if ptr.is_null() {
        Err(Fail::null(what))
    } else {
        Ok(ptr)
    }
}
