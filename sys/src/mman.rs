//! Pinned and huge memory: hugetlb `mmap`/`memfd_create` flags, `mbind` policies, pagemap entries and
//! the hugepage sysfs files.
//!
//! * `mmap(MAP_HUGETLB | map_huge(shift))` and `memfd_create(MFD_HUGETLB | mfd_huge(shift))` ask for
//!   pages of `1 << shift` bytes: the page size's log2 goes in bits 26-31 of the flags
//!   (`<asm-generic/hugetlb_encode.h>`). 0 there means the system's default huge page size.
//! * `mbind(addr, len, mode, nodemask, maxnode, flags)` (`<linux/mempolicy.h>`) places pages on NUMA
//!   nodes: modes `MPOL_*`, flags `MPOL_MF_*`.
//! * `/proc/self/pagemap` holds one little-endian `u64` per virtual page: bit 63 present, bit 62
//!   swapped, bits 0-54 the page frame number (zero unless the reader has `CAP_SYS_ADMIN`). These bits
//!   are defined in fs/proc/task_mmu.c and documented in Documentation/admin-guide/mm/pagemap.rst; no
//!   uapi header has them.
//! * `/sys/kernel/mm/hugepages/hugepages-<size in kB>kB/` (and the same under each
//!   `/sys/devices/system/node/node<N>/hugepages/`) has one file per counter, [`NR_HUGEPAGES`] being
//!   the pool size root can write.

use libc::{c_int, c_uint};

// Architecture-specific values (MIPS, PowerPC, SPARC and Alpha differ), taken from libc per target.
pub use libc::{MAP_HUGETLB, MAP_LOCKED, MAP_POPULATE};
// `madvise`: MADV_POPULATE_READ/WRITE (Linux 5.14) fault pages in and fail with an error instead of
// SIGBUS when no huge page is free; MADV_DONTFORK keeps DMA memory out of a forked child.
pub use libc::{MADV_DONTFORK, MADV_POPULATE_READ, MADV_POPULATE_WRITE};
pub use libc::{MFD_ALLOW_SEALING, MFD_CLOEXEC, MFD_HUGETLB};
pub use libc::{MPOL_BIND, MPOL_DEFAULT, MPOL_INTERLEAVE, MPOL_LOCAL, MPOL_PREFERRED};

// ---- huge page size encoding ----

/// log2 of a 2 MiB page.
pub const HUGE_2MB_SHIFT: u32 = 21;
/// log2 of a 1 GiB page.
pub const HUGE_1GB_SHIFT: u32 = 30;

/// Bit position of the page size's log2 in `mmap` flags.
pub const MAP_HUGE_SHIFT: c_int = 26;
/// Mask of the page size's log2 (after shifting down by [`MAP_HUGE_SHIFT`]).
pub const MAP_HUGE_MASK: c_int = 0x3f;
/// Bit position of the page size's log2 in `memfd_create` flags.
pub const MFD_HUGE_SHIFT: c_uint = 26;
/// Mask of the page size's log2 (after shifting down by [`MFD_HUGE_SHIFT`]).
pub const MFD_HUGE_MASK: c_uint = 0x3f;

/// The `mmap` flag bits that select huge pages of `1 << page_shift` bytes (`HUGETLB_FLAG_ENCODE`).
///
/// `None` if `page_shift` does not fit the 6-bit field (above 63).
pub const fn map_huge(page_shift: u32) -> Option<c_int> {
    if page_shift > MAP_HUGE_MASK as u32 {
        return None;
    }
    // page_shift <= 63, so the value fits in the top 6 bits of 32; the kernel reads the flags as an
    // unsigned int, so the cast to c_int keeps the bit pattern (it is negative for shifts >= 32).
    Some((page_shift << MAP_HUGE_SHIFT) as c_int)
}

/// The `memfd_create` flag bits that select huge pages of `1 << page_shift` bytes.
///
/// `None` if `page_shift` does not fit the 6-bit field (above 63).
pub const fn mfd_huge(page_shift: u32) -> Option<c_uint> {
    if page_shift > MFD_HUGE_MASK {
        return None;
    }
    Some(page_shift << MFD_HUGE_SHIFT)
}

/// Unwraps an encoding of a shift known to be valid, at compile time.
const fn known<T: Copy>(encoded: Option<T>) -> T {
    match encoded {
        Some(v) => v,
        None => panic!("huge page shift out of range"),
    }
}

/// `mmap` flags for 2 MiB huge pages (with [`MAP_HUGETLB`]).
pub const MAP_HUGE_2MB: c_int = known(map_huge(HUGE_2MB_SHIFT));
/// `mmap` flags for 1 GiB huge pages (with [`MAP_HUGETLB`]).
pub const MAP_HUGE_1GB: c_int = known(map_huge(HUGE_1GB_SHIFT));
/// `memfd_create` flags for 2 MiB huge pages (with [`MFD_HUGETLB`]).
pub const MFD_HUGE_2MB: c_uint = known(mfd_huge(HUGE_2MB_SHIFT));
/// `memfd_create` flags for 1 GiB huge pages (with [`MFD_HUGETLB`]).
pub const MFD_HUGE_1GB: c_uint = known(mfd_huge(HUGE_1GB_SHIFT));

/// `statfs` `f_type` of a hugetlbfs mount (`<linux/magic.h>`).
pub const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;

// ---- NUMA placement (mbind / set_mempolicy) ----

