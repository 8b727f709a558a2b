//! The device-memory range allocator against a byte map: alloc (any size, any alignment,
//! power of two or not), alloc at a fixed offset, and free of any live range, on a memory whose
//! size comes from the input. After every step: every live range lies inside the memory, is
//! aligned as asked, overlaps no other, the allocator's free count equals the model's, and a
//! request fails only when the model has no place for it (first fit by address: the same
//! offset the model finds). At the end, with every range freed, one free range spans it all.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::device::{DeviceMemory, Range};
use userdma::dma::DeviceOffset;

#[derive(Debug, Arbitrary)]
struct Input {
    /// Memory size in 16-byte units (at most 64 KiB).
    size: u16,
    ops: Vec<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Alloc {
        len: u16,
        align_log2: u8,
        odd_align: bool,
    },
    AllocAt {
        offset: u16,
        len: u16,
    },
    Free(u8),
}

/// The lowest offset that is a multiple of `align` where `len` bytes are free in `used`.
fn first_fit(used: &[bool], len: u64, align: u64) -> Option<u64> {
    let size = used.len() as u64;
    let mut at = 0u64;
    while at.checked_add(len)? <= size {
        match (at..at + len).find(|&b| used[b as usize]) {
            None => return Some(at),
            Some(taken) => at = (taken + 1).checked_next_multiple_of(align)?,
        }
    }
    None
}

fuzz_target!(|input: Input| {
    let size = u64::from(input.size) * 16;
    let memory = DeviceMemory::new(2, size);
    let mut used = vec![false; size as usize];
    let mut live: Vec<Range> = Vec::new();
    for op in input.ops.into_iter().take(256) {
        match op {
            Op::Alloc {
                len,
                align_log2,
                odd_align,
            } => {
                let len = u64::from(len);
                let align = if odd_align {
                    3
                } else {
                    1u64 << (align_log2 % 13)
                };
                let expected = (len > 0 && align.is_power_of_two())
                    .then(|| first_fit(&used, len, align))
                    .flatten();
                match memory.alloc(len, align) {
                    Ok(range) => {
                        assert_eq!(Some(range.offset().raw()), expected, "first fit");
                        assert!(range.offset().is_aligned(align));
                        live.push(range);
                    }
                    Err(_) => assert_eq!(expected, None, "refused a request that fits"),
                }
            }
            Op::AllocAt { offset, len } => {
                let (at, len) = (u64::from(offset), u64::from(len));
                let fits = len > 0
                    && at + len <= size
                    && !used[at as usize..(at + len) as usize].iter().any(|&b| b);
                match memory.alloc_at(DeviceOffset(at), len) {
                    Ok(range) => {
                        assert!(fits, "granted a range in use or outside");
                        live.push(range);
                    }
                    Err(_) => assert!(!fits, "refused a free range"),
                }
            }
            Op::Free(i) => {
                if !live.is_empty() {
                    let range = live.swap_remove(usize::from(i) % live.len());
                    let at = range.offset().raw() as usize;
                    used[at..at + range.len() as usize].fill(false);
                }
            }
        }
        // Mark what is live (the last grant included) and check the invariants.
        used.fill(false);
        for range in &live {
            let at = range.offset().raw() as usize;
            let end = at + range.len() as usize;
            assert!(end as u64 <= size, "a range past the end");
            assert!(!used[at..end].iter().any(|&b| b), "two ranges overlap");
            used[at..end].fill(true);
        }
        let free = used.iter().filter(|&&b| !b).count() as u64;
        assert_eq!(memory.free_bytes(), free);
    }
    drop(live);
    assert_eq!(memory.free_bytes(), size);
    assert_eq!(memory.largest_free(), size);
});
