//! The queue pair against a reference model: the host `Queue` and a `DeviceQueue` (played by
//! this harness) take turns at submit / post / batch / flush / fetch / pop / pop burst / release
//! / complete (out of order, or with a bogus id, or held back for its cache line) / flush held
//! / poll / reap / zero-timeout wait / arm / disarm / drop, with counter or slot-valued
//! doorbells.
//! After every step the results, ids, payloads, errors and counts equal the model's; a payload
//! the device may still touch is never dropped unless the device was stopped first, and a queue
//! that cannot stop its device leaks instead.

#![no_main]

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::mmio::{Block, Shared};
use userdma::ring::{
    leaks, Config, DeviceQueue, DoorbellValue, Doorbells, Error, Layout, Memory, Queue, Quiesce,
    Rejected, Status, Submission, POSTED,
};
use userdma::zerocopy::{FromBytes, Immutable, IntoBytes};

#[derive(Debug, Arbitrary)]
struct Input {
    depth_log2: u8,
    /// Slot-valued doorbells (`DoorbellValue::Slot`, NVMe's format) instead of counters.
    slot_doorbells: bool,
    ops: Vec<Op>,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Push,
    PushBurst(u8),
    PostBurst(u8),
    Post,
    PostAndFlush,
    Batch(u8),
    Flush,
    Fetch,
    Pop(u8),
    PopBurst(u8),
    Release,
    Complete(u8),
    CompleteBogus(u8),
    /// `DeviceQueue::complete_held`: `more` says whether the device has more work at hand.
    CompleteHeld {
        pick: u8,
        more: bool,
    },
    FlushHeld,
    Interrupt,
    Poll,
    Reap(u8),
    WaitZero,
    Arm,
    Disarm,
    Drop {
        quiesce_ok: bool,
    },
}

/// An 8-byte descriptor carrying the payload's value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable)]
#[zerocopy(crate = "userdma::zerocopy")]
struct Desc {
    id: u16,
    pad: u16,
    value: u32,
}
impl Submission for Desc {
    fn command_id(&self) -> u16 {
        self.id
    }
    fn set_command_id(&mut self, id: u16) {
        self.id = id;
    }
}

/// What payload drops may see. A static, not an `Arc` in each payload: payloads a queue leaks on
/// purpose must own no heap memory, or the leak sanitizer would (rightly) report them.
#[derive(Debug)]
struct Watch {
    /// Values the device may still read or write (announced, not completed).
    device_may_touch: BTreeSet<u32>,
    /// The device was stopped by `Quiesce`.
    stopped: bool,
    dropped: u64,
}

static WATCH: Mutex<Watch> = Mutex::new(Watch {
    device_may_touch: BTreeSet::new(),
    stopped: false,
    dropped: 0,
});

fn watch() -> std::sync::MutexGuard<'static, Watch> {
    WATCH
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct Payload {
    value: u32,
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload({})", self.value)
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        let mut watch = watch();
        assert!(
            watch.stopped || !watch.device_may_touch.contains(&self.value),
            "payload {} dropped while the device may still touch it",
            self.value
        );
        watch.dropped += 1;
    }
}

struct FakeQuiesce {
    ok: bool,
}

impl Quiesce for FakeQuiesce {
    fn quiesce(&mut self, _queue: u16, _timeout: Duration) -> std::io::Result<()> {
        if self.ok {
            watch().stopped = true;
            Ok(())
        } else {
            Err(std::io::Error::other("stuck"))
        }
    }
}

/// A completion the model expects: a real one, or a bogus id.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cqe {
    Real { id: u16, value: u32 },
    Bogus { id: u16 },
}

/// The reference model of both sides.
#[derive(Debug, Default)]
struct Model {
    depth: u32,
    /// Slots kept empty in each ring (1 with slot doorbells: a slot cannot tell full from empty).
    reserve: u32,
    // Host.
    tail: u32,
    announced: u32,
    /// SQ tail doorbells rung.
    doorbells: u64,
    /// Posted descriptors queued (each takes an SQ slot).
    posted: u64,
    head_seen: u32,
    /// The SQ counter the host may write up to.
    limit: u64,
    free_ids: Vec<u16>,
    in_flight: HashSet<u16>,
    cq_head: u32,
    cq_announced: u32,
    armed: bool,
    /// SQ entries from the device's head to the tail: (id, value).
    sq: VecDeque<(u16, u32)>,
    // Device.
    dev_head: u32,
    dev_tail_seen: u32,
    released: u32,
    holding: Vec<(u16, u32)>,
    cq_tail: u32,
    dev_cq_head: u32,
    cq: VecDeque<Cqe>,
    /// Completions the device holds back, not written yet: (id, value).
    held: Vec<(u16, u32)>,
    next_value: u32,
}

