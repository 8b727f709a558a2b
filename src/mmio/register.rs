//! [`RawRegister`]: the address of one register that a backend serves by a single memory
//! access, for hot paths (doorbells) that cannot afford a checked, dynamically dispatched
//! [`Block::write`](super::Block::write) per access.

use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};

use super::Width;

/// How the register's memory is accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Mapped device memory: `read_volatile` / `write_volatile`.
    Volatile(NonNull<u8>),
    /// A 32-bit atomic word in ordinary memory that another thread accesses atomically.
    Atomic(NonNull<AtomicU32>),
}

/// One register reached by a single memory access, as a [`Backend`](super::Backend) hands it
/// out from [`Backend::raw_register`](super::Backend::raw_register) (through
/// [`Block::raw_register`](super::Block::raw_register), which checks the offset first).
///
/// The contract, which the `unsafe` constructors make the backend promise and the `unsafe`
/// accessors make the user keep:
///
/// - **Alignment and size**: the address is aligned to [`RawRegister::width`] and the
///   `width.bytes()` bytes at it are the register, inside the backend's window.
/// - **Lifetime**: the address stays valid while the backend that returned it, or any clone of
///   it, lives. Keep the block (its `Arc`) alive next to the `RawRegister`; the type carries no
///   lifetime of its own.
/// - **Access**: only through [`RawRegister::read`] / [`RawRegister::write`] (and the 32-bit
///   forms): for a mapped BAR one `read_volatile` / `write_volatile` of exactly the width, for
///   shared memory one atomic load (`Acquire`) or store (`Release`) of the word, the same
///   accesses the backend makes. No Rust reference (`&`/`&mut`) to a device register's bytes
///   is ever formed: a device or another thread changes them behind Rust's back (a
///   shared-memory word is used as `&AtomicU32`, which is how atomics are shared).
///
/// An access through a `RawRegister` is not a fence, as for a backend access: code that
/// publishes memory with a register write still puts its fence before it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RawRegister {
    kind: Kind,
    width: Width,
}

// SAFETY: a RawRegister is an address plus a width. Every access through it is `unsafe` and is
// a volatile access to device registers (one bus transaction, which any thread may make) or an
// atomic access to a word (race-free by construction): neither depends on the thread.
unsafe impl Send for RawRegister {}
// SAFETY: as for Send: `&RawRegister` gives only the same volatile or atomic accesses.
unsafe impl Sync for RawRegister {}

impl fmt::Debug for RawRegister {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (access, addr) = match self.kind {
            Kind::Volatile(ptr) => ("volatile", ptr.as_ptr() as usize),
            Kind::Atomic(word) => ("atomic", word.as_ptr() as usize),
        };
        f.debug_struct("RawRegister")
            .field("access", &access)
            .field("addr", &format_args!("{addr:#x}"))
            .field("width", &self.width)
            .finish()
    }
}

impl RawRegister {
    /// A register in mapped device memory (a BAR), accessed by volatile loads and stores of
    /// `width`.
    ///
    /// # Safety
    /// `ptr` must be aligned to `width.bytes()`, and the `width.bytes()` bytes at it must be a
    /// register that is mapped, readable and writable for as long as the backend returning this
    /// value (or any clone of it) lives. Those bytes are accessed only by volatile accesses
    /// (the device's, the backend's, this type's), never through a Rust reference.
    pub unsafe fn volatile(ptr: NonNull<u8>, width: Width) -> RawRegister {
        RawRegister {
            kind: Kind::Volatile(ptr),
            width,
        }
    }

    /// A 32-bit register that is an atomic word in ordinary memory (shared with another
    /// thread, which accesses it only atomically), accessed by `Acquire` loads and `Release`
    /// stores.
    ///
    /// # Safety
    /// `word` must point to an `AtomicU32` that stays allocated for as long as the backend
    /// returning this value (or any clone of it) lives.
    pub unsafe fn atomic(word: NonNull<AtomicU32>) -> RawRegister {
        RawRegister {
            kind: Kind::Atomic(word),
            width: Width::U32,
        }
    }

    /// The register's width.
    pub fn width(&self) -> Width {
        self.width
    }

    /// The register's address (raw: never make a reference from it).
    pub fn as_ptr(&self) -> NonNull<u8> {
        match self.kind {
            Kind::Volatile(ptr) => ptr,
            Kind::Atomic(word) => word.cast(),
        }
    }

