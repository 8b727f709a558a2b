//! The register backends: [`Direct`] (a mapped BAR), [`FileBacked`] (`pread`/`pwrite` on a
//! device file), [`Shared`] (ordinary memory shared with another thread) and [`Recording`] (a
//! logging wrapper for tests).

use std::fmt;
use std::io;
use std::os::fd::AsFd;
use std::ptr::{self, NonNull};

use super::{check, Backend, Error, RawRegister, Width};
use crate::sync::{Arc, AtomicU32, Mutex, Ordering};

/// A mapped register window (a BAR `mmap`ed from VFIO, UIO or sysfs): every access is one
/// volatile load or store of exactly its width, in the CPU's byte order (little-endian on
/// x86-64, PCI's order). A BAR mapped by the kernel is uncached (UC), so the CPU neither merges
/// nor reorders these accesses with each other.
///
/// Cloning copies the pointer: the [`Direct::new`] contract covers every clone.
#[derive(Clone)]
pub struct Direct {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Direct is a pointer to registers that stay mapped while it (and every clone) lives
// (the `new` contract); it only ever does volatile loads and stores through it, never making a
// reference, so sending it to another thread or using it from several is what MMIO is: each
// access is a single device transaction.
unsafe impl Send for Direct {}
// SAFETY: as for Send: `&Direct` allows only the same volatile accesses.
unsafe impl Sync for Direct {}

impl fmt::Debug for Direct {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Direct")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl Direct {
    /// Registers in the `len` bytes at `ptr`; `ptr` must be 8-byte aligned (an `Err` otherwise).
    ///
    /// # Safety
    /// `ptr..ptr + len` must be mapped, readable and writable, and stay so while the returned
    /// value or any clone of it lives. No Rust reference (`&`/`&mut`) to those bytes may exist in
    /// that time: they are touched only by volatile accesses (this type's, the device's).
    pub unsafe fn new(ptr: NonNull<u8>, len: usize) -> Result<Direct, Error> {
        let addr = ptr.as_ptr() as usize;
        if addr % 8 != 0 {
            return Err(Error::UnalignedBase { addr });
        }
        Ok(Direct { ptr, len })
    }

    /// The first byte (raw: never make a reference from it).
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }
}

impl Backend for Direct {
    fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn read(&self, offset: usize, width: Width) -> Result<u64, Error> {
        check(offset, width, self.len)?;
        // SAFETY: `check` put the access inside the window, which is mapped and readable
        // (`new`'s contract), and at an offset that is a multiple of the width from an 8-byte
        // aligned base, so the pointer is aligned for the type read. Volatile: MMIO.
        unsafe {
            let at = self.ptr.as_ptr().add(offset);
            Ok(match width {
                Width::U8 => u64::from(ptr::read_volatile(at)),
                Width::U16 => u64::from(ptr::read_volatile(at.cast::<u16>())),
                Width::U32 => u64::from(ptr::read_volatile(at.cast::<u32>())),
                Width::U64 => ptr::read_volatile(at.cast::<u64>()),
            })
        }
    }

    #[inline]
    fn write(&self, offset: usize, width: Width, value: u64) -> Result<(), Error> {
        check(offset, width, self.len)?;
        // SAFETY: as in `read`, for a writable window; the casts truncate to the register width
        // on purpose (the trait passes narrower values zero-extended).
        unsafe {
            let at = self.ptr.as_ptr().add(offset);
            match width {
                Width::U8 => ptr::write_volatile(at, value as u8),
                Width::U16 => ptr::write_volatile(at.cast::<u16>(), value as u16),
                Width::U32 => ptr::write_volatile(at.cast::<u32>(), value as u32),
                Width::U64 => ptr::write_volatile(at.cast::<u64>(), value),
            }
        }
        Ok(())
    }

    /// Every register of a mapped BAR is one volatile access away.
    fn raw_register(&self, offset: usize, width: Width) -> Option<RawRegister> {
        check(offset, width, self.len).ok()?;
        // SAFETY: `check` put the register inside the window, at an offset that is a multiple
        // of its width from an 8-byte aligned base (`new` checked it), so the address is in
        // bounds (`add` stays in the mapping) and aligned for the width. The window stays
        // mapped, readable and writable while this value or any clone lives, and is touched
        // only by volatile accesses (`new`'s contract), which is `RawRegister::volatile`'s.
        Some(unsafe { RawRegister::volatile(self.ptr.add(offset), width) })
    }
}

/// Registers reached through `pread`/`pwrite` on a file descriptor, at `offset` bytes into the
/// file: how VFIO serves BAR parts that cannot be mapped (the region's `offset` from
/// `VFIO_DEVICE_GET_REGION_INFO`). Each access is one system call of exactly the access width
/// (the kernel turns it into one device access of that width); values are little-endian on the
/// wire, as VFIO passes them.
#[derive(Clone, Debug)]
pub struct FileBacked<F> {
    file: F,
    offset: u64,
    len: usize,
}

