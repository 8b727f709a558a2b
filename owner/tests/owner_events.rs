//! The owner's `tracing` events (the `tracing` feature; docs/tracing-events.md), caught by a
//! subscriber of the test's own (tests/common/capture.rs at the repository root) while the
//! owner runs on this test's thread and clients connect from others: a client connected and
//! left, one closed for a bad message with what it was told, one refused at the door with its
//! uid.
//!
//! `cargo test -p userdma-owner --features server,tracing --test owner_events`

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr};
use userdma::Runtime;
use userdma_infer::accel::{Accelerator, LoopbackEngine};
use userdma_infer::pipeline::{Config as PipelineConfig, Model};
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};
use userdma_owner::proto::OwnerFigures;
use userdma_owner::server::{Access, Config, Entry, Owner};
use userdma_owner::{Client, Options};

#[path = "../../tests/common/capture.rs"]
mod capture;

use capture::{Capture, Fields};

const WAIT: Duration = Duration::from_secs(20);

/// A socket path in a fresh directory.
fn tmp_socket() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("owner.sock");
    (dir, path)
}

/// Runs an owner on `socket` (its config changed by `tweak`) on this thread while `clients`
/// runs on another, until `clients` returns and `done` says the owner has seen it all.
fn serve(
    socket: &Path,
    tweak: impl FnOnce(Config) -> Config,
    clients: impl FnOnce(PathBuf) + Send + 'static,
    done: impl Fn(&OwnerFigures) -> bool,
) {
    let rt = Runtime::loopback(loopback::Config::default().cost(Cost::zero()).queues(4))
        .expect("loopback device");
    let engine: Arc<dyn Accelerator> = Arc::new(LoopbackEngine::new(&rt).expect("an engine"));
    let config = Config::new(socket).model(Entry {
        name: "chain".into(),
        model: Model::chain(2, 4 << 10).expect("a model"),
        pipeline: PipelineConfig::default(),
    });
    let mut owner = Owner::bind(engine, tweak(config)).expect("bind");
    let path = socket.to_owned();
    let thread = std::thread::spawn(move || clients(path));
    let deadline = Instant::now() + WAIT;
    while !(thread.is_finished() && done(&owner.figures())) {
        assert!(Instant::now() < deadline, "{:?}", owner.figures());
        owner.turn(Duration::from_millis(5)).expect("a turn");
    }
    thread.join().expect("the clients' thread");
}

#[test]
fn clients_connecting_leaving_and_closed_are_reported() {
    let (_dir, socket) = tmp_socket();
    let ((), capture) = Capture::run(|| {
        serve(
            &socket,
            |c| c,
            |path| {
                let options = Options {
                    name: "events".into(),
                    ..Options::default()
                };
                let client = Client::connect(&path, &options).expect("connect");
                drop(client);
                // A message that is none: an error, then the end of the connection.
                let fd = socket::socket(
                    AddressFamily::Unix,
                    SockType::SeqPacket,
                    SockFlag::SOCK_CLOEXEC,
                    None,
                )
                .expect("a socket");
                socket::connect(fd.as_raw_fd(), &UnixAddr::new(&path).expect("an address"))
                    .expect("connect");
                socket::send(fd.as_raw_fd(), b"not a message", MsgFlags::empty()).expect("send");
                let mut buf = [0u8; 512];
                while socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).expect("recv") > 0 {
                }
            },
            |f| f.left == 1 && f.closed == 1,
        )
    });
    let me = nix::unistd::geteuid().as_raw().to_string();
    let connected = capture.events_saying("client connected");
    assert_eq!(connected.len(), 1, "{:#?}", capture.events());
    assert_eq!(connected[0].level, tracing::Level::INFO);
    assert_eq!(connected[0].field("name"), Some("events"));
    assert_eq!(connected[0].field("uid"), Some(me.as_str()));
    assert_eq!(
        connected[0].field("pid"),
        Some(std::process::id().to_string().as_str())
    );
    assert!(connected[0].target.starts_with("userdma_owner::server"));
    let left = capture.events_saying("client left");
    assert_eq!(left.len(), 1, "{:#?}", capture.events());
    assert_eq!(left[0].field("name"), Some("events"));
    assert_eq!(left[0].field("client"), connected[0].field("client"));
    let closed = capture.events_saying("client closed");
    assert_eq!(closed.len(), 1, "{:#?}", capture.events());
    assert_eq!(closed[0].level, tracing::Level::WARN);
    let why = closed[0].field("why").unwrap_or_default();
    assert!(!why.is_empty(), "{:#?}", closed[0]);
}

#[test]
fn a_client_refused_at_the_door_is_reported_with_its_uid() {
    let (_dir, socket) = tmp_socket();
    let me = nix::unistd::geteuid().as_raw();
    let ((), capture) = Capture::run(|| {
        serve(
            &socket,
            move |mut c| {
                c.access = Access {
                    uids: vec![me.wrapping_add(12345)],
                    gids: vec![],
                };
                c
            },
            |path| {
                let err = Client::connect(&path, &Options::default()).unwrap_err();
                assert_eq!(err.code(), userdma::Code::Refused, "{err}");
            },
            |f| f.refused == 1,
        )
    });
    let refused = capture.events_saying("client refused: its uid and gid are not allowed");
    assert_eq!(refused.len(), 1, "{:#?}", capture.events());
    assert_eq!(refused[0].level, tracing::Level::WARN);
    assert_eq!(refused[0].field("uid"), Some(me.to_string().as_str()));
    assert!(capture.events_saying("client connected").is_empty());
}
