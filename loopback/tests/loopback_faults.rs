//! Fault injection in the loopback device, one kind per test: the host detects the fault (the
//! error names the queue and the command ids), never hands out a payload the device may still
//! own, leaks nothing, the bytes outside the transferred ranges stay as they were, and after
//! recovery (reset, shutdown, a new queue) the device moves data again, checked byte for byte.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::Device;
use userdma::dma::{DeviceOffset, Mapping};
use userdma::memory::PageSize;
use userdma::ring::{self, Error};
use userdma_loopback::fault::{Counts, Injection, Kind};
use userdma_loopback::{
    Config, Cost, Descriptor, Loopback, LoopbackStatus, Queue, StatusCode, Wait,
};

#[path = "common/device_process.rs"]
mod device_process;

/// Round trips per test.
const TRANSFERS: usize = 4;
/// Each transfer's length and its offset in its slot.
const LEN: usize = 100;
const OFFSET: usize = 10;
/// Bytes of a slot.
const SLOT: usize = 256;
const CANARY: u8 = 0xa5;
const TIMEOUT: Duration = Duration::from_secs(5);

/// A payload: which transfer, which half.
type Token = (usize, bool);

struct Rig {
    device: Arc<Loopback>,
    /// Source slots, then destination slots.
    host: Mapping,
    queue: Option<Queue<Token>>,
    /// Payloads submitted and not handed back.
    outstanding: BTreeSet<Token>,
    leaks: ring::Leaks,
}

fn rig_with(config: Config) -> Rig {
    let device = Arc::new(Loopback::new(config.cost(Cost::zero()).queues(2)).expect("device"));
    let host = userdma::runtime::map_memory(
        device.dma_space().as_ref(),
        2 * TRANSFERS * SLOT,
        PageSize::Base,
    )
    .expect("host memory");
    host.slice().fill(CANARY);
    let mut rig = Rig {
        device,
        host,
        queue: None,
        outstanding: BTreeSet::new(),
        leaks: ring::leaks(),
    };
    rig.queue = Some(rig.open());
    rig
}

fn rig() -> Rig {
    rig_with(Config::default())
}

impl Rig {
    fn open(&self) -> Queue<Token> {
        let queue = self
            .device
            .open_queue(ring::Config::new(64), Wait::Interrupt)
            .expect("queue");
        assert!(queue.in_order(), "loopback queues check completion order");
        queue
    }

    fn queue(&mut self) -> &mut Queue<Token> {
        self.queue.as_mut().expect("open")
    }

    fn src(i: usize) -> usize {
        i * SLOT
    }

    fn dst(i: usize) -> usize {
        (TRANSFERS + i) * SLOT
    }

    fn pattern(i: usize, round: u8) -> Vec<u8> {
        (0..LEN)
            .map(|j| (j as u8).wrapping_mul(7) ^ (i as u8) ^ round)
            .collect()
    }

    /// Writes the sources, fills the destinations with canaries and submits `TRANSFERS`
    /// round trips (ToDevice then ToHost each), one doorbell; returns the command ids in
    /// submission order.
    fn submit(&mut self, round: u8) -> Vec<u16> {
        let slice = self.host.slice();
        let mut ids = Vec::new();
        for i in 0..TRANSFERS {
            slice
                .write_from(Rig::src(i) + OFFSET, &Rig::pattern(i, round))
                .unwrap();
            slice.write_from(Rig::dst(i), &[CANARY; SLOT]).unwrap();
        }
        for i in 0..TRANSFERS {
            let at = DeviceOffset((i * SLOT) as u64);
            let src = self.host.iova(Rig::src(i) + OFFSET).unwrap();
            let dst = self.host.iova(Rig::dst(i) + OFFSET).unwrap();
            let to_device = Descriptor::to_device(src, at, LEN as u64).build();
            let to_host = Descriptor::to_host(at, dst, LEN as u64).build();
            let queue = self.queue.as_mut().unwrap();
            ids.push(queue.push(to_device, (i, false)).unwrap());
            ids.push(queue.push(to_host, (i, true)).unwrap());
            self.outstanding.insert((i, false));
            self.outstanding.insert((i, true));
        }
        self.queue().flush().unwrap();
        ids
    }

