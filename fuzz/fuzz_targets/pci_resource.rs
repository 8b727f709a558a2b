//! The sysfs `resource` parser: never panics, and an accepted file re-printed in the kernel's
//! format parses to the same resources.
#![no_main]

use libfuzzer_sys::fuzz_target;
use userdma::pci::{parse_resource, MAX_RESOURCE_LINES};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(resources) = parse_resource(text) else {
        return;
    };
    assert!(resources.len() <= MAX_RESOURCE_LINES);
    let mut printed = String::new();
    for (i, r) in resources.iter().enumerate() {
        assert_eq!(r.index(), i);
        if r.end() == 0 {
            assert_eq!(r.size(), 0);
        } else {
            assert!(r.start() <= r.end());
            assert_eq!(r.size(), r.end() - r.start() + 1);
        }
        let _ = (
            r.kind(),
            r.is_io(),
            r.is_mem(),
            r.is_prefetchable(),
            r.is_64bit(),
        );
        printed.push_str(&format!(
            "0x{:016x} 0x{:016x} 0x{:016x}\n",
            r.start(),
            r.end(),
            r.flags()
        ));
    }
    assert_eq!(
        parse_resource(&printed).expect("kernel format parses"),
        resources
    );
});
