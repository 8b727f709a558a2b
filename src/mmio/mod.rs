//! Typed, bounds-checked register access to a BAR or any other register window.
//!
//! A [`Block`] is a window of device registers reached through a swappable [`Backend`]:
//!
//! | backend | memory | each access is |
//! |---|---|---|
//! | [`Direct`] | a mapped BAR (`mmap` of a VFIO region, UIO map, sysfs `resourceN`) | one volatile load or store of exactly that width |
//! | [`FileBacked`] | a BAR part that cannot be mapped (VFIO serves those through `pread`/`pwrite` on the device fd) | one `pread`/`pwrite` of exactly that width |
//! | [`Shared`] | ordinary memory shared with another thread (the loopback device's BAR, tests) | an atomic access (see [`Shared`] for 64-bit and sub-word accesses) |
//! | [`Recording`] | whatever it wraps | forwarded, and logged for tests to inspect |
//!
//! Every access is checked: an offset past the window or not aligned to the access width is an
//! [`Error`], never a panic and never an access. Registers are described once, as [`Field`]s that
//! carry the value type and the access rules, and values can be typed with `bitflags`:
//!
//! ```
//! use userdma::mmio::{Block, Field, ReadClear, ReadOnly, ReadWrite, Shared, Value, WriteOnly};
//!
//! bitflags::bitflags! {
//!     /// The control register.
//!     #[derive(Clone, Copy, Debug, PartialEq, Eq)]
//!     pub struct Control: u32 {
//!         const ENABLE = 1 << 0;
//!         const RESET = 1 << 1;
//!     }
//! }
//! impl Value for Control {
//!     type Raw = u32;
//!     fn from_raw(raw: u32) -> Self { Control::from_bits_retain(raw) }
//!     fn to_raw(self) -> u32 { self.bits() }
//! }
//!
//! /// The register block, as a layout-checked `#[repr(C)]` struct (never instantiated: it only
//! /// gives the offsets).
//! #[repr(C)]
//! struct Regs { id: u32, control: u32, doorbell: u32, irq_status: u32, base: u64 }
//! const ID: Field<u32, ReadOnly> = Field::new(std::mem::offset_of!(Regs, id));
//! const CONTROL: Field<Control, ReadWrite> = Field::new(std::mem::offset_of!(Regs, control));
//! const DOORBELL: Field<u32, WriteOnly> = Field::new(std::mem::offset_of!(Regs, doorbell));
//! const IRQ_STATUS: Field<u32, ReadClear> = Field::new(std::mem::offset_of!(Regs, irq_status));
//! const BASE: Field<u64, ReadWrite> = Field::new(std::mem::offset_of!(Regs, base));
//!
//! # fn main() -> Result<(), userdma::mmio::Error> {
//! let mut regs = Block::new(Shared::new(std::mem::size_of::<Regs>()));
//! regs.set(CONTROL, Control::ENABLE)?;
//! regs.modify(CONTROL, |c| c | Control::RESET)?;
//! regs.set(DOORBELL, 7)?;
//! regs.set(BASE, 0x1_0000_2000)?;
//! assert_eq!(regs.get(CONTROL)?, Control::ENABLE | Control::RESET);
//! assert_eq!(regs.get(ID)?, 0);
//! let _pending = regs.take(IRQ_STATUS)?; // a read with a side effect needs `&mut`
//! assert!(regs.read::<u32>(0x100).is_err()); // out of the window: an error
//! # Ok(())
//! # }
//! ```
//!
//! Hot paths that write one register over and over (a queue's doorbells) can ask the block for
//! it once as a [`RawRegister`] ([`Block::raw_register`]): for a mapped BAR ([`Direct`]) and
//! shared memory ([`Shared`], 32-bit registers) each access is then one volatile or atomic
//! access, with no bounds check and no call through the backend; other backends answer `None`
//! and keep every access.
//!
//! Ordering: an access through a backend is not a fence. Code that publishes memory to a device
//! with a register write (a doorbell) puts a `fence(Release)` before the write; see the `ring`
//! module for the full protocol.

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::sync::Arc;

mod backend;
mod register;

pub use self::backend::{Access, Direct, FileBacked, Op, Recording, Shared};
pub use self::register::RawRegister;

/// The width of one register access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Width {
    /// 8 bits.
    U8,
    /// 16 bits.
    U16,
    /// 32 bits.
    U32,
    /// 64 bits.
    U64,
}

impl Width {
    /// The width in bytes (also the alignment an access of this width needs).
    pub const fn bytes(self) -> usize {
        match self {
            Width::U8 => 1,
            Width::U16 => 2,
            Width::U32 => 4,
            Width::U64 => 8,
        }
    }