    /// Takes the next completion.
    fn wait(&mut self) -> Result<ring::Done<ring::Status, Token>, Error> {
        let done = self.queue().wait(Some(TIMEOUT))?;
        assert!(self.outstanding.remove(&done.payload), "handed out twice");
        Ok(done)
    }

    /// Takes every completion of a burst that needed no recovery.
    fn drain(&mut self) -> Vec<ring::Done<ring::Status, Token>> {
        (0..2 * TRANSFERS)
            .map(|_| self.wait().expect("a completion"))
            .collect()
    }

    /// Reset, shutdown, new queue: every payload back, nothing leaked.
    fn recover(&mut self) {
        let queue = self.queue.take().expect("open");
        // `recover` shuts down with a zero timeout: it cannot wait for the device, so what is
        // checked is that every payload comes back and nothing leaks (timing it only measured
        // the reset, which under ThreadSanitizer on a loaded machine took over a second).
        let shutdown = self.device.recover(queue).expect("recovered");
        for done in shutdown.completed {
            assert!(self.outstanding.remove(&done.payload), "handed out twice");
        }
        for (_, token) in shutdown.aborted {
            assert!(self.outstanding.remove(&token), "handed out twice");
        }
        self.check_no_leak();
        self.queue = Some(self.open());
    }

    fn check_no_leak(&self) {
        assert!(
            self.outstanding.is_empty(),
            "{:?} not handed back",
            self.outstanding
        );
        assert_eq!(ring::leaks(), self.leaks, "the ring leaked");
    }

    /// The bytes outside every transferred range are still the canary.
    fn check_canaries(&self) {
        let slice = self.host.slice();
        for i in 0..TRANSFERS {
            let mut dst = [0u8; SLOT];
            slice.read_into(Rig::dst(i), &mut dst).unwrap();
            for (j, &b) in dst.iter().enumerate() {
                if !(OFFSET..OFFSET + LEN).contains(&j) {
                    assert_eq!(b, CANARY, "slot {i} byte {j} outside the transfer");
                }
            }
        }
    }

    /// A clean burst, every byte checked: the device works.
    fn check_usable(&mut self) {
        self.submit(0x3c);
        for done in self.drain() {
            assert!(done.entry.is_success(), "{:?}", done.entry);
        }
        let slice = self.host.slice();
        for i in 0..TRANSFERS {
            let mut dst = vec![0u8; LEN];
            slice.read_into(Rig::dst(i) + OFFSET, &mut dst).unwrap();
            assert_eq!(dst, Rig::pattern(i, 0x3c), "transfer {i}");
        }
        self.check_canaries();
        self.check_no_leak();
    }

    fn injected(&self) -> Counts {
        self.device.injected().unwrap().queues[0]
    }

    /// The fault's aftermath common to the protocol faults: the queue refuses work, recovery
    /// gives everything back, the device works again.
    fn after_protocol_fault(&mut self, kind: Kind) {
        assert!(self.queue().is_faulted());
        let refused = self
            .queue()
            .push(Descriptor::nop().build(), (99, false))
            .unwrap_err();
        assert!(
            matches!(refused.error, Error::Faulted { queue: 0 }),
            "{}",
            refused.error
        );
        assert!(matches!(
            self.queue().poll_one(),
            Err(Error::Faulted { queue: 0 })
        ));
        self.recover();
        self.check_canaries();
        assert_eq!(self.injected().get(kind), 1);
        assert_eq!(self.injected().total(), 1);
        self.check_usable();
    }
}

