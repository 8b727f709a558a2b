//! Tests of the region and interrupt info parsers, and the region replies they build (the
//! device tests build theirs with `reply` and `sparse_body` too).

use super::*;

/// A region reply: header, then the given capabilities (id, bytes after the cap header),
/// chained in order.
pub(crate) fn reply(
    index: u32,
    size: u64,
    offset: u64,
    flags: u32,
    caps: &[(u16, Vec<u8>)],
) -> Vec<u8> {
    let mut bytes = vec![0u8; size_of::<vfio_region_info>()];
    let mut flags = flags;
    if !caps.is_empty() {
        flags |= VFIO_REGION_INFO_FLAG_CAPS;
    }
    put(&mut bytes, 4, &flags.to_ne_bytes());
    put(&mut bytes, 8, &index.to_ne_bytes());
    put(&mut bytes, 16, &size.to_ne_bytes());
    put(&mut bytes, 24, &offset.to_ne_bytes());
    let mut prev_next: Option<usize> = None;
    for (id, body) in caps {
        let at = bytes.len();
        match prev_next {
            None => put(&mut bytes, 12, &(at as u32).to_ne_bytes()),
            Some(p) => put(&mut bytes, p, &(at as u32).to_ne_bytes()),
        }
        bytes.extend_from_slice(&id.to_ne_bytes());
        bytes.extend_from_slice(&1u16.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(body);
        while bytes.len() % 8 != 0 {
            bytes.push(0);
        }
        prev_next = Some(at + 4);
    }
    let argsz = bytes.len() as u32;
    put(&mut bytes, 0, &argsz.to_ne_bytes());
    bytes
}

pub(crate) fn sparse_body(areas: &[(u64, u64)]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(areas.len() as u32).to_ne_bytes());
    body.extend_from_slice(&0u32.to_ne_bytes());
    for (offset, size) in areas {
        body.extend_from_slice(&offset.to_ne_bytes());
        body.extend_from_slice(&size.to_ne_bytes());
    }
    body
}

const RW_MMAP: u32 =
    VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE | VFIO_REGION_INFO_FLAG_MMAP;

#[test]
fn plain_region() {
    let bytes = reply(0, 0x1000, 0x10_0000, RW_MMAP, &[]);
    let info = RegionInfo::parse(&bytes).unwrap();
    assert_eq!(info.index, 0);
    assert_eq!(info.size, 0x1000);
    assert_eq!(info.offset, 0x10_0000);
    assert!(info.readable() && info.writable() && info.mappable());
    assert_eq!(info.sparse, None);
    assert_eq!(
        info.mmap_areas(),
        vec![SparseArea {
            offset: 0,
            size: 0x1000
        }]
    );
    assert_eq!(info.flag_names(), "read write mmap");
}

#[test]
fn sparse_type_and_msix_caps() {
    let caps = vec![
        (
            VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16,
            sparse_body(&[(0, 0x2000), (0x3000, 0x1000), (0x8000, 0x9000)]),
        ),
        (77, vec![1, 2, 3, 4]),
        (VFIO_REGION_INFO_CAP_TYPE as u16, {
            let mut b = 5u32.to_ne_bytes().to_vec();
            b.extend_from_slice(&6u32.to_ne_bytes());
            b
        }),
        (VFIO_REGION_INFO_CAP_MSIX_MAPPABLE as u16, vec![]),
    ];
    let bytes = reply(2, 0x10000, 0x20_0000, RW_MMAP, &caps);
    let info = RegionInfo::parse(&bytes).unwrap();
    assert_eq!(
        info.sparse.as_deref(),
        Some(
            &[
                SparseArea {
                    offset: 0,
                    size: 0x2000
                },
                SparseArea {
                    offset: 0x3000,
                    size: 0x1000
                },
                SparseArea {
                    offset: 0x8000,
                    size: 0x9000
                },
            ][..]
        )
    );
    assert_eq!(info.region_type, Some((5, 6)));
    assert!(info.msix_mappable);
    // The third area runs past the region: not mapped.
    assert_eq!(info.mmap_areas().len(), 2);
    assert!(info.flag_names().ends_with("caps"));
}

#[test]
fn not_mappable_has_no_areas() {
    let bytes = reply(1, 0x100, 0, VFIO_REGION_INFO_FLAG_READ, &[]);
    let info = RegionInfo::parse(&bytes).unwrap();
    assert!(info.mmap_areas().is_empty());
    let empty = RegionInfo::parse(&reply(1, 0, 0, RW_MMAP, &[])).unwrap();
    assert!(empty.mmap_areas().is_empty());
}

