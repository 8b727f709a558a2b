//! Single-threaded tests of the queue pair: the host `Queue` and a `DeviceQueue` driven in turn
//! over loopback DMA memory, with the doorbells recorded.

use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
use std::sync::Arc;
use std::time::Duration;

use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::*;
use crate::dma::{Mapping, SoftIommu, Space};
use crate::memory::{PageSize, Region};
use crate::mmio::{Access, Block, Op, Recording, Shared, Width};

mod held;
mod nvme;

/// An 8-byte descriptor: id and a value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
struct Small {
    id: u16,
    tag: u16,
    value: u32,
}
impl Submission for Small {
    fn command_id(&self) -> u16 {
        self.id
    }
    fn set_command_id(&mut self, id: u16) {
        self.id = id;
    }
}

/// A payload that counts its drops.
#[derive(Debug)]
struct Tracked {
    value: u32,
    drops: Arc<AtomicUsize>,
}
impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, StdOrdering::SeqCst);
    }
}

struct Rig<T: Send> {
    queue: Queue<Small, Status, T>,
    device: DeviceQueue<Small, Status>,
    bar: Recording<Shared>,
    _space: SoftIommu,
}

fn mapped(space: &SoftIommu, len: usize) -> Arc<Mapping> {
    let len = len.div_ceil(4096) * 4096;
    let region = Region::builder(len)
        .page_size(PageSize::Base)
        .lock(false)
        .build()
        .expect("a base-page region");
    Arc::new(space.map(Arc::new(region)).expect("loopback mapping"))
}

fn setup<T: Send>(depth: u32, interrupt: bool) -> Rig<T> {
    let space = SoftIommu::new(48).unwrap();
    let layout = Layout::new::<Small, Status>(depth).unwrap();
    let mapping = mapped(&space, layout.size());
    let memory = Memory::from_mapping(mapping, 0, layout.size()).unwrap();
    let bar = Recording::new(Shared::new(256));
    let doorbells = Doorbells::new(Block::new(bar.clone()).erase(), 0x10, 0x50).unwrap();
    let (host_irq, device_irq) = if interrupt {
        let irq = crate::irq::EventFd::new().unwrap();
        let clone = irq.try_clone().unwrap();
        (Some(irq), Some(clone))
    } else {
        (None, None)
    };
    let config = Config::new(depth).with_id(3).with_context(9);
    let queue = Queue::new(config, memory.clone(), doorbells.clone(), host_irq).unwrap();
    // The device reaches the ring by translating its IOVA, as the loopback engine does.
    let window = space.translate(memory.iova(), layout.size()).unwrap();
    let device_memory = Memory::from_window(window, memory.iova()).unwrap();
    let device = DeviceQueue::new(3, depth, device_memory, doorbells, device_irq).unwrap();
    bar.take_log();
    Rig {
        queue,
        device,
        bar,
        _space: space,
    }
}

/// The device completes everything announced, echoing `value + 1` as the result.
fn serve(device: &mut DeviceQueue<Small, Status>) -> usize {
    device.fetch().unwrap();
    let mut n = 0;
    while let Some(desc) = device.pop() {
        device
            .complete(Status::new(desc.id, 0, u64::from(desc.value) + 1))
            .unwrap();
        n += 1;
    }
    device.release();
    n
}

#[test]
fn layout_checks_depth_and_entry_types() {
    assert!(matches!(
        Layout::new::<Small, Status>(3),
        Err(Error::InvalidDepth { depth: 3, .. })
    ));
    assert!(Layout::new::<Small, Status>(MAX_DEPTH * 2).is_err());
    let layout = Layout::new::<Command, Status>(64).unwrap();
    assert_eq!(layout.sq_offset(), 0);
    assert_eq!(layout.cq_offset(), 64 * 64);
    assert_eq!(
        layout.sq_head_offset(),
        64 * 64 + ((64 * 16) as usize).next_multiple_of(128)
    );
    assert_eq!(layout.interrupt_offset(), layout.sq_head_offset() + 128);
    assert_eq!(layout.size(), layout.interrupt_offset() + 128);
    assert_eq!((layout.sq_entry_size(), layout.cq_entry_size()), (64, 16));

    #[repr(C)]
    #[derive(Clone, Copy, FromBytes, IntoBytes, Immutable)]
    struct Odd([u8; 6]);
    impl Submission for Odd {
        fn command_id(&self) -> u16 {
            0
        }
        fn set_command_id(&mut self, _: u16) {}
    }
    assert!(matches!(
        Layout::new::<Odd, Status>(4),
        Err(Error::EntryType {
            kind: "submission",
            size: 6,
            ..
        })
    ));

    #[repr(C)]
    #[derive(Clone, Copy, FromBytes, IntoBytes, Immutable)]
    struct TwoBits([u32; 2]);
    impl Completion for TwoBits {
        const PHASE_WORD: usize = 4;
        const PHASE_BIT: u32 = 0b11;
        fn command_id(&self) -> u16 {
            0
        }
    }
    assert!(matches!(
        Layout::new::<Small, TwoBits>(4),
        Err(Error::EntryType {
            kind: "completion",
            ..
        })
    ));

    #[repr(C)]
    #[derive(Clone, Copy, FromBytes, IntoBytes, Immutable)]
    struct PastEnd([u32; 2]);
    impl Completion for PastEnd {
        const PHASE_WORD: usize = 8;
        const PHASE_BIT: u32 = 1;
        fn command_id(&self) -> u16 {
            0
        }
    }
    assert!(Layout::new::<Small, PastEnd>(4).is_err());
}

