//! The VFIO region-info parser (`device::vfio::RegionInfo::parse`) against a model: a reply
//! built from an arbitrary header and capability chain parses to exactly what was encoded (the
//! first sparse-mmap, type and MSI-X capability count; unknown ones are skipped), and any byte
//! string, including the encoded reply with arbitrary corruption, parses or fails without
//! panicking, looping or allocating for areas that are not there.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::device::vfio::{RegionInfo, SparseArea};

/// `VFIO_REGION_INFO_FLAG_CAPS`, `_CAP_SPARSE_MMAP`, `_CAP_TYPE`, `_CAP_MSIX_MAPPABLE`.
const FLAG_CAPS: u32 = 1 << 3;
const SPARSE: u16 = 1;
const TYPE: u16 = 2;
const MSIX: u16 = 3;

#[derive(Debug, Arbitrary)]
enum Cap {
    Sparse(Vec<(u64, u64)>),
    Type(u32, u32),
    Msix,
    Unknown { id: u16, body: Vec<u8> },
}

#[derive(Debug, Arbitrary)]
struct Input {
    flags: u32,
    index: u32,
    size: u64,
    offset: u64,
    caps: Vec<Cap>,
    /// Bytes of padding after each capability (kept 8-aligned).
    gap: u8,
    /// Corruption applied to the encoded reply: (position, byte).
    corrupt: Vec<(u16, u8)>,
    /// Cut the reply to this length (when shorter).
    cut: Option<u16>,
    raw: Vec<u8>,
}

fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_ne_bytes());
}

fn put64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_ne_bytes());
}

fuzz_target!(|input: Input| {
    // Any bytes: no panic.
    let _ = RegionInfo::parse(&input.raw);

    let caps: Vec<&Cap> = input
        .caps
        .iter()
        .filter(|c| match c {
            Cap::Unknown { id, .. } => !matches!(*id, SPARSE | TYPE | MSIX),
            Cap::Sparse(areas) => areas.iter().all(|(o, s)| o.checked_add(*s).is_some()),
            _ => true,
        })
        .take(8)
        .collect();
    let flags = if caps.is_empty() {
        input.flags & !FLAG_CAPS
    } else {
        input.flags | FLAG_CAPS
    };
    let mut b = Vec::new();
    put32(&mut b, 0);
    put32(&mut b, flags);
    put32(&mut b, input.index);
    put32(&mut b, 0);
    put64(&mut b, input.size);
    put64(&mut b, input.offset);
    let gap = usize::from(input.gap % 4) * 8;
    let mut prev_next: Option<usize> = None;
    for cap in &caps {
        let at = b.len();
        let link = prev_next.unwrap_or(12);
        b[link..link + 4].copy_from_slice(&(at as u32).to_ne_bytes());
        let id = match cap {
            Cap::Sparse(_) => SPARSE,
            Cap::Type(..) => TYPE,
            Cap::Msix => MSIX,
            Cap::Unknown { id, .. } => *id,
        };
        b.extend_from_slice(&id.to_ne_bytes());
        b.extend_from_slice(&1u16.to_ne_bytes());
        put32(&mut b, 0);
        match cap {
            Cap::Sparse(areas) => {
                let areas = &areas[..areas.len().min(32)];
                put32(&mut b, areas.len() as u32);
                put32(&mut b, 0);
                for (o, s) in areas {
                    put64(&mut b, *o);
                    put64(&mut b, *s);
                }
            }
            Cap::Type(t, s) => {
                put32(&mut b, *t);
                put32(&mut b, *s);
            }
            Cap::Msix => {}
            Cap::Unknown { body, .. } => b.extend_from_slice(&body[..body.len().min(64)]),
        }
        while b.len() % 8 != 0 {
            b.push(0);
        }
        b.extend(std::iter::repeat_n(0u8, gap));
        prev_next = Some(at + 4);
    }
    let argsz = b.len() as u32;
    b[0..4].copy_from_slice(&argsz.to_ne_bytes());

    // The model.
    let info = RegionInfo::parse(&b).expect("a well-formed reply parses");
    assert_eq!(
        (info.flags, info.index, info.size, info.offset),
        (flags, input.index, input.size, input.offset)
    );
    let want_sparse = caps.iter().find_map(|c| match c {
        Cap::Sparse(areas) => Some(
            areas[..areas.len().min(32)]
                .iter()
                .map(|&(offset, size)| SparseArea { offset, size })
                .collect::<Vec<_>>(),
        ),
        _ => None,
    });
    assert_eq!(info.sparse, want_sparse);
    let want_type = caps.iter().find_map(|c| match c {
        Cap::Type(t, s) => Some((*t, *s)),
        _ => None,
    });
    assert_eq!(info.region_type, want_type);
    assert_eq!(
        info.msix_mappable,
        caps.iter().any(|c| matches!(c, Cap::Msix))
    );
    // Mappable areas are inside the region.
    for area in info.mmap_areas() {
        assert!(area
            .offset
            .checked_add(area.size)
            .is_some_and(|e| e <= info.size));
    }

    // Corrupted and cut copies: no panic.
    let mut bad = b.clone();
    for &(pos, byte) in input.corrupt.iter().take(16) {
        let len = bad.len();
        if let Some(slot) = bad.get_mut(usize::from(pos) % len) {
            *slot = byte;
        }
    }
    if let Some(cut) = input.cut {
        bad.truncate(usize::from(cut));
    }
    if let Ok(info) = RegionInfo::parse(&bad) {
        for area in info.mmap_areas() {
            assert!(area
                .offset
                .checked_add(area.size)
                .is_some_and(|e| e <= info.size));
        }
    }
});