impl Model {
    fn new(depth: u32, reserve: u32) -> Model {
        Model {
            depth,
            reserve,
            free_ids: (0..depth as u16).rev().collect(),
            limit: u64::from(depth - reserve),
            ..Model::default()
        }
    }

    /// The host's SQ room check, refreshing the head like the queue does.
    /// The host's SQ room: up to `limit`, recomputed from the device's written-back head only
    /// when there is none. While the device has entries left to read, the host does not write
    /// slots in the cache line (8 descriptors of 8 bytes) holding the device's head, when the
    /// ring spans at least two lines, and it always keeps `reserve` slots empty. Counted
    /// without wrapping (no test runs 2^32 entries).
    fn sq_room(&mut self) -> u32 {
        let room = |m: &Model| (m.limit.saturating_sub(u64::from(m.tail))) as u32;
        if room(self) > 0 {
            return room(self);
        }
        self.head_seen = self.released;
        let head = u64::from(self.head_seen);
        let busy = self.tail != self.head_seen;
        let slack = if self.depth >= 16 && busy {
            head % 8
        } else {
            0
        };
        self.limit = head + u64::from(self.depth) - slack.max(u64::from(self.reserve));
        room(self)
    }

    /// The poll announcement rule: after taking, ring when half the ring or the CQ is drained.
    fn poll_announce(&mut self) {
        let unannounced = self.cq_head.wrapping_sub(self.cq_announced);
        if unannounced > 0 && (unannounced >= self.depth / 2 || self.cq.is_empty()) {
            self.cq_announced = self.cq_head;
        }
    }

    /// CQ slots free past the device's written tail, its cached CQ head refreshed from the
    /// host's announcement when it says at most `needed` (as `DeviceQueue` does).
    fn dev_free(&mut self, needed: u32) -> u32 {
        let usable = self.depth - self.reserve;
        if usable - self.cq_tail.wrapping_sub(self.dev_cq_head) <= needed {
            self.dev_cq_head = self.cq_announced;
        }
        usable - self.cq_tail.wrapping_sub(self.dev_cq_head)
    }

    /// The device writes the completions it held: the SQ head written back first, then each
    /// in order; the device no longer touches their buffers.
    fn write_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        self.released = self.dev_head;
        for (id, value) in std::mem::take(&mut self.held) {
            self.cq_tail = self.cq_tail.wrapping_add(1);
            watch().device_may_touch.remove(&value);
            self.cq.push_back(Cqe::Real { id, value });
        }
    }

    /// Takes the CQ front like `take_cq`.
    fn take(&mut self) -> Option<Cqe> {
        let cqe = self.cq.pop_front()?;
        self.cq_head = self.cq_head.wrapping_add(1);
        if let Cqe::Real { id, .. } = cqe {
            assert!(self.in_flight.remove(&id));
            self.free_ids.push(id);
        }
        Some(cqe)
    }
}

type Host = Queue<Desc, Status, Payload>;

fn check_done(
    got: Result<Option<userdma::ring::Done<Status, Payload>>, Error>,
    expect: Option<Cqe>,
) {
    match (got, expect) {
        (Ok(None), None) => {}
        (Ok(Some(done)), Some(Cqe::Real { id, value })) => {
            assert_eq!(done.id, id);
            assert_eq!(done.payload.value, value);
            assert_eq!(done.entry.result, u64::from(value));
            assert_eq!(done.entry.command_id, id);
        }
        (Err(Error::UnknownCommand { id, .. }), Some(Cqe::Bogus { id: expect })) => {
            assert_eq!(id, expect)
        }
        (got, expect) => panic!("queue gave {got:?}, model expects {expect:?}"),
    }
}

