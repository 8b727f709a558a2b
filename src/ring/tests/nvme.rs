//! The queue against a device double that keeps NVMe's queue-pair format: slot-valued SQ tail
//! and CQ head doorbells, the SQ head reported in each completion (dword 2, bits 15:0), the
//! phase in bit 16 of dword 3, SQ and CQ at separately given, page-aligned IOVAs, completions in
//! any order, and a device that never writes ring memory other than CQ entries.

use std::sync::atomic::{fence, Ordering as StdOrdering};
use std::time::Duration;

use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::super::*;
use super::mapped;
use crate::dma::{Iova, SoftIommu};
use crate::irq::EventFd;
use crate::mmio::{Access, Block, DynBlock, Op, Recording, Shared, Width};

/// A 64-byte submission entry in NVMe's shape.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
struct Sqe {
    opcode: u8,
    flags: u8,
    cid: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    mptr: u64,
    prp1: u64,
    prp2: u64,
    cdw10: [u32; 6],
}
const _: () = assert!(std::mem::size_of::<Sqe>() == 64);
impl Submission for Sqe {
    fn command_id(&self) -> u16 {
        self.cid
    }
    fn set_command_id(&mut self, id: u16) {
        self.cid = id;
    }
}

/// A 16-byte completion entry in NVMe's shape: DW0, DW1, DW2 = SQ head | SQ id << 16,
/// DW3 = command id | phase << 16 | status << 17.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
struct Cqe {
    dw0: u32,
    dw1: u32,
    sq_head: u16,
    sq_id: u16,
    cid: u16,
    status: u16,
}
const _: () = assert!(std::mem::size_of::<Cqe>() == 16);
impl Completion for Cqe {
    const PHASE_WORD: usize = 12;
    const PHASE_BIT: u32 = 1 << 16;
    fn command_id(&self) -> u16 {
        self.cid
    }
    fn sq_head(&self) -> Option<u16> {
        Some(self.sq_head)
    }
}

const SQ_DOORBELL: usize = 0x8;
const CQ_DOORBELL: usize = 0xc;
const PAGE: usize = 4096;

/// The device: told the SQ and CQ IOVAs and the depth, as by NVMe's Create I/O SQ/CQ commands.
struct Nvme {
    depth: u32,
    sq: Memory,
    cq: Memory,
    bar: DynBlock,
    irq: Option<EventFd>,
    /// Slot of the next SQ entry to fetch.
    sq_head: u32,
    /// Slot of the next CQ entry to write, and its phase.
    cq_tail: u32,
    phase: bool,
    /// The CQ head slot the host last rang.
    cq_head: u32,
    /// Fetched, not yet completed.
    fetched: Vec<Sqe>,
}

impl Nvme {
    fn new(space: &SoftIommu, depth: u32, sq_iova: u64, cq_iova: u64, bar: DynBlock) -> Nvme {
        let sq_len = depth as usize * 64;
        let cq_len = depth as usize * 16;
        let sq_iova = Iova(sq_iova);
        let sq = Memory::from_window(space.translate(sq_iova, sq_len).unwrap(), sq_iova).unwrap();
        let cq_iova = Iova(cq_iova);
        let cq = Memory::from_window(space.translate(cq_iova, cq_len).unwrap(), cq_iova).unwrap();
        Nvme {
            depth,
            sq,
            cq,
            bar,
            irq: None,
            sq_head: 0,
            cq_tail: 0,
            phase: true,
            cq_head: 0,
            fetched: Vec::new(),
        }
    }

    /// Fetches up to `max` commands the host announced. Panics on a doorbell value NVMe would
    /// reject (a slot past the ring).
    fn fetch(&mut self, max: usize) -> usize {
        let tail = self.bar.read::<u32>(SQ_DOORBELL).unwrap();
        assert!(tail < self.depth, "SQ tail doorbell {tail} is not a slot");
        // Acquire: entries written before the doorbell are visible (pairs with the host's
        // fence(Release) before the doorbell write).
        fence(StdOrdering::Acquire);
        self.sq.tsan_acquire(0);
        let mut n = 0;
        while self.sq_head != tail && n < max {
            let entry: Sqe = self.sq.read_entry(self.sq_head as usize * 64);
            self.fetched.push(entry);
            self.sq_head = (self.sq_head + 1) % self.depth;
            n += 1;
        }
        n
    }

