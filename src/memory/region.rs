//! [`Region`]: one pinned mapping of hugepages (or base pages, when asked), and its [`Builder`].

#[cfg(not(miri))]
use std::ffi::CStr;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use super::hugepages;
use super::pagemap::{self, PhysicalPages};
use super::shim::{self, Share};
use super::u64_of;
use super::{Error, PageSize, ReserveHint, SYSFS_ROOT};

/// The name memfds of regions carry in `/proc/<pid>/fd` and `/proc/<pid>/maps`.
#[cfg(not(miri))]
const MEMFD_NAME: &CStr = c"userdma-region";

/// What backs a region's pages.
#[derive(Debug, Default)]
pub enum Backing {
    /// Private anonymous memory (`MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB`); no file descriptor.
    #[default]
    Anonymous,
    /// A memfd (`MFD_HUGETLB` for hugepages), sealed against resizing, mapped shared; another
    /// process maps the same pages from [`Region::fd`].
    Memfd,
    /// A file on a hugetlbfs mount whose `pagesize` is the region's page size (created if missing,
    /// sized to the region, left in place on drop), mapped shared. For base pages, a file on any
    /// filesystem other than hugetlbfs (use tmpfs).
    File(PathBuf),
    /// An already open file (a memfd or hugetlbfs file received from another process), mapped
    /// shared; it must hold at least the region's length.
    Fd(OwnedFd),
}

/// Configures and creates a [`Region`]: page size (2 MiB by default), backing (anonymous by
/// default), NUMA node (none by default), locking (on by default).
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct Builder {
    len: usize,
    page_size: PageSize,
    backing: Backing,
    node: Option<u32>,
    lock: bool,
    sysfs_root: PathBuf,
    meminfo: PathBuf,
}

impl Builder {
    /// A region of `len` bytes of 2 MiB hugepages, anonymous, locked, on no particular node.
    pub fn new(len: usize) -> Self {
        Builder {
            len,
            page_size: PageSize::Huge2M,
            backing: Backing::Anonymous,
            node: None,
            lock: true,
            sysfs_root: PathBuf::from(SYSFS_ROOT),
            meminfo: PathBuf::from(MEMINFO),
        }
    }

    /// Sets the page size. [`PageSize::Base`] gives 4 KiB pages, which are not physically
    /// contiguous beyond one page.
    pub fn page_size(mut self, page_size: PageSize) -> Self {
        self.page_size = page_size;
        self
    }

    /// Sets what backs the pages.
    pub fn backing(mut self, backing: Backing) -> Self {
        self.backing = backing;
        self
    }

    /// Backs the region with a memfd another process can map ([`Backing::Memfd`]).
    pub fn memfd(self) -> Self {
        self.backing(Backing::Memfd)
    }

    /// Binds the pages to a NUMA node, or (`None`, the default) places them nowhere in
    /// particular. Takes a node number or an `Option` of one.
    ///
    /// The node must be online ([`numa::online`](super::numa::online)): when the kernel
    /// refuses the binding, building reads the online nodes and, for a node not among them,
    /// fails with [`Error::NoSuchNode`] naming them (no sysfs read when it works). It binds
    /// the fresh mapping with
    /// `mbind(MPOL_BIND)` before any page is faulted in (hugetlb pages too: they are taken from
    /// the node's pool at fault time), faults the pages in and checks that every one landed
    /// there ([`Region::page_nodes`]). A node short of free pages is an error, never pages from
    /// another node.
    pub fn node(mut self, node: impl Into<Option<u32>>) -> Self {
        self.node = node.into();
        self
    }

    /// Whether to `mlock` the region (default: yes). Hugepages are never swapped, but locking
    /// also makes RLIMIT_MEMLOCK problems show up here rather than at DMA-map time.
    pub fn lock(mut self, lock: bool) -> Self {
        self.lock = lock;
        self
    }