    /// The largest value of this width.
    pub const fn max(self) -> u64 {
        match self {
            Width::U8 => u8::MAX as u64,
            Width::U16 => u16::MAX as u64,
            Width::U32 => u32::MAX as u64,
            Width::U64 => u64::MAX,
        }
    }
}

impl fmt::Display for Width {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-bit", self.bytes() * 8)
    }
}

/// What went wrong in this module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An access (or a window) does not fit in the register block.
    #[error("register access of {len} bytes at offset {offset:#x} is outside the {size:#x}-byte register block: check the register map")]
    OutOfBounds {
        /// Offset of the access within the block.
        offset: usize,
        /// Bytes accessed.
        len: usize,
        /// Size of the block.
        size: usize,
    },

    /// An access at an offset that is not a multiple of its width.
    #[error("{width} register access at offset {offset:#x} is not aligned to {} bytes: registers are accessed at their natural alignment", width.bytes())]
    Misaligned {
        /// Offset of the access within the block.
        offset: usize,
        /// Width of the access.
        width: Width,
    },

    /// Raw memory given to [`Direct::new`] or a window that is not 8-byte aligned.
    #[error("register memory at {addr:#x} is not 8-byte aligned: map BARs at page boundaries")]
    UnalignedBase {
        /// The address given.
        addr: usize,
    },

    /// `pread` on the register file failed or came back short.
    #[error("reading {width} register at offset {offset:#x} (file offset {file_offset:#x}) through the device file failed: is the region readable (VFIO region flags)?")]
    Read {
        /// Offset of the register within the block.
        offset: usize,
        /// The file offset read.
        file_offset: u64,
        /// Width of the access.
        width: Width,
        /// The kernel's answer (`UnexpectedEof` for a short read).
        #[source]
        source: io::Error,
    },

    /// `pwrite` on the register file failed or came back short.
    #[error("writing {width} register at offset {offset:#x} (file offset {file_offset:#x}) through the device file failed: is the region writable (VFIO region flags)?")]
    Write {
        /// Offset of the register within the block.
        offset: usize,
        /// The file offset written.
        file_offset: u64,
        /// Width of the access.
        width: Width,
        /// The kernel's answer (`WriteZero` for a short write).
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::OutOfBounds { .. } | Error::Misaligned { .. } | Error::UnalignedBase { .. } => {
                Code::InvalidArgument
            }
            Error::Read { .. } | Error::Write { .. } => Code::System,
        }
    }
}

/// How a [`Block`] reaches its registers. Offsets given to a backend are already checked by the
/// block: `offset + width.bytes() <= self.len()` and `offset % width.bytes() == 0`. A backend
/// still returns an error rather than misbehave if that is not so.
///
/// Values travel as `u64`; for narrower widths only the low bits are meaningful (reads return
/// them zero-extended, writes ignore the high bits).
pub trait Backend: fmt::Debug + Send + Sync {
    /// The size of the register window in bytes.
    fn len(&self) -> usize;

    /// Whether the window has no registers.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads one register of `width` at `offset`.
    fn read(&self, offset: usize, width: Width) -> Result<u64, Error>;

    /// Writes one register of `width` at `offset`.
    fn write(&self, offset: usize, width: Width, value: u64) -> Result<(), Error>;

    /// The register of `width` at `offset` as a [`RawRegister`], if this backend serves it by
    /// one plain memory access that a caller may make itself (a mapped BAR: a volatile access;
    /// shared memory: an atomic one), and the offset is inside the window and aligned.
    /// `None` (the default) when every access must go through [`Backend::read`] /
    /// [`Backend::write`]: a `pread`/`pwrite` file, a recording double, a sub-word or split
    /// access. The register is valid while this backend or a clone of it lives (see
    /// [`RawRegister`] for the whole contract).
    fn raw_register(&self, offset: usize, width: Width) -> Option<RawRegister> {
        let _ = (offset, width);
        None
    }
}

/// A backend behind a smart pointer (`Arc<B>`, `Box<B>`, `B` possibly `dyn Backend`) is the
/// backend it points to: every method forwards to the pointee.
macro_rules! forward_backend {
    ($($pointer:ident),*) => {$(
        impl<B: Backend + ?Sized> Backend for $pointer<B> {
            fn len(&self) -> usize {
                (**self).len()
            }
            #[inline]
            fn read(&self, offset: usize, width: Width) -> Result<u64, Error> {
                (**self).read(offset, width)
            }
            #[inline]
            fn write(&self, offset: usize, width: Width, value: u64) -> Result<(), Error> {
                (**self).write(offset, width, value)
            }
            fn raw_register(&self, offset: usize, width: Width) -> Option<RawRegister> {
                // The pointee is the backend: its registers live as long as this handle does.
                (**self).raw_register(offset, width)
            }
        }
    )*};
}

