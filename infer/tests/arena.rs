//! A planned model's arenas: each tensor at its planned place in device memory and in host
//! memory mapped for DMA, written and read back through the loopback device.

use std::time::Duration;

use userdma::memory::PageSize;
use userdma::{ring, Runtime};
use userdma_infer::arena::{DeviceArena, HostArena};
use userdma_infer::plan::{self, Budget, Options, Strategy, Tensor};
use userdma_loopback::{self as loopback, Cost, Descriptor, LoopbackRuntime};

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(10));

fn runtime() -> Runtime {
    Runtime::loopback(loopback::Config::default().queues(2).cost(Cost::zero()))
        .expect("a loopback device")
}

#[test]
fn a_planned_model_runs_in_its_arena_without_allocating() {
    let runtime = runtime();
    // Three tensors: 0 and 2 never live together, so they share memory.
    let tensors = [
        Tensor::new(0, 4000, 0, 1),
        Tensor::new(1, 1000, 1, 2),
        Tensor::new(2, 3000, 2, 3),
    ];
    let plan = plan::plan(
        &tensors,
        &Options::default(),
        Strategy::Auto,
        Budget::Nodes(10_000),
    )
    .expect("plan");
    plan.validate(&tensors).expect("valid");
    let arena = DeviceArena::new(runtime.device_memory().expect("device memory"), &plan)
        .expect("device arena");
    assert!(arena.range().len() >= plan.arena_bytes);
    let pool = runtime.pool(4 << 20, PageSize::Base).expect("pool");
    let mut queue = runtime.queue(ring::Config::new(64)).expect("queue");
    // Write each tensor's bytes to its planned place and read them back.
    for t in &tensors {
        let at = arena.tensor(t.id).expect("placed");
        assert_eq!(at.bytes, t.bytes);
        assert!(at.offset.is_aligned(plan.align));
        let len = t.bytes as usize;
        let source = pool.alloc_owned(len).expect("source");
        source.write(0, &vec![t.id as u8 + 1; len]).expect("write");
        let back = pool.alloc_owned(len).expect("back");
        let (src, dst) = (source.iova(), back.iova());
        queue
            .push(
                Descriptor::to_device(src, at.offset, t.bytes).build(),
                source,
            )
            .expect("push");
        queue
            .push(Descriptor::to_host(at.offset, dst, t.bytes).build(), back)
            .expect("push");
        queue.flush().expect("doorbell");
        assert!(queue.wait(TIMEOUT).expect("there").entry.is_success());
        let done = queue.wait(TIMEOUT).expect("back");
        let mut got = vec![0u8; len];
        done.payload.read(0, &mut got).expect("read");
        assert!(got.iter().all(|&b| b == t.id as u8 + 1));
    }
    assert_eq!(arena.tensor(99), None);

    let host = HostArena::new(&runtime, &plan, PageSize::Base).expect("host arena");
    let t0 = host.tensor(0).expect("tensor 0");
    let t2 = host.tensor(2).expect("tensor 2");
    assert_eq!(t0.iova, host.mapping().iova(t0.offset).expect("mapped"));
    host.slice(1)
        .expect("slice")
        .write_from(0, b"abc")
        .expect("write");
    assert_eq!(
        plan.placements[0].offset == plan.placements[2].offset,
        t0.offset == t2.offset
    );
}
