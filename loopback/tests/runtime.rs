//! The runtime against the loopback device: one transfer each way through owned buffers and
//! typed descriptors, handles that outlive each other in any order, and the errors of a device
//! without a built-in format.

use std::sync::Arc;
use std::time::Duration;

use userdma::device::{self, Device};
use userdma::dma::DeviceOffset;
use userdma::memory::PageSize;
use userdma::pool::OwnedBuffer;
use userdma::{ring, Runtime};
use userdma_loopback::{
    self as loopback, Cost, Descriptor, LoopbackRuntime, LoopbackStatus, StatusCode,
};

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
    assert_eq!(first.entry.loopback_code(), Ok(StatusCode::Success));
    let back = queue.wait(TIMEOUT).expect("second");
    assert_eq!(back.entry.loopback_code(), Ok(StatusCode::Success));
    let mut got = vec![0u8; 4096];
    back.payload.read(0, &mut got).expect("read");
    assert_eq!(got, payload);
    // Memory the device was not given is refused with an error completion, not written.
    queue
        .submit(
            Descriptor::to_device(userdma::dma::Iova(0x10), DeviceOffset(0), 8).build(),
            pool.alloc_owned(8).expect("buffer"),
        )
        .expect("submitted");
    let refused = queue.wait(TIMEOUT).expect("completion");
    assert_eq!(refused.entry.loopback_code(), Ok(StatusCode::HostUnmapped));
}

#[test]
fn handles_outlive_the_runtime_in_any_order_and_in_flight_buffers_come_back() {
    let runtime = runtime();
    let pool = runtime.pool(4 << 20, PageSize::Base).expect("pool");
    // The pool's memory: alive as long as the pool's state (its handle or an owned buffer).
    let weak = Arc::downgrade(pool.mapping().region());
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
        "buffers in flight keep their pool's memory"
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
    assert_eq!(err.code(), userdma::Code::Unsupported);
    assert!(err.to_string().contains("Runtime::open_queue"), "{err}");
    // Device memory is the device's own say (`Device::memory_bar`), known without its type.
    let memory = runtime
        .device_memory()
        .expect("the device says where its memory is");
    assert_eq!(memory.size(), loopback.config().memory_bytes() as u64);
    // A device that does not say gets an error naming what to make instead.
    let vfio_like = Runtime::from_device(Arc::new(NoMemory(Arc::clone(&loopback))));
    let err = vfio_like.device_memory().expect_err("no memory BAR said");
    assert_eq!(err.code(), userdma::Code::Unsupported);
    assert!(err.to_string().contains("DeviceMemory::of_bar"), "{err}");
    assert!(vfio_like.device_as::<loopback::Loopback>().is_none());
    assert!(Runtime::from_concrete(Arc::clone(&loopback))
        .device_as::<loopback::Loopback>()
        .is_some());
    // The generic path works with the driver's format.
    let mut queue: loopback::Queue<()> = runtime
        .open_queue(
            loopback::NpuFormat::new(loopback),
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
    assert_eq!(busy.code(), userdma::Code::Busy, "{busy}");
    let missing = runtime.queue(ring::Config::new(64).with_id(9)).unwrap_err();
    assert_eq!(missing.code(), userdma::Code::NotFound, "{missing}");
    let bad = runtime.pool(0, PageSize::Base).unwrap_err();
    assert_eq!(bad.code(), userdma::Code::InvalidArgument, "{bad}");
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
    assert_eq!(missing.code(), userdma::Code::NotFound, "{missing}");
    // The failed open released everything: the queue opens again.
    runtime
        .queue_with::<()>(config, device::Wait::Poll)
        .expect("queue 1 again");
}

/// A device that forwards everything to the loopback device but does not say where its
/// memory is (the default `Device::memory_bar`), as a backend that does not know would.
#[derive(Debug)]
struct NoMemory(Arc<loopback::Loopback>);

impl Device for NoMemory {
    fn identity(&self) -> &device::Identity {
        self.0.identity()
    }
    fn bar(&self, index: usize) -> Result<userdma::mmio::DynBlock, device::Error> {
        self.0.bar(index)
    }
    fn dma_space(&self) -> Arc<dyn userdma::dma::Space> {
        self.0.dma_space()
    }
    fn vectors(&self) -> u32 {
        self.0.vectors()
    }
    fn interrupt(&self, vector: u32) -> Result<userdma::irq::EventFd, device::Error> {
        self.0.interrupt(vector)
    }
    fn set_masked(&self, vector: u32, masked: bool) -> Result<(), device::Error> {
        self.0.set_masked(vector, masked)
    }
    fn reset(&self) -> Result<(), device::Error> {
        self.0.reset()
    }
}

/// Memory the caller allocated (`Region::borrowed`), mapped into the loopback NPU's DMA space:
/// the device copies into and out of it by IOVA, and it stays the caller's afterwards.
#[test]
fn the_device_copies_through_memory_the_caller_owns() {
    let runtime = runtime();
    let len = 2 * 4096;
    let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
    // SAFETY: a non-zero size; the memory is freed below, after the region and its mapping.
    let raw = unsafe { std::alloc::alloc_zeroed(layout) };
    let ptr = std::ptr::NonNull::new(raw).expect("memory");
    // SAFETY: `raw` stays allocated until after `mapping` (which holds the region) is dropped,
    // and the test reaches it only through raw pointers meanwhile.
    let region = unsafe { userdma::memory::Region::borrowed(ptr, len, PageSize::Base) }
        .expect("the caller's memory");
    let mapping = runtime
        .dma_space()
        .map(Arc::new(region))
        .expect("mapped into the device's space");
    let payload: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
    // SAFETY: page 0 of the allocation; the device touches nothing yet.
    unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), raw, 4096) };
    let memory = runtime.device_memory().expect("device memory");
    let window = memory.alloc(4096, 256).expect("a device range");
    let mut queue = runtime
        .queue_with::<()>(ring::Config::new(64), device::Wait::Poll)
        .expect("queue");
    let (page0, page1) = (mapping.iova(0).unwrap(), mapping.iova(4096).unwrap());
    queue
        .push(
            Descriptor::to_device(page0, window.offset(), 4096).build(),
            (),
        )
        .expect("to device");
    queue
        .push(
            Descriptor::to_host(window.offset(), page1, 4096).build(),
            (),
        )
        .expect("to host");
    queue.flush().expect("doorbell");
    for _ in 0..2 {
        let done = queue.wait(TIMEOUT).expect("a completion");
        assert_eq!(done.entry.loopback_code(), Ok(StatusCode::Success));
    }
    drop(queue);
    drop(mapping);
    let mut back = vec![0u8; 4096];
    // SAFETY: page 1 of the allocation, which the device finished writing above.
    unsafe { std::ptr::copy_nonoverlapping(raw.add(4096), back.as_mut_ptr(), 4096) };
    assert_eq!(back, payload, "the device wrote the caller's page 1");
    // SAFETY: allocated above with this layout; nothing holds it any more.
    unsafe { std::alloc::dealloc(raw, layout) };
}

