//! The raw memory-management calls: one function per syscall, errno turned into `io::Error`
//! right here. Calls that can break memory safety (`mmap`, `munmap`, `mbind`, `madvise`, `mlock`)
//! are `unsafe fn`; the ones that only fill buffers they are given are safe wrappers.

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::{self, NonNull};

use super::{MemlockLimit, PageSize};

use userdma_sys::mman::{
    MAP_HUGETLB, MAP_HUGE_1GB, MAP_HUGE_2MB, MAP_POPULATE, MFD_ALLOW_SEALING, MFD_CLOEXEC,
    MFD_HUGETLB, MFD_HUGE_1GB, MFD_HUGE_2MB, MPOL_BIND,
};

/// `madvise` advice that faults pages in writable and reports failure instead of raising
/// SIGBUS (Linux 5.14). From libc until `userdma_sys::mman::MADV_POPULATE_WRITE` exists.
const MADV_POPULATE_WRITE: libc::c_int = libc::MADV_POPULATE_WRITE;
/// `f_type` of a hugetlbfs mount, as `fstatfs` reports it.
/// (`u32` to `i64` is lossless; `i64::from` is not usable in a const.)
pub(super) const HUGETLBFS_MAGIC: i64 = userdma_sys::mman::HUGETLBFS_MAGIC as i64;

/// Result of a syscall returning `-1` on error.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// How a region's pages are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Share {
    /// `MAP_PRIVATE | MAP_ANONYMOUS`.
    PrivateAnonymous,
    /// `MAP_SHARED` of a file.
    SharedFile,
}

/// `mmap` of `len` read-write bytes.
///
/// # Safety
/// `fd` must be `Some` exactly when `share` is [`Share::SharedFile`] and name a file at least
/// `len` bytes long. The returned mapping is fresh (the kernel chooses its address), so it aliases
/// no Rust object; the caller owns it and must `munmap` it exactly once.
pub(super) unsafe fn mmap(
    len: usize,
    page_size: PageSize,
    share: Share,
    fd: Option<BorrowedFd<'_>>,
    populate: bool,
) -> io::Result<NonNull<u8>> {
    let mut flags = match share {
        Share::PrivateAnonymous => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        Share::SharedFile => libc::MAP_SHARED,
    };
    if share == Share::PrivateAnonymous {
        flags |= match page_size {
            PageSize::Base => 0,
            PageSize::Huge2M => MAP_HUGETLB | MAP_HUGE_2MB,
            PageSize::Huge1G => MAP_HUGETLB | MAP_HUGE_1GB,
        };
    }
    if populate {
        flags |= MAP_POPULATE;
    }
    let raw_fd = fd.map_or(-1, |fd| fd.as_raw_fd());
    // SAFETY: a null hint lets the kernel choose a free address range, so no existing mapping is
    // replaced; the flags and fd are checked by the kernel, and the caller upholds the fd/length
    // contract above.
    let addr = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            raw_fd,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(addr.cast::<u8>()).ok_or_else(|| io::Error::from_raw_os_error(libc::EFAULT))
}

/// `munmap`.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns, no longer used by anything: after this
/// call every pointer into it dangles.
pub(super) unsafe fn munmap(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the mapping and guarantees nothing uses it any more.
    check(unsafe { libc::munmap(addr.as_ptr().cast(), len) }).map(drop)
}