#[test]
fn a_stall_times_out_naming_the_oldest_command_and_the_device_recovers() {
    let mut rig = rig();
    rig.device
        .inject(0, &Injection::next(Kind::Stall, 1))
        .unwrap();
    let ids = rig.submit(1);
    let timeout = rig
        .queue()
        .wait(Some(Duration::from_millis(50)))
        .unwrap_err();
    assert!(matches!(timeout, Error::Timeout { queue: 0, .. }));
    let error = rig.queue().explain(timeout);
    match &error {
        Error::Stalled {
            queue: 0,
            id,
            read: false,
            in_flight,
            ..
        } => {
            assert_eq!(*id, ids[0]);
            assert_eq!(*in_flight, 2 * TRANSFERS);
        }
        other => panic!("{other}"),
    }
    let message = error.to_string();
    assert!(
        message.contains("queue 0") && message.contains(&format!("command id {}", ids[0])),
        "{message}"
    );
    rig.recover();
    rig.check_canaries();
    assert_eq!(rig.injected().stall, 1);
    rig.check_usable();
}

#[test]
fn a_dropped_completion_is_seen_when_the_next_command_completes_first() {
    let mut rig = rig();
    rig.device
        .inject(0, &Injection::next(Kind::DropCompletion, 1))
        .unwrap();
    let ids = rig.submit(2);
    let error = rig.wait().unwrap_err();
    match &error {
        Error::LostCompletion {
            queue: 0,
            expected,
            got,
        } => assert_eq!((*expected, *got), (ids[0], ids[1])),
        other => panic!("{other}"),
    }
    let message = error.to_string();
    assert!(message.contains("queue 0"), "{message}");
    assert!(
        message.contains(&format!("command id {}", ids[1])),
        "{message}"
    );
    assert!(message.contains(&format!("id {}", ids[0])), "{message}");
    // Nothing was handed out: the second command's payload stays with the queue.
    assert_eq!(rig.outstanding.len(), 2 * TRANSFERS);
    rig.after_protocol_fault(Kind::DropCompletion);
}

#[test]
fn a_dropped_last_completion_times_out_with_the_command_read() {
    let mut rig = rig();
    rig.device
        .inject(0, &Injection::next(Kind::DropCompletion, 1))
        .unwrap();
    // One command alone: with its completion dropped nothing arrives.
    let id = rig.submit_one();
    let timeout = rig
        .queue()
        .wait(Some(Duration::from_millis(50)))
        .unwrap_err();
    match rig.queue().explain(timeout) {
        Error::Stalled {
            queue: 0,
            id: named,
            read: true,
            ..
        } => assert_eq!(named, id),
        other => panic!("{other}"),
    }
    rig.recover();
    rig.check_canaries();
    assert_eq!(rig.injected().drop_completion, 1);
    rig.check_usable();
}

impl Rig {
    /// One ToDevice of transfer 0, submitted alone.
    fn submit_one(&mut self) -> u16 {
        let src = self.host.iova(Rig::src(0) + OFFSET).unwrap();
        let desc = Descriptor::to_device(src, DeviceOffset(0), LEN as u64).build();
        let id = self.queue().submit(desc, (0, false)).unwrap();
        self.outstanding.insert((0, false));
        id
    }
}

#[test]
fn a_duplicate_completion_is_refused_and_hands_nothing_out() {
    let mut rig = rig();
    rig.device
        .inject(0, &Injection::next(Kind::CompleteTwice, 1))
        .unwrap();
    let ids = rig.submit(4);
    let first = rig.wait().unwrap();
    assert_eq!(first.id, ids[0]);
    let error = rig.wait().unwrap_err();
    match &error {
        Error::DuplicateCompletion {
            queue: 0,
            expected,
            got,
        } => assert_eq!((*expected, *got), (Some(ids[1]), ids[0])),
        other => panic!("{other}"),
    }
    assert!(error
        .to_string()
        .contains(&format!("command id {}", ids[0])));
    assert_eq!(rig.outstanding.len(), 2 * TRANSFERS - 1);
    rig.after_protocol_fault(Kind::CompleteTwice);
}

