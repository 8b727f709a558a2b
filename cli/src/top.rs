//! `userdma top`: a live view of a device owner (`userdma serve`): per unit of its device the
//! busy share, descriptors and context switches per second; per stream frames per second,
//! latency (p50, p99, max) and its longest wait beside the bound the owner states; the
//! scheduler's switches per second; the pools mapped for the device and the frames out; the
//! clients.
//!
//! ```text
//! userdma top --socket /run/userdma/owner.sock        # attach to a running owner
//! userdma top --demo 3                                 # an owner of its own, three demo streams
//! userdma top -- ./my-app --camera 0                   # an owner of its own, a command's clients
//! userdma top --json --count 5 --interval 0.5          # JSON lines, for scripts
//! ```
//!
//! The view is a client of the owner ([`userdma_owner::Client`], named `userdma top`, with
//! the smallest pool the owner gives): every `--interval` it asks for stats and shows the
//! interval between two answers, timed by the owner's clock. The owner shows every client's
//! streams only to an administrator (uid 0 and its own user); anyone else sees their own
//! client, and the screen says so.
//!
//! On a terminal it redraws the alternate screen in place and quits on `q` (or Ctrl-C,
//! SIGTERM, `--count`); the terminal is put back on every way out. When stdout is not a
//! terminal, or with `--json`, it prints one JSON object per sample ([`sample::Sample`]),
//! no escape codes.

mod sample;
mod screen;
mod term;
mod wrap;

use nix::sys::signal::Signal;
use std::ffi::OsString;
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use userdma_owner::{Client, EventKind, Options, Stats};

use crate::exit;
use crate::serve::CostArg;

use self::sample::At;
use self::term::{Key, Terminal};
use self::wrap::{Plan, Wrapped};

/// How long an answer of the owner may take (it answers within one turn of its loop).
const ANSWER: Duration = Duration::from_secs(5);
/// How long a wrapped owner may take to listen.
const STARTUP: Duration = Duration::from_secs(30);
/// The longest step of a wait between samples (signals and the command's end are seen
/// within it).
const STEP: Duration = Duration::from_millis(50);

/// `userdma top`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TopArgs {
    /// The owner's socket (default: $USERDMA_OWNER_SOCKET or /run/userdma/owner.sock).
    #[arg(long, conflicts_with_all = ["demo", "command"])]
    socket: Option<PathBuf>,
    /// Seconds between samples (0.05 to 3600).
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = parse_interval)]
    interval: Duration,
    /// Stop after this many samples.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Start an owner of its own (`userdma serve` on a temporary socket) with N built-in
    /// streams (clients in this process, every result checked), show it, stop both on quit.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8))]
    demo: Option<u32>,
    /// The cost model of the owner top starts (--demo, or a COMMAND).
    #[arg(long, value_enum)]
    cost: Option<CostArg>,
    /// A model of the owner top starts, as `userdma serve --model` takes it (repeated;
    /// default: serve's).
    #[arg(long = "model", value_name = "NAME=SPEC")]
    models: Vec<String>,
    /// A command to run against an owner of top's own: started with USERDMA_OWNER_SOCKET set
    /// to its socket; top ends when it does, with its exit status.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    crate::parse_seconds_in(
        text,
        0.05..=3600.0,
        "give the seconds between samples, from 0.05 to 3600 (e.g. --interval 0.5)",
    )
}

