//! What a hostile client can send the device owner (userdma-owner), three ways; the input's
//! first byte chooses which:
//!
//! - **messages** (`0`): the rest decoded with `proto::decode`, which never panics; a message
//!   it accepts encodes back to the same bytes (an error's text: to the same message), and
//!   decodes back to the same message. One exception, checked as such: an error text of bytes
//!   that are not UTF-8 decodes with U+FFFD for each bad sequence, and may come out longer
//!   than the 192 bytes the wire holds; encoding it cuts it.
//! - **rings** (`1`): rings laid out with `Rings::init` over plain words, an honest client on
//!   its own view of them (`Rings::open`), and between the owner side's operations the
//!   fuzzer's writes to any word a client can reach (its tail and head, entries, the header,
//!   even the owner's own indices). The owner side never panics, never reports more waiting
//!   submissions than the ring holds, never posts a completion past its room nor writes a word
//!   outside the entry it posts; while nothing was overwritten, it sees exactly what the
//!   honest client sent and the client takes exactly what it posted.
//! - **owner** (`2`, `3`): one real `Owner` per fuzz process (a loopback device of zero cost,
//!   its socket in a directory of its own, stepped in this thread with `Owner::turn`). Each
//!   input connects a raw `SOCK_SEQPACKET` socket and runs the rest as a script: packets of
//!   lengths the script chooses, turns of the owner (a few, or until its frames are done),
//!   reading the owner's answers (every one must decode; a welcome's rings are mapped; the
//!   device's figures of a stats answer carry the device's counters, which the owner reads
//!   through `server::LoopbackCounters`, and its clock never goes back), and
//!   writes into those rings (any word, submissions of pool pages, completions taken). Then
//!   the socket is closed, and the owner must let go of everything of that client (clients,
//!   streams, frames, mapped bytes all back to zero) and leave no socket or eventfd open
//!   (counted in `/proc/self/fd`; of memfds, no more than the loopback device's translation
//!   caches may hold, see [`DEVICE_CACHES`]). Every [`PROBE_EVERY`] such inputs a well-formed
//!   [`Client`] connects, declares a stream and runs a frame whose result is checked, and its
//!   stats show that stream and the device's counters past that frame: the owner still
//!   serves.
//!
//! Every descriptor opened here is close-on-exec: libFuzzer forks a symbolizer when it
//! reports new coverage, and a descriptor that child inherited would look leaked.

#![no_main]

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use userdma::memory::Region;
use userdma::share::{self, Received};
use userdma::Runtime;
use userdma_infer::accel::{Accelerator, LoopbackEngine};
use userdma_infer::pipeline::{Config as PipelineConfig, Model};
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};
use userdma_owner::chan::{self, Completion, Rings, Submission};
use userdma_owner::proto::{self, Msg, MAX_MESSAGE, TEXT};
use userdma_owner::server::{Config, Entry, Limits, LoopbackCounters, Owner};
use userdma_owner::{Client, Options, StreamDecl};

/// The input, read front to back; past its end every read is `None`.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    /// Up to `n` bytes.
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    /// Up to 8 bytes, little-endian (the missing high bytes zero); `None` at the end.
    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8);
        if b.is_empty() {
            return None;
        }
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        Some(u64::from_le_bytes(w))
    }

    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2);
        if b.is_empty() {
            return None;
        }
        Some(u16::from(b[0]) | b.get(1).map_or(0, |&h| u16::from(h) << 8))
    }
}

// ---- messages ----

/// `proto::decode` of any bytes: no panic; what it accepts round-trips.
fn messages(bytes: &[u8]) {
    let Ok(msg) = proto::decode(bytes) else {
        return;
    };
    let mut buf = [0u8; MAX_MESSAGE];
    let n = proto::encode(&msg, &mut buf);
    assert_eq!(n, bytes.len(), "{msg:?}: every kind has one length");
    let again = proto::decode(&buf[..n])
        .unwrap_or_else(|e| panic!("{msg:?} encoded to a message decode refuses: {e}"));
    match &msg {
        // decode cuts a text that replacement characters made longer than the wire holds.
        Msg::Error { text, .. } if text.len() > TEXT => {
            panic!("{msg:?}: a decoded text longer than the wire's {TEXT} bytes")
        }
        // An error's text ends at its first NUL, and what follows in the bytes is not read:
        // the same message, not always the same bytes.
        Msg::Error { .. } => assert_eq!(again, msg),
        _ => {
            assert_eq!(again, msg);
            assert_eq!(
                &buf[..n],
                bytes,
                "{msg:?}: not the bytes it was decoded from"
            );
        }
    }
}

