//! PCI address parsing: never panics, and every accepted address prints canonically and
//! parses back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use userdma::pci::Bdf;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text.parse::<Bdf>() {
        Ok(bdf) => {
            let canonical = bdf.to_string();
            let again: Bdf = canonical.parse().expect("canonical form parses");
            assert_eq!(again, bdf);
            assert_eq!(again.to_string(), canonical);
            // Bus, device and function are printed as given, lower-cased; only the domain is
            // normalised (added when missing, leading zeros beyond four digits dropped).
            let tail = &canonical[canonical.find(':').expect("domain separator")..];
            let lower = format!(":{}", text.to_ascii_lowercase());
            assert!(lower.ends_with(tail), "{text:?}");
            assert!(bdf.device() <= 0x1f && bdf.function() <= 7);
        }
        Err(e) => {
            assert!(e.to_string().contains("DDDD:BB:DD.F"));
            assert!(e.input().chars().count() <= 65);
        }
    }
});
