//! Loom models of the queue-pair protocol between a host thread and a device thread. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --lib ring::` (preemptions are bounded to 3
//! unless `LOOM_MAX_PREEMPTIONS` says otherwise).
//!
//! The rings are two entries deep and carry three commands, so the SQ fills up (the host must
//! read the device's head write-back to go on), both rings wrap, and the third completion is
//! written with the flipped phase. Every entry spans several words, each derived from the same
//! sequence number, so a torn read (an ordering missing) shows as a mismatch.

use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::*;
use crate::mmio::{Block, Shared};
use crate::sync::thread;

/// An 8-byte descriptor whose two words must agree.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable)]
struct Small {
    id: u16,
    seq: u16,
    check: u32,
}
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

/// The device: serves `COMMANDS` commands, checking each descriptor, in batches. With `held`,
/// each completion is held back while another descriptor is read and runnable
/// ([`DeviceQueue::complete_held`]), and what is held is written at the end of the batch or
/// when the CQ has no room past it.
fn device_loop(mut device: DeviceQueue<Small, Status>, held: bool) {
    let mut served = 0;
    while served < COMMANDS {
        device.fetch().expect("a legal SQ tail");
        while let Some(desc) = device.pop() {
            assert_eq!(desc.check, u32::from(desc.seq) * 7 + 1, "torn descriptor");
            assert_eq!(desc.seq, served, "in order");
            let status = Status::new(desc.id, 0, result_of(&desc));
            loop {
                let done = if held {
                    let more = device.available() > 0;
                    device.complete_held(status, more).map(drop)
                } else {
                    device.complete(status)
                };
                match done {
                    Ok(()) => break,
                    Err(Error::CqFull { .. }) => {
                        // What is held has room (it was checked): written, the host can
                        // free more.
                        device.flush_held().expect("room for what is held");
                        thread::yield_now();
                    }
                    Err(err) => panic!("{err}"),
                }
            }
            served += 1;
        }
        device.flush_held().expect("room for what is held");
        device.release();
        thread::yield_now();
    }
}

#[test]
fn loom_sq_and_cq_wrap_through_a_full_ring() {
    wrap_through_a_full_ring(false);
}

/// As `loom_sq_and_cq_wrap_through_a_full_ring`, with the device holding completions back to
/// write several at once (one fence for their entries, then their phase words).
#[test]
fn loom_held_completions_wrap_through_a_full_ring() {
    wrap_through_a_full_ring(true);
}