// ---- rings ----

// The rings' layout, as `chan` documents it: a client may write any of these words.
const W_SQ_ENTRIES: usize = 2;
const W_SQ_TAIL: usize = 8;
const W_SQ_HEAD: usize = 16;
const W_CQ_TAIL: usize = 24;
const W_CQ_HEAD: usize = 32;
const W_OWNER_IDLE: usize = 40;
const W_ENTRIES: usize = 64;
const ENTRY_WORDS: usize = 4;

fn snapshot(words: &[AtomicU64]) -> Vec<u64> {
    words.iter().map(|w| w.load(Ordering::Relaxed)).collect()
}

/// Asserts that only the words in `changed` differ between `before` and now.
fn only_changed(before: &[u64], words: &[AtomicU64], changed: &[usize], what: &str) {
    for (i, (b, w)) in before.iter().zip(words).enumerate() {
        let now = w.load(Ordering::Relaxed);
        if now != *b && !changed.contains(&i) {
            panic!("{what} wrote word {i} ({b:#x} -> {now:#x}), outside {changed:?}");
        }
    }
}

fn rings(data: &mut Bytes<'_>) {
    let sizes = data.u8().unwrap_or(0);
    let sq = 1u32 << (sizes % 5);
    let cq = 1u32 << ((sizes / 5) % 5);
    let words: Vec<AtomicU64> = (0..chan::region_len(sq, cq) / 8)
        .map(|_| AtomicU64::new(0))
        .collect();
    Rings::init(&words, sq, cq).expect("sizes that fit");
    // The owner's view: the sizes it laid out, whatever the header says later.
    let owner = Rings::trusted(&words, sq, cq);
    let (sq64, cq64) = (u64::from(sq), u64::from(cq));
    // Both sides start at any index, as if that many frames had gone round: wrapping counts.
    let start = data.u64().unwrap_or(0);
    for w in [W_SQ_TAIL, W_SQ_HEAD, W_CQ_TAIL, W_CQ_HEAD] {
        words[w].store(start, Ordering::Relaxed);
    }
    let (mut head, mut tail) = (start, start);
    // What the honest client sent and the owner has not read; what the owner posted and the
    // client has not taken. Checked exactly only while nothing was overwritten.
    let mut sent: VecDeque<Submission> = VecDeque::new();
    let mut posted: VecDeque<Completion> = VecDeque::new();
    let mut tampered = false;
    let mut tag = 0u64;
    for _ in 0..512 {
        let Some(op) = data.u8() else { break };
        match op % 8 {
            // Any word, any value.
            0 => {
                let at = usize::from(data.u16().unwrap_or(0)) % words.len();
                words[at].store(data.u64().unwrap_or(0), Ordering::Relaxed);
                tampered = true;
            }
            // The client's tail or head near where the owner is: the edges of the checks.
            1 => {
                let delta = i64::from(data.u8().unwrap_or(0) as i8);
                let (word, base) = if op & 8 == 0 {
                    (W_SQ_TAIL, head)
                } else {
                    (W_CQ_HEAD, tail)
                };
                words[word].store(base.wrapping_add_signed(delta), Ordering::Relaxed);
                tampered = true;
            }
            // The honest client submits.
            2 => {
                let Ok(client) = Rings::open(&words) else {
                    assert!(tampered, "fresh rings refused");
                    continue;
                };
                tag += 1;
                let s = Submission {
                    stream: u32::from(data.u8().unwrap_or(0)),
                    input: data.u64().unwrap_or(0),
                    result: u64::from(op),
                    tag,
                };
                let took = client.submit(&s);
                if !tampered {
                    assert_eq!(took, sent.len() < sq as usize, "full only when full");
                    if took {
                        sent.push_back(s);
                    }
                }
            }
            // The honest client takes a completion.
            3 => {
                let Ok(client) = Rings::open(&words) else {
                    assert!(tampered, "fresh rings refused");
                    continue;
                };
                let got = client.complete();
                if !tampered {
                    assert_eq!(got, posted.pop_front(), "not what the owner posted");
                }
            }
            // The owner takes up to n submissions.
            4 => {
                let n = u64::from(data.u8().unwrap_or(1) % 20);
                match owner.submissions(head) {
                    Ok(waiting) => {
                        assert!(waiting <= sq64, "{waiting} waiting in a ring of {sq}");
                        if !tampered {
                            assert_eq!(waiting, sent.len() as u64);
                        }
                        let before = snapshot(&words);
                        for _ in 0..waiting.min(n) {
                            let s = owner.read_submission(head);
                            head = head.wrapping_add(1);
                            if !tampered {
                                assert_eq!(Some(s), sent.pop_front(), "not what was sent");
                            }
                        }
                        owner.consumed(head);
                        only_changed(&before, &words, &[W_SQ_HEAD], "taking submissions");
                    }
                    Err(chan::Error::Corrupt { .. }) => assert!(tampered, "an honest tail refused"),
                    Err(e) => panic!("{e}"),
                }
            }
            // The owner posts up to n completions.
            5 => {
                let n = u64::from(data.u8().unwrap_or(1) % 20);
                match owner.completion_room(tail) {
                    Ok(room) => {
                        assert!(room <= cq64, "room for {room} in a ring of {cq}");
                        if !tampered {
                            assert_eq!(room, cq64 - posted.len() as u64);
                        }
                        let k = room.min(n);
                        for i in 0..k {
                            let before = snapshot(&words);
                            let c = Completion {
                                stream: op.into(),
                                status: (i % 6) as u32,
                                tag: tail,
                                latency_ns: i,
                                wait_ns: n,
                            };
                            let next = owner.post(tail, &c);
                            assert_eq!(next, tail.wrapping_add(1));
                            let entry = W_ENTRIES
                                + ENTRY_WORDS * (sq as usize + (tail & (cq64 - 1)) as usize);
                            let mut allowed: Vec<usize> = (entry..entry + ENTRY_WORDS).collect();
                            allowed.push(W_CQ_TAIL);
                            only_changed(&before, &words, &allowed, "posting a completion");
                            tail = next;
                            if !tampered {
                                posted.push_back(c);
                            }
                        }
                        // Nothing else wrote meanwhile: the room went down by what was posted,
                        // never below nothing.
                        match owner.completion_room(tail) {
                            Ok(left) => assert_eq!(left, room - k, "posted past the room"),
                            Err(e) => panic!("posting within the room broke the ring: {e}"),
                        }
                    }
                    Err(chan::Error::Corrupt { .. }) => assert!(tampered, "an honest head refused"),
                    Err(e) => panic!("{e}"),
                }
            }
            // The idle flags.
            6 => {
                let before = snapshot(&words);
                let waiting = owner.owner_idle(head);
                if !tampered {
                    assert_eq!(waiting, !sent.is_empty());
                }
                owner.owner_awake();
                let _ = owner.client_needs_wake();
                if let Ok(client) = Rings::open(&words) {
                    let _ = client.owner_needs_wake();
                }
                // Back to what they were, but for the flag a hostile client may have set.
                let mut after = snapshot(&words);
                after[W_OWNER_IDLE] = before[W_OWNER_IDLE];
                assert_eq!(before, after, "the idle flags wrote elsewhere");
            }
            // A header the client rewrote: opened or refused, never a view past the words.
            _ => {
                if op & 8 != 0 {
                    let at = W_SQ_ENTRIES + usize::from(op >> 4) % 2;
                    words[at].store(data.u64().unwrap_or(0), Ordering::Relaxed);
                    tampered = true;
                }
                if let Ok(view) = Rings::open(&words) {
                    let (s, c) = (view.sq_entries(), view.cq_entries());
                    assert!(s.is_power_of_two() && c.is_power_of_two());
                    assert!(chan::region_len(s, c) <= words.len() * 8);
                    let got = view.complete();
                    if !tampered {
                        assert_eq!(got, posted.pop_front(), "not what the owner posted");
                    }
                }
            }
        }
    }
}