    /// Where sysfs is mounted, for the hugepage counts quoted in errors (default `/sys`).
    pub fn sysfs_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.sysfs_root = root.into();
        self
    }

    /// Where `/proc/meminfo` is, for the check that base pages fit the host's available
    /// memory (default `/proc/meminfo`).
    pub fn meminfo(mut self, path: impl Into<PathBuf>) -> Self {
        self.meminfo = path.into();
        self
    }

    /// Maps, binds, faults in, verifies and locks the region.
    ///
    /// Base pages are faulted in as they are mapped, so a region larger than the memory the
    /// host has available would be met by the kernel's OOM killer rather than an error: such
    /// a size is refused first ([`Error::HostMemory`], from `MemAvailable` in
    /// `/proc/meminfo`; skipped where that file cannot be read). Hugepages are counted by
    /// their pool (an error naming its counts when it is short).
    pub fn build(self) -> Result<Region, Error> {
        let Builder {
            len,
            page_size,
            backing,
            node,
            lock,
            sysfs_root,
            meminfo,
        } = self;
        whole_pages(len, page_size)?;
        // (Under Miri the pages are the interpreter's, not the host's.)
        if !page_size.is_huge() && !cfg!(miri) {
            if let Some(available) = mem_available(&meminfo) {
                if u64_of(len) > available {
                    return Err(Error::HostMemory {
                        len,
                        available,
                        meminfo,
                    });
                }
            }
        }
        let fd = open_backing(backing, len, page_size)?;
        let share = if fd.is_some() {
            Share::SharedFile
        } else {
            Share::PrivateAnonymous
        };
        // With a node, pages must be faulted in after mbind, so not by MAP_POPULATE.
        let populate_at_map = node.is_none();
        let context = Context {
            len,
            page_size,
            node,
            sysfs_root: &sysfs_root,
        };
        // SAFETY: `fd` is Some exactly for shared file mappings, and `open_backing` checked or
        // made the file at least `len` long. The mapping is owned by the Region made next.
        let ptr = unsafe {
            shim::mmap(
                len,
                page_size,
                share,
                fd.as_ref().map(AsFd::as_fd),
                populate_at_map,
            )
        }
        .map_err(|source| context.map_error(source))?;
        let region = Region {
            ptr,
            len,
            page_size,
            fd,
            node,
            locked: false,
            owned: true,
        };
        region.settle(&context, lock)
    }
}

/// The default [`Builder::meminfo`].
const MEMINFO: &str = "/proc/meminfo";

/// `MemAvailable` of a `/proc/meminfo` file, in bytes; `None` if it cannot be read or has none.
fn mem_available(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|line| line.strip_prefix("MemAvailable:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// What `Builder::build` needs to turn kernel errors into helpful ones.
struct Context<'a> {
    len: usize,
    page_size: PageSize,
    node: Option<u32>,
    sysfs_root: &'a Path,
}

impl Context<'_> {
    /// Pages the region needs.
    fn pages(&self) -> u64 {
        u64_of(self.len / self.page_size.bytes())
    }

    /// The error for a failed `mmap`.
    fn map_error(&self, source: io::Error) -> Error {
        if self.page_size.is_huge() {
            match source.raw_os_error() {
                Some(libc::ENOMEM) => return self.shortage(source),
                Some(libc::EINVAL) => {
                    let path = hugepages::pool_dir(self.sysfs_root, self.page_size, None);
                    if !path.exists() {
                        return Error::UnsupportedPageSize {
                            page_size: self.page_size,
                            path,
                        };
                    }
                }
                _ => {}
            }
        }
        Error::Map {
            len: self.len,
            page_size: self.page_size,
            source,
        }
    }

    /// The error for a failed pre-fault.
    fn populate_error(&self, source: io::Error) -> Error {
        let shortage = matches!(source.raw_os_error(), Some(libc::ENOMEM | libc::EFAULT));
        if self.page_size.is_huge() && shortage {
            return self.shortage(source);
        }
        Error::Populate {
            len: self.len,
            page_size: self.page_size,
            source,
        }
    }

    /// The "not enough hugepages" error, with the pool's counts read from sysfs. When sysfs
    /// cannot be read the counts show as zero and the hint still names the file.
    fn shortage(&self, source: io::Error) -> Error {
        let pool = hugepages::read_pool(self.sysfs_root, self.page_size, self.node).ok();
        let (total, free) = pool.map_or((0, 0), |pool| (pool.total, pool.available()));
        shortage_error(
            self.sysfs_root,
            self.page_size,
            self.node,
            self.pages(),
            total,
            free,
            source,
        )
    }
}

/// Builds [`Error::HugepagesUnavailable`]: `needed` pages, `free` of `total` in the pool.
pub(super) fn shortage_error(
    sysfs_root: &Path,
    page_size: PageSize,
    node: Option<u32>,
    needed: u64,
    total: u64,
    free: u64,
    source: io::Error,
) -> Error {
    let missing = needed.saturating_sub(free).max(1);
    Error::HugepagesUnavailable {
        page_size,
        node,
        needed,
        free,
        total,
        hint: ReserveHint {
            path: hugepages::pool_dir(sysfs_root, page_size, node)
                .join(userdma_sys::mman::NR_HUGEPAGES),
            count: total.saturating_add(missing),
            page_size,
            node,
        },
        source,
    }
}

