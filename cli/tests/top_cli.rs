//! `userdma top`: the live view against a `userdma serve` the test starts, with streams
//! driven by clients of this test (each its own connection):
//!
//! - in a pseudo-terminal: it shows every stream, reads keys without Enter (canonical mode
//!   and echo off while it runs), quits on `q` with status 0, and leaves the terminal's modes
//!   as they were and the alternate screen left; SIGINT the same; the owner going away ends
//!   it non-zero with why, the terminal restored too;
//! - JSON lines (`--json --count 3`): one object per interval, every field checked (frames/s
//!   of the active streams above 0, busy shares in [0, 1], counters that only grow);
//! - wrapping a run: `--demo 2` and a command after `--`;
//! - bad input: no owner, a socket that is not an owner's, an interval of 0: a clear error
//!   and its exit code, never a panic.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::termios::{self, LocalFlags, Termios};
use serde_json::Value;
use userdma_owner::{chan, Client, Options, StreamDecl};

const BIN: &str = env!("CARGO_BIN_EXE_userdma");
const PATIENCE: Duration = Duration::from_secs(15);

/// A `userdma serve` of the test's, stopped (SIGTERM) when dropped.
struct Owner {
    child: Child,
    socket: PathBuf,
    _out: BufReader<ChildStdout>,
    _dir: tempfile::TempDir,
}

fn serve() -> Owner {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("owner.sock");
    let mut child = Command::new(BIN)
        .args(["serve", "--cost", "zero", "--model", "small=chain:2:16384"])
        .arg("--socket")
        .arg(&socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("listening on"), "{line}");
    Owner {
        child,
        socket,
        _out: out,
        _dir: dir,
    }
}

impl Owner {
    fn stop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Streams of the test's clients: each a thread with a client of its own, a frame every
/// 2 ms until stopped.
struct Streams {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<u64>>,
}

fn drive(socket: &Path, names: &[&'static str]) -> Streams {
    let stop = Arc::new(AtomicBool::new(false));
    let (ready, declared) = mpsc::channel();
    let threads = names
        .iter()
        .map(|&name| {
            let (socket, stop, ready) = (socket.to_owned(), Arc::clone(&stop), ready.clone());
            std::thread::spawn(move || {
                let options = Options {
                    pool_bytes: 1 << 20,
                    name: format!("client-{name}"),
                };
                let mut client = Client::connect(&socket, &options).unwrap();
                let stream = client.declare(&StreamDecl::new(name, "small")).unwrap();
                let pool = Arc::clone(client.pool());
                let input = pool.alloc(stream.input_bytes as usize).unwrap();
                let result = pool.alloc(stream.result_bytes as usize).unwrap();
                ready.send(()).unwrap();
                let mut frames = 0;
                while !stop.load(Ordering::Relaxed) {
                    match client.submit(&stream, &input, &result, frames) {
                        Ok(()) => {}
                        Err(_) => break,
                    }
                    match client.wait(Some(PATIENCE)) {
                        Ok(c) if c.status == chan::STATUS_OK => frames += 1,
                        _ => break,
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                frames
            })
        })
        .collect();
    for _ in names {
        declared.recv_timeout(PATIENCE).expect("a stream declared");
    }
    Streams { stop, threads }
}

impl Streams {
    fn stop(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect()
    }
}

/// Waits for `child` (up to `PATIENCE`), reading the terminal meanwhile.
fn wait_draining(
    child: &mut Child,
    master: &OwnedFd,
    seen: &mut String,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            read_for(master, Duration::from_millis(50), seen);
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "top did not end; the screen:\n{seen}"
        );
        read_for(master, Duration::from_millis(20), seen);
    }
}

/// Reads what the terminal shows for up to `time`.
fn read_for(master: &OwnedFd, time: Duration, seen: &mut String) {
    let deadline = Instant::now() + time;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(master.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => return,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => panic!("poll: {e}"),
        }
        let mut buf = [0u8; 8192];
        match nix::unistd::read(master.as_fd(), &mut buf) {
            Ok(0) | Err(nix::errno::Errno::EIO) => return,
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) => panic!("read: {e}"),
        }
        if left.is_zero() {
            return;
        }
    }
}

