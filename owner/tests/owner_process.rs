//! The device owner with real client processes: the owner runs on a loopback NPU in a thread
//! of this test; clients are this test binary run again with a role in its environment.
//! Each client declares a stream, fills its inputs in its own pool, submits through its
//! rings, checks every result against the model's host reference and prints what it saw and
//! what the owner's stats say.
//!
//! - two and four clients of different priorities and maximum waits: every frame right, every
//!   stream's longest wait within the bound the owner states;
//! - a client SIGKILLed mid-stream: the others' frames all right and their rates kept; its
//!   pool unmapped and nothing of it left in the owner's accounting;
//! - a uid not allowed refused at the door; hostile messages and rings close that client only;
//! - a frame naming a buffer too short for its stream, one not allocated, or an offset where no
//!   buffer can start refused with nothing written (the next buffers untouched), and a
//!   client's offsets reaching only its own pool;
//! - an owner restart waited for; a removed device told to every client;
//! - stats: an administrator sees every client's streams by name and the device's counters;
//!   anyone else its own client only.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use userdma::Runtime;
use userdma_infer::accel::{Accelerator, LoopbackEngine};
use userdma_infer::pipeline::{Config as PipelineConfig, Model};
use userdma_loopback::fault::{Injection, Kind};
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};
use userdma_owner::proto::OwnerFigures;
use userdma_owner::server::{Access, Config, Entry, LoopbackCounters, Owner};
use userdma_owner::{chan, Client, EventKind, Options, Span, StreamDecl};

const ROLE: &str = "USERDMA_OWNER_TEST_ROLE";
const WAIT: Duration = Duration::from_secs(20);

fn model() -> Model {
    Model::chain(2, 16 << 10).unwrap()
}

/// Input of frame `n` of a client named `name`.
fn fill(name: &str, n: u64, buf: &mut [u8]) {
    let seed = name
        .bytes()
        .fold(n.wrapping_mul(0x9E37_79B9_7F4A_7C15), |h, b| {
            h.rotate_left(7) ^ u64::from(b)
        });
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let v = seed
            .wrapping_add(i as u64)
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
    }
}

/// Work for the owner's thread to do between two turns of its loop, the owner still.
type Job = Box<dyn FnOnce(&Owner) + Send>;

/// A running owner: its socket, its stop flag, its thread (returning its last figures).
struct Running {
    stop: Arc<AtomicBool>,
    device: Arc<loopback::Loopback>,
    thread: Option<std::thread::JoinHandle<OwnerFigures>>,
    figures: Arc<std::sync::Mutex<OwnerFigures>>,
    jobs: mpsc::Sender<Job>,
}

impl Running {
    fn stop(mut self) -> OwnerFigures {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .unwrap()
            .join()
            .expect("the owner thread")
    }

    fn figures(&self) -> OwnerFigures {
        *self.figures.lock().unwrap()
    }

    /// Runs `f` on the owner's thread between two turns: nothing of the owner moves while it
    /// runs (the device may finish a frame, but only a turn posts its completion).
    fn between_turns<R: Send + 'static>(&self, f: impl FnOnce(&Owner) -> R + Send + 'static) -> R {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send(Box::new(move |o: &Owner| {
                let _ = tx.send(f(o));
            }))
            .expect("the owner thread runs");
        rx.recv_timeout(WAIT)
            .expect("the owner thread took the job")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start_owner(socket: &Path, tweak: impl FnOnce(Config) -> Config + Send + 'static) -> Running {
    let stop = Arc::new(AtomicBool::new(false));
    let figures = Arc::new(std::sync::Mutex::new(OwnerFigures::default()));
    let (tx, rx) = mpsc::channel();
    let (jobs, job_rx) = mpsc::channel::<Job>();
    let (stop2, figures2, path) = (Arc::clone(&stop), Arc::clone(&figures), socket.to_owned());
    let thread = std::thread::spawn(move || {
        let rt = Runtime::loopback(loopback::Config::default().cost(Cost::npu()).queues(16))
            .expect("loopback device");
        let device = Arc::clone(rt.loopback_device().unwrap());
        let engine: Arc<dyn Accelerator> = Arc::new(LoopbackEngine::new(&rt).unwrap());
        let mut config = Config::new(&path).model(Entry {
            name: "chain".into(),
            model: model(),
            pipeline: PipelineConfig::default(),
        });
        config.counters = Some(Arc::new(LoopbackCounters::new(Arc::clone(&device))));
        let mut owner = Owner::bind(engine, tweak(config)).expect("bind");
        tx.send(device).unwrap();
        while !stop2.load(Ordering::Relaxed) {
            while let Ok(job) = job_rx.try_recv() {
                job(&owner);
            }
            owner.turn(Duration::from_millis(20)).expect("a turn");
            *figures2.lock().unwrap() = owner.figures();
        }
        owner.run(&AtomicBool::new(true)).expect("shutdown");
        owner.figures()
    });
    let device = rx.recv_timeout(WAIT).expect("the owner started");
    Running {
        stop,
        device,
        thread: Some(thread),
        figures,
        jobs,
    }
}

/// A client process's settings.
#[derive(Debug, Clone)]
struct Spec {
    name: &'static str,
    priority: u8,
    /// 0: as fast as possible.
    period_ms: u64,
    max_wait_ms: u64,
    run_ms: u64,
    /// Frames it keeps out at most (0: 4 periodic, 2 as fast as possible).
    depth: usize,
    /// Checks every result (a victim about to be killed keeps its frames out instead).
    check: bool,
}

fn spawn(test: &str, socket: &Path, spec: &Spec) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, "client")
        .env("OWNER_SOCKET", socket)
        .env("CLIENT_NAME", spec.name)
        .env("CLIENT_PRIORITY", spec.priority.to_string())
        .env("CLIENT_PERIOD_MS", spec.period_ms.to_string())
        .env("CLIENT_MAX_WAIT_MS", spec.max_wait_ms.to_string())
        .env("CLIENT_RUN_MS", spec.run_ms.to_string())
        .env("CLIENT_DEPTH", spec.depth.to_string())
        .env("CLIENT_CHECK", if spec.check { "1" } else { "0" })
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// What a client printed last: `key=value` pairs of its `CLIENT` line.
#[derive(Debug, Default)]
struct Seen {
    fields: Vec<(String, u64)>,
}

