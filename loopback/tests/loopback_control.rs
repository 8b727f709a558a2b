//! The loopback device's control paths: interrupts (masked, pending, delivered on unmask),
//! polling mode, reset, queue faults, stopping a queue with work in flight (the ring's quiesce
//! hook), the cost model and its counters, and an idle engine that sleeps.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::{Device, Error};
use userdma::dma::Mapping;
use userdma::memory::PageSize;
use userdma::ring::{self, Command, Queue, Status};
use userdma_loopback::{regs, Config, Cost, Fault, Loopback, Opcode, Wait};

mod procfs;

use procfs::{allowed_cpus, thread_dir};

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(10));

fn device_with(config: Config) -> Arc<Loopback> {
    Arc::new(Loopback::new(config.memory_size(4 << 20)).expect("loopback device"))
}

fn device() -> Arc<Loopback> {
    device_with(Config::default().cost(Cost::zero()))
}

fn host_memory(device: &Loopback, len: usize) -> Mapping {
    userdma::runtime::map_memory(device.dma_space().as_ref(), len, PageSize::Base)
        .expect("host memory mapped into the device's DMA space")
}

/// Opens a queue, copies `len` bytes of `host` to the device through it, checks the
/// completion and returns the queue.
fn one_transfer(device: &Arc<Loopback>, host: &Mapping, len: u64) -> Queue<Command, Status, ()> {
    let mut queue: Queue<Command, Status, ()> = device
        .open_queue(ring::Config::new(16), Wait::Interrupt)
        .unwrap();
    queue
        .submit(to_device(host.iova(0).unwrap().raw(), 0, len), ())
        .unwrap();
    assert!(queue.wait(TIMEOUT).unwrap().entry.is_success());
    queue
}

fn to_device(src: u64, dst: u64, len: u64) -> Command {
    Command {
        opcode: Opcode::ToDevice as u8,
        src,
        dst,
        len,
        ..Command::default()
    }
}

#[test]
fn masked_interrupts_stay_pending_until_unmasked() {
    let device = device();
    let host = host_memory(&device, 4096);
    let mut queue: Queue<Command, Status, ()> = device
        .open_queue(ring::Config::new(16).with_id(1), Wait::Interrupt)
        .unwrap();
    let irq = device.interrupt(1).unwrap();
    device.set_masked(1, true).unwrap();
    assert_eq!(device.get(regs::IRQ_MASK).unwrap(), 0b10);

    // Ask for an interrupt, as a waiting host does, then submit.
    assert!(!queue.arm_interrupt().unwrap());
    queue
        .submit(to_device(host.iova(0).unwrap().raw(), 0, 64), ())
        .unwrap();
    let start = Instant::now();
    while !queue.is_ready() {
        assert!(start.elapsed() < Duration::from_secs(10), "no completion");
        std::thread::yield_now();
    }
    assert!(
        !irq.wait_readable(Some(Duration::from_millis(100))).unwrap(),
        "masked vector fired"
    );
    assert_eq!(device.get(regs::IRQ_PENDING).unwrap(), 0b10);
    assert_eq!(device.counters().unwrap().interrupts, 0);

    device.set_masked(1, false).unwrap();
    assert!(
        irq.wait_readable(Some(Duration::from_secs(10))).unwrap(),
        "unmasked vector did not fire"
    );
    assert_eq!(device.get(regs::IRQ_PENDING).unwrap(), 0);
    assert_eq!(device.counters().unwrap().interrupts, 1);
    queue.disarm_interrupt();
    assert!(queue.poll_one().unwrap().unwrap().entry.is_success());

    // Unmasked: a waiting queue is woken by the interrupt.
    queue
        .submit(to_device(host.iova(0).unwrap().raw(), 0, 64), ())
        .unwrap();
    assert!(queue.wait(TIMEOUT).unwrap().entry.is_success());
    assert!(device.set_masked(5, true).is_err());
}

#[test]
fn polling_mode_raises_no_interrupts() {
    let device = device();
    let host = host_memory(&device, 64 << 10);
    let mut queue: Queue<Command, Status, u32> = device
        .open_queue(ring::Config::new(64), Wait::Poll)
        .unwrap();
    assert!(queue.interrupt().is_none());
    let iova = host.iova(0).unwrap();
    let mut next = 0u32;
    for batch in 0..50u32 {
        for i in 0..32u32 {
            let n = batch * 32 + i;
            queue
                .push_wait(
                    to_device(iova.raw(), u64::from(n % 64) * 1024, 1024),
                    n,
                    TIMEOUT,
                )
                .unwrap();
        }
        queue.flush().unwrap();
        while let Some(done) = queue.poll_one().unwrap() {
            assert_eq!(done.payload, next);
            next += 1;
        }
    }
    while next < 1600 {
        let done = queue.wait(TIMEOUT).unwrap();
        assert_eq!(done.payload, next);
        next += 1;
    }
    let counters = device.counters().unwrap();
    assert_eq!((counters.descriptors, counters.interrupts), (1600, 0));
}