#[test]
fn memory_and_doorbells_are_checked() {
    let space = SoftIommu::new(48).unwrap();
    let mapping = mapped(&space, 8192);
    assert!(matches!(
        Memory::from_mapping(Arc::clone(&mapping), 8000, 400),
        Err(Error::MemoryRange { .. })
    ));
    assert!(matches!(
        Memory::from_mapping(Arc::clone(&mapping), 8, 64),
        Err(Error::MisalignedMemory { .. })
    ));
    let memory = Memory::from_mapping(Arc::clone(&mapping), 0, 8192).unwrap();
    assert_eq!(memory.iova(), mapping.iova(0).unwrap());
    let sub = memory.sub(4096, 1024).unwrap();
    assert_eq!(sub.iova(), memory.iova() + 4096);
    assert_eq!(sub.len(), 1024);
    assert!(memory.sub(4000, 64).is_err(), "unaligned sub-range");
    assert!(memory.sub(8192 - 64, 128).is_err(), "past the end");

    let small = memory.sub(0, 256).unwrap();
    let doorbells = Doorbells::new(Block::new(Shared::new(64)).erase(), 0, 4).unwrap();
    let made: Result<Queue<Small, Status, ()>, _> =
        Queue::new(Config::new(64), small, doorbells, None);
    assert!(matches!(made, Err(Error::MemoryTooSmall { len: 256, .. })));

    let bar = Block::new(Shared::new(64)).erase();
    assert!(matches!(
        Doorbells::new(bar.clone(), 62, 0),
        Err(Error::DoorbellOffset { offset: 62, .. })
    ));
    assert!(matches!(
        Doorbells::new(bar.clone(), 2, 8),
        Err(Error::DoorbellOffset { offset: 2, .. })
    ));
    assert!(matches!(
        Doorbells::new(bar, 8, 8),
        Err(Error::SameDoorbell { offset: 8 })
    ));
}

#[test]
fn one_doorbell_per_batch_and_payloads_come_back() {
    let mut rig = setup::<Vec<u32>>(8, false);
    for value in 0..5u32 {
        let id = rig
            .queue
            .push(
                Small {
                    value,
                    ..Small::default()
                },
                vec![value],
            )
            .unwrap();
        assert_eq!(id, value as u16, "ids are handed out lowest first");
    }
    assert_eq!(rig.queue.unflushed(), 5);
    assert!(rig.bar.take_log().is_empty(), "no doorbell before flush");
    rig.queue.flush().unwrap();
    rig.queue.flush().unwrap();
    assert_eq!(
        rig.bar.take_log(),
        vec![Access {
            op: Op::Write,
            offset: 0x10,
            width: Width::U32,
            value: 5
        }],
        "one SQ doorbell for the batch, none for an empty flush"
    );
    assert_eq!(rig.queue.in_flight(), 5);
    assert_eq!(serve(&mut rig.device), 5);
    let mut got = Vec::new();
    let reaped = rig
        .queue
        .reap(16, |done| {
            assert_eq!(done.entry.result, u64::from(done.payload[0]) + 1);
            assert_eq!(done.entry.command_id, done.id);
            got.push(done.payload[0]);
        })
        .unwrap();
    assert_eq!((reaped, got), (5, vec![0, 1, 2, 3, 4]));
    let cq_writes: Vec<_> = rig
        .bar
        .take_log()
        .into_iter()
        .filter(|a| a.op == Op::Write)
        .collect();
    assert_eq!(
        cq_writes,
        vec![Access {
            op: Op::Write,
            offset: 0x50,
            width: Width::U32,
            value: 5
        }],
        "one CQ head doorbell for the batch"
    );
    assert_eq!(rig.queue.in_flight(), 0);
    let stats = rig.queue.stats();
    assert_eq!(
        (
            stats.submitted,
            stats.completed,
            stats.sq_doorbells,
            stats.cq_doorbells
        ),
        (5, 5, 1, 1)
    );
}

