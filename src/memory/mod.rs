//! Pinned host memory: hugepage regions, page sizes, mlock, NUMA placement, physical addresses.
//!
//! A [`Region`] is one `mmap` of 2 MiB or 1 GiB hugepages (or, when asked for explicitly, base
//! pages), pre-faulted, locked and optionally bound to a NUMA node, unmapped on drop. It is the
//! memory a device reads and writes by DMA, so this module never hands out `&[u8]` to it: the
//! [`dma`](crate::dma) module maps a region into a device's address space and gives volatile
//! handles to it.
//!
//! A region is anonymous, or backed by a file (a hugetlb memfd, or a file on a hugetlbfs mount) so
//! that a second process can map the same pages from the file descriptor
//! ([`Region::fd`], [`Region::from_fd`]).
//!
//! ```no_run
//! use userdma::memory::{PageSize, Region};
//!
//! # fn main() -> Result<(), userdma::memory::Error> {
//! let region = Region::builder(8 << 20).page_size(PageSize::Huge2M).memfd().build()?;
//! let pages = region.physical_pages()?; // needs CAP_SYS_ADMIN
//! println!("{} pages, first at {:#x}", pages.len(), pages.as_slice()[0]);
//! # Ok(())
//! # }
//! ```
//!
//! The hugepage pools themselves (how many pages of each size are reserved and free, per NUMA
//! node) are read and resized through [`hugepages`]; the NUMA nodes a region can be placed on are
//! listed by [`numa`].

use std::fmt;
use std::str::FromStr;

mod error;
pub mod hugepages;
mod keep;
pub mod numa;
mod pagemap;
mod region;
// Under Miri, the same calls over the interpreter's allocator (the file says why).
#[cfg_attr(miri, path = "shim_miri.rs")]
mod shim;

pub use self::error::{Error, MemlockLimit, ReserveHint};
pub use self::keep::keep_until_exit;
pub use self::pagemap::PhysicalPages;
pub use self::region::{Backing, Builder, Region};

/// Where sysfs is mounted on a running system; every sysfs reader takes its root as a parameter
/// so tests can point it at a fake tree.
pub const SYSFS_ROOT: &str = "/sys";

/// The size of the pages backing a [`Region`].
///
/// Hugepages are the default everywhere; [`PageSize::Base`] (the CPU's base page, 4 KiB on x86-64)
/// is used only when a caller asks for it, because a base-page region is not physically contiguous
/// beyond one page and costs the IOMMU and TLB one entry per 4 KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageSize {
    /// The CPU's base page size (4 KiB on x86-64), from `sysconf(_SC_PAGESIZE)`.
    Base,
    /// 2 MiB hugepages (`MAP_HUGE_2MB`, `hugepages-2048kB`).
    Huge2M,
    /// 1 GiB hugepages (`MAP_HUGE_1GB`, `hugepages-1048576kB`).
    Huge1G,
}

impl PageSize {
    /// The hugepage sizes, smallest first.
    pub const HUGE: [PageSize; 2] = [PageSize::Huge2M, PageSize::Huge1G];

    /// The page size in bytes.
    pub fn bytes(self) -> usize {
        match self {
            PageSize::Base => base_page_size(),
            PageSize::Huge2M => 2 << 20,
            PageSize::Huge1G => 1 << 30,
        }
    }

    /// Whether this is a hugepage size (served from the kernel's hugetlb pools).
    pub fn is_huge(self) -> bool {
        self != PageSize::Base
    }

    /// The hugepage size with exactly `bytes` bytes, if there is one.
    pub fn from_huge_bytes(bytes: u64) -> Option<PageSize> {
        PageSize::HUGE
            .into_iter()
            .find(|size| u64::try_from(size.bytes()) == Ok(bytes))
    }

    /// The directory name of this size's pool in sysfs (`hugepages-2048kB`); `None` for base pages.
    pub fn sysfs_dir(self) -> Option<String> {
        use userdma_sys::mman::{HUGEPAGES_DIR_PREFIX, HUGEPAGES_DIR_SUFFIX};
        self.is_huge().then(|| {
            format!(
                "{HUGEPAGES_DIR_PREFIX}{}{HUGEPAGES_DIR_SUFFIX}",
                self.bytes() >> 10
            )
        })
    }

    /// The short name the command-line tool accepts and prints: `4K`, `2M`, `1G`.
    pub fn label(self) -> &'static str {
        match self {
            PageSize::Base => "4K",
            PageSize::Huge2M => "2M",
            PageSize::Huge1G => "1G",
        }
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PageSize::Base => write!(f, "{} KiB base", self.bytes() >> 10),
            PageSize::Huge2M => f.write_str("2 MiB"),
            PageSize::Huge1G => f.write_str("1 GiB"),
        }
    }
}

