//! An in-order queue (`Config::with_in_order`) against a misbehaving device and a model: the
//! harness plays the device, serving the SQ in order and, when told, dropping a completion,
//! writing one twice, naming a wrong command id or stalling; the host submits, polls, waits
//! briefly and recovers (the device stopped, the queue shut down at once, a new queue pair).
//! After every step: no payload is handed out twice; none is handed out before the device
//! finished its command; every completion handed out is the oldest command's; every protocol
//! fault the device wrote is reported before anything after it is handed out, and the queue
//! then refuses work; a stall is a timeout naming the oldest command, unread; a recovery hands
//! every payload in flight back exactly once.

#![no_main]

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::mmio::{Block, Shared};
use userdma::ring::{
    Command, Config, DeviceQueue, Doorbells, Error, Layout, Memory, Queue, Quiesce, Status,
};

#[derive(Debug, Arbitrary)]
struct Input {
    depth_log2: u8,
    ops: Vec<Op>,
}

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Fault {
    Drop,
    Twice,
    WrongId(u16),
    Stall,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Submit(u8),
    Flush,
    Inject(Fault),
    Serve(u8),
    Poll,
    WaitShort,
    Recover,
}

/// The device's stop: always succeeds (the harness's device simply stops serving).
struct Stop;

impl Quiesce for Stop {
    fn quiesce(&mut self, _queue: u16, _timeout: Duration) -> std::io::Result<()> {
        Ok(())
    }
}

/// Ring memory, freed when dropped: after every queue and device view of it (the run declares
/// its rings before its queues, so they drop last; a queue here never leaks its memory, its
/// stop always succeeds).
struct Ring {
    ptr: std::ptr::NonNull<u8>,
    alloc: std::alloc::Layout,
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: allocated in `pair` with this layout; nothing uses it any more (above).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.alloc) };
    }
}

/// A queue pair on fresh ring memory, which `rings` keeps.
fn pair(
    depth: u32,
    rings: &mut Vec<Ring>,
) -> (Queue<Command, Status, u64>, DeviceQueue<Command, Status>) {
    let layout = Layout::new::<Command, Status>(depth).unwrap();
    let alloc = std::alloc::Layout::from_size_align(layout.size(), 4096).unwrap();
    // SAFETY: the layout has a nonzero size.
    let raw = unsafe { std::alloc::alloc_zeroed(alloc) };
    let ptr = std::ptr::NonNull::new(raw).expect("allocation");
    rings.push(Ring { ptr, alloc });
    // SAFETY: `raw` is a fresh allocation of `layout.size()` bytes, page-aligned, freed only
    // after the queue and the device view are gone (`Ring`); this harness is the only device
    // and touches it only through the ring's handles; no reference to it is made. The IOVA is
    // fictitious: no hardware sees it.
    let memory = unsafe { Memory::from_raw(ptr, layout.size(), 0x10_0000) }.unwrap();
    let doorbells = Doorbells::new(Block::new(Shared::new(64)).erase(), 0, 32).unwrap();
    let config = Config::new(depth).with_in_order(true);
    let mut queue = Queue::new(config, memory.clone(), doorbells.clone(), None).unwrap();
    queue.set_quiesce(Stop);
    let device = DeviceQueue::new(0, depth, memory, doorbells, None).unwrap();
    (queue, device)
}

/// What the model knows.
#[derive(Debug, Default)]
struct Model {
    /// Payloads in flight in submission order, with their command ids.
    in_flight: VecDeque<(u16, u64)>,
    /// Payloads the device has finished (executed).
    finished: BTreeSet<u64>,
    /// Payloads the device has read from the SQ (and released the slot of).
    popped: BTreeSet<u64>,
    /// Payloads handed back, by any path.
    handed: BTreeSet<u64>,
    /// The next device command gets this fault.
    fault: Option<Fault>,
    /// The device stalls (serves nothing more until a recovery).
    stalled: bool,
    /// The CQ entries the device wrote and the host has not taken, oldest first: whether the
    /// host may accept each (false: a duplicate, a wrong id, or any entry after a dropped or
    /// misnamed completion, which is out of order for the host).
    cq: VecDeque<bool>,
    /// A completion was dropped or misnamed: every later entry is out of order.
    out_of_order: bool,
    /// The host reported a protocol fault.
    faulted: bool,
    next_value: u64,
}

