//! Several hardware queues of one device: each its own part of one DMA mapping, its own doorbell
//! pair in one BAR, its own interrupt eventfd and context; one device thread serves them all and
//! one host thread sleeps on all their interrupts at once (`ring::wait_any` over an
//! `irq::Waiter`, io_uring and epoll).
#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use userdma::dma::{SoftIommu, Space};
use userdma::irq::{EventFd, Kind, Waiter};
use userdma::memory::{PageSize, Region};
use userdma::mmio::{Block, Shared};
use userdma::ring::{
    wait_any, Command, Config, DeviceQueue, Doorbells, Layout, Memory, Queue, Status, Waitable,
};

const QUEUES: u16 = 4;
const DEPTH: u32 = 8;
/// Doorbell pairs 128 bytes apart: each queue's on its own cache lines.
const STRIDE: usize = 128;

type HostQueue = Queue<Command, Status, (u16, u64)>;

fn queues() -> (Vec<HostQueue>, Vec<DeviceQueue<Command, Status>>, SoftIommu) {
    let space = SoftIommu::new(48).unwrap();
    let layout = Layout::new::<Command, Status>(DEPTH).unwrap();
    let per_queue = layout.size().next_multiple_of(4096);
    let region = Region::builder(per_queue * usize::from(QUEUES))
        .page_size(PageSize::Base)
        .lock(false)
        .build()
        .unwrap();
    let mapping = Arc::new(space.map(Arc::new(region)).unwrap());
    let all = Memory::from_mapping(mapping, 0, per_queue * usize::from(QUEUES)).unwrap();
    let bar = Block::new(Shared::new(STRIDE * usize::from(QUEUES)));
    let (mut hosts, mut devices) = (Vec::new(), Vec::new());
    for q in 0..QUEUES {
        let memory = all.sub(per_queue * usize::from(q), layout.size()).unwrap();
        let window = bar.window(STRIDE * usize::from(q), STRIDE).unwrap().erase();
        let doorbells = Doorbells::new(window, 0, 64).unwrap();
        let irq = EventFd::new().unwrap();
        let device_irq = irq.try_clone().unwrap();
        let config = Config::new(DEPTH)
            .with_id(q)
            .with_context(1000 + u32::from(q));
        hosts.push(Queue::new(config, memory.clone(), doorbells.clone(), Some(irq)).unwrap());
        let seen = space.translate(memory.iova(), layout.size()).unwrap();
        let device_memory = Memory::from_window(seen, memory.iova()).unwrap();
        devices
            .push(DeviceQueue::new(q, DEPTH, device_memory, doorbells, Some(device_irq)).unwrap());
    }
    (hosts, devices, space)
}

/// One engine thread for every queue: round robin, a pause per round so the host sleeps.
fn engine(
    mut devices: Vec<DeviceQueue<Command, Status>>,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut served = 0;
        while !stop.load(Ordering::Acquire) {
            thread::sleep(Duration::from_micros(300));
            for device in devices.iter_mut() {
                device.fetch().unwrap();
                let mut any = false;
                while let Some(command) = device.pop() {
                    // The context travels in the descriptor; echo it with the queue id.
                    let mut status = Status::new(command.command_id, 0, u64::from(command.context));
                    status.queue_id = device.id();
                    device.complete(status).unwrap();
                    served += 1;
                    any = true;
                }
                device.release();
                if any {
                    device.interrupt().unwrap();
                }
            }
        }
        served
    })
}

fn one_thread_waits_on_every_queue(kind: Kind) {
    let (mut hosts, devices, _space) = queues();
    let mut waiter = match kind {
        Kind::IoUring => Waiter::with_io_uring().unwrap_or_else(|err| {
            panic!("io_uring is needed ({err}): sysctl kernel.io_uring_disabled=0")
        }),
        Kind::Epoll => Waiter::with_epoll().unwrap(),
    };
    for (i, queue) in hosts.iter().enumerate() {
        waiter.add(queue.interrupt().unwrap(), i as u64).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let handle = engine(devices, Arc::clone(&stop));
    let per_queue = 30u64;
    let mut done = vec![0u64; hosts.len()];
    let mut sent = vec![0u64; hosts.len()];
    let mut ready = Vec::new();
    while done.iter().sum::<u64>() < per_queue * u64::from(QUEUES) {
        for (q, queue) in hosts.iter_mut().enumerate() {
            // At most two in flight per queue, so queues become ready at different times.
            while sent[q] < per_queue && queue.in_flight() < 2 {
                let command = Command {
                    context: queue.context(),
                    ..Command::default()
                };
                queue.submit(command, (queue.id(), sent[q])).unwrap();
                sent[q] += 1;
            }
        }
        let mut waitables: Vec<&mut dyn Waitable> =
            hosts.iter_mut().map(|q| q as &mut dyn Waitable).collect();
        wait_any(
            &mut waiter,
            &mut waitables,
            Some(Duration::from_secs(10)),
            &mut ready,
        )
        .unwrap();
        assert!(
            !ready.is_empty(),
            "{kind}: woke with nothing ready before the timeout"
        );
        for &q in &ready {
            let queue = &mut hosts[q];
            let (id, context) = (queue.id(), queue.context());
            queue
                .reap(usize::MAX, |d| {
                    assert_eq!(d.payload.0, id, "completion on its own queue");
                    assert_eq!(d.entry.queue_id, id);
                    assert_eq!(d.entry.result, u64::from(context));
                    done[q] += 1;
                })
                .unwrap();
        }
    }
    stop.store(true, Ordering::Release);
    assert_eq!(handle.join().unwrap(), per_queue * u64::from(QUEUES));
    assert!(hosts.iter().all(|q| q.in_flight() == 0));
    // Nothing ready: wait_any times out with an empty list.
    let mut waitables: Vec<&mut dyn Waitable> =
        hosts.iter_mut().map(|q| q as &mut dyn Waitable).collect();
    wait_any(
        &mut waiter,
        &mut waitables,
        Some(Duration::from_millis(10)),
        &mut ready,
    )
    .unwrap();
    assert!(ready.is_empty());
}

#[test]
#[cfg(feature = "io-uring")]
fn io_uring_one_thread_waits_on_every_queue() {
    one_thread_waits_on_every_queue(Kind::IoUring);
}

#[test]
fn epoll_one_thread_waits_on_every_queue() {
    one_thread_waits_on_every_queue(Kind::Epoll);
}