forward_backend!(Arc, Box);

/// Checks that an access of `width` at `offset` fits in `size` bytes and is aligned: what a
/// [`Backend`] implementation checks before every access (a register file simulated in
/// software, as the loopback NPU's).
///
/// # Errors
/// [`Error::OutOfBounds`] past `size`, [`Error::Misaligned`] off the width's alignment.
pub fn check(offset: usize, width: Width, size: usize) -> Result<(), Error> {
    let len = width.bytes();
    match offset.checked_add(len) {
        Some(end) if end <= size => {}
        _ => return Err(Error::OutOfBounds { offset, len, size }),
    }
    if offset % len != 0 {
        return Err(Error::Misaligned { offset, width });
    }
    Ok(())
}

mod sealed {
    pub trait Sealed {}
}

/// The raw integer types a register can have: `u8`, `u16`, `u32`, `u64`.
pub trait Raw: Copy + sealed::Sealed {
    /// The access width.
    const WIDTH: Width;
    /// Truncates a backend value to this type.
    fn from_u64(value: u64) -> Self;
    /// Zero-extends to `u64`.
    fn to_u64(self) -> u64;
}

macro_rules! raw {
    ($($ty:ty => $width:ident),*) => {$(
        impl sealed::Sealed for $ty {}
        impl Raw for $ty {
            const WIDTH: Width = Width::$width;
            #[inline]
            fn from_u64(value: u64) -> Self {
                // Truncation is the point: backends zero-extend narrower registers.
                value as $ty
            }
            #[inline]
            fn to_u64(self) -> u64 {
                u64::from(self)
            }
        }
        impl Value for $ty {
            type Raw = $ty;
            #[inline]
            fn from_raw(raw: $ty) -> Self {
                raw
            }
            #[inline]
            fn to_raw(self) -> $ty {
                self
            }
        }
    )*};
}

/// A register's value type: an integer, or a typed wrapper of one (a `bitflags` type, an enum
/// with a fallback). Implement it for a `bitflags` type with `from_bits_retain` / `bits`, so no
/// bit the device sets is lost.
pub trait Value: Copy {
    /// The integer the register holds; its width is the access width.
    type Raw: Raw;
    /// The typed value of the raw bits.
    fn from_raw(raw: Self::Raw) -> Self;
    /// The raw bits of the value.
    fn to_raw(self) -> Self::Raw;
}

raw!(u8 => U8, u16 => U16, u32 => U32, u64 => U64);

/// Reads of this register have no side effect: they take `&self`.
pub trait Readable: sealed::Sealed {}
/// The register can be written.
pub trait Writable: sealed::Sealed {}

/// A register whose reads have no side effect and which cannot be written (an ID, a status).
#[derive(Debug, Clone, Copy)]
pub enum ReadOnly {}
/// A register that can be written but not read back (a doorbell).
#[derive(Debug, Clone, Copy)]
pub enum WriteOnly {}
/// A register that can be read without side effect and written (a control register).
#[derive(Debug, Clone, Copy)]
pub enum ReadWrite {}
/// A register whose reads change device state (read-to-clear status): reading needs `&mut`.
#[derive(Debug, Clone, Copy)]
pub enum ReadClear {}

impl sealed::Sealed for ReadOnly {}
impl sealed::Sealed for WriteOnly {}
impl sealed::Sealed for ReadWrite {}
impl sealed::Sealed for ReadClear {}
impl Readable for ReadOnly {}
impl Readable for ReadWrite {}
impl Writable for WriteOnly {}
impl Writable for ReadWrite {}

/// One register: its offset in the block, its value type `V` and its access rule `A`
/// ([`ReadOnly`], [`WriteOnly`], [`ReadWrite`], [`ReadClear`]). A plain constant; the block
/// checks it on every access.
pub struct Field<V, A> {
    offset: usize,
    _marker: PhantomData<fn() -> (V, A)>,
}

impl<V, A> Field<V, A> {
    /// The register at `offset` (use `offset_of!` on a `#[repr(C)]` layout struct).
    pub const fn new(offset: usize) -> Self {
        Field {
            offset,
            _marker: PhantomData,
        }
    }

    /// The register `index * stride` bytes after this one (arrays of per-queue registers).
    pub const fn at(self, index: usize, stride: usize) -> Option<Self> {
        match index.checked_mul(stride) {
            Some(step) => match self.offset.checked_add(step) {
                Some(offset) => Some(Field::new(offset)),
                None => None,
            },
            None => None,
        }
    }

    /// The register's offset in the block.
    pub const fn offset(&self) -> usize {
        self.offset
    }
}

