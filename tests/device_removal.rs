//! A device taken away while it works ([`Loopback::remove`], the host's stand-in for a
//! hot-unplug or an administrator's `remove`): the application is told (an event it can poll,
//! wait on or put into epoll), every queue stops waiting ([`ring::Error::Removed`]), every
//! in-flight buffer comes back (after the device can no longer touch it), nothing hangs, and
//! every later operation says the device was removed. In the engine's thread mode and in its
//! device-process mode.

use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::{Device, Error as DeviceError, Event};
use userdma::dma::DeviceOffset;
use userdma::memory::PageSize;
use userdma::pool::{OwnedBuffer, Pool};
use userdma::ring::{self, Command};
use userdma::{Code, Runtime};
use userdma_loopback::{regs, Config, Cost, Descriptor, LoopbackRuntime, Mode, Wait};

#[path = "../loopback/tests/common/device_process.rs"]
mod device_process;

const TIMEOUT: Duration = Duration::from_secs(10);

fn runtime(mode: Mode) -> Runtime {
    Runtime::loopback(
        Config::default()
            .cost(Cost::zero())
            .memory_size(1 << 20)
            .queues(4)
            .mode(mode),
    )
    .expect("a loopback device")
}

/// The device process: this test binary, re-executed to serve the device
/// (tests/common/device_process.rs).
fn device_process() -> Mode {
    Mode::Process(device_process::program())
}

/// A descriptor that holds queue 0 until queue 3 completes a million descriptors: what is
/// queued behind it stays in flight, in the device's hands, until the device goes away.
fn blocker() -> Command {
    Descriptor::wait(3, 1_000_000).build()
}

fn to_device(buffer: &OwnedBuffer, offset: u64) -> Command {
    Descriptor::to_device(buffer.iova(), DeviceOffset(offset), buffer.len() as u64).build()
}

/// Buffers (and large bytes) allocated and not freed.
fn outstanding(pool: &Pool) -> u64 {
    pool.stats().classes.iter().map(|c| c.in_use).sum::<u64>() + pool.stats().large.in_use_bytes
}

