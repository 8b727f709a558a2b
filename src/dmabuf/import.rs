//! Import: a dma-buf into a device's DMA space, by the one way the space and the kernel allow.

use std::sync::Arc;

use super::{origin, DmaBuf, Error};
use crate::dma::{self, Access, Iova, Kind, Mapping, Space};

/// How an [`Imported`] dma-buf reached the DMA space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A dma-buf this process exported ([`super::export`]): the region behind it is mapped
    /// directly (the same pages, no copy), on every kind of space.
    Origin,
    /// An mmap of the dma-buf mapped by address: the software IOMMU (a simulated device reads
    /// and writes through the CPU mapping), and VFIO type1 when the exporter's pages are ones
    /// type1 maps (it refuses ordinary memory behind a dma-buf's mapping).
    Address,
    /// By file descriptor, iommufd's `IOMMU_IOAS_MAP_FILE` (dma-bufs from Linux 6.19, from
    /// exporters that allow it).
    File,
}

/// A dma-buf in a device's DMA space: the mapping, and where the dma-buf's bytes are in it.
#[derive(Debug)]
pub struct Imported {
    mapping: Mapping,
    offset: usize,
    len: usize,
    via: Via,
}

impl Imported {
    /// The IOVA of the dma-buf's first byte.
    pub fn iova(&self) -> Iova {
        self.iova_at(0).expect("an import covers its first byte")
    }

    /// The IOVA of byte `offset` of the dma-buf, `None` past its end.
    pub fn iova_at(&self, offset: usize) -> Option<Iova> {
        if offset >= self.len {
            return None;
        }
        self.mapping.iova(self.offset + offset)
    }

    /// The dma-buf's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How it was mapped.
    pub fn via(&self) -> Via {
        self.via
    }

    /// The mapping (of the whole origin region for [`Via::Origin`]).
    pub fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// The mapping, owned (unmapped when dropped); the dma-buf's bytes are
    /// [`Imported::offset`]`..+`[`Imported::len`] of it.
    pub fn into_mapping(self) -> Mapping {
        self.mapping
    }

    /// Where the dma-buf's first byte is in [`Imported::mapping`].
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The bytes of the dma-buf, for the CPU (volatile access; a device may write them).
    ///
    /// # Errors
    /// Never for a live import (the range is inside the mapping).
    pub fn slice(&self) -> Result<dma::Slice<'_>, dma::Error> {
        self.mapping.slice_at(self.offset, self.len)
    }
}

/// Maps `buf` into `space` for the device to use as `access` says.
///
/// - A dma-buf this process exported is mapped as the memory behind it ([`Via::Origin`]).
/// - On iommufd, by file descriptor ([`Via::File`], `IOMMU_IOAS_MAP_FILE`).
/// - On VFIO type1 and the software IOMMU, by the address of an mmap of it ([`Via::Address`]).
///
/// # Errors
/// [`Error::NotImportable`] naming why (the kernel feature and release that would do it) and
/// the refusal of the way tried; [`Error::Dma`] when mapping an origin region fails.
pub fn import(space: &dyn Space, buf: &DmaBuf, access: Access) -> Result<Imported, Error> {
    if let Some(origin) = origin(buf) {
        if let Some((offset, len)) = origin.contiguous() {
            let mapping = space.map_with(Arc::clone(&origin.region), access)?;
            return Ok(Imported {
                mapping,
                offset,
                len,
                via: Via::Origin,
            });
        }
    }
    let refuse = |why: &'static str, source: Option<Box<dma::Error>>| Error::NotImportable {
        space: space.kind(),
        exporter: buf
            .exporter()
            .unwrap_or_else(|| "an unknown exporter".to_owned()),
        len: buf.len(),
        why,
        source,
    };
    let view = || buf.cpu_view().map(Arc::new);
    let (mapped, via, why) = match space.kind() {
        Kind::Physical => {
            return Err(refuse(
                "a physical-address space needs the pages' physical addresses, which a \
                 dma-buf does not give user space; use an IOMMU (VFIO type1 or iommufd)",
                None,
            ))
        }
        Kind::Iommufd => (
            space.map_file(view()?, access),
            Via::File,
            "iommufd maps a dma-buf only by file descriptor (IOMMU_IOAS_MAP_FILE takes \
             dma-bufs from Linux 6.19, and only from exporters that allow it, such as \
             vfio-pci's MMIO), and refuses to pin a dma-buf's mmap by address; export the \
             buffer from userdma instead (a userdma export imports as its own memory) or use \
             VFIO type1 for exporters of device memory",
        ),
        Kind::Type1 => (
            space.map_with(view()?, access),
            Via::Address,
            "VFIO type1 pins a dma-buf's mmap only where the exporter maps device memory (a \
             PCI BAR); ordinary pages behind it (udmabuf, the system dma-heap) are refused; \
             export the buffer from userdma instead (a userdma export imports as its own \
             memory), or on iommufd a kernel with IOMMU_IOAS_MAP_FILE for dma-bufs (6.19)",
        ),
        Kind::SoftIommu => (
            space.map_with(view()?, access),
            Via::Address,
            "the exporter refused the CPU mapping the software IOMMU works through",
        ),
    };
    match mapped {
        Ok(mapping) => Ok(Imported {
            mapping,
            offset: 0,
            len: buf.len(),
            via,
        }),
        Err(source) => Err(refuse(why, Some(Box::new(source)))),
    }
}