/// What the view fails with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// Nothing listens at the socket.
    #[error(
        "no device owner at {path} (start one with `userdma serve --socket {path}`, give the \
         socket one listens on with --socket or USERDMA_OWNER_SOCKET, or let top start one: \
         `userdma top --demo 2`)"
    )]
    NoOwner {
        /// The socket's path.
        path: PathBuf,
        /// Why the connection failed.
        #[source]
        source: io::Error,
    },
    /// Something listens, and it is not an owner.
    #[error(
        "{path} is not a userdma device owner's socket (give the one `userdma serve` prints \
         in its `listening on` line)"
    )]
    NotOwner {
        /// The socket's path.
        path: PathBuf,
        /// What came instead of an owner's welcome.
        #[source]
        source: Box<userdma_owner::Error>,
    },
    /// The owner (or the socket file's mode) refused this view.
    #[error(
        "the owner at {path} refused this view (it admits the users its --allow-uid and \
         --allow-gid name, and the socket file's mode must let this user connect)"
    )]
    Refused {
        /// The socket's path.
        path: PathBuf,
        /// Its answer.
        #[source]
        source: Box<userdma_owner::Error>,
    },
    /// Connecting failed otherwise (mapping the pool the owner made for the view).
    #[error("connecting to the owner at {path}")]
    Connect {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<userdma_owner::Error>,
    },
    /// The owner went away while watched.
    #[error(
        "the device owner at {path} went away after {samples} samples ({why}): start it \
         again, then top"
    )]
    Gone {
        /// The socket's path.
        path: PathBuf,
        /// Samples shown.
        samples: u64,
        /// What was seen.
        why: String,
    },
    /// A stats request failed otherwise.
    #[error("asking the owner at {path} for its figures")]
    Stats {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<userdma_owner::Error>,
    },
    /// A process or thread of the wrapped run could not start.
    #[error("cannot start {what}")]
    Spawn {
        /// What.
        what: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The owner top started ended before or while it was watched.
    #[error("the owner top started (`userdma serve`) ended ({status}); it said: {log}")]
    WrappedOwner {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The end of what it wrote on stderr.
        log: String,
    },
    /// The wrapped command failed.
    #[error("the command `{command}` {status}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
    },
    /// A demo stream failed (a wrong result, the owner refusing it).
    #[error("demo streams failed: {0}")]
    Demo(String),
    /// The terminal could not be set up or read.
    #[error("the terminal: cannot {what}")]
    Terminal {
        /// What.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The signals that quit the view could not be caught.
    #[error("cannot catch SIGINT, SIGTERM and SIGHUP")]
    Signals(#[source] io::Error),
    /// Options that go together only with a wrapped run.
    #[error("{0}")]
    Usage(String),
    /// Writing the output failed (a reader that went away ends the view quietly).
    #[error("cannot write the output")]
    Output(#[source] io::Error),
    /// Encoding a sample as JSON failed.
    #[error("cannot encode a sample as JSON")]
    Json(#[source] serde_json::Error),
}

impl Error {
    /// The tool's exit code for it.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Error::NoOwner { .. } => exit::NOT_FOUND,
            Error::NotOwner { .. } | Error::Usage(_) => exit::USAGE,
            // Its options refused (`--model`): bad input too.
            Error::WrappedOwner { status, .. } if status.code() == Some(i32::from(exit::USAGE)) => {
                exit::USAGE
            }
            Error::Refused { .. } => exit::REFUSED,
            Error::Connect { .. }
            | Error::Gone { .. }
            | Error::Stats { .. }
            | Error::Spawn { .. }
            | Error::WrappedOwner { .. }
            | Error::Command { .. }
            | Error::Demo(_)
            | Error::Terminal { .. }
            | Error::Signals(_)
            | Error::Output(_)
            | Error::Json(_) => exit::FAILURE,
        }
    }
}

/// How the view shows samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Screen,
    Json,
}