impl FromStr for PageSize {
    type Err = ParsePageSizeError;

    /// Accepts `4K`/`base`, `2M`/`2MB`/`2MiB`/`2048kB`, `1G`/`1GB`/`1GiB`/`1048576kB`
    /// (case-insensitive).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "4k" | "4kb" | "4kib" | "base" => Ok(PageSize::Base),
            "2m" | "2mb" | "2mib" | "2048k" | "2048kb" => Ok(PageSize::Huge2M),
            "1g" | "1gb" | "1gib" | "1048576k" | "1048576kb" => Ok(PageSize::Huge1G),
            _ => Err(ParsePageSizeError {
                text: text.to_owned(),
            }),
        }
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for PageSize {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.label())
    }
}

/// A page size name that is not one of `4K`, `2M`, `1G`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown page size {text:?}: use 2M or 1G (or 4K for base pages)")]
pub struct ParsePageSizeError {
    /// The text that was given.
    pub text: String,
}

// Every Linux target userdma supports has a usize of at most 64 bits, so `u64_of` is lossless.
const _: () = assert!(usize::BITS <= u64::BITS);

/// A length or offset as a `u64` (lossless: see the assertion above).
#[inline]
pub(crate) const fn u64_of(value: usize) -> u64 {
    value as u64
}

/// The CPU's base page size.
pub(crate) fn base_page_size() -> usize {
    let size = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE);
    // A failing sysconf(_SC_PAGESIZE) does not exist on Linux; 4 KiB is every Linux target's
    // smallest page, so it is the safe assumption if it ever did.
    size.ok()
        .flatten()
        .and_then(|s| usize::try_from(s).ok())
        .unwrap_or(4096)
}

/// A zeroed heap buffer of `len` bytes for `what`, or [`Error::HostAlloc`] when the host's
/// allocator cannot give it: for buffers sized by a caller (a model's tensors, a request),
/// where a failed allocation must be an error, never the process aborted.
///
/// # Errors
/// [`Error::HostAlloc`].
pub fn zeroed(len: u64, what: &'static str) -> Result<Vec<u8>, Error> {
    let fail = || Error::HostAlloc { what, len };
    let n = usize::try_from(len).map_err(|_| fail())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| fail())?;
    v.resize(n, 0);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_parses_cli_spellings() {
        assert_eq!("2M".parse::<PageSize>().unwrap(), PageSize::Huge2M);
        assert_eq!("2048kB".parse::<PageSize>().unwrap(), PageSize::Huge2M);
        assert_eq!("1g".parse::<PageSize>().unwrap(), PageSize::Huge1G);
        assert_eq!("1GiB".parse::<PageSize>().unwrap(), PageSize::Huge1G);
        assert_eq!("4K".parse::<PageSize>().unwrap(), PageSize::Base);
        let err = "3M".parse::<PageSize>().unwrap_err();
        assert!(err.to_string().contains("use 2M or 1G"), "{err}");
    }

    #[test]
    fn page_size_names_its_sysfs_pool() {
        assert_eq!(PageSize::Huge2M.sysfs_dir().unwrap(), "hugepages-2048kB");
        assert_eq!(PageSize::Huge1G.sysfs_dir().unwrap(), "hugepages-1048576kB");
        assert_eq!(PageSize::Base.sysfs_dir(), None);
        assert_eq!(PageSize::from_huge_bytes(2 << 20), Some(PageSize::Huge2M));
        assert_eq!(PageSize::from_huge_bytes(1 << 30), Some(PageSize::Huge1G));
        assert_eq!(PageSize::from_huge_bytes(4096), None);
    }

    #[test]
    fn invalid_length_error_names_the_multiple() {
        let err = Error::InvalidLength {
            len: 3 << 20,
            page_size: PageSize::Huge2M,
            suggested: 4 << 20,
        };
        let text = err.to_string();
        assert!(text.contains("multiple of 2097152 bytes"), "{text}");
        assert!(text.contains("4194304"), "{text}");
    }

    #[test]
    fn reserve_hint_renders_both_commands() {
        let hint = ReserveHint {
            path: "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages".into(),
            count: 8,
            page_size: PageSize::Huge2M,
            node: Some(1),
        };
        assert_eq!(
            hint.to_string(),
            "`echo 8 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages` or \
             `userdma hugepages --reserve 8 --size 2M --node 1` as root"
        );
    }
}
