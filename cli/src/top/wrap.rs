//! A run the live view wraps: a device owner of its own (`userdma serve`, this binary, a
//! child process on a socket in a temporary directory), the built-in demo streams (threads
//! of this process, each a client of its own with its own connection and pool, every result
//! checked), and a command of the user's (a child process, its `USERDMA_OWNER_SOCKET` set to
//! the owner's socket, so a client that connects to `client::default_socket()` finds it).
//!
//! Stopping goes in the order that loses nothing: the demo streams close, the command gets
//! SIGTERM (SIGKILL after 5 s), then the owner gets SIGTERM and lets the frames on the
//! device finish (SIGKILL after 20 s). The children are in process groups of their own (a
//! Ctrl-C at the terminal reaches the view only, which stops them in that order) and get
//! SIGTERM if the view dies first.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use userdma_infer::pipeline::Model;
use userdma_owner::{chan, Client, Options, StreamDecl};

use super::Error;
use crate::serve::CostArg;

/// The model the demo streams run, as the wrapped owner is told it.
const DEMO_MODEL: &str = "top-demo";
const DEMO_SPEC: (u32, u64) = (2, 16384);
/// The owner's models when the user names none: `userdma serve`'s defaults.
const SERVE_DEFAULTS: [&str; 2] = ["yolov5s=yolov5s", "chain=chain:2:16384"];
/// How long the wrapped owner may take to stop.
const OWNER_STOP: Duration = Duration::from_secs(20);
/// How long the command may take to go after SIGTERM.
const COMMAND_STOP: Duration = Duration::from_secs(5);
/// How much of the command's output is shown after the screen closes.
const OUTPUT_TAIL: u64 = 64 << 10;

/// What the view wraps.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Demo streams (0: none).
    pub(crate) demo: u32,
    /// The wrapped owner's cost model.
    pub(crate) cost: CostArg,
    /// Its models, `NAME=SPEC` as `userdma serve --model` takes them (empty: serve's).
    pub(crate) models: Vec<String>,
    /// The command and its arguments (empty: none).
    pub(crate) command: Vec<OsString>,
    /// The command's standard output goes to the view's standard error (JSON lines on
    /// stdout), else to a file shown when the view ends.
    pub(crate) command_output_to_stderr: bool,
}

/// The wrapped run, started.
#[derive(Debug)]
pub(crate) struct Wrapped {
    dir: PathBuf,
    socket: PathBuf,
    owner: Option<Child>,
    owner_log: PathBuf,
    command: Option<Child>,
    command_text: String,
    command_log: Option<PathBuf>,
    command_status: Option<ExitStatus>,
    demo: Vec<JoinHandle<Result<u64, String>>>,
    demo_stop: Arc<AtomicBool>,
    /// The line the screen shows about the run.
    pub(crate) describe: String,
}

/// How the wrapped run ended.
#[derive(Debug)]
pub(crate) struct Ended {
    /// The command's text and exit status, if it ended by itself (not stopped by top).
    pub(crate) command: Option<(String, ExitStatus)>,
    /// What the command wrote (when it went to a file), the last 64 KiB.
    pub(crate) output: Option<String>,
    /// Errors of the demo streams.
    pub(crate) demo_errors: Vec<String>,
}