#[test]
fn phase_survives_many_wraps_and_full_rings() {
    let depth = 4;
    let mut rig = setup::<u32>(depth, false);
    let mut next = 0u32;
    let mut expect = 0u32;
    for round in 0..50 {
        // Fill the ring completely (no slot is wasted), then one more is refused.
        for _ in 0..depth {
            rig.queue
                .push(
                    Small {
                        value: next,
                        ..Small::default()
                    },
                    next,
                )
                .unwrap();
            next += 1;
        }
        let refused = rig.queue.push(Small::default(), 999).unwrap_err();
        assert!(
            matches!(refused.error, Error::Full { queue: 3, depth: 4 }),
            "{round}: {:?}",
            refused.error
        );
        assert_eq!(refused.payload, 999, "handed back");
        rig.queue.flush().unwrap();
        // The device serves in two halves, so completions straddle the ring's wrap.
        rig.device.fetch().unwrap();
        for _ in 0..2 {
            let desc = rig.device.pop().unwrap();
            rig.device
                .complete(Status::new(desc.id, 0, u64::from(desc.value)))
                .unwrap();
        }
        rig.device.release();
        for _ in 0..2 {
            let done = rig.queue.poll_one().unwrap().unwrap();
            assert_eq!(
                (done.payload, done.entry.result),
                (expect, u64::from(expect))
            );
            expect += 1;
        }
        assert!(rig.queue.poll_one().unwrap().is_none());
        serve(&mut rig.device);
        while let Some(done) = rig.queue.poll_one().unwrap() {
            assert_eq!(done.payload, expect);
            expect += 1;
        }
    }
    assert_eq!(expect, next);
}

#[test]
fn command_ids_run_out_before_slots_when_completions_lag() {
    let mut rig = setup::<u8>(4, false);
    for i in 0..4 {
        rig.queue.push(Small::default(), i).unwrap();
    }
    rig.queue.flush().unwrap();
    // The device reads everything (SQ slots free) but completes nothing yet.
    rig.device.fetch().unwrap();
    let descs: Vec<_> = std::iter::from_fn(|| rig.device.pop()).collect();
    rig.device.release();
    let refused = rig.queue.push(Small::default(), 9).unwrap_err();
    assert!(matches!(
        refused.error,
        Error::NoCommandId { in_flight: 4, .. }
    ));
    // Out of order completion is fine.
    for desc in descs.iter().rev() {
        rig.device.complete(Status::new(desc.id, 0, 0)).unwrap();
    }
    let order: Vec<u8> = std::iter::from_fn(|| rig.queue.poll_one().unwrap())
        .map(|done| done.payload)
        .collect();
    assert_eq!(order, vec![3, 2, 1, 0]);
}

#[test]
fn posted_descriptors_need_no_completion() {
    let mut rig = setup::<()>(4, false);
    for value in 0..3 {
        // SAFETY: the descriptor names no host memory.
        unsafe {
            rig.queue.post(Small {
                value,
                ..Small::default()
            })
        }
        .unwrap();
    }
    rig.queue.flush().unwrap();
    rig.device.fetch().unwrap();
    let got: Vec<_> = std::iter::from_fn(|| rig.device.pop()).collect();
    assert!(got.iter().all(|d| d.id == POSTED));
    assert_eq!(
        got.iter().map(|d| d.value).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    rig.device.release();
    assert_eq!(rig.queue.in_flight(), 0);
    // Four more fit again once the head is written back.
    for _ in 0..4 {
        // SAFETY: as above.
        unsafe { rig.queue.post(Small::default()) }.unwrap();
    }
    assert_eq!(rig.queue.stats().posted, 7);
}

#[test]
fn a_misbehaving_device_is_an_error() {
    let mut rig = setup::<u8>(4, false);
    rig.queue.submit(Small::default(), 1).unwrap();
    serve(&mut rig.device);
    // A duplicate completion for id 0 after it was reaped.
    rig.queue.poll_one().unwrap().unwrap();
    rig.device.complete(Status::new(0, 0, 0)).unwrap();
    assert!(matches!(
        rig.queue.poll_one(),
        Err(Error::UnknownCommand { queue: 3, id: 0 })
    ));
    rig.device.complete(Status::new(77, 0, 0)).unwrap();
    assert!(matches!(
        rig.queue.reap(8, |_| {}),
        Err(Error::UnknownCommand { id: 77, .. })
    ));
    assert_eq!(rig.queue.in_flight(), 0);

    // A head write-back past the announced tail.
    let memory = rig.queue.memory().clone();
    memory.store_u32(rig.queue.layout().sq_head_offset(), 100);
    // The cached head is still 0: three pushes fit, the fourth reads the write-back.
    for _ in 0..3 {
        rig.queue.push(Small::default(), 0).unwrap();
    }
    let refused = rig.queue.push(Small::default(), 0);
    assert!(
        matches!(
            refused,
            Err(Rejected {
                error: Error::DeviceSqHead { head: 100, .. },
                ..
            })
        ),
        "{refused:?}"
    );
}

#[test]
fn a_misbehaving_host_is_a_device_error() {
    let mut rig = setup::<u8>(4, false);
    rig.queue.doorbells().block().write::<u32>(0x10, 9).unwrap();
    assert!(matches!(
        rig.device.fetch(),
        Err(Error::HostSqTail { tail: 9, .. })
    ));
    // The CQ fills up when the host never consumes.
    let mut rig = setup::<u8>(2, false);
    for i in 0..2 {
        rig.queue.submit(Small::default(), i).unwrap();
    }
    serve(&mut rig.device);
    assert!(matches!(
        rig.device.complete(Status::new(0, 0, 0)),
        Err(Error::CqFull { depth: 2, .. })
    ));
    rig.queue.reap(8, |_| {}).unwrap();
    assert_eq!(rig.device.cq_room().unwrap(), 2);
    rig.queue.doorbells().block().write::<u32>(0x50, 7).unwrap();
    rig.device.complete(Status::new(0, 0, 0)).unwrap();
    rig.device.complete(Status::new(1, 0, 0)).unwrap();
    assert!(matches!(
        rig.device.cq_room(),
        Err(Error::HostCqHead { head: 7, .. })
    ));
}

#[test]
fn timeouts_without_an_interrupt() {
    let mut rig = setup::<u8>(4, false);
    rig.queue.submit(Small::default(), 1).unwrap();
    let err = rig.queue.wait(Some(Duration::from_millis(5))).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                queue: 3,
                in_flight: 1,
                ..
            }
        ),
        "{err}"
    );
    serve(&mut rig.device);
    assert_eq!(rig.queue.wait(Some(Duration::ZERO)).unwrap().payload, 1);
}

