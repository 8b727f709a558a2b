//! Where a queue's parts are in ring memory: [`Layout`]. (Its doorbells in the register BAR are
//! in `doorbell.rs`.)

use std::mem::{align_of, size_of};

use super::index::{self, MAX_DEPTH};
use super::memory::ALIGN;
use super::{Completion, Error, Memory, Submission};

/// Each part of the ring starts on its own 128-byte boundary: two cache lines, so the CPU's
/// adjacent-line prefetch does not make the host's and the device's lines share.
const PART_ALIGN: usize = 128;

const _: () = assert!(PART_ALIGN % ALIGN == 0);

/// The largest part alignment [`Layout::with_align`] takes: 1 GiB.
const MAX_PART_ALIGN: usize = 1 << 30;

/// `value` rounded up to a multiple of `align` (a power of two).
fn round_up(value: usize, align: usize) -> Option<usize> {
    value.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// The layout of one queue pair in ring memory, for descriptor type `D` and completion type `C`:
///
/// | offset | what | written by |
/// |---|---|---|
/// | [`Layout::sq_offset`] | `depth` submission entries | host |
/// | [`Layout::cq_offset`] | `depth` completion entries | device |
/// | [`Layout::sq_head_offset`] | the SQ head, a `u32` counter | device (head write-back) |
/// | [`Layout::interrupt_offset`] | the interrupt request flag, a `u32` | host |
///
/// A device is told the memory's IOVA and the depth (and the entry sizes it already knows from
/// its format) and computes the same layout with [`Layout::new`].
///
/// A device that is given the SQ and CQ base addresses separately (NVMe's ASQ/ACQ registers and
/// its Create I/O SQ/CQ commands) and needs them aligned (NVMe: to the memory page size) uses
/// [`Layout::with_align`]: it programs `memory.iova() + layout.sq_offset()` and
/// `memory.iova() + layout.cq_offset()`. The device must then write nothing but CQ entries, and
/// read nothing but SQ entries: the two words after the CQ are the host's business (the SQ
/// head write-back is not read when the completions carry the SQ head, see
/// [`Completion::sq_head`]; the interrupt flag only matters to a device that polls it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    depth: u32,
    align: usize,
    sq_entry: usize,
    cq_entry: usize,
    cq: usize,
    sq_head: usize,
    interrupt: usize,
    size: usize,
    phase_word: usize,
    phase_bit: u32,
    sq_per_line: u32,
}

impl Layout {
    /// The layout of a queue pair of `depth` entries (a power of two, 2 to 32768). Checks the
    /// entry types: sizes a nonzero multiple of 4 bytes, and `C`'s phase bit a single bit of an
    /// aligned word inside the entry. Each part starts on a 128-byte boundary.
    pub fn new<D: Submission, C: Completion>(depth: u32) -> Result<Layout, Error> {
        Layout::with_align::<D, C>(depth, PART_ALIGN)
    }

    /// [`Layout::new`] with the SQ and the CQ each starting at a multiple of `part_align` bytes
    /// (a power of two from 64 to 2^30; below 128, 128 is used), for a device that takes their
    /// base addresses separately and needs them aligned, e.g. 4096 for an NVMe queue pair.
    /// The ring memory's IOVA must then be `part_align`-aligned too (checked when a
    /// [`Queue`](super::Queue) is made over it); the SQ is at offset 0 and the CQ at
    /// [`Layout::cq_offset`], a multiple of `part_align`.
    pub fn with_align<D: Submission, C: Completion>(
        depth: u32,
        part_align: usize,
    ) -> Result<Layout, Error> {
        if !part_align.is_power_of_two() || !(ALIGN..=MAX_PART_ALIGN).contains(&part_align) {
            return Err(Error::InvalidAlign {
                align: part_align,
                min: ALIGN,
                max: MAX_PART_ALIGN,
            });
        }
        let align = part_align.max(PART_ALIGN);
        if !index::valid_depth(depth) {
            return Err(Error::InvalidDepth {
                depth,
                max: MAX_DEPTH,
            });
        }
        let (sq_entry, cq_entry) = (size_of::<D>(), size_of::<C>());
        let entries = [
            ("submission", sq_entry, align_of::<D>()),
            ("completion", cq_entry, align_of::<C>()),
        ];
        for (kind, size, align) in entries {
            if size == 0 || size % 4 != 0 {
                return Err(Error::EntryType {
                    kind,
                    size,
                    reason: "its size must be a nonzero multiple of 4 bytes",
                });
            }
            if align > ALIGN {
                return Err(Error::EntryType {
                    kind,
                    size,
                    reason: "its alignment must be at most 64 bytes",
                });
            }
        }
        if C::PHASE_WORD % 4 != 0
            || C::PHASE_WORD
                .checked_add(4)
                .is_none_or(|end| end > cq_entry)
            || C::PHASE_BIT.count_ones() != 1
        {
            return Err(Error::EntryType {
                kind: "completion",
                size: cq_entry,
                reason: "PHASE_WORD must be a 4-aligned offset inside the entry and PHASE_BIT a single bit",
            });
        }
        let depth_bytes = depth as usize;
        let sq_bytes = sq_entry
            .checked_mul(depth_bytes)
            .ok_or_else(|| overflow_of(depth))?;
        let cq = round_up(sq_bytes, align).ok_or_else(|| overflow_of(depth))?;
        let cq_bytes = cq_entry
            .checked_mul(depth_bytes)
            .ok_or_else(|| overflow_of(depth))?;
        let sq_head = cq
            .checked_add(cq_bytes)
            .and_then(|end| round_up(end, PART_ALIGN))
            .ok_or_else(|| overflow_of(depth))?;
        let interrupt = sq_head
            .checked_add(PART_ALIGN)
            .ok_or_else(|| overflow_of(depth))?;
        let size = interrupt
            .checked_add(PART_ALIGN)
            .ok_or_else(|| overflow_of(depth))?;
        // SQ entries per cache line, when they tile lines exactly and the ring holds at least
        // two lines' worth (see `index::sq_limit`).
        let per_line = if sq_entry < ALIGN && ALIGN % sq_entry == 0 {
            (ALIGN / sq_entry) as u32
        } else {
            1
        };
        let sq_per_line = if depth >= 2 * per_line { per_line } else { 1 };
        Ok(Layout {
            sq_per_line,
            depth,
            align,
            sq_entry,
            cq_entry,
            cq,
            sq_head,
            interrupt,
            size,
            phase_word: C::PHASE_WORD,
            phase_bit: C::PHASE_BIT,
        })
    }