    /// Whether the register is an atomic word in ordinary memory rather than device memory.
    pub fn is_atomic(&self) -> bool {
        matches!(self.kind, Kind::Atomic(_))
    }

    /// Reads the register: one access of its width, zero-extended.
    ///
    /// # Safety
    /// The backend that returned this register, or a clone of it, must still be alive.
    #[inline]
    pub unsafe fn read(&self) -> u64 {
        match self.kind {
            // SAFETY: the caller keeps the backend alive, so by the constructor's contract the
            // register is mapped, readable and aligned for its width.
            Kind::Volatile(ptr) => unsafe {
                let at = ptr.as_ptr();
                match self.width {
                    Width::U8 => u64::from(ptr::read_volatile(at)),
                    Width::U16 => u64::from(ptr::read_volatile(at.cast::<u16>())),
                    Width::U32 => u64::from(ptr::read_volatile(at.cast::<u32>())),
                    Width::U64 => ptr::read_volatile(at.cast::<u64>()),
                }
            },
            // SAFETY: as for `read_u32`, which this is for an atomic (always 32-bit) register.
            Kind::Atomic(_) => u64::from(unsafe { self.read_u32() }),
        }
    }

    /// Writes the register: one access of its width (the value truncated to it).
    ///
    /// # Safety
    /// The backend that returned this register, or a clone of it, must still be alive.
    #[inline]
    pub unsafe fn write(&self, value: u64) {
        match self.kind {
            // SAFETY: the caller keeps the backend alive, so by the constructor's contract the
            // register is mapped, writable and aligned for its width. The casts truncate to
            // the register width on purpose.
            Kind::Volatile(ptr) => unsafe {
                let at = ptr.as_ptr();
                match self.width {
                    Width::U8 => ptr::write_volatile(at, value as u8),
                    Width::U16 => ptr::write_volatile(at.cast::<u16>(), value as u16),
                    Width::U32 => ptr::write_volatile(at.cast::<u32>(), value as u32),
                    Width::U64 => ptr::write_volatile(at.cast::<u64>(), value),
                }
            },
            // SAFETY: as for `write_u32`, which this is for an atomic (always 32-bit)
            // register; truncation on purpose.
            Kind::Atomic(_) => unsafe { self.write_u32(value as u32) },
        }
    }

    /// Reads a 32-bit register: one volatile load, or one `Acquire` atomic load.
    ///
    /// # Safety
    /// The register's width is [`Width::U32`], and the backend that returned it, or a clone of
    /// it, is still alive.
    #[inline]
    pub unsafe fn read_u32(&self) -> u32 {
        debug_assert_eq!(self.width, Width::U32);
        match self.kind {
            // SAFETY: the caller keeps the backend alive and the register is 32 bits wide, so
            // by the constructor's contract the 4 bytes are mapped, readable and 4-aligned.
            Kind::Volatile(ptr) => unsafe { ptr::read_volatile(ptr.as_ptr().cast::<u32>()) },
            Kind::Atomic(word) => {
                // SAFETY: the caller keeps the backend alive, so the AtomicU32 is allocated
                // (constructor's contract); a shared reference to an atomic is how it is used.
                let word = unsafe { word.as_ref() };
                // Acquire: as the backend's own loads (MMIO ordering: what the writer wrote
                // before the register is visible after this read); pairs with the Release
                // store of whoever wrote it.
                word.load(Ordering::Acquire)
            }
        }
    }

    /// Writes a 32-bit register: one volatile store, or one `Release` atomic store.
    ///
    /// # Safety
    /// The register's width is [`Width::U32`], and the backend that returned it, or a clone of
    /// it, is still alive.
    #[inline]
    pub unsafe fn write_u32(&self, value: u32) {
        debug_assert_eq!(self.width, Width::U32);
        match self.kind {
            // SAFETY: the caller keeps the backend alive and the register is 32 bits wide, so
            // by the constructor's contract the 4 bytes are mapped, writable and 4-aligned.
            Kind::Volatile(ptr) => unsafe {
                ptr::write_volatile(ptr.as_ptr().cast::<u32>(), value)
            },
            Kind::Atomic(word) => {
                // SAFETY: the caller keeps the backend alive, so the AtomicU32 is allocated
                // (constructor's contract); a shared reference to an atomic is how it is used.
                let word = unsafe { word.as_ref() };
                // Release: as the backend's own stores (MMIO ordering: everything written
                // before this register write is visible to a reader that sees it); pairs with
                // the Acquire load of the reader.
                word.store(value, Ordering::Release);
            }
        }
    }
}