impl<V, A> Clone for Field<V, A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V, A> Copy for Field<V, A> {}
impl<V, A> fmt::Debug for Field<V, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Field<{}, {}>@{:#x}",
            std::any::type_name::<V>(),
            std::any::type_name::<A>(),
            self.offset
        )
    }
}

/// A window of registers: `len` bytes from `base` of a [`Backend`]. Cloning a block (for
/// backends that are `Clone`: all of this module's) gives a second handle to the same registers.
///
/// Writes and pure reads take `&self` (several queues ring their own doorbells in one BAR);
/// reads with a side effect ([`ReadClear`]) and read-modify-write take `&mut self`.
#[derive(Clone, Debug)]
pub struct Block<B> {
    backend: B,
    base: usize,
    len: usize,
}

/// A block whose backend is chosen at run time (a mapped BAR, a file, shared memory).
pub type DynBlock = Block<Arc<dyn Backend>>;

impl<B: Backend> Block<B> {
    /// All of `backend`'s registers.
    pub fn new(backend: B) -> Self {
        let len = backend.len();
        Block {
            backend,
            base: 0,
            len,
        }
    }

    /// The size of the window in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window has no registers.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Where the window starts in the backend.
    pub fn base(&self) -> usize {
        self.base
    }

    /// The `len` bytes at `offset` of this window, as a window of their own (e.g. one queue's
    /// doorbells). Offsets in the new block start at 0.
    pub fn window(&self, offset: usize, len: usize) -> Result<Block<B>, Error>
    where
        B: Clone,
    {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {}
            _ => {
                return Err(Error::OutOfBounds {
                    offset,
                    len,
                    size: self.len,
                })
            }
        }
        Ok(Block {
            backend: self.backend.clone(),
            base: self.base + offset,
            len,
        })
    }

    /// The same registers behind a type-erased backend.
    pub fn erase(self) -> DynBlock
    where
        B: 'static,
    {
        Block {
            backend: Arc::new(self.backend),
            base: self.base,
            len: self.len,
        }
    }

    /// Checks an access and returns the backend offset.
    #[inline]
    fn locate(&self, offset: usize, width: Width) -> Result<usize, Error> {
        check(offset, width, self.len)?;
        let absolute = self.base + offset;
        if absolute % width.bytes() != 0 {
            return Err(Error::Misaligned { offset, width });
        }
        Ok(absolute)
    }

    /// Reads the `R`-wide register at `offset` (one access of that width). For registers
    /// without read side effects; use a [`ReadClear`] field and [`Block::take`] otherwise.
    #[inline]
    pub fn read<R: Raw>(&self, offset: usize) -> Result<R, Error> {
        let at = self.locate(offset, R::WIDTH)?;
        self.backend.read(at, R::WIDTH).map(R::from_u64)
    }

    /// The register of `width` at `offset` as a [`RawRegister`] (one volatile or atomic
    /// access, no check and no dispatch per access), or `None` if the backend does not serve it
    /// by plain memory (see [`Backend::raw_register`]); an offset outside the window or not
    /// aligned is an [`Error`]. The register stays valid while this block's backend (or a
    /// clone) lives: keep the block next to it.
    pub fn raw_register(&self, offset: usize, width: Width) -> Result<Option<RawRegister>, Error> {
        let at = self.locate(offset, width)?;
        Ok(self.backend.raw_register(at, width))
    }

    /// Writes the `R`-wide register at `offset` (one access of that width).
    #[inline]
    pub fn write<R: Raw>(&self, offset: usize, value: R) -> Result<(), Error> {
        let at = self.locate(offset, R::WIDTH)?;
        self.backend.write(at, R::WIDTH, value.to_u64())
    }

    /// Reads a register whose reads have no side effect.
    #[inline]
    pub fn get<V: Value, A: Readable>(&self, field: Field<V, A>) -> Result<V, Error> {
        self.read::<V::Raw>(field.offset).map(V::from_raw)
    }

    /// Reads a register whose reads change device state (read-to-clear).
    #[inline]
    pub fn take<V: Value>(&mut self, field: Field<V, ReadClear>) -> Result<V, Error> {
        self.read::<V::Raw>(field.offset).map(V::from_raw)
    }

    /// Writes a register.
    #[inline]
    pub fn set<V: Value, A: Writable>(&self, field: Field<V, A>, value: V) -> Result<(), Error> {
        self.write::<V::Raw>(field.offset, value.to_raw())
    }

    /// Reads, changes and writes back a read-write register (two accesses; `&mut` so that this
    /// handle does not interleave with itself).
    pub fn modify<V: Value>(
        &mut self,
        field: Field<V, ReadWrite>,
        change: impl FnOnce(V) -> V,
    ) -> Result<(), Error> {
        let value = self.get(field)?;
        self.set(field, change(value))
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