fn run(input: Input) {
    let depth = 1u32 << (input.depth_log2 % 5 + 1);
    let layout = Layout::new::<Desc, Status>(depth).unwrap();
    let alloc_layout = std::alloc::Layout::from_size_align(layout.size(), 4096).unwrap();
    // SAFETY: the layout has a nonzero size.
    let raw = unsafe { std::alloc::alloc_zeroed(alloc_layout) };
    let ptr = std::ptr::NonNull::new(raw).expect("allocation");
    // SAFETY: `raw` is a fresh allocation of `layout.size()` bytes, page-aligned, freed below
    // only after the queue and the device view are gone; this harness is the only device and
    // touches it only through the ring's own handles; no reference to it is made. The IOVA is
    // fictitious: no hardware sees it.
    let memory = unsafe { Memory::from_raw(ptr, layout.size(), 0x10_0000) }.unwrap();
    let doorbells = Doorbells::new(Block::new(Shared::new(64)).erase(), 0, 32).unwrap();
    *watch() = Watch {
        device_may_touch: BTreeSet::new(),
        stopped: false,
        dropped: 0,
    };
    let doorbell = if input.slot_doorbells {
        DoorbellValue::Slot
    } else {
        DoorbellValue::Counter
    };
    let config = Config::new(depth).with_doorbell(doorbell);
    let mut queue: Option<Host> =
        Some(Queue::new(config, memory.clone(), doorbells.clone(), None).unwrap());
    let mut device = DeviceQueue::<Desc, Status>::new(0, depth, memory, doorbells, None)
        .unwrap()
        .with_doorbell(doorbell);
    let mut m = Model::new(depth, u32::from(input.slot_doorbells));
    let mut created = 0u64;
    let leaks_before = leaks();
    let mut expect_leaked = 0u64;

    for op in input.ops.into_iter().take(512) {
        let Some(q) = queue.as_mut() else { break };
        match op {
            Op::Push | Op::Batch(_) => {
                let count = match op {
                    Op::Batch(n) => usize::from(n % 8) + 1,
                    _ => 1,
                };
                for _ in 0..count {
                    let value = m.next_value;
                    m.next_value += 1;
                    created += 1;
                    let payload = Payload { value };
                    let desc = Desc {
                        value,
                        ..Desc::default()
                    };
                    let got = q.push(desc, payload);
                    let room = m.sq_room();
                    match got {
                        Ok(id) => {
                            assert!(room > 0);
                            assert_eq!(Some(id), m.free_ids.pop());
                            m.in_flight.insert(id);
                            m.sq.push_back((id, value));
                            m.tail = m.tail.wrapping_add(1);
                        }
                        Err(Rejected {
                            error: Error::Full { .. },
                            payload,
                            ..
                        }) => {
                            assert_eq!(room, 0);
                            assert_eq!(payload.value, value);
                        }
                        Err(Rejected {
                            error: Error::NoCommandId { .. },
                            ..
                        }) => {
                            assert!(room > 0 && m.free_ids.is_empty());
                        }
                        Err(rejected) => panic!("{}", rejected.error),
                    }
                }
                if matches!(op, Op::Batch(_)) {
                    q.flush().unwrap();
                    flush_model(&mut m);
                }
            }
            Op::PushBurst(n) => {
                let n = u32::from(n % 40);
                let first = m.next_value;
                let mut items = (first..first + n).map(|value| {
                    (
                        Desc {
                            value,
                            ..Desc::default()
                        },
                        Payload { value },
                    )
                });
                let got = q.push_burst(&mut items).unwrap();
                let room = m.sq_room();
                let expect = room.min(m.free_ids.len() as u32).min(n);
                assert_eq!(got, expect, "room {room}, ids {}", m.free_ids.len());
                // The items not taken are still in the iterator (dropped here, never queued).
                assert_eq!(
                    items.next().map(|(d, _)| d.value),
                    (got < n).then_some(first + got)
                );
                drop(items);
                for value in first..first + got {
                    let id = m.free_ids.pop().expect("an id");
                    m.in_flight.insert(id);
                    m.sq.push_back((id, value));
                    m.tail = m.tail.wrapping_add(1);
                }
                // Payloads are made lazily: the ones queued, and the one the check above took.
                created += u64::from(got) + u64::from(got < n);
                m.next_value += n;
            }
            Op::PostBurst(n) => {
                let n = u32::from(n % 40);
                let first = m.next_value;
                let mut descs = (first..first + n).map(|value| Desc {
                    value,
                    ..Desc::default()
                });
                // SAFETY: the descriptors name no host memory.
                let got = unsafe { q.post_burst(&mut descs) }.unwrap();
                let room = m.sq_room();
                assert_eq!(got, room.min(n));
                // What was not queued is still in the iterator.
                assert_eq!(
                    descs.next().map(|d| d.value),
                    (got < n).then_some(first + got)
                );
                for value in first..first + got {
                    m.sq.push_back((POSTED, value));
                    m.tail = m.tail.wrapping_add(1);
                }
                m.posted += u64::from(got);
                m.next_value += n;
            }
            Op::Post | Op::PostAndFlush => {
                let value = m.next_value;
                m.next_value += 1;
                let desc = Desc {
                    value,
                    ..Desc::default()
                };
                let and_flush = matches!(op, Op::PostAndFlush);
                let got = if and_flush {
                    // SAFETY: the descriptor names no host memory.
                    unsafe { q.post_and_flush(desc) }
                } else {
                    // SAFETY: as above.
                    unsafe { q.post(desc) }.map_err(|rejected| rejected.error)
                };
                let room = m.sq_room();
                match got {
                    Ok(()) => {
                        assert!(room > 0);
                        m.sq.push_back((POSTED, value));
                        m.tail = m.tail.wrapping_add(1);
                        m.posted += 1;
                        // post_and_flush announces it with everything queued before.
                        if and_flush {
                            flush_model(&mut m);
                        }
                    }
                    // Nothing queued (and nothing rung).
                    Err(Error::Full { .. }) => assert_eq!(room, 0),
                    Err(error) => panic!("{error}"),
                }
            }
            Op::Flush => {
                q.flush().unwrap();
                flush_model(&mut m);
            }
            Op::Fetch => {
                let available = device.fetch().unwrap();
                m.dev_tail_seen = m.announced;
                assert_eq!(available, m.dev_tail_seen.wrapping_sub(m.dev_head));
            }
            Op::Pop(n) => {
                for _ in 0..n % 8 {
                    let got = device.pop();
                    if m.dev_head == m.dev_tail_seen {
                        assert!(got.is_none());
                        break;
                    }
                    let desc = got.expect("an announced entry");
                    let (id, value) = m.sq.pop_front().expect("model entry");
                    assert_eq!((desc.id, desc.value), (id, value));
                    m.dev_head = m.dev_head.wrapping_add(1);
                    if id != POSTED {
                        m.holding.push((id, value));
                    }
                }
            }
            Op::PopBurst(n) => {
                let max = u32::from(n % 8);
                let mut got = Vec::new();
                let count = device.pop_burst(max, |desc| got.push(desc));
                assert_eq!(count as usize, got.len());
                let expect = m.dev_tail_seen.wrapping_sub(m.dev_head).min(max);
                assert_eq!(count, expect, "pop_burst takes what was fetched, up to max");
                for desc in got {
                    let (id, value) = m.sq.pop_front().expect("model entry");
                    assert_eq!((desc.id, desc.value), (id, value));
                    m.dev_head = m.dev_head.wrapping_add(1);
                    if id != POSTED {
                        m.holding.push((id, value));
                    }
                }
            }
            Op::Release => {
                device.release();
                m.released = m.dev_head;
            }
            Op::Complete(pick) | Op::CompleteBogus(pick) => {
                let bogus = matches!(op, Op::CompleteBogus(_));
                if !bogus && m.holding.is_empty() {
                    continue;
                }
                let (id, value) = if bogus {
                    (depth as u16 + u16::from(pick), 0)
                } else {
                    m.holding[usize::from(pick) % m.holding.len()]
                };
                // `complete` writes what is held first (which had room when it was held).
                if !m.held.is_empty() {
                    let held = m.held.len() as u32;
                    assert!(m.dev_free(held - 1) >= held);
                    m.write_held();
                }
                let got = device.complete(Status::new(id, 0, u64::from(value)));
                let usable = m.depth - m.reserve;
                if m.cq_tail.wrapping_sub(m.dev_cq_head) >= usable {
                    m.dev_cq_head = m.cq_announced;
                }
                if m.cq_tail.wrapping_sub(m.dev_cq_head) >= usable {
                    assert!(matches!(got, Err(Error::CqFull { .. })), "{got:?}");
                    continue;
                }
                got.unwrap();
                // The device writes its SQ head back before each completion it writes.
                m.released = m.dev_head;
                m.cq_tail = m.cq_tail.wrapping_add(1);
                if bogus {
                    m.cq.push_back(Cqe::Bogus { id });
                } else {
                    m.holding.retain(|&(h, _)| h != id);
                    watch().device_may_touch.remove(&value);
                    m.cq.push_back(Cqe::Real { id, value });
                }
            }
            Op::CompleteHeld { pick, more } => {
                if m.holding.is_empty() {
                    continue;
                }
                let (id, value) = m.holding[usize::from(pick) % m.holding.len()];
                let got = device.complete_held(Status::new(id, 0, u64::from(value)), more);
                let held = m.held.len() as u32;
                if m.dev_free(held) <= held {
                    assert!(matches!(got, Err(Error::CqFull { .. })), "{got:?}");
                    continue;
                }
                m.holding.retain(|&(h, _)| h != id);
                m.held.push((id, value));
                // 16-byte completions from a CQ on a 128-byte boundary: the 4th of each group
                // of four slots ends a 64-byte line. At most three are held.
                let slot = m.cq_tail.wrapping_add(held) % m.depth;
                if more && slot % 4 != 3 && m.held.len() < 4 {
                    assert_eq!(got.unwrap(), 0, "held");
                } else {
                    assert_eq!(got.unwrap(), m.held.len(), "the held ones written");
                    m.write_held();
                }
            }
            Op::FlushHeld => {
                assert_eq!(device.flush_held().unwrap(), m.held.len());
                m.write_held();
            }
            Op::Interrupt => assert_eq!(device.interrupt().unwrap(), m.armed),
            Op::Poll => {
                let got = q.poll_one();
                let expect = m.take();
                m.poll_announce();
                check_done(got, expect);
            }
            Op::Reap(max) => {
                let max = usize::from(max % 8);
                let mut got = Vec::new();
                let result = q.reap(max, |done| got.push((done.id, done.payload.value)));
                let mut expect = Vec::new();
                let mut error = None;
                while expect.len() < max {
                    match m.take() {
                        Some(Cqe::Real { id, value }) => expect.push((id, value)),
                        Some(Cqe::Bogus { id }) => {
                            error = Some(id);
                            break;
                        }
                        None => break,
                    }
                }
                m.cq_announced = m.cq_head;
                assert_eq!(got, expect);
                match (result, error) {
                    (Ok(n), None) => assert_eq!(n, expect.len()),
                    (Err(Error::UnknownCommand { id, .. }), Some(bogus)) => assert_eq!(id, bogus),
                    (result, error) => panic!("reap gave {result:?}, model expects {error:?}"),
                }
            }
            Op::WaitZero => {
                let got = q.wait(Some(Duration::ZERO));
                match m.take() {
                    None => {
                        m.cq_announced = m.cq_head;
                        assert!(matches!(got, Err(Error::Timeout { .. })), "{got:?}");
                    }
                    some => {
                        m.poll_announce();
                        check_done(got.map(Some), some);
                    }
                }
            }
            Op::Arm => {
                assert_eq!(q.arm_interrupt().unwrap(), !m.cq.is_empty());
                m.armed = true;
            }
            Op::Disarm => {
                q.disarm_interrupt();
                m.armed = false;
            }
            Op::Drop { quiesce_ok } => {
                q.set_quiesce(FakeQuiesce { ok: quiesce_ok });
                let touching = watch().device_may_touch.len() as u64;
                // Collected on drop: completed but not reaped, up to a bogus entry.
                let mut in_flight = m.in_flight.len() as u64;
                let unannounced =
                    m.sq.iter()
                        .rev()
                        .take(m.tail.wrapping_sub(m.announced) as usize);
                in_flight -= unannounced.filter(|(id, _)| *id != POSTED).count() as u64;
                while let Some(Cqe::Real { .. }) = m.cq.front() {
                    m.take();
                    in_flight -= 1;
                }
                let quiet = in_flight == 0 && m.released == m.announced;
                queue = None;
                if !quiet && !quiesce_ok {
                    expect_leaked = in_flight;
                }
                // Nothing the device may touch was dropped unless it was stopped: the payloads'
                // own Drop checks that; count the ones it had to keep.
                let kept = watch().device_may_touch.len() as u64;
                assert!(kept <= touching);
            }
        }
        if let Some(q) = queue.as_ref() {
            assert_eq!(q.in_flight(), m.in_flight.len());
            assert_eq!(q.unflushed(), m.tail.wrapping_sub(m.announced));
            let stats = q.stats();
            assert_eq!(
                stats.sq_doorbells, m.doorbells,
                "one doorbell per flush with news"
            );
            assert_eq!(stats.posted, m.posted);
        }
    }
    let had_queue = queue.is_some();
    if had_queue {
        queue
            .as_mut()
            .unwrap()
            .set_quiesce(FakeQuiesce { ok: true });
    }
    drop(queue);
    drop(device);
    let leaked = leaks().payloads - leaks_before.payloads;
    assert_eq!(leaked, expect_leaked, "leaked payloads");
    assert_eq!(
        watch().dropped + leaked,
        created,
        "every payload dropped or leaked"
    );
    // SAFETY: allocated above with this layout; the queue and the device view are gone, and the
    // harness (the only device) no longer touches the memory.
    unsafe { std::alloc::dealloc(raw, alloc_layout) };
}

/// The host rang the doorbell: everything queued is now the device's to touch.
fn flush_model(m: &mut Model) {
    let new = m.tail.wrapping_sub(m.announced) as usize;
    if new > 0 {
        m.doorbells += 1;
    }
    let mut watch = watch();
    for &(id, value) in m.sq.iter().rev().take(new) {
        if id != POSTED {
            watch.device_may_touch.insert(value);
        }
    }
    m.announced = m.tail;
}

fuzz_target!(|input: Input| run(input));