/// Device-read-only and device-write-only mappings (`Space::map_with`): the loopback NPU reads
/// a read-only mapping and fails a write into it with `HostAccess` (the memory unchanged), and
/// the other way round for a write-only one.
#[test]
fn access_modes_are_enforced_by_the_device() {
    use userdma::dma::Access;
    use userdma::memory::Region;
    let runtime = runtime();
    let memory = runtime.device_memory().expect("device memory");
    let window = memory.alloc(4096, 256).expect("a device range");
    let mut queue = runtime
        .queue_with::<()>(ring::Config::new(64), device::Wait::Poll)
        .expect("queue");
    let mut run = |desc: Descriptor| {
        queue.push(desc.build(), ()).expect("pushed");
        queue.flush().expect("doorbell");
        queue.wait(TIMEOUT).expect("a completion").entry
    };
    let region = |fill: u8| {
        let r = Region::builder(4096)
            .page_size(PageSize::Base)
            .lock(false)
            .build()
            .expect("a page");
        userdma::dma::Slice::from_region(&r).fill(fill);
        Arc::new(r)
    };
    let space = runtime.dma_space();
    let read_only = space.map_with(region(0xaa), Access::ReadOnly).unwrap();
    assert_eq!(read_only.access(), Access::ReadOnly);
    let ro = read_only.iova(0).unwrap();
    // The device reads it ...
    let done = run(Descriptor::to_device(ro, window.offset(), 4096));
    assert_eq!(done.loopback_code(), Ok(StatusCode::Success));
    // ... and may not write it: an error completion naming the IOVA, nothing written.
    let done = run(Descriptor::to_host(window.offset(), ro, 4096));
    assert_eq!(done.loopback_code(), Ok(StatusCode::HostAccess));
    assert_eq!(done.result, ro.raw());
    let mut bytes = vec![0u8; 4096];
    read_only.slice().read_into(0, &mut bytes).unwrap();
    assert!(
        bytes.iter().all(|&b| b == 0xaa),
        "the read-only page is unchanged"
    );

    let write_only = space.map_with(region(0), Access::WriteOnly).unwrap();
    let wo = write_only.iova(0).unwrap();
    let done = run(Descriptor::to_device(wo, window.offset(), 4096));
    assert_eq!(done.loopback_code(), Ok(StatusCode::HostAccess));
    let done = run(Descriptor::to_host(window.offset(), wo, 4096));
    assert_eq!(done.loopback_code(), Ok(StatusCode::Success));
    write_only.slice().read_into(0, &mut bytes).unwrap();
    assert!(
        bytes.iter().all(|&b| b == 0xaa),
        "the device wrote what it read before"
    );
    drop(queue);
}

