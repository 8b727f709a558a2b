//! Loom models of the queue-pair protocol between a host thread and a device thread. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --lib ring::` (preemptions are bounded to 3
//! unless `LOOM_MAX_PREEMPTIONS` says otherwise).
//!
//! The rings are two entries deep and carry three commands, so the SQ fills up (the host must
//! read the device's head write-back to go on), both rings wrap, and the third completion is
//! written with the flipped phase. Every entry spans several words, each derived from the same
//! sequence number, so a torn read (an ordering missing) shows as a mismatch.

use super::*;
use crate::mmio::{Block, Shared};
use crate::sync::thread;

/// An 8-byte descriptor whose two words must agree.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Small {
    id: u16,
    seq: u16,
    check: u32,
}
// SAFETY: repr(C), integers only, no padding (2 + 2 + 4 = 8).
unsafe impl Pod for Small {}
impl Submission for Small {
    fn command_id(&self) -> u16 {
        self.id
    }
    fn set_command_id(&mut self, id: u16) {
        self.id = id;
    }
}

fn small(seq: u16) -> Small {
    Small {
        id: 0,
        seq,
        check: u32::from(seq) * 7 + 1,
    }
}

/// The result a device writes for `desc`: both halves of the u64 say the same.
fn result_of(desc: &Small) -> u64 {
    let v = u64::from(desc.check);
    v | (v << 32)
}

const COMMANDS: u16 = 3;
const DEPTH: u32 = 2;

fn check(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

fn pair() -> (Queue<Small, Status, u16>, DeviceQueue<Small, Status>) {
    let layout = Layout::new::<Small, Status>(DEPTH).expect("layout");
    let memory = Memory::simulated(layout.size(), 0x10_0000);
    let bar = Block::new(Shared::new(16)).erase();
    let doorbells = Doorbells::new(bar, 0, 8).expect("doorbells");
    let queue =
        Queue::new(Config::new(DEPTH), memory.clone(), doorbells.clone(), None).expect("queue");
    let device = DeviceQueue::new(0, DEPTH, memory, doorbells, None).expect("device");
    (queue, device)
}

/// The device: serves `COMMANDS` commands, checking each descriptor, in batches.
fn device_loop(mut device: DeviceQueue<Small, Status>) {
    let mut served = 0;
    while served < COMMANDS {
        device.fetch().expect("a legal SQ tail");
        while let Some(desc) = device.pop() {
            assert_eq!(desc.check, u32::from(desc.seq) * 7 + 1, "torn descriptor");
            assert_eq!(desc.seq, served, "in order");
            loop {
                match device.complete(Status::new(desc.id, 0, result_of(&desc))) {
                    Ok(()) => break,
                    Err(Error::CqFull { .. }) => thread::yield_now(),
                    Err(err) => panic!("{err}"),
                }
            }
            served += 1;
        }
        device.release();
        thread::yield_now();
    }
}

#[test]
fn loom_sq_and_cq_wrap_through_a_full_ring() {
    check(|| {
        let (mut queue, device) = pair();
        let handle = thread::spawn(move || device_loop(device));
        let (mut sent, mut got) = (0u16, 0u16);
        while got < COMMANDS {
            if sent < COMMANDS {
                match queue.push(small(sent), sent) {
                    Ok(_) => {
                        sent += 1;
                        queue.flush().expect("doorbell");
                    }
                    Err(Rejected {
                        error: Error::Full { .. } | Error::NoCommandId { .. },
                        ..
                    }) => {}
                    Err(rejected) => panic!("{}", rejected.error),
                }
            }
            match queue.poll_one().expect("a legal completion") {
                Some(done) => {
                    assert_eq!(done.payload, got, "completions in order");
                    let expect = result_of(&small(got));
                    assert_eq!(done.entry.result, expect, "torn completion");
                    got += 1;
                }
                None => thread::yield_now(),
            }
        }
        handle.join().expect("device thread");
        assert_eq!(queue.in_flight(), 0);
        assert_eq!(queue.stats().completed, u64::from(COMMANDS));
    });
}

#[test]
fn loom_no_lost_wakeup() {
    check(|| {
        let (mut queue, mut device) = pair();
        queue.submit(small(0), 0).expect("submit");
        let handle = thread::spawn(move || {
            loop {
                device.fetch().expect("a legal SQ tail");
                if let Some(desc) = device.pop() {
                    device
                        .complete(Status::new(desc.id, 0, result_of(&desc)))
                        .expect("room");
                    device.release();
                    break;
                }
                thread::yield_now();
            }
            device.interrupt().expect("interrupt")
        });
        // The host decides to sleep: arm, then look once more.
        let saw_it = queue.arm_interrupt().expect("arm");
        let raised = handle.join().expect("device thread");
        assert!(
            saw_it || raised,
            "the host slept on an empty ring and the device raised no interrupt"
        );
        if saw_it {
            let done = queue.poll_one().expect("legal").expect("seen ready");
            assert_eq!(done.entry.result, result_of(&small(0)));
        }
    });
}