/// The removal, seen by every layer, for a device run in `mode`.
fn removal_in(mode: Mode) {
    let runtime = runtime(mode);
    let device = Arc::clone(runtime.loopback_device().expect("loopback"));
    let pool = runtime.pool(4 << 20, PageSize::Base).expect("a pool");
    let mut events = device.events().expect("events");
    assert_eq!(events.try_next(), None);
    assert!(!device.is_removed());

    // Queue 0: held by the blocker, with eight buffers in flight behind it.
    let mut held: userdma_loopback::Queue = device
        .open_queue(ring::Config::new(16), Wait::Interrupt)
        .expect("queue 0");
    held.submit(blocker(), pool.alloc_owned(64).unwrap())
        .unwrap();
    for i in 0..8u64 {
        let buffer = pool.alloc_owned(4096).unwrap();
        held.submit(to_device(&buffer, i * 4096), buffer).unwrap();
    }
    // Queue 1: works normally until the removal.
    let mut working: userdma_loopback::Queue = device
        .open_queue(ring::Config::new(16).with_id(1), Wait::Interrupt)
        .expect("queue 1");
    let buffer = pool.alloc_owned(4096).unwrap();
    working.submit(to_device(&buffer, 0), buffer).unwrap();
    let done = working
        .wait(Some(TIMEOUT))
        .expect("a completion before the removal");
    assert!(done.entry.is_success());
    drop(done);
    let before = outstanding(&pool);
    assert!(before > 0, "the held queue's buffers are out");

    // A thread asleep on the held queue (nothing will complete there) and one asleep on the
    // device's events.
    let sleeper = std::thread::spawn(move || {
        let start = Instant::now();
        let result = held.wait(Some(TIMEOUT));
        (result.map(|_| ()), start.elapsed(), held)
    });
    let mut watcher_events = device.events().expect("events");
    let watcher = std::thread::spawn(move || watcher_events.wait(Some(TIMEOUT)));
    std::thread::sleep(Duration::from_millis(50));

    let start = Instant::now();
    device.remove();
    let removal = start.elapsed();

    // The event: on every subscriber, once.
    assert_eq!(watcher.join().unwrap().unwrap(), Some(Event::Removal));
    assert_eq!(events.wait(Some(TIMEOUT)).unwrap(), Some(Event::Removal));
    assert_eq!(events.try_next(), None);
    assert!(device.is_removed());

    // The sleeping wait woke with the removal, not a timeout.
    let (result, slept, held) = sleeper.join().unwrap();
    let err = result.expect_err("a wait on a removed device fails");
    assert!(
        matches!(
            err,
            ring::Error::Removed {
                queue: 0,
                in_flight: 9
            }
        ),
        "{err:?}"
    );
    assert!(slept < TIMEOUT, "woke in {slept:?}");
    assert_eq!(userdma::Error::from(err).code(), Code::Removed);

    // Polls and waits on the other queue say so too, at once.
    assert!(matches!(
        working.poll_one(),
        Err(ring::Error::Removed { queue: 1, .. })
    ));
    let start = Instant::now();
    assert!(matches!(
        working.wait(Some(TIMEOUT)),
        Err(ring::Error::Removed { .. })
    ));
    assert!(start.elapsed() < TIMEOUT / 2);
    assert!(
        working.is_ready(),
        "wait_any callers look at a removed queue"
    );

    // Shutting down hands every in-flight buffer back at once: the device can no longer
    // touch them.
    let start = Instant::now();
    let shutdown = held.shutdown(TIMEOUT).expect("a removed queue shuts down");
    assert!(start.elapsed() < TIMEOUT / 2, "{:?}", start.elapsed());
    assert!(shutdown.completed.is_empty());
    assert_eq!(shutdown.aborted.len(), 9);
    drop(shutdown);
    assert_eq!(outstanding(&pool), 0, "every buffer is back");
    assert_eq!(ring::leaks().queues, 0, "nothing leaked");
    // Dropping a removed queue neither hangs nor leaks.
    drop(working);
    assert_eq!(ring::leaks().queues, 0);

    // The registers read all-ones, as a removed PCIe device's do; writes go nowhere.
    assert_eq!(device.get(regs::ID).unwrap(), u32::MAX);
    let bar = device.bar(regs::MEMORY_BAR).unwrap();
    assert_eq!(bar.read::<u64>(0).unwrap(), u64::MAX);
    bar.write::<u64>(0, 0).unwrap();
    assert_eq!(bar.read::<u64>(0).unwrap(), u64::MAX);

    // Everything else says the device was removed.
    let err = device.reset().unwrap_err();
    assert!(matches!(err, DeviceError::Removed { .. }), "{err:?}");
    assert!(err.to_string().contains("removed"), "{err}");
    let err = device
        .open_queue::<()>(ring::Config::new(16).with_id(2), Wait::Interrupt)
        .unwrap_err();
    assert!(matches!(err, DeviceError::Removed { .. }), "{err:?}");
    assert_eq!(userdma::Error::from(err).code(), Code::Removed);
    assert!(!device.is_running());
    // A second removal changes nothing; a late subscriber still learns of it.
    device.remove();
    let mut late = device.events().unwrap();
    assert_eq!(late.try_next(), Some(Event::Removal));
    assert!(removal < Duration::from_secs(6), "removal took {removal:?}");
}

#[test]
fn a_removed_device_stops_its_queues_and_returns_every_buffer() {
    removal_in(Mode::Thread);
}

#[test]
fn a_removed_device_process_stops_its_queues_and_returns_every_buffer() {
    removal_in(device_process());
}

/// A removal while the device works through a long burst: the device stops after the
/// descriptor it is executing (as a control write ends a burst), so what was queued behind it
/// comes back aborted, not completed after the host was told the device is gone.
fn removal_mid_burst(mode: Mode) {
    const QUEUED: usize = 8;
    // 200 ms a descriptor: the whole burst would take 1.6 s.
    let runtime = Runtime::loopback(
        Config::default()
            .cost(Cost {
                descriptor_ns: 200_000_000,
                ..Cost::zero()
            })
            .memory_size(1 << 20)
            .mode(mode),
    )
    .expect("a loopback device");
    let device = Arc::clone(runtime.loopback_device().unwrap());
    let pool = runtime.pool(4 << 20, PageSize::Base).unwrap();
    let mut queue: userdma_loopback::Queue = device
        .open_queue(ring::Config::new(16), Wait::Interrupt)
        .unwrap();
    for i in 0..QUEUED as u64 {
        let buffer = pool.alloc_owned(4096).unwrap();
        queue.submit(to_device(&buffer, i * 4096), buffer).unwrap();
    }
    // The first completion: the unit is inside the burst, on the second descriptor.
    let first = queue.wait(Some(TIMEOUT)).expect("the first descriptor");
    assert!(first.entry.is_success());
    drop(first);
    device.remove();
    let stopped = queue.shutdown(TIMEOUT).expect("a removed queue shuts down");
    let completed = 1 + stopped.completed.len();
    assert_eq!(completed + stopped.aborted.len(), QUEUED);
    // The descriptor in execution when the removal came may finish (and one more if this
    // thread was descheduled 200 ms); the rest of the burst must not.
    assert!(
        completed <= 3,
        "{completed} of {QUEUED} descriptors completed: the device ran its burst on after \
         the removal"
    );
    drop(stopped);
    assert_eq!(outstanding(&pool), 0, "every buffer is back");
}