/// A pool's layout follows what its device says it needs (`Device::dma_alignment`): the
/// loopback NPU takes 256-byte aligned buffers, so its pools are cache-coloured (4 KiB buffers
/// at several offsets within a page); a device that does not say needs a page, so its pools'
/// 4 KiB buffers are page aligned. A caller can ask for either layout the device allows, and
/// is told when it asks for one the device does not.
#[test]
fn a_pool_takes_its_layout_from_the_device_alignment() {
    const BUFFERS: usize = 32;
    /// The offsets within a page of `BUFFERS` 4 KiB buffers of `pool`, each checked aligned.
    fn page_offsets(
        pool: &Arc<userdma::pool::Pool>,
        align: u64,
    ) -> std::collections::BTreeSet<u64> {
        let buffers: Vec<OwnedBuffer> = (0..BUFFERS)
            .map(|_| pool.alloc_owned(4096).expect("a buffer"))
            .collect();
        buffers
            .iter()
            .map(|b| {
                assert_eq!(
                    b.iova().0 % align,
                    0,
                    "{:#x} aligned to {align}",
                    b.iova().0
                );
                b.iova().0 % 4096
            })
            .collect()
    }
    let runtime = runtime();
    assert_eq!(runtime.dma_alignment(), 256);
    let pool = runtime.pool(4 << 20, PageSize::Base).expect("a pool");
    assert!(
        pool.is_coloured(4096),
        "the loopback NPU gets the coloured layout"
    );
    assert!(
        page_offsets(&pool, 256).len() > 1,
        "4 KiB buffers at several page offsets"
    );
    // Page aligned when asked.
    let config = Runtime::pool_config(PageSize::Base).colouring(false);
    let aligned = runtime
        .pool_with(4 << 20, PageSize::Base, config)
        .expect("a page-aligned pool");
    assert!(!aligned.is_coloured(4096));
    assert_eq!(page_offsets(&aligned, 4096).len(), 1);
    // A stated alignment below the device's is refused, naming it.
    let config = Runtime::pool_config(PageSize::Base).dma_alignment(64);
    let err = runtime
        .pool_with(4 << 20, PageSize::Base, config)
        .unwrap_err();
    assert_eq!(err.code(), userdma::Code::InvalidArgument, "{err}");
    assert!(err.to_string().contains("dma_alignment = 64"), "{err}");

    // A device that does not say: a page, so page-aligned classes.
    let loopback = Arc::clone(runtime.loopback_device().unwrap());
    let plain = Runtime::from_device(Arc::new(NoMemory(loopback)));
    assert_eq!(plain.dma_alignment(), 4096);
    let pool = plain.pool(4 << 20, PageSize::Base).expect("a pool");
    assert!(
        !pool.is_coloured(4096),
        "page aligned for a device that needs pages"
    );
    assert_eq!(page_offsets(&pool, 4096), [0].into());
    // Colouring asked for on it is refused: its buffers would be 256-byte aligned only.
    let config = Runtime::pool_config(PageSize::Base).colouring(true);
    let err = plain
        .pool_with(4 << 20, PageSize::Base, config)
        .unwrap_err();
    assert_eq!(err.code(), userdma::Code::InvalidArgument, "{err}");
    assert!(err.to_string().contains("colouring"), "{err}");
    // A bad alignment is an error too, not a panic.
    let config = Runtime::pool_config(PageSize::Base).dma_alignment(3000);
    let err = plain
        .pool_with(4 << 20, PageSize::Base, config)
        .unwrap_err();
    assert!(err.to_string().contains("a power of two"), "{err}");
}
