//! [`Physical`]: the DMA address space of a device without an IOMMU in the way (UIO, VFIO in
//! no-IOMMU mode). The device uses physical addresses, read from `/proc/self/pagemap` (which
//! needs CAP_SYS_ADMIN), so every page of a mapped region must be physically contiguous and
//! within the device's DMA mask. Nothing is programmed anywhere: mapping only looks addresses up,
//! and pages physically adjacent to each other merge into one contiguous piece.
//!
//! Physical addresses are stable only while the kernel does not migrate the pages; hugetlb pages
//! are not moved by ordinary reclaim or compaction, which is why hugepages are the memory to use
//! here (the same assumption DPDK and SPDK make).

use std::sync::Arc;

use super::iova::mask_of;
use super::mapping::{Backend, Counters, Piece};
use super::{Error, Kind, Mapping, Space, Stats};
use crate::memory::u64_of;
use crate::memory::Region;

/// The counters of a physical space; its mappings keep them alive.
#[derive(Debug, Default)]
struct Inner {
    mask_bits: u32,
    counters: Counters,
}

impl Backend for Inner {
    fn unmap(&self, region: &Region, _pieces: &[Piece]) -> Result<(), Error> {
        // No IOMMU, so nothing to undo: the device keeps reaching the pages until the region is
        // unmapped and its hugepages go back to the pool.
        self.counters.unmapped(u64_of(region.len()));
        Ok(())
    }
}

/// The DMA address space "physical addresses", for UIO and no-IOMMU VFIO. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Physical {
    inner: Arc<Inner>,
}

impl Physical {
    /// A physical space for a device with a `dma_mask_bits`-bit DMA mask.
    pub fn new(dma_mask_bits: u32) -> Result<Physical, Error> {
        mask_of(dma_mask_bits)?;
        Ok(Physical {
            inner: Arc::new(Inner {
                mask_bits: dma_mask_bits,
                counters: Counters::default(),
            }),
        })
    }

    fn try_map(&self, region: &Region) -> Result<Vec<Piece>, Error> {
        let mask = mask_of(self.inner.mask_bits)?;
        let pages = region
            .physical_pages()
            .map_err(|source| Error::Physical { source })?;
        let page_bytes = region.page_size().bytes();
        let step = u64_of(page_bytes);
        let mut pieces: Vec<Piece> = Vec::new();
        for (index, &addr) in pages.as_slice().iter().enumerate() {
            let offset = index * page_bytes;
            let within = addr.checked_add(step - 1).is_some_and(|last| last <= mask);
            if !within {
                return Err(Error::BeyondMask {
                    offset,
                    addr,
                    mask_bits: self.inner.mask_bits,
                });
            }
            match pieces.last_mut() {
                Some(last) if last.iova.checked_add(last.len) == Some(addr) => last.len += step,
                _ => pieces.push(Piece {
                    iova: addr,
                    offset,
                    len: step,
                }),
            }
        }
        Ok(pieces)
    }
}

impl Space for Physical {
    /// Looks up the region's physical pages; refuses it if a page is not physically contiguous
    /// (base pages always are; a hugepage must be), not resident, above the DMA mask, or if the
    /// process may not see physical addresses.
    fn map(&self, region: Arc<Region>) -> Result<Mapping, Error> {
        #[cfg(feature = "tracing")]
        let _span = super::mapping::map_span(Kind::Physical, &region, super::Access::ReadWrite);
        let placed = self.try_map(&region);
        let inner = &self.inner;
        Mapping::from_placement(region, placed, Kind::Physical, &inner.counters, inner)
    }

    fn stats(&self) -> Stats {
        self.inner.counters.snapshot()
    }

    fn kind(&self) -> Kind {
        Kind::Physical
    }

    fn dma_mask_bits(&self) -> u32 {
        self.inner.mask_bits
    }
}
