//! The record format and the reader, against a scripted device writing a buffer: records come
//! out oldest first, a ring's overwriting and a torn copy are counted lost exactly, and no
//! bytes or counts a device writes make the reader panic, read outside the buffer or hand out
//! a record that fails its check.

use std::time::{Duration, Instant};

use userdma::dma::Slice;
use userdma::memory::{PageSize, Region};

use super::*;

/// A record that passes [`Record::check`] as record `index` of `unit`.
fn valid(unit: Unit, index: u64) -> Record {
    Record {
        start_ns: 1_000 + 10 * (index % 1_000_000),
        end_ns: 1_005 + 10 * (index % 1_000_000),
        bytes: 4096,
        sram_touched: 4096,
        sram_missed: 1024,
        context: 7,
        sequence: index as u32,
        queue: 3,
        command: (index % 60_000) as u16,
        status: StatusCode::Success as u16,
        opcode: Opcode::Compute as u8,
        unit: unit as u8,
        flags: Flags::SWITCHED.bits(),
        reserved: 0,
    }
}

/// A scripted device: the activity buffer of `records` records per unit in a region, and each
/// unit's count of records written.
struct Device {
    region: Region,
    records: u32,
    written: [u64; 2],
}

impl Device {
    fn new(records: u32) -> Device {
        let bytes = buffer_bytes(records).expect("a valid size");
        Device {
            region: Region::builder(bytes.next_multiple_of(4096))
                .page_size(PageSize::Base)
                .build()
                .expect("memory"),
            records,
            written: [0; 2],
        }
    }

    fn slice(&self) -> Slice<'_> {
        Slice::from_region(&self.region)
    }

    /// Writes `bytes` into slot `slot` of `unit`'s ring.
    fn write_slot(&self, unit: Unit, slot: u64, bytes: &[u8; RECORD_BYTES]) {
        let at = (unit as usize * self.records as usize + slot as usize) * RECORD_BYTES;
        self.slice()
            .write_from(at, bytes)
            .expect("inside the buffer");
    }

    /// Writes `unit`'s next record (a valid one) and counts it.
    fn push(&mut self, unit: Unit) -> Record {
        let index = self.written[unit as usize];
        let record = valid(unit, index);
        self.write_slot(unit, index % u64::from(self.records), &record.to_bytes());
        self.written[unit as usize] += 1;
        record
    }

    /// Drains with `reader`, the counts read from `written`.
    fn drain(&self, reader: &mut Reader) -> (Vec<Record>, Drained) {
        let mut out = Vec::new();
        let written = self.written;
        let drained = reader.drain(self.slice(), &mut |u| Some(written[u as usize]), &mut |r| {
            out.push(*r)
        });
        (out, drained)
    }
}

#[test]
fn records_round_trip_through_their_bytes_at_their_offsets() {
    let record = valid(Unit::Compute, 0x1234_5678_9abc);
    let bytes = record.to_bytes();
    assert_eq!(Record::from_bytes(&bytes), record);
    assert_eq!(bytes[0..8], record.start_ns.to_le_bytes());
    assert_eq!(bytes[0x36], Opcode::Compute as u8);
    assert_eq!(bytes[0x37], 1);
    assert_eq!(bytes[0x2c..0x30], 0x5678_9abc_u32.to_le_bytes());
    // The device's words hold the same bytes in memory order.
    let words = record.to_words();
    let mut again = [0u8; RECORD_BYTES];
    for (chunk, word) in again.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
    assert_eq!(again, bytes);
    assert_eq!(record.unit(), Some(Unit::Compute));
    assert_eq!(record.opcode(), Some(Opcode::Compute));
    assert_eq!(record.status_code(), Some(StatusCode::Success));
    assert!(record.switched());
    assert_eq!(record.duration_ns(), 5);
}

