//! [`Reader`]: the host's reader of the units' activity rings, which the device writes behind
//! its back (see the [module docs](super) for the protocol). It keeps, per unit, the number of
//! the next record to read; each [`Reader::drain`] hands out the records written since, oldest
//! first, and counts those lost to overwriting and those that fail [`Record::check`]. It
//! allocates nothing, reads the buffer only with 64-bit atomic loads inside a bounds-checked
//! [`Slice`] (never a plain reference), and does at most a ring's worth of work per unit per
//! call, whatever the counts say.

use userdma::dma::Slice;

use super::{valid_records, Record, RECORD_BYTES};
use crate::regs::Unit;
use crate::sync::{fence, AtomicU64, Ordering};
use crate::u64_of;

/// Records copied out between two readings of a unit's count: a chunk of the ring on the
/// stack (2 KiB), so the count is re-read once per chunk rather than once per record.
const CHUNK: usize = 32;

/// What one [`Reader::drain`] (or a run of them, added up) found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Drained {
    /// Records handed out.
    pub records: u64,
    /// Records the device overwrote before they were read, or may have been overwriting
    /// while they were copied.
    pub lost: u64,
    /// Records that failed [`Record::check`] (skipped).
    pub bad: u64,
    /// Times a unit's count went backwards (the device was reset, or is broken): the reader
    /// starts again from the count it read.
    pub rewound: u64,
}

impl Drained {
    /// Adds `other` to these totals (saturating).
    pub fn add(&mut self, other: Drained) {
        self.records = self.records.saturating_add(other.records);
        self.lost = self.lost.saturating_add(other.lost);
        self.bad = self.bad.saturating_add(other.bad);
        self.rewound = self.rewound.saturating_add(other.rewound);
    }
}

/// The host's reader of an activity buffer of `records` records per unit. See the module docs.
#[derive(Debug, Clone)]
pub struct Reader {
    /// Records per unit (a power of two).
    records: u64,
    /// Per unit: the number of the next record to read.
    next: [u64; 2],
}