    /// Whether the CQ is full in NVMe's sense (one slot always empty), re-reading the head.
    fn cq_full(&mut self) -> bool {
        let head = self.bar.read::<u32>(CQ_DOORBELL).unwrap();
        assert!(head < self.depth, "CQ head doorbell {head} is not a slot");
        fence(StdOrdering::Acquire);
        self.cq.tsan_acquire(0);
        self.cq_head = head;
        (self.cq_tail + 1) % self.depth == self.cq_head
    }

    /// Completes the `index`th fetched command with `status`, reporting `sq_head` (normally
    /// the device's real head). `false` if the CQ is full.
    fn complete_with(&mut self, index: usize, status: u16, sq_head: u16) -> bool {
        if self.cq_full() {
            return false;
        }
        let sqe = self.fetched.remove(index);
        let cqe = Cqe {
            dw0: sqe.cdw10[0].wrapping_mul(3),
            dw1: 0,
            sq_head,
            sq_id: 1,
            cid: sqe.cid,
            status: (status << 1) | u16::from(self.phase),
        };
        let offset = self.cq_tail as usize * 16;
        self.cq.write_entry(offset, &cqe, Some(12));
        // Release: the entry is visible before its phase flips (pairs with the host's
        // fence(Acquire) after it sees the phase).
        fence(StdOrdering::Release);
        self.cq.store_u32(offset + 12, Memory::word_of(&cqe, 12));
        self.cq_tail = (self.cq_tail + 1) % self.depth;
        if self.cq_tail == 0 {
            self.phase = !self.phase;
        }
        true
    }

    fn complete(&mut self, index: usize) -> bool {
        let head = self.sq_head as u16;
        self.complete_with(index, 0, head)
    }

    /// MSI-X: an interrupt after a batch, whatever the host's flag in ring memory says.
    fn interrupt(&self) {
        if let Some(irq) = &self.irq {
            irq.signal().unwrap();
        }
    }
}

struct Rig {
    queue: Queue<Sqe, Cqe, u32>,
    device: Nvme,
    bar: Recording<Shared>,
    layout: Layout,
    _space: SoftIommu,
}

fn config(depth: u32) -> Config {
    Config::new(depth)
        .with_id(1)
        .with_doorbell(DoorbellValue::Slot)
        .with_part_align(PAGE)
}

fn nvme_rig(depth: u32, interrupt: bool) -> Rig {
    let space = SoftIommu::new(48).unwrap();
    let layout = config(depth).layout::<Sqe, Cqe>().unwrap();
    assert_eq!(layout, Layout::with_align::<Sqe, Cqe>(depth, PAGE).unwrap());
    let mapping = mapped(&space, layout.size());
    let memory = Memory::from_mapping(mapping, 0, layout.size()).unwrap();
    let bar = Recording::new(Shared::new(64));
    let block = Block::new(bar.clone()).erase();
    let doorbells = Doorbells::new(block.clone(), SQ_DOORBELL, CQ_DOORBELL).unwrap();
    let (host_irq, device_irq) = if interrupt {
        let irq = EventFd::new().unwrap();
        let clone = irq.try_clone().unwrap();
        (Some(irq), Some(clone))
    } else {
        (None, None)
    };
    let queue = Queue::new(config(depth), memory.clone(), doorbells, host_irq).unwrap();
    assert!(queue.sq_head_from_completions());
    assert_eq!(queue.doorbell(), DoorbellValue::Slot);
    // What a driver programs: ASQ/ACQ, or the Create I/O SQ/CQ commands' PRP1.
    let sq_iova = memory.iova() + layout.sq_offset() as u64;
    let cq_iova = memory.iova() + layout.cq_offset() as u64;
    assert_eq!(sq_iova % PAGE as u64, 0);
    assert_eq!(cq_iova % PAGE as u64, 0);
    let mut device = Nvme::new(&space, depth, sq_iova.raw(), cq_iova.raw(), block);
    device.irq = device_irq;
    Rig {
        queue,
        device,
        bar,
        layout,
        _space: space,
    }
}

fn sqe(value: u32) -> Sqe {
    Sqe {
        opcode: 2,
        cdw10: [value, 0, 0, 0, 0, 0],
        ..Sqe::default()
    }
}

/// Every doorbell write so far: (register, value), checking each is a 32-bit slot value.
fn doorbell_writes(bar: &Recording<Shared>, depth: u32) -> Vec<(usize, u64)> {
    bar.take_log()
        .into_iter()
        .filter(|a| a.op == Op::Write)
        .map(
            |Access {
                 offset,
                 width,
                 value,
                 ..
             }| {
                assert_eq!(width, Width::U32);
                assert!(
                    value < u64::from(depth),
                    "doorbell value {value} is not a slot"
                );
                (offset, value)
            },
        )
        .collect()
}