#[test]
fn interrupt_is_raised_only_when_armed() {
    let mut rig = setup::<u8>(4, true);
    rig.queue.submit(Small::default(), 1).unwrap();
    serve(&mut rig.device);
    assert!(
        !rig.device.interrupt().unwrap(),
        "not armed: no system call"
    );
    assert!(rig.queue.interrupt().unwrap().try_read().unwrap().is_none());
    assert!(
        rig.queue.arm_interrupt().unwrap(),
        "a completion is waiting"
    );
    rig.queue.disarm_interrupt();
    rig.queue.poll_one().unwrap().unwrap();
    assert!(!rig.queue.arm_interrupt().unwrap());
    rig.queue.submit(Small::default(), 2).unwrap();
    serve(&mut rig.device);
    assert!(rig.device.interrupt().unwrap());
    assert_eq!(rig.queue.interrupt().unwrap().try_read().unwrap(), Some(1));
    rig.queue.disarm_interrupt();
    assert!(!rig.device.interrupt().unwrap());
}

struct FakeDevice {
    ok: bool,
    calls: Arc<AtomicUsize>,
}
impl Quiesce for FakeDevice {
    fn quiesce(&mut self, queue: u16, _timeout: Duration) -> std::io::Result<()> {
        assert_eq!(queue, 3);
        self.calls.fetch_add(1, StdOrdering::SeqCst);
        if self.ok {
            Ok(())
        } else {
            Err(std::io::Error::other("device hung"))
        }
    }
}

fn tracked(value: u32, drops: &Arc<AtomicUsize>) -> Tracked {
    Tracked {
        value,
        drops: Arc::clone(drops),
    }
}

#[test]
fn drop_collects_finished_work_and_quiesces_the_rest() {
    let drops = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut rig = setup::<Tracked>(8, false);
    rig.queue.set_quiesce(FakeDevice {
        ok: true,
        calls: Arc::clone(&calls),
    });
    for i in 0..3 {
        rig.queue
            .push(Small::default(), tracked(i, &drops))
            .unwrap();
    }
    rig.queue.flush().unwrap();
    rig.device.fetch().unwrap();
    let first = rig.device.pop().unwrap();
    rig.device.complete(Status::new(first.id, 0, 0)).unwrap();
    // Pushed but never announced: the device cannot know of it.
    rig.queue
        .push(Small::default(), tracked(3, &drops))
        .unwrap();
    drop(rig.queue);
    assert_eq!(
        calls.load(StdOrdering::SeqCst),
        1,
        "two commands were still out"
    );
    // Dropped, so not leaked (the process-wide leak count is shared with tests running in
    // parallel, so it cannot be compared here).
    assert_eq!(
        drops.load(StdOrdering::SeqCst),
        4,
        "all payloads dropped after quiesce"
    );
}

#[test]
fn drop_leaks_when_the_device_cannot_be_stopped() {
    let drops = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut rig = setup::<Tracked>(8, false);
    rig.queue.set_quiesce(FakeDevice {
        ok: false,
        calls: Arc::clone(&calls),
    });
    rig.queue
        .submit(Small::default(), tracked(1, &drops))
        .unwrap();
    rig.queue
        .submit(Small::default(), tracked(2, &drops))
        .unwrap();
    let before = leaks();
    drop(rig.queue);
    assert_eq!(calls.load(StdOrdering::SeqCst), 1);
    assert_eq!(
        drops.load(StdOrdering::SeqCst),
        0,
        "in-flight payloads are never dropped"
    );
    let after = leaks();
    assert!(after.queues > before.queues);
    assert!(after.payloads >= before.payloads + 2);
    // The ring memory is still mapped: the device side can still complete into it.
    serve(&mut rig.device);
}

#[test]
fn idle_drop_neither_quiesces_nor_leaks() {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut rig = setup::<u8>(4, false);
    rig.queue.set_quiesce(FakeDevice {
        ok: false,
        calls: Arc::clone(&calls),
    });
    rig.queue.submit(Small::default(), 1).unwrap();
    serve(&mut rig.device);
    // Finished but not reaped: collected on drop.
    drop(rig.queue);
    assert_eq!(calls.load(StdOrdering::SeqCst), 0);
}

