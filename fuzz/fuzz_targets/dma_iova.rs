//! The IOVA allocator against a model: after every operation the allocations do not overlap,
//! lie under the DMA mask and inside the valid ranges, are aligned and sized as asked; the free
//! list is exactly the usable space minus the allocations, coalesced; allocation is lowest
//! first-fit (and fails only when nothing fits); and freeing everything coalesces back to the
//! usable ranges.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::dma::{mask_of, Error, IovaAllocator, IovaRange};

#[derive(Debug, Arbitrary)]
struct Input {
    mask_bits: u8,
    /// Scale of every size and address: units of `1 << shift` bytes.
    shift: u8,
    ranges: Vec<(u16, u16)>,
    /// Add a range ending at the top of the 64-bit space.
    top: Option<u16>,
    ops: Vec<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Alloc { units: u16, align_log2: u8 },
    AllocPartial { units: u16, align_log2: u8 },
    Reserve { start: u16, units: u16 },
    Free { index: u16 },
    FreeBogus { iova: u64 },
}

/// A live allocation as the model knows it.
#[derive(Debug, Clone, Copy)]
struct Live {
    range: IovaRange,
    align: u64,
}

/// The model's own normalisation: clip to the mask, sort, merge overlapping or touching ranges.
fn model_usable(raw: &[IovaRange], mask: u64) -> Vec<IovaRange> {
    let mut clipped: Vec<(u64, u64)> = raw
        .iter()
        .filter(|r| r.start <= mask)
        .map(|r| (r.start, r.last.min(mask)))
        .collect();
    clipped.sort();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (start, last) in clipped {
        if let Some(prev) = out.last_mut() {
            if u128::from(start) <= u128::from(prev.1) + 1 {
                prev.1 = prev.1.max(last);
                continue;
            }
        }
        out.push((start, last));
    }
    out.into_iter()
        .map(|(start, last)| IovaRange { start, last })
        .collect()
}

/// Usable space minus the live allocations.
fn model_free(usable: &[IovaRange], live: &[Live]) -> Vec<IovaRange> {
    let mut taken: Vec<IovaRange> = live.iter().map(|l| l.range).collect();
    taken.sort();
    let mut free = Vec::new();
    for range in usable {
        let mut cursor = Some(range.start);
        for t in taken.iter().filter(|t| range.covers(t)) {
            if let Some(c) = cursor {
                if c < t.start {
                    free.push(IovaRange {
                        start: c,
                        last: t.start - 1,
                    });
                }
            }
            cursor = t.last.checked_add(1);
        }
        if let Some(c) = cursor {
            if c <= range.last {
                free.push(IovaRange {
                    start: c,
                    last: range.last,
                });
            }
        }
    }
    free
}

fn align_up(value: u64, align: u64) -> Option<u64> {
    Some(value.checked_add(align - 1)? & !(align - 1))
}

/// Where lowest first-fit puts `size` bytes aligned to `align`.
fn first_fit(free: &[IovaRange], size: u64, align: u64) -> Option<u64> {
    free.iter().find_map(|r| {
        let start = align_up(r.start, align)?;
        let last = start.checked_add(size - 1)?;
        (start <= r.last && last <= r.last).then_some(start)
    })
}

fn units(shift: u32, n: u64) -> Option<u64> {
    n.checked_shl(shift).filter(|v| v >> shift == n)
}

fn check(alloc: &IovaAllocator, usable: &[IovaRange], live: &[Live], mask: u64) {
    assert_eq!(alloc.usable(), usable, "usable ranges");
    let mut got: Vec<IovaRange> = alloc.allocations().collect();
    let mut want: Vec<IovaRange> = live.iter().map(|l| l.range).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "allocations");
    for pair in want.windows(2) {
        assert!(
            pair[0].last < pair[1].start,
            "overlap {} {}",
            pair[0],
            pair[1]
        );
    }
    for l in live {
        assert!(l.range.last <= mask, "{} above mask {mask:#x}", l.range);
        assert!(
            usable.iter().any(|u| u.covers(&l.range)),
            "{} outside ranges",
            l.range
        );
        assert_eq!(
            l.range.start % l.align,
            0,
            "{} not aligned to {:#x}",
            l.range,
            l.align
        );
    }
    let free: Vec<IovaRange> = alloc.free_ranges().collect();
    assert_eq!(free, model_free(usable, live), "free list");
    for pair in free.windows(2) {
        assert!(
            u128::from(pair[0].last) + 1 < u128::from(pair[1].start),
            "free ranges {} and {} not coalesced",
            pair[0],
            pair[1]
        );
    }
}

