//! The host's reader of the loopback device's activity records (`activity::Reader`) against
//! device-written memory and a model of an honest device: the device writes valid records
//! (and, while draining, more of them between the reader's two readings of a count, as a copy
//! may race with), or, when told, hostile ones — any bytes into any slot, any count. After every
//! drain: for a unit whose device was honest, every record written since the last drain is
//! either handed out (exactly as written, oldest first) or counted lost, never both, none bad;
//! for any unit, nothing panics, nothing outside the buffer is read, at most a ring's worth is
//! handed out, and every record handed out passes its check.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::dma::Slice;
use userdma::memory::{PageSize, Region};
use userdma_loopback::activity::{buffer_bytes, Reader, Record, RECORD_BYTES};
use userdma_loopback::Unit;

#[derive(Debug, Arbitrary)]
struct Input {
    /// Records per unit: 2^(this % 7).
    records_log2: u8,
    ops: Vec<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    /// The device writes `n` valid records of a unit, fields drawn from `seed`.
    Write { compute: bool, n: u8, seed: u64 },
    /// Hostile: `bytes` into slot `slot` of a unit's ring.
    Raw {
        compute: bool,
        slot: u16,
        bytes: [u8; RECORD_BYTES],
    },
    /// Hostile: a unit's count becomes `value`.
    Count { compute: bool, value: u64 },
    /// The host drains; at its second reading of each unit's count the device has written
    /// `during[u]` more records of unit `u`.
    Drain { during: [u8; 2] },
}

/// One unit as the device and the model see it.
#[derive(Debug, Default)]
struct Side {
    /// Its count of records written.
    written: u64,
    /// The records it wrote, by number (while honest).
    history: Vec<Record>,
    /// It wrote something hostile: the model no longer predicts it.
    hostile: bool,
}

fn unit_of(compute: bool) -> Unit {
    if compute {
        Unit::Compute
    } else {
        Unit::Copy
    }
}

/// A valid record number `index` of `unit`, its fields drawn from `seed`.
fn valid(unit: Unit, index: u64, seed: u64) -> Record {
    let start = seed % 1_000_000_000_000;
    let touched = seed & 0xfff;
    Record {
        start_ns: start,
        end_ns: start + (seed >> 40) % 1000,
        bytes: seed & 0xffff,
        sram_touched: touched,
        sram_missed: touched / 2,
        context: (seed >> 8) as u32,
        sequence: index as u32,
        queue: (seed % 32) as u16,
        command: (seed >> 16) as u16,
        // Status codes 0 to 12 and opcodes 0 to 8 are all the device's.
        status: ((seed >> 24) % 13) as u16,
        opcode: ((seed >> 28) % 9) as u8,
        unit: unit as u8,
        flags: ((seed >> 33) & 1) as u32,
        reserved: 0,
    }
}

/// The device's store of `bytes` into slot `slot` of `unit`'s ring.
fn store(buffer: Slice<'_>, records: u64, unit: Unit, slot: u64, bytes: &[u8; RECORD_BYTES]) {
    let at = (unit as u64 * records + slot % records) as usize * RECORD_BYTES;
    buffer.write_from(at, bytes).expect("inside the buffer");
}

/// The device writes `n` valid records of `unit`.
fn write(buffer: Slice<'_>, records: u64, side: &mut Side, unit: Unit, n: u8, seed: u64) {
    for k in 0..u64::from(n) {
        let index = side.written;
        let record = valid(unit, index, seed.wrapping_add(k.wrapping_mul(0x9e37_79b9)));
        store(buffer, records, unit, index, &record.to_bytes());
        if !side.hostile {
            side.history.push(record);
        }
        side.written = side.written.wrapping_add(1);
    }
}

fuzz_target!(|input: Input| {
    let records = 1u32 << (input.records_log2 % 7);
    let n = u64::from(records);
    let bytes = buffer_bytes(records).expect("a valid size");
    let region = Region::builder(bytes.next_multiple_of(4096))
        .page_size(PageSize::Base)
        .build()
        .expect("memory");
    let buffer = Slice::from_region(&region)
        .subslice(0, bytes)
        .expect("inside");
    let mut reader = Reader::new(records).expect("a valid size");
    let mut sides = [Side::default(), Side::default()];
    for op in input.ops.into_iter().take(512) {
        match op {
            Op::Write {
                compute,
                n: count,
                seed,
            } => {
                let unit = unit_of(compute);
                write(buffer, n, &mut sides[unit as usize], unit, count, seed);
            }
            Op::Raw {
                compute,
                slot,
                bytes,
            } => {
                let unit = unit_of(compute);
                store(buffer, n, unit, u64::from(slot), &bytes);
                sides[unit as usize].hostile = true;
            }
            Op::Count { compute, value } => {
                let side = &mut sides[compute as usize];
                side.written = value;
                side.hostile = true;
            }
            Op::Drain { during } => {
                let before = [reader.next(Unit::Copy), reader.next(Unit::Compute)];
                let first = [sides[0].written, sides[1].written];
                let mut reads = [0u32; 2];
                let mut out: [Vec<Record>; 2] = Default::default();
                let drained = reader.drain(
                    buffer,
                    &mut |unit| {
                        let u = unit as usize;
                        reads[u] += 1;
                        if reads[u] == 2 {
                            write(
                                buffer,
                                n,
                                &mut sides[u],
                                unit,
                                during[u],
                                u64::from(during[u]),
                            );
                        }
                        Some(sides[u].written)
                    },
                    &mut |record| {
                        let unit = record.unit().expect("only checked records come out");
                        assert!(record.check(unit, u64::from(record.sequence)).is_ok());
                        out[unit as usize].push(*record);
                    },
                );
                assert_eq!(drained.records, (out[0].len() + out[1].len()) as u64);
                for u in 0..2 {
                    assert!(out[u].len() as u64 <= n, "more than a ring handed out");
                }
                if sides.iter().any(|s| s.hostile) {
                    continue;
                }
                // An honest device: nothing bad, every record since the last drain handed out
                // as written or lost, and the reader now at the first count it read.
                assert_eq!((drained.bad, drained.rewound), (0, 0));
                let mut accounted = drained.lost;
                for u in 0..2 {
                    assert_eq!(reader.next(Unit::ALL[u]), first[u]);
                    let mut last = None;
                    for record in &out[u] {
                        let index = u64::from(record.sequence);
                        assert!((before[u]..first[u]).contains(&index), "{index}");
                        assert!(last.is_none_or(|l| l < index), "out of order");
                        last = Some(index);
                        assert_eq!(record, &sides[u].history[index as usize]);
                    }
                    accounted += out[u].len() as u64;
                }
                assert_eq!(accounted, (first[0] - before[0]) + (first[1] - before[1]));
            }
        }
    }
});
