//! `irq::EventFd`: counting, nonblocking reads, timeouts, and wake-ups across threads.
#![cfg(not(loom))]

use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

use userdma::irq::EventFd;

#[test]
fn signals_add_up_and_a_read_resets() {
    let irq = EventFd::new().unwrap();
    assert_eq!(
        irq.try_read().unwrap(),
        None,
        "starts at zero, never blocks"
    );
    irq.signal().unwrap();
    irq.signal().unwrap();
    irq.write(5).unwrap();
    assert_eq!(irq.try_read().unwrap(), Some(7));
    assert_eq!(irq.try_read().unwrap(), None);
}

#[test]
fn clones_share_the_counter_through_distinct_fds() {
    let host = EventFd::new().unwrap();
    let device = host.try_clone().unwrap();
    assert_ne!(host.as_raw_fd(), device.as_raw_fd());
    device.signal().unwrap();
    assert_eq!(host.try_read().unwrap(), Some(1));
    drop(host);
    device.signal().unwrap();
    assert_eq!(
        device.try_read().unwrap(),
        Some(1),
        "each handle owns its fd"
    );
}

#[test]
fn a_full_counter_does_not_block_the_signaller() {
    let irq = EventFd::new().unwrap();
    irq.write(u64::MAX - 1).unwrap();
    // The counter cannot grow: the write would block; nonblocking, it is dropped, and the
    // interrupt is pending anyway.
    irq.signal().unwrap();
    assert_eq!(irq.try_read().unwrap(), Some(u64::MAX - 1));
}

#[test]
fn wait_times_out_and_wakes() {
    let irq = EventFd::new().unwrap();
    let start = Instant::now();
    assert_eq!(irq.wait(Some(Duration::from_millis(20))).unwrap(), None);
    assert!(start.elapsed() >= Duration::from_millis(20));
    assert!(!irq.wait_readable(Some(Duration::ZERO)).unwrap());

    let device = irq.try_clone().unwrap();
    let signaller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(10));
        device.write(3).unwrap();
    });
    let start = Instant::now();
    assert_eq!(irq.wait(Some(Duration::from_secs(10))).unwrap(), Some(3));
    assert!(start.elapsed() < Duration::from_secs(5));
    signaller.join().unwrap();

    let device = irq.try_clone().unwrap();
    let signaller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(5));
        device.signal().unwrap();
    });
    assert_eq!(irq.read().unwrap(), 1, "read blocks until signalled");
    signaller.join().unwrap();
}

#[test]
fn wait_readable_does_not_consume() {
    let irq = EventFd::new().unwrap();
    irq.signal().unwrap();
    assert!(irq.wait_readable(None).unwrap());
    assert!(irq.wait_readable(Some(Duration::from_millis(1))).unwrap());
    assert_eq!(irq.try_read().unwrap(), Some(1));
}