#[test]
fn check_names_each_defect() {
    let good = valid(Unit::Copy, 5);
    assert_eq!(good.check(Unit::Copy, 5), Ok(()));
    // The sequence is the low 32 bits of the number.
    assert_eq!(
        Record {
            sequence: 1,
            ..good
        }
        .check(Unit::Copy, (1 << 32) + 1),
        Ok(())
    );
    let cases: [(Record, Defect); 9] = [
        (
            good,
            Defect::Unit {
                found: 0,
                expected: 1,
            },
        ),
        (
            Record {
                sequence: 4,
                ..good
            },
            Defect::Sequence {
                found: 4,
                expected: 5,
            },
        ),
        (Record { status: 13, ..good }, Defect::Status(13)),
        (Record { opcode: 9, ..good }, Defect::Opcode(9)),
        (Record { queue: 32, ..good }, Defect::Queue(32)),
        (Record { flags: 2, ..good }, Defect::Flags(2)),
        (
            Record {
                reserved: 1,
                ..good
            },
            Defect::Reserved(1),
        ),
        (
            Record {
                end_ns: good.start_ns - 1,
                ..good
            },
            Defect::Time {
                start_ns: good.start_ns,
                end_ns: good.start_ns - 1,
            },
        ),
        (
            Record {
                sram_missed: good.sram_touched + 1,
                ..good
            },
            Defect::Sram {
                touched: good.sram_touched,
                missed: good.sram_touched + 1,
            },
        ),
    ];
    for (k, (record, defect)) in cases.into_iter().enumerate() {
        let unit = if k == 0 { Unit::Compute } else { Unit::Copy };
        assert_eq!(record.check(unit, 5), Err(defect), "case {k}");
    }
    // A descriptor with a bad opcode is recorded as read.
    let bad_opcode = Record {
        opcode: 0x40,
        status: StatusCode::BadOpcode as u16,
        ..good
    };
    assert_eq!(bad_opcode.check(Unit::Copy, 5), Ok(()));
}

#[test]
fn sizes_must_be_powers_of_two_up_to_the_maximum() {
    for bad in [0, 3, 6, MAX_ACTIVITY_RECORDS + 1, MAX_ACTIVITY_RECORDS * 2] {
        assert!(Reader::new(bad).is_err(), "{bad}");
        assert_eq!(buffer_bytes(bad), None, "{bad}");
    }
    assert_eq!(buffer_bytes(1), Some(128));
    assert_eq!(buffer_bytes(MAX_ACTIVITY_RECORDS), Some(128 << 20));
    assert_eq!(Reader::new(64).unwrap().records_per_unit(), 64);
}

#[test]
fn a_reader_hands_out_new_records_oldest_first_per_unit() {
    let mut device = Device::new(8);
    let mut reader = Reader::new(8).unwrap();
    let copy: Vec<Record> = (0..3).map(|_| device.push(Unit::Copy)).collect();
    let compute: Vec<Record> = (0..5).map(|_| device.push(Unit::Compute)).collect();
    let (out, drained) = device.drain(&mut reader);
    assert_eq!(out, [copy, compute].concat());
    assert_eq!(
        drained,
        Drained {
            records: 8,
            ..Drained::default()
        }
    );
    // Nothing new: nothing handed out.
    let (out, drained) = device.drain(&mut reader);
    assert!(out.is_empty());
    assert_eq!(drained, Drained::default());
    // Then only what came since, across the ring's wrap.
    let later: Vec<Record> = (0..7).map(|_| device.push(Unit::Copy)).collect();
    let (out, drained) = device.drain(&mut reader);
    assert_eq!(out, later);
    assert_eq!(drained.records, 7);
    assert_eq!(reader.next(Unit::Copy), 10);
    assert_eq!(reader.next(Unit::Compute), 5);
}