pub(crate) fn run(args: &TopArgs, json: bool) -> Result<(), Error> {
    match run_view(args, json) {
        // The reader went away (`userdma top | head -3`): not an error.
        Err(Error::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

fn run_view(args: &TopArgs, json: bool) -> Result<(), Error> {
    let wraps = args.demo.is_some() || !args.command.is_empty();
    if !wraps && (args.cost.is_some() || !args.models.is_empty()) {
        return Err(Error::Usage(
            "--cost and --model set up the owner top starts: give them with --demo N or a \
             command after --"
                .into(),
        ));
    }
    let mode = if json || !io::stdout().is_terminal() {
        Mode::Json
    } else {
        Mode::Screen
    };
    crate::signals::catch(&[Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP])
        .map_err(|e| Error::Signals(e.into()))?;
    if !wraps {
        let socket = args
            .socket
            .clone()
            .unwrap_or_else(userdma_owner::client::default_socket);
        return view(args, &socket, mode, None);
    }
    let plan = Plan {
        demo: args.demo.unwrap_or(0),
        cost: args.cost.unwrap_or(CostArg::Npu),
        models: args.models.clone(),
        command: args.command.clone(),
        command_output_to_stderr: mode == Mode::Json,
    };
    let mut wrapped = Wrapped::start_owner(&plan)?;
    let socket = wrapped.socket().to_owned();
    let mut viewed = view(args, &socket, mode, Some((&mut wrapped, &plan)));
    if matches!(viewed, Err(Error::Gone { .. })) {
        // Its own owner went: what it said is the better answer.
        if let Err(e) = wrapped.check_owner() {
            viewed = Err(e);
        }
    }
    let ended = wrapped.stop();
    if let Some(output) = ended.output.as_deref().filter(|o| !o.is_empty()) {
        // What the command wrote while the screen was up.
        let mut out = io::stdout().lock();
        out.write_all(output.as_bytes())
            .and_then(|()| out.flush())
            .map_err(Error::Output)?;
    }
    viewed?;
    if !ended.demo_errors.is_empty() {
        return Err(Error::Demo(ended.demo_errors.join("; ")));
    }
    match ended.command {
        Some((command, status)) if !status.success() => Err(Error::Command { command, status }),
        _ => Ok(()),
    }
}

/// Connects, then samples until quit, `--count`, the wrapped command's end or an error.
fn view(
    args: &TopArgs,
    socket: &Path,
    mode: Mode,
    mut wrapped: Option<(&mut Wrapped, &Plan)>,
) -> Result<(), Error> {
    let mut client = connect(socket, wrapped.as_mut().map(|(w, _)| &mut **w))?;
    if let Some((w, plan)) = wrapped.as_mut() {
        w.start_load(plan)?;
    }
    let started = Instant::now();
    let this = client.id();
    let path = socket.display().to_string();
    let uid = nix::unistd::geteuid().as_raw();
    let mut shutdown = false;
    let mut before = ask(&mut client, socket, 0, &mut shutdown)?;
    let mut terminal = match mode {
        Mode::Screen => Some(Terminal::enter().map_err(|source| Error::Terminal {
            what: "switch it to the live view",
            source,
        })?),
        Mode::Json => None,
    };
    let at = |n| At {
        sample: n,
        elapsed_s: started.elapsed().as_secs_f64(),
        socket: &path,
        this_client: this,
    };
    let describe = wrapped.as_ref().map(|(w, _)| w.describe.clone());
    let draw = |terminal: &mut Option<Terminal>, s: &sample::Sample| -> Result<(), Error> {
        match terminal {
            Some(t) => {
                let frame = screen::Frame {
                    interval_s: args.interval.as_secs_f64(),
                    quit: if t.reads_keys() {
                        "q quits"
                    } else {
                        "Ctrl-C quits"
                    },
                    wrapped: describe.as_deref(),
                    uid,
                };
                t.draw(&screen::render(s, &frame)).map_err(Error::Output)?;
            }
            None => {
                let line = serde_json::to_string(s).map_err(Error::Json)?;
                let mut out = io::stdout().lock();
                writeln!(out, "{line}")
                    .and_then(|()| out.flush())
                    .map_err(Error::Output)?;
            }
        }
        Ok(())
    };
    if terminal.is_some() {
        draw(&mut terminal, &sample::sample(at(0), None, &before))?;
    }
    let mut next = Instant::now() + args.interval;
    for n in 1.. {
        let ended = match wait(
            next,
            terminal.as_mut(),
            wrapped.as_mut().map(|(w, _)| &mut **w),
        )? {
            Wake::Quit => return Ok(()),
            Wake::CommandEnded => true,
            Wake::Time => false,
        };
        let now = ask(&mut client, socket, n - 1, &mut shutdown)?;
        next += args.interval;
        // A slow answer: the next sample an interval from now, not a burst.
        if next < Instant::now() {
            next = Instant::now() + args.interval;
        }
        draw(&mut terminal, &sample::sample(at(n), Some(&before), &now))?;
        before = now;
        if args.count == Some(n) || ended {
            return Ok(());
        }
    }
    Ok(())
}

/// Why a wait between samples ended.
enum Wake {
    Time,
    Quit,
    CommandEnded,
}

/// Waits until `deadline`, watching keys, signals and the wrapped run.
fn wait(
    deadline: Instant,
    mut terminal: Option<&mut Terminal>,
    mut wrapped: Option<&mut Wrapped>,
) -> Result<Wake, Error> {
    loop {
        if crate::signals::stopped() {
            return Ok(Wake::Quit);
        }
        if let Some(w) = wrapped.as_deref_mut() {
            if w.command_ended() {
                return Ok(Wake::CommandEnded);
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Wake::Time);
        }
        let step = left.min(STEP);
        match terminal.as_deref_mut() {
            Some(t) => {
                let key = t.key(step).map_err(|source| Error::Terminal {
                    what: "read a key",
                    source,
                })?;
                if key == Key::Quit {
                    return Ok(Wake::Quit);
                }
            }
            None => std::thread::sleep(step),
        }
    }
}

/// Connects as a client named `userdma top` (the smallest pool); a wrapped owner is waited
/// for until it listens.
fn connect(socket: &Path, mut wrapped: Option<&mut Wrapped>) -> Result<Client, Error> {
    let options = Options {
        pool_bytes: 1 << 20,
        name: "userdma top".into(),
    };
    let deadline = Instant::now() + STARTUP;
    loop {
        let e = match Client::connect_timeout(socket, &options, ANSWER) {
            Ok(c) => return Ok(c),
            Err(e) => e,
        };
        if let Some(w) = wrapped.as_deref_mut() {
            w.check_owner()?;
            if matches!(e, userdma_owner::Error::Connect { .. }) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        }
        return Err(classify(socket, e));
    }
}

/// What a failed connection means for the view.
fn classify(socket: &Path, e: userdma_owner::Error) -> Error {
    use userdma_owner::Error as E;
    let path = socket.to_owned();
    match e {
        E::Connect { source, .. } => match source.raw_os_error() {
            // A socket of another type (a stream socket), or not a socket at all.
            Some(libc::EPROTOTYPE | libc::ENOTSOCK) => Error::NotOwner {
                path,
                source: Box::new(E::Connect {
                    path: socket.to_owned(),
                    source,
                }),
            },
            Some(libc::EACCES | libc::EPERM) => Error::Refused {
                path,
                source: Box::new(E::Connect {
                    path: socket.to_owned(),
                    source,
                }),
            },
            _ => Error::NoOwner { path, source },
        },
        E::Owner { .. } => Error::Refused {
            path,
            source: Box::new(e),
        },
        E::Proto(_) | E::Unexpected { .. } | E::Timeout(_) | E::Gone { .. } | E::Share(_) => {
            Error::NotOwner {
                path,
                source: Box::new(e),
            }
        }
        other => Error::Connect {
            path,
            source: Box::new(other),
        },
    }
}

/// One stats answer; the owner leaving becomes [`Error::Gone`] (saying so if it announced
/// its shutdown).
fn ask(
    client: &mut Client,
    socket: &Path,
    samples: u64,
    shutdown: &mut bool,
) -> Result<Stats, Error> {
    // Events arrive between answers: a shutdown announced says why the owner went.
    if let Ok(events) = client.events() {
        *shutdown |= events.iter().any(|e| e.kind == EventKind::Shutdown);
    }
    match client.stats() {
        Ok(s) => Ok(s),
        Err(userdma_owner::Error::Gone { why }) => Err(Error::Gone {
            path: socket.to_owned(),
            samples,
            why: if *shutdown
                || client
                    .events()
                    .is_ok_and(|e| e.iter().any(|e| e.kind == EventKind::Shutdown))
            {
                "it shut down".into()
            } else {
                why.into()
            },
        }),
        Err(source) => Err(Error::Stats {
            path: socket.to_owned(),
            source: Box::new(source),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_is_a_positive_number_of_seconds_in_range() {
        assert_eq!(parse_interval("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("1"), Ok(Duration::from_secs(1)));
        for bad in ["0", "-1", "0.01", "nan", "inf", "x", "7200"] {
            let e = parse_interval(bad).unwrap_err();
            assert!(e.contains("--interval 0.5"), "{bad}: {e}");
        }
    }

    #[test]
    fn connection_failures_say_what_is_at_the_socket() {
        let p = Path::new("/x.sock");
        let connect = |errno| userdma_owner::Error::Connect {
            path: p.to_owned(),
            source: io::Error::from_raw_os_error(errno),
        };
        assert!(matches!(
            classify(p, connect(libc::ENOENT)),
            Error::NoOwner { .. }
        ));
        assert!(matches!(
            classify(p, connect(libc::ECONNREFUSED)),
            Error::NoOwner { .. }
        ));
        assert!(matches!(
            classify(p, connect(libc::EPROTOTYPE)),
            Error::NotOwner { .. }
        ));
        assert!(matches!(
            classify(p, connect(libc::EACCES)),
            Error::Refused { .. }
        ));
        let magic = userdma_owner::proto::ProtoError::Magic { found: 1 };
        let e = classify(p, userdma_owner::Error::Proto(magic));
        assert_eq!(e.exit_code(), exit::USAGE);
        let e = classify(p, connect(libc::ENOENT));
        assert_eq!(e.exit_code(), exit::NOT_FOUND);
        assert!(
            e.to_string().contains("userdma serve --socket /x.sock"),
            "{e}"
        );
    }
}
