//! The iommufd space against a double that simulates the kernel's iommufd: IOAS allocation, the
//! `IOMMU_IOAS_IOVA_RANGES` protocol (EMSGSIZE and a retry with more room), fixed-IOVA maps that
//! must lie in the allowed ranges and respect the alignment, exact unmaps, a mapping limit of
//! the double's own, ranges narrowing on device attach, and injected failures.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use userdma::dma::{Access, Error, Iommufd, IommufdIoctl, IovaRange, Kind, Space};
use userdma::memory::{PageSize, Region};

const PAGE: u64 = 4096;
const IOAS: u32 = 7;

#[derive(Debug, Default)]
struct SimState {
    ranges: Vec<IovaRange>,
    alignment: u64,
    /// Pinning fails with ENOMEM past this many mappings (the memlock accounting of a real one).
    max_mappings: usize,
    allocated: Vec<u32>,
    destroyed: Vec<u32>,
    /// iova -> (vaddr, length)
    mappings: BTreeMap<u64, (u64, u64)>,
    /// iova -> what IOMMU_IOAS_MAP_READABLE / _WRITEABLE let the device do.
    accesses: BTreeMap<u64, Access>,
    range_calls: usize,
    map_calls: usize,
    /// `IOMMU_IOAS_MAP_FILE` exists (Linux 6.13); without it the call is `ENOTTY`.
    map_file: bool,
    /// iova -> (file start, length) of the maps by file.
    file_mappings: BTreeMap<u64, (u64, u64)>,
    fail_next_unmap: Option<i32>,
}

#[derive(Debug, Clone)]
struct Sim(Arc<Mutex<SimState>>);

