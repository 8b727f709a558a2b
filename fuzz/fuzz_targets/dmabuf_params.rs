//! The parameters of a dma-buf export and of the reverse lookup, from any caller: ranges of any
//! count, offset and length over a memfd region of any size. `dmabuf::export` must refuse what
//! a model says is invalid (count, alignment, bounds) with the matching error, never panic,
//! and reach the kernel only with valid ranges (on a kernel without udmabuf that is
//! `NoUdmabuf`; with one, a dma-buf of exactly the ranges' bytes whose lookup walks them in
//! order); `Origin::region_offset` and `contiguous` agree with a model for any ranges.

#![no_main]

use std::sync::{Arc, OnceLock};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::dmabuf::{self, Error, Importers, Origin};
use userdma::memory::{PageSize, Region};

const PAGE: usize = 4096;

#[derive(Debug, Arbitrary)]
struct Input {
    /// Region pages, 1..=64.
    pages: u8,
    ranges: Vec<(u32, u32)>,
    /// Scale the values to pages (likelier to be valid) or take them as bytes.
    in_pages: bool,
    dma_only: bool,
    lookups: Vec<u32>,
}

fn region(pages: usize) -> Arc<Region> {
    static REGIONS: OnceLock<Vec<Arc<Region>>> = OnceLock::new();
    let regions = REGIONS.get_or_init(|| {
        (1..=64)
            .map(|n| {
                Arc::new(
                    Region::builder(n * PAGE)
                        .page_size(PageSize::Base)
                        .memfd()
                        .lock(false)
                        .build()
                        .expect("a memfd region"),
                )
            })
            .collect()
    });
    Arc::clone(&regions[pages - 1])
}

fuzz_target!(|input: Input| {
    let pages = usize::from(input.pages % 64) + 1;
    let region = region(pages);
    let len = pages * PAGE;
    let ranges: Vec<(usize, usize)> = input
        .ranges
        .iter()
        .take(1100)
        .map(|&(o, l)| {
            if input.in_pages {
                ((o % 80) as usize * PAGE, (l % 80) as usize * PAGE)
            } else {
                (o as usize, l as usize)
            }
        })
        .collect();
    let importers = if input.dma_only {
        Importers::DmaOnly
    } else {
        Importers::Any
    };
    let count_ok = !ranges.is_empty() && ranges.len() <= 1024;
    let bad_range = ranges.iter().find(|&&(o, l)| {
        l == 0 || o % PAGE != 0 || l % PAGE != 0 || o.checked_add(l).is_none_or(|end| end > len)
    });
    match dmabuf::export(&region, &ranges, importers) {
        Err(Error::RangeCount { count, .. }) => {
            assert!(!count_ok);
            assert_eq!(count, ranges.len());
        }
        Err(Error::Range { offset, len: l, .. }) => {
            assert!(count_ok);
            assert_eq!(
                bad_range,
                Some(&(offset, l)),
                "the first bad range is named"
            );
        }
        Err(Error::NoUdmabuf { .. }) | Err(Error::Create { .. }) => {
            assert!(
                count_ok && bad_range.is_none(),
                "the kernel was asked with bad ranges"
            );
        }
        Err(other) => panic!("unexpected refusal: {other}"),
        Ok(export) => {
            assert!(count_ok && bad_range.is_none());
            let total: usize = ranges.iter().map(|&(_, l)| l).sum();
            assert_eq!(export.dmabuf().len(), total);
            let origin = dmabuf::origin(export.dmabuf()).expect("its own export");
            assert_eq!(origin.ranges, ranges);
        }
    }

    // The lookup's arithmetic against a model, for any ranges (valid or not, bounded).
    let bounded: Vec<(usize, usize)> = ranges
        .iter()
        .take(64)
        .map(|&(o, l)| (o % (1 << 30), l % (1 << 30)))
        .collect();
    let origin = Origin {
        region,
        ranges: bounded.clone(),
    };
    let total: usize = bounded.iter().map(|&(_, l)| l).sum();
    for &n in input.lookups.iter().take(16) {
        let n = n as usize % (total + 2);
        let mut model = None;
        let mut start = 0;
        for &(o, l) in &bounded {
            if n < start + l {
                model = Some(o + (n - start));
                break;
            }
            start += l;
        }
        assert_eq!(origin.region_offset(n), model);
    }
    let joined = bounded.first().and_then(|&(first, _)| {
        let mut end = first;
        for &(o, l) in &bounded {
            if o != end {
                return None;
            }
            end = o + l;
        }
        Some((first, end - first))
    });
    assert_eq!(origin.contiguous(), joined);
});
