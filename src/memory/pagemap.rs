//! Physical addresses of a region's pages from `/proc/self/pagemap`, with a contiguity check.
//!
//! pagemap holds one 64-bit entry per base page of the process's address space: bit 63 "present",
//! bits 0–54 the page frame number (PFN). Without CAP_SYS_ADMIN the kernel reports PFN 0.
//! A hugepage is one physical block, so its base pages must have consecutive PFNs; a region is
//! usable for physical-address DMA only if that holds for every page.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::u64_of;
use super::{base_page_size, Error, PageSize};

use userdma_sys::mman::{PM_ENTRY_BYTES as ENTRY_BYTES, PM_PFRAME_MASK, PM_PRESENT};

/// The current process's pagemap.
pub(super) use userdma_sys::mman::PAGEMAP_PATH as SELF_PAGEMAP;

/// Entries read per `pread`: 64 KiB of entries (256 MiB of base pages) at a time.
const ENTRIES_PER_READ: usize = 8192;

/// One decoded pagemap entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Bit 63.
    pub(crate) present: bool,
    /// Bits 0–54 (0 when hidden from an unprivileged reader).
    pub(crate) pfn: u64,
}

/// Decodes a raw pagemap entry.
pub(crate) fn decode(raw: u64) -> Entry {
    Entry {
        present: raw & PM_PRESENT != 0,
        pfn: raw & PM_PFRAME_MASK,
    }
}

/// The physical address of each page of a region, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhysicalPages {
    page_size: PageSize,
    page_bytes: usize,
    addrs: Box<[u64]>,
}

impl PhysicalPages {
    /// Builds the table from per-page physical addresses. Used by [`Region::physical_pages`]
    /// and by tests that need a table without CAP_SYS_ADMIN.
    ///
    /// [`Region::physical_pages`]: super::Region::physical_pages
    pub fn new(page_size: PageSize, addrs: Vec<u64>) -> PhysicalPages {
        PhysicalPages {
            page_size,
            page_bytes: page_size.bytes(),
            addrs: addrs.into_boxed_slice(),
        }
    }

    /// The page size.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// The number of pages.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Whether there are no pages.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// The physical address of each page, in order.
    pub fn as_slice(&self) -> &[u64] {
        &self.addrs
    }

    /// The physical address of the byte at `offset` in the region (O(1)); `None` past the end.
    pub fn addr_of(&self, offset: usize) -> Option<u64> {
        let page = self.addrs.get(offset / self.page_bytes)?;
        page.checked_add(u64_of(offset % self.page_bytes))
    }
}

