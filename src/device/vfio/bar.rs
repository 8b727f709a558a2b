//! A BAR of a VFIO device as an [`mmio::Backend`]: the parts the kernel lets user space map
//! (the whole region, or its sparse-mmap areas) are mapped and reached by volatile loads and
//! stores ([`mmio::Direct`]); everything else (the MSI-X table of a BAR the kernel protects, a
//! BAR that cannot be mapped at all, I/O port BARs) is reached by `pread`/`pwrite` on the device
//! fd at the region's offset ([`mmio::FileBacked`]).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use super::info::RegionInfo;
use super::kernel::Mmap;
use crate::device::vfio::Error as VfioError;
use crate::device::Error;
use crate::mmio::{self, Backend, Direct, FileBacked, Width};
use crate::pci::Bdf;

/// One mapped area of the BAR.
#[derive(Debug)]
struct Area {
    /// Offset of the first byte in the BAR.
    start: usize,
    /// Offset past the last byte.
    end: usize,
    /// Declared before `map`, so dropped before the mapping it points into.
    direct: Direct,
    map: Mmap,
}

/// A BAR: mapped areas, and the device fd for the rest.
#[derive(Debug)]
pub(crate) struct Bar {
    len: usize,
    areas: Vec<Area>,
    file: FileBacked<Arc<OwnedFd>>,
}

impl Bar {
    /// Maps what `info` allows of the region from `device`.
    pub(crate) fn new(bdf: Bdf, device: &Arc<OwnedFd>, info: &RegionInfo) -> Result<Bar, Error> {
        let len = usize::try_from(info.size).map_err(|_| VfioError::MapBar {
            bdf,
            index: info.index,
            offset: 0,
            len: info.size,
            source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
        })?;
        let mut areas = Vec::new();
        for area in info.mmap_areas() {
            let fail = |source| VfioError::MapBar {
                bdf,
                index: info.index,
                offset: area.offset,
                len: area.size,
                source,
            };
            let bounds = usize::try_from(area.offset)
                .ok()
                .zip(usize::try_from(area.size).ok());
            let Some((start, size)) = bounds else {
                return Err(fail(std::io::Error::from(std::io::ErrorKind::InvalidInput)).into());
            };
            let file_offset = info
                .offset
                .checked_add(area.offset)
                .ok_or_else(|| fail(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
            let map = Mmap::shared(device.as_fd(), file_offset, size).map_err(fail)?;
            // SAFETY: `map` is a fresh shared read-write mapping of `size` bytes that this
            // `Area` owns and drops after `direct` (field order); nothing makes a reference to
            // its bytes: they are touched only by `Direct`'s volatile accesses.
            let direct = unsafe { Direct::new(map.as_ptr(), map.len()) }
                .map_err(|_| fail(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
            areas.push(Area {
                start,
                end: start.saturating_add(size),
                direct,
                map,
            });
        }
        areas.sort_by_key(|a| a.start);
        Ok(Bar {
            len,
            areas,
            file: FileBacked::new(Arc::clone(device), info.offset, len),
        })
    }

    /// Replaces every mapped area by memory that reads all-ones ([`Mmap::cut_off`]): the BAR
    /// no longer holds the device file, and accesses reach nothing. The part served by the
    /// device fd fails once the fd is released.
    pub(crate) fn cut_off(&self) -> std::io::Result<()> {
        self.areas.iter().try_for_each(|a| a.map.cut_off())
    }

    /// How many bytes are mapped (the rest goes through the device fd).
    pub(crate) fn mapped_len(&self) -> usize {
        self.areas.iter().map(|a| a.end - a.start).sum()
    }

    /// The mapped area holding `offset..offset + width`, and the offset in it.
    fn area(&self, offset: usize, width: Width) -> Option<(&Direct, usize)> {
        let end = offset.checked_add(width.bytes())?;
        self.areas
            .iter()
            .find(|a| a.start <= offset && end <= a.end)
            .map(|a| (&a.direct, offset - a.start))
    }
}

impl Backend for Bar {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&self, offset: usize, width: Width) -> Result<u64, mmio::Error> {
        mmio::check(offset, width, self.len)?;
        match self.area(offset, width) {
            Some((direct, at)) => direct.read(at, width),
            None => self.file.read(offset, width),
        }
    }

    fn write(&self, offset: usize, width: Width, value: u64) -> Result<(), mmio::Error> {
        mmio::check(offset, width, self.len)?;
        match self.area(offset, width) {
            Some((direct, at)) => direct.write(at, width, value),
            None => self.file.write(offset, width, value),
        }
    }
}