impl Wrapped {
    /// Starts the owner (the view's connection waits until it listens; then
    /// [`Wrapped::start_load`] starts the demo streams and the command).
    ///
    /// # Errors
    /// [`Error::Spawn`] when a process cannot be started.
    pub(crate) fn start_owner(plan: &Plan) -> Result<Wrapped, Error> {
        let dir = std::env::temp_dir().join(format!("userdma-top-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|source| Error::Spawn {
            what: format!("a temporary directory {}", dir.display()),
            source,
        })?;
        let socket = dir.join("owner.sock");
        let owner_log = dir.join("owner.log");
        let exe = std::env::current_exe().map_err(|source| Error::Spawn {
            what: "the owner (this program's path)".into(),
            source,
        })?;
        let mut models: Vec<String> = if plan.models.is_empty() {
            SERVE_DEFAULTS.iter().map(|m| (*m).to_owned()).collect()
        } else {
            plan.models.clone()
        };
        if plan.demo > 0 {
            models.push(format!(
                "{DEMO_MODEL}=chain:{}:{}",
                DEMO_SPEC.0, DEMO_SPEC.1
            ));
        }
        let log = File::create(&owner_log).map_err(|source| Error::Spawn {
            what: format!("the owner's log {}", owner_log.display()),
            source,
        })?;
        let mut cmd = Command::new(exe);
        cmd.arg("serve")
            .arg("--socket")
            .arg(&socket)
            .arg("--cost")
            .arg(match plan.cost {
                CostArg::Npu => "npu",
                CostArg::Zero => "zero",
            });
        for m in &models {
            cmd.arg("--model").arg(m);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        own_group_and_die_with_us(&mut cmd);
        let owner = cmd.spawn().map_err(|source| Error::Spawn {
            what: "the owner (`userdma serve`)".into(),
            source,
        })?;
        let describe = format!(
            "wrapping `userdma serve` (pid {}, cost {}, models {})",
            owner.id(),
            match plan.cost {
                CostArg::Npu => "npu",
                CostArg::Zero => "zero",
            },
            models
                .iter()
                .map(|m| m.split('=').next().unwrap_or(m))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(Wrapped {
            dir,
            socket,
            owner: Some(owner),
            owner_log,
            command: None,
            command_text: String::new(),
            command_log: None,
            command_status: None,
            demo: Vec::new(),
            demo_stop: Arc::new(AtomicBool::new(false)),
            describe,
        })
    }

    /// The owner's socket.
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// `Err` when the owner has ended: its status and what it wrote on stderr.
    pub(crate) fn check_owner(&mut self) -> Result<(), Error> {
        let Some(owner) = self.owner.as_mut() else {
            return Ok(());
        };
        match owner.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::WrappedOwner {
                status,
                log: tail(&self.owner_log, 4096)
                    .map(|t| t.trim().to_owned())
                    .unwrap_or_default(),
            }),
            Err(source) => Err(Error::Spawn {
                what: "the owner's status".into(),
                source,
            }),
        }
    }