fn run(input: Input) {
    let depth = 1u32 << (input.depth_log2 % 5 + 1);
    let mut rings = Vec::new();
    let (mut queue, mut device) = pair(depth, &mut rings);
    let mut m = Model::default();
    for op in input.ops.into_iter().take(256) {
        match op {
            Op::Submit(n) => {
                for _ in 0..(n % 8) + 1 {
                    let value = m.next_value;
                    let desc = Command {
                        opcode: 1,
                        src: value,
                        ..Command::default()
                    };
                    match queue.push(desc, value) {
                        Ok(id) => {
                            assert!(!m.faulted, "a faulted queue took a submission");
                            m.next_value += 1;
                            m.in_flight.push_back((id, value));
                        }
                        Err(rejected) => {
                            assert_eq!(rejected.payload, value);
                            match rejected.error {
                                Error::Faulted { .. } => assert!(m.faulted),
                                Error::Full { .. } | Error::NoCommandId { .. } => {}
                                other => panic!("submission refused: {other}"),
                            }
                            break;
                        }
                    }
                }
            }
            Op::Flush => {
                let _ = queue.flush();
            }
            Op::Inject(fault) => m.fault = Some(fault),
            Op::Serve(n) => serve(&mut device, &mut m, u32::from(n % 8) + 1, depth),
            Op::Poll => match queue.poll_one() {
                Ok(Some(done)) => handed_out(&mut m, done.id, done.payload),
                Ok(None) => {
                    assert!(!m.faulted);
                    assert!(m.cq.is_empty(), "a written completion was not seen");
                }
                Err(error) => reported(&mut m, &error),
            },
            Op::WaitShort => match queue.wait(Some(Duration::ZERO)) {
                Ok(done) => handed_out(&mut m, done.id, done.payload),
                Err(timeout @ Error::Timeout { .. }) if !m.faulted => {
                    assert!(m.cq.is_empty(), "a written completion was not seen");
                    match queue.explain(timeout) {
                        Error::Stalled { id, read, .. } => {
                            let &(oldest, value) = m.in_flight.front().expect("in flight");
                            assert_eq!(id, oldest, "the stall names the oldest command");
                            // Read: its completion was dropped; unread: stalled or not
                            // served yet.
                            assert_eq!(read, m.popped.contains(&value));
                        }
                        Error::Timeout { in_flight, .. } => assert_eq!(in_flight, 0),
                        other => panic!("{other}"),
                    }
                }
                Err(error) => reported(&mut m, &error),
            },
            Op::Recover => {
                // The device stops (a reset): it touches nothing more.
                let fresh = pair(depth, &mut rings);
                let old = std::mem::replace(&mut queue, fresh.0);
                device = fresh.1;
                let shutdown = old.shutdown(Duration::ZERO).expect("shutdown after a stop");
                for done in shutdown.completed {
                    handed_out(&mut m, done.id, done.payload);
                }
                for (_, value) in shutdown.aborted {
                    assert!(m.handed.insert(value), "payload {value} handed back twice");
                    m.in_flight.retain(|&(_, v)| v != value);
                }
                assert!(
                    m.in_flight.is_empty(),
                    "{:?} never handed back",
                    m.in_flight
                );
                m = Model {
                    handed: std::mem::take(&mut m.handed),
                    finished: std::mem::take(&mut m.finished),
                    popped: std::mem::take(&mut m.popped),
                    next_value: m.next_value,
                    ..Model::default()
                };
            }
        }
    }
}

/// The harness's device serves up to `n` descriptors in order, with the injected fault.
fn serve(device: &mut DeviceQueue<Command, Status>, m: &mut Model, n: u32, depth: u32) {
    if m.stalled || device.fetch().is_err() {
        return;
    }
    for _ in 0..n {
        let room = device.cq_room().unwrap_or(0);
        if room == 0 {
            break;
        }
        let fault = m.fault;
        if matches!(fault, Some(Fault::Stall)) && device.available() > 0 {
            m.fault = None;
            m.stalled = true;
            break;
        }
        if matches!(fault, Some(Fault::Twice)) && room < 2 {
            break;
        }
        let Some(command) = device.pop() else { break };
        m.fault = None;
        m.finished.insert(command.src);
        m.popped.insert(command.src);
        let id = command.command_id;
        let mut write = |m: &mut Model, id: u16, good: bool| {
            device.complete(Status::new(id, 0, 0)).unwrap();
            m.cq.push_back(good && !m.out_of_order);
        };
        match fault {
            None | Some(Fault::Stall) => write(m, id, true),
            Some(Fault::Drop) => m.out_of_order = true,
            Some(Fault::Twice) => {
                write(m, id, true);
                write(m, id, false);
            }
            Some(Fault::WrongId(other)) => {
                // Any id but its own: another in flight, or none. Nor the id the host expects
                // for the entry after those written so far, when those are all good: that
                // differs from this command's own only when the expected command's completion
                // was dropped, and a completion under its id cannot be told from its own (the
                // host rightly takes it; what is lost is this command's completion, the Drop
                // case).
                let span = 2 * depth as u16;
                let expected = if m.cq.iter().all(|&good| good) {
                    m.in_flight.get(m.cq.len()).map(|&(expected, _)| expected)
                } else {
                    None
                };
                let mut other = other % span;
                while other == id || Some(other) == expected {
                    other = (other + 1) % span;
                }
                write(m, other, false);
                m.out_of_order = true;
            }
        }
    }
    device.release();
}

/// The host handed out `value` under command `id`.
fn handed_out(m: &mut Model, id: u16, value: u64) {
    assert_eq!(
        m.cq.pop_front(),
        Some(true),
        "handed out a completion the host cannot trust"
    );
    assert!(m.handed.insert(value), "payload {value} handed out twice");
    assert!(
        m.finished.contains(&value),
        "payload {value} handed out before the device finished it"
    );
    assert_eq!(m.in_flight.pop_front(), Some((id, value)), "not the oldest");
}

/// The host reported `error`.
fn reported(m: &mut Model, error: &Error) {
    match error {
        Error::LostCompletion { .. }
        | Error::DuplicateCompletion { .. }
        | Error::WrongCommand { .. } => {
            assert_eq!(
                m.cq.pop_front(),
                Some(false),
                "a good completion refused: {error}"
            );
            assert!(!m.faulted);
            m.faulted = true;
        }
        Error::Faulted { .. } => assert!(m.faulted),
        other => panic!("unexpected error: {other}"),
    }
}

fuzz_target!(|input: Input| run(input));