#[test]
fn a_duplicate_after_the_host_submitted_again_is_still_refused() {
    // The duplicate is read after the host took the original and submitted a new command:
    // with ids reused newest-freed first, the new command would have the duplicate's id and
    // be handed back before the device has run it. Reused oldest-freed first, the new
    // command has another id, and the duplicate is refused.
    let mut rig = rig();
    rig.device
        .inject(0, &Injection::next(Kind::CompleteTwice, 1))
        .unwrap();
    let first = rig.submit_one();
    assert_eq!(rig.wait().unwrap().id, first);
    let src = rig.host.iova(Rig::src(1) + OFFSET).unwrap();
    let desc = Descriptor::to_device(src, DeviceOffset(SLOT as u64), LEN as u64).build();
    let second = rig.queue().submit(desc, (1, false)).unwrap();
    rig.outstanding.insert((1, false));
    assert_ne!(second, first, "a freed id comes back last");
    let error = rig.wait().unwrap_err();
    match &error {
        Error::DuplicateCompletion {
            queue: 0,
            expected,
            got,
        } => assert_eq!((*expected, *got), (Some(second), first)),
        other => panic!("{other}"),
    }
    rig.after_protocol_fault(Kind::CompleteTwice);
}

#[test]
fn a_completion_with_a_wrong_id_is_refused_and_hands_nothing_out() {
    let mut rig = rig();
    rig.device
        .inject(0, &Injection::next(Kind::WrongId, 1))
        .unwrap();
    let ids = rig.submit(6);
    let error = rig.wait().unwrap_err();
    match &error {
        Error::WrongCommand {
            queue: 0,
            expected,
            got,
        } => {
            // The newest command in flight: handing its buffer out would have let the
            // device write a buffer the host reuses.
            assert_eq!((*expected, *got), (Some(ids[0]), *ids.last().unwrap()));
        }
        other => panic!("{other}"),
    }
    let message = error.to_string();
    assert!(
        message.contains("queue 0") && message.contains(&format!("command id {}", ids[7])),
        "{message}"
    );
    assert_eq!(rig.outstanding.len(), 2 * TRANSFERS);
    rig.after_protocol_fault(Kind::WrongId);
}

#[test]
fn an_error_status_is_handed_out_with_its_payload_and_touches_no_data() {
    let mut rig = rig();
    rig.device
        .inject(0, &Injection::next(Kind::ErrorStatus, 1))
        .unwrap();
    let ids = rig.submit(7);
    let done = rig.drain();
    assert_eq!(done[0].id, ids[0]);
    assert_eq!(done[0].entry.loopback_code(), Ok(StatusCode::Injected));
    assert_eq!(done[0].entry.queue_id, 0);
    assert!(done[1..].iter().all(|d| d.entry.is_success()));
    // The failed ToDevice wrote nothing: the ToHost after it brought back the device's
    // zeros (a fresh device), not the source.
    let mut back = vec![0u8; LEN];
    rig.host
        .slice()
        .read_into(Rig::dst(0) + OFFSET, &mut back)
        .unwrap();
    assert_eq!(back, vec![0u8; LEN]);
    assert!(
        !rig.queue().is_faulted(),
        "an error status is no protocol error"
    );
    rig.check_canaries();
    rig.check_no_leak();
    assert_eq!(rig.injected().error_status, 1);
    rig.check_usable();
}

#[test]
fn a_corrupted_descriptor_fails_its_checks_and_touches_no_memory() {
    let mut rig = rig();
    rig.device
        .inject(0, &Injection::next(Kind::CorruptDescriptor, 1))
        .unwrap();
    let ids = rig.submit(8);
    let done = rig.drain();
    assert_eq!(done[0].id, ids[0]);
    assert_eq!(done[0].entry.loopback_code(), Ok(StatusCode::BadContext));
    let mut device = vec![0xffu8; LEN];
    rig.device
        .device_memory()
        .read_into(0, &mut device)
        .unwrap();
    assert_eq!(device, vec![0u8; LEN], "nothing reached device memory");
    rig.check_canaries();
    rig.check_no_leak();
    assert_eq!(rig.injected().corrupt_descriptor, 1);
    rig.check_usable();
}