/// Reads the physical address of each `page_size` page of `[addr, addr + len)` from the pagemap
/// file at `path`, checking that every page is present and physically contiguous.
pub(super) fn physical_pages(
    path: &Path,
    addr: usize,
    len: usize,
    page_size: PageSize,
) -> Result<PhysicalPages, Error> {
    let pagemap_error = |source: io::Error| Error::Pagemap {
        path: path.to_owned(),
        source,
    };
    let file = File::open(path).map_err(pagemap_error)?;
    let base = base_page_size();
    let base_u64 = u64_of(base);
    let subpages = page_size.bytes() / base;
    let first_index = addr / base;
    let entries = len / base;
    let mut addrs = Vec::with_capacity(len / page_size.bytes());
    let mut buf = vec![0u8; ENTRIES_PER_READ.min(entries) * ENTRY_BYTES];
    let mut index = 0;
    // PFN of the current page's first base page.
    let mut page_first_pfn = 0;
    while index < entries {
        let count = (entries - index).min(ENTRIES_PER_READ);
        let chunk = &mut buf[..count * ENTRY_BYTES];
        let file_offset = u64_of((first_index + index) * ENTRY_BYTES);
        file.read_exact_at(chunk, file_offset)
            .map_err(pagemap_error)?;
        for (i, raw) in chunk.chunks_exact(ENTRY_BYTES).enumerate() {
            let raw = u64::from_ne_bytes(
                raw.try_into()
                    .map_err(|_| pagemap_error(io::Error::from(io::ErrorKind::UnexpectedEof)))?,
            );
            let at = index + i;
            let entry = decode(raw);
            if !entry.present {
                return Err(Error::PageNotPresent {
                    offset: at * base,
                    entry: raw,
                });
            }
            if entry.pfn == 0 {
                return Err(Error::PhysicalAddressHidden);
            }
            let subpage = at % subpages;
            if subpage == 0 {
                page_first_pfn = entry.pfn;
                addrs.push(
                    entry
                        .pfn
                        .checked_mul(base_u64)
                        .ok_or(Error::PhysicalAddressHidden)?,
                );
            } else {
                let expected = page_first_pfn.wrapping_add(u64_of(subpage));
                if entry.pfn != expected {
                    return Err(Error::NotContiguous {
                        offset: (at - subpage) * base,
                        page_size,
                        subpage,
                        expected,
                        found: entry.pfn,
                    });
                }
            }
        }
        index += count;
    }
    Ok(PhysicalPages::new(page_size, addrs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn fake_pagemap(entries: &[u64]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        for entry in entries {
            file.write_all(&entry.to_ne_bytes()).unwrap();
        }
        file.flush().unwrap();
        file
    }

    #[test]
    fn decode_splits_present_bit_and_pfn() {
        let entry = decode(PM_PRESENT | (1 << 62) | 0x1234);
        assert!(entry.present);
        assert_eq!(entry.pfn, 0x1234);
        assert!(!decode(0x1234).present);
    }

    #[test]
    fn contiguous_hugepages_give_one_address_per_page() {
        let subpages = PageSize::Huge2M.bytes() / base_page_size();
        let mut entries = Vec::new();
        for first in [0x10_0000u64, 0x40_0000] {
            entries.extend((0..subpages as u64).map(|k| PM_PRESENT | (first + k)));
        }
        let file = fake_pagemap(&entries);
        let pages = physical_pages(file.path(), 0, 4 << 20, PageSize::Huge2M).unwrap();
        let base = base_page_size() as u64;
        assert_eq!(pages.as_slice(), &[0x10_0000 * base, 0x40_0000 * base]);
        assert_eq!(pages.addr_of(5), Some(0x10_0000 * base + 5));
        assert_eq!(pages.addr_of((2 << 20) + 7), Some(0x40_0000 * base + 7));
        assert_eq!(pages.addr_of(4 << 20), None);
    }

    #[test]
    fn broken_run_is_reported_with_its_subpage() {
        let subpages = PageSize::Huge2M.bytes() / base_page_size();
        let mut entries: Vec<u64> = (0..subpages as u64)
            .map(|k| PM_PRESENT | (0x500 + k))
            .collect();
        entries[3] = PM_PRESENT | 0x9999;
        let file = fake_pagemap(&entries);
        let err = physical_pages(file.path(), 0, 2 << 20, PageSize::Huge2M).unwrap_err();
        match err {
            Error::NotContiguous {
                offset,
                subpage,
                expected,
                found,
                ..
            } => {
                assert_eq!((offset, subpage, expected, found), (0, 3, 0x503, 0x9999));
            }
            other => panic!("unexpected error {other:?}"),
        }
    }

    #[test]
    fn zero_pfn_means_missing_capability() {
        let file = fake_pagemap(&[PM_PRESENT, PM_PRESENT]);
        let err = physical_pages(file.path(), 0, 2 * base_page_size(), PageSize::Base).unwrap_err();
        assert!(matches!(err, Error::PhysicalAddressHidden), "{err:?}");
        assert!(err.to_string().contains("CAP_SYS_ADMIN"));
    }

    #[test]
    fn absent_page_is_reported_with_its_offset() {
        let file = fake_pagemap(&[PM_PRESENT | 7, 0]);
        let err = physical_pages(file.path(), 0, 2 * base_page_size(), PageSize::Base).unwrap_err();
        assert!(
            matches!(err, Error::PageNotPresent { offset, .. } if offset == base_page_size()),
            "{err:?}"
        );
    }

    #[test]
    fn reads_at_the_entry_of_the_address() {
        let base = base_page_size();
        // Entries for pages 0..4; the region starts at page 2.
        let file = fake_pagemap(&[0, 0, PM_PRESENT | 77, PM_PRESENT | 5]);
        let pages = physical_pages(file.path(), 2 * base, 2 * base, PageSize::Base).unwrap();
        assert_eq!(pages.as_slice(), &[77 * base as u64, 5 * base as u64]);
    }

    #[test]
    fn short_pagemap_is_a_read_error() {
        let file = fake_pagemap(&[PM_PRESENT | 1]);
        let err = physical_pages(file.path(), 0, 2 * base_page_size(), PageSize::Base).unwrap_err();
        assert!(matches!(err, Error::Pagemap { .. }), "{err:?}");
    }
}
