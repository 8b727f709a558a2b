//! The `pci.ids` parser: never panics, and every vendor, device and class line it accepted can
//! be looked up.
#![no_main]

use libfuzzer_sys::fuzz_target;
#[path = "../../cli/src/bounded.rs"]
#[allow(dead_code)]
mod bounded;
#[path = "../../cli/src/ids.rs"]
#[allow(dead_code)]
mod ids;

use ids::Ids;

/// The ID at the start of `s` if it is `width` hex digits followed by whitespace.
fn id(s: &str, width: usize) -> Option<u32> {
    let digits = s.get(..width)?;
    if !s[width..].starts_with([' ', '\t']) || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(ids) = Ids::parse(text) else { return };
    // Reference model: scan the top-level lines again and check each is found.
    for line in text.lines() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if let Some(class) = line.strip_prefix("C ") {
            let c = id(class, 2).expect("accepted class line");
            assert!(ids.base_class(u8::try_from(c).unwrap()).is_some());
        } else if !line.starts_with('\t') {
            let v = id(line, 4).expect("accepted vendor line");
            assert!(ids.vendor(u16::try_from(v).unwrap()).is_some());
        }
    }
    let _ = (ids.vendor_count(), ids.class_count(), ids.class(0x02_00_00));
});
