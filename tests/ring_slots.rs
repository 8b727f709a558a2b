//! A submission slot is free as soon as the host holds the completion that frees it: fill a
//! queue, ring once, take every completion, and the next push must succeed at once (no retry,
//! no yield). The loopback device writes its SQ head back before each completion it writes,
//! so the host reading a completion always finds the head past that command's slot. Checked
//! for several depths, with the device as a thread and as a separate process, with bursts of
//! every size up to the depth, and with posted descriptors between the commands.
#![cfg(not(loom))]

use std::sync::Arc;
use std::time::Duration;

use userdma::device::Wait;
use userdma::ring::{self, Command, Queue, Status};
use userdma_loopback::{Config, Cost, Descriptor, Loopback, Mode, Program};

#[path = "../loopback/tests/common/device_process.rs"]
mod device_process;

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(20));

fn device(mode: Mode) -> Arc<Loopback> {
    let config = Config::default()
        .cost(Cost::zero())
        .memory_size(1 << 20)
        .queues(2)
        .mode(mode);
    Arc::new(Loopback::new(config).expect("loopback device"))
}

fn program() -> Program {
    match std::env::var_os("USERDMA_LOOPBACK_PROGRAM") {
        Some(path) => Program::new(path),
        None => device_process::program(),
    }
}

/// `cycles` rounds of: `burst` no-ops pushed, one doorbell, every completion taken, then the
/// check that nothing is in flight and a push is taken at once. Returns how many pushes were
/// refused (must be 0).
fn full_bursts(queue: &mut Queue<Command, Status, u32>, burst: u32, cycles: u32) -> Vec<String> {
    let mut refused = Vec::new();
    for cycle in 0..cycles {
        for i in 0..burst {
            if let Err(rejected) = queue.push(Descriptor::nop().build(), i) {
                refused.push(format!(
                    "cycle {cycle}, push {i} of {burst} ({} in flight): {}",
                    queue.in_flight(),
                    rejected.error
                ));
                return refused;
            }
        }
        queue.flush().expect("doorbell");
        for _ in 0..burst {
            let done = queue.wait(TIMEOUT).expect("a completion");
            assert!(done.entry.is_success(), "{:?}", done.entry);
        }
        assert_eq!(queue.in_flight(), 0);
    }
    refused
}

fn slots_come_back_with_their_completions(mode: Mode, name: &str) {
    let device = device(mode);
    for depth in [2u32, 8, 64, 256] {
        let mut queue: Queue<Command, Status, u32> = device
            .open_queue(ring::Config::new(depth).with_id(0), Wait::Interrupt)
            .expect("queue");
        let cycles = if depth >= 64 { 60 } else { 200 };
        let refused = full_bursts(&mut queue, depth, cycles);
        assert!(
            refused.is_empty(),
            "{name}, depth {depth}: a push refused after every completion was taken: {refused:?}"
        );
        // Bursts of every size, so the device's bursts end at every slot.
        for burst in 1..=depth.min(64) {
            let refused = full_bursts(&mut queue, burst, 3);
            assert!(
                refused.is_empty(),
                "{name}, depth {depth}, bursts of {burst}: {refused:?}"
            );
        }
        assert_eq!(
            queue.stats().full,
            0,
            "{name}, depth {depth}: refusals counted"
        );
        drop(queue);
    }
}

#[test]
fn slots_come_back_with_their_completions_device_thread() {
    slots_come_back_with_their_completions(Mode::Thread, "device thread");
}

#[test]
fn slots_come_back_with_their_completions_device_process() {
    slots_come_back_with_their_completions(Mode::Process(program()), "device process");
}

/// Posted descriptors (no completion) take slots too: the completion of a later command frees
/// theirs.
#[test]
fn posted_slots_come_back_with_the_next_completion() {
    let device = device(Mode::Thread);
    let depth = 8;
    let mut queue: Queue<Command, Status, u32> = device
        .open_queue(ring::Config::new(depth).with_id(1), Wait::Interrupt)
        .expect("queue");
    for cycle in 0..200 {
        for _ in 0..depth - 1 {
            // SAFETY: a no-op names no memory.
            unsafe { queue.post(Descriptor::nop().build()) }.expect("posted");
        }
        queue
            .push(Descriptor::nop().build(), cycle)
            .expect("pushed");
        queue.flush().expect("doorbell");
        let done = queue.wait(TIMEOUT).expect("a completion");
        assert_eq!(done.payload, cycle);
        for i in 0..depth {
            queue
                .push(Descriptor::nop().build(), i)
                .unwrap_or_else(|r| panic!("cycle {cycle}, push {i}: {}", r.error));
        }
        queue.flush().expect("doorbell");
        for _ in 0..depth {
            queue.wait(TIMEOUT).expect("a completion");
        }
    }
}