#[test]
fn nvme_layout_puts_each_ring_on_its_own_page() {
    let layout = Layout::with_align::<Sqe, Cqe>(16, PAGE).unwrap();
    assert_eq!((layout.sq_offset(), layout.cq_offset()), (0, PAGE));
    assert_eq!(layout.part_align(), PAGE);
    // The host's own words come after the CQ entries, outside both rings.
    assert!(layout.sq_head_offset() >= layout.cq_offset() + 16 * 16);
    assert!(layout.interrupt_offset() > layout.sq_head_offset());
    assert!(layout.size() >= layout.interrupt_offset() + 4);
    // A deep SQ spills over several pages; the CQ starts on the next one.
    let layout = Layout::with_align::<Sqe, Cqe>(128, PAGE).unwrap();
    assert_eq!(layout.cq_offset(), 2 * PAGE);
    // Small alignments keep the default layout.
    assert_eq!(
        Layout::with_align::<Sqe, Cqe>(16, 64).unwrap(),
        Layout::new::<Sqe, Cqe>(16).unwrap()
    );
    for bad in [0, 32, 3000, 1 << 31] {
        assert!(
            matches!(
                Layout::with_align::<Sqe, Cqe>(16, bad),
                Err(Error::InvalidAlign { align, .. }) if align == bad
            ),
            "{bad}"
        );
    }

    // Ring memory off the page boundary is refused: the device could not be given its bases.
    let space = SoftIommu::new(48).unwrap();
    let mapping = mapped(&space, 4 * PAGE);
    let memory = Memory::from_mapping(mapping, 0, 4 * PAGE).unwrap();
    let doorbells = Doorbells::new(Block::new(Shared::new(64)).erase(), 8, 12).unwrap();
    let off_page = memory.sub(128, 3 * PAGE).unwrap();
    let made: Result<Queue<Sqe, Cqe, ()>, _> =
        Queue::new(config(16), off_page, doorbells.clone(), None);
    assert!(
        matches!(made, Err(Error::PartAlign { align: PAGE, iova }) if iova == (memory.iova() + 128).raw()),
        "{made:?}"
    );
    let made: Result<Queue<Sqe, Cqe, ()>, _> =
        Queue::new(config(16).with_part_align(3000), memory, doorbells, None);
    assert!(matches!(made, Err(Error::InvalidAlign { align: 3000, .. })));
}

#[test]
fn nvme_queue_writes_slots_and_keeps_one_sq_slot_empty() {
    let depth = 8;
    let mut rig = nvme_rig(depth, false);
    assert!(
        doorbell_writes(&rig.bar, depth).is_empty(),
        "no doorbell write before there is something to announce"
    );
    // Full in NVMe's sense: depth - 1 entries, then `Full`.
    for value in 0..depth - 1 {
        rig.queue.push(sqe(value), value).unwrap();
    }
    let refused = rig.queue.push(sqe(99), 99).unwrap_err();
    assert!(
        matches!(refused.error, Error::Full { queue: 1, depth: 8 }),
        "{:?}",
        refused.error
    );
    assert_eq!(refused.payload, 99);
    rig.queue.flush().unwrap();
    assert_eq!(doorbell_writes(&rig.bar, depth), vec![(SQ_DOORBELL, 7)]);

    // The device fetches two but completes nothing: the host cannot know, so still full.
    assert_eq!(rig.device.fetch(2), 2);
    assert!(matches!(
        rig.queue.push(sqe(99), 99).unwrap_err().error,
        Error::Full { .. }
    ));
    // One completion reports SQ head 2: two slots are free again.
    assert!(rig.device.complete(1));
    let done = rig.queue.poll_one().unwrap().unwrap();
    assert_eq!((done.payload, done.entry.dw0), (1, 3));
    assert_eq!(done.entry.sq_id, 1);
    rig.queue.push(sqe(7), 7).unwrap();
    rig.queue.push(sqe(8), 8).unwrap();
    assert!(matches!(
        rig.queue.push(sqe(99), 99).unwrap_err().error,
        Error::Full { .. }
    ));
    rig.queue.flush().unwrap();
    // SQ tail wrapped: 9 entries written, slot 1.
    let writes = doorbell_writes(&rig.bar, depth);
    assert_eq!(writes.last(), Some(&(SQ_DOORBELL, 1)));
    assert!(
        writes.contains(&(CQ_DOORBELL, 1)),
        "the CQ head is rung as a slot: {writes:?}"
    );
    // The device takes everything and completes it in reverse.
    assert_eq!(rig.device.fetch(64), 7);
    let mut got = Vec::new();
    while !rig.device.fetched.is_empty() {
        let last = rig.device.fetched.len() - 1;
        assert!(rig.device.complete(last));
        got.extend(std::iter::from_fn(|| rig.queue.poll_one().unwrap()).map(|d| d.payload));
    }
    assert_eq!(got, vec![8, 7, 6, 5, 4, 3, 2, 0]);
    assert_eq!(rig.queue.in_flight(), 0);
}

