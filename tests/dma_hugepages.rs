//! Physical-address DMA spaces over real hugepages (needs root: the pool is topped up for each
//! test and put back by a guard; physical addresses need CAP_SYS_ADMIN). Tests in this file run
//! one at a time, since they resize the same pools.

use std::sync::Arc;

use userdma::dma::{Error, Kind, Physical, Space};

use userdma::memory::{PageSize, Region};

mod reserve;

use reserve::{reserve, serial};

fn hugepage_region(len: usize, size: PageSize) -> Arc<Region> {
    Arc::new(Region::builder(len).page_size(size).build().unwrap())
}

#[test]
fn physical_space_maps_2m_pages_at_their_physical_addresses_hugepages() {
    let _serial = serial();
    let _pool = reserve(4, PageSize::Huge2M);
    let region = hugepage_region(8 << 20, PageSize::Huge2M);
    let pages = region
        .physical_pages()
        .unwrap_or_else(|err| panic!("physical addresses need root (CAP_SYS_ADMIN): {err}"));
    let space = Physical::new(64).unwrap();
    let mapping = space.map(Arc::clone(&region)).unwrap();
    assert_eq!(mapping.kind(), Kind::Physical);
    let page = 2 << 20;
    for offset in [0, 1, page - 1, page, 3 * page + 12345, 4 * page - 1] {
        assert_eq!(
            mapping.iova(offset).map(|iova| iova.raw()),
            pages.addr_of(offset),
            "offset {offset:#x}"
        );
    }
    assert_eq!(mapping.iova(4 * page), None);
    // Contiguity follows the physical layout: a run continues exactly when the next page is
    // physically adjacent.
    let addrs = pages.as_slice();
    for index in 0..addrs.len() {
        let mut run = 1;
        while index + run < addrs.len()
            && addrs[index + run - 1] + page as u64 == addrs[index + run]
        {
            run += 1;
        }
        assert_eq!(
            mapping.contiguous_len(index * page),
            run * page,
            "page {index}"
        );
        assert_eq!(mapping.contiguous_len(index * page + 5), run * page - 5);
    }
    // Segments merge adjacent pages and cover the region in order.
    let mut covered = 0;
    for (offset, range) in mapping.segments() {
        assert_eq!(offset, covered);
        assert_eq!(Some(range.start), pages.addr_of(offset));
        covered += range.size() as usize;
    }
    assert_eq!(covered, 8 << 20);
    // What the host writes is at the physical address the device is given: nothing to check
    // without a device, but the handle reads back through the same memory.
    mapping.slice().write(3 * page, 9u64).unwrap();
    assert_eq!(mapping.slice().read::<u64>(3 * page).unwrap(), 9);
    drop(mapping);
    let stats = space.stats();
    assert_eq!((stats.maps, stats.unmaps, stats.live_bytes), (1, 1, 0));
}

#[test]
fn physical_space_maps_a_1g_page_as_one_piece_hugepages() {
    let _serial = serial();
    let _pool = reserve(1, PageSize::Huge1G);
    let region = hugepage_region(1 << 30, PageSize::Huge1G);
    let space = Physical::new(64).unwrap();
    let mapping = space.map(region).unwrap();
    let start = mapping.iova(0).unwrap();
    assert_eq!(start % (1 << 30), 0);
    assert_eq!(mapping.contiguous_len(0), 1 << 30);
    assert_eq!(mapping.iova((1 << 30) - 1), Some(start + (1 << 30) - 1));
    assert_eq!(mapping.iova_range().map(|r| r.size()), Some(1 << 30));
}

#[test]
fn pages_above_the_dma_mask_are_refused_hugepages() {
    let _serial = serial();
    let _pool = reserve(1, PageSize::Huge2M);
    let region = hugepage_region(2 << 20, PageSize::Huge2M);
    // A 21-bit mask reaches the first 2 MiB of physical memory, which never holds a hugepage.
    let space = Physical::new(21).unwrap();
    let err = space.map(region).unwrap_err();
    match &err {
        Error::BeyondMask {
            offset, mask_bits, ..
        } => assert_eq!((*offset, *mask_bits), (0, 21)),
        other => panic!("expected BeyondMask, got {other:?}"),
    }
    assert!(err.to_string().contains("21-bit DMA mask"), "{err}");
    assert_eq!(space.stats().map_errors, 1);
}