#[test]
fn malformed_replies() {
    assert_eq!(
        RegionInfo::parse(&[0u8; 31]),
        Err(RegionDefect::TooShort { len: 31 })
    );
    // Cap offset inside the header.
    let mut bytes = reply(0, 0x1000, 0, RW_MMAP, &[]);
    put(
        &mut bytes,
        4,
        &(RW_MMAP | VFIO_REGION_INFO_FLAG_CAPS).to_ne_bytes(),
    );
    put(&mut bytes, 12, &8u32.to_ne_bytes());
    assert_eq!(
        RegionInfo::parse(&bytes),
        Err(RegionDefect::CapInsideHeader { offset: 8 })
    );
    // Cap offset past the end.
    put(&mut bytes, 12, &64u32.to_ne_bytes());
    assert_eq!(
        RegionInfo::parse(&bytes),
        Err(RegionDefect::CapOutOfBounds { offset: 64 })
    );
    // Misaligned.
    put(&mut bytes, 12, &33u32.to_ne_bytes());
    assert_eq!(
        RegionInfo::parse(&bytes),
        Err(RegionDefect::Misaligned { offset: 33 })
    );
    // A loop: the cap points at itself.
    let mut looped = reply(0, 0x1000, 0, RW_MMAP, &[(99, vec![])]);
    put(&mut looped, 32 + 4, &32u32.to_ne_bytes());
    assert_eq!(
        RegionInfo::parse(&looped),
        Err(RegionDefect::ChainNotAscending { offset: 32 })
    );
    // Sparse areas past the end.
    let mut body = sparse_body(&[(0, 0x1000)]);
    body[0..4].copy_from_slice(&3u32.to_ne_bytes());
    let bytes = reply(
        0,
        0x1000,
        0,
        RW_MMAP,
        &[(VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16, body)],
    );
    assert_eq!(
        RegionInfo::parse(&bytes),
        Err(RegionDefect::CapOutOfBounds { offset: 32 })
    );
    // Too many areas.
    let mut body = sparse_body(&[]);
    body[0..4].copy_from_slice(&u32::MAX.to_ne_bytes());
    let bytes = reply(
        0,
        0x1000,
        0,
        RW_MMAP,
        &[(VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16, body)],
    );
    assert!(matches!(
        RegionInfo::parse(&bytes),
        Err(RegionDefect::TooManyAreas { .. })
    ));
    // Overflowing area.
    let bytes = reply(
        0,
        0x1000,
        0,
        RW_MMAP,
        &[(
            VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16,
            sparse_body(&[(u64::MAX, 2)]),
        )],
    );
    assert!(matches!(
        RegionInfo::parse(&bytes),
        Err(RegionDefect::AreaOverflows { .. })
    ));
    // Type cap truncated.
    let bytes = reply(
        0,
        0x1000,
        0,
        RW_MMAP,
        &[(VFIO_REGION_INFO_CAP_TYPE as u16, vec![])],
    );
    let cut = &bytes[..bytes.len() - 8 + 4];
    assert!(RegionInfo::parse(cut).is_err());
    for defect in [
        RegionDefect::TooShort { len: 1 },
        RegionDefect::TooLarge { argsz: 9 },
        RegionDefect::TooManyAreas {
            offset: 1,
            count: 2,
        },
    ] {
        assert!(!defect.to_string().is_empty());
    }
}

#[test]
fn caps_ignored_without_flag() {
    let mut bytes = reply(
        0,
        0x1000,
        0,
        RW_MMAP,
        &[(
            VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16,
            sparse_body(&[(0, 0x1000)]),
        )],
    );
    put(&mut bytes, 4, &RW_MMAP.to_ne_bytes());
    assert_eq!(RegionInfo::parse(&bytes).unwrap().sparse, None);
}

#[test]
fn irq_info_parse_and_flags() {
    let mut bytes = vec![0u8; 16];
    put(&mut bytes, 0, &16u32.to_ne_bytes());
    put(
        &mut bytes,
        4,
        &(VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_MASKABLE | VFIO_IRQ_INFO_AUTOMASKED).to_ne_bytes(),
    );
    put(&mut bytes, 8, &0u32.to_ne_bytes());
    put(&mut bytes, 12, &1u32.to_ne_bytes());
    let info = IrqInfo::parse(&bytes).unwrap();
    assert_eq!(info.count, 1);
    assert!(info.eventfd() && info.maskable() && info.automasked() && !info.noresize());
    assert_eq!(info.flag_names(), "eventfd maskable automasked");
    assert_eq!(IrqInfo::parse(&bytes[..15]), None);
    let raw = vfio_irq_info {
        argsz: 16,
        flags: VFIO_IRQ_INFO_NORESIZE,
        index: 2,
        count: 8,
    };
    let info = IrqInfo::from_raw(&raw);
    assert_eq!((info.index, info.count), (2, 8));
    assert!(info.noresize() && !info.eventfd());
}