// ---- the owner ----

/// A well-formed client every this many owner inputs (and on the first).
const PROBE_EVERY: u64 = 256;
/// Pieces of host memory the loopback device may keep mapped after their owner let go: one
/// per unit (copy, compute).
const DEVICE_CACHES: usize = 2;
/// How long the owner may take to let go of a client, or to serve the probe.
const PATIENCE: Duration = Duration::from_secs(20);

/// The owner of this fuzz process.
struct Harness {
    // Dropped first: the owner, then the device under it.
    owner: Owner,
    _runtime: Runtime,
    socket: PathBuf,
    model: Model,
    inputs: u64,
    /// The descriptors before any client came.
    baseline: BTreeMap<i32, String>,
}

thread_local! {
    static HARNESS: RefCell<Option<Harness>> = const { RefCell::new(None) };
}

/// The latest owner's clock a stats answer carried (it never goes back).
static CLOCK: AtomicU64 = AtomicU64::new(0);

/// The socket's directory, removed at exit.
static DIR: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_dir() {
    if let Some(dir) = DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn model() -> Model {
    Model::chain(1, 4096).expect("a model")
}

fn harness() -> Harness {
    let dir = std::env::temp_dir().join(format!("userdma-fuzz-owner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the socket");
    let socket = dir.join("owner.sock");
    if DIR.set(dir).is_ok() {
        // SAFETY: registers a function of no arguments that only removes a directory.
        unsafe { libc::atexit(remove_dir) };
    }
    let runtime = Runtime::loopback(loopback::Config::default().cost(Cost::zero()).queues(16))
        .expect("a loopback device");
    let engine: Arc<dyn Accelerator> =
        Arc::new(LoopbackEngine::new(&runtime).expect("the loopback engine"));
    let device = Arc::clone(runtime.loopback_device().expect("the loopback device"));
    let config = Config {
        counters: Some(Arc::new(LoopbackCounters::new(device))),
        // Room for the hostile client and the probe, both with all their streams; small pools
        // and rings, so that a welcome is cheap.
        limits: Limits {
            clients: 4,
            pool_bytes: 1 << 20,
            streams: 2,
            in_flight: 8,
        },
        in_flight: 2,
        ..Config::new(&socket)
    }
    .model(Entry {
        name: "chain".into(),
        model: model(),
        pipeline: PipelineConfig::default(),
    });
    let owner = Owner::bind(engine, config).expect("the owner");
    Harness {
        owner,
        _runtime: runtime,
        socket,
        model: model(),
        inputs: 0,
        baseline: descriptors(),
    }
}

impl Harness {
    fn turn(&mut self) {
        // A client's misbehaviour never ends the loop: only a system call failing does.
        self.owner
            .turn(Duration::ZERO)
            .unwrap_or_else(|e| panic!("a turn of the owner failed: {e}"));
    }

    /// Turns until no frame is on the device, or `patience` passed.
    fn drain(&mut self, patience: Duration) {
        let deadline = Instant::now() + patience;
        self.turn();
        while self.owner.figures().in_flight > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(10));
            self.turn();
        }
    }

    /// Turns until the owner holds nothing of any client.
    fn settle(&mut self, after: &str) {
        let deadline = Instant::now() + PATIENCE;
        for turns in 0u64.. {
            self.turn();
            let f = self.owner.figures();
            if f.clients == 0
                && f.streams == 0
                && f.in_flight == 0
                && f.departing == 0
                && f.mapped_bytes == 0
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{after}, the owner still holds {f:?} after {turns} turns"
            );
            if turns > 64 {
                // Frames on the device: the engine thread finishes them.
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// A well-formed client (in a thread of its own, the owner turning here) connects,
    /// declares a stream and runs a frame, whose result is right.
    fn probe(&mut self) {
        let (path, model) = (self.socket.clone(), self.model.clone());
        let client = std::thread::spawn(move || -> Result<(), String> {
            let options = Options {
                pool_bytes: 1 << 20,
                name: "probe".into(),
            };
            let mut c = Client::connect(&path, &options).map_err(|e| format!("connect: {e}"))?;
            let s = c
                .declare(&StreamDecl::new("probe", "chain"))
                .map_err(|e| format!("declare: {e}"))?;
            let pool = Arc::clone(c.pool());
            let input = pool
                .alloc(s.input_bytes as usize)
                .map_err(|e| e.to_string())?;
            let result = pool
                .alloc(s.result_bytes as usize)
                .map_err(|e| e.to_string())?;
            let bytes: Vec<u8> = (0..s.input_bytes).map(|i| (i * 7 + 3) as u8).collect();
            input.write(0, &bytes).map_err(|e| e.to_string())?;
            c.submit(&s, &input, &result, 7)
                .map_err(|e| format!("submit: {e}"))?;
            let done = c.wait(Some(PATIENCE)).map_err(|e| format!("wait: {e}"))?;
            if (done.status, done.tag) != (chan::STATUS_OK, 7) {
                return Err(format!("completion {done:?}"));
            }
            let mut got = vec![0u8; s.result_bytes as usize];
            result.read(0, &mut got).map_err(|e| e.to_string())?;
            if got != model.expected(&bytes) {
                return Err("a wrong result".into());
            }
            let stats = c.stats().map_err(|e| format!("stats: {e}"))?;
            let seen = stats
                .streams
                .iter()
                .any(|f| f.name.as_str() == "probe" && f.frames == 1);
            let ran = stats
                .device
                .counters
                .is_some_and(|d| d.compute.descriptors > 0 && d.copy.descriptors > 0);
            if !seen || !ran {
                return Err(format!("stats without the probe's frame: {stats:?}"));
            }
            Ok(())
        });
        let deadline = Instant::now() + PATIENCE;
        while !client.is_finished() {
            self.turn();
            assert!(Instant::now() < deadline, "the owner stopped serving");
        }
        if let Err(e) = client.join().expect("the probe thread") {
            panic!("a well-formed client could not use the owner: {e}");
        }
        self.settle("after the probe");
    }
}

/// The descriptors of this process that the owner or a client would make: sockets, eventfds
/// and other anonymous inodes, memfds (libFuzzer's own, files and pipes, are left out).
fn descriptors() -> BTreeMap<i32, String> {
    let mut fds = BTreeMap::new();
    for entry in std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
    {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let mut target = target.to_string_lossy().into_owned();
        if target.contains("/memfd:") {
            // Its length, to tell a pool from rings in a report.
            if let Ok(m) = std::fs::metadata(entry.path()) {
                target = format!("{target}, {} bytes", m.len());
            }
        } else if !target.starts_with("socket:") && !target.starts_with("anon_inode:") {
            continue;
        }
        fds.insert(fd, target);
    }
    fds
}

fn connect(path: &Path) -> OwnedFd {
    // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed sockaddr_un is valid; the path is shorter than sun_path (checked).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_encoded_bytes();
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
    for (d, &s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = s as libc::c_char;
    }
    // SAFETY: `addr` is a valid sockaddr_un of the given length; `fd` is open.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "connect: {}", std::io::Error::last_os_error());
    fd
}

/// Reads every answer waiting: each must decode; a welcome's descriptors are taken and its
/// rings mapped into `rings`.
fn answers(fd: &OwnedFd, rings: &mut Option<Region>) {
    loop {
        let mut magic = [0u8; 4];
        // SAFETY: `magic` is writable for its length; `fd` is open.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                magic.as_mut_ptr().cast(),
                magic.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            // Nothing waiting, or the owner closed this connection.
            return;
        }
        if magic == *b"UDMS" {
            // The descriptors of a welcome: a pool, the rings, two doorbells.
            let items = share::recv(fd.as_fd())
                .unwrap_or_else(|e| panic!("the owner sent descriptors that do not decode: {e}"));
            assert_eq!(items.len(), 4, "{items:?}");
            let mut items = items.into_iter();
            drop(items.next());
            if let Some(r @ Received::Region { .. }) = items.next() {
                let region = r.into_region().expect("the rings map");
                assert!(region.len() % 8 == 0 && region.len() >= chan::region_len(1, 1));
                *rings = Some(region);
            } else {
                panic!("the welcome's second item is not the rings");
            }
            continue;
        }
        let mut buf = [0u8; MAX_MESSAGE + 1];
        // SAFETY: `buf` is writable for its length; `fd` is open.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            return;
        }
        let msg = &buf[..n as usize];
        match proto::decode(msg) {
            Err(e) => panic!("the owner sent a message that does not decode: {e} ({msg:?})"),
            Ok(Msg::DeviceStats(d)) => {
                assert!(d.counters.is_some(), "no device counters: {d:?}");
                let before = CLOCK.fetch_max(d.clock_ns, Ordering::Relaxed);
                assert!(d.clock_ns >= before, "the owner's clock went back: {d:?}");
            }
            Ok(_) => {}
        }
    }
}

