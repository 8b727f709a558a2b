//! A shared mapping of a device file (a VFIO region, a sysfs `resourceN`), unmapped on drop.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// `len` bytes of a file mapped shared, read-write. Only ever touched through raw pointers
/// (volatile accesses in `mmio::Direct`): no reference to the bytes is ever made.
#[derive(Debug)]
pub(crate) struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mmap {
    /// Maps `len` bytes of `fd` at `offset`, shared and read-write.
    pub(crate) fn shared(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Mmap> {
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mmap offset too large"))?;
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot map 0 bytes",
            ));
        }
        // SAFETY: a new mapping chosen by the kernel (address NULL), so no existing memory is
        // replaced; `fd` is open for the duration of the call (borrowed); the result is checked
        // against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null address"))?;
        Ok(Mmap { ptr, len })
    }

    /// The first byte.
    pub(crate) fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The mapped length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + len` is a mapping this value made and owns; whoever borrowed it
        // (an `Edu`'s register block) is dropped before it (field order in `edu::Edu`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