fuzz_target!(|input: Input| {
    let mask_bits = 1 + u32::from(input.mask_bits) % 64;
    let shift = u32::from(input.shift) % 56;
    let mut raw = Vec::new();
    for &(start, len) in input.ranges.iter().take(16) {
        let (Some(start), Some(len)) =
            (units(shift, start.into()), units(shift, u64::from(len) + 1))
        else {
            continue;
        };
        if let Some(last) = start.checked_add(len - 1) {
            raw.push(IovaRange { start, last });
        }
    }
    if let Some(len) = input.top.and_then(|n| units(shift, u64::from(n) + 1)) {
        raw.push(IovaRange {
            start: u64::MAX - (len - 1),
            last: u64::MAX,
        });
    }
    let mask = mask_of(mask_bits).unwrap();
    let mut alloc = IovaAllocator::new(mask_bits, &raw).unwrap();
    let usable = model_usable(&raw, mask);
    let mut live: Vec<Live> = Vec::new();
    check(&alloc, &usable, &live, mask);

    for op in input.ops.iter().take(256) {
        match *op {
            Op::Alloc {
                units: n,
                align_log2,
            } => {
                let Some(size) = units(shift, u64::from(n) + 1) else {
                    continue;
                };
                let align = 1u64 << (align_log2 % 64);
                let expected = first_fit(&model_free(&usable, &live), size, align);
                match alloc.alloc(size, align) {
                    Ok(iova) => {
                        assert_eq!(Some(iova), expected, "not lowest first-fit");
                        let range = IovaRange::from_len(iova, size).unwrap();
                        live.push(Live { range, align });
                    }
                    Err(Error::IovaExhausted {
                        size: s,
                        mask_bits: m,
                        ..
                    }) => {
                        assert_eq!((s, m), (size, mask_bits));
                        assert_eq!(expected, None, "refused although {size:#x} fits");
                    }
                    Err(other) => panic!("unexpected {other:?}"),
                }
            }
            Op::AllocPartial {
                units: n,
                align_log2,
            } => {
                let Some(max) = units(shift, u64::from(n) + 1) else {
                    continue;
                };
                let align = 1u64 << (align_log2 % 64);
                match alloc.alloc_partial(max, align) {
                    Ok(range) => {
                        let size = range.size();
                        assert!(size >= u128::from(align) && size <= u128::from(max));
                        assert_eq!(size % u128::from(align), 0);
                        live.push(Live { range, align });
                    }
                    Err(Error::InvalidIovaRequest { .. }) => assert!(max < align),
                    Err(Error::IovaExhausted { .. }) => {
                        let free = model_free(&usable, &live);
                        assert!(max < align || first_fit(&free, align, align).is_none());
                    }
                    Err(other) => panic!("unexpected {other:?}"),
                }
            }
            Op::Reserve { start, units: n } => {
                let (Some(start), Some(len)) =
                    (units(shift, start.into()), units(shift, u64::from(n) + 1))
                else {
                    continue;
                };
                let Some(range) = IovaRange::from_len(start, len) else {
                    continue;
                };
                let fits = model_free(&usable, &live).iter().any(|f| f.covers(&range));
                match alloc.reserve(range) {
                    Ok(()) => {
                        assert!(fits, "reserved {range} which is not free");
                        live.push(Live { range, align: 1 });
                    }
                    Err(Error::IovaUnavailable { .. }) => assert!(!fits, "refused free {range}"),
                    Err(other) => panic!("unexpected {other:?}"),
                }
            }
            Op::Free { index } => {
                if live.is_empty() {
                    continue;
                }
                let victim = live.swap_remove(usize::from(index) % live.len());
                assert_eq!(alloc.free(victim.range.start).unwrap(), victim.range);
            }
            Op::FreeBogus { iova } => {
                if live.iter().any(|l| l.range.start == iova) {
                    continue;
                }
                assert!(matches!(alloc.free(iova), Err(Error::UnknownIova { .. })));
            }
        }
        check(&alloc, &usable, &live, mask);
    }

    for l in live.drain(..) {
        alloc.free(l.range.start).unwrap();
    }
    assert_eq!(
        alloc.free_ranges().collect::<Vec<_>>(),
        usable,
        "everything freed coalesces back"
    );
    assert_eq!(alloc.allocation_count(), 0);
});
