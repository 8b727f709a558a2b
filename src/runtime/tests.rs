//! The runtime against the loopback device: one transfer each way through owned buffers and
//! typed descriptors, handles that outlive each other in any order, and the errors of a device
//! without a built-in format.

use std::sync::Arc;
use std::time::Duration;

use super::Runtime;
use crate::device::loopback::{self, Code as Status, Cost, Descriptor};
use crate::device::{self, Device};
use crate::dma::DeviceOffset;
use crate::memory::PageSize;
use crate::pool::OwnedBuffer;
use crate::ring;

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(10));

fn runtime() -> Runtime {
    Runtime::loopback(loopback::Config::default().queues(2).cost(Cost::zero()))
        .expect("a loopback device")
}

fn assert_owned<T: Send + Sync + 'static>() {}

#[test]
fn runtime_and_its_handles_are_static_and_send() {
    assert_owned::<Runtime>();
    assert_owned::<OwnedBuffer>();
    fn send<T: Send + 'static>() {}
    send::<loopback::Queue>();
}

#[test]
fn one_transfer_there_and_back_through_device_memory() {
    let runtime = runtime();
    let pool = runtime.pool(4 << 20, PageSize::Base).expect("pool");
    let memory = runtime.device_memory().expect("device memory");
    let window = memory.alloc(4096, 256).expect("a device range");
    let mut queue = runtime.queue(ring::Config::new(64)).expect("queue");

    let source = pool.alloc_owned(4096).expect("source");
    let payload: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    source.write(0, &payload).expect("write");
    let destination = pool.alloc_owned(4096).expect("destination");
    let (src, dst) = (source.iova(), destination.iova());

    queue
        .push(
            Descriptor::to_device(src, window.offset(), 4096).build(),
            source,
        )
        .expect("to device");
    queue
        .push(
            Descriptor::to_host(window.offset(), dst, 4096).build(),
            destination,
        )
        .expect("to host");
    queue.flush().expect("doorbell");
    let first = queue.wait(TIMEOUT).expect("first");
    assert_eq!(first.entry.loopback_code(), Ok(Status::Success));
    let back = queue.wait(TIMEOUT).expect("second");
    assert_eq!(back.entry.loopback_code(), Ok(Status::Success));
    let mut got = vec![0u8; 4096];
    back.payload.read(0, &mut got).expect("read");
    assert_eq!(got, payload);
    // Memory the device was not given is refused with an error completion, not written.
    queue
        .submit(
            Descriptor::to_device(crate::dma::Iova(0x10), DeviceOffset(0), 8).build(),
            pool.alloc_owned(8).expect("buffer"),
        )
        .expect("submitted");
    let refused = queue.wait(TIMEOUT).expect("completion");
    assert_eq!(refused.entry.loopback_code(), Ok(Status::HostUnmapped));
}

#[test]
fn handles_outlive_the_runtime_in_any_order_and_in_flight_buffers_come_back() {
    let runtime = runtime();
    let pool = runtime.pool(4 << 20, PageSize::Base).expect("pool");
    let weak = Arc::downgrade(&pool);
    let mut queue = runtime
        .queue(ring::Config::new(64).with_id(1).with_context(0))
        .expect("queue");
    let buffers: Vec<_> = (0..8)
        .map(|_| pool.alloc_owned(512).expect("buffer"))
        .collect();
    for buffer in buffers {
        let d = Descriptor::to_device(buffer.iova(), DeviceOffset(0), 512).build();
        queue.push(d, buffer).expect("pushed");
    }
    queue.flush().expect("doorbell");
    // Everything but the queue goes first; the queue still owns its buffers and its device.
    drop((runtime, pool));
    assert!(
        weak.upgrade().is_some(),
        "buffers in flight keep their pool"
    );
    let queue = std::thread::spawn(move || {
        let mut done = 0;
        while done < 4 {
            let completion = queue.wait(TIMEOUT).expect("completion");
            assert!(completion.entry.is_success());
            done += 1;
        }
        queue
    })
    .join()
    .expect("thread");
    // Dropping the queue with work possibly in flight stops the device queue first.
    drop(queue);
    assert!(
        weak.upgrade().is_none(),
        "the last buffer dropped the pool and its mapping"
    );
}

#[test]
fn a_device_without_a_built_in_format_says_what_to_use() {
    let loopback = Arc::new(
        loopback::Loopback::new(loopback::Config::default().cost(Cost::zero())).expect("device"),
    );
    let runtime = Runtime::from_device(Arc::clone(&loopback) as Arc<dyn Device>);
    let err = runtime.queue(ring::Config::new(64)).unwrap_err();
    assert_eq!(err.code(), crate::Code::Unsupported);
    assert!(err.to_string().contains("Runtime::open_queue"), "{err}");
    assert!(runtime.device_memory().is_err());
    // The generic path works with the driver's format.
    let mut queue: loopback::Queue<()> = runtime
        .open_queue(
            loopback::Format::new(loopback),
            ring::Config::new(64),
            device::Wait::Poll,
        )
        .expect("queue through the format");
    queue.submit(Descriptor::nop().build(), ()).expect("nop");
    assert!(queue.wait(TIMEOUT).expect("done").entry.is_success());
}

#[test]
fn queue_ids_in_use_and_out_of_range_are_refused() {
    let runtime = runtime();
    let _first = runtime.queue(ring::Config::new(64)).expect("queue 0");
    let busy = runtime.queue(ring::Config::new(64)).unwrap_err();
    assert_eq!(busy.code(), crate::Code::Busy, "{busy}");
    let missing = runtime.queue(ring::Config::new(64).with_id(9)).unwrap_err();
    assert_eq!(missing.code(), crate::Code::NotFound, "{missing}");
    let bad = runtime.pool(0, PageSize::Base).unwrap_err();
    assert_eq!(bad.code(), crate::Code::InvalidArgument, "{bad}");
}

#[test]
fn a_queue_waits_on_the_vector_it_names() {
    let runtime = runtime();
    // Queue 1's completions raise vector 1 on the loopback device: naming it explicitly is
    // the same as the default.
    let config = ring::Config::new(64).with_id(1);
    let mut queue: loopback::Queue<()> = runtime
        .queue_with(config, device::Wait::Vector(1))
        .expect("queue 1 on vector 1");
    queue.submit(Descriptor::nop().build(), ()).expect("nop");
    assert!(queue.wait(TIMEOUT).expect("woken").entry.is_success());
    drop(queue);
    let missing = runtime
        .queue_with::<()>(config, device::Wait::Vector(7))
        .unwrap_err();
    assert_eq!(missing.code(), crate::Code::NotFound, "{missing}");
    // The failed open released everything: the queue opens again.
    runtime
        .queue_with::<()>(config, device::Wait::Poll)
        .expect("queue 1 again");
}

#[test]
fn a_planned_model_runs_in_its_arena_without_allocating() {
    use crate::plan::{self, Budget, Options, Strategy, Tensor};
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
    let arena = runtime.device_arena(&plan).expect("device arena");
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

    let host = runtime
        .host_arena(&plan, PageSize::Base)
        .expect("host arena");
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