#[test]
fn a_removal_stops_the_device_after_the_descriptor_it_executes() {
    removal_mid_burst(Mode::Thread);
}

#[test]
fn a_removal_stops_the_device_process_after_the_descriptor_it_executes() {
    removal_mid_burst(device_process());
}

#[test]
fn a_queue_dropped_with_work_in_flight_on_a_removed_device_frees_its_buffers() {
    let runtime = runtime(Mode::Thread);
    let device = Arc::clone(runtime.loopback_device().unwrap());
    let pool = runtime.pool(4 << 20, PageSize::Base).unwrap();
    let mut queue: userdma_loopback::Queue = device
        .open_queue(ring::Config::new(16), Wait::Poll)
        .unwrap();
    queue
        .submit(blocker(), pool.alloc_owned(64).unwrap())
        .unwrap();
    let buffer = pool.alloc_owned(4096).unwrap();
    queue.submit(to_device(&buffer, 0), buffer).unwrap();
    // A polling queue (no interrupt) learns of the removal too.
    assert!(queue.poll_one().unwrap().is_none());
    device.remove();
    assert!(matches!(
        queue.poll_one(),
        Err(ring::Error::Removed { in_flight: 2, .. })
    ));
    let start = Instant::now();
    drop(queue);
    assert!(start.elapsed() < TIMEOUT / 2);
    assert_eq!(outstanding(&pool), 0);
    assert_eq!(ring::leaks().queues, 0);
}

#[test]
fn wait_any_wakes_for_a_removed_device() {
    let runtime = runtime(Mode::Thread);
    let device = Arc::clone(runtime.loopback_device().unwrap());
    let mut a: userdma_loopback::Queue<()> = device
        .open_queue(ring::Config::new(16), Wait::Interrupt)
        .unwrap();
    let mut b: userdma_loopback::Queue<()> = device
        .open_queue(ring::Config::new(16).with_id(1), Wait::Interrupt)
        .unwrap();
    a.submit(blocker(), ()).unwrap();
    let mut waiter = userdma::irq::Waiter::new().unwrap();
    waiter.add(a.interrupt().unwrap(), 0).unwrap();
    waiter.add(b.interrupt().unwrap(), 1).unwrap();
    let remover = {
        let device = Arc::clone(&device);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            device.remove();
        })
    };
    let mut ready = Vec::new();
    let start = Instant::now();
    ring::wait_any(
        &mut waiter,
        &mut [&mut a as &mut dyn ring::Waitable, &mut b],
        Some(TIMEOUT),
        &mut ready,
    )
    .unwrap();
    assert!(start.elapsed() < TIMEOUT);
    assert_eq!(
        ready,
        vec![0, 1],
        "both queues are ready: to say they are removed"
    );
    assert!(matches!(a.poll_one(), Err(ring::Error::Removed { .. })));
    remover.join().unwrap();
}

#[test]
fn the_events_fd_goes_into_an_epoll_loop() {
    use std::os::fd::AsFd;
    let runtime = runtime(Mode::Thread);
    let device = Arc::clone(runtime.loopback_device().unwrap());
    let mut events = device.events().unwrap();
    let mut waiter = userdma::irq::Waiter::with_epoll().unwrap();
    waiter.add(events.as_fd(), 7).unwrap();
    assert!(waiter
        .wait(Some(Duration::from_millis(5)))
        .unwrap()
        .is_empty());
    device.remove();
    assert_eq!(waiter.wait(Some(TIMEOUT)).unwrap(), &[7]);
    assert_eq!(events.try_next(), Some(Event::Removal));
}