/// `mbind` mode: prefer the nodes given, fall back to any (Linux 5.15).
pub const MPOL_PREFERRED_MANY: c_int = 5;
/// `mbind` flag: fail with `EIO` if existing pages do not follow the policy.
pub const MPOL_MF_STRICT: c_uint = 1 << 0;
/// `mbind` flag: move this process's existing pages to follow the policy.
pub const MPOL_MF_MOVE: c_uint = 1 << 1;
/// `mbind` flag: move every existing page, even shared ones (needs `CAP_SYS_NICE`).
pub const MPOL_MF_MOVE_ALL: c_uint = 1 << 2;

// ---- /proc/<pid>/pagemap ----

/// The pagemap of the calling process.
pub const PAGEMAP_PATH: &str = "/proc/self/pagemap";
/// Size of one pagemap entry; entry `n` (for virtual page `n`) is at offset `n * PM_ENTRY_BYTES`.
pub const PM_ENTRY_BYTES: usize = 8;
/// Number of page frame number bits in an entry.
pub const PM_PFRAME_BITS: u32 = 55;
/// Page frame number, bits 0-54 (valid if [`PM_PRESENT`] is set and the reader has
/// `CAP_SYS_ADMIN`; zero otherwise).
#[doc(alias = "PM_PFN_MASK")]
pub const PM_PFRAME_MASK: u64 = (1 << PM_PFRAME_BITS) - 1;
/// The page was written since the soft-dirty bits were last cleared.
pub const PM_SOFT_DIRTY: u64 = 1 << 55;
/// The page is mapped only by this process.
pub const PM_MMAP_EXCLUSIVE: u64 = 1 << 56;
/// The page is file-backed or shared anonymous.
pub const PM_FILE: u64 = 1 << 61;
/// The page is swapped out (bits 0-54 then hold the swap type and offset).
pub const PM_SWAP: u64 = 1 << 62;
/// The page is present in RAM.
pub const PM_PRESENT: u64 = 1 << 63;

// ---- hugepage pools in sysfs ----

/// Directory of the system-wide huge page pools.
pub const HUGEPAGES_SYSFS_DIR: &str = "/sys/kernel/mm/hugepages";
/// Directory of the NUMA nodes; each `node<N>` has a `hugepages` directory like
/// [`HUGEPAGES_SYSFS_DIR`].
pub const NODE_SYSFS_DIR: &str = "/sys/devices/system/node";
/// Name of a node's hugepage pools directory under `node<N>`.
pub const NODE_HUGEPAGES_DIR: &str = "hugepages";
/// Prefix of a pool directory: `hugepages-<size in kB>kB`.
pub const HUGEPAGES_DIR_PREFIX: &str = "hugepages-";
/// Suffix of a pool directory: `hugepages-<size in kB>kB`.
pub const HUGEPAGES_DIR_SUFFIX: &str = "kB";
/// Pool file: persistent huge pages in the pool (root writes it to grow or shrink the pool).
pub const NR_HUGEPAGES: &str = "nr_hugepages";
/// Pool file: huge pages not yet allocated to anyone.
pub const FREE_HUGEPAGES: &str = "free_hugepages";
/// Pool file: huge pages reserved by mappings but not yet faulted in.
pub const RESV_HUGEPAGES: &str = "resv_hugepages";
/// Pool file: surplus huge pages above [`NR_HUGEPAGES`] (from overcommit).
pub const SURPLUS_HUGEPAGES: &str = "surplus_hugepages";
/// Pool file: how many surplus huge pages may be allocated on demand.
pub const NR_OVERCOMMIT_HUGEPAGES: &str = "nr_overcommit_hugepages";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_page_flags_match_the_kernel_encoding() {
        assert_eq!(MAP_HUGE_2MB, 21 << 26);
        assert_eq!(MAP_HUGE_1GB, 30 << 26);
        assert_eq!(MFD_HUGE_2MB, 0x5400_0000);
        assert_eq!(MFD_HUGE_1GB, 0x7800_0000);
        assert_eq!(map_huge(0), Some(0));
        assert_eq!(map_huge(63), Some((63u32 << 26) as c_int));
        assert_eq!(map_huge(64), None);
        assert_eq!(mfd_huge(64), None);
    }

    #[test]
    fn agrees_with_libc() {
        assert_eq!(MAP_HUGE_SHIFT, libc::MAP_HUGE_SHIFT);
        assert_eq!(MAP_HUGE_MASK, libc::MAP_HUGE_MASK);
        assert_eq!(MAP_HUGE_2MB, libc::MAP_HUGE_2MB);
        assert_eq!(MAP_HUGE_1GB, libc::MAP_HUGE_1GB);
        assert_eq!(MFD_HUGE_SHIFT, libc::MFD_HUGE_SHIFT);
        assert_eq!(MFD_HUGE_MASK, libc::MFD_HUGE_MASK);
        assert_eq!(MFD_HUGE_2MB, libc::MFD_HUGE_2MB);
        assert_eq!(MFD_HUGE_1GB, libc::MFD_HUGE_1GB);
    }

    #[test]
    fn pagemap_bits_do_not_overlap() {
        assert_eq!(PM_PFRAME_MASK, 0x007F_FFFF_FFFF_FFFF);
        let flags = [
            PM_SOFT_DIRTY,
            PM_MMAP_EXCLUSIVE,
            PM_FILE,
            PM_SWAP,
            PM_PRESENT,
        ];
        for (i, a) in flags.iter().enumerate() {
            assert_eq!(a & PM_PFRAME_MASK, 0);
            for b in &flags[i + 1..] {
                assert_eq!(a & b, 0);
            }
        }
    }
}
