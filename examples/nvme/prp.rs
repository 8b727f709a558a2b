//! PRPs: how a run of blocks is cut into commands ([`plan`]) and how a command's data is
//! described to the controller ([`prp_entries`], [`data_pointer`]).
//!
//! A command's data is described by PRP1 (the IOVA of its first byte, any 4-byte-aligned offset
//! in a page) and PRP2: nothing when the data fits in PRP1's page, the second page's IOVA when it
//! spans two, else the IOVA of a PRP list (a page of 8-byte entries: the IOVA of every further
//! page). The driver's memory page size is 4 KiB (CC.MPS = 0).

use userdma::pool::OwnedBuffer;

use crate::command::DataPointer;
use crate::io::Error;
use crate::regs::PAGE;

/// Where the data of the commands that start inside a page begins in their buffer.
pub(crate) const IN_PAGE_OFFSET: usize = 0x200;

/// One command's worth of blocks: `blocks` blocks from `lba`, placed at `offset` in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// The first block.
    pub(crate) lba: u64,
    /// How many blocks.
    pub(crate) blocks: u32,
    /// Where the data starts in the buffer (a multiple of 4: PRP1 may point inside a page).
    pub(crate) offset: usize,
}

/// Cuts `blocks` blocks from `lba` into commands of at most `max_bytes` (at least one block;
/// with the data's offset in its buffer, at most `max_bytes` when a block fits) that exercise
/// every PRP shape: one block in one page; two whole pages (PRP2 a page); three
/// pages starting inside a page (a PRP list, PRP1 with an offset); then the largest commands,
/// alternately page-aligned and not.
pub(crate) fn plan(lba: u64, blocks: u64, lba_size: u32, max_bytes: usize) -> Vec<Chunk> {
    let size = lba_size as usize;
    let most = (max_bytes / size).max(1);
    let shapes = [(size, 0), (2 * PAGE, 0), (3 * PAGE, IN_PAGE_OFFSET)];
    let mut chunks = Vec::new();
    let (mut next, mut left) = (lba, blocks);
    let mut i = 0;
    while left > 0 {
        let (bytes, offset) = shapes
            .get(i)
            .copied()
            .unwrap_or((most * size, if i % 2 == 0 { 0 } else { IN_PAGE_OFFSET }));
        // Data that starts inside a page still ends within `max_bytes` of the buffer's start,
        // so every buffer comes from the same few size classes.
        let fits = (max_bytes.saturating_sub(offset) / size).max(1);
        let want = (bytes / size).clamp(1, most.min(fits)) as u64;
        let take = want.min(left);
        // `take <= most <= max_bytes`, which fits in a u32 for any real transfer size.
        let take32 = u32::try_from(take).unwrap_or(u32::MAX);
        chunks.push(Chunk {
            lba: next,
            blocks: take32,
            offset,
        });
        next += u64::from(take32);
        left -= u64::from(take32);
        i += 1;
    }
    chunks
}

/// The PRP entries of `len` bytes at byte `offset` of a buffer whose 4 KiB page `i` is at
/// `page_iova(i)`: the first with the offset in its page, then one per further page. `None` if a
/// page has no IOVA, the length is zero, or the offset is not a multiple of 4.
pub(crate) fn prp_entries(
    offset: usize,
    len: usize,
    page_iova: impl Fn(usize) -> Option<u64>,
) -> Option<Vec<u64>> {
    if len == 0 || offset % 4 != 0 {
        return None;
    }
    let first_page = offset / PAGE;
    let in_page = offset % PAGE;
    let pages = (in_page.checked_add(len)?).div_ceil(PAGE);
    let mut entries = Vec::with_capacity(pages);
    entries.push(page_iova(first_page)?.checked_add(in_page as u64)?);
    for page in 1..pages {
        entries.push(page_iova(first_page.checked_add(page)?)?);
    }
    Some(entries)
}

