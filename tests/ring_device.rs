//! The queue pair against a device thread: many wraps, full rings, blocking waits that sleep on
//! the interrupt, and a queue dropped while the device still holds its work.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use userdma::ring::{Command, Config, DeviceQueue, Error, Queue, Quiesce, Status};

mod ring_pair;

/// A host queue (id 1, context 7) and the device's view of it.
fn pair<T: Send>(
    depth: u32,
) -> (
    Queue<Command, Status, T>,
    DeviceQueue<Command, Status>,
    userdma::dma::SoftIommu,
) {
    ring_pair::pair(Config::new(depth).with_id(1).with_context(7), true)
}

/// What the device answers for `command`.
fn result_of(command: &Command) -> u64 {
    command.src.wrapping_mul(3) ^ command.len
}

fn command(value: u64) -> Command {
    Command {
        opcode: 1,
        src: value,
        len: value.rotate_left(17),
        ..Command::default()
    }
}

/// Serves until `stop`, completing in batches (reversed, to complete out of order), after
/// `delay` per batch. Returns how many it served.
fn serve(
    mut device: DeviceQueue<Command, Status>,
    stop: Arc<AtomicBool>,
    delay: Duration,
) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut served = 0;
        let mut batch = Vec::new();
        while !stop.load(Ordering::Acquire) {
            device.fetch().unwrap();
            batch.extend(std::iter::from_fn(|| device.pop()));
            device.release();
            if batch.is_empty() {
                thread::yield_now();
                continue;
            }
            if !delay.is_zero() {
                thread::sleep(delay);
            }
            for command in batch.drain(..).rev() {
                let mut status = Status::new(command.command_id, 0, result_of(&command));
                status.queue_id = device.id();
                loop {
                    match device.complete(status) {
                        Ok(()) => break,
                        Err(Error::CqFull { .. }) => thread::yield_now(),
                        Err(err) => panic!("{err}"),
                    }
                }
                served += 1;
            }
            device.interrupt().unwrap();
        }
        served
    })
}

#[test]
fn many_wraps_batches_and_full_rings_with_a_device_thread() {
    let (mut queue, device, _space) = pair::<Box<u64>>(16);
    let stop = Arc::new(AtomicBool::new(false));
    let handle = serve(device, Arc::clone(&stop), Duration::ZERO);
    let total = 40_000u64;
    let (mut next, mut done, mut batches) = (0u64, 0u64, 0u64);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut seen = vec![false; total as usize];
    while done < total {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let batch = (rng % 16 + 1).min(total - next);
        for _ in 0..batch {
            let id = queue
                .push_wait(command(next), Box::new(next), Some(Duration::from_secs(10)))
                .unwrap();
            assert!(u32::from(id) < 16);
            next += 1;
        }
        if batch > 0 {
            queue.flush().unwrap();
            batches += 1;
        }
        queue
            .reap(usize::MAX, |d| {
                let value = *d.payload;
                assert_eq!(
                    d.entry.result,
                    result_of(&command(value)),
                    "payload {value}"
                );
                assert_eq!(d.entry.queue_id, 1);
                assert!(d.entry.is_success());
                assert!(!seen[value as usize], "{value} completed twice");
                seen[value as usize] = true;
                done += 1;
            })
            .unwrap();
        if next == total && done < total {
            let d = queue.wait(Some(Duration::from_secs(10))).unwrap();
            seen[*d.payload as usize] = true;
            done += 1;
        }
    }
    stop.store(true, Ordering::Release);
    assert_eq!(handle.join().unwrap(), total);
    assert!(seen.iter().all(|&s| s));
    assert_eq!(queue.in_flight(), 0);
    let stats = queue.stats();
    assert_eq!((stats.submitted, stats.completed), (total, total));
    assert!(
        stats.sq_doorbells >= batches && stats.sq_doorbells < total,
        "{stats:?}"
    );
}