fn wrap_through_a_full_ring(held: bool) {
    check(move || {
        let (mut queue, device) = pair();
        let handle = thread::spawn(move || device_loop(device, held));
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

/// A slot is free once the host holds the completion that frees it: the device completes a
/// full ring and only then (end of its burst) would write the head back on its own; the host
/// that took both completions must be able to push again at once, with no retry.
#[test]
fn loom_a_completed_full_ring_takes_the_next_push_at_once() {
    check(|| {
        let (mut queue, mut device) = pair();
        for seq in 0..DEPTH as u16 {
            queue.push(small(seq), seq).expect("room for a full ring");
        }
        queue.flush().expect("doorbell");
        let handle = thread::spawn(move || {
            let mut served = 0;
            while served < DEPTH {
                device.fetch().expect("a legal SQ tail");
                while let Some(desc) = device.pop() {
                    device
                        .complete(Status::new(desc.id, 0, result_of(&desc)))
                        .expect("room");
                    served += 1;
                }
                thread::yield_now();
            }
            // The end-of-burst write-back comes after every completion (and after the host
            // may have taken them all).
            device.release();
        });
        let mut got = 0;
        while got < DEPTH {
            match queue.poll_one().expect("a legal completion") {
                Some(_) => got += 1,
                None => thread::yield_now(),
            }
        }
        assert_eq!(queue.in_flight(), 0);
        queue
            .push(small(DEPTH as u16), 9)
            .map_err(|rejected| rejected.error)
            .expect("a push with nothing in flight is taken at once");
        handle.join().expect("device thread");
    });
}

#[test]
fn loom_posted_descriptors_one_doorbell_each_through_a_full_ring() {
    check(|| {
        let (mut queue, mut device) = pair();
        // The device reads in bursts (`pop_burst`) and hands the slots back after each.
        let handle = thread::spawn(move || {
            let mut served = 0;
            while served < COMMANDS {
                device.fetch().expect("a legal SQ tail");
                device.pop_burst(u32::MAX, |desc| {
                    assert_eq!(desc.id, POSTED);
                    assert_eq!(desc.check, u32::from(desc.seq) * 7 + 1, "torn descriptor");
                    assert_eq!(desc.seq, served, "in order");
                    served += 1;
                });
                device.release();
                thread::yield_now();
            }
        });
        // The host posts each descriptor with its own doorbell (`post_and_flush`): the third
        // waits for the device's head write-back.
        let mut sent = 0u16;
        while sent < COMMANDS {
            // SAFETY: the descriptors name no host memory.
            match unsafe { queue.post_and_flush(small(sent)) } {
                Ok(()) => sent += 1,
                Err(Error::Full { .. }) => thread::yield_now(),
                Err(error) => panic!("{error}"),
            }
        }
        handle.join().expect("device thread");
        let stats = queue.stats();
        assert_eq!((stats.posted, stats.sq_doorbells), (3, 3));
        assert_eq!(queue.unflushed(), 0);
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

/// A completion in NVMe's shape that reports the SQ head (a slot) itself.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable)]
struct HeadStatus {
    result: u64,
    sq_head: u16,
    sq_id: u16,
    id: u16,
    /// Bit 0: the phase.
    status: u16,
}
impl Completion for HeadStatus {
    const PHASE_WORD: usize = 12;
    const PHASE_BIT: u32 = 1 << 16;
    fn command_id(&self) -> u16 {
        self.id
    }
    fn sq_head(&self) -> Option<u16> {
        Some(self.sq_head)
    }
}

/// The device of the NVMe format: reads slot doorbells, keeps one CQ slot empty, reports the
/// SQ head in each completion and writes nothing else into ring memory.
fn nvme_device_loop(memory: Memory, doorbells: Doorbells) {
    let layout = Layout::new::<Small, HeadStatus>(DEPTH).expect("layout");
    let (mut sq_head, mut sq_tail, mut cq_tail, mut cq_head) = (0u32, 0u32, 0u32, 0u32);
    let mut served = 0;
    while served < COMMANDS {
        let slot = doorbells.read_sq_tail(0).expect("doorbell");
        // Acquire: pairs with the fence(Release) in `Doorbells::ring_sq`.
        crate::sync::fence(crate::sync::Ordering::Acquire);
        assert!(slot < DEPTH, "a slot");
        sq_tail = super::index::counter_of_slot(sq_tail, slot, DEPTH);
        while sq_head != sq_tail {
            let desc: Small = memory.read_entry(layout.sq_entry(sq_head));
            sq_head = sq_head.wrapping_add(1);
            assert_eq!(desc.check, u32::from(desc.seq) * 7 + 1, "torn descriptor");
            assert_eq!(desc.seq, served, "in order");
            // NVMe's full CQ: depth - 1 entries.
            while cq_tail.wrapping_sub(cq_head) >= DEPTH - 1 {
                let slot = doorbells.read_cq_head(0).expect("doorbell");
                // Acquire: pairs with the fence(Release) in `Doorbells::ring_cq`.
                crate::sync::fence(crate::sync::Ordering::Acquire);
                cq_head = super::index::counter_of_slot(cq_head, slot, DEPTH);
                thread::yield_now();
            }
            let entry = HeadStatus {
                result: result_of(&desc),
                sq_head: (sq_head % DEPTH) as u16,
                sq_id: 0,
                id: desc.id,
                status: 0,
            };
            let offset = layout.cq_entry(cq_tail);
            let word = layout.with_phase(Memory::word_of(&entry, 12), cq_tail);
            memory.write_entry(offset, &entry, Some(12));
            // Release: pairs with the fence(Acquire) in `Queue::take_cq`, which also orders
            // this device's reads of the SQ entries before the host reuses their slots.
            crate::sync::fence(crate::sync::Ordering::Release);
            memory.store_u32(offset + 12, word);
            cq_tail = cq_tail.wrapping_add(1);
            served += 1;
        }
        thread::yield_now();
    }
}

#[test]
fn loom_slot_doorbells_and_sq_head_in_completions() {
    check(|| {
        let layout = Layout::new::<Small, HeadStatus>(DEPTH).expect("layout");
        let memory = Memory::simulated(layout.size(), 0x10_0000);
        let bar = Block::new(Shared::new(16)).erase();
        let doorbells = Doorbells::new(bar, 0, 8).expect("doorbells");
        let config = Config::new(DEPTH).with_doorbell(DoorbellValue::Slot);
        let mut queue: Queue<Small, HeadStatus, u16> =
            Queue::new(config, memory.clone(), doorbells.clone(), None).expect("queue");
        let handle = thread::spawn(move || nvme_device_loop(memory, doorbells));
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
                    assert_eq!(done.entry.result, result_of(&small(got)), "torn completion");
                    got += 1;
                }
                None => thread::yield_now(),
            }
        }
        handle.join().expect("device thread");
        assert_eq!(queue.in_flight(), 0);
    });
}
