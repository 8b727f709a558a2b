//! The memory-management calls as Miri runs them (`cfg(miri)`, `scripts/miri.sh`): the same
//! functions as `shim.rs`, with a region's pages taken from the interpreter's allocator instead
//! of `mmap`. Miri runs no `memfd_create`, `mmap` of a file, `mbind`, `mlock`, `mincore` or
//! `move_pages`, and what it checks in this crate is the code above them (pools, rings, slices
//! over a region's bytes), to which these pages are the same memory: fresh, zeroed, page
//! aligned, owned by one `Region` until `munmap`. Residency is reported as complete and locking
//! as done; the calls that cannot be modelled (a NUMA policy, a file's filesystem) fail with
//! `ENOSYS`, so a test that needs them says so instead of passing on a pretence. There is no
//! `memfd_create` or `seal_size`: `Region`'s memfd backing is private memory under Miri.

use std::alloc::{self, Layout};
use std::collections::BTreeMap;
use std::io;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::Mutex;

use super::{MemlockLimit, PageSize};

/// `f_type` of a hugetlbfs mount, as `fstatfs` reports it.
pub(super) const HUGETLBFS_MAGIC: i64 = userdma_sys::mman::HUGETLBFS_MAGIC as i64;

/// How a region's pages are shared (as in `shim.rs`; both are private memory here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Share {
    /// `MAP_PRIVATE | MAP_ANONYMOUS`.
    PrivateAnonymous,
    /// `MAP_SHARED` of a file.
    SharedFile,
}

/// The layout each live allocation was made with, by address, for `munmap`.
static LIVE: Mutex<BTreeMap<usize, Layout>> = Mutex::new(BTreeMap::new());

fn unsupported() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSYS)
}

/// `len` zeroed bytes aligned to the page size.
///
/// # Safety
/// As `shim::mmap`: the caller owns the memory and frees it with [`munmap`] exactly once.
pub(super) unsafe fn mmap(
    len: usize,
    page_size: PageSize,
    _share: Share,
    _fd: Option<BorrowedFd<'_>>,
    _populate: bool,
) -> io::Result<NonNull<u8>> {
    if len == 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let layout = Layout::from_size_align(len, page_size.bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: the layout's size is nonzero (checked above).
    let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.insert(ptr.as_ptr() as usize, layout);
    Ok(ptr)
}

/// Frees what [`mmap`] returned.
///
/// # Safety
/// As `shim::munmap`: `addr` came from [`mmap`] with this `len`, and nothing uses it any more.
pub(super) unsafe fn munmap(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    match live.remove(&(addr.as_ptr() as usize)) {
        Some(layout) if layout.size() == len => {
            // SAFETY: allocated by `mmap` above with this layout, and the caller's contract
            // says nothing uses it any more.
            unsafe { alloc::dealloc(addr.as_ptr(), layout) };
            Ok(())
        }
        other => {
            if let Some(layout) = other {
                live.insert(addr.as_ptr() as usize, layout);
            }
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        }
    }
}

/// A NUMA policy cannot be modelled: `ENOSYS`.
///
/// # Safety
/// None beyond `shim::mbind`'s.
pub(super) unsafe fn mbind(_addr: NonNull<u8>, _len: usize, _node: u32) -> io::Result<()> {
    Err(unsupported())
}

/// The pages are allocated (and zeroed) already.
///
/// # Safety
/// None beyond `shim::populate_write`'s.
pub(super) unsafe fn populate_write(_addr: NonNull<u8>, _len: usize) -> io::Result<()> {
    Ok(())
}

/// The interpreter never swaps.
///
/// # Safety
/// None beyond `shim::mlock`'s.
pub(super) unsafe fn mlock(_addr: NonNull<u8>, _len: usize) -> io::Result<()> {
    Ok(())
}

/// Every base page is resident.
///
/// # Safety
/// None beyond `shim::mincore`'s.
pub(super) unsafe fn mincore(_addr: NonNull<u8>, len: usize) -> io::Result<Vec<u8>> {
    Ok(vec![1; len.div_ceil(super::base_page_size())])
}

/// Page placement cannot be modelled: `ENOSYS`.
pub(super) fn page_nodes(_pages: &[*mut libc::c_void]) -> io::Result<Vec<i32>> {
    Err(unsupported())
}

/// Files are not mapped under Miri: `ENOSYS`.
pub(super) fn ftruncate(_fd: BorrowedFd<'_>, _len: usize) -> io::Result<()> {
    Err(unsupported())
}

/// Files are not mapped under Miri: `ENOSYS`.
pub(super) fn fs_magic_and_block_size(_fd: BorrowedFd<'_>) -> io::Result<(i64, i64)> {
    Err(unsupported())
}

/// Files are not mapped under Miri: `ENOSYS`.
pub(super) fn file_len(_fd: BorrowedFd<'_>) -> io::Result<u64> {
    Err(unsupported())
}

/// No limit applies to the interpreter's memory.
pub(super) fn memlock_limit() -> io::Result<(MemlockLimit, MemlockLimit)> {
    Ok((MemlockLimit::Unlimited, MemlockLimit::Unlimited))
}