impl Sim {
    fn new(ranges: &[(u64, u64)]) -> Sim {
        Sim(Arc::new(Mutex::new(SimState {
            ranges: ranges
                .iter()
                .map(|&(s, l)| IovaRange::new(s, l).unwrap())
                .collect(),
            alignment: PAGE,
            max_mappings: usize::MAX,
            ..SimState::default()
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.0.lock().unwrap()
    }
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl IommufdIoctl for Sim {
    fn ioas_alloc(&self) -> io::Result<u32> {
        self.state().allocated.push(IOAS);
        Ok(IOAS)
    }

    fn ioas_iova_ranges(&self, ioas: u32, out: &mut [IovaRange]) -> io::Result<(usize, u64)> {
        let mut state = self.state();
        state.range_calls += 1;
        if ioas != IOAS {
            return Err(errno(libc::ENOENT));
        }
        for (dst, src) in out.iter_mut().zip(&state.ranges) {
            *dst = *src;
        }
        Ok((state.ranges.len(), state.alignment))
    }

    fn ioas_map(&self, ioas: u32, vaddr: u64, iova: u64, len: u64) -> io::Result<()> {
        self.ioas_map_with(ioas, vaddr, iova, len, Access::ReadWrite)
    }

    fn ioas_map_with(
        &self,
        ioas: u32,
        vaddr: u64,
        iova: u64,
        len: u64,
        access: Access,
    ) -> io::Result<()> {
        let mut state = self.state();
        state.map_calls += 1;
        if ioas != IOAS {
            return Err(errno(libc::ENOENT));
        }
        let align = state.alignment;
        if len == 0 || iova % align != 0 || (iova + len) % align != 0 {
            return Err(errno(libc::EINVAL));
        }
        let piece = IovaRange::from_len(iova, len).ok_or(errno(libc::EOVERFLOW))?;
        if !state.ranges.iter().any(|r| r.covers(&piece)) {
            return Err(errno(libc::ENOENT));
        }
        let overlaps = state
            .mappings
            .iter()
            .any(|(&s, &(_, l))| s <= piece.last && piece.start <= s + (l - 1));
        if overlaps {
            return Err(errno(libc::EEXIST));
        }
        if state.mappings.len() >= state.max_mappings {
            return Err(errno(libc::ENOMEM));
        }
        state.mappings.insert(iova, (vaddr, len));
        state.accesses.insert(iova, access);
        Ok(())
    }

    fn ioas_map_file(
        &self,
        ioas: u32,
        file: std::os::fd::BorrowedFd<'_>,
        start: u64,
        iova: u64,
        len: u64,
        access: Access,
    ) -> io::Result<()> {
        if !self.state().map_file {
            return Err(errno(libc::ENOTTY));
        }
        // The same checks as a map by address, recorded by file offset.
        let _ = file;
        self.ioas_map_with(ioas, u64::MAX, iova, len, access)?;
        self.state().file_mappings.insert(iova, (start, len));
        Ok(())
    }

    fn ioas_unmap(&self, ioas: u32, iova: u64, len: u64) -> io::Result<u64> {
        let mut state = self.state();
        if ioas != IOAS {
            return Err(errno(libc::ENOENT));
        }
        if let Some(code) = state.fail_next_unmap.take() {
            return Err(errno(code));
        }
        match state.mappings.get(&iova) {
            Some(&(_, mapped)) if mapped == len => {
                state.mappings.remove(&iova);
                Ok(len)
            }
            // Splitting or truncating is not allowed.
            Some(_) => Err(errno(libc::EINVAL)),
            None => Err(errno(libc::ENOENT)),
        }
    }

    fn destroy(&self, id: u32) -> io::Result<()> {
        self.state().destroyed.push(id);
        Ok(())
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

#[test]
fn a_region_is_one_fixed_iova_map_in_the_ioas() {
    let sim = Sim::new(&[(0, (1 << 48) - 1)]);
    let space = Iommufd::with_ioctl(sim.clone(), 48).unwrap();
    assert_eq!(space.ioas_id(), IOAS);
    assert!(space.fd().is_none());
    assert_eq!(space.kind(), Kind::Iommufd);
    let region = region(32);
    let mapping = space.map(Arc::clone(&region)).unwrap();
    {
        let state = sim.state();
        assert_eq!(
            state.map_calls, 1,
            "32 pages merged into one IOMMU_IOAS_MAP"
        );
        let (&iova, &(vaddr, len)) = state.mappings.iter().next().unwrap();
        assert_eq!((vaddr, len), (region.as_ptr().as_ptr() as u64, 32 * PAGE));
        assert_eq!(mapping.iova(0).map(|i| i.raw()), Some(iova));
        assert_ne!(iova, 0);
    }
    assert_eq!(mapping.contiguous_len(0), mapping.len());
    mapping.unmap().unwrap();
    assert!(sim.state().mappings.is_empty());
}

/// Device-read-only and -write-only mappings reach the kernel as the matching
/// `IOMMU_IOAS_MAP_*` flags, and the mapping says which it is.
#[test]
fn access_modes_reach_the_kernel_as_map_flags() {
    let sim = Sim::new(&[(0, (1 << 48) - 1)]);
    let space = Iommufd::with_ioctl(sim.clone(), 48).unwrap();
    for access in [Access::ReadOnly, Access::WriteOnly, Access::ReadWrite] {
        let mapping = space.map_with(region(2), access).unwrap();
        assert_eq!(mapping.access(), access);
        let iova = mapping.iova(0).unwrap().raw();
        assert_eq!(sim.state().accesses[&iova], access);
    }
}

#[test]
fn many_ranges_are_read_with_a_second_larger_query() {
    // 40 one-page holes: more than the first query has room for.
    let ranges: Vec<(u64, u64)> = (1..=40u64)
        .map(|i| (i * 0x10000, i * 0x10000 + PAGE - 1))
        .collect();
    let sim = Sim::new(&ranges);
    let space = Iommufd::with_ioctl(sim.clone(), 32).unwrap();
    assert_eq!(sim.state().range_calls, 2);
    assert_eq!(space.usable_ranges().len(), 40);
    // Three pages scatter over three holes.
    let mapping = space.map(region(3)).unwrap();
    let starts: Vec<u64> = mapping.segments().map(|(_, range)| range.start).collect();
    assert_eq!(starts, vec![0x10000, 0x20000, 0x30000]);
    assert_eq!(
        mapping.iova(PAGE as usize + 5).map(|i| i.raw()),
        Some(0x20005)
    );
}

#[test]
fn ranges_and_mask_are_honoured_and_refreshed_on_attach() {
    let sim = Sim::new(&[(0, u64::MAX)]);
    let space = Iommufd::with_ioctl(sim.clone(), 28).unwrap();
    assert_eq!(
        space.usable_ranges(),
        vec![IovaRange::new(0x1000, 0x0fff_ffff).unwrap()]
    );
    let first = space.map(region(4)).unwrap();
    assert!(first.iova(first.len() - 1).unwrap().raw() < 1 << 28);

    // A device attaches and the IOAS narrows to everything but an MSI window that does not touch
    // the live mapping.
    sim.state().ranges = vec![
        IovaRange::new(0, 0x00ff_ffff).unwrap(),
        IovaRange::new(0x0200_0000, u64::MAX).unwrap(),
    ];
    space.refresh_ranges().unwrap();
    assert_eq!(
        space.usable_ranges(),
        vec![
            IovaRange::new(0x1000, 0x00ff_ffff).unwrap(),
            IovaRange::new(0x0200_0000, 0x0fff_ffff).unwrap()
        ]
    );
    // 20 MiB does not fit below the window (16 MiB), nor in it: it goes above.
    let big = space.map(region(5 * 1024)).unwrap();
    assert!(big.iova(0).unwrap().raw() >= 0x0200_0000);
    let segments: Vec<IovaRange> = big.segments().map(|(_, r)| r).collect();
    for segment in &segments {
        let inside = space.usable_ranges().iter().any(|r| r.covers(segment));
        assert!(inside, "{segment} outside the narrowed ranges");
    }

    // A narrowing that would strand a live mapping is refused, changing nothing.
    sim.state().ranges = vec![IovaRange::new(0x0400_0000, u64::MAX).unwrap()];
    let err = space.refresh_ranges().unwrap_err();
    assert!(matches!(err, Error::IovaUnavailable { .. }), "{err:?}");
    assert_eq!(space.usable_ranges().len(), 2);
    drop((first, big));
    space.refresh_ranges().unwrap();
    assert_eq!(
        space.usable_ranges(),
        vec![IovaRange::new(0x0400_0000, 0x0fff_ffff).unwrap()]
    );
}

#[test]
fn the_kernels_mapping_limit_is_reported_and_rolled_back() {
    let sim = Sim::new(&[(0, u64::MAX)]);
    sim.state().max_mappings = 2;
    let space = Iommufd::with_ioctl(sim.clone(), 64).unwrap();
    let a = space.map(region(1)).unwrap();
    let _b = space.map(region(1)).unwrap();
    let err = space.map(region(1)).unwrap_err();
    match &err {
        Error::Map {
            kind: Kind::Iommufd,
            source,
            ..
        } => assert_eq!(source.raw_os_error(), Some(libc::ENOMEM)),
        other => panic!("expected a map error, got {other:?}"),
    }
    assert!(err.to_string().contains("RLIMIT_MEMLOCK"), "{err}");
    assert_eq!(space.stats().map_errors, 1);
    // The failed map's IOVA was returned: after one unmap, the next map takes the freed place.
    let freed = a.iova(0);
    drop(a);
    let c = space.map(region(1)).unwrap();
    assert_eq!(c.iova(0), freed);
}

#[test]
fn unmap_errors_are_reported_and_counted() {
    let sim = Sim::new(&[(0, u64::MAX)]);
    let space = Iommufd::with_ioctl(sim.clone(), 64).unwrap();
    let mapping = space.map(region(2)).unwrap();
    sim.state().fail_next_unmap = Some(libc::EBUSY);
    drop(mapping);
    let stats = space.stats();
    assert_eq!(stats.unmap_errors, 1);
    match stats.last_unmap_error.as_deref() {
        Some(Error::Unmap {
            kind: Kind::Iommufd,
            source,
            ..
        }) => assert_eq!(source.raw_os_error(), Some(libc::EBUSY)),
        other => panic!("expected the unmap failure, got {other:?}"),
    }
    let mapping = space.map(region(1)).unwrap();
    sim.state().fail_next_unmap = Some(libc::EIO);
    assert!(matches!(mapping.unmap(), Err(Error::UnmapFailed { .. })));
    assert_eq!(space.stats().unmap_errors, 2);
}

#[test]
fn the_ioas_is_destroyed_after_the_space_and_its_mappings() {
    let sim = Sim::new(&[(0, u64::MAX)]);
    let space = Iommufd::with_ioctl(sim.clone(), 64).unwrap();
    let mapping = space.map(region(1)).unwrap();
    drop(space);
    assert!(
        sim.state().destroyed.is_empty(),
        "a live mapping keeps the IOAS"
    );
    drop(mapping);
    assert_eq!(sim.state().destroyed, vec![IOAS]);
}

#[test]
fn alignment_larger_than_the_region_page_is_refused() {
    let sim = Sim::new(&[(0, u64::MAX)]);
    sim.state().alignment = 64 << 10;
    let space = Iommufd::with_ioctl(sim.clone(), 64).unwrap();
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
fn the_kernel_shim_reports_the_errno_of_a_non_iommufd_fd() {
    // /dev/null answers every ioctl with ENOTTY: the real IOMMU_IOAS_ALLOC path runs and its
    // error comes back with the cause attached.
    let fd = std::fs::File::open("/dev/null").unwrap();
    let err = Iommufd::new(fd.into(), 32).unwrap_err();
    match &err {
        Error::IoasAlloc { source } => assert_eq!(source.raw_os_error(), Some(libc::ENOTTY)),
        other => panic!("expected IoasAlloc, got {other:?}"),
    }
}

/// A region mapped by file descriptor reaches the kernel as `IOMMU_IOAS_MAP_FILE` pieces at
/// their file offsets, and is unmapped like any other; a kernel without the ioctl gets a
/// `MapFile` error naming the releases that have it, with nothing left mapped.
#[test]
fn map_file_maps_by_descriptor_where_the_kernel_has_it() {
    let sim = Sim::new(&[(0, (1 << 48) - 1)]);
    let space = Iommufd::with_ioctl(sim.clone(), 48).unwrap();
    let memfd_region = || {
        Arc::new(
            Region::builder(8 * PAGE as usize)
                .page_size(PageSize::Base)
                .memfd()
                .lock(false)
                .build()
                .unwrap(),
        )
    };
    let err = space
        .map_file(memfd_region(), Access::ReadOnly)
        .unwrap_err();
    assert!(
        matches!(&err, Error::MapFile { kind: Kind::Iommufd, source } if source.raw_os_error() == Some(libc::ENOTTY)),
        "{err}"
    );
    assert!(err.to_string().contains("6.13"), "{err}");
    assert!(sim.state().mappings.is_empty());
    assert_eq!(space.stats().map_errors, 1);

    sim.state().map_file = true;
    let mapping = space.map_file(memfd_region(), Access::ReadOnly).unwrap();
    let iova = mapping.iova(0).unwrap().raw();
    assert_eq!(sim.state().file_mappings[&iova], (0, 8 * PAGE));
    assert_eq!(sim.state().accesses[&iova], Access::ReadOnly);
    assert_eq!(mapping.access(), Access::ReadOnly);
    drop(mapping);
    assert!(sim.state().mappings.is_empty());

    // Anonymous memory has no file to map.
    let err = space.map_file(region(2), Access::ReadWrite).unwrap_err();
    assert!(matches!(err, Error::MapFile { .. }), "{err}");
}