#[test]
fn a_slow_descriptor_completes_late_and_correct() {
    let mut rig = rig();
    let delay = Duration::from_millis(30);
    rig.device
        .inject(0, &Injection::next(Kind::Slow, 1).delay(delay))
        .unwrap();
    let began = Instant::now();
    rig.submit(0x3c);
    let first = rig.wait().unwrap();
    assert!(began.elapsed() >= delay, "{:?}", began.elapsed());
    assert!(first.entry.is_success());
    for _ in 1..2 * TRANSFERS {
        assert!(rig.wait().unwrap().entry.is_success());
    }
    rig.check_canaries();
    rig.check_no_leak();
    assert_eq!(rig.injected().slow, 1);
    rig.check_usable();
}

#[test]
fn with_no_injection_nothing_changes() {
    let mut rig = rig();
    for _ in 0..50 {
        rig.check_usable();
    }
    assert_eq!(rig.injected(), Counts::default());
    let counters = rig.device.counters().unwrap();
    assert_eq!(counters.errors, 0);
    assert_eq!(counters.queues[0].completed, 50 * 2 * TRANSFERS as u64);
    let queue = rig.queue.take().unwrap();
    let shutdown = queue.shutdown(Duration::from_secs(1)).unwrap();
    assert!(shutdown.completed.is_empty() && shutdown.aborted.is_empty());
}

#[test]
fn an_injection_from_the_configuration_hits_from_the_start() {
    let mut rig = rig_with(Config::default().inject(0, Injection::next(Kind::ErrorStatus, 2)));
    rig.submit(9);
    let done = rig.drain();
    assert_eq!(done[0].entry.loopback_code(), Ok(StatusCode::Injected));
    assert_eq!(done[1].entry.loopback_code(), Ok(StatusCode::Injected));
    assert!(done[2..].iter().all(|d| d.entry.is_success()));
    assert_eq!(rig.injected().error_status, 2);
    // Used up: the device is clean again.
    rig.check_usable();
}

#[test]
fn a_random_injection_repeats_for_its_seed() {
    let run = |seed| {
        let mut rig = rig();
        rig.device
            .inject(0, &Injection::random(&[Kind::ErrorStatus], 0.2, seed))
            .unwrap();
        let mut codes = Vec::new();
        for round in 0..10 {
            rig.submit(round);
            codes.extend(rig.drain().iter().map(|d| d.entry.code()));
        }
        rig.device.clear_injection(0).unwrap();
        rig.check_usable();
        codes
    };
    let a = run(11);
    assert_eq!(a, run(11));
    assert_ne!(a, run(12));
    assert!(a.iter().any(|&c| c != 0) && a.contains(&0));
}

#[test]
fn bad_injections_are_refused() {
    let rig = rig();
    assert!(rig
        .device
        .inject(5, &Injection::next(Kind::Stall, 1))
        .is_err());
    assert!(rig
        .device
        .inject(0, &Injection::random(&[Kind::Stall], 2.0, 1))
        .is_err());
    assert!(rig
        .device
        .inject(0, &Injection::random(&[], 0.5, 1))
        .is_err());
    assert!(Loopback::new(Config::default().inject(9, Injection::next(Kind::Stall, 1))).is_err());
}

#[test]
fn injection_is_programmed_through_the_bar_of_a_device_process() {
    let program = match std::env::var_os("USERDMA_LOOPBACK_DEVICE_PROGRAM") {
        Some(path) => userdma_loopback::Program::new(std::path::PathBuf::from(path)),
        None => device_process::program(),
    };
    let mut rig = rig_with(
        Config::default()
            .memory_size(1 << 20)
            .mode(userdma_loopback::Mode::Process(program)),
    );
    assert!(rig.device.process_id().is_some());
    rig.device
        .inject(0, &Injection::next(Kind::WrongId, 1))
        .unwrap();
    rig.submit(10);
    let error = rig.wait().unwrap_err();
    assert!(
        matches!(error, Error::WrongCommand { queue: 0, .. }),
        "{error}"
    );
    rig.after_protocol_fault(Kind::WrongId);
}