#[test]
fn shutdown_does_not_sleep_through_a_late_sq_head_write_back() {
    // Everything completed, but the device writes its SQ head back only later (preempted
    // between its completions and its release): no interrupt follows, so a shutdown that slept
    // on one for its whole timeout would return only then.
    let mut rig = setup::<u32>(8, true);
    rig.queue.submit(Small::default(), 7).unwrap();
    rig.device.fetch().unwrap();
    let desc = rig.device.pop().unwrap();
    rig.device.complete(Status::new(desc.id, 0, 0)).unwrap();
    assert!(
        !rig.device.interrupt().unwrap(),
        "the host asked for no interrupt yet"
    );
    let done = rig.queue.wait(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(done.payload, 7);
    let mut device = rig.device;
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        device.release();
        device
    });
    let timeout = Duration::from_secs(20);
    let start = std::time::Instant::now();
    let shut = rig.queue.shutdown(timeout).unwrap();
    let took = start.elapsed();
    assert!(shut.completed.is_empty() && shut.aborted.is_empty());
    // Not a speed check: the bound is half the timeout, which the old wait slept through.
    assert!(
        took < timeout / 2,
        "shutdown took {took:?} for a 20 ms write-back"
    );
    drop(late.join().unwrap());
}

#[test]
fn shutdown_hands_back_completed_and_aborted_work() {
    let drops = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut rig = setup::<Tracked>(8, false);
    rig.queue.set_quiesce(FakeDevice {
        ok: true,
        calls: Arc::clone(&calls),
    });
    for i in 0..3 {
        rig.queue
            .push(Small::default(), tracked(i, &drops))
            .unwrap();
    }
    rig.queue.flush().unwrap();
    rig.device.fetch().unwrap();
    let first = rig.device.pop().unwrap();
    rig.device.complete(Status::new(first.id, 0, 0)).unwrap();
    rig.device.release();
    let shut = rig.queue.shutdown(Duration::from_millis(20)).unwrap();
    assert_eq!(shut.completed.len(), 1);
    assert_eq!(shut.completed[0].payload.value, 0);
    let mut aborted: Vec<u32> = shut.aborted.iter().map(|(_, p)| p.value).collect();
    aborted.sort_unstable();
    assert_eq!(aborted, vec![1, 2]);
    assert_eq!(calls.load(StdOrdering::SeqCst), 1);
    assert_eq!(
        drops.load(StdOrdering::SeqCst),
        0,
        "handed back, not dropped"
    );
    drop(shut);
    assert_eq!(drops.load(StdOrdering::SeqCst), 3);

    // Without a way to stop the device, shutdown leaks and says so.
    let mut rig = setup::<Tracked>(8, false);
    rig.queue
        .submit(Small::default(), tracked(9, &drops))
        .unwrap();
    let err = rig.queue.shutdown(Duration::from_millis(5)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Quiesce {
                in_flight: 1,
                leaked: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn push_wait_makes_room_by_reaping() {
    let mut rig = setup::<u32>(2, false);
    rig.queue.push(Small::default(), 0).unwrap();
    rig.queue.push(Small::default(), 1).unwrap();
    // Nobody serves: times out, hands the payload back, and flushed what was queued.
    let refused = rig
        .queue
        .push_wait(Small::default(), 2, Some(Duration::from_millis(3)))
        .unwrap_err();
    assert!(matches!(refused.error, Error::Timeout { .. }));
    assert_eq!(refused.payload, 2);
    assert_eq!(rig.queue.unflushed(), 0);
    serve(&mut rig.device);
    let id = rig
        .queue
        .push_wait(Small::default(), 2, Some(Duration::from_millis(100)))
        .unwrap();
    assert!(id < 2);
    // Completions reaped to make room are handed out first, in order.
    assert_eq!(rig.queue.poll_one().unwrap().unwrap().payload, 0);
    assert_eq!(rig.queue.poll_one().unwrap().unwrap().payload, 1);
}

#[test]
fn bursts_fill_the_ring_and_spare_the_line_the_device_reads() {
    // 8-byte entries, 8 per cache line, 16 deep: two lines.
    let mut rig = setup::<u32>(16, false);
    let mut items = (0..40u32).map(|v| {
        (
            Small {
                value: v,
                ..Small::default()
            },
            v,
        )
    });
    assert_eq!(rig.queue.push_burst(&mut items).unwrap(), 16);
    assert_eq!(
        items.next().map(|(_, v)| v),
        Some(16),
        "the rest stays in the iterator"
    );
    assert_eq!(rig.queue.unflushed(), 16);
    rig.queue.flush().unwrap();
    rig.device.fetch().unwrap();
    let mut held: Vec<Small> = (0..3).map(|_| rig.device.pop().unwrap()).collect();
    rig.device.release();
    // Slots 0..3 are free, but share a line with slot 3, which the device reads next.
    let mut more = (100..104u32).map(|v| (Small::default(), v));
    assert_eq!(rig.queue.push_burst(&mut more).unwrap(), 0);
    // SAFETY: the descriptors name no memory.
    let posted = unsafe { rig.queue.post_burst(&mut [Small::default(); 4].into_iter()) };
    assert_eq!(posted.unwrap(), 0);
    let refused = rig.queue.push(Small::default(), 7).unwrap_err();
    assert!(matches!(refused.error, Error::Full { .. }));
    // Once the device is into the next line, the first line is free to write...
    held.extend((0..6).map(|_| rig.device.pop().unwrap()));
    rig.device.release();
    // ...but every id is in flight until completions come back.
    let refused = rig.queue.push(Small::default(), 7).unwrap_err();
    assert!(
        matches!(refused.error, Error::NoCommandId { .. }),
        "{:?}",
        refused.error
    );
    let mut twelve = [Small::default(); 12].into_iter();
    // SAFETY: as above.
    let posted = unsafe { rig.queue.post_burst(&mut twelve) };
    assert_eq!(twelve.len(), 4, "the rest stays in the iterator");
    assert_eq!(posted.unwrap(), 8);
    rig.queue.flush().unwrap();
    // The device finishes everything: all ids come back, and the whole ring is usable again.
    rig.device.fetch().unwrap();
    held.extend(std::iter::from_fn(|| rig.device.pop()));
    rig.device.release();
    let mut completed = 0;
    for desc in held.iter().filter(|d| d.id != POSTED) {
        rig.device.complete(Status::new(desc.id, 0, 0)).unwrap();
        completed += 1;
    }
    assert_eq!((completed, held.len()), (16, 24));
    assert_eq!(rig.queue.reap(64, |_| {}).unwrap(), 16);
    let mut again = (0..40u32).map(|v| (Small::default(), v));
    assert_eq!(rig.queue.push_burst(&mut again).unwrap(), 16);
    let stats = rig.queue.stats();
    assert_eq!((stats.submitted, stats.posted), (32, 8));
}

#[test]
fn pop_burst_reads_across_the_ring_wrap_in_order() {
    let mut rig = setup::<u32>(8, false);
    let mut next = 0u32;
    let mut expect = 0u32;
    for round in 0..20 {
        // 5 at a time on a ring of 8: runs start at every slot and often wrap.
        for _ in 0..5 {
            rig.queue
                .push(
                    Small {
                        value: next,
                        ..Small::default()
                    },
                    next,
                )
                .unwrap();
            next += 1;
        }
        rig.queue.flush().unwrap();
        assert_eq!(rig.device.fetch().unwrap(), 5);
        // A limit smaller than what is there leaves the rest for the next call.
        let mut got = Vec::new();
        let max = if round % 2 == 0 { 2 } else { 5 };
        let n = rig.device.pop_burst(max, |d| got.push(d));
        assert_eq!(n as usize, got.len());
        assert_eq!(n, max);
        let m = rig.device.pop_burst(u32::MAX, |d| got.push(d));
        assert_eq!(n + m, 5);
        assert_eq!(
            rig.device.pop_burst(u32::MAX, |_| panic!("nothing left")),
            0
        );
        assert!(rig.device.pop().is_none());
        for desc in &got {
            assert_eq!(desc.value, expect, "in order, whole");
            expect += 1;
            rig.device
                .complete(Status::new(desc.id, 0, u64::from(desc.value)))
                .unwrap();
        }
        rig.device.release();
        let reaped = rig
            .queue
            .reap(8, |done| {
                assert_eq!(done.entry.result, u64::from(done.payload))
            })
            .unwrap();
        assert_eq!(reaped, 5);
    }
}

#[test]
fn room_reads_the_device_head_only_when_short_of_what_is_wanted() {
    // 8-byte entries, 8 per cache line, 16 deep.
    let mut rig = setup::<()>(16, false);
    assert_eq!(rig.queue.room(16).unwrap(), 16);
    let mut ten = [Small::default(); 10].into_iter();
    // SAFETY: the descriptors name no host memory.
    assert_eq!(unsafe { rig.queue.post_burst(&mut ten) }.unwrap(), 10);
    rig.queue.flush().unwrap();
    assert_eq!(rig.queue.room(1).unwrap(), 6);
    // The device takes all ten and writes its head back.
    rig.device.fetch().unwrap();
    assert_eq!(rig.device.pop_burst(u32::MAX, drop), 10);
    rig.device.release();
    // Enough room by the count the queue keeps: the head is not read again...
    assert_eq!(rig.queue.room(6).unwrap(), 6);
    // ...but asking for more reads it, and finds all sixteen free (the device has nothing
    // left to read, so no line is spared).
    assert_eq!(rig.queue.room(7).unwrap(), 16);
    assert_eq!(rig.queue.room(16).unwrap(), 16);
    // More than the ring holds is never there: the answer is what is free.
    assert_eq!(rig.queue.room(17).unwrap(), 16);
    let mut sixteen = [Small::default(); 16].into_iter();
    // SAFETY: as above.
    assert_eq!(unsafe { rig.queue.post_burst(&mut sixteen) }.unwrap(), 16);
    assert_eq!(rig.queue.room(1).unwrap(), 0);
}

#[test]
fn doorbell_and_entry_counts_survive_their_wraps() {
    use super::submit::SqTail;
    // Doorbells of 2^15 entries each (the most a queue can have unannounced). From zero,
    // 2^17 + 1 of them: the tail counter wraps once past 2^32, the doorbell count (kept modulo
    // 2^16 in the word) twice. Under Miri (scripts/miri.sh), where those rounds took 22 s, four
    // of them from two short of both wraps: each counter wraps once.
    let (mut tail, rounds, announced, doorbells) = if cfg!(miri) {
        let tail = SqTail::at(0u32.wrapping_sub(2 << 15), u16::MAX - 1);
        (tail, 4, 1u32 << 16, (1u64 << 16) + 2)
    } else {
        (SqTail::default(), (1 << 17) + 1, 1 << 15, (1 << 17) + 1)
    };
    for _ in 0..rounds {
        tail.wrote(1 << 15);
        tail.rang();
    }
    assert_eq!(tail.announced(), announced);
    assert_eq!(tail.unflushed(), 0);
    let entries = (1u64 << 32) + u64::from(announced);
    assert_eq!(tail.entries(), entries);
    assert_eq!(tail.doorbells(), doorbells);
    // Written and not yet announced: entries, not doorbells; the next counter past them.
    tail.wrote(3);
    assert_eq!((tail.unflushed(), tail.next()), (3, announced + 3));
    assert_eq!(tail.entries(), entries + 3);
    assert_eq!(tail.doorbells(), doorbells);
    // One taken back unannounced is still counted as written.
    tail.unwrite();
    assert_eq!((tail.unflushed(), tail.next()), (2, announced + 2));
    assert_eq!(tail.entries(), entries + 3);

    // Three doorbells short of 2^16 of them, one entry each.
    let mut tail = SqTail::at(7, u16::MAX - 2);
    for _ in 8..13 {
        tail.wrote(1);
        tail.rang();
    }
    assert_eq!(tail.announced(), 12);
    assert_eq!(tail.doorbells(), (1u64 << 16) + 2);
    assert_eq!(tail.entries(), 12);

    // Both wraps in one post-and-ring (`wrote_and_rang`, what `post_and_flush` records) with
    // entries queued before it: the tail counter passes 2^32 under the queued ones, and the
    // doorbell count's carry (into the unflushed bits) is cleared with them.
    let mut tail = SqTail::at(u32::MAX - 1, u16::MAX);
    tail.wrote(2);
    assert_eq!(
        (tail.next(), tail.unflushed(), tail.announced()),
        (0, 2, u32::MAX - 1)
    );
    assert_eq!(tail.entries(), 1u64 << 32);
    tail.wrote_and_rang(1);
    assert_eq!((tail.next(), tail.unflushed(), tail.announced()), (1, 0, 1));
    assert_eq!(tail.doorbells(), 1u64 << 16);
    assert_eq!(tail.entries(), (1u64 << 32) + 1);
    // Entries taken back across the tail counter's wrap take the wrap back with them, and
    // still count as written.
    let mut tail = SqTail::at(u32::MAX, 0);
    tail.wrote(2);
    assert_eq!((tail.next(), tail.unflushed()), (1, 2));
    tail.unwrite();
    tail.unwrite();
    assert_eq!((tail.next(), tail.unflushed()), (u32::MAX, 0));
    assert_eq!(tail.entries(), (1u64 << 32) + 1);
}

/// `post_and_flush` of a descriptor that names no host memory.
fn post_now(queue: &mut Queue<Small, Status, ()>, desc: Small) -> Result<(), Error> {
    // SAFETY: the descriptor names no host memory.
    unsafe { queue.post_and_flush(desc) }
}

#[test]
fn post_and_flush_rings_once_for_it_and_what_was_posted_before() {
    let mut rig = setup::<()>(4, false);
    let small = |value| Small {
        value,
        ..Small::default()
    };
    // SAFETY: the descriptor names no host memory.
    unsafe { rig.queue.post(small(1)) }.unwrap();
    post_now(&mut rig.queue, small(2)).unwrap();
    let writes = |bar: &Recording<Shared>| -> Vec<(usize, u64)> {
        bar.take_log()
            .into_iter()
            .filter(|access| access.op == Op::Write)
            .map(|access| (access.offset, access.value))
            .collect()
    };
    // One doorbell, announcing both.
    assert_eq!(writes(&rig.bar), vec![(0x10, 2)]);
    assert_eq!(rig.queue.unflushed(), 0);
    assert_eq!(rig.device.fetch().unwrap(), 2);
    let got: Vec<_> = std::iter::from_fn(|| rig.device.pop()).collect();
    assert_eq!(got, [small(1), small(2)].map(|d| Small { id: POSTED, ..d }));
    // Two more fit; the next is refused, with nothing written or rung, and counted.
    post_now(&mut rig.queue, small(3)).unwrap();
    post_now(&mut rig.queue, small(4)).unwrap();
    assert_eq!(writes(&rig.bar), vec![(0x10, 3), (0x10, 4)]);
    let refused = post_now(&mut rig.queue, small(5)).unwrap_err();
    assert!(
        matches!(refused, Error::Full { queue: 3, depth: 4 }),
        "{refused:?}"
    );
    assert_eq!(writes(&rig.bar), vec![]);
    let stats = rig.queue.stats();
    assert_eq!(
        (stats.posted, stats.sq_doorbells, stats.full),
        (4, 3, 1),
        "{stats:?}"
    );
    // Once the device hands the two slots it read back, the queue finds them (it reads the
    // head again) and takes descriptors again.
    rig.device.release();
    post_now(&mut rig.queue, small(5)).unwrap();
    assert_eq!(writes(&rig.bar), vec![(0x10, 5)]);
    assert_eq!(rig.device.fetch().unwrap(), 3);
    let got: Vec<u32> = std::iter::from_fn(|| rig.device.pop())
        .map(|d| d.value)
        .collect();
    assert_eq!(got, vec![3, 4, 5]);
    assert_eq!(rig.queue.stats().posted, 5);
}

/// Register memory whose writes fail while `fail` is set (a BAR reached through a file whose
/// writes the kernel refuses).
#[derive(Debug)]
struct Flaky {
    inner: Shared,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

impl crate::mmio::Backend for Flaky {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn read(&self, offset: usize, width: Width) -> Result<u64, crate::mmio::Error> {
        self.inner.read(offset, width)
    }

    fn write(&self, offset: usize, width: Width, value: u64) -> Result<(), crate::mmio::Error> {
        if self.fail.load(StdOrdering::SeqCst) {
            return Err(crate::mmio::Error::Write {
                offset,
                file_offset: offset as u64,
                width,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        self.inner.write(offset, width, value)
    }
}

#[test]
fn a_failed_doorbell_leaves_the_descriptor_queued_for_the_next_flush() {
    let space = SoftIommu::new(48).unwrap();
    let layout = Layout::new::<Small, Status>(4).unwrap();
    let memory = Memory::from_mapping(mapped(&space, layout.size()), 0, layout.size()).unwrap();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bar = Flaky {
        inner: Shared::new(256),
        fail: Arc::clone(&fail),
    };
    let doorbells = Doorbells::new(Block::new(bar).erase(), 0x10, 0x50).unwrap();
    let mut queue: Queue<Small, Status, ()> =
        Queue::new(Config::new(4), memory.clone(), doorbells.clone(), None).unwrap();
    let window = space.translate(memory.iova(), layout.size()).unwrap();
    let device_memory = Memory::from_window(window, memory.iova()).unwrap();
    let mut device: DeviceQueue<Small, Status> =
        DeviceQueue::new(0, 4, device_memory, doorbells, None).unwrap();

    fail.store(true, StdOrdering::SeqCst);
    let desc = Small {
        value: 7,
        ..Small::default()
    };
    let error = post_now(&mut queue, desc).unwrap_err();
    assert!(
        matches!(
            error,
            Error::Doorbell {
                which: "SQ tail",
                ..
            }
        ),
        "{error:?}"
    );
    // Written, not announced: the device sees nothing, and the entry waits for a flush.
    assert_eq!(queue.unflushed(), 1);
    let stats = queue.stats();
    assert_eq!((stats.posted, stats.sq_doorbells), (1, 0));
    assert_eq!(device.fetch().unwrap(), 0);
    fail.store(false, StdOrdering::SeqCst);
    queue.flush().unwrap();
    assert_eq!(queue.stats().sq_doorbells, 1);
    assert_eq!(device.fetch().unwrap(), 1);
    assert_eq!(device.pop().map(|d| d.value), Some(7));
}

#[test]
fn pop_prefetches_each_cache_line_once_as_entries_reach_it() {
    use super::entries::new_lines;
    // 8-byte entries from a line boundary: the first of each eight reaches a new line.
    let lines: Vec<_> = (0..16)
        .map(|k| new_lines(4096 + 8 * k, 8, k == 0).collect::<Vec<_>>())
        .collect();
    for (k, lines) in lines.iter().enumerate() {
        let expected = if k % 8 == 0 { vec![64 + k / 8] } else { vec![] };
        assert_eq!(*lines, expected, "entry {k}");
    }
    // 64-byte entries: one line each.
    assert_eq!(new_lines(4096 + 64, 64, false).collect::<Vec<_>>(), [65]);
    // 48-byte entries straddle lines: the second (bytes 48..96) reaches line 1, which the
    // first (0..48) did not; the third (96..144) reaches line 2; the fourth (144..192) no new
    // one; the first of the ring reaches its own line.
    assert_eq!(new_lines(0, 48, true).collect::<Vec<_>>(), [0]);
    assert_eq!(new_lines(48, 48, false).collect::<Vec<_>>(), [1]);
    assert_eq!(new_lines(96, 48, false).collect::<Vec<_>>(), [2]);
    assert_eq!(
        new_lines(144, 48, false).collect::<Vec<_>>(),
        Vec::<usize>::new()
    );
    // A 256-byte entry reaches four lines.
    assert_eq!(new_lines(256, 256, false).collect::<Vec<_>>(), [4, 5, 6, 7]);
}
