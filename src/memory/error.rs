//! The module's error type, and the small types its messages are built from.

use std::fmt;
use std::io;
use std::path::PathBuf;

use super::numa::NodeList;
use super::PageSize;

/// An `RLIMIT_MEMLOCK` value, shown the way `ulimit -l` would show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemlockLimit {
    /// `RLIM_INFINITY`.
    Unlimited,
    /// A limit in bytes.
    Bytes(u64),
    /// `getrlimit` failed.
    Unknown,
}

impl fmt::Display for MemlockLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemlockLimit::Unlimited => f.write_str("unlimited"),
            MemlockLimit::Bytes(bytes) => write!(f, "{} KiB", bytes >> 10),
            MemlockLimit::Unknown => f.write_str("unknown"),
        }
    }
}

/// Renders " on NUMA node N" for a per-node pool, nothing otherwise.
struct OnNode(Option<u32>);

impl fmt::Display for OnNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(node) => write!(f, " on NUMA node {node}"),
            None => Ok(()),
        }
    }
}

/// How to get more hugepages of one size, rendered into error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveHint {
    /// The pool's `nr_hugepages` file.
    pub path: PathBuf,
    /// The pool size to ask for (the current total plus what is missing).
    pub count: u64,
    /// The page size.
    pub page_size: PageSize,
    /// The NUMA node, for a per-node pool.
    pub node: Option<u32>,
}

impl fmt::Display for ReserveHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`echo {} > {}` or `userdma hugepages --reserve {} --size {}",
            self.count,
            self.path.display(),
            self.count,
            self.page_size.label()
        )?;
        if let Some(node) = self.node {
            write!(f, " --node {node}")?;
        }
        f.write_str("` as root")
    }
}