/// `mbind(addr, len, MPOL_BIND, {node}, ...)`: future faults in the range allocate on `node`.
///
/// `MPOL_BIND`, not `MPOL_PREFERRED`: memory placed for a device must be on its node or not be
/// had at all, so that a shortage on that node is an error naming the node's hugepage pool,
/// not pages silently taken from another node (which a preferred policy does, hugetlb faults
/// included). The policy applies to the pages faulted in after this call, so the caller binds
/// before touching the range.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns. Changing its policy does not change its
/// contents, so there are no further obligations.
pub(super) unsafe fn mbind(addr: NonNull<u8>, len: usize, node: u32) -> io::Result<()> {
    const WORD_BITS: u32 = libc::c_ulong::BITS;
    // One word per WORD_BITS nodes, enough for `node`.
    let words = usize::try_from(node / WORD_BITS + 1)
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut mask = vec![0 as libc::c_ulong; words];
    let word = mask
        .last_mut()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    *word = 1 << (node % WORD_BITS);
    // maxnode counts bits; the kernel reads maxnode - 1 of them, so pass one more than we fill.
    let maxnode = libc::c_ulong::from(WORD_BITS) * libc::c_ulong::from(node / WORD_BITS + 1) + 1;
    // The libc crate has no `mbind` (glibc leaves it to libnuma), hence the raw syscall.
    // SAFETY: the range is the caller's mapping; `mask` lives across the call and holds
    // `maxnode - 1` bits; flags 0 moves no existing pages.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr.as_ptr(),
            len,
            MPOL_BIND,
            mask.as_ptr(),
            maxnode,
            0u32,
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `madvise(MADV_POPULATE_WRITE)`: fault every page in, writable, without changing contents;
/// failures (no hugepage left, node exhausted) come back as errors instead of SIGBUS.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns, mapped writable.
pub(super) unsafe fn populate_write(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the writable mapping; populating does not change its contents.
    check(unsafe { libc::madvise(addr.as_ptr().cast(), len, MADV_POPULATE_WRITE) }).map(drop)
}

/// `mlock`.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns.
pub(super) unsafe fn mlock(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the mapping; locking changes residency, not contents.
    check(unsafe { libc::mlock(addr.as_ptr().cast(), len) }).map(drop)
}

/// `mincore`: one byte per base page of `[addr, addr + len)`, bit 0 set when resident.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns.
pub(super) unsafe fn mincore(addr: NonNull<u8>, len: usize) -> io::Result<Vec<u8>> {
    let base = super::base_page_size();
    let pages = len.div_ceil(base);
    let mut vec = vec![0u8; pages];
    // SAFETY: the range is the caller's mapping; `vec` has one byte per base page of it, which is
    // exactly what the kernel writes.
    check(unsafe { libc::mincore(addr.as_ptr().cast(), len, vec.as_mut_ptr()) })?;
    Ok(vec)
}

/// `move_pages(0, pages, NULL, status, 0)`: the NUMA node of each page (or a negative errno).
pub(super) fn page_nodes(pages: &[*mut libc::c_void]) -> io::Result<Vec<i32>> {
    let mut status = vec![0 as libc::c_int; pages.len()];
    // SAFETY: with a null `nodes` array move_pages only reports where each page is; it reads
    // `pages.len()` pointers (never dereferencing them in this process) and writes as many ints
    // into `status`, which has that length.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0 as libc::pid_t,
            pages.len() as libc::c_ulong,
            pages.as_ptr(),
            ptr::null::<libc::c_int>(),
            status.as_mut_ptr(),
            0 as libc::c_int,
        )
    };
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(status)
    }
}

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | hugetlb flags)`.
pub(super) fn memfd_create(name: &CStr, page_size: PageSize) -> io::Result<OwnedFd> {
    let mut flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
    flags |= match page_size {
        PageSize::Base => 0,
        PageSize::Huge2M => MFD_HUGETLB | MFD_HUGE_2MB,
        PageSize::Huge1G => MFD_HUGETLB | MFD_HUGE_1GB,
    };
    // SAFETY: `name` is a valid C string for the call; the flags are checked by the kernel.
    let fd = check(unsafe { libc::memfd_create(name.as_ptr(), flags) })?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `ftruncate`.
pub(super) fn ftruncate(fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: ftruncate on a borrowed, open descriptor has no memory-safety preconditions.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }).map(drop)
}

/// `fcntl(F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)`: nobody can resize the file
/// under a peer's mapping (which would turn its accesses into SIGBUS).
pub(super) fn seal_size(fd: BorrowedFd<'_>) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS takes an int argument and touches no memory of ours.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }).map(drop)
}

/// `fstatfs`: the filesystem magic (`f_type`) and block size (`f_bsize`, the hugepage size on
/// hugetlbfs).
pub(super) fn fs_magic_and_block_size(fd: BorrowedFd<'_>) -> io::Result<(i64, i64)> {
    let mut buf = MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `buf` is a writable statfs the kernel fills in.
    check(unsafe { libc::fstatfs(fd.as_raw_fd(), buf.as_mut_ptr()) })?;
    // SAFETY: fstatfs succeeded, so the kernel initialised the struct (it was zeroed before too).
    let stat = unsafe { buf.assume_init() };
    // The fields are `__fsword_t`: i64 on 64-bit targets (a no-op there), i32 on 32-bit ones.
    #[allow(clippy::useless_conversion)]
    Ok((i64::from(stat.f_type), i64::from(stat.f_bsize)))
}

/// `fstat`: the file's length in bytes.
pub(super) fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut buf = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `buf` is a writable stat the kernel fills in.
    check(unsafe { libc::fstat(fd.as_raw_fd(), buf.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so the kernel initialised the struct.
    let stat = unsafe { buf.assume_init() };
    u64::try_from(stat.st_size).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))
}

/// `getrlimit(RLIMIT_MEMLOCK)`: (soft, hard).
pub(super) fn memlock_limit() -> io::Result<(MemlockLimit, MemlockLimit)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a writable rlimit the kernel fills in.
    check(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) })?;
    let convert = |value: libc::rlim_t| {
        if value == libc::RLIM_INFINITY {
            MemlockLimit::Unlimited
        } else {
            MemlockLimit::Bytes(value)
        }
    };
    Ok((convert(limit.rlim_cur), convert(limit.rlim_max)))
}