#[test]
fn records_overwritten_before_the_read_are_counted_lost_exactly() {
    let mut device = Device::new(4);
    let mut reader = Reader::new(4).unwrap();
    let all: Vec<Record> = (0..11).map(|_| device.push(Unit::Compute)).collect();
    let (out, drained) = device.drain(&mut reader);
    // Records 0..7 were overwritten by 4..11, and record 7's slot is the one record 11 goes
    // to (the device may be writing it): the newest three come out.
    assert_eq!(out, all[8..]);
    assert_eq!(drained.lost, 8);
    assert_eq!(drained.records, 3);
    assert_eq!(drained.bad, 0);
    // More than a chunk of the ring behind, on a big ring: the same.
    let mut device = Device::new(64);
    let mut reader = Reader::new(64).unwrap();
    let all: Vec<Record> = (0..200).map(|_| device.push(Unit::Copy)).collect();
    let (out, drained) = device.drain(&mut reader);
    assert_eq!(out, all[137..]);
    assert_eq!((drained.records, drained.lost), (63, 137));
    // A ring not yet full comes out whole.
    let more: Vec<Record> = (0..63).map(|_| device.push(Unit::Copy)).collect();
    let (out, drained) = device.drain(&mut reader);
    assert_eq!(out, more);
    assert_eq!((drained.records, drained.lost), (63, 0));
}

#[test]
fn a_copy_the_device_may_have_been_overwriting_is_counted_lost() {
    let mut device = Device::new(4);
    let mut reader = Reader::new(4).unwrap();
    let all: Vec<Record> = (0..4).map(|_| device.push(Unit::Copy)).collect();
    // The count reads 4, then (after the copies) 6: the device may have been writing records
    // 4, 5 and 6, into the slots of 0, 1 and 2, while the reader copied them.
    let mut reads = 0;
    let mut out = Vec::new();
    let drained = reader.drain(
        device.slice(),
        &mut |unit| {
            if unit == Unit::Compute {
                return Some(0);
            }
            reads += 1;
            Some(if reads == 1 { 4 } else { 6 })
        },
        &mut |r| out.push(*r),
    );
    assert_eq!(out, all[3..]);
    assert_eq!((drained.records, drained.lost), (1, 3));
    assert_eq!(reader.next(Unit::Copy), 4);
}

#[test]
fn counts_that_go_backwards_or_leap_ahead_are_survived() {
    let mut device = Device::new(4);
    let mut reader = Reader::new(4).unwrap();
    for _ in 0..3 {
        device.push(Unit::Copy);
    }
    device.drain(&mut reader);
    // Backwards (a reset the host did not see): rewound, and the reader follows.
    device.written[Unit::Copy as usize] = 1;
    let (out, drained) = device.drain(&mut reader);
    assert!(out.is_empty());
    assert_eq!(drained.rewound, 1);
    assert_eq!(reader.next(Unit::Copy), 1);
    // Far ahead: at most a ring looked at, the rest lost (the oldest of the ring too: its slot
    // is the next to be written), and the stale slots are bad (their sequence numbers are not
    // the ones the count claims).
    device.written[Unit::Copy as usize] = u64::MAX;
    let (out, drained) = device.drain(&mut reader);
    assert!(out.is_empty());
    assert_eq!(drained.lost, u64::MAX - 4);
    assert_eq!(drained.bad, 3);
    assert_eq!(reader.next(Unit::Copy), u64::MAX);
    // Backwards during the read: nothing of the chunk is handed out.
    let mut reader = Reader::new(4).unwrap();
    let mut reads = 0;
    let mut out = Vec::new();
    let drained = reader.drain(
        device.slice(),
        &mut |_| {
            reads += 1;
            Some(if reads == 1 { 3 } else { 0 })
        },
        &mut |r| out.push(*r),
    );
    assert!(out.is_empty());
    assert_eq!(drained.rewound, 1);
    assert_eq!(reader.next(Unit::Copy), 0);
    // No count at all: the unit is skipped.
    let drained = reader.drain(device.slice(), &mut |_| None, &mut |r| out.push(*r));
    assert_eq!(drained, Drained::default());
    assert!(out.is_empty());
}