/// Reads until `done` says so (or fails after `PATIENCE` with the screen).
fn read_until(master: &OwnedFd, seen: &mut String, done: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done(seen) {
        assert!(
            Instant::now() < deadline,
            "the screen never showed it:\n{seen}"
        );
        read_for(master, Duration::from_millis(20), seen);
    }
}

/// What the terminal's modes say about keys: canonical mode and echo.
fn keys(t: &Termios) -> (bool, bool) {
    (
        t.local_flags.contains(LocalFlags::ICANON),
        t.local_flags.contains(LocalFlags::ECHO),
    )
}

/// `userdma top` in a new pseudo-terminal (its stdin and stdout), stderr piped.
struct InPty {
    child: Child,
    master: OwnedFd,
    slave: OwnedFd,
    before: Termios,
    seen: String,
}

fn top_in_pty(socket: &Path) -> InPty {
    let pty = nix::pty::openpty(None, None).unwrap();
    let before = termios::tcgetattr(&pty.slave).unwrap();
    assert_eq!(
        keys(&before),
        (true, true),
        "a new terminal is canonical and echoes"
    );
    let child = Command::new(BIN)
        .args(["top", "--interval", "0.2", "--socket"])
        .arg(socket)
        .stdin(Stdio::from(pty.slave.try_clone().unwrap()))
        .stdout(Stdio::from(pty.slave.try_clone().unwrap()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    InPty {
        child,
        master: pty.master,
        slave: pty.slave,
        before,
        seen: String::new(),
    }
}

impl InPty {
    /// Waits for the end; checks the terminal is as it was and the alternate screen left;
    /// returns the status and stderr.
    fn end(mut self) -> (std::process::ExitStatus, String) {
        let status = wait_draining(&mut self.child, &self.master, &mut self.seen);
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let after = termios::tcgetattr(&self.slave).unwrap();
        assert_eq!(keys(&after), (true, true), "modes restored; stderr: {err}");
        assert_eq!(after.local_flags, self.before.local_flags);
        assert_eq!(after.input_flags, self.before.input_flags);
        assert_eq!(after.output_flags, self.before.output_flags);
        assert_eq!(after.control_chars, self.before.control_chars);
        let entered = self
            .seen
            .find("\x1b[?1049h")
            .expect("the alternate screen entered");
        let left = self
            .seen
            .rfind("\x1b[?1049l")
            .expect("the alternate screen left");
        assert!(left > entered);
        assert!(
            self.seen.rfind("\x1b[H").is_some_and(|draw| draw < left),
            "the last draw before leaving"
        );
        assert!(
            self.seen[left..].contains("\x1b[?25h") || self.seen[..left].ends_with("\x1b[?25h")
        );
        (status, err)
    }
}

const NAMES: [&str; 3] = ["cam-live", "cam-replay", "batch-7"];

#[test]
fn in_a_terminal_it_shows_every_stream_and_quits_on_q_with_the_terminal_restored() {
    let owner = serve();
    let streams = drive(&owner.socket, &NAMES);
    let mut top = top_in_pty(&owner.socket);
    // Every stream on screen, with a measured interval (rates, busy shares).
    read_until(&top.master, &mut top.seen, |s| {
        NAMES.iter().all(|n| s.contains(n)) && s.contains("sample 2") && s.contains(" %")
    });
    // Keys without Enter and without echo while it runs.
    let during = termios::tcgetattr(&top.slave).unwrap();
    assert_eq!(keys(&during), (false, false));
    nix::unistd::write(&top.master, b"q").unwrap();
    let (status, err) = top.end();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let frames = streams.stop();
    assert!(frames.iter().all(|&f| f > 0), "{frames:?}");
}

#[test]
fn in_a_terminal_sigint_quits_and_an_owner_going_away_ends_it_with_why() {
    let mut owner = serve();
    let streams = drive(&owner.socket, &NAMES[..1]);
    // Ctrl-C (SIGINT): status 0, the terminal restored.
    let mut top = top_in_pty(&owner.socket);
    read_until(&top.master, &mut top.seen, |s| s.contains("sample 1"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(top.child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let (status, err) = top.end();
    assert!(status.success(), "{status}: {err}");
    // The owner stops while watched: non-zero, says why, the terminal restored.
    let mut top = top_in_pty(&owner.socket);
    read_until(&top.master, &mut top.seen, |s| s.contains("sample 1"));
    owner.stop();
    let (status, err) = top.end();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("went away"), "{err}");
    assert!(err.contains("start it again"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    streams.stop();
}

fn lines(out: &Output) -> Vec<Value> {
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(!text.contains('\x1b'), "no escape codes: {text}");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a count: {v}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("a number: {v}"))
}

fn stream<'a>(line: &'a Value, name: &str) -> &'a Value {
    line["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("stream {name} in {line}"))
}

#[test]
fn json_lines_carry_rates_shares_and_counters_that_only_grow() {
    let owner = serve();
    let streams = drive(&owner.socket, &NAMES[..2]);
    let out = Command::new(BIN)
        .args([
            "top",
            "--json",
            "--count",
            "3",
            "--interval",
            "0.3",
            "--socket",
        ])
        .arg(&owner.socket)
        .output()
        .unwrap();
    streams.stop();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = lines(&out);
    assert_eq!(lines.len(), 3, "{lines:?}");
    let mut last: Option<&Value> = None;
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(u(&l["sample"]), i as u64 + 1);
        let interval = f(&l["interval_s"]);
        assert!(interval > 0.15 && interval < 5.0, "{l}");
        assert_eq!(l["socket"], owner.socket.display().to_string());
        assert_eq!(l["sees_all"], true, "this test's uid is the owner's: {l}");
        let d = &l["device"];
        assert_eq!(d["counters"], true, "{d}");
        assert!(d["name"].as_str().is_some_and(|n| !n.is_empty()), "{d}");
        for unit in ["copy", "compute"] {
            let share = f(&d[unit]["busy_share"]);
            assert!((0.0..=1.0).contains(&share), "{unit}: {share}");
            assert!(f(&d[unit]["descriptors_per_s"]) > 0.0, "{unit}: {d}");
        }
        let o = &l["owner"];
        assert_eq!(u(&o["streams"]), 2);
        // The two streams' clients and this view.
        assert_eq!(u(&o["clients"]), 3);
        assert!(u(&o["mapped_bytes"]) >= 3 << 20, "{o}");
        assert!(f(&o["frames_per_s"]) > 0.0, "{o}");
        for name in &NAMES[..2] {
            let s = stream(l, name);
            assert!(f(&s["frames_per_s"]) > 0.0, "{s}");
            assert!(
                s["client_name"].as_str().is_some_and(|c| c.contains(name)),
                "{s}"
            );
            let (p50, p99, max) = (
                f(&s["latency_p50_ms"]),
                f(&s["latency_p99_ms"]),
                f(&s["latency_max_ms"]),
            );
            assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{s}");
        }
        let this: Vec<&Value> = l["clients"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["this_view"] == true)
            .collect();
        assert_eq!(this.len(), 1, "{l}");
        assert_eq!(this[0]["name"], "userdma top");
        assert_eq!(this[0]["client"], l["this_client"]);
        if let Some(p) = last {
            assert!(u(&o["frames"]) > u(&p["owner"]["frames"]));
            for unit in ["copy", "compute"] {
                for c in ["busy_ns", "descriptors"] {
                    assert!(
                        u(&d[unit][c]) > u(&p["device"][unit][c]),
                        "{unit}.{c} grows: {d} after {}",
                        p["device"]
                    );
                }
            }
            for name in &NAMES[..2] {
                assert!(u(&stream(l, name)["frames"]) > u(&stream(p, name)["frames"]));
            }
            assert!(f(&l["elapsed_s"]) > f(&p["elapsed_s"]));
        }
        last = Some(l);
    }
}

#[test]
fn wrapping_a_run_demo_streams_and_a_command() {
    // --demo 2: an owner of its own with two demo streams; stdout not a terminal: JSON.
    let out = Command::new(BIN)
        .args(["top", "--demo", "2", "--count", "2", "--interval", "0.3"])
        .args(["--cost", "zero", "--model", "small=chain:2:16384"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let samples = lines(&out);
    assert_eq!(samples.len(), 2);
    let socket = samples[0]["socket"].as_str().unwrap().to_owned();
    for l in &samples {
        for name in ["demo0", "demo1"] {
            assert!(f(&stream(l, name)["frames_per_s"]) > 0.0, "{l}");
        }
    }
    assert!(
        !Path::new(&socket).exists(),
        "the wrapped owner stopped and its socket went"
    );
    // A command: run with USERDMA_OWNER_SOCKET set to the wrapped owner's socket; top ends
    // when it does, with its status.
    let run = |script: &str| {
        Command::new(BIN)
            .args(["top", "--interval", "0.1", "--cost", "zero"])
            .args(["--model", "small=chain:2:16384", "--", "sh", "-c", script])
            .output()
            .unwrap()
    };
    let out = run("test -S \"$USERDMA_OWNER_SOCKET\" && sleep 0.3 && echo done");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Its output goes to stderr beside the JSON lines.
    assert!(err.contains("done"), "{err}");
    assert!(!lines(&out).is_empty());
    let out = run("exit 3");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("exit status: 3"), "{err}");
}

#[test]
fn bad_input_gets_a_clear_error_and_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let top = |args: &[&str], socket: &Path| {
        let out = Command::new(BIN)
            .arg("top")
            .args(args)
            .arg("--socket")
            .arg(socket)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!err.contains("panicked"), "{err}");
        (out.status.code(), err)
    };
    // Nothing there.
    let (code, err) = top(&["--count", "1"], &dir.path().join("none.sock"));
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no device owner at"), "{err}");
    assert!(err.contains("userdma serve --socket"), "{err}");
    // A stream socket: not an owner's.
    let path = dir.path().join("stream.sock");
    let _listener = UnixListener::bind(&path).unwrap();
    let (code, err) = top(&["--count", "1"], &path);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("is not a userdma device owner's socket"),
        "{err}"
    );
    // A packet socket that answers something else.
    let path = dir.path().join("other.sock");
    let server = seqpacket_answering(&path, b"HTTP/1.1 400 Bad Request\r\n");
    let (code, err) = top(&["--count", "1"], &path);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("is not a userdma device owner's socket"),
        "{err}"
    );
    assert!(err.contains("magic"), "{err}");
    server.join().unwrap();
    // An interval of 0, --cost without a run to wrap.
    let (code, err) = top(&["--interval", "0"], &path);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--interval 0.5"), "{err}");
    let (code, err) = top(&["--cost", "zero"], &path);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--demo"), "{err}");
}

/// A `SOCK_SEQPACKET` listener at `path` that answers its first peer's first packet with
/// `answer`.
fn seqpacket_answering(path: &Path, answer: &'static [u8]) -> JoinHandle<()> {
    use nix::sys::socket::{self, AddressFamily, Backlog, MsgFlags, SockFlag, SockType, UnixAddr};
    use std::os::fd::{AsRawFd, FromRawFd};
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    socket::bind(fd.as_raw_fd(), &UnixAddr::new(path).unwrap()).unwrap();
    socket::listen(&fd, Backlog::new(4).unwrap()).unwrap();
    std::thread::spawn(move || {
        let peer = socket::accept(fd.as_raw_fd()).unwrap();
        // SAFETY: accept returned a new descriptor owned by nothing else.
        let peer = unsafe { OwnedFd::from_raw_fd(peer) };
        let mut buf = [0u8; 512];
        let _ = socket::recv(peer.as_raw_fd(), &mut buf, MsgFlags::empty());
        let _ = socket::send(peer.as_raw_fd(), answer, MsgFlags::MSG_NOSIGNAL);
        // Held until the peer hangs up.
        let _ = socket::recv(peer.as_raw_fd(), &mut buf, MsgFlags::empty());
    })
}