/// Runs `rounds` rounds of: push what fits (at most `burst`), flush, let the device fetch and
/// complete a pseudo-random part in a pseudo-random order, reap; then drains. Checks every
/// payload against its descriptor and that the SQ never holds `depth` entries.
fn churn(rig: &mut Rig, rounds: u32, seed: u64) {
    let depth = rig.device.depth;
    let mut rng = seed;
    let mut next = |bound: u32| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((rng >> 33) % u64::from(bound.max(1))) as u32
    };
    let (mut sent, mut done) = (0u32, 0u32);
    let mut outstanding = std::collections::BTreeSet::new();
    for round in 0..rounds + depth * 2 {
        let draining = round >= rounds;
        if !draining {
            let burst = next(depth) + 1;
            for _ in 0..burst {
                match rig.queue.push(sqe(sent), sent) {
                    Ok(_) => {
                        outstanding.insert(sent);
                        sent += 1;
                    }
                    Err(Rejected {
                        error: Error::Full { .. } | Error::NoCommandId { .. },
                        ..
                    }) => break,
                    Err(rejected) => panic!("{}", rejected.error),
                }
            }
            rig.queue.flush().unwrap();
        }
        let unread =
            (rig.device.bar.read::<u32>(SQ_DOORBELL).unwrap() + depth - rig.device.sq_head) % depth;
        assert!(unread < depth, "the SQ never holds depth entries");
        let fetch = if draining { depth } else { next(depth + 1) };
        rig.device.fetch(fetch as usize);
        let completions = if draining { depth } else { next(depth + 1) };
        for _ in 0..completions {
            if rig.device.fetched.is_empty() {
                break;
            }
            let pick = next(rig.device.fetched.len() as u32) as usize;
            if !rig.device.complete(pick) {
                break;
            }
        }
        rig.device.interrupt();
        let mut reaped = Vec::new();
        rig.queue
            .reap(usize::MAX, |d| {
                assert_eq!(d.entry.dw0, d.payload.wrapping_mul(3), "the entry matches");
                assert_eq!(d.entry.status >> 1, 0);
                reaped.push(d.payload);
            })
            .unwrap();
        for value in reaped {
            assert!(outstanding.remove(&value), "{value} completed twice");
            done += 1;
        }
    }
    assert!(outstanding.is_empty(), "{outstanding:?} never completed");
    assert_eq!((sent, done), (done, sent));
    assert!(
        sent >= 8 * depth,
        "the rings wrapped many times ({sent} commands)"
    );
    assert_eq!(rig.queue.in_flight(), 0);
}

#[test]
fn nvme_queue_survives_wraps_and_out_of_order_completions() {
    // 400 operations per depth (under Miri, scripts/miri.sh, 40, and not the ring of 64, whose
    // wraps take the most operations; each operation is ~0.1 s interpreted).
    let (ops, depths) = if cfg!(miri) { (40, 3) } else { (400, 4) };
    for (depth, seed) in [(2, 1), (4, 2), (8, 3), (64, 4)].into_iter().take(depths) {
        let mut rig = nvme_rig(depth, false);
        churn(&mut rig, ops, seed);
        let stats = rig.queue.stats();
        assert_eq!(stats.submitted, stats.completed);
    }
}

#[test]
fn nvme_queue_survives_the_counter_wrap() {
    let depth = 8;
    let mut rig = nvme_rig(depth, false);
    // Start the host's counters a few passes before 2^32, at slot 0 on an even pass (so the
    // first pass expects phase 1, as the device writes it over the zeroed CQ).
    let start = 0u32.wrapping_sub(4 * depth);
    let queue = &mut rig.queue;
    queue.sq.tail = super::super::submit::SqTail::at(start, 0);
    queue.sq.head = start;
    queue.sq.limit = start.wrapping_add(depth - 1);
    queue.cq.head = start;
    queue.cq.announced = start;
    churn(&mut rig, 200, 5);
    assert!(rig.queue.sq.tail.next() < start, "the counters wrapped");
}