impl Seen {
    fn get(&self, key: &str) -> u64 {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|&(_, v)| v)
            .unwrap_or_else(|| panic!("no {key} in {:?}", self.fields))
    }
}

/// Reads `child`'s output up to its `CLIENT` line (after `RUNNING`, signalled on `running`).
fn collect(child: &mut Child, running: Option<mpsc::Sender<()>>) -> Seen {
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = Seen::default();
    for line in out.lines() {
        let line = line.unwrap();
        if line.contains("RUNNING") {
            if let Some(tx) = &running {
                let _ = tx.send(());
            }
        }
        if let Some(at) = line.find("CLIENT ") {
            for kv in line[at + 7..].split_whitespace() {
                if let Some((k, v)) = kv.split_once('=') {
                    seen.fields.push((k.to_owned(), v.parse().unwrap_or(0)));
                }
            }
        }
    }
    seen
}

/// The client role: one stream, frames for `CLIENT_RUN_MS`, every result checked.
fn client() {
    let var = |k: &str| std::env::var(k).unwrap();
    let num = |k: &str| var(k).parse::<u64>().unwrap();
    let name = var("CLIENT_NAME");
    let name = name.as_str();
    let (period, max_wait, run) = (
        num("CLIENT_PERIOD_MS"),
        num("CLIENT_MAX_WAIT_MS"),
        num("CLIENT_RUN_MS"),
    );
    let options = Options {
        pool_bytes: 8 << 20,
        name: name.into(),
    };
    let mut client = Client::connect(var("OWNER_SOCKET"), &options).expect("connect");
    let mut decl = StreamDecl::new(name, "chain").priority(num("CLIENT_PRIORITY") as u8);
    if period > 0 {
        decl = decl.period(Duration::from_millis(period));
    }
    if max_wait > 0 {
        decl = decl.max_wait(Duration::from_millis(max_wait));
    }
    let stream = client.declare(&decl).expect("declare");
    let model = model();
    let pool = Arc::clone(client.pool());
    let depth = match num("CLIENT_DEPTH") as usize {
        0 if period > 0 => 4,
        0 => 2,
        d => d,
    };
    let check = var("CLIENT_CHECK") != "0";
    let inputs: Vec<_> = (0..depth)
        .map(|_| pool.alloc(stream.input_bytes as usize).unwrap())
        .collect();
    let results: Vec<_> = (0..depth)
        .map(|_| pool.alloc(stream.result_bytes as usize).unwrap())
        .collect();
    let mut scratch = vec![0u8; stream.input_bytes as usize];
    let mut got = vec![0u8; stream.result_bytes as usize];
    let mut free: Vec<usize> = (0..depth).collect();
    let mut frame_of = vec![0u64; depth];
    let (mut n, mut done, mut wrong, mut other) = (0u64, 0u64, 0u64, 0u64);
    let mut latency_max = 0u64;
    let start = Instant::now();
    let end = start + Duration::from_millis(run);
    let mut next = start;
    println!("RUNNING");
    loop {
        let now = Instant::now();
        let open = now < end;
        if open && !free.is_empty() && (period == 0 || now >= next) {
            let b = free.pop().unwrap();
            fill(name, n, &mut scratch);
            inputs[b].write(0, &scratch).unwrap();
            client
                .submit(&stream, &inputs[b], &results[b], b as u64)
                .expect("submit");
            frame_of[b] = n;
            n += 1;
            if period > 0 {
                next += Duration::from_millis(period);
            }
            continue;
        }
        if !open && free.len() == depth {
            break;
        }
        let timeout = if period > 0 && open && !free.is_empty() {
            next.saturating_duration_since(Instant::now())
        } else {
            WAIT
        };
        let c = match client.wait(Some(timeout.max(Duration::from_micros(100)))) {
            Ok(c) => c,
            Err(userdma_owner::Error::Timeout(_)) => continue,
            Err(e) => panic!("wait: {e}"),
        };
        let b = c.tag as usize;
        if c.status == chan::STATUS_OK {
            if check {
                results[b].read(0, &mut got).unwrap();
                fill(name, frame_of[b], &mut scratch);
                wrong += u64::from(got != model.expected(&scratch));
            }
            done += 1;
            latency_max = latency_max.max(c.latency_ns);
        } else {
            other += 1;
        }
        free.push(b);
    }
    let stats = client.stats().expect("stats");
    let s = stats.streams[0];
    println!(
        "CLIENT frames={done} submitted={n} wrong={wrong} other={other} owner_frames={} \
         max_head_wait={} bound={} frame_ns={} latency_max={latency_max} seconds_ms={}",
        s.frames,
        s.max_head_wait_ns,
        s.bound_ns,
        s.frame_ns,
        start.elapsed().as_millis()
    );
}