/// A command's data pointer for `entries`, writing a PRP list into `list` when there are more
/// than two. `None` if `list` is needed but missing or too small.
pub(crate) fn data_pointer(
    entries: &[u64],
    list: Option<&OwnedBuffer>,
) -> Option<Result<DataPointer, Error>> {
    match entries {
        [] => None,
        [one] => Some(Ok(DataPointer {
            prp1: *one,
            prp2: 0,
        })),
        [one, two] => Some(Ok(DataPointer {
            prp1: *one,
            prp2: *two,
        })),
        [one, rest @ ..] => {
            let list = list?;
            let bytes: Vec<u8> = rest.iter().flat_map(|e| e.to_le_bytes()).collect();
            if bytes.len() > PAGE {
                return None;
            }
            Some(
                list.write(0, &bytes)
                    .map(|()| DataPointer {
                        prp1: *one,
                        prp2: list.iova().raw(),
                    })
                    .map_err(|source| Error::Buffer {
                        what: "writing the PRP list",
                        len: bytes.len(),
                        offset: 0,
                        source: Box::new(source),
                    }),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::MAX_CHUNK;

    #[test]
    fn plan_covers_every_block_once_with_every_prp_shape() {
        let chunks = plan(16, 300, 512, MAX_CHUNK);
        let mut next = 16;
        for c in &chunks {
            assert_eq!(c.lba, next);
            assert!(c.blocks >= 1 && c.blocks as usize * 512 <= MAX_CHUNK);
            assert_eq!(c.offset % 4, 0);
            next += u64::from(c.blocks);
        }
        assert_eq!(next, 316);
        assert_eq!(chunks[0].blocks, 1);
        assert_eq!((chunks[1].blocks, chunks[1].offset), (16, 0));
        assert_eq!((chunks[2].blocks, chunks[2].offset), (24, IN_PAGE_OFFSET));
        assert_eq!((chunks[3].blocks, chunks[3].offset), (127, IN_PAGE_OFFSET));
        assert_eq!((chunks[4].blocks, chunks[4].offset), (128, 0));
        assert!(chunks
            .iter()
            .all(|c| c.offset + c.blocks as usize * 512 <= MAX_CHUNK));
        // Few blocks: the shapes are cut short, never past the end.
        assert_eq!(
            plan(0, 3, 512, MAX_CHUNK),
            vec![
                Chunk {
                    lba: 0,
                    blocks: 1,
                    offset: 0
                },
                Chunk {
                    lba: 1,
                    blocks: 2,
                    offset: 0
                },
            ]
        );
        assert!(plan(0, 0, 512, MAX_CHUNK).is_empty());
        // A controller limit below a page still gets whole blocks.
        assert!(plan(0, 20, 4096, 512).iter().all(|c| c.blocks == 1));
    }

    fn pages(base: u64) -> impl Fn(usize) -> Option<u64> {
        move |i| (i < 32).then(|| base + (i as u64) * 0x10_000)
    }

    #[test]
    fn prp_entries_per_page() {
        // One page: PRP1 only.
        assert_eq!(prp_entries(0, 512, pages(0x100_000)), Some(vec![0x100_000]));
        assert_eq!(
            prp_entries(0, PAGE, pages(0x100_000)),
            Some(vec![0x100_000])
        );
        // Inside a page, crossing into the next.
        assert_eq!(
            prp_entries(0x200, PAGE, pages(0x100_000)),
            Some(vec![0x100_200, 0x110_000])
        );
        // Three pages from an offset: four entries (a list).
        assert_eq!(
            prp_entries(0x200, 3 * PAGE, pages(0x100_000)),
            Some(vec![0x100_200, 0x110_000, 0x120_000, 0x130_000])
        );
        // Starting in a later page.
        assert_eq!(
            prp_entries(PAGE + 8, 8, pages(0x100_000)),
            Some(vec![0x110_008])
        );
        assert_eq!(prp_entries(0, 0, pages(0)), None);
        assert_eq!(prp_entries(2, 8, pages(0)), None);
        assert_eq!(prp_entries(0, 40 * PAGE, pages(0)), None);
    }
}