#[test]
fn reset_stops_queues_and_clears_state() {
    let device = device();
    let host = host_memory(&device, 8192);
    host.slice().fill(0x77);
    let mut queue = one_transfer(&device, &host, 8192);
    device.set_masked(0, true).unwrap();
    let count = device.get(regs::RESET_COUNT).unwrap();

    device.reset().unwrap();
    assert_eq!(device.get(regs::RESET_COUNT).unwrap(), count + 1);
    let counters = device.counters().unwrap();
    assert_eq!((counters.descriptors, counters.bytes), (0, 0));
    assert_eq!(device.get(regs::IRQ_MASK).unwrap(), 0);
    let q0_status = regs::queue_field(regs::Q_STATUS, 0).unwrap();
    assert!(device.get(q0_status).unwrap().is_empty());
    let mut back = vec![0xffu8; 8192];
    device.device_memory().read_into(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0), "device memory not cleared");

    // The old queue is no longer served: its command times out, and dropping it with the
    // command in flight is safe (the device has stopped).
    queue
        .submit(to_device(host.iova(0).unwrap().raw(), 0, 8), ())
        .unwrap();
    assert!(queue.wait(Some(Duration::from_millis(100))).is_err());
    let leaks = ring::leaks();
    drop(queue);
    assert_eq!(ring::leaks(), leaks);

    one_transfer(&device, &host, 8);
}

#[test]
fn bad_ring_programming_faults_the_queue() {
    let device = device();
    let q = 2;
    let program = |base: u64, depth: u32| -> Fault {
        device
            .set(regs::queue_field(regs::Q_RING_BASE, q).unwrap(), base)
            .unwrap();
        device
            .set(regs::queue_field(regs::Q_DEPTH, q).unwrap(), depth)
            .unwrap();
        device
            .set(
                regs::queue_field(regs::Q_CONTROL, q).unwrap(),
                regs::QueueControl::ENABLE,
            )
            .unwrap();
        let start = Instant::now();
        while device
            .get(regs::queue_field(regs::Q_STATUS, q).unwrap())
            .unwrap()
            .is_empty()
        {
            assert!(start.elapsed() < Duration::from_secs(10), "no answer");
            std::thread::yield_now();
        }
        assert_eq!(
            device
                .get(regs::queue_field(regs::Q_STATUS, q).unwrap())
                .unwrap(),
            regs::QueueStatus::FAULT
        );
        let fault = Fault::from_raw(
            device
                .get(regs::queue_field(regs::Q_FAULT, q).unwrap())
                .unwrap(),
        )
        .unwrap();
        device
            .set(
                regs::queue_field(regs::Q_CONTROL, q).unwrap(),
                regs::QueueControl::empty(),
            )
            .unwrap();
        while !device
            .get(regs::queue_field(regs::Q_STATUS, q).unwrap())
            .unwrap()
            .is_empty()
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "fault not cleared"
            );
            std::thread::yield_now();
        }
        fault
    };
    let host = host_memory(&device, 64 << 10);
    let iova = host.iova(0).unwrap();
    assert_eq!(program(1 << 40, 64), Fault::RingUnmapped);
    assert_eq!(program((iova + 8).raw(), 64), Fault::RingMisaligned);
    assert_eq!(program(iova.raw(), 3), Fault::BadDepth);
    assert_eq!(
        program(iova.raw(), 8192),
        Fault::BadDepth,
        "above max_depth"
    );
    assert_eq!(
        program((iova + (60 << 10)).raw(), 1024),
        Fault::RingUnmapped,
        "past the end"
    );

    // A queue whose host rings an impossible SQ tail is stopped with a fault.
    let queue: Queue<Command, Status, ()> = device
        .open_queue(ring::Config::new(16).with_id(q), Wait::Interrupt)
        .unwrap();
    assert!(matches!(
        device.open_queue::<()>(ring::Config::new(16).with_id(q), Wait::Poll),
        Err(Error::QueueBusy { queue: 2 })
    ));
    device
        .set(regs::queue_field(regs::Q_SQ_TAIL, q).unwrap(), 1000)
        .unwrap();
    let start = Instant::now();
    while !device
        .get(regs::queue_field(regs::Q_STATUS, q).unwrap())
        .unwrap()
        .contains(regs::QueueStatus::FAULT)
    {
        assert!(start.elapsed() < Duration::from_secs(10), "no fault");
        std::thread::yield_now();
    }
    assert_eq!(
        device
            .get(regs::queue_field(regs::Q_FAULT, q).unwrap())
            .unwrap(),
        Fault::BadSqTail as u32
    );
    drop(queue);
    assert!(device
        .open_queue::<()>(ring::Config::new(5), Wait::Poll)
        .is_err());
}

