//! `VFIO_IOMMU_GET_INFO` replies as arbitrary bytes: the capability-chain parser never panics,
//! always ends, and what it accepts is consistent (ranges ordered, the DMA-avail count taken
//! from the reply).
#![no_main]

use libfuzzer_sys::fuzz_target;
use userdma::dma::Type1Info;

fuzz_target!(|data: &[u8]| {
    let Ok(info) = Type1Info::parse(data) else {
        return;
    };
    // A reply that parsed holds at least the fixed header (argsz, flags, pgsizes, cap_offset).
    assert!(data.len() >= 24);
    assert_eq!(
        info.flags,
        u32::from_ne_bytes(data[4..8].try_into().expect("4 bytes"))
    );
    if let Some(ranges) = &info.iova_ranges {
        for r in ranges {
            assert!(r.start <= r.last, "inverted range {r:?} accepted");
        }
    }
    // Parsing is a pure function of the bytes.
    assert_eq!(Type1Info::parse(data).ok(), Some(info));
});