    /// Starts the demo streams and the command (the owner listens).
    ///
    /// # Errors
    /// [`Error::Spawn`] when the command cannot be started.
    pub(crate) fn start_load(&mut self, plan: &Plan) -> Result<(), Error> {
        for i in 0..plan.demo {
            let (socket, stop) = (self.socket.clone(), Arc::clone(&self.demo_stop));
            let handle = std::thread::Builder::new()
                .name(format!("demo{i}"))
                .spawn(move || demo_stream(&socket, i, &stop))
                .map_err(|source| Error::Spawn {
                    what: format!("demo stream {i}"),
                    source,
                })?;
            self.demo.push(handle);
        }
        if plan.demo > 0 {
            self.describe.push_str(&format!(
                " · {} demo streams, {} to {} frames/s",
                plan.demo,
                fps(0),
                fps(plan.demo - 1)
            ));
        }
        if let Some((program, args)) = plan.command.split_first() {
            let text = plan
                .command
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ");
            let mut cmd = Command::new(program);
            cmd.args(args)
                .env("USERDMA_OWNER_SOCKET", &self.socket)
                .stdin(Stdio::null());
            if plan.command_output_to_stderr {
                let err = io::stderr()
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|source| Error::Spawn {
                        what: "the command's output (standard error)".into(),
                        source,
                    })?;
                cmd.stdout(Stdio::from(err));
            } else {
                let path = self.dir.join("command.log");
                let log = File::create(&path).map_err(|source| Error::Spawn {
                    what: format!("the command's log {}", path.display()),
                    source,
                })?;
                let log2 = log.try_clone().map_err(|source| Error::Spawn {
                    what: format!("the command's log {}", path.display()),
                    source,
                })?;
                cmd.stdout(log).stderr(log2);
                self.command_log = Some(path);
            }
            own_group_and_die_with_us(&mut cmd);
            let child = cmd.spawn().map_err(|source| Error::Spawn {
                what: format!("the command `{text}`"),
                source,
            })?;
            self.describe
                .push_str(&format!(" · command `{text}` (pid {})", child.id()));
            self.command_text = text;
            self.command = Some(child);
        }
        Ok(())
    }

    /// Whether the command has ended (it ran, and is done).
    pub(crate) fn command_ended(&mut self) -> bool {
        if self.command_status.is_some() {
            return true;
        }
        let Some(child) = self.command.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(Some(status)) => {
                self.command_status = Some(status);
                true
            }
            _ => false,
        }
    }

    /// Stops everything in order; says how the command ended and what it wrote.
    pub(crate) fn stop(mut self) -> Ended {
        self.demo_stop.store(true, Ordering::Relaxed);
        let demo_errors = self
            .demo
            .drain(..)
            .filter_map(|h| match h.join() {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some("a demo stream panicked".into()),
            })
            .collect();
        let command = self.command.take().and_then(|mut child| {
            // Ended by itself before the view stopped: its status is the run's. Still
            // running: the view was quit, and the command stopped with it.
            match self.command_status {
                Some(status) => Some((std::mem::take(&mut self.command_text), status)),
                None => {
                    end(&mut child, COMMAND_STOP);
                    None
                }
            }
        });
        if let Some(mut owner) = self.owner.take() {
            end(&mut owner, OWNER_STOP);
        }
        let output = self
            .command_log
            .as_deref()
            .and_then(|p| tail(p, OUTPUT_TAIL));
        Ended {
            command,
            output,
            demo_errors,
        }
    }
}