/// Writes into the rings the owner sent (if it did).
fn ring_write(rings: &Option<Region>, how: u8, data: &mut Bytes<'_>) {
    let Some(region) = rings else {
        return;
    };
    let len = region.len() / 8;
    // SAFETY: the region is mapped for its life, page-aligned (so aligned for AtomicU64) and
    // `len` words long; the owner touches these words only as atomics.
    let words: &[AtomicU64] =
        unsafe { std::slice::from_raw_parts(region.as_ptr().as_ptr().cast(), len) };
    match how % 4 {
        // Any word.
        0 => {
            let at = usize::from(data.u16().unwrap_or(0)) % len;
            words[at].store(data.u64().unwrap_or(0), Ordering::Release);
        }
        // A submission as a client makes it, with buffers at page offsets in the pool (the
        // pool's buffers start at one of them).
        1 => {
            if let Ok(view) = Rings::open(words) {
                let page = |b: Option<u8>| u64::from(b.unwrap_or(0)) * 4096;
                let s = Submission {
                    stream: u32::from(data.u8().unwrap_or(0) % 4),
                    input: page(data.u8()),
                    result: page(data.u8()),
                    tag: u64::from(how),
                };
                view.submit(&s);
            }
        }
        // Completions taken (as many as the ring holds: the tail is a word this client can
        // overwrite too).
        2 => {
            if let Ok(view) = Rings::open(words) {
                for _ in 0..view.cq_entries() {
                    if view.complete().is_none() {
                        break;
                    }
                }
            }
        }
        // The client's tail or head moved near the owner's by a small step.
        _ => {
            let delta = i64::from(data.u8().unwrap_or(0) as i8);
            let (word, base) = if how & 4 == 0 {
                (W_SQ_TAIL, W_SQ_HEAD)
            } else {
                (W_CQ_HEAD, W_CQ_TAIL)
            };
            let at = words[base]
                .load(Ordering::Acquire)
                .wrapping_add_signed(delta);
            words[word].store(at, Ordering::Release);
        }
    }
}