impl<F: AsFd> FileBacked<F> {
    /// The `len` registers at `offset` bytes into `file`.
    pub fn new(file: F, offset: u64, len: usize) -> FileBacked<F> {
        FileBacked { file, offset, len }
    }

    /// The file offset of register offset `at` (checked by the caller to be inside the window).
    fn file_offset(&self, at: usize) -> Option<u64> {
        self.offset.checked_add(u64::try_from(at).ok()?)
    }
}

/// `pread`/`pwrite` of exactly `buf.len()` bytes at `offset`, as an `io::Result`.
fn pread_exact(fd: std::os::fd::BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
    match nix::sys::uio::pread(fd, buf, off)? {
        n if n == buf.len() => Ok(()),
        _ => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
    }
}

fn pwrite_exact(fd: std::os::fd::BorrowedFd<'_>, buf: &[u8], offset: u64) -> io::Result<()> {
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
    match nix::sys::uio::pwrite(fd, buf, off)? {
        n if n == buf.len() => Ok(()),
        _ => Err(io::Error::from(io::ErrorKind::WriteZero)),
    }
}

impl<F: AsFd + fmt::Debug + Send + Sync> Backend for FileBacked<F> {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&self, offset: usize, width: Width) -> Result<u64, Error> {
        check(offset, width, self.len)?;
        let file_offset = self.file_offset(offset).ok_or(Error::OutOfBounds {
            offset,
            len: width.bytes(),
            size: self.len,
        })?;
        let mut bytes = [0u8; 8];
        pread_exact(self.file.as_fd(), &mut bytes[..width.bytes()], file_offset).map_err(
            |source| Error::Read {
                offset,
                file_offset,
                width,
                source,
            },
        )?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn write(&self, offset: usize, width: Width, value: u64) -> Result<(), Error> {
        check(offset, width, self.len)?;
        let file_offset = self.file_offset(offset).ok_or(Error::OutOfBounds {
            offset,
            len: width.bytes(),
            size: self.len,
        })?;
        let bytes = value.to_le_bytes();
        pwrite_exact(self.file.as_fd(), &bytes[..width.bytes()], file_offset).map_err(|source| {
            Error::Write {
                offset,
                file_offset,
                width,
                source,
            }
        })
    }
}

/// Registers in ordinary memory shared between threads: the loopback device's BAR, which its
/// engine thread reads and writes while the host does, and register doubles in tests. Cloning
/// gives another handle to the same registers. Zero when made.
///
/// The memory is an array of 32-bit atomics, so host and device never race in the sense of the
/// Rust memory model (a volatile access would). A 32-bit access is one atomic load or store; a
/// 64-bit access is two 32-bit ones, low half first, so a 64-bit register that another thread
/// changes at the same moment can be read torn (as through a 32-bit bus; write such registers
/// before enabling the device, as drivers do); an 8- or 16-bit write is a compare-exchange on the
/// containing word. Stores are `Release` and loads `Acquire`, which gives these registers the
/// ordering MMIO has: a register write is seen only after everything written before it, as
/// uncached writes to a device arrive in order.
#[derive(Clone, Debug)]
pub struct Shared {
    words: Arc<Vec<AtomicU32>>,
    len: usize,
}

impl Shared {
    /// `len` bytes of registers, all zero.
    pub fn new(len: usize) -> Shared {
        let words: Vec<AtomicU32> = (0..len.div_ceil(4)).map(|_| AtomicU32::new(0)).collect();
        Shared {
            words: Arc::new(words),
            len,
        }
    }

    /// The shift, within its word's value, of the `width`-byte register at byte `offset` (the
    /// register lies inside one word: it is naturally aligned and at most 2 bytes here).
    fn shift(offset: usize, width: Width) -> u32 {
        let byte = (offset % 4) as u32;
        if cfg!(target_endian = "little") {
            8 * byte
        } else {
            8 * (4 - byte - width.bytes() as u32)
        }
    }

    fn word(&self, index: usize) -> &AtomicU32 {
        // `check` keeps every access within `len`, and `words` has `len / 4` rounded up.
        &self.words[index]
    }

    fn load(&self, index: usize) -> u32 {
        // Acquire: pairs with the Release store (or compare-exchange) of whoever wrote the
        // register, so what they wrote before it is visible after this read (MMIO ordering).
        self.word(index).load(Ordering::Acquire)
    }

    fn store(&self, index: usize, value: u32) {
        // Release: everything written before this register write is visible to a reader that
        // sees it (pairs with the Acquire in `load`).
        self.word(index).store(value, Ordering::Release);
    }