    /// Entries in each of the SQ and the CQ.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The alignment of the SQ's and the CQ's start (128 unless [`Layout::with_align`] asked
    /// for more): the ring memory's IOVA must be aligned to it.
    pub fn part_align(&self) -> usize {
        self.align
    }

    /// Bytes of ring memory the queue pair needs.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Where the submission entries start (0).
    pub fn sq_offset(&self) -> usize {
        0
    }

    /// Where the completion entries start.
    pub fn cq_offset(&self) -> usize {
        self.cq
    }

    /// Where the device writes back the SQ head.
    pub fn sq_head_offset(&self) -> usize {
        self.sq_head
    }

    /// Where the host sets the interrupt request flag.
    pub fn interrupt_offset(&self) -> usize {
        self.interrupt
    }

    /// Bytes of one submission entry.
    pub fn sq_entry_size(&self) -> usize {
        self.sq_entry
    }

    /// Bytes of one completion entry.
    pub fn cq_entry_size(&self) -> usize {
        self.cq_entry
    }

    /// Checks that `memory` holds this layout: large enough, and its IOVA aligned so that the
    /// SQ and the CQ start where the device needs them.
    pub(crate) fn check_memory(&self, memory: &Memory) -> Result<(), Error> {
        // `align` is a power of two no larger than 2^30: it fits in a u64.
        if memory.iova().raw() & (self.align as u64 - 1) != 0 {
            return Err(Error::PartAlign {
                iova: memory.iova().raw(),
                align: self.align,
            });
        }
        if memory.len() < self.size {
            return Err(Error::MemoryTooSmall {
                len: memory.len(),
                needed: self.size,
                depth: self.depth,
            });
        }
        Ok(())
    }

    /// SQ entries per cache line the host spares while the device reads it (1: none).
    pub(crate) fn sq_per_line(&self) -> u32 {
        self.sq_per_line
    }

    /// The byte offset of the SQ entry for counter `counter`.
    #[inline]
    pub(crate) fn sq_entry(&self, counter: u32) -> usize {
        index::slot(counter, self.depth) as usize * self.sq_entry
    }

    /// The byte offset of the CQ entry for counter `counter`.
    #[inline]
    pub(crate) fn cq_entry(&self, counter: u32) -> usize {
        self.cq + index::slot(counter, self.depth) as usize * self.cq_entry
    }

    /// The byte offset of the phase word of the CQ entry for counter `counter`.
    #[inline]
    pub(crate) fn cq_phase_word(&self, counter: u32) -> usize {
        self.cq_entry(counter) + self.phase_word
    }

    /// Whether a CQ entry's phase word says it was written at `counter`.
    #[inline]
    pub(crate) fn is_current(&self, word: u32, counter: u32) -> bool {
        (word & self.phase_bit != 0) == index::phase(counter, self.depth)
    }

    /// `word` with the phase bit of `counter`.
    #[inline]
    pub(crate) fn with_phase(&self, word: u32, counter: u32) -> u32 {
        if index::phase(counter, self.depth) {
            word | self.phase_bit
        } else {
            word & !self.phase_bit
        }
    }

    /// The byte offset of the phase word within a CQ entry.
    pub(crate) fn phase_word(&self) -> usize {
        self.phase_word
    }
}

fn overflow_of(depth: u32) -> Error {
    Error::InvalidDepth {
        depth,
        max: MAX_DEPTH,
    }
}
