//! The VFIO type1 space against a double that simulates the kernel's type1 IOMMU driver: its
//! `VFIO_IOMMU_GET_INFO` reply protocol (argsz growth, capability chain), the valid IOVA ranges,
//! the `dma_entry_limit`, type1v2 map/unmap rules, and injected failures.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use userdma::dma::{Access, Error, IovaRange, Kind, Space, Type1, Type1Ioctl};
use userdma::memory::{PageSize, Region};

const PAGE: u64 = 4096;
/// `VFIO_IOMMU_INFO_PGSIZES | VFIO_IOMMU_INFO_CAPS`.
const INFO_FLAGS: u32 = 1 | 2;
const CAP_IOVA_RANGE: u16 = 1;
const CAP_DMA_AVAIL: u16 = 3;

/// One kernel mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KernelMapping {
    vaddr: u64,
    size: u64,
    /// What VFIO_DMA_MAP_FLAG_READ / _WRITE let the device do.
    access: Access,
}

#[derive(Debug, Default)]
struct SimState {
    pgsizes: u64,
    ranges: Vec<(u64, u64)>,
    /// The module's dma_entry_limit.
    limit: u32,
    mappings: BTreeMap<u64, KernelMapping>,
    get_info_calls: usize,
    map_calls: usize,
    unmap_calls: usize,
    /// Fail the map call with this index (0-based, counting all map calls).
    fail_map_call: Option<usize>,
    /// Fail the next unmap with this errno.
    fail_next_unmap: Option<i32>,
    /// Report one page fewer than unmapped on the next unmap.
    short_next_unmap: bool,
}

/// The simulated type1 driver; clones share the state, so the test keeps one to inspect.
#[derive(Debug, Clone)]
struct Sim(Arc<Mutex<SimState>>);