#[test]
fn blocking_wait_sleeps_on_the_interrupt() {
    let (mut queue, device, _space) = pair::<u32>(8);
    let stop = Arc::new(AtomicBool::new(false));
    let handle = serve(device, Arc::clone(&stop), Duration::from_millis(30));
    queue.submit(command(5), 5).unwrap();
    let start = Instant::now();
    let done = queue.wait(Some(Duration::from_secs(10))).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(30));
    assert_eq!(
        (done.payload, done.entry.result),
        (5, result_of(&command(5)))
    );
    assert!(queue.stats().sleeps >= 1, "slept instead of spinning 30 ms");
    stop.store(true, Ordering::Release);
    handle.join().unwrap();

    // No device: the wait times out after the time given.
    let (mut queue, _device, _space) = pair::<u32>(8);
    queue.submit(command(1), 1).unwrap();
    let start = Instant::now();
    let err = queue.wait(Some(Duration::from_millis(20))).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                queue: 1,
                in_flight: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(start.elapsed() >= Duration::from_millis(20));
}

/// A device thread that holds the commands it fetched until told to stop, then stops.
struct Holding {
    stop: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
}

impl Quiesce for Holding {
    fn quiesce(&mut self, queue: u16, timeout: Duration) -> std::io::Result<()> {
        assert_eq!(queue, 1);
        self.stop.store(true, Ordering::Release);
        let start = Instant::now();
        while !self.stopped.load(Ordering::Acquire) {
            if start.elapsed() > timeout {
                return Err(std::io::Error::from(std::io::ErrorKind::TimedOut));
            }
            thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

/// A payload that records, when dropped, whether the device had stopped.
struct Guarded {
    stopped: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<bool>>>,
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let stopped = self.stopped.load(Ordering::Acquire);
        self.log.lock().unwrap().push(stopped);
    }
}

#[test]
fn dropping_a_queue_with_work_in_flight_stops_the_device_first() {
    let (mut queue, mut device, _space) = pair::<Guarded>(8);
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::new()));
    let fetched = Arc::new(AtomicUsize::new(0));
    let handle = {
        let (stop, stopped, fetched) = (
            Arc::clone(&stop),
            Arc::clone(&stopped),
            Arc::clone(&fetched),
        );
        thread::spawn(move || {
            let mut held = Vec::new();
            while !stop.load(Ordering::Acquire) {
                device.fetch().unwrap();
                held.extend(std::iter::from_fn(|| device.pop()));
                fetched.store(held.len(), Ordering::Release);
                thread::sleep(Duration::from_millis(1));
            }
            stopped.store(true, Ordering::Release);
            held.len()
        })
    };
    queue.set_quiesce(Holding {
        stop: Arc::clone(&stop),
        stopped: Arc::clone(&stopped),
    });
    for i in 0..4 {
        let payload = Guarded {
            stopped: Arc::clone(&stopped),
            log: Arc::clone(&log),
        };
        queue.submit(command(i), payload).unwrap();
    }
    while fetched.load(Ordering::Acquire) < 4 {
        thread::yield_now();
    }
    drop(queue);
    assert_eq!(handle.join().unwrap(), 4);
    // Dropped (not leaked), each after the device stopped.
    assert_eq!(
        *log.lock().unwrap(),
        vec![true; 4],
        "every payload dropped after the device stopped"
    );
}

#[test]
fn a_device_that_never_stops_gets_leaked_memory_not_freed_memory() {
    struct Stuck;
    impl Quiesce for Stuck {
        fn quiesce(&mut self, _: u16, _: Duration) -> std::io::Result<()> {
            Err(std::io::Error::other("the engine does not answer"))
        }
    }
    let (mut queue, mut device, _space) = pair::<Arc<AtomicU64>>(4);
    queue.set_quiesce(Stuck);
    let payload = Arc::new(AtomicU64::new(0));
    queue.submit(command(1), Arc::clone(&payload)).unwrap();
    let before = userdma::ring::leaks();
    drop(queue);
    let after = userdma::ring::leaks();
    assert!(after.queues > before.queues && after.payloads > before.payloads);
    assert_eq!(
        Arc::strong_count(&payload),
        2,
        "the in-flight payload is alive, leaked"
    );
    // The device can still finish into the ring: its memory was not freed.
    device.fetch().unwrap();
    let command = device.pop().unwrap();
    device
        .complete(Status::new(command.command_id, 0, 0))
        .unwrap();
}