/// What went wrong in this module. Each variant names the operation, the sizes or paths involved
/// and, where there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The length is zero or not a multiple of the page size.
    #[error(
        "region length {len} is not a positive multiple of the {page_size} page size: use a multiple \
         of {} bytes, e.g. {suggested}",
        page_size.bytes()
    )]
    InvalidLength {
        /// The length asked for.
        len: usize,
        /// The page size asked for.
        page_size: PageSize,
        /// The nearest valid length at or above `len`.
        suggested: usize,
    },

    /// The caller's memory ([`Region::borrowed`](super::Region::borrowed)) does not start on
    /// a page.
    #[error(
        "memory at {addr:#x} does not start on a {page_size} page: give a range aligned to the \
         page size of the memory behind it"
    )]
    Unaligned {
        /// Its start.
        addr: u64,
        /// The page size given.
        page_size: PageSize,
    },

    /// Part of the caller's memory is not mapped in this process.
    #[error(
        "memory at {addr:#x}+{len:#x} is not all mapped in this process: give a range the \
         process has mapped (and keeps mapped while a device may use it)"
    )]
    NotMapped {
        /// Its start.
        addr: u64,
        /// Its length.
        len: usize,
    },

    /// The caller's memory cannot be faulted in for writing, so it cannot be given to a
    /// device.
    #[error(
        "memory at {addr:#x}+{len:#x} cannot be faulted in for writing (MADV_POPULATE_WRITE): a \
         device can be given only writable memory the kernel can pin (anonymous, a shared file, \
         hugetlb), not a read-only, PROT_NONE or device mapping; this needs Linux 5.14 or later"
    )]
    NotPinnable {
        /// Its start.
        addr: u64,
        /// Its length.
        len: usize,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },

    /// The kernel or CPU has no pool of this hugepage size.
    #[error("this kernel offers no {page_size} hugepages ({} does not exist)", path.display())]
    UnsupportedPageSize {
        /// The page size asked for.
        page_size: PageSize,
        /// The sysfs directory of that pool.
        path: PathBuf,
    },

    /// Not enough free hugepages to back the region.
    #[error(
        "not enough free {page_size} hugepages{}: needed {needed}, {free} available in a pool of \
         {total}; reserve more with {hint}",
        OnNode(*node)
    )]
    HugepagesUnavailable {
        /// The page size asked for.
        page_size: PageSize,
        /// The NUMA node asked for, if any.
        node: Option<u32>,
        /// Pages the region needs.
        needed: u64,
        /// Pages available in the pool: free and not promised to other mappings (per node when
        /// a node was asked for).
        free: u64,
        /// Total pages in the pool.
        total: u64,
        /// The command that would reserve enough.
        hint: ReserveHint,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// `memfd_create` failed.
    #[error("memfd_create for a {page_size} region failed")]
    Memfd {
        /// The page size asked for.
        page_size: PageSize,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Opening or creating the backing file failed.
    #[error("cannot open backing file {}", path.display())]
    OpenFile {
        /// The file.
        path: PathBuf,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Querying the backing file (`fstat`/`fstatfs`) failed.
    #[error("cannot query the backing file")]
    Stat {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// The backing file is not on a filesystem serving pages of the requested size.
    #[error(
        "the backing file is not on a hugetlbfs mount with pagesize={} (filesystem magic {magic:#x}, \
         block size {block_size}): create it on one, e.g. \
         `mount -t hugetlbfs -o pagesize={} none /mnt/huge-{}`",
        page_size.label(),
        page_size.label(),
        page_size.label()
    )]
    NotHugetlbfs {
        /// The page size asked for.
        page_size: PageSize,
        /// `f_type` of the file's filesystem.
        magic: i64,
        /// `f_bsize` of the file's filesystem (the hugepage size on hugetlbfs).
        block_size: i64,
    },

    /// A base-page region was given a hugetlbfs file.
    #[error("the backing file is on hugetlbfs (block size {block_size}); ask for that page size, not base pages")]
    UnexpectedHugetlbfs {
        /// `f_bsize` of the file's filesystem.
        block_size: i64,
    },

    /// The backing file is shorter than the region.
    #[error("the backing file holds {file_len} bytes, fewer than the {len} bytes asked for")]
    FileTooShort {
        /// The region length asked for.
        len: usize,
        /// The file's length.
        file_len: u64,
    },

    /// Sizing the backing file (`ftruncate`) failed.
    #[error("cannot size the backing file to {len} bytes")]
    Truncate {
        /// The length asked for.
        len: usize,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Sealing the memfd against resizing failed.
    #[error("cannot seal the memfd against resizing")]
    Seal {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// `mmap` failed for a reason other than missing hugepages.
    #[error("mmap of {len} bytes of {page_size} pages failed")]
    Map {
        /// The length asked for.
        len: usize,
        /// The page size asked for.
        page_size: PageSize,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// The NUMA node asked for does not exist.
    #[error(
        "NUMA node {node} does not exist: {} lists the online nodes as {online}; ask for one of \
         those, or for no node",
        path.display()
    )]
    NoSuchNode {
        /// The node asked for.
        node: u32,
        /// The nodes that are online (empty on a kernel without NUMA).
        online: NodeList,
        /// The sysfs list read.
        path: PathBuf,
    },

    /// `mbind` to the NUMA node failed.
    #[error(
        "binding the region to NUMA node {node} failed: check that the node exists and has memory \
         (/sys/devices/system/node/has_memory)"
    )]
    Bind {
        /// The node asked for.
        node: u32,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Base pages asked for beyond what the host has available.
    #[error("{len} bytes of base pages are more than the {available} bytes the host has available ({meminfo}, MemAvailable): ask for less, or use hugepages reserved for it")]
    HostMemory {
        /// The length asked for.
        len: usize,
        /// Bytes available.
        available: u64,
        /// Where that was read.
        meminfo: PathBuf,
    },

    /// The host's allocator could not give a buffer the library needed (a heap copy sized by
    /// the caller's model or request).
    #[error("the host could not allocate {len} bytes for {what}: ask for less")]
    HostAlloc {
        /// What it was for.
        what: &'static str,
        /// Bytes asked for.
        len: u64,
    },

    /// Faulting the region's pages in failed.
    #[error("pre-faulting {len} bytes of {page_size} pages failed")]
    Populate {
        /// The length asked for.
        len: usize,
        /// The page size asked for.
        page_size: PageSize,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// `mincore` failed.
    #[error("mincore on the region failed")]
    Mincore {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A page was still not resident after pre-faulting.
    #[error("the page at offset {offset:#x} is not resident after pre-faulting")]
    NotResident {
        /// Byte offset of the page in the region.
        offset: usize,
    },

    /// Asking the kernel which node holds the pages (`move_pages`) failed.
    #[error("querying the NUMA node of the region's pages failed")]
    NodeQuery {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// The kernel reported no node for a page (`move_pages` status, a negative errno).
    #[error("the kernel reports no NUMA node for the page at offset {offset:#x}")]
    PageNode {
        /// Byte offset of the page in the region.
        offset: usize,
        /// The status `move_pages` gave for the page.
        #[source]
        source: io::Error,
    },

    /// A page landed on another NUMA node than the one asked for.
    #[error("the page at offset {offset:#x} is on NUMA node {found}, not on node {node} as asked")]
    WrongNode {
        /// Byte offset of the page in the region.
        offset: usize,
        /// The node asked for.
        node: u32,
        /// The node (or negative errno from `move_pages`) reported for the page.
        found: i32,
    },

    /// `mlock` failed.
    #[error(
        "mlock of {len} bytes failed: RLIMIT_MEMLOCK is {soft} (hard limit {hard}); raise it with \
         `ulimit -l unlimited` in the shell that starts the program, a `memlock` line in \
         /etc/security/limits.d/ (e.g. `@accel - memlock unlimited`), LimitMEMLOCK=infinity for a \
         systemd service, or grant the process CAP_IPC_LOCK"
    )]
    Lock {
        /// The length that was to be locked.
        len: usize,
        /// The soft `RLIMIT_MEMLOCK`.
        soft: MemlockLimit,
        /// The hard `RLIMIT_MEMLOCK`.
        hard: MemlockLimit,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Opening or reading `/proc/self/pagemap` failed.
    #[error("cannot read {}", path.display())]
    Pagemap {
        /// The pagemap file.
        path: PathBuf,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Physical frame numbers read as zero: the process lacks CAP_SYS_ADMIN.
    #[error(
        "physical addresses are hidden: /proc/self/pagemap reports frame number 0 without \
         CAP_SYS_ADMIN; run as root or grant the process CAP_SYS_ADMIN (physical-address DMA, for \
         UIO and no-IOMMU VFIO, needs it)"
    )]
    PhysicalAddressHidden,

    /// A page of the region is not present in memory.
    #[error("the page at offset {offset:#x} is not present in memory (pagemap entry {entry:#x})")]
    PageNotPresent {
        /// Byte offset of the base page in the region.
        offset: usize,
        /// The raw pagemap entry.
        entry: u64,
    },

    /// A page of the region is not physically contiguous.
    #[error(
        "the {page_size} page at offset {offset:#x} is not physically contiguous: its base page \
         {subpage} has frame {found:#x}, expected {expected:#x}; physical-address DMA needs \
         contiguous pages (use hugepages)"
    )]
    NotContiguous {
        /// Byte offset of the page in the region.
        offset: usize,
        /// The region's page size.
        page_size: PageSize,
        /// Index of the first base page that breaks the run.
        subpage: usize,
        /// The frame number that would continue the run.
        expected: u64,
        /// The frame number found.
        found: u64,
    },

    /// Reading a sysfs file failed.
    #[error("cannot read {}", path.display())]
    SysfsRead {
        /// The file.
        path: PathBuf,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A sysfs file held something other than a number.
    #[error("{} holds {content:?}, not a count", path.display())]
    SysfsParse {
        /// The file.
        path: PathBuf,
        /// What it held.
        content: String,
    },

    /// Writing a hugepage count failed.
    #[error("writing {count} to {} failed (it needs root)", path.display())]
    SysfsWrite {
        /// The file.
        path: PathBuf,
        /// The count that was to be written.
        count: u64,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// There is no hugepage pool for this size and node.
    #[error("no {page_size} hugepage pool{} in sysfs ({} does not exist)",
        OnNode(*node), path.display())]
    NoSuchPool {
        /// The page size asked for.
        page_size: PageSize,
        /// The node asked for, if any.
        node: Option<u32>,
        /// The directory that is missing.
        path: PathBuf,
    },

    /// The kernel granted fewer hugepages than asked for.
    #[error(
        "asked the kernel for {requested} {page_size} hugepages{} but it granted {granted}: memory \
         is too fragmented; free memory, or reserve at boot (kernel command line \
         `hugepagesz={} hugepages={requested}`)",
        OnNode(*node),
        page_size.label()
    )]
    ReserveShort {
        /// The page size.
        page_size: PageSize,
        /// The node, for a per-node pool.
        node: Option<u32>,
        /// The pool size asked for.
        requested: u64,
        /// The pool size the kernel reports afterwards.
        granted: u64,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            // The caller's length, page size or backing file cannot make the region.
            Error::InvalidLength { .. }
            | Error::UnsupportedPageSize { .. }
            | Error::NotHugetlbfs { .. }
            | Error::UnexpectedHugetlbfs { .. }
            | Error::FileTooShort { .. }
            | Error::Unaligned { .. }
            | Error::NotMapped { .. } => Code::InvalidArgument,
            Error::HugepagesUnavailable { .. }
            | Error::ReserveShort { .. }
            | Error::HostMemory { .. }
            | Error::HostAlloc { .. } => Code::Exhausted,
            Error::Lock { .. } => Code::Refused,
            Error::NoSuchPool { .. } | Error::NoSuchNode { .. } => Code::NotFound,
            Error::NotContiguous { .. } | Error::PhysicalAddressHidden => Code::Unsupported,
            Error::NotPinnable { .. } => Code::Refused,
            // A system call failed, or the kernel's answer (a page not resident, on another
            // node, not present; a sysfs file not a number) is not what it should be.
            Error::Memfd { .. }
            | Error::OpenFile { .. }
            | Error::Stat { .. }
            | Error::Truncate { .. }
            | Error::Seal { .. }
            | Error::Map { .. }
            | Error::Bind { .. }
            | Error::Populate { .. }
            | Error::Mincore { .. }
            | Error::NotResident { .. }
            | Error::NodeQuery { .. }
            | Error::PageNode { .. }
            | Error::WrongNode { .. }
            | Error::Pagemap { .. }
            | Error::PageNotPresent { .. }
            | Error::SysfsRead { .. }
            | Error::SysfsParse { .. }
            | Error::SysfsWrite { .. } => Code::System,
        }
    }
}