impl Sim {
    fn new(ranges: &[(u64, u64)], limit: u32) -> Sim {
        Sim(Arc::new(Mutex::new(SimState {
            pgsizes: PAGE | (2 << 20) | (1 << 30),
            ranges: ranges.to_vec(),
            limit,
            ..SimState::default()
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.0.lock().unwrap()
    }

    /// The reply the kernel builds: info, IOVA-range capability, DMA-avail capability.
    fn reply(state: &SimState) -> Vec<u8> {
        let mut bytes = vec![0u8; 24];
        bytes[4..8].copy_from_slice(&INFO_FLAGS.to_ne_bytes());
        bytes[8..16].copy_from_slice(&state.pgsizes.to_ne_bytes());
        bytes[16..20].copy_from_slice(&24u32.to_ne_bytes());
        // IOVA ranges.
        let ranges_at = bytes.len();
        bytes.extend_from_slice(&CAP_IOVA_RANGE.to_ne_bytes());
        bytes.extend_from_slice(&1u16.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(&(state.ranges.len() as u32).to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        for &(start, end) in &state.ranges {
            bytes.extend_from_slice(&start.to_ne_bytes());
            bytes.extend_from_slice(&end.to_ne_bytes());
        }
        let avail_at = bytes.len() as u32;
        bytes[ranges_at + 4..ranges_at + 8].copy_from_slice(&avail_at.to_ne_bytes());
        // DMA avail.
        let avail = state.limit - state.mappings.len() as u32;
        bytes.extend_from_slice(&CAP_DMA_AVAIL.to_ne_bytes());
        bytes.extend_from_slice(&1u16.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(&avail.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes
    }
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl Type1Ioctl for Sim {
    fn get_info(&self, buf: &mut [u8]) -> io::Result<()> {
        let mut state = self.state();
        state.get_info_calls += 1;
        let argsz = u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize;
        if argsz < 24 || argsz > buf.len() {
            return Err(errno(libc::EINVAL));
        }
        let reply = Sim::reply(&state);
        if argsz < reply.len() {
            // Like the kernel: the fixed part, the flag, and the size needed; no capabilities.
            buf[0..4].copy_from_slice(&(reply.len() as u32).to_ne_bytes());
            buf[4..8].copy_from_slice(&INFO_FLAGS.to_ne_bytes());
            buf[8..16].copy_from_slice(&state.pgsizes.to_ne_bytes());
            buf[16..24].fill(0);
        } else {
            buf[4..reply.len()].copy_from_slice(&reply[4..]);
        }
        Ok(())
    }

    fn map_dma(&self, vaddr: u64, iova: u64, size: u64) -> io::Result<()> {
        self.map_dma_with(vaddr, iova, size, Access::ReadWrite)
    }

    fn map_dma_with(&self, vaddr: u64, iova: u64, size: u64, access: Access) -> io::Result<()> {
        let mut state = self.state();
        let call = state.map_calls;
        state.map_calls += 1;
        if state.fail_map_call == Some(call) {
            return Err(errno(libc::EFAULT));
        }
        let min_page = 1 << state.pgsizes.trailing_zeros();
        if size == 0 || iova % min_page != 0 || size % min_page != 0 || vaddr % min_page != 0 {
            return Err(errno(libc::EINVAL));
        }
        let last = iova
            .checked_add(size - 1)
            .ok_or_else(|| errno(libc::EINVAL))?;
        // vfio_iommu_iova_dma_valid: the whole range inside one valid range.
        if !state.ranges.iter().any(|&(s, e)| s <= iova && last <= e) {
            return Err(errno(libc::EINVAL));
        }
        let overlaps = state
            .mappings
            .iter()
            .any(|(&start, m)| start <= last && iova <= start + (m.size - 1));
        if overlaps {
            return Err(errno(libc::EEXIST));
        }
        if state.mappings.len() >= state.limit as usize {
            return Err(errno(libc::ENOSPC));
        }
        state.mappings.insert(
            iova,
            KernelMapping {
                vaddr,
                size,
                access,
            },
        );
        Ok(())
    }

    fn unmap_dma(&self, iova: u64, size: u64) -> io::Result<u64> {
        let mut state = self.state();
        state.unmap_calls += 1;
        if let Some(code) = state.fail_next_unmap.take() {
            return Err(errno(code));
        }
        let last = iova + (size - 1);
        // type1v2: no bisecting a mapping.
        let inside: Vec<u64> = state
            .mappings
            .iter()
            .filter(|(&start, m)| start <= last && iova <= start + (m.size - 1))
            .map(|(&start, m)| {
                if start < iova || start + m.size - 1 > last {
                    Err(errno(libc::EINVAL))
                } else {
                    Ok(start)
                }
            })
            .collect::<io::Result<_>>()?;
        let mut unmapped = 0;
        for start in inside {
            unmapped += state.mappings.remove(&start).unwrap().size;
        }
        if std::mem::take(&mut state.short_next_unmap) {
            unmapped -= PAGE;
        }
        Ok(unmapped)
    }
}

fn region(pages: usize) -> Arc<Region> {
    Arc::new(
        Region::builder(pages * PAGE as usize)
            .page_size(PageSize::Base)
            .lock(false)
            .build()
            .expect("a small base-page region"),
    )
}

/// Every kernel mapping lies in one of `ranges` and under the mask.
fn assert_placement(sim: &Sim, ranges: &[(u64, u64)], mask: u64) {
    for (&iova, m) in &sim.state().mappings {
        let last = iova + m.size - 1;
        assert!(last <= mask, "{iova:#x}..={last:#x} above mask {mask:#x}");
        assert!(
            ranges.iter().any(|&(s, e)| s <= iova && last <= e),
            "{iova:#x}..={last:#x} outside {ranges:x?}"
        );
    }
}

#[test]
fn info_is_read_with_a_grown_buffer() {
    let sim = Sim::new(&[(0, (1 << 39) - 1)], 65535);
    let space = Type1::with_ioctl(sim.clone(), 48).unwrap();
    assert_eq!(
        sim.state().get_info_calls,
        2,
        "too-small buffer first, then the right one"
    );
    let info = space.info();
    assert_eq!(info.iova_pgsizes, Some(PAGE | (2 << 20) | (1 << 30)));
    assert_eq!(info.dma_avail, Some(65535));
    assert_eq!(
        info.iova_ranges.as_deref(),
        Some(&[IovaRange::new(0, (1 << 39) - 1).unwrap()][..])
    );
    assert_eq!(space.kind(), Kind::Type1);
    assert_eq!(space.dma_mask_bits(), 48);
    assert_eq!(space.mappings_left(), 65535);
}

#[test]
fn a_region_is_merged_into_one_kernel_mapping() {
    let sim = Sim::new(&[(0, u64::MAX)], 65535);
    let space = Type1::with_ioctl(sim.clone(), 64).unwrap();
    let region = region(64);
    let mapping = space.map(Arc::clone(&region)).unwrap();
    {
        let state = sim.state();
        assert_eq!(state.map_calls, 1, "64 pages, one VFIO_IOMMU_MAP_DMA");
        let (&iova, kernel) = state.mappings.iter().next().unwrap();
        assert_eq!(kernel.vaddr, region.as_ptr().as_ptr() as u64);
        assert_eq!(kernel.size, 64 * PAGE);
        assert_eq!(mapping.iova(0).map(|i| i.raw()), Some(iova));
    }
    assert_eq!(space.mappings_left(), 65534);
    let base = mapping.iova(0).unwrap().raw();
    assert_ne!(base, 0, "IOVA 0 is never handed out");
    assert_eq!(mapping.iova(12345).map(|i| i.raw()), Some(base + 12345));
    assert_eq!(mapping.iova(mapping.len()), None);
    assert_eq!(mapping.contiguous_len(100), mapping.len() - 100);
    assert_eq!(mapping.contiguous_len(mapping.len()), 0);
    assert_eq!(mapping.iova_range(), IovaRange::from_len(base, 64 * PAGE));
    assert_eq!(mapping.segments().count(), 1);
    assert_eq!(mapping.kind(), Kind::Type1);
    drop(mapping);
    assert!(sim.state().mappings.is_empty());
    assert_eq!(space.mappings_left(), 65535);
    let stats = space.stats();
    assert_eq!((stats.maps, stats.unmaps, stats.live_bytes), (1, 1, 0));
}

/// Memory the caller owns (`Region::borrowed`) is mapped like the library's own: one kernel
/// mapping of the caller's address, undone on drop, and the memory stays mapped in the process.
#[test]
fn the_callers_memory_is_one_kernel_mapping_of_its_address() {
    let sim = Sim::new(&[(0, u64::MAX)], 65535);
    let space = Type1::with_ioctl(sim.clone(), 64).unwrap();
    let len = 8 * PAGE as usize;
    let layout = std::alloc::Layout::from_size_align(len, PAGE as usize).unwrap();
    // SAFETY: a non-zero size; freed below, after the region and its mapping.
    let raw = unsafe { std::alloc::alloc_zeroed(layout) };
    let ptr = std::ptr::NonNull::new(raw).unwrap();
    // SAFETY: `raw` stays allocated until after the mapping (which holds the region) is
    // dropped; the test makes no reference into it meanwhile.
    let region = unsafe { Region::borrowed(ptr, len, PageSize::Base) }.unwrap();
    let mapping = space.map(Arc::new(region)).unwrap();
    {
        let state = sim.state();
        let (&iova, kernel) = state.mappings.iter().next().unwrap();
        assert_eq!(kernel.vaddr, raw as u64, "the caller's address, as it is");
        assert_eq!(kernel.size, len as u64);
        assert_eq!(mapping.iova(0).map(|i| i.raw()), Some(iova));
    }
    drop(mapping);
    assert!(sim.state().mappings.is_empty());
    // SAFETY: allocated above with this layout; nothing holds it any more.
    unsafe { std::alloc::dealloc(raw, layout) };
}

/// Device-read-only and -write-only mappings reach the kernel as the matching
/// `VFIO_DMA_MAP_FLAG_*` (the IOMMU then refuses the other direction), and the mapping says
/// which it is; a physical-address space, which nothing enforces, refuses both.
#[test]
fn access_modes_reach_the_kernel_as_map_flags() {
    let sim = Sim::new(&[(0, u64::MAX)], 65535);
    let space = Type1::with_ioctl(sim.clone(), 64).unwrap();
    for access in [Access::ReadOnly, Access::WriteOnly, Access::ReadWrite] {
        let mapping = space.map_with(region(2), access).unwrap();
        assert_eq!(mapping.access(), access);
        let iova = mapping.iova(0).unwrap().raw();
        assert_eq!(sim.state().mappings[&iova].access, access);
    }
    assert_eq!(space.map(region(1)).unwrap().access(), Access::ReadWrite);
    let physical = userdma::dma::Physical::new(64).unwrap();
    let err = physical.map_with(region(1), Access::ReadOnly).unwrap_err();
    assert!(matches!(err, Error::AccessMode { .. }), "{err}");
    assert_eq!(err.code(), userdma::Code::Unsupported);
    assert!(err.to_string().contains("IOMMU"), "{err}");
}

#[test]
fn mapping_count_limit_is_honoured() {
    let sim = Sim::new(&[(0, u64::MAX)], 3);
    let space = Type1::with_ioctl(sim.clone(), 64).unwrap();
    let mut mappings: Vec<_> = (0..3).map(|_| space.map(region(1)).unwrap()).collect();
    assert_eq!(space.mappings_left(), 0);
    let err = space.map(region(1)).unwrap_err();
    match &err {
        Error::MappingLimit {
            needed,
            available,
            limit,
        } => assert_eq!((*needed, *available, *limit), (1, 0, 3)),
        other => panic!("expected the mapping limit, got {other:?}"),
    }
    assert!(err.to_string().contains("dma_entry_limit"), "{err}");
    assert_eq!(
        sim.state().map_calls,
        3,
        "the kernel was never asked past its limit"
    );
    mappings.pop();
    mappings.push(space.map(region(1)).unwrap());
    assert_eq!(sim.state().mappings.len(), 3);
    assert_eq!(space.stats().map_errors, 1);
}

#[test]
fn iova_ranges_and_mask_are_honoured() {
    // Reserved holes between ranges, a range crossing the 20-bit mask, one above it.
    let ranges = [
        (0x0, 0x7fff),
        (0x10000, 0x1ffff),
        (0x40000, 0x10_ffff),
        (0x100_0000, 0x1ff_ffff),
    ];
    let sim = Sim::new(&ranges, 65535);
    let space = Type1::with_ioctl(sim.clone(), 20).unwrap();
    assert_eq!(
        space.usable_ranges(),
        vec![
            IovaRange::new(0x1000, 0x7fff).unwrap(),
            IovaRange::new(0x10000, 0x1ffff).unwrap(),
            IovaRange::new(0x40000, 0xf_ffff).unwrap(),
        ]
    );
    let mut live = Vec::new();
    for pages in [4, 8, 16, 64, 2, 1] {
        live.push(space.map(region(pages)).unwrap());
    }
    assert_placement(&sim, &ranges, 0xf_ffff);
    // What is left: nothing holds 256 pages (1 MiB) any more.
    let err = space.map(region(256)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::IovaExhausted { .. }), "{err:?}");
    assert!(
        text.contains("20-bit") && text.contains("0x40000..=0xfffff"),
        "{text}"
    );
    assert_eq!(
        sim.state().mappings.len(),
        live.len(),
        "nothing left behind"
    );
}

#[test]
fn a_region_too_large_for_any_hole_is_scattered_over_the_fewest_pieces() {
    // 4 + 2 + 8 pages: no range holds 10.
    let ranges = [(0x1000, 0x4fff), (0x10000, 0x11fff), (0x20000, 0x27fff)];
    let sim = Sim::new(&ranges, 65535);
    let space = Type1::with_ioctl(sim.clone(), 32).unwrap();
    let mapping = space.map(region(10)).unwrap();
    let segments: Vec<_> = mapping.segments().collect();
    assert_eq!(
        segments,
        vec![
            (0, IovaRange::new(0x1000, 0x4fff).unwrap()),
            (0x4000, IovaRange::new(0x10000, 0x11fff).unwrap()),
            (0x6000, IovaRange::new(0x20000, 0x23fff).unwrap()),
        ]
    );
    assert_eq!(sim.state().map_calls, 3);
    assert_placement(&sim, &ranges, u32::MAX.into());
    assert_eq!(mapping.iova(0x10).map(|i| i.raw()), Some(0x1010));
    assert_eq!(mapping.contiguous_len(0x10), 0x4000 - 0x10);
    assert_eq!(mapping.iova(0x5008).map(|i| i.raw()), Some(0x11008));
    assert_eq!(mapping.contiguous_len(0x5008), 0x1000 - 0x8);
    assert_eq!(mapping.iova(0x9fff).map(|i| i.raw()), Some(0x23fff));
    assert_eq!(mapping.contiguous_len(0x9fff), 1);
    assert_eq!(mapping.iova_range(), None);
    assert_eq!(space.mappings_left(), 65535 - 3);
    drop(mapping);
    assert!(sim.state().mappings.is_empty());
    assert_eq!(space.mappings_left(), 65535);
}

#[test]
fn a_scattered_region_counts_every_piece_against_the_limit() {
    let ranges = [(0x1000, 0x1fff), (0x3000, 0x3fff), (0x5000, 0x5fff)];
    let sim = Sim::new(&ranges, 2);
    let space = Type1::with_ioctl(sim.clone(), 32).unwrap();
    let err = space.map(region(3)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::MappingLimit {
                needed: 3,
                available: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(sim.state().map_calls, 0);
    let _two = space.map(region(2)).unwrap();
    assert_eq!(space.mappings_left(), 0);
}

#[test]
fn a_failed_map_is_rolled_back() {
    let ranges = [(0x1000, 0x2fff), (0x8000, 0x9fff)];
    let sim = Sim::new(&ranges, 65535);
    let space = Type1::with_ioctl(sim.clone(), 32).unwrap();
    sim.state().fail_map_call = Some(1);
    let err = space.map(region(4)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Map {
                kind: Kind::Type1,
                iova: 0x8000,
                ..
            }
        ),
        "{err:?}"
    );
    let state = sim.state();
    assert!(
        state.mappings.is_empty(),
        "the first piece was unmapped again"
    );
    assert_eq!(state.unmap_calls, 1);
    drop(state);
    assert_eq!(space.stats().map_errors, 1);
    assert_eq!(space.mappings_left(), 65535);
    // The IOVAs were returned: the next map gets the same place.
    let mapping = space.map(region(4)).unwrap();
    assert_eq!(mapping.iova(0).map(|i| i.raw()), Some(0x1000));
}

#[test]
fn unmap_errors_are_reported_and_counted() {
    let sim = Sim::new(&[(0, u64::MAX)], 65535);
    let space = Type1::with_ioctl(sim.clone(), 64).unwrap();

    // Explicit unmap returns the error.
    let mapping = space.map(region(2)).unwrap();
    let lost = mapping.iova(0).unwrap().raw();
    sim.state().fail_next_unmap = Some(libc::EIO);
    let err = mapping.unmap().unwrap_err();
    let Error::UnmapFailed { source } = &err else {
        panic!("expected UnmapFailed, got {err:?}");
    };
    match source.as_ref() {
        Error::Unmap {
            kind: Kind::Type1,
            iova,
            len,
            source,
        } => {
            assert_eq!((*iova, *len), (lost, 2 * PAGE));
            assert_eq!(source.raw_os_error(), Some(libc::EIO));
        }
        other => panic!("expected an Unmap cause, got {other:?}"),
    }
    let stats = space.stats();
    assert_eq!(stats.unmap_errors, 1);
    assert!(stats.last_unmap_error.is_some());

    // Drop records it too: an unmap that unmapped part of the range. (One that unmapped
    // nothing is a mapping the kernel had dropped already, done and counted in
    // `unmaps_after_removal`: src/dma/type1.rs.)
    let mapping = space.map(region(2)).unwrap();
    sim.state().short_next_unmap = true;
    drop(mapping);
    let stats = space.stats();
    assert_eq!(stats.unmap_errors, 2);
    assert!(
        matches!(
            stats.last_unmap_error.as_deref(),
            Some(Error::UnmapIncomplete { unmapped, .. }) if *unmapped == PAGE
        ),
        "{:?}",
        stats.last_unmap_error
    );

    // A range whose unmap failed is never handed out again.
    for _ in 0..8 {
        let mapping = space.map(region(2)).unwrap();
        assert_ne!(mapping.iova(0).map(|i| i.raw()), Some(lost));
    }
}

#[test]
fn iommu_pages_larger_than_the_region_pages_are_refused() {
    let sim = Sim::new(&[(0, u64::MAX)], 65535);
    sim.state().pgsizes = 64 << 10;
    let space = Type1::with_ioctl(sim.clone(), 64).unwrap();
    let err = space.map(region(16)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::IommuPageSize {
                iommu_page: 0x10000,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(sim.state().map_calls, 0);
}

#[test]
fn bad_mask_and_failing_info_are_errors() {
    let sim = Sim::new(&[(0, u64::MAX)], 65535);
    assert!(matches!(
        Type1::with_ioctl(sim, 65),
        Err(Error::InvalidDmaMask { bits: 65 })
    ));

    #[derive(Debug)]
    struct NoIommu;
    impl Type1Ioctl for NoIommu {
        fn get_info(&self, _: &mut [u8]) -> io::Result<()> {
            Err(errno(libc::EINVAL))
        }
        fn map_dma(&self, _: u64, _: u64, _: u64) -> io::Result<()> {
            unreachable!("never mapped")
        }
        fn unmap_dma(&self, _: u64, _: u64) -> io::Result<u64> {
            unreachable!("never unmapped")
        }
    }
    let err = Type1::with_ioctl(NoIommu, 32).unwrap_err();
    assert!(matches!(err, Error::GetInfo { .. }), "{err:?}");
    assert!(err.to_string().contains("VFIO_SET_IOMMU"), "{err}");
}

#[test]
fn concurrent_maps_never_overlap() {
    let sim = Sim::new(&[(0, (1 << 32) - 1)], 65535);
    let space = Type1::with_ioctl(sim.clone(), 32).unwrap();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let space = space.clone();
            scope.spawn(move || {
                for round in 0..50 {
                    let mapping = space.map(region(1 + round % 3)).unwrap();
                    assert!(mapping.iova(0).is_some());
                }
            });
        }
    });
    // The simulated kernel refuses overlapping maps (EEXIST), so success means none overlapped.
    let stats = space.stats();
    assert_eq!((stats.maps, stats.unmaps, stats.map_errors), (200, 200, 0));
    assert!(sim.state().mappings.is_empty());
}

#[test]
fn the_kernel_shim_reports_the_errno_of_a_non_vfio_fd() {
    // /dev/null answers every ioctl with ENOTTY: the real VFIO_IOMMU_GET_INFO path runs and its
    // error comes back with the cause attached.
    let fd = std::fs::File::open("/dev/null").unwrap();
    let err = Type1::new(fd.into(), 32).unwrap_err();
    match &err {
        Error::GetInfo { source } => assert_eq!(source.raw_os_error(), Some(libc::ENOTTY)),
        other => panic!("expected GetInfo, got {other:?}"),
    }
}