    /// Word `index` as a [`RawRegister`] (`index` inside `words`).
    #[cfg(not(loom))]
    fn atomic_register(&self, index: usize) -> Option<RawRegister> {
        let word = NonNull::from(self.words.get(index)?);
        // SAFETY: the word is an element of the `Vec` behind this value's `Arc`, which no one
        // can resize (it is never mutably borrowed), so it stays allocated, at this address,
        // while this value or any clone (sharing the `Arc`) lives.
        Some(unsafe { RawRegister::atomic(word) })
    }

    /// Under loom the words are loom's model atomics, which only loom may access: no raw
    /// register, every access goes through `read`/`write` and is modelled.
    #[cfg(loom)]
    fn atomic_register(&self, index: usize) -> Option<RawRegister> {
        let _ = index;
        None
    }

    /// Replaces the bits of `mask` in word `index` with those of `bits` (a sub-word write).
    fn merge(&self, index: usize, mask: u32, bits: u32) {
        let word = self.word(index);
        // Relaxed first read: only a guess for the compare-exchange, which checks it.
        let mut current = word.load(Ordering::Relaxed);
        loop {
            let new = (current & !mask) | (bits & mask);
            // AcqRel on success: Release as for `store`, Acquire as for `load` (it is both).
            // Relaxed on failure: the value is only the next guess.
            match word.compare_exchange(current, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }
}

impl Backend for Shared {
    fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn read(&self, offset: usize, width: Width) -> Result<u64, Error> {
        check(offset, width, self.len)?;
        let index = offset / 4;
        Ok(match width {
            Width::U8 | Width::U16 => {
                let shift = Self::shift(offset, width);
                (u64::from(self.load(index)) >> shift) & width.max()
            }
            Width::U32 => u64::from(self.load(index)),
            Width::U64 => {
                let (low, high) = if cfg!(target_endian = "little") {
                    (index, index + 1)
                } else {
                    (index + 1, index)
                };
                let low = u64::from(self.load(low));
                let high = u64::from(self.load(high));
                low | (high << 32)
            }
        })
    }

    #[inline]
    fn write(&self, offset: usize, width: Width, value: u64) -> Result<(), Error> {
        check(offset, width, self.len)?;
        let index = offset / 4;
        match width {
            Width::U8 | Width::U16 => {
                let shift = Self::shift(offset, width);
                // `width.max()` fits in 16 bits here.
                let mask = (width.max() as u32) << shift;
                self.merge(index, mask, ((value & width.max()) as u32) << shift);
            }
            // Truncation to the register width on purpose.
            Width::U32 => self.store(index, value as u32),
            Width::U64 => {
                let (low, high) = if cfg!(target_endian = "little") {
                    (index, index + 1)
                } else {
                    (index + 1, index)
                };
                self.store(low, value as u32);
                self.store(high, (value >> 32) as u32);
            }
        }
        Ok(())
    }

    /// A 32-bit register is one atomic word: handed out as such. Sub-word and 64-bit registers
    /// take more than one access (a compare-exchange, two stores): `None`.
    fn raw_register(&self, offset: usize, width: Width) -> Option<RawRegister> {
        if width != Width::U32 {
            return None;
        }
        check(offset, width, self.len).ok()?;
        self.atomic_register(offset / 4)
    }
}

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A register read.
    Read,
    /// A register write.
    Write,
}

/// One logged register access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Read or write.
    pub op: Op,
    /// Backend offset.
    pub offset: usize,
    /// Access width.
    pub width: Width,
    /// The value read or written.
    pub value: u64,
}

/// A test double: forwards every access to `B` and logs it. Clones share the log.
#[derive(Clone, Debug)]
pub struct Recording<B> {
    inner: B,
    log: Arc<Mutex<Vec<Access>>>,
}

impl<B: Backend> Recording<B> {
    /// Logs the accesses made to `inner`.
    pub fn new(inner: B) -> Recording<B> {
        Recording {
            inner,
            log: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The accesses so far, oldest first, and clears the log.
    pub fn take_log(&self) -> Vec<Access> {
        self.with_log(std::mem::take)
    }

    fn with_log<R>(&self, f: impl FnOnce(&mut Vec<Access>) -> R) -> R {
        // A panic while logging leaves a complete Vec: take it over.
        let mut log = self
            .log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut log)
    }

    fn record(&self, op: Op, offset: usize, width: Width, value: u64) {
        let access = Access {
            op,
            offset,
            width,
            value,
        };
        self.with_log(|log| log.push(access));
    }
}

impl<B: Backend> Backend for Recording<B> {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn read(&self, offset: usize, width: Width) -> Result<u64, Error> {
        let value = self.inner.read(offset, width)?;
        self.record(Op::Read, offset, width, value);
        Ok(value)
    }

    fn write(&self, offset: usize, width: Width, value: u64) -> Result<(), Error> {
        self.inner.write(offset, width, value)?;
        self.record(Op::Write, offset, width, value & width.max());
        Ok(())
    }
}
