//! The IOMMU fault log parser (`pci::faults`), two ways. Arbitrary text: `parse_fault` and
//! `kmsg_message` never panic, and a parsed fault's reason is one line. A model: a fault drawn
//! from the input is written as the Intel or AMD driver would log it (in a `/dev/kmsg` record or
//! a `dmesg` line, with or without a PASID or the device prefix), and the parser must give the
//! same requester, address, access and reason back.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use userdma::pci::faults::{kmsg_message, parse_fault, Access};
use userdma::pci::Bdf;

#[derive(Debug, Arbitrary)]
struct Line {
    domain: u16,
    bus: u8,
    device: u8,
    function: u8,
    addr: u64,
    write: bool,
    amd: bool,
    /// Intel: a PASID (or NO_PASID); AMD: the device named in the message, not the prefix.
    pasid: Option<u32>,
    code: u8,
    reason: String,
    domain_id: u16,
    flags: u16,
    /// A `/dev/kmsg` record header, a `dmesg` time stamp, or neither.
    framing: u8,
    seq: u32,
}

fn model(line: &Line) {
    let Ok(bdf) = Bdf::new(
        u32::from(line.domain),
        line.bus,
        line.device & 0x1f,
        line.function & 7,
    ) else {
        return;
    };
    // The kernel prints the reason text from a fixed table: one line, no brackets.
    let reason: String = line
        .reason
        .chars()
        .filter(|c| !c.is_control() && *c != ']' && *c != '[')
        .collect();
    let reason = reason.trim();
    let dir = if line.write { "DMA Write" } else { "DMA Read" };
    let (text, want_bdf, want_reason, want_kind) = if line.amd {
        let flags = if line.write {
            line.flags | 0x20
        } else {
            line.flags & !0x20
        };
        let fields = format!(
            "domain=0x{:04x} address=0x{:x} flags=0x{flags:04x}",
            line.domain_id, line.addr
        );
        let text = match line.pasid {
            Some(_) => format!("AMD-Vi: Event logged [IO_PAGE_FAULT device={bdf} {fields}]"),
            None => format!("vfio-pci {bdf}: AMD-Vi: Event logged [IO_PAGE_FAULT {fields}]"),
        };
        let reason = format!(
            "IO_PAGE_FAULT domain=0x{:04x} flags=0x{flags:04x}",
            line.domain_id
        );
        let kind = if line.write {
            Access::Write
        } else {
            Access::Read
        };
        (text, bdf, reason, kind)
    } else {
        let pasid = match line.pasid {
            Some(p) => format!("PASID 0x{p:x}"),
            None => "NO_PASID".to_owned(),
        };
        let text = format!(
            "DMAR: [{dir} {pasid}] Request device [{:02x}:{:02x}.{}] fault addr 0x{:x} [fault reason 0x{:02x}] {reason}",
            bdf.bus(),
            bdf.device(),
            bdf.function(),
            line.addr,
            line.code
        );
        // Intel names no segment.
        let Ok(in_segment_0) = Bdf::new(0, bdf.bus(), bdf.device(), bdf.function()) else {
            return;
        };
        let want = if reason.is_empty() {
            format!("{:#04x}", line.code)
        } else {
            format!("{:#04x} {reason}", line.code)
        };
        let kind = if line.write {
            Access::Write
        } else {
            Access::Read
        };
        (text, in_segment_0, want, kind)
    };
    let framed = match line.framing % 3 {
        0 => format!("3,{},{},-;{text}", line.seq, u64::from(line.seq) * 7),
        1 => format!(
            "[{:5}.{:06}] {text}",
            line.seq % 100_000,
            line.seq % 1_000_000
        ),
        _ => text.clone(),
    };
    let message = kmsg_message(&framed).expect("a record line is a message");
    let fault = parse_fault(message).unwrap_or_else(|| panic!("not parsed: {framed:?}"));
    assert_eq!(fault.bdf, want_bdf, "{framed:?}");
    assert_eq!(fault.addr, line.addr, "{framed:?}");
    assert_eq!(fault.kind, want_kind, "{framed:?}");
    assert_eq!(fault.reason, want_reason, "{framed:?}");
}

fuzz_target!(|data: &[u8]| {
    // Any text: no panic, and what parses is sane.
    let text = String::from_utf8_lossy(data);
    for line in text.split('\n') {
        if let Some(message) = kmsg_message(line) {
            if let Some(fault) = parse_fault(message) {
                assert!(!fault.reason.contains('\n'));
                assert!(fault.bdf.device() <= 0x1f && fault.bdf.function() <= 7);
            }
        }
    }
    // The model.
    let mut u = Unstructured::new(data);
    while let Ok(line) = Line::arbitrary(&mut u) {
        model(&line);
        if u.is_empty() {
            break;
        }
    }
});
