//! Completions held back to be written a cache line at a time
//! ([`DeviceQueue::complete_held`]): what the host sees and when, the room they take, and
//! their order against `complete` and `flush_held`.

use super::super::*;
use super::{setup, Rig, Small};

/// Pushes `n` descriptors whose values are `0..n` and lets the device read them.
fn announce(rig: &mut Rig<u32>, n: u32) {
    for value in 0..n {
        rig.queue
            .push(
                Small {
                    value,
                    ..Small::default()
                },
                value,
            )
            .unwrap();
    }
    rig.queue.flush().unwrap();
    assert_eq!(rig.device.fetch().unwrap(), n);
}

/// The device's completion of `desc`: the value plus one.
fn status(desc: &Small) -> Status {
    Status::new(desc.id, 0, u64::from(desc.value) + 1)
}

/// Every completion the host can take now, as payloads (checking each result).
fn taken(rig: &mut Rig<u32>) -> Vec<u32> {
    let mut got = Vec::new();
    while let Some(done) = rig.queue.poll_one().unwrap() {
        assert_eq!(done.entry.result, u64::from(done.payload) + 1);
        got.push(done.payload);
    }
    got
}

#[test]
fn held_completions_appear_a_cache_line_at_a_time_and_at_the_end() {
    let mut rig = setup::<u32>(16, false);
    announce(&mut rig, 10);
    let mut seen = Vec::new();
    for k in 0..10u32 {
        let desc = rig.device.pop().unwrap();
        let more = rig.device.available() > 0;
        let written = rig.device.complete_held(status(&desc), more).unwrap();
        let now = taken(&mut rig);
        // Four 16-byte completions to a 64-byte line: the 4th and the 8th end one; the 10th
        // is the last with nothing more to run.
        let expect: Vec<u32> = match k {
            3 => (0..4).collect(),
            7 => (4..8).collect(),
            9 => vec![8, 9],
            _ => Vec::new(),
        };
        assert_eq!(written, expect.len(), "completion {k}");
        assert_eq!(now, expect, "completion {k}");
        seen.extend(now);
    }
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    assert_eq!(rig.device.flush_held().unwrap(), 0, "nothing left held");
    assert_eq!(rig.queue.in_flight(), 0);
}

#[test]
fn flush_and_complete_write_what_is_held_first() {
    let mut rig = setup::<u32>(16, false);
    announce(&mut rig, 5);
    for _ in 0..2 {
        let desc = rig.device.pop().unwrap();
        assert_eq!(rig.device.complete_held(status(&desc), true).unwrap(), 0);
    }
    assert!(taken(&mut rig).is_empty(), "held, not written");
    assert_eq!(rig.device.flush_held().unwrap(), 2);
    assert_eq!(taken(&mut rig), vec![0, 1]);
    // Held again, then a plain completion: the held one goes first.
    let desc = rig.device.pop().unwrap();
    assert_eq!(rig.device.complete_held(status(&desc), true).unwrap(), 0);
    let desc = rig.device.pop().unwrap();
    rig.device.complete(status(&desc)).unwrap();
    assert_eq!(taken(&mut rig), vec![2, 3]);
    // The SQ head is written back with the held completions too: the host may reuse the slots.
    let desc = rig.device.pop().unwrap();
    assert_eq!(rig.device.complete_held(status(&desc), true).unwrap(), 0);
    assert_eq!(rig.device.flush_held().unwrap(), 1);
    assert_eq!(taken(&mut rig), vec![4]);
    assert_eq!(rig.queue.in_flight(), 0);
}

#[test]
fn held_completions_take_their_room_in_a_ring_smaller_than_a_line() {
    // Two 16-byte slots: no completion ends a line, so only the room stops the holding.
    let mut rig = setup::<u32>(2, false);
    announce(&mut rig, 2);
    assert_eq!(rig.device.cq_room().unwrap(), 2);
    for held in 1..=2 {
        let desc = rig.device.pop().unwrap();
        assert_eq!(rig.device.complete_held(status(&desc), true).unwrap(), 0);
        assert_eq!(
            rig.device.cq_room().unwrap(),
            2 - held,
            "held ones take room"
        );
    }
    let extra = Status::new(7, 0, 0);
    assert!(
        matches!(
            rig.device.complete_held(extra, true),
            Err(Error::CqFull { .. })
        ),
        "no room past the held ones"
    );
    assert!(taken(&mut rig).is_empty());
    assert_eq!(rig.device.flush_held().unwrap(), 2);
    assert_eq!(taken(&mut rig), vec![0, 1]);
    // The host announced the room it freed: the device has it again.
    assert_eq!(rig.device.cq_room().unwrap(), 2);
}
