use std::collections::BTreeMap;

use super::*;
use crate::memory::PageSize;

/// A type1 container as the kernel keeps it, reduced to what unmapping needs: its mappings
/// (IOVA to size) while it has its IOMMU, and `EINVAL` for every IOMMU ioctl once the last
/// group left it (`vfio_fops_unl_ioctl` with no `iommu_driver`). Clones share the state.
#[derive(Debug, Clone)]
struct Container(Arc<std::sync::Mutex<ContainerState>>);

#[derive(Debug)]
struct ContainerState {
    /// A group is attached and `VFIO_SET_IOMMU` done.
    has_iommu: bool,
    mappings: BTreeMap<u64, u64>,
    /// Fail the next unmap with this errno (before anything else is checked).
    fail_next_unmap: Option<i32>,
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl Container {
    fn new() -> Container {
        Container(Arc::new(std::sync::Mutex::new(ContainerState {
            has_iommu: true,
            mappings: BTreeMap::new(),
            fail_next_unmap: None,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ContainerState> {
        self.0.lock().unwrap()
    }

    /// What the kernel does when the container's last group leaves it (its device was
    /// removed): `vfio_group_detach_container` releases the type1 IOMMU, which unmaps and
    /// unpins every mapping, and the container has no IOMMU driver any more.
    fn lose_iommu(&self) {
        let mut state = self.state();
        state.mappings.clear();
        state.has_iommu = false;
    }
}

impl Type1Ioctl for Container {
    fn get_info(&self, buf: &mut [u8]) -> io::Result<()> {
        let state = self.state();
        let argsz = read_u32(buf, 0).and_then(|argsz| usize::try_from(argsz).ok());
        let header = size_of::<vfio_iommu_type1_info>();
        if !state.has_iommu || argsz.is_none_or(|argsz| argsz < header || argsz > buf.len()) {
            return Err(errno(libc::EINVAL));
        }
        // Base pages only, no capabilities.
        buf[4..8].copy_from_slice(&VFIO_IOMMU_INFO_PGSIZES.to_ne_bytes());
        buf[8..16].copy_from_slice(&u64_of(base_page_size()).to_ne_bytes());
        buf[16..24].fill(0);
        Ok(())
    }

    fn map_dma(&self, _vaddr: u64, iova: u64, size: u64) -> io::Result<()> {
        let mut state = self.state();
        if !state.has_iommu {
            return Err(errno(libc::EINVAL));
        }
        state.mappings.insert(iova, size);
        Ok(())
    }

    fn unmap_dma(&self, iova: u64, size: u64) -> io::Result<u64> {
        let mut state = self.state();
        if let Some(code) = state.fail_next_unmap.take() {
            return Err(errno(code));
        }
        if !state.has_iommu {
            return Err(errno(libc::EINVAL));
        }
        match state.mappings.get(&iova) {
            Some(&mapped) if mapped == size => {
                state.mappings.remove(&iova);
                Ok(size)
            }
            // type1v2 refuses to cut a mapping.
            Some(_) => Err(errno(libc::EINVAL)),
            None => Ok(0),
        }
    }
}

fn region(pages: usize) -> Arc<Region> {
    let region = Region::builder(pages * base_page_size())
        .page_size(PageSize::Base)
        .lock(false)
        .build();
    Arc::new(region.expect("a small base-page region"))
}

#[test]
fn unmaps_after_the_container_lost_its_iommu_are_done_not_errors() {
    let container = Container::new();
    let space = Type1::with_ioctl(container.clone(), 48).unwrap();
    let unmapped = space.map(region(2)).unwrap();
    let dropped = space.map(region(1)).unwrap();
    assert_eq!(container.state().mappings.len(), 2);

    // The device is hot-unplugged: the kernel detaches its group, the container's last.
    container.lose_iommu();

    // Both ways of unmapping: the mapping is gone, as asked.
    unmapped.unmap().expect("the kernel unmapped it already");
    drop(dropped);
    let stats = space.stats();
    assert_eq!(
        (
            stats.maps,
            stats.unmaps,
            stats.unmap_errors,
            stats.unmaps_after_removal
        ),
        (2, 2, 0, 2),
        "{stats:?}"
    );
    assert_eq!(stats.live_bytes, 0);
    assert!(stats.last_unmap_error.is_none(), "{stats:?}");
}

/// The kernel dropped the mappings (with the container's last IOMMU domain) and still has
/// the IOMMU: an unmap succeeds having unmapped nothing, and counts as done.
#[test]
fn unmaps_the_kernel_answers_with_nothing_unmapped_are_done_not_errors() {
    let container = Container::new();
    let space = Type1::with_ioctl(container.clone(), 48).unwrap();
    let unmapped = space.map(region(2)).unwrap();
    let dropped = space.map(region(1)).unwrap();
    container.state().mappings.clear();
    unmapped.unmap().expect("nothing was mapped there any more");
    drop(dropped);
    let stats = space.stats();
    assert_eq!(
        (
            stats.unmaps,
            stats.unmap_errors,
            stats.unmaps_after_removal,
            stats.live_bytes
        ),
        (2, 0, 2, 0),
        "{stats:?}"
    );
    // The space is still usable: a new mapping maps and unmaps as usual.
    let again = space.map(region(1)).unwrap();
    again.unmap().unwrap();
    let stats = space.stats();
    assert_eq!((stats.unmaps, stats.unmaps_after_removal), (3, 2));
}

#[test]
fn unmap_failures_on_a_container_with_its_iommu_stay_errors() {
    let container = Container::new();
    let space = Type1::with_ioctl(container.clone(), 48).unwrap();

    // EINVAL from a container that still answers: a real failure, the mapping stays.
    let mapping = space.map(region(2)).unwrap();
    let iova = mapping.iova(0).unwrap().raw();
    container.state().fail_next_unmap = Some(libc::EINVAL);
    let err = mapping.unmap().unwrap_err();
    let Error::UnmapFailed { source } = &err else {
        panic!("expected UnmapFailed, got {err:?}");
    };
    assert!(
        matches!(source.as_ref(), Error::Unmap { iova: at, source, .. }
            if *at == iova && source.raw_os_error() == Some(libc::EINVAL)),
        "{source:?}"
    );
    assert!(container.state().mappings.contains_key(&iova));
    let stats = space.stats();
    assert_eq!(
        (stats.unmaps, stats.unmap_errors, stats.unmaps_after_removal),
        (0, 1, 0),
        "{stats:?}"
    );
    assert!(stats.last_unmap_error.is_some());

    // A failure other than EINVAL is an error even from a container without its IOMMU.
    let mapping = space.map(region(1)).unwrap();
    container.lose_iommu();
    container.state().fail_next_unmap = Some(libc::EIO);
    drop(mapping);
    let stats = space.stats();
    assert_eq!(
        (stats.unmaps, stats.unmap_errors, stats.unmaps_after_removal),
        (0, 2, 0),
        "{stats:?}"
    );
}

/// A reply as the kernel lays it out: the info, then an IOVA-range capability (if `ranges`)
/// and a DMA-avail capability (if `avail`), chained in that order.
fn reply(pgsizes: u64, ranges: Option<&[(u64, u64)]>, avail: Option<u32>) -> Vec<u8> {
    let mut caps: Vec<Vec<u8>> = Vec::new();
    if let Some(ranges) = ranges {
        let mut cap = Vec::new();
        cap.extend_from_slice(&(VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE as u16).to_ne_bytes());
        cap.extend_from_slice(&1u16.to_ne_bytes());
        cap.extend_from_slice(&0u32.to_ne_bytes()); // next, patched below
        cap.extend_from_slice(&(ranges.len() as u32).to_ne_bytes());
        cap.extend_from_slice(&0u32.to_ne_bytes());
        for &(start, end) in ranges {
            cap.extend_from_slice(&start.to_ne_bytes());
            cap.extend_from_slice(&end.to_ne_bytes());
        }
        caps.push(cap);
    }
    if let Some(avail) = avail {
        let mut cap = Vec::new();
        cap.extend_from_slice(&(VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL as u16).to_ne_bytes());
        cap.extend_from_slice(&1u16.to_ne_bytes());
        cap.extend_from_slice(&0u32.to_ne_bytes());
        cap.extend_from_slice(&avail.to_ne_bytes());
        cap.extend_from_slice(&0u32.to_ne_bytes()); // pad to 8
        caps.push(cap);
    }
    let mut bytes = vec![0u8; 24];
    let mut flags = VFIO_IOMMU_INFO_PGSIZES;
    bytes[8..16].copy_from_slice(&pgsizes.to_ne_bytes());
    if !caps.is_empty() {
        flags |= VFIO_IOMMU_INFO_CAPS;
        bytes[16..20].copy_from_slice(&24u32.to_ne_bytes());
    }
    let count = caps.len();
    for (i, cap) in caps.into_iter().enumerate() {
        let at = bytes.len();
        bytes.extend_from_slice(&cap);
        if i + 1 < count {
            let next = (bytes.len() as u32).to_ne_bytes();
            bytes[at + 4..at + 8].copy_from_slice(&next);
        }
    }
    bytes[4..8].copy_from_slice(&flags.to_ne_bytes());
    let argsz = bytes.len() as u32;
    bytes[0..4].copy_from_slice(&argsz.to_ne_bytes());
    bytes
}

#[test]
fn parses_ranges_and_avail() {
    let bytes = reply(
        0x4020_1000,
        Some(&[(0, 0xfedf_ffff), (0xfef0_0000, 0xffff_ffff_ffff)]),
        Some(65000),
    );
    let info = Type1Info::parse(&bytes).unwrap();
    assert_eq!(info.iova_pgsizes, Some(0x4020_1000));
    assert_eq!(
        info.iova_ranges.unwrap(),
        vec![
            IovaRange::new(0, 0xfedf_ffff).unwrap(),
            IovaRange::new(0xfef0_0000, 0xffff_ffff_ffff).unwrap()
        ]
    );
    assert_eq!(info.dma_avail, Some(65000));
}

#[test]
fn no_caps_means_no_restrictions_known() {
    let info = Type1Info::parse(&reply(0x1000, None, None)).unwrap();
    assert_eq!(info.iova_ranges, None);
    assert_eq!(info.dma_avail, None);
    assert!(matches!(
        Type1Info::parse(&[0u8; 23]),
        Err(Error::MalformedInfo {
            defect: InfoDefect::TooShort,
            ..
        })
    ));
}

#[test]
fn chain_pointing_backwards_is_refused() {
    let mut bytes = reply(0x1000, Some(&[(0, 0xffff)]), Some(1));
    // Make the last capability point back at the first.
    let last = bytes.len() - 16;
    bytes[last + 4..last + 8].copy_from_slice(&24u32.to_ne_bytes());
    let err = Type1Info::parse(&bytes).unwrap_err();
    assert!(
        matches!(
            err,
            Error::MalformedInfo {
                defect: InfoDefect::ChainNotAscending,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn truncated_or_wild_capabilities_are_refused() {
    let bytes = reply(0x1000, Some(&[(0, 0xffff), (0x20000, 0x2ffff)]), None);
    let cut = &bytes[..bytes.len() - 8];
    assert!(matches!(
        Type1Info::parse(cut),
        Err(Error::MalformedInfo {
            defect: InfoDefect::CapOutOfBounds,
            ..
        })
    ));
    let mut huge_count = bytes.clone();
    huge_count[24 + 8..24 + 12].copy_from_slice(&u32::MAX.to_ne_bytes());
    assert!(Type1Info::parse(&huge_count).is_err());
    let mut inside = bytes.clone();
    inside[16..20].copy_from_slice(&8u32.to_ne_bytes());
    assert!(matches!(
        Type1Info::parse(&inside),
        Err(Error::MalformedInfo {
            defect: InfoDefect::CapInsideHeader,
            ..
        })
    ));
    let mut outside = bytes.clone();
    outside[16..20].copy_from_slice(&u32::MAX.to_ne_bytes());
    assert!(Type1Info::parse(&outside).is_err());
    let mut inverted = bytes;
    inverted[24 + 16..24 + 24].copy_from_slice(&0x10_0000u64.to_ne_bytes());
    assert!(matches!(
        Type1Info::parse(&inverted),
        Err(Error::MalformedInfo {
            defect: InfoDefect::InvertedRange,
            ..
        })
    ));
}

#[test]
fn every_prefix_and_bit_flip_parses_or_fails_cleanly() {
    let bytes = reply(0x1000, Some(&[(0, 0xffff), (0x20000, 0x2ffff)]), Some(7));
    for len in 0..=bytes.len() {
        let _ = Type1Info::parse(&bytes[..len]);
    }
    for bit in 0..bytes.len() * 8 {
        let mut flipped = bytes.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        let _ = Type1Info::parse(&flipped);
    }
}