impl Drop for Wrapped {
    fn drop(&mut self) {
        // After `stop`, nothing is left but the directory; on an early error, the children go
        // too.
        self.demo_stop.store(true, Ordering::Relaxed);
        for h in self.demo.drain(..) {
            let _ = h.join();
        }
        if let Some(mut c) = self.command.take() {
            end(&mut c, COMMAND_STOP);
        }
        if let Some(mut o) = self.owner.take() {
            end(&mut o, OWNER_STOP);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Puts the child in a process group of its own and has it get SIGTERM when this process
/// dies.
fn own_group_and_die_with_us(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: the closure runs in the child between fork and exec; it calls only prctl(2),
    // which is async-signal-safe, and touches no memory the parent's other threads could
    // have left inconsistent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Ends `child` (its process group): SIGTERM, then SIGKILL after `patience`; its status.
fn end(child: &mut Child, patience: Duration) -> ExitStatus {
    use nix::sys::signal::{killpg, Signal};
    use nix::unistd::Pid;
    if let Ok(Some(status)) = child.try_wait() {
        return status;
    }
    let group = Pid::from_raw(child.id() as i32);
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = killpg(group, Signal::SIGKILL);
    let _ = child.kill();
    child.wait().unwrap_or_else(|_| {
        // Waited for already, or not ours: report a kill.
        std::os::unix::process::ExitStatusExt::from_raw(libc::SIGKILL)
    })
}

/// The last `bytes` of the file at `path`, as text.
fn tail(path: &Path, bytes: u64) -> Option<String> {
    let mut f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(bytes))).ok()?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Demo stream `i`'s rate: 200 frames/s, halved for each stream after the first.
fn fps(i: u32) -> u32 {
    (200u32 >> i.min(7)).max(1)
}

/// One demo stream: a client of its own, frames at its rate (two buffers), every result
/// checked against the model on the host, until `stop` or the owner goes. Returns its
/// frames.
fn demo_stream(socket: &Path, i: u32, stop: &AtomicBool) -> Result<u64, String> {
    let name = format!("demo{i}");
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("{name}: {what}: {e}");
    let model = Model::chain(DEMO_SPEC.0, DEMO_SPEC.1).map_err(|e| fail("its model", &e))?;
    let options = Options {
        pool_bytes: 2 << 20,
        name: name.clone(),
    };
    let mut client = Client::connect_timeout(socket, &options, Duration::from_secs(10))
        .map_err(|e| fail("connect", &e))?;
    let period = Duration::from_secs(1) / fps(i);
    // The first stream first: priorities from N-1 down.
    let decl = StreamDecl::new(&name, DEMO_MODEL)
        .priority(u8::try_from(8 - i.min(8)).unwrap_or(0))
        .period(period);
    let stream = client.declare(&decl).map_err(|e| fail("declare", &e))?;
    let pool = Arc::clone(client.pool());
    let alloc = |n: u64| pool.alloc(n as usize).map_err(|e| fail("a buffer", &e));
    let inputs = [alloc(stream.input_bytes)?, alloc(stream.input_bytes)?];
    let results = [alloc(stream.result_bytes)?, alloc(stream.result_bytes)?];
    // Four input patterns, their results computed once.
    let patterns: Vec<Vec<u8>> = (0..4u8)
        .map(|p| {
            (0..stream.input_bytes)
                .map(|k| (k as u8).wrapping_mul(31) ^ p.wrapping_mul(17).wrapping_add(i as u8))
                .collect()
        })
        .collect();
    let expected: Vec<Vec<u8>> = patterns.iter().map(|p| model.expected(p)).collect();
    let mut got = vec![0u8; stream.result_bytes as usize];
    let mut pattern_of = [0usize; 2];
    let mut free = vec![0usize, 1];
    let (mut n, mut done) = (0u64, 0u64);
    let mut next = Instant::now();
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if Instant::now() >= next {
            if let Some(b) = free.pop() {
                let p = (n % 4) as usize;
                inputs[b]
                    .write(0, &patterns[p])
                    .map_err(|e| fail("an input", &e))?;
                match client.submit(&stream, &inputs[b], &results[b], b as u64) {
                    Ok(()) => {}
                    Err(userdma_owner::Error::Gone { .. }) => break,
                    Err(e) => return Err(fail("submit", &e)),
                }
                pattern_of[b] = p;
                n += 1;
                next += period;
                // Behind by more than a period (a slow host): the rate, not a burst.
                let now = Instant::now();
                if next + period < now {
                    next = now;
                }
                continue;
            }
        }
        let wait = next
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_micros(100), Duration::from_millis(50));
        let c = match client.wait(Some(wait)) {
            Ok(c) => c,
            Err(userdma_owner::Error::Timeout(_)) => continue,
            Err(userdma_owner::Error::Gone { .. }) => break,
            Err(e) => return Err(fail("wait", &e)),
        };
        let b = usize::try_from(c.tag).unwrap_or(usize::MAX);
        if b > 1 || free.contains(&b) {
            return Err(format!("{name}: a completion with tag {} not out", c.tag));
        }
        free.push(b);
        match c.status {
            chan::STATUS_OK => {
                results[b]
                    .read(0, &mut got)
                    .map_err(|e| fail("a result", &e))?;
                if got != expected[pattern_of[b]] {
                    return Err(format!("{name}: frame {done}: a wrong result"));
                }
                done += 1;
            }
            // The owner stopping or the device reset: not this stream's fault.
            chan::STATUS_CLOSED | chan::STATUS_LOST | chan::STATUS_REMOVED => {}
            other => return Err(format!("{name}: a frame completed with status {other}")),
        }
    }
    // Its frames out taken back before it hangs up (the owner counts it as left, not
    // vanished), as long as the owner is there to finish them.
    while free.len() < 2 {
        match client.wait(Some(Duration::from_secs(1))) {
            Ok(c) => free.push(usize::try_from(c.tag).unwrap_or(0)),
            Err(_) => break,
        }
    }
    Ok(done)
}
