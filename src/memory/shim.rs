//! The memory-management calls: one function per syscall, through `nix` where it has the
//! call, its `Errno` turned into `io::Error` right here. Calls that can break memory safety
//! (`mmap`, `munmap`, `mbind`, `madvise`, `mlock`) are `unsafe fn`; the ones that only fill
//! buffers they are given are safe wrappers. `mbind`, `mincore` and `move_pages` stay raw
//! `libc` calls: `nix` has none of them.

use std::ffi::CStr;
use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::{self, NonNull};

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::MFdFlags;
use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags};
use nix::sys::resource::{getrlimit, Resource};

use super::{MemlockLimit, PageSize};

use userdma_sys::mman::MPOL_BIND;

/// `f_type` of a hugetlbfs mount, as `fstatfs` reports it.
/// (`u32` to `i64` is lossless; `i64::from` is not usable in a const.)
pub(super) const HUGETLBFS_MAGIC: i64 = userdma_sys::mman::HUGETLBFS_MAGIC as i64;

/// Result of a raw `libc` call returning `-1` on error.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A length the kernel would refuse as zero: `EINVAL`, as `mmap` itself says.
fn nonzero(len: usize) -> io::Result<NonZeroUsize> {
    NonZeroUsize::new(len).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
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
    let len = nonzero(len)?;
    let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    let mut flags = if populate {
        MapFlags::MAP_POPULATE
    } else {
        MapFlags::empty()
    };
    let addr = match (share, fd) {
        (Share::PrivateAnonymous, _) => {
            flags |= MapFlags::MAP_PRIVATE
                | match page_size {
                    PageSize::Base => MapFlags::empty(),
                    PageSize::Huge2M => MapFlags::MAP_HUGETLB | MapFlags::MAP_HUGE_2MB,
                    PageSize::Huge1G => MapFlags::MAP_HUGETLB | MapFlags::MAP_HUGE_1GB,
                };
            // SAFETY: no address hint, so the kernel chooses a free range and no existing
            // mapping is replaced; the flags are checked by the kernel.
            unsafe { nix::sys::mman::mmap_anonymous(None, len, prot, flags) }?
        }
        (Share::SharedFile, Some(fd)) => {
            flags |= MapFlags::MAP_SHARED;
            // SAFETY: as above; the caller upholds the fd/length contract.
            unsafe { nix::sys::mman::mmap(None, len, prot, flags, fd, 0) }?
        }
        (Share::SharedFile, None) => return Err(io::Error::from_raw_os_error(libc::EBADF)),
    };
    Ok(addr.cast::<u8>())
}

/// `munmap`.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns, no longer used by anything: after this
/// call every pointer into it dangles.
pub(super) unsafe fn munmap(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the mapping and guarantees nothing uses it any more.
    Ok(unsafe { nix::sys::mman::munmap(addr.cast(), len) }?)
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
    // Linux has at most 2^10 nodes (CONFIG_NODES_SHIFT): past that the node does not exist,
    // and its mask is not built (it would be sized by the node number).
    const MAX_NODES: u32 = 1 << 10;
    if node >= MAX_NODES {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
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
    Ok(unsafe { nix::sys::mman::madvise(addr.cast(), len, MmapAdvise::MADV_POPULATE_WRITE) }?)
}

/// `mlock`.
///
/// # Safety
/// `[addr, addr + len)` must be a mapping the caller owns.
pub(super) unsafe fn mlock(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the mapping; locking changes residency, not contents.
    Ok(unsafe { nix::sys::mman::mlock(addr.cast(), len) }?)
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
    let flags = MFdFlags::MFD_CLOEXEC
        | MFdFlags::MFD_ALLOW_SEALING
        | match page_size {
            PageSize::Base => MFdFlags::empty(),
            PageSize::Huge2M => MFdFlags::MFD_HUGETLB | MFdFlags::MFD_HUGE_2MB,
            PageSize::Huge1G => MFdFlags::MFD_HUGETLB | MFdFlags::MFD_HUGE_1GB,
        };
    Ok(nix::sys::memfd::memfd_create(name, flags)?)
}

/// `ftruncate`.
pub(super) fn ftruncate(fd: BorrowedFd<'_>, len: usize) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    Ok(nix::unistd::ftruncate(fd, len)?)
}

/// `fcntl(F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)`: nobody can resize the file
/// under a peer's mapping (which would turn its accesses into SIGBUS).
pub(super) fn seal_size(fd: BorrowedFd<'_>) -> io::Result<()> {
    let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
    fcntl(fd, FcntlArg::F_ADD_SEALS(seals))?;
    Ok(())
}

/// `fstatfs`: the filesystem magic (`f_type`) and block size (`f_bsize`, the hugepage size on
/// hugetlbfs).
pub(super) fn fs_magic_and_block_size(fd: BorrowedFd<'_>) -> io::Result<(i64, i64)> {
    let stat = nix::sys::statfs::fstatfs(fd)?;
    // The fields are `__fsword_t`: i64 on 64-bit targets (a no-op there), i32 on 32-bit ones.
    #[allow(clippy::useless_conversion)]
    Ok((
        i64::from(stat.filesystem_type().0),
        i64::from(stat.block_size()),
    ))
}

/// `fstat`: the file's length in bytes.
pub(super) fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let stat = nix::sys::stat::fstat(fd)?;
    u64::try_from(stat.st_size).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))
}

/// `getrlimit(RLIMIT_MEMLOCK)`: (soft, hard).
pub(super) fn memlock_limit() -> io::Result<(MemlockLimit, MemlockLimit)> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_MEMLOCK)?;
    let convert = |value: libc::rlim_t| {
        if value == libc::RLIM_INFINITY {
            MemlockLimit::Unlimited
        } else {
            MemlockLimit::Bytes(value)
        }
    };
    Ok((convert(soft), convert(hard)))
}