/// The tests that time frames across processes run one at a time: the stated bounds hold
/// for the service the device and the owner's loop gave, and tests sharing two cores with
/// each other would stall the owner between a frame's arrival and its dispatch.
static TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn timed() -> std::sync::MutexGuard<'static, ()> {
    TIMED.lock().unwrap_or_else(|p| p.into_inner())
}

fn tmp_socket(tag: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{tag}.sock"));
    (dir, path)
}

/// Runs `specs` as client processes against one owner; returns what each saw and the
/// owner's figures once all left.
fn run_clients(test: &str, specs: &[Spec]) -> (Vec<Seen>, OwnerFigures) {
    let (_dir, socket) = tmp_socket(test);
    let owner = start_owner(&socket, |c| c);
    let mut children: Vec<Child> = specs.iter().map(|s| spawn(test, &socket, s)).collect();
    let seen: Vec<Seen> = children.iter_mut().map(|c| collect(c, None)).collect();
    for c in &mut children {
        assert!(c.wait().unwrap().success(), "a client failed");
    }
    let figures = settle(&owner);
    owner.stop();
    (seen, figures)
}

/// Waits until the owner holds nothing of any client.
fn settle(owner: &Running) -> OwnerFigures {
    let deadline = Instant::now() + WAIT;
    loop {
        let f = owner.figures();
        if f.clients == 0 && f.streams == 0 && f.mapped_bytes == 0 && f.in_flight == 0 {
            return f;
        }
        assert!(Instant::now() < deadline, "the owner still holds {f:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn check_bounds(specs: &[Spec], seen: &[Seen]) {
    for (spec, s) in specs.iter().zip(seen) {
        assert_eq!(s.get("wrong"), 0, "{spec:?}: wrong results");
        assert_eq!(s.get("other"), 0, "{spec:?}: frames not run");
        assert!(s.get("frames") > 0, "{spec:?} ran nothing");
        assert_eq!(s.get("frames"), s.get("owner_frames"), "{spec:?}");
        let (wait, bound) = (s.get("max_head_wait"), s.get("bound"));
        if bound == 0 {
            // No bound exists at the pace the device and the owner's loop gave: a maximum-wait
            // stream's forced frames could fill the device. Only a host far behind the cost
            // model (a 2-layer chain of 16 KiB tensors takes well under a millisecond) gets
            // there; the case study tolerates it the same way. Under a sanitizer
            // (scripts/sanitize.sh) frames run several times slower again: 5.5 ms was seen
            // under ThreadSanitizer, so there a millisecond is far enough behind.
            let service = s.get("frame_ns");
            let behind = if cfg!(any(
                userdma_sanitize = "address",
                userdma_sanitize = "thread"
            )) {
                1_000_000
            } else {
                10_000_000
            };
            assert!(
                service > behind,
                "{spec:?}: no bound stated at a service of {service} ns"
            );
            continue;
        }
        assert!(
            wait <= bound,
            "{spec:?}: waited {wait} ns > bound {bound} ns"
        );
    }
}

const TWO: &str = "two_clients_of_different_priorities_keep_the_stated_bounds";
#[test]
fn two_clients_of_different_priorities_keep_the_stated_bounds() {
    if std::env::var(ROLE).is_ok() {
        return client();
    }
    let specs = [
        Spec {
            name: "live",
            priority: 1,
            period_ms: 20,
            max_wait_ms: 0,
            run_ms: 1500,
            depth: 0,
            check: true,
        },
        Spec {
            name: "batch",
            priority: 0,
            period_ms: 0,
            max_wait_ms: 100,
            run_ms: 1500,
            depth: 0,
            check: true,
        },
    ];
    let _one = timed();
    let (seen, figures) = run_clients(TWO, &specs);
    check_bounds(&specs, &seen);
    // The live stream kept its rate: 75 frames in 1.5 s, give or take its last.
    assert!(seen[0].get("frames") >= 70, "{:?}", seen[0]);
    assert!(figures.switches > 0, "{figures:?}");
    assert_eq!(figures.vanished, 0);
}

const FOUR: &str = "four_clients_with_maximum_waits_keep_the_stated_bounds";
#[test]
fn four_clients_with_maximum_waits_keep_the_stated_bounds() {
    if std::env::var(ROLE).is_ok() {
        return client();
    }
    let spec = |name, priority, period_ms, max_wait_ms| Spec {
        name,
        priority,
        period_ms,
        max_wait_ms,
        run_ms: 1500,
        depth: 0,
        check: true,
    };
    let specs = [
        spec("cam0", 2, 25, 0),
        spec("cam1", 2, 40, 0),
        spec("batch0", 0, 0, 150),
        spec("batch1", 1, 0, 0),
    ];
    let _one = timed();
    let (seen, _) = run_clients(FOUR, &specs);
    check_bounds(&specs, &seen);
}

const KILL: &str = "a_client_killed_mid_stream_leaks_nothing_and_the_others_go_on";
#[test]
fn a_client_killed_mid_stream_leaks_nothing_and_the_others_go_on() {
    if std::env::var(ROLE).is_ok() {
        return client();
    }
    let _one = timed();
    let (_dir, socket) = tmp_socket("kill");
    let owner = start_owner(&socket, |c| c);
    let live = Spec {
        name: "live",
        priority: 1,
        period_ms: 20,
        max_wait_ms: 0,
        run_ms: 2000,
        depth: 0,
        check: true,
    };
    let other = Spec {
        name: "other",
        priority: 0,
        period_ms: 0,
        max_wait_ms: 200,
        run_ms: 2000,
        depth: 0,
        check: true,
    };
    let victim = Spec {
        name: "victim",
        priority: 0,
        period_ms: 0,
        max_wait_ms: 0,
        run_ms: 60_000,
        // Many frames out and no time spent checking results: killed, it has frames taken,
        // queued or running whatever the moment (a sanitized client spends most of its time
        // checking, with nothing out).
        depth: 16,
        check: false,
    };
    let mut survivors = [spawn(KILL, &socket, &live), spawn(KILL, &socket, &other)];
    let mut doomed = spawn(KILL, &socket, &victim);
    let (tx, rx) = mpsc::channel();
    let mut out = doomed.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut line = String::new();
        let mut r = BufReader::new(&mut out);
        while r.read_line(&mut line).unwrap_or(0) > 0 {
            if line.contains("RUNNING") {
                let _ = tx.send(());
            }
            line.clear();
        }
    });
    rx.recv_timeout(WAIT).expect("the victim runs");
    // Mid-stream: the others running too. Killed between two turns of the owner, and only at
    // a moment the owner counts frames of the victim taken and not completed (it may have
    // none out for a moment when its device outruns it, e.g. under a sanitizer), so that the
    // kill is one with frames out whatever the machine's speed.
    std::thread::sleep(Duration::from_millis(200));
    let deadline = Instant::now() + WAIT;
    let mut doomed = Some(doomed);
    let (clients, out) = loop {
        let mut victim = doomed.take().unwrap();
        let (victim, clients, killed_with) = owner.between_turns(move |o| {
            let clients = o.client_figures();
            let out = clients
                .iter()
                .find(|c| c.name.as_str() == "victim")
                .map_or(0, |c| c.in_flight);
            let now = out > 0 && clients.len() == 3;
            if now {
                victim.kill().unwrap();
                // Dead and its socket closed before the owner's next turn.
                victim.wait().unwrap();
            }
            (victim, clients, now.then_some(out))
        });
        if let Some(out) = killed_with {
            break (clients, out);
        }
        assert!(
            Instant::now() < deadline,
            "the victim never had a frame out with the others connected: {clients:?}"
        );
        doomed = Some(victim);
        std::thread::sleep(Duration::from_millis(5));
    };
    reader.join().unwrap();
    eprintln!("killed with {out} frames out: {clients:?}");
    // Seen at once: within a few turns of the loop, as a client that left with frames out.
    let deadline = Instant::now() + Duration::from_secs(2);
    while owner.figures().clients != 2 {
        assert!(
            Instant::now() < deadline,
            "the kill went unnoticed: {:?}",
            owner.figures()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let after = owner.figures();
    assert_eq!((after.vanished, after.left), (1, 0), "{after:?}");
    let seen: Vec<Seen> = survivors.iter_mut().map(|c| collect(c, None)).collect();
    for c in &mut survivors {
        assert!(c.wait().unwrap().success());
    }
    check_bounds(&[live, other], &seen);
    // The live stream kept its rate through the kill: 100 frames in 2 s (90 at least on a
    // loaded host).
    assert!(seen[0].get("frames") >= 90, "{:?}", seen[0]);
    let figures = settle(&owner);
    assert_eq!(figures.vanished, 1, "{figures:?}");
    assert_eq!(figures.departing, 0);
    owner.stop();
}

const DOOR: &str = "a_uid_not_allowed_is_refused_at_the_door";
#[test]
fn a_uid_not_allowed_is_refused_at_the_door() {
    let (_dir, socket) = tmp_socket("door");
    let me = nix::unistd::geteuid().as_raw();
    let owner = start_owner(&socket, move |mut c| {
        c.access = Access {
            uids: vec![me.wrapping_add(12345)],
            gids: vec![],
        };
        c
    });
    let err = Client::connect(&socket, &Options::default()).unwrap_err();
    assert_eq!(err.code(), userdma::Code::Refused, "{err}");
    assert!(err.to_string().contains(&format!("uid {me}")), "{err}");
    let deadline = Instant::now() + WAIT;
    while owner.figures().refused != 1 {
        assert!(Instant::now() < deadline, "{:?}", owner.figures());
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = DOOR;
}

const HOSTILE: &str = "hostile_messages_and_rings_close_that_client_only";
#[test]
fn hostile_messages_and_rings_close_that_client_only() {
    use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let (_dir, socket) = tmp_socket("hostile");
    let owner = start_owner(&socket, |c| c);
    let mut good = Client::connect(&socket, &Options::default()).unwrap();
    let stream = good.declare(&StreamDecl::new("good", "chain")).unwrap();
    // Garbage, a message out of turn, a truncated hello: each gets an error and a close.
    let cases: [&[u8]; 3] = [
        b"not a message at all",
        &[b'U', b'D', b'O', b'W', 1, 0, 7, 0], // Stats before hello
        &[b'U', b'D', b'O', b'W', 1, 0, 1, 0, 1, 2],
    ];
    for bytes in cases {
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        socket::connect(fd.as_raw_fd(), &UnixAddr::new(&socket).unwrap()).unwrap();
        socket::send(fd.as_raw_fd(), bytes, MsgFlags::empty()).unwrap();
        let mut buf = [0u8; 512];
        let n = socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
        match userdma_owner::proto::decode(&buf[..n]).unwrap() {
            userdma_owner::proto::Msg::Error { fatal, text, .. } => {
                assert!(fatal, "{text}");
            }
            other => panic!("{other:?}"),
        }
        // Then the end of the connection.
        assert_eq!(
            socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap(),
            0
        );
    }
    // Offsets outside the pool, and a stream that is not the client's: refused, not run.
    let pool = Arc::clone(good.pool());
    let input = pool.alloc(stream.input_bytes as usize).unwrap();
    let result = pool.alloc(stream.result_bytes as usize).unwrap();
    good.submit_offsets(stream.id, 0, result.offset() as u64, 1)
        .unwrap(); // the pool's metadata, not a buffer
    good.submit_offsets(stream.id, input.offset() as u64, 1 << 40, 2)
        .unwrap();
    good.submit_offsets(
        stream.id + 7,
        input.offset() as u64,
        result.offset() as u64,
        3,
    )
    .unwrap();
    for _ in 0..3 {
        let c = good.wait(Some(WAIT)).unwrap();
        assert_eq!(c.status, chan::STATUS_REFUSED, "{c:?}");
    }
    // And the good client still runs frames.
    let model = model();
    let mut scratch = vec![0u8; stream.input_bytes as usize];
    fill("good", 0, &mut scratch);
    input.write(0, &scratch).unwrap();
    good.submit(&stream, &input, &result, 9).unwrap();
    let c = good.wait(Some(WAIT)).unwrap();
    assert_eq!((c.status, c.tag), (chan::STATUS_OK, 9));
    let mut got = vec![0u8; stream.result_bytes as usize];
    result.read(0, &mut got).unwrap();
    assert_eq!(got, model.expected(&scratch));
    let f = owner.figures();
    assert_eq!(f.closed, 3, "{f:?}");
    assert_eq!(f.clients, 1);
    let _ = HOSTILE;
}

/// What a binding that keeps a table of its buffers knows of `b`.
fn span(b: &userdma::pool::Buffer<'_>) -> Span {
    Span {
        offset: b.offset() as u64,
        len: b.len() as u64,
    }
}

/// Whether every byte of `b` is `byte`.
fn all(b: &userdma::pool::Buffer<'_>, byte: u8) -> bool {
    let mut got = vec![0u8; b.len()];
    b.read(0, &mut got).unwrap();
    got.iter().all(|&x| x == byte)
}

#[test]
fn buffers_too_short_or_not_allocated_are_refused_with_nothing_written() {
    let (_dir, socket) = tmp_socket("short");
    let owner = start_owner(&socket, |c| c);
    let mut client = Client::connect(&socket, &Options::default()).unwrap();
    let stream = client.declare(&StreamDecl::new("s", "chain")).unwrap();
    let (needed_in, needed_res) = (stream.input_bytes, stream.result_bytes);
    let pool = Arc::clone(client.pool());
    let input = pool.alloc(needed_in as usize).unwrap();
    let result = pool.alloc(needed_res as usize).unwrap();
    let mut scratch = vec![0u8; needed_in as usize];
    fill("short", 0, &mut scratch);
    input.write(0, &scratch).unwrap();
    // A buffer far shorter than the stream's result, and buffers after it that a frame
    // writing the stream's result bytes from its offset would overwrite (the C program of
    // the report: 100 bytes, then a buffer of the client's; status ok and the buffer after it
    // overwritten). Of 64 buffers of 100 bytes (one class), the lowest is the short one, the
    // others those buffers.
    let mut victims: Vec<_> = (0..64)
        .map(|_| {
            let v = pool.alloc(100).unwrap();
            v.write(0, &[0xEE; 100]).unwrap();
            v
        })
        .collect();
    victims.sort_by_key(userdma::pool::Buffer::offset);
    let short = victims.remove(0);
    let reach = short.offset()..short.offset() + needed_res as usize;
    assert!(
        victims.iter().any(|v| reach.contains(&v.offset())),
        "no buffer after the short one within the stream's result bytes: the test proves nothing"
    );
    let untouched = |what: &str| {
        for v in &victims {
            assert!(
                all(v, 0xEE),
                "{what}: the buffer at {:#x} was written",
                v.offset()
            );
        }
    };
    let refused = |client: &mut Client, tag: u64, what: &str| {
        let c = client.wait(Some(WAIT)).unwrap();
        assert_eq!(
            (c.status, c.tag),
            (chan::STATUS_REFUSED, tag),
            "{what}: {c:?}"
        );
        untouched(what);
    };

    // A result buffer too short, an input buffer too short (as its length, even though its
    // block's 256 bytes are more than the length).
    client
        .submit_spans(stream.id, Some(span(&input)), Some(span(&short)), 1)
        .unwrap();
    refused(&mut client, 1, "a short result");
    client
        .submit_spans(stream.id, Some(span(&short)), Some(span(&result)), 2)
        .unwrap();
    refused(&mut client, 2, "a short input");
    // A buffer the binding does not know (freed, never allocated, or an offset in the middle
    // of one of its buffers), and a stream not declared.
    client
        .submit_spans(stream.id, Some(span(&input)), None, 3)
        .unwrap();
    refused(&mut client, 3, "an unknown result");
    client
        .submit_spans(stream.id, None, Some(span(&result)), 4)
        .unwrap();
    refused(&mut client, 4, "an unknown input");
    client
        .submit_spans(stream.id + 7, Some(span(&input)), Some(span(&result)), 5)
        .unwrap();
    refused(&mut client, 5, "a stream not declared");
    assert_eq!(client.in_flight(), 0);
    // The Rust API with the buffers themselves: an error, nothing sent.
    match client.submit(&stream, &input, &short, 6) {
        Err(userdma_owner::Error::ShortBuffer { what: "result", .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(client.poll().is_none());
    untouched("Client::submit of a short result");
    // Bare offsets where no buffer can start (inside the result buffer, inside the short
    // one): the owner refuses them.
    let (inside, in_short) = (result.offset() as u64 + 8, short.offset() as u64 + 4);
    result.write(0, &vec![0xEE; result.len()]).unwrap();
    client
        .submit_offsets(stream.id, input.offset() as u64, inside, 7)
        .unwrap();
    refused(&mut client, 7, "a result offset inside a buffer");
    client
        .submit_offsets(stream.id, in_short, result.offset() as u64, 8)
        .unwrap();
    refused(&mut client, 8, "an input offset inside a buffer");
    assert!(
        all(&result, 0xEE),
        "a refused frame wrote the result buffer"
    );

    // The client goes on: a frame of its right buffers runs, and so does one whose input and
    // result are the same buffer (the input is read whole before the result is written).
    let model = model();
    let expected = model.expected(&scratch);
    client
        .submit_spans(stream.id, Some(span(&input)), Some(span(&result)), 9)
        .unwrap();
    let c = client.wait(Some(WAIT)).unwrap();
    assert_eq!((c.status, c.tag), (chan::STATUS_OK, 9), "{c:?}");
    let mut got = vec![0u8; needed_res as usize];
    result.read(0, &mut got).unwrap();
    assert_eq!(got, expected);
    let both = pool.alloc(needed_in.max(needed_res) as usize).unwrap();
    both.write(0, &scratch).unwrap();
    client
        .submit_spans(stream.id, Some(span(&both)), Some(span(&both)), 10)
        .unwrap();
    let c = client.wait(Some(WAIT)).unwrap();
    assert_eq!((c.status, c.tag), (chan::STATUS_OK, 10), "{c:?}");
    both.read(0, &mut got).unwrap();
    assert_eq!(got, expected, "a frame in place");
    untouched("the frames that ran");
    let f = owner.figures();
    assert_eq!((f.clients, f.closed), (1, 0), "{f:?}");
}

#[test]
fn a_clients_offsets_reach_only_its_own_pool() {
    let (_dir, socket) = tmp_socket("own-pool");
    let owner = start_owner(&socket, |c| c);
    let mut a = Client::connect(&socket, &Options::default()).unwrap();
    let mut b = Client::connect(&socket, &Options::default()).unwrap();
    let sa = a.declare(&StreamDecl::new("a", "chain")).unwrap();
    let sb = b.declare(&StreamDecl::new("b", "chain")).unwrap();
    let (pa, pb) = (Arc::clone(a.pool()), Arc::clone(b.pool()));
    let a_input = pa.alloc(sa.input_bytes as usize).unwrap();
    let a_result = pa.alloc(sa.result_bytes as usize).unwrap();
    a_input.write(0, &vec![0xAA; a_input.len()]).unwrap();
    a_result.write(0, &vec![0xEE; a_result.len()]).unwrap();
    // B names A's buffers by their offsets, with buffers of its own there or not: the owner
    // resolves them in B's pool (they lie inside it), so the frame runs on B's memory only.
    let b_input = pb.alloc(sb.input_bytes as usize).unwrap();
    let mut scratch = vec![0u8; b_input.len()];
    fill("b", 0, &mut scratch);
    b_input.write(0, &scratch).unwrap();
    b.submit_offsets(sb.id, b_input.offset() as u64, a_result.offset() as u64, 1)
        .unwrap();
    b.submit_offsets(sb.id, a_input.offset() as u64, a_result.offset() as u64, 2)
        .unwrap();
    for _ in 0..2 {
        let c = b.wait(Some(WAIT)).unwrap();
        assert_eq!(c.status, chan::STATUS_OK, "{c:?}");
    }
    assert!(all(&a_result, 0xEE), "B's frame wrote A's result buffer");
    assert!(all(&a_input, 0xAA), "B's frame wrote A's input buffer");
    // A's own frame still reads and writes its own buffers.
    a.submit(&sa, &a_input, &a_result, 3).unwrap();
    let c = a.wait(Some(WAIT)).unwrap();
    assert_eq!((c.status, c.tag), (chan::STATUS_OK, 3), "{c:?}");
    let mut got = vec![0u8; a_result.len()];
    a_result.read(0, &mut got).unwrap();
    assert_eq!(got, model().expected(&vec![0xAA; a_input.len()]));
    drop(owner);
}

const RESTART: &str = "an_owner_restart_is_waited_for_and_a_removal_is_told";
#[test]
fn an_owner_restart_is_waited_for_and_a_removal_is_told() {
    let (_dir, socket) = tmp_socket("restart");
    let owner = start_owner(&socket, |c| c);
    let mut client = Client::connect(&socket, &Options::default()).unwrap();
    client.declare(&StreamDecl::new("s", "chain")).unwrap();
    owner.stop();
    // The owner said it was going, then the connection ended.
    let deadline = Instant::now() + WAIT;
    let mut events = Vec::new();
    while !client.is_gone() {
        events.extend(client.events().unwrap());
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        events.iter().any(|e| e.kind == EventKind::Shutdown),
        "{events:?}"
    );
    // A new owner on the same path: the client waits for it and comes back.
    let path = socket.clone();
    let restarted = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        start_owner(&path, |c| c)
    });
    let mut again = Client::connect_wait(&socket, &Options::default(), WAIT).unwrap();
    let owner = restarted.join().unwrap();
    let stream = again.declare(&StreamDecl::new("s", "chain")).unwrap();
    // The device is removed: every client hears it, and frames are refused as removed.
    owner.device.remove();
    let pool = Arc::clone(again.pool());
    let input = pool.alloc(stream.input_bytes as usize).unwrap();
    let result = pool.alloc(stream.result_bytes as usize).unwrap();
    let mut statuses = Vec::new();
    let deadline = Instant::now() + WAIT;
    let mut removed = false;
    while !removed {
        again.submit(&stream, &input, &result, 1).unwrap();
        statuses.push(again.wait(Some(WAIT)).unwrap().status);
        removed = again
            .events()
            .unwrap()
            .iter()
            .any(|e| e.kind == EventKind::Removed);
        assert!(Instant::now() < deadline, "{statuses:?}");
    }
    again.submit(&stream, &input, &result, 2).unwrap();
    assert_eq!(again.wait(Some(WAIT)).unwrap().status, chan::STATUS_REMOVED);
    let _ = RESTART;
}

#[test]
fn a_device_that_stops_answering_is_reset_told_and_its_frames_come_back_lost() {
    let (_dir, socket) = tmp_socket("reset");
    let owner = start_owner(&socket, |mut c| {
        for m in &mut c.models {
            m.pipeline.timeout = Duration::from_millis(300);
        }
        c
    });
    let mut client = Client::connect(&socket, &Options::default()).unwrap();
    let stream = client.declare(&StreamDecl::new("s", "chain")).unwrap();
    let pool = Arc::clone(client.pool());
    let input = pool.alloc(stream.input_bytes as usize).unwrap();
    let result = pool.alloc(stream.result_bytes as usize).unwrap();
    let model = model();
    let mut scratch = vec![0u8; stream.input_bytes as usize];
    let mut got = vec![0u8; stream.result_bytes as usize];
    let mut run = |client: &mut Client, n: u64| {
        fill("reset", n, &mut scratch);
        input.write(0, &scratch).unwrap();
        client.submit(&stream, &input, &result, n).unwrap();
        let c = client.wait(Some(WAIT)).unwrap();
        if c.status == chan::STATUS_OK {
            result.read(0, &mut got).unwrap();
            assert_eq!(got, model.expected(&scratch), "frame {n}");
        }
        c
    };
    assert_eq!(run(&mut client, 0).status, chan::STATUS_OK);
    // The stream's first queue stops serving: its next frame is overdue, the device reset.
    owner
        .device
        .inject(0, &Injection::next(Kind::Stall, 1))
        .unwrap();
    let lost = run(&mut client, 1);
    assert_eq!(lost.status, chan::STATUS_LOST, "{lost:?}");
    let events = client.events().unwrap();
    assert!(
        events.iter().any(|e| e.kind == EventKind::Reset),
        "{events:?}"
    );
    // The device runs frames again after its reset.
    assert_eq!(run(&mut client, 2).status, chan::STATUS_OK);
    let stats = client.stats().unwrap();
    assert_eq!(stats.streams[0].lost, 1);
    assert_eq!(stats.owner.resets, 1);
}

#[test]
fn per_client_limits_hold_memory_streams_frames_and_clients() {
    let (_dir, socket) = tmp_socket("limits");
    let owner = start_owner(&socket, |mut c| {
        c.limits = userdma_owner::server::Limits {
            clients: 2,
            pool_bytes: 4 << 20,
            streams: 2,
            in_flight: 4,
        };
        c
    });
    // A pool larger than the limit is cut to it.
    let options = Options {
        pool_bytes: 1 << 30,
        name: "big".into(),
    };
    let mut a = Client::connect(&socket, &options).unwrap();
    assert!(a.pool().mapping().len() <= 4 << 20);
    assert_eq!(a.max_in_flight(), 4);
    let s0 = a.declare(&StreamDecl::new("s0", "chain")).unwrap();
    let err = a.declare(&StreamDecl::new("s0", "chain")).unwrap_err();
    assert!(err.to_string().contains("already has"), "{err}");
    let err = a
        .declare(&StreamDecl::new("s3", "no-such-model"))
        .unwrap_err();
    assert!(
        err.to_string().contains("chain"),
        "names the models it has: {err}"
    );
    a.declare(&StreamDecl::new("s1", "chain")).unwrap();
    let err = a.declare(&StreamDecl::new("s2", "chain")).unwrap_err();
    assert_eq!(err.code(), userdma::Code::Exhausted, "{err}");
    // Frames out: the fifth is refused at once, and taking completions makes room.
    let pool = Arc::clone(a.pool());
    let buffers: Vec<_> = (0..5)
        .map(|_| {
            (
                pool.alloc(s0.input_bytes as usize).unwrap(),
                pool.alloc(s0.result_bytes as usize).unwrap(),
            )
        })
        .collect();
    for (i, (input, result)) in buffers.iter().take(4).enumerate() {
        a.submit(&s0, input, result, i as u64).unwrap();
    }
    let (input, result) = &buffers[4];
    let err = a.submit(&s0, input, result, 4).unwrap_err();
    assert_eq!(err.code(), userdma::Code::Busy, "{err}");
    a.wait(Some(WAIT)).unwrap();
    a.submit(&s0, input, result, 4).unwrap();
    // A buffer too short, one of another pool: refused before the ring.
    let short = pool.alloc(16).unwrap();
    assert!(a.submit(&s0, &short, result, 5).is_err());
    // Clients: a third is refused while two are connected.
    let _b = Client::connect(&socket, &Options::default()).unwrap();
    let err = Client::connect(&socket, &Options::default()).unwrap_err();
    assert_eq!(err.code(), userdma::Code::Busy, "{err}");
    while a.in_flight() > 0 {
        a.wait(Some(WAIT)).unwrap();
    }
    drop(owner);
}

/// Runs `frames` frames of `stream` one at a time; every one must complete.
fn frames(client: &mut Client, stream: &userdma_owner::Stream, frames: u64) {
    let pool = Arc::clone(client.pool());
    let input = pool.alloc(stream.input_bytes as usize).unwrap();
    let result = pool.alloc(stream.result_bytes as usize).unwrap();
    for tag in 0..frames {
        client.submit(stream, &input, &result, tag).unwrap();
        let done = client.wait(Some(WAIT)).unwrap();
        assert_eq!((done.status, done.tag), (chan::STATUS_OK, tag));
    }
}

#[test]
fn stats_show_an_administrator_every_stream_and_the_devices_counters() {
    let (_dir, socket) = tmp_socket("stats");
    let owner = start_owner(&socket, |c| c);
    let named = |name: &str| Options {
        pool_bytes: 1 << 20,
        name: name.into(),
    };
    let mut camera = Client::connect(&socket, &named("camera")).unwrap();
    let live = camera.declare(&StreamDecl::new("live", "chain")).unwrap();
    frames(&mut camera, &live, 3);
    let mut batch = Client::connect(&socket, &named("batch")).unwrap();
    let night = batch.declare(&StreamDecl::new("night", "chain")).unwrap();
    frames(&mut batch, &night, 2);
    // This test's uid is the owner's: an administrator.
    let stats = batch.stats().unwrap();
    assert!(stats.sees_all(), "{stats:?}");
    assert_eq!(stats.streams.len(), 1);
    assert_eq!(stats.streams[0].name.as_str(), "night");
    assert_eq!(
        (stats.streams[0].client, stats.streams[0].frames),
        (batch.id(), 2)
    );
    assert_eq!(stats.others.len(), 1);
    assert_eq!(stats.others[0].name.as_str(), "live");
    assert_eq!(
        (stats.others[0].client, stats.others[0].frames),
        (camera.id(), 3)
    );
    let names: Vec<&str> = stats.clients.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["camera", "batch"]);
    let d = stats.device;
    assert!(!d.device.as_str().is_empty() && d.clock_ns > 0, "{d:?}");
    let c = d.counters.expect("the loopback device's counters");
    // Five frames of a two-layer chain: each a copy in, compute, a copy out at least.
    assert!(
        c.copy.descriptors >= 10 && c.compute.descriptors >= 5,
        "{c:?}"
    );
    assert!(c.copy.busy_ns > 0 && c.compute.busy_ns > 0, "{c:?}");
    // The clock and the counters only grow.
    frames(&mut camera, &live, 1);
    let again = batch.stats().unwrap();
    assert!(again.device.clock_ns > d.clock_ns);
    let c2 = again.device.counters.unwrap();
    assert!(c2.compute.descriptors > c.compute.descriptors);
    assert_eq!(again.others[0].frames, 4);
    drop((camera, batch));
    settle(&owner);
    owner.stop();

    // No administrators, no counters: each client sees its own, and the answer says the
    // device's counters are not read.
    let (_dir, socket) = tmp_socket("stats-own");
    let owner = start_owner(&socket, |mut c| {
        c.admins.clear();
        c.counters = None;
        c
    });
    let mut camera = Client::connect(&socket, &named("camera")).unwrap();
    let live = camera.declare(&StreamDecl::new("live", "chain")).unwrap();
    frames(&mut camera, &live, 1);
    let mut other = Client::connect(&socket, &named("other")).unwrap();
    let stats = other.stats().unwrap();
    assert!(!stats.sees_all(), "{stats:?}");
    assert!(stats.streams.is_empty() && stats.others.is_empty());
    assert_eq!(stats.clients.len(), 1);
    assert_eq!(stats.clients[0].client, other.id());
    assert_eq!((stats.owner.clients, stats.owner.streams), (2, 1));
    assert_eq!(stats.device.counters, None);
    drop((camera, other));
    settle(&owner);
    owner.stop();
}