/// A payload that counts its drops.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A device that moves 50 MB/s: a 1 MiB descriptor takes about 21 ms.
fn slow_device() -> Arc<Loopback> {
    let slow = Cost {
        dma_bytes_per_sec: 50_000_000,
        ..Cost::zero()
    };
    device_with(Config::default().cost(slow))
}

#[test]
fn dropping_a_busy_queue_stops_the_device_first() {
    let device = slow_device();
    let host = host_memory(&device, 1 << 20);
    let dropped = Arc::new(AtomicUsize::new(0));
    let mut queue: Queue<Command, Status, Counted> = device
        .open_queue(ring::Config::new(16), Wait::Interrupt)
        .unwrap();
    for _ in 0..10 {
        let desc = to_device(host.iova(0).unwrap().raw(), 0, 1 << 20);
        queue.push(desc, Counted(Arc::clone(&dropped))).unwrap();
    }
    queue.flush().unwrap();
    let first = queue.wait(TIMEOUT).unwrap();
    assert!(first.entry.is_success());
    drop(first);
    let leaks = ring::leaks();
    // Dropping waits up to DROP_QUIESCE_TIMEOUT for the device to stop and leaks the queue if
    // it does not: the leak count below says which happened (timing the drop would only
    // measure the machine).
    drop(queue);
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        10,
        "payloads not handed back"
    );
    assert_eq!(
        ring::leaks(),
        leaks,
        "the queue leaked: the device did not stop"
    );
    let status = regs::queue_field(regs::Q_STATUS, 0).unwrap();
    let fault = regs::queue_field(regs::Q_FAULT, 0).unwrap();
    assert!(
        device.get(status).unwrap().is_empty(),
        "{:?} {:?}",
        device.get(status),
        device.get(fault)
    );
    let done = device.counters().unwrap().queues[0].completed;
    assert!(done < 10, "all {done} ran: nothing was stopped");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        device.counters().unwrap().queues[0].completed,
        done,
        "still running"
    );
}

#[test]
fn shutdown_hands_back_what_the_device_did_not_run() {
    let device = slow_device();
    let host = host_memory(&device, 1 << 20);
    let mut queue: Queue<Command, Status, usize> = device
        .open_queue(ring::Config::new(16), Wait::Interrupt)
        .unwrap();
    for i in 0..8 {
        queue
            .push(to_device(host.iova(0).unwrap().raw(), 0, 1 << 20), i)
            .unwrap();
    }
    queue.flush().unwrap();
    let outcome = queue.shutdown(Duration::from_millis(30)).unwrap();
    let mut ids: Vec<usize> = outcome.completed.iter().map(|d| d.payload).collect();
    ids.extend(outcome.aborted.iter().map(|(_, payload)| *payload));
    ids.sort_unstable();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    assert!(
        !outcome.aborted.is_empty(),
        "the device ran everything in 30 ms"
    );
    assert!(outcome.completed.iter().all(|d| d.entry.is_success()));
}

