//! Memory the caller owns as a [`Region`] ([`Region::borrowed`]): any page-aligned range this
//! process has mapped writable (anonymous, a shared file, hugetlb), checked, faulted in, and
//! left mapped when the region goes; its lifetime as DMA memory is the region's (a
//! [`dma::Mapping`](crate::dma::Mapping) of it holds it).

use std::ptr::NonNull;

use super::super::{shim, Error, PageSize};
use super::Region;
use crate::memory::u64_of;

impl Region {
    /// The caller's memory `[ptr, ptr + len)` as a region, to map into a device's DMA space
    /// ([`dma::Space::map`](crate::dma::Space::map)) like one this library made: `ptr` aligned
    /// to `page_size` (the size of the pages that back it: base pages, or the hugetlb size of
    /// a hugetlb mapping), `len` a positive multiple of it. Every page is faulted in for
    /// writing now (`MADV_POPULATE_WRITE`, Linux 5.14), which also proves the range is memory
    /// a device may be given: mapped, writable, and not a device or `PROT_NONE` mapping. The
    /// region does not unmap the memory when dropped, and its contents stay as they are.
    ///
    /// # Errors
    /// [`Error::InvalidLength`] for a length that is not a positive multiple of the page size;
    /// [`Error::Unaligned`] for a start that is not page-aligned; [`Error::NotMapped`] when part
    /// of the range is not mapped in this process; [`Error::NotPinnable`] when it cannot be
    /// faulted in for writing (read-only, `PROT_NONE`, a device mapping, or a kernel before
    /// 5.14).
    ///
    /// # Safety
    /// The range stays mapped, and is not remapped or unmapped, until this region and
    /// everything holding it (its DMA mappings, pools carved from them, their buffers) are
    /// dropped; and while a device may access it, the caller makes no Rust reference to it (use
    /// the raw pointer, or the region's [`dma::Slice`](crate::dma::Slice)).
    pub unsafe fn borrowed(
        ptr: NonNull<u8>,
        len: usize,
        page_size: PageSize,
    ) -> Result<Region, Error> {
        super::whole_pages(len, page_size)?;
        let page = page_size.bytes();
        let addr = ptr.as_ptr() as usize;
        if addr % page != 0 {
            return Err(Error::Unaligned {
                addr: u64_of(addr),
                page_size,
            });
        }
        if addr.checked_add(len).is_none() {
            return Err(Error::NotMapped {
                addr: u64_of(addr),
                len,
            });
        }
        // SAFETY: mincore reads nothing of the range and changes nothing; it fails with ENOMEM
        // where the range is not mapped, which is what is checked here.
        if let Err(source) = unsafe { shim::mincore(ptr, len) } {
            return Err(if source.raw_os_error() == Some(libc::ENOMEM) {
                Error::NotMapped {
                    addr: u64_of(addr),
                    len,
                }
            } else {
                Error::Mincore { source }
            });
        }
        // SAFETY: the caller's promise: the range is theirs and stays mapped; populating for
        // writing faults pages in without changing their contents, and fails (changing
        // nothing) on a mapping that is not writable.
        if let Err(source) = unsafe { shim::populate_write(ptr, len) } {
            return Err(Error::NotPinnable {
                addr: u64_of(addr),
                len,
                source,
            });
        }
        Ok(Region {
            ptr,
            len,
            page_size,
            fd: None,
            node: None,
            locked: false,
            owned: false,
        })
    }

    /// Whether the region made its mapping (false for the caller's memory,
    /// [`Region::borrowed`], which it leaves mapped).
    pub fn is_owned(&self) -> bool {
        self.owned
    }
}