/// Opens or creates the file behind a shared region; `None` for anonymous memory.
fn open_backing(
    backing: Backing,
    len: usize,
    page_size: PageSize,
) -> Result<Option<OwnedFd>, Error> {
    match backing {
        Backing::Anonymous => Ok(None),
        // Miri has no memfd: the default backing is private memory there (`shim_miri.rs`).
        #[cfg(miri)]
        Backing::Memfd => Ok(None),
        #[cfg(not(miri))]
        Backing::Memfd => {
            let fd = shim::memfd_create(MEMFD_NAME, page_size)
                .map_err(|source| Error::Memfd { page_size, source })?;
            shim::ftruncate(fd.as_fd(), len).map_err(|source| Error::Truncate { len, source })?;
            shim::seal_size(fd.as_fd()).map_err(|source| Error::Seal { source })?;
            Ok(Some(fd))
        }
        Backing::File(path) => {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)
                .map_err(|source| Error::OpenFile { path, source })?;
            let fd = OwnedFd::from(file);
            check_filesystem(fd.as_fd(), page_size)?;
            let file_len = shim::file_len(fd.as_fd()).map_err(|source| Error::Stat { source })?;
            if file_len < u64_of(len) {
                shim::ftruncate(fd.as_fd(), len)
                    .map_err(|source| Error::Truncate { len, source })?;
            }
            Ok(Some(fd))
        }
        Backing::Fd(fd) => {
            check_filesystem(fd.as_fd(), page_size)?;
            let file_len = shim::file_len(fd.as_fd()).map_err(|source| Error::Stat { source })?;
            if file_len < u64_of(len) {
                return Err(Error::FileTooShort { len, file_len });
            }
            Ok(Some(fd))
        }
    }
}

/// Checks that `fd` lives on hugetlbfs with pages of `page_size` (or, for base pages, not on
/// hugetlbfs).
fn check_filesystem(fd: BorrowedFd<'_>, page_size: PageSize) -> Result<(), Error> {
    let (magic, block_size) =
        shim::fs_magic_and_block_size(fd).map_err(|source| Error::Stat { source })?;
    let on_hugetlbfs = magic == shim::HUGETLBFS_MAGIC;
    if page_size.is_huge() {
        if !on_hugetlbfs || usize::try_from(block_size) != Ok(page_size.bytes()) {
            return Err(Error::NotHugetlbfs {
                page_size,
                magic,
                block_size,
            });
        }
    } else if on_hugetlbfs {
        return Err(Error::UnexpectedHugetlbfs { block_size });
    }
    Ok(())
}

/// A pinned, pre-faulted mapping of host memory, unmapped on drop; or memory the caller owns
/// ([`Region::borrowed`]), left mapped on drop.
///
/// The memory may be read and written by a device at any time, so the region hands out only raw
/// pointers ([`Region::as_ptr`]); the [`dma`](crate::dma) module gives volatile handles to it.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    page_size: PageSize,
    fd: Option<OwnedFd>,
    node: Option<u32>,
    locked: bool,
    /// The region made the mapping (and unmaps it on drop); false for the caller's memory.
    owned: bool,
}

mod borrowed;
mod external;

/// A region's length must be a positive multiple of its page size
/// ([`Error::InvalidLength`], with the nearest length that is).
fn whole_pages(len: usize, page_size: PageSize) -> Result<(), Error> {
    let page = page_size.bytes();
    if len == 0 || len % page != 0 {
        return Err(Error::InvalidLength {
            len,
            page_size,
            suggested: len.max(1).div_ceil(page).saturating_mul(page),
        });
    }
    Ok(())
}

// SAFETY: a Region owns its mapping outright; the mapping is process-wide, so it may be used and
// unmapped from any thread. No Rust reference into the memory exists: every access goes through
// raw pointers (volatile in `dma::Slice`), whose users uphold their own synchronisation.
unsafe impl Send for Region {}
// SAFETY: `&Region` gives out only the pointer, the length and metadata; none of them can be
// mutated through a shared reference.
unsafe impl Sync for Region {}

impl Region {
    /// Starts a [`Builder`] for a region of `len` bytes (2 MiB pages unless told otherwise).
    pub fn builder(len: usize) -> Builder {
        Builder::new(len)
    }

    /// Maps `len` bytes of a file another process shares (a memfd or hugetlbfs file from
    /// [`Region::fd`]), with pages of `page_size`, pre-faulted and locked. The pages keep their
    /// contents: both processes see each other's writes.
    pub fn from_fd(fd: OwnedFd, len: usize, page_size: PageSize) -> Result<Region, Error> {
        Builder::new(len)
            .page_size(page_size)
            .backing(Backing::Fd(fd))
            .build()
    }