#[test]
fn a_buffer_shorter_than_the_rings_counts_what_is_outside_it_bad() {
    let mut device = Device::new(8);
    for _ in 0..8 {
        device.push(Unit::Compute);
    }
    let mut reader = Reader::new(8).unwrap();
    let written = device.written;
    let short = device
        .slice()
        .subslice(0, 8 * RECORD_BYTES + 3 * RECORD_BYTES)
        .unwrap();
    let mut out = Vec::new();
    let drained = reader.drain(short, &mut |u| Some(written[u as usize]), &mut |r| {
        out.push(*r)
    });
    // Record 0 is a whole ring behind (lost), 1 and 2 are inside the buffer, 3 to 7 not.
    assert_eq!((drained.records, drained.bad, drained.lost), (2, 5, 1));
    assert_eq!(out.len(), 2);
}

/// A xorshift generator, for hostile buffers and counts.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn hostile_bytes_and_counts_never_make_the_reader_panic_or_hand_out_bad_records() {
    let device = Device::new(16);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut reader = Reader::new(16).unwrap();
    let mut total = Drained::default();
    // 2000 rounds (under Miri, scripts/miri.sh, 40: the same generator's first ones).
    let rounds = if cfg!(miri) { 40 } else { 2_000 };
    for round in 0..rounds {
        // Random bytes over the buffer, with now and then a record that passes, so both
        // paths are taken.
        for slot in 0..32u64 {
            let mut bytes = [0u8; RECORD_BYTES];
            for chunk in bytes.chunks_exact_mut(8) {
                chunk.copy_from_slice(&rng.next().to_le_bytes());
            }
            let unit = if slot < 16 { Unit::Copy } else { Unit::Compute };
            if rng.next() % 3 == 0 {
                // The record the reader expects in this slot next.
                let next = reader.next(unit);
                let index = next.wrapping_add((slot % 16).wrapping_sub(next) % 16);
                bytes = valid(unit, index).to_bytes();
            }
            device.write_slot(unit, slot % 16, &bytes);
        }
        let mut counts = || match rng.next() % 6 {
            0 => u64::MAX - rng.next() % 64,
            1 => 0,
            2 => rng.next(),
            _ => reader.next(Unit::Copy).wrapping_add(rng.next() % 40),
        };
        let script = [counts(), counts(), counts(), counts(), counts(), counts()];
        let mut k = 0;
        let mut handed = 0u64;
        let drained = reader.drain(
            device.slice(),
            &mut |_| {
                let count = script[k % script.len()];
                k += 1;
                (round % 17 != 0).then_some(count)
            },
            &mut |record| {
                handed += 1;
                let unit = record.unit().expect("only checked records come out");
                assert!(record.check(unit, u64::from(record.sequence)).is_ok());
            },
        );
        assert_eq!(drained.records, handed);
        assert!(handed <= 32, "at most a ring per unit per drain");
        total.add(drained);
    }
    assert!(total.records > 0 && total.bad > 0 && total.lost > 0 && total.rewound > 0);
}

#[test]
fn the_anchor_puts_instants_on_the_monotonic_clock() {
    let before = shim::monotonic_ns().unwrap();
    let now = Instant::now();
    let ns = monotonic_ns(now);
    let after = shim::monotonic_ns().unwrap();
    // The anchor was taken at first use, within this test or before; `Instant` is
    // CLOCK_MONOTONIC on Linux, so the conversion lands between the two readings (give or
    // take the nanoseconds between an anchor's two readings).
    assert!(
        ns + 10_000 >= before && ns <= after + 10_000,
        "{before} {ns} {after}"
    );
    let later = now + Duration::from_millis(3);
    assert_eq!(monotonic_ns(later) - ns, 3_000_000);
    let earlier = now - Duration::from_micros(7);
    assert_eq!(ns - monotonic_ns(earlier), 7_000);
    let anchor = Anchor::now();
    assert!(anchor.ns(now) <= anchor.ns(Instant::now()));
}