fn owner(h: &mut Harness, data: &mut Bytes<'_>) {
    h.inputs += 1;
    if h.inputs % PROBE_EVERY == 1 {
        h.probe();
    }
    let before = descriptors();
    let fd = connect(&h.socket);
    let mut rings: Option<Region> = None;
    for _ in 0..64 {
        let Some(op) = data.u8() else { break };
        match op % 4 {
            // A packet of the length the next byte says (what is left, if less).
            0 => {
                let len = usize::from(data.u8().unwrap_or(0));
                let packet = data.take(len);
                messages(packet);
                // SAFETY: `packet` is readable for its length; `fd` is open. A full socket or
                // a connection the owner closed is the client's problem, not the owner's.
                unsafe {
                    libc::send(
                        fd.as_raw_fd(),
                        packet.as_ptr().cast(),
                        packet.len(),
                        libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    )
                };
            }
            // Turns: 1 to 4, or until nothing is on the device (the frames of a client
            // that keeps submitting may keep it busy: 100 ms at most).
            1 if op & 0x10 != 0 => h.drain(Duration::from_millis(100)),
            1 => {
                for _ in 0..=(op >> 2) % 4 {
                    h.turn();
                }
            }
            2 => answers(&fd, &mut rings),
            _ => ring_write(&rings, op >> 2, data),
        }
    }
    // A last turn, so that what was sent last is read, then hang up.
    h.turn();
    answers(&fd, &mut rings);
    drop(rings);
    drop(fd);
    h.settle("once its client hung up");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let after = descriptors();
        // Sockets and eventfds: exactly those of before.
        let left: Vec<_> = after
            .iter()
            .filter(|&(fd, target)| !target.contains("/memfd:") && before.get(fd) != Some(target))
            .collect();
        // Memory: the loopback device's two units each keep the last piece of host memory
        // they reached mapped (their translation cache, `Host` in userdma-loopback) until
        // their next lookup, whoever it belonged to; a pool of a client that left can stay
        // open there, but never more than one per unit, whatever came before.
        let held: Vec<_> = after
            .iter()
            .filter(|&(fd, target)| {
                target.contains("/memfd:") && h.baseline.get(fd) != Some(target)
            })
            .collect();
        if left.is_empty() && held.len() <= DEVICE_CACHES {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "descriptors left after the client hung up: {left:?}, memory held: {held:?}"
        );
        h.turn();
        std::thread::sleep(Duration::from_micros(100));
    }
}

fuzz_target!(|data: &[u8]| {
    // libFuzzer's main is not Rust's, which would have ignored SIGPIPE.
    // SAFETY: setting a signal's disposition to ignore; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let mut data = Bytes(data);
    match data.u8().unwrap_or(0) % 4 {
        0 => messages(data.0),
        1 => rings(&mut data),
        _ => HARNESS.with(|h| {
            let mut h = h.borrow_mut();
            owner(h.get_or_insert_with(harness), &mut data);
        }),
    }
});