    /// Binds, faults in, verifies and locks a freshly mapped region.
    fn settle(mut self, context: &Context<'_>, lock: bool) -> Result<Region, Error> {
        if let Some(node) = self.node {
            // SAFETY: the range is this region's own mapping.
            if let Err(source) = unsafe { shim::mbind(self.ptr, self.len, node) } {
                // A node that does not exist is the likely cause: say which ones do. Read
                // only on failure, so placing a region reads no sysfs file.
                super::numa::check(context.sysfs_root, node)?;
                return Err(Error::Bind { node, source });
            }
            // SAFETY: the range is this region's own writable mapping.
            unsafe { shim::populate_write(self.ptr, self.len) }
                .map_err(|source| context.populate_error(source))?;
        }
        if let Err(not_resident) = self.check_resident() {
            // MAP_POPULATE does not report failure; populating again does, so the error says why.
            // SAFETY: the range is this region's own writable mapping.
            unsafe { shim::populate_write(self.ptr, self.len) }
                .map_err(|source| context.populate_error(source))?;
            self.check_resident().map_err(|_| not_resident)?;
        }
        if let Some(node) = self.node {
            self.check_node(node)?;
        }
        if lock {
            // SAFETY: the range is this region's own mapping.
            if let Err(source) = unsafe { shim::mlock(self.ptr, self.len) } {
                let (soft, hard) = shim::memlock_limit()
                    .unwrap_or((super::MemlockLimit::Unknown, super::MemlockLimit::Unknown));
                return Err(Error::Lock {
                    len: self.len,
                    soft,
                    hard,
                    source,
                });
            }
            self.locked = true;
        }
        Ok(self)
    }

    /// Checks with `mincore` that every base page is resident.
    fn check_resident(&self) -> Result<(), Error> {
        // SAFETY: the range is this region's own mapping.
        let resident = unsafe { shim::mincore(self.ptr, self.len) }
            .map_err(|source| Error::Mincore { source })?;
        match resident.iter().position(|&flags| flags & 1 == 0) {
            Some(index) => Err(Error::NotResident {
                offset: index.saturating_mul(super::base_page_size()),
            }),
            None => Ok(()),
        }
    }

    /// Checks with `move_pages` that every page is on `node`.
    fn check_node(&self, node: u32) -> Result<(), Error> {
        let found = super::numa::raw_page_nodes(self.ptr.as_ptr(), self.len, self.page_size)?;
        for (index, &page_node) in found.iter().enumerate() {
            if u32::try_from(page_node) != Ok(node) {
                return Err(Error::WrongNode {
                    offset: index * self.page_size.bytes(),
                    node,
                    found: page_node,
                });
            }
        }
        Ok(())
    }

    /// The NUMA node each page is on now, in order, as the kernel reports it
    /// ([`numa::page_nodes`](super::numa::page_nodes): `move_pages` with no target nodes,
    /// which moves nothing). Works for any region, bound or not: it is how a caller checks
    /// where memory placed for a device actually is.
    ///
    /// # Errors
    /// As [`numa::page_nodes`](super::numa::page_nodes).
    pub fn page_nodes(&self) -> Result<Vec<u32>, Error> {
        super::numa::page_nodes(self.ptr.as_ptr(), self.len, self.page_size)
    }

    /// The start of the mapping. A raw pointer: the memory may change under the process (a device
    /// or another process writes it), so never turn it into a reference.
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The length in bytes (a positive multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: regions are never empty. Present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The page size backing the region.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// The number of pages in the region.
    pub fn page_count(&self) -> usize {
        self.len / self.page_size.bytes()
    }

    /// The file behind a shared region, to pass to another process (over a Unix socket, or by
    /// inheritance) which maps it with [`Region::from_fd`]. `None` for anonymous memory.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    /// The NUMA node the pages were bound to and checked on, if one was asked for.
    pub fn node(&self) -> Option<u32> {
        self.node
    }

    /// Whether the region is `mlock`ed.
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// The physical address of every page, from `/proc/self/pagemap` (needs CAP_SYS_ADMIN),
    /// checking that each page is physically contiguous. Physical addresses are what a device
    /// uses without an IOMMU (UIO, no-IOMMU VFIO).
    pub fn physical_pages(&self) -> Result<PhysicalPages, Error> {
        pagemap::physical_pages(
            Path::new(pagemap::SELF_PAGEMAP),
            self.ptr.as_ptr() as usize,
            self.len,
            self.page_size,
        )
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if !self.owned {
            // The caller's memory: theirs to unmap, once nothing of this region is left.
            return;
        }
        // SAFETY: the Region owns the mapping; dropping it means nothing borrows it any more
        // (`dma::Mapping` and `dma::Slice` keep the Region alive through an Arc or a borrow).
        let result = unsafe { shim::munmap(self.ptr, self.len) };
        // munmap of a whole mapping we own cannot fail; a failure would be a bug in this module.
        debug_assert!(
            result.is_ok(),
            "munmap of an owned region failed: {result:?}"
        );
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
