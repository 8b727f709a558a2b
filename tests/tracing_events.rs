//! The driver's `tracing` spans and events (the `tracing` feature; docs/tracing-events.md),
//! caught by a subscriber of the test's own (tests/common/capture.rs) around work on the
//! loopback device: a removal reported once with the device's name, a queue's creation as a
//! span with its id and depth, DMA maps and unmaps as spans with the IOVA the mapping has, a
//! pool's creation, the runtime's, and a ring protocol error.
//!
//! `cargo test -p userdma --features tracing --test tracing_events`

use std::time::Duration;

use userdma::device::Device;
use userdma::memory::PageSize;
use userdma::ring::{self, Error as RingError};
use userdma::{Code, Runtime};
use userdma_loopback::fault::{Injection, Kind};
use userdma_loopback::{Config, Cost, Descriptor, LoopbackRuntime};

#[path = "common/capture.rs"]
mod capture;

use capture::{Capture, Fields};

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(10));

/// A small loopback runtime named `name`.
fn runtime(name: &str) -> Runtime {
    Runtime::loopback(
        Config::default()
            .name(name)
            .cost(Cost::zero())
            .memory_size(1 << 20)
            .queues(4),
    )
    .expect("a loopback device")
}

#[test]
fn a_removal_is_reported_once_with_the_device_name() {
    let ((), capture) = Capture::run(|| {
        let runtime = runtime("trace-removal");
        let device = runtime.loopback_device().expect("loopback").clone();
        device.remove();
        device.remove();
        // Using it after: refused, and reported no second time.
        let refused = runtime.queue(ring::Config::new(16)).unwrap_err();
        assert_eq!(refused.code(), Code::Removed);
        assert_eq!(device.reset().unwrap_err().code(), Code::Removed);
    });
    let removals = capture.events_saying("device removed");
    assert_eq!(removals.len(), 1, "{:#?}", capture.events());
    assert_eq!(removals[0].level, tracing::Level::WARN);
    assert_eq!(removals[0].field("device"), Some("trace-removal"));
    assert_eq!(removals[0].target, "userdma::device::events");
    // The refused queue still opened its span, with the device it was refused on.
    let opens = capture.spans_named("queue.open");
    assert_eq!(opens.len(), 1);
    assert_eq!(opens[0].field("device"), Some("trace-removal (simulated)"));
    assert!(
        capture.events_saying("device reset").is_empty(),
        "a removed device is not reset"
    );
}

#[test]
fn opening_a_queue_is_a_span_with_its_id_and_depth() {
    let (ring_iova, capture) = Capture::run(|| {
        let runtime = runtime("trace-queue");
        let queue = runtime
            .queue(ring::Config::new(64).with_id(2))
            .expect("queue 2");
        assert_eq!(queue.id(), 2);
        queue.memory().iova().to_string()
    });
    let opens = capture.spans_named("queue.open");
    assert_eq!(opens.len(), 1, "{:#?}", capture.spans());
    let open = &opens[0];
    assert_eq!(open.level, tracing::Level::INFO);
    assert_eq!(open.field("queue"), Some("2"));
    assert_eq!(open.field("depth"), Some("64"));
    assert_eq!(open.field("device"), Some("trace-queue (simulated)"));
    // The ring is made inside it, in memory mapped inside it.
    let created = capture.events_saying("ring created");
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].field("queue"), Some("2"));
    assert_eq!(created[0].field("ring_iova"), Some(ring_iova.as_str()));
    assert!(created[0].within("queue.open").is_some());
    let mapped = capture.events_saying("mapped");
    assert!(
        mapped
            .iter()
            .any(|e| e.within("queue.open").is_some() && e.within("dma.map").is_some()),
        "{mapped:#?}"
    );
}

#[test]
fn maps_and_unmaps_are_spans_with_the_iova() {
    let ((iova, bytes), capture) = Capture::run(|| {
        let runtime = runtime("trace-dma");
        let mapping = runtime
            .map_memory(256 << 10, PageSize::Base)
            .expect("mapped");
        let seen = (mapping.iova(0).expect("mapped").to_string(), mapping.len());
        drop(mapping);
        seen
    });
    let map = capture
        .events_saying("mapped")
        .into_iter()
        .find(|e| e.within("runtime.map_memory").is_some())
        .expect("the runtime's map");
    assert_eq!(map.field("iova"), Some(iova.as_str()));
    assert_eq!(map.field("bytes"), Some(bytes.to_string().as_str()));
    assert_eq!(map.field("space"), Some("software IOMMU"));
    let span = map.within("dma.map").expect("inside the map span");
    assert_eq!(span.field("bytes"), Some(bytes.to_string().as_str()));
    assert_eq!(span.level, tracing::Level::DEBUG);
    let unmaps = capture.spans_named("dma.unmap");
    assert!(
        unmaps
            .iter()
            .any(|s| s.field("iova") == Some(iova.as_str())),
        "{unmaps:#?}"
    );
}

#[test]
fn a_pool_and_the_runtime_say_what_they_made() {
    let (pool_iova, capture) = Capture::run(|| {
        let runtime = runtime("trace-pool");
        let pool = runtime.pool(4 << 20, PageSize::Base).expect("a pool");
        pool.alloc_owned(4096).expect("a buffer").iova().to_string()
    });
    let ready = capture.events_saying("runtime ready");
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].field("device"), Some("trace-pool (simulated)"));
    assert_eq!(ready[0].field("dma_space"), Some("software IOMMU"));
    let pools = capture.spans_named("pool.new");
    assert_eq!(pools.len(), 1);
    assert_eq!(pools[0].field("how"), Some("private"));
    assert_eq!(
        pools[0].field("bytes"),
        Some((4u64 << 20).to_string().as_str())
    );
    let made = capture.events_saying("pool ready");
    assert_eq!(made.len(), 1);
    assert!(made[0].within("pool.new").is_some());
    assert!(!pool_iova.is_empty());
    // Nothing is reported per buffer.
    assert!(capture
        .events()
        .iter()
        .all(|e| !e.message.contains("buffer")));
}

#[test]
fn a_ring_protocol_error_is_reported_with_the_queue() {
    let (error, capture) = Capture::run(|| {
        let runtime = runtime("trace-protocol");
        let device = runtime.loopback_device().expect("loopback").clone();
        device
            .inject(1, &Injection::next(Kind::WrongId, 1))
            .expect("injected");
        let pool = runtime.pool(4 << 20, PageSize::Base).expect("a pool");
        let mut queue = runtime
            .queue(ring::Config::new(16).with_id(1).with_in_order(true))
            .expect("queue 1");
        for i in 0..4u64 {
            let buffer = pool.alloc_owned(64).expect("a buffer");
            let at = userdma::dma::DeviceOffset(i * 64);
            queue
                .push(Descriptor::to_device(buffer.iova(), at, 64).build(), buffer)
                .expect("pushed");
        }
        queue.flush().expect("announced");
        let error = loop {
            match queue.wait(TIMEOUT) {
                Ok(_) => continue,
                Err(error) => break error,
            }
        };
        let _ = device.recover(queue);
        error
    });
    assert!(
        matches!(
            error,
            RingError::WrongCommand { queue: 1, .. } | RingError::LostCompletion { queue: 1, .. }
        ),
        "{error}"
    );
    let faults = capture.events_saying("ring protocol error: queue faulted");
    assert_eq!(faults.len(), 1, "{:#?}", capture.events());
    assert_eq!(faults[0].level, tracing::Level::WARN);
    assert_eq!(faults[0].field("queue"), Some("1"));
    assert_eq!(faults[0].field("error"), Some(error.to_string().as_str()));
}
