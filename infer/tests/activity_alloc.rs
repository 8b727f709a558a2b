//! Draining activity records allocates nothing (a counting global allocator, this thread's
//! count): a trace recorder may call `Accelerator::drain_activity` as often as it likes during
//! a run.

use std::time::Duration;

use userdma::device::Wait;
use userdma::Runtime;
use userdma_infer::accel::{Accelerator, Activity, LoopbackEngine, Op, QueueSpec, Unit};
use userdma_infer::stats::thread_allocations;
use userdma_loopback::{self as loopback, LoopbackRuntime};

#[global_allocator]
static GLOBAL: userdma_infer::stats::CountingAllocator = userdma_infer::stats::CountingAllocator;

#[test]
fn draining_activity_records_allocates_nothing() {
    let runtime = Runtime::loopback(loopback::Config::default().queues(1)).unwrap();
    let engine = LoopbackEngine::new(&runtime).unwrap();
    engine.record_activity(256).unwrap();
    let pool = engine.host_pool(4 << 20).unwrap();
    let buffer = pool.alloc_owned(4096).unwrap();
    let arena = engine.alloc_arena(4096, 64).unwrap();
    let mut queue = engine
        .open_queue(QueueSpec {
            id: 0,
            depth: 64,
            context: 0,
            unit: Unit::Copy,
            wait: Wait::Interrupt,
            arena_bytes: 4096,
        })
        .unwrap();
    let span = userdma_infer::accel::HostSpan {
        iova: buffer.iova(),
        ptr: buffer.as_ptr(),
        len: 4096,
    };
    let mut got: Vec<Activity> = Vec::with_capacity(1024);
    let mut run = |n: u64| {
        for tag in 0..n {
            let op = Op::ToDevice {
                from: span,
                to: arena.at,
            };
            queue.push(op, tag).unwrap();
        }
        queue.flush().unwrap();
        for _ in 0..n {
            queue.wait(Duration::from_secs(20)).unwrap();
        }
    };
    // Warm-up: the first drain's lock and register reads.
    run(4);
    engine.drain_activity(&mut |a| got.push(*a)).unwrap();
    for round in 0..10 {
        run(32);
        let before = thread_allocations();
        let drained = engine.drain_activity(&mut |a| got.push(*a)).unwrap();
        let allocated = thread_allocations() - before;
        assert_eq!(drained.records, 32, "round {round}");
        assert_eq!(allocated, 0, "round {round}: a drain allocated");
    }
    assert_eq!(got.len(), 4 + 10 * 32);
    engine.stop_activity();
}