#[test]
fn nvme_queue_rejects_an_impossible_sq_head_and_keeps_the_completion() {
    let depth = 8;
    let mut rig = nvme_rig(depth, false);
    for value in 0..3 {
        rig.queue.push(sqe(value), value).unwrap();
    }
    rig.queue.flush().unwrap();
    rig.device.fetch(3);
    // Slot 5 is past the announced tail (slot 3).
    assert!(rig.device.complete_with(0, 0, 5));
    let err = rig.queue.poll_one().unwrap_err();
    assert!(
        matches!(
            err,
            Error::CompletionSqHead {
                queue: 1,
                slot: 5,
                old: 0,
                tail: 3,
                depth: 8
            }
        ),
        "{err}"
    );
    // The command did complete: it is handed out next.
    assert_eq!(rig.queue.poll_one().unwrap().unwrap().payload, 0);
    // A slot past the ring.
    assert!(rig.device.complete_with(0, 0, 8));
    assert!(matches!(
        rig.queue.reap(8, |_| {}),
        Err(Error::CompletionSqHead { slot: 8, .. })
    ));
    assert_eq!(rig.queue.poll_one().unwrap().unwrap().payload, 1);
    assert!(rig.device.complete(0));
    assert_eq!(rig.queue.poll_one().unwrap().unwrap().payload, 2);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: waits on the MSI-X eventfd with poll(2), which Miri does not emulate"
)]
fn nvme_queue_waits_on_an_msix_eventfd() {
    let mut rig = nvme_rig(16, true);
    rig.queue.submit(sqe(5), 5).unwrap();
    let mut device = rig.device;
    let handle = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(device.fetch(16), 1);
        assert!(device.complete(0));
        device.interrupt();
        device
    });
    let done = rig.queue.wait(Some(Duration::from_secs(10))).unwrap();
    assert_eq!((done.payload, done.entry.dw0), (5, 15));
    rig.device = handle.join().unwrap();
    assert_eq!(rig.queue.stats().sleeps, 1, "slept on the interrupt");
    // The future works the same way.
    rig.queue.submit(sqe(6), 6).unwrap();
    rig.device.fetch(16);
    assert!(rig.device.complete(0));
    rig.device.interrupt();
    let done = futures::executor::block_on(rig.queue.next_completion()).unwrap();
    assert_eq!(done.payload, 6);
    let _ = rig.layout;
}

#[test]
fn slot_doorbells_with_the_crate_device_queue() {
    // The same doorbell format with the write-back SQ head: `DeviceQueue` decodes the slots.
    let space = SoftIommu::new(48).unwrap();
    let depth = 4;
    let layout = Layout::new::<Sqe, Status>(depth).unwrap();
    let mapping = mapped(&space, layout.size());
    let memory = Memory::from_mapping(mapping, 0, layout.size()).unwrap();
    let bar = Recording::new(Shared::new(64));
    let doorbells = Doorbells::new(Block::new(bar.clone()).erase(), 8, 12).unwrap();
    let config = Config::new(depth).with_doorbell(DoorbellValue::Slot);
    let mut queue: Queue<Sqe, Status, u32> =
        Queue::new(config, memory.clone(), doorbells.clone(), None).unwrap();
    assert!(!queue.sq_head_from_completions());
    let mut device = DeviceQueue::<Sqe, Status>::new(0, depth, memory, doorbells, None)
        .unwrap()
        .with_doorbell(DoorbellValue::Slot);
    let mut expect = 0;
    let mut next = 0;
    for _ in 0..50 {
        // Three fit, not four.
        while queue.push(sqe(next), next).is_ok() {
            next += 1;
        }
        assert_eq!(queue.in_flight(), 3);
        queue.flush().unwrap();
        assert_eq!(device.fetch().unwrap(), 3);
        while let Some(desc) = device.pop() {
            match device.complete(Status::new(desc.cid, 0, u64::from(desc.cdw10[0]))) {
                Ok(()) => {}
                Err(err) => panic!("{err}"),
            }
        }
        device.release();
        // The CQ holds at most depth - 1: three fit, a fourth is refused until the host reaps.
        assert_eq!(device.cq_room().unwrap(), 0);
        queue
            .reap(8, |done| {
                assert_eq!(done.payload, expect);
                assert_eq!(done.entry.result, u64::from(expect));
                expect += 1;
            })
            .unwrap();
        assert_eq!(device.cq_room().unwrap(), 3);
    }
    assert!(doorbell_writes(&bar, depth).len() >= 100);
    // A slot past the ring is the host's error.
    queue.doorbells().block().write::<u32>(8, 4).unwrap();
    assert!(matches!(
        device.fetch(),
        Err(Error::HostSqTail { tail: 4, .. })
    ));
}
