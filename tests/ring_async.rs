//! `Queue::next_completion` under two executors that know nothing of eventfds:
//! `futures::executor::block_on` and a tokio current-thread runtime.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use userdma::ring::{Command, Config, DeviceQueue, Queue, Status};

mod ring_pair;

fn pair(
    depth: u32,
    interrupt: bool,
) -> (
    Queue<Command, Status, u64>,
    DeviceQueue<Command, Status>,
    userdma::dma::SoftIommu,
) {
    ring_pair::pair(Config::new(depth), interrupt)
}

/// Serves until `stop`, sleeping `delay` before each batch (so the host's futures must sleep).
fn serve(
    mut device: DeviceQueue<Command, Status>,
    stop: Arc<AtomicBool>,
    delay: Duration,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        while !stop.load(Ordering::Acquire) {
            device.fetch().unwrap();
            if device.available() == 0 {
                thread::sleep(Duration::from_micros(200));
                continue;
            }
            thread::sleep(delay);
            while let Some(command) = device.pop() {
                device
                    .complete(Status::new(command.command_id, 0, command.src + 1))
                    .unwrap();
            }
            device.release();
            device.interrupt().unwrap();
        }
    })
}

fn command(value: u64) -> Command {
    Command {
        src: value,
        ..Command::default()
    }
}

async fn round_trips(queue: &mut Queue<Command, Status, u64>, count: u64) {
    for value in 0..count {
        queue.submit(command(value), value).unwrap();
        let done = queue.next_completion().await.unwrap();
        assert_eq!((done.payload, done.entry.result), (value, value + 1));
    }
    // Several in flight, awaited one by one.
    for value in 0..4 {
        queue.push(command(value), value).unwrap();
    }
    queue.flush().unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(queue.next_completion().await.unwrap().payload);
    }
    got.sort_unstable();
    assert_eq!(got, vec![0, 1, 2, 3]);
}

#[test]
fn futures_executor_block_on() {
    let (mut queue, device, _space) = pair(8, true);
    let stop = Arc::new(AtomicBool::new(false));
    let handle = serve(device, Arc::clone(&stop), Duration::from_millis(2));
    futures::executor::block_on(round_trips(&mut queue, 20));
    assert!(queue.stats().completed >= 24);
    stop.store(true, Ordering::Release);
    handle.join().unwrap();
}

#[test]
fn tokio_current_thread_runtime() {
    let (mut queue, device, _space) = pair(8, true);
    let stop = Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    // Nobody serves yet: a timeout drops the pending future (and its registration).
    queue.submit(command(100), 100).unwrap();
    let timed_out = runtime.block_on(async {
        tokio::time::timeout(Duration::from_millis(20), queue.next_completion()).await
    });
    assert!(timed_out.is_err(), "nothing can complete without a device");
    let handle = serve(device, Arc::clone(&stop), Duration::from_millis(1));
    runtime.block_on(async {
        let done = queue.next_completion().await.unwrap();
        assert_eq!(done.payload, 100);
        round_trips(&mut queue, 20).await;
    });
    stop.store(true, Ordering::Release);
    handle.join().unwrap();
}

#[test]
fn a_queue_without_an_interrupt_gives_a_polling_future() {
    let (mut queue, device, _space) = pair(4, false);
    let stop = Arc::new(AtomicBool::new(false));
    let handle = serve(device, Arc::clone(&stop), Duration::from_millis(1));
    futures::executor::block_on(round_trips(&mut queue, 5));
    stop.store(true, Ordering::Release);
    handle.join().unwrap();
}
