//! Capability-list walk over arbitrary configuration-space bytes: never panics, always ends,
//! and whatever it reports is consistent with the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use userdma::pci::{CapabilityKind, ConfigSpace, Walk};

fuzz_target!(|data: &[u8]| {
    let config = ConfigSpace::new(data);
    let _ = (
        config.vendor_id(),
        config.device_id(),
        config.revision(),
        config.class(),
    );
    let _ = (config.header_type(), config.interrupt_pin());
    let caps = config.capabilities();
    assert!(caps.entries.len() <= 48);
    let mut seen = std::collections::HashSet::new();
    for c in &caps.entries {
        assert!(
            c.offset >= 0x40 && c.offset % 4 == 0,
            "offset {:#x}",
            c.offset
        );
        assert!(seen.insert(c.offset), "offset {:#x} twice", c.offset);
        assert_eq!(data[usize::from(c.offset)], c.id);
        match &c.kind {
            CapabilityKind::Msi(m) => assert!(m.vectors.is_power_of_two() && m.vectors <= 32),
            CapabilityKind::MsiX(x) => {
                assert!((1..=2048).contains(&x.table_size));
                assert!(x.table_bar <= 7 && x.pba_bar <= 7);
            }
            CapabilityKind::Express(_) | CapabilityKind::Other => {}
        }
    }
    match caps.walk {
        Walk::Truncated { needed, available } => {
            assert_eq!(available, data.len());
            assert!(needed > available);
        }
        Walk::Complete => assert_eq!(caps.is_known(), true),
        Walk::Malformed(_) | Walk::Unreadable(_) => assert!(!caps.is_known()),
    }
});