#[test]
fn cost_model_charges_bandwidth_and_context_switches() {
    let cost = Cost {
        dma_bytes_per_sec: 100_000_000,
        descriptor_ns: 0,
        compute_bytes_per_sec: 0,
        context_switch_ns: 2_000_000,
        ..Cost::zero()
    };
    let device = device_with(Config::default().cost(cost).max_burst(1));
    let host = host_memory(&device, 1 << 20);
    let iova = host.iova(0).unwrap();

    // Bandwidth: 5 x 1 MiB at 100 MB/s is at least 52 ms of device time.
    let mut queue: Queue<Command, Status, ()> = device
        .open_queue(ring::Config::new(16), Wait::Interrupt)
        .unwrap();
    let start = Instant::now();
    for _ in 0..5 {
        queue.push(to_device(iova.raw(), 0, 1 << 20), ()).unwrap();
    }
    queue.flush().unwrap();
    for _ in 0..5 {
        assert!(queue.wait(TIMEOUT).unwrap().entry.is_success());
    }
    let modelled = Duration::from_nanos(5 * (1u64 << 20) * 10);
    assert!(
        start.elapsed() >= modelled,
        "{:?} < {modelled:?}",
        start.elapsed()
    );
    assert!(device.counters().unwrap().busy_ns >= modelled.as_nanos() as u64);
    drop(queue);

    // Two queues of two contexts, one descriptor per turn: every turn is a switch.
    let mut queues: Vec<Queue<Command, Status, ()>> = (0..2u16)
        .map(|q| {
            let config = ring::Config::new(16)
                .with_id(q)
                .with_context(u32::from(q) + 1);
            device.open_queue(config, Wait::Interrupt).unwrap()
        })
        .collect();
    for queue in &mut queues {
        for _ in 0..4 {
            let mut desc = to_device(iova.raw(), 0, 64);
            desc.context = u32::from(queue.id()) + 1;
            queue.push(desc, ()).unwrap();
        }
    }
    let start = Instant::now();
    for queue in &mut queues {
        queue.flush().unwrap();
    }
    for queue in &mut queues {
        for _ in 0..4 {
            assert!(queue.wait(TIMEOUT).unwrap().entry.is_success());
        }
    }
    let switches = device.counters().unwrap().context_switches;
    // At most one per descriptor (the first one also leaves the context of the queue above).
    assert!((2..=8).contains(&switches), "{switches} switches");
    assert!(start.elapsed() >= Duration::from_millis(2 * switches));
}

/// Clock ticks of CPU time the thread named `name` has used.
fn thread_cpu_ticks(name: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("{}/stat", thread_dir(name))).unwrap();
    // Fields after the command name (which is in parentheses): utime and stime are the 12th
    // and 13th of them.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn an_idle_engine_sleeps() {
    let device = device_with(Config::default().cost(Cost::zero()).name("idle-engine"));
    let host = host_memory(&device, 4096);
    let mut queue: Queue<Command, Status, ()> = device
        .open_queue(ring::Config::new(16), Wait::Interrupt)
        .unwrap();
    queue
        .submit(to_device(host.iova(0).unwrap().raw(), 0, 64), ())
        .unwrap();
    assert!(queue.wait(TIMEOUT).unwrap().entry.is_success());
    std::thread::sleep(Duration::from_millis(20));
    let before = thread_cpu_ticks("idle-engine");
    std::thread::sleep(Duration::from_millis(500));
    let used = thread_cpu_ticks("idle-engine") - before;
    // A spinning engine would use about 50 ticks (at 100 Hz) in 500 ms.
    assert!(
        used <= 3,
        "the idle engine used {used} ticks of CPU in 500 ms"
    );
    // And it still wakes for the next doorbell.
    queue
        .submit(to_device(host.iova(0).unwrap().raw(), 0, 64), ())
        .unwrap();
    assert!(queue.wait(TIMEOUT).unwrap().entry.is_success());
}

#[test]
fn a_pinned_engine_runs_on_its_cpu_only() {
    let cpus = allowed_cpus("/proc/thread-self");
    // The last CPU this thread may use: on a machine with several, not where the scheduler
    // would put the engine by default anyway.
    let cpu = *cpus.last().expect("at least one CPU");
    let device = device_with(
        Config::default()
            .cost(Cost::zero())
            .name("pinned-engine")
            .engine_cpu(cpu),
    );
    assert_eq!(device.config().engine_cpu_pin(), Some(cpu));
    assert_eq!(allowed_cpus(&thread_dir("pinned-engine")), vec![cpu]);
    // This thread keeps its own CPUs.
    assert_eq!(allowed_cpus("/proc/thread-self"), cpus);
    one_transfer(&device, &host_memory(&device, 4096), 8);
}

#[test]
fn an_engine_cpu_the_process_may_not_use_is_refused() {
    let cpus = allowed_cpus("/proc/thread-self");
    // Beyond any CPU set the kernel takes, and (on a machine where this process is not
    // allowed everywhere) a CPU outside its set.
    let mut bad = vec![4096, u32::MAX];
    if let Some(outside) = (0..1024).find(|cpu| !cpus.contains(cpu)) {
        bad.push(outside);
    }
    for cpu in bad {
        let config = Config::default()
            .cost(Cost::zero())
            .memory_size(1 << 20)
            .engine_cpu(cpu);
        let err = Loopback::new(config).expect_err("a CPU this process may not use");
        match userdma_loopback::Error::of(&err) {
            Some(userdma_loopback::Error::Config { field, value, .. }) => {
                assert_eq!((*field, *value), ("engine_cpu", u64::from(cpu)));
                assert!(err.to_string().contains("taskset"), "{err}");
            }
            _ => panic!("engine CPU {cpu}: {err:?}"),
        }
    }
}