impl Reader {
    /// A reader of rings of `records_per_unit` records, from record 0 of each unit (as the
    /// device counts from the enable).
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) unless `records_per_unit` is a power of two from
    /// 1 to [`MAX_ACTIVITY_RECORDS`](crate::regs::MAX_ACTIVITY_RECORDS).
    pub fn new(records_per_unit: u32) -> Result<Reader, crate::Error> {
        if !valid_records(records_per_unit) {
            return Err(crate::Error::Config {
                field: "activity records per unit",
                value: u64::from(records_per_unit),
                expected: "a power of two from 1 to 1048576",
            });
        }
        Ok(Reader {
            records: u64::from(records_per_unit),
            next: [0; 2],
        })
    }

    /// Records per unit.
    pub fn records_per_unit(&self) -> u32 {
        // Checked in `new`: at most 2^20.
        self.records as u32
    }

    /// The number of the next record of `unit` the reader will read.
    pub fn next(&self, unit: Unit) -> u64 {
        self.next[unit as usize]
    }

    /// Starts again from record 0 of each unit (the device was enabled again: its counts
    /// start from 0).
    pub fn restart(&mut self) {
        self.next = [0; 2];
    }

    /// Hands every record written since the last call to `out`, oldest first, unit by unit
    /// (the copy engine's, then the compute unit's), reading the buffer through `buffer`
    /// (both rings: `2 * records * 64` bytes; a record outside it is counted bad) and unit
    /// `u`'s count of records written through `written(u)` (the device's
    /// [`ACTIVITY_WRITTEN`](crate::regs::ACTIVITY_WRITTEN) register, read with Acquire
    /// ordering; `None` when it cannot be read, which skips the unit).
    ///
    /// `written` is read once, then again after every chunk of records copied out (the
    /// seqlock check of the module docs). A count that runs more than a ring ahead of the
    /// reader loses the records overwritten; one that goes backwards counts in
    /// [`Drained::rewound`] and moves the reader back to it. At most `records` records per
    /// unit are looked at per call.
    pub fn drain(
        &mut self,
        buffer: Slice<'_>,
        written: &mut dyn FnMut(Unit) -> Option<u64>,
        out: &mut dyn FnMut(&Record),
    ) -> Drained {
        let mut drained = Drained::default();
        for unit in Unit::ALL {
            self.drain_unit(unit, buffer, written, out, &mut drained);
        }
        drained
    }

    /// [`Reader::drain`] for one unit.
    fn drain_unit(
        &mut self,
        unit: Unit,
        buffer: Slice<'_>,
        written: &mut dyn FnMut(Unit) -> Option<u64>,
        out: &mut dyn FnMut(&Record),
        drained: &mut Drained,
    ) {
        let n = self.records;
        let next = &mut self.next[unit as usize];
        let Some(first) = written(unit) else {
            return;
        };
        if first < *next {
            drained.rewound = drained.rewound.saturating_add(1);
            *next = first;
            return;
        }
        // More than a ring behind: the oldest were overwritten before this read.
        if first - *next > n {
            drained.lost = drained.lost.saturating_add(first - *next - n);
            *next = first - n;
        }
        let mut copies = [[0u8; RECORD_BYTES]; CHUNK];
        while *next < first {
            // At most CHUNK: fits.
            let count = (first - *next).min(u64_of(CHUNK)) as usize;
            for (k, copy) in copies.iter_mut().enumerate().take(count) {
                let index = *next + u64_of(k);
                if read_slot(buffer, unit, n, index, copy).is_none() {
                    // Outside the buffer (one shorter than the rings): a copy `check` rejects
                    // (its unit reads 0xff), so the record counts as bad.
                    *copy = [0xff; RECORD_BYTES];
                }
            }
            // Acquire: orders the copies above before the count's second reading, pairing
            // with the device's `fence(Release)` between its store of `written = i + n` and
            // its stores of record `i + n` into slot `i % n` (a copy that saw any byte of
            // that record finds the count at `i + n` or more below).
            fence(Ordering::Acquire);
            let again = written(unit).unwrap_or(first);
            if again < first {
                // The count went backwards while reading: nothing copied can be trusted.
                drained.rewound = drained.rewound.saturating_add(1);
                *next = again;
                return;
            }
            for (k, copy) in copies.iter().enumerate().take(count) {
                let index = *next + u64_of(k);
                // `again >= first > index`: no underflow. Record `index + n` overwrites this
                // slot, and the device began writing it once the count reached `index + n`.
                if again - index >= n {
                    drained.lost = drained.lost.saturating_add(1);
                    continue;
                }
                let record = Record::from_bytes(copy);
                if record.check(unit, index).is_err() {
                    drained.bad = drained.bad.saturating_add(1);
                    continue;
                }
                drained.records = drained.records.saturating_add(1);
                out(&record);
            }
            *next += u64_of(count);
        }
    }
}

/// Copies record `index` of `unit`'s ring of `records` records out of `buffer` into `copy`;
/// `None` when its slot is not inside the buffer.
///
/// The device stores each record as eight 64-bit atomic words (a slot may be rewritten while
/// it is copied: the seqlock of the module docs tells), so the copy is eight 64-bit atomic
/// loads; a buffer that is not 8-aligned (no device buffer: they are 64-aligned) is copied
/// with volatile loads instead.
fn read_slot(
    buffer: Slice<'_>,
    unit: Unit,
    records: u64,
    index: u64,
    copy: &mut [u8; RECORD_BYTES],
) -> Option<()> {
    // `records` is a power of two: the slot is the index modulo it, at most 2 * 2^20 (no
    // overflow).
    let slot = u64::from(unit as u32) * records + (index & (records - 1));
    let offset = usize::try_from(slot).ok()?.checked_mul(RECORD_BYTES)?;
    let bytes = buffer.subslice(offset, RECORD_BYTES).ok()?;
    let base = bytes.as_ptr();
    if base.as_ptr() as usize % 8 != 0 {
        return bytes.read_into(0, copy).ok();
    }
    for (k, chunk) in copy.chunks_exact_mut(8).enumerate() {
        // SAFETY: the 8 bytes at `base + 8 * k` are inside `bytes` (`k < 8`, 64 bytes), which
        // the slice keeps mapped and readable for its lifetime, longer than this reference
        // (used for this load only); the address is 8-aligned (checked above). The device
        // writes the buffer only with 64-bit atomic stores of these same words, so this load
        // may race only with atomic accesses of its size: an atomic reference is sound (the
        // slice's contract allows atomic access; no plain reference is made).
        let word = unsafe { AtomicU64::from_ptr(base.as_ptr().add(8 * k).cast()) };
        // Relaxed: the reader's `fence(Acquire)` after the copy orders these loads (the
        // seqlock's reader side, see `Reader::drain_unit`).
        chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
    }
    Some(())
}
