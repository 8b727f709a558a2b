//! The loopback device's translation table: what the device can reach (exactly what is mapped),
//! unmapping, the DMA mask, and lookups racing with map/unmap from another thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use userdma::dma::{Error, Iova, IovaRange, Kind, SoftIommu, Space};
use userdma::memory::{PageSize, Region};

const PAGE: usize = 4096;

fn region(pages: usize) -> Arc<Region> {
    Arc::new(
        Region::builder(pages * PAGE)
            .page_size(PageSize::Base)
            .lock(false)
            .build()
            .expect("a small base-page region"),
    )
}

#[test]
fn the_device_reaches_exactly_what_is_mapped() {
    let space = SoftIommu::new(32).unwrap();
    let mapping = space.map(region(4)).unwrap();
    let base = mapping.iova(0).unwrap();
    assert_eq!(mapping.kind(), Kind::SoftIommu);
    assert_eq!(
        space.mapped_ranges(),
        vec![IovaRange::from_len(base.raw(), 4 * PAGE as u64).unwrap()]
    );

    // Host writes, device reads.
    mapping.slice().write(100, 0xdead_beefu32).unwrap();
    let window = space.translate(base + 100, 4).unwrap();
    assert_eq!(window.len(), 4);
    assert_eq!(window.slice().read::<u32>(0).unwrap(), 0xdead_beef);
    // Device writes, host reads.
    space
        .translate(base + 4 * PAGE as u64 - 8, 8)
        .unwrap()
        .slice()
        .write(0, 42u64)
        .unwrap();
    assert_eq!(mapping.slice().read::<u64>(4 * PAGE - 8).unwrap(), 42);

    // One byte past either end, and zero-length accesses, are refused.
    assert!(space.translate(base + 4 * PAGE as u64 - 8, 9).is_none());
    assert!(space.translate(base - 1, 2).is_none());
    assert!(space.translate(base, 0).is_none());
    assert!(space.translate(Iova(u64::MAX), 1).is_none());
    assert!(space.translate(Iova(u64::MAX - 1), 4).is_none());

    mapping.unmap().unwrap();
    assert!(space.translate(base + 100, 4).is_none());
    assert!(space.mapped_ranges().is_empty());
    let stats = space.stats();
    assert_eq!((stats.maps, stats.unmaps, stats.live_bytes), (1, 1, 0));
}

#[test]
fn neighbouring_mappings_do_not_leak_into_each_other() {
    let space = SoftIommu::new(32).unwrap();
    let a = space.map(region(1)).unwrap();
    let b = space.map(region(1)).unwrap();
    let (ia, ib) = (a.iova(0).unwrap(), b.iova(0).unwrap());
    assert_eq!(ib, ia + PAGE as u64, "placed next to each other");
    // A device access straddling both pieces is refused: they are different host memory.
    assert!(space.translate(ib - 4, 8).is_none());
    b.slice().write(0, 7u8).unwrap();
    assert_eq!(
        space
            .translate(ib, 1)
            .unwrap()
            .slice()
            .read::<u8>(0)
            .unwrap(),
        7
    );
    assert_eq!(
        space
            .translate(ia, 1)
            .unwrap()
            .slice()
            .read::<u8>(0)
            .unwrap(),
        0
    );
}

#[test]
fn the_dma_mask_and_ranges_bound_placement() {
    let space = SoftIommu::new(20).unwrap();
    let mut mappings = Vec::new();
    while let Ok(mapping) = space.map(region(16)) {
        let last = mapping.iova(mapping.len() - 1).unwrap();
        assert!(last.raw() < 1 << 20);
        assert_ne!(mapping.iova(0).map(|i| i.raw()), Some(0));
        mappings.push(mapping);
    }
    // 1 MiB of space minus the null page: 15 whole 64 KiB regions.
    assert_eq!(mappings.len(), 15);
    let err = space.map(region(16)).unwrap_err();
    assert!(err.to_string().contains("20-bit"), "{err}");

    let windows = [IovaRange::new(0x1_0000, 0x1_ffff).unwrap()];
    let space = SoftIommu::with_ranges(32, &windows).unwrap();
    let mapping = space.map(region(16)).unwrap();
    assert_eq!(mapping.iova(0).map(|i| i.raw()), Some(0x1_0000));
    assert!(matches!(
        space.map(region(1)),
        Err(Error::IovaExhausted { .. })
    ));
}

#[test]
fn a_window_keeps_memory_alive_after_the_host_unmaps() {
    let space = SoftIommu::new(32).unwrap();
    let mapping = space.map(region(1)).unwrap();
    mapping.slice().write(0, 0x55aa_u16).unwrap();
    let window = space
        .translate(Iova(mapping.iova(0).unwrap().raw()), 2)
        .unwrap();
    drop(mapping);
    // The table no longer has it, but the device's in-flight access still has valid memory.
    assert!(space.mapped_ranges().is_empty());
    assert_eq!(window.slice().read::<u16>(0).unwrap(), 0x55aa);
}

#[test]
fn lookups_race_safely_with_map_and_unmap() {
    let space = SoftIommu::new(32).unwrap();
    let stop = AtomicBool::new(false);
    let lookups = AtomicU64::new(0);
    let stable = space.map(region(1)).unwrap();
    stable.slice().write(0, 0x1234_5678u32).unwrap();
    let stable_iova = stable.iova(0).unwrap();
    std::thread::scope(|scope| {
        let device = scope.spawn(|| {
            // Relaxed: the flag only ends the loop; nothing is published through it.
            while !stop.load(Ordering::Relaxed) {
                let window = space
                    .translate(Iova(stable_iova.raw()), 4)
                    .expect("the stable mapping");
                assert_eq!(window.slice().read::<u32>(0).unwrap(), 0x1234_5678);
                // Whatever else is mapped at this moment must be readable.
                for range in space.mapped_ranges() {
                    if let Some(window) = space.translate(Iova(range.start), 1) {
                        window.slice().read::<u8>(0).unwrap();
                    }
                }
                // Relaxed: a count the host only reads to know the race has been run.
                lookups.fetch_add(1, Ordering::Relaxed);
            }
        });
        // The mappings are mapped and dropped untouched: the device thread may be reading any
        // of them, and a host write meanwhile would be a data race (a real device's reads would
        // race the same way; the buffer contract forbids it), which is not what this tests.
        // The host maps and unmaps at least 200 times and until the device thread has looked up
        // 200 times, so the two really overlap however the threads are scheduled (a device thread
        // that had not started before the host's rounds ended tested nothing). A device thread
        // that panicked ends the loop, and its panic fails the test at the join.
        let mut round = 0usize;
        while (round < 200 || lookups.load(Ordering::Relaxed) < 200) && !device.is_finished() {
            let mapping = space.map(region(1 + round % 4)).unwrap();
            drop(mapping);
            round += 1;
            if round % 64 == 0 {
                std::thread::yield_now();
            }
        }
        stop.store(true, Ordering::Relaxed);
        device.join().expect("the device thread's lookups");
        assert!(lookups.load(Ordering::Relaxed) >= 200);
    });
    assert_eq!(space.mapped_ranges().len(), 1);
}

#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<userdma::dma::Mapping>();
    send_sync::<userdma::dma::Slice<'static>>();
    send_sync::<userdma::dma::Window>();
    send_sync::<SoftIommu>();
    send_sync::<userdma::dma::Type1>();
    send_sync::<userdma::dma::Iommufd>();
    send_sync::<userdma::dma::Physical>();
    send_sync::<Region>();
    send_sync::<Arc<dyn Space>>();
}
