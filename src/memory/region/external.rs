//! A [`Region`] over a file another driver exports (a dma-buf): mapped shared, its pages left to
//! the exporter (no populate, no residency check, no lock: an exporter's mmap may insert page
//! frames on fault, which `MADV_POPULATE_WRITE` and `mlock` do not take), unmapped on drop.

use std::os::fd::{AsFd, OwnedFd};

use super::super::shim::{self, Share};
use super::super::{Error, PageSize};
use super::Region;

impl Region {
    /// Maps the first `len` bytes of `file` (a dma-buf, whose size the caller read) shared and
    /// read-write, as a region of base pages that owns `file` ([`Region::fd`]). The exporter
    /// gives the pages on first touch; nothing is faulted in, locked or checked here.
    ///
    /// # Errors
    /// [`Error::InvalidLength`] for a length that is not a positive multiple of the base page;
    /// [`Error::Map`] when the exporter refuses the mapping.
    pub(crate) fn of_exported_file(file: OwnedFd, len: usize) -> Result<Region, Error> {
        let page_size = PageSize::Base;
        super::whole_pages(len, page_size)?;
        // SAFETY: `file` is open and the caller read its size as at least `len`; the mapping
        // is fresh and becomes the Region's, which unmaps it once on drop.
        let ptr =
            unsafe { shim::mmap(len, page_size, Share::SharedFile, Some(file.as_fd()), false) }
                .map_err(|source| Error::Map {
                    len,
                    page_size,
                    source,
                })?;
        Ok(Region {
            ptr,
            len,
            page_size,
            fd: Some(file),
            node: None,
            locked: false,
            owned: true,
        })
    }
}
