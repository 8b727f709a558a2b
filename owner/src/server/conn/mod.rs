//! Connections: the door (`SO_PEERCRED` against the allow-list), the welcome (a pool and
//! rings of the client's own), control messages (streams declared and closed, stats), and
//! closing a client, whether it asked, misbehaved or vanished.

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::socket::{self, sockopt, MsgFlags, SockFlag};
use userdma::fence::Fence;
use userdma::memory::{PageSize, Region};
use userdma::pool::{self, Pool};
use userdma::share::{self, Item};
use userdma::Code;
use userdma_infer::pipeline::{Pipeline, Results};

use super::{OStream, Owner};
use crate::chan::{self, Rings};
use crate::proto::{self, ClientFigures, EventKind, Msg, Name, StreamFigures, MAX_MESSAGE};

mod welcome;

/// How long a connected peer has to say hello.
const GREETING: Duration = Duration::from_secs(5);
/// The least pool a client gets.
const MIN_POOL: u64 = 1 << 20;

/// A client's connection.
#[derive(Debug)]
pub struct Conn {
    pub(super) id: u64,
    socket: OwnedFd,
    pid: u32,
    uid: u32,
    name: String,
    greeting_until: Instant,
    pub(super) ready: Option<Ready>,
    /// Refused at the door: told this in answer to its hello (answering before its hello
    /// arrived would close the socket with the hello unread, which resets the connection and
    /// loses the answer), then closed.
    refusal: Option<Msg>,
}

/// A client past its welcome.
#[derive(Debug)]
pub(super) struct Ready {
    pub(super) pool: Arc<Pool>,
    pub(super) shared: Shared,
    pub(super) sq_head: u64,
    pub(super) cq_tail: u64,
    owner_bell: Fence,
    client_bell: Fence,
    pub(super) in_flight: u32,
    pub(super) frames: u64,
    next_stream: u32,
    pub(super) streams: u32,
}

/// A client's rings' memory, as the owner maps it.
#[derive(Debug)]
pub(super) struct Shared {
    /// Held: `words` points into its mapping.
    _region: Arc<Region>,
    words: NonNull<AtomicU64>,
    len: usize,
    sq: u32,
    cq: u32,
}

// SAFETY: `words` points into `region`, held for the struct's life; the words are atomics any
// thread may touch.
unsafe impl Send for Shared {}

impl Shared {
    /// The rings. The owner laid them out and keeps their sizes: what a client writes into
    /// the header changes nothing here.
    pub(super) fn rings(&self) -> Rings<'_> {
        // SAFETY: `words` is the start of `region`'s mapping (page-aligned, so aligned for
        // `AtomicU64`), `len` words long, mapped as long as `self` holds the region; both
        // processes touch the words only as atomics, valid for any bytes.
        let words = unsafe { std::slice::from_raw_parts(self.words.as_ptr(), self.len) };
        Rings::trusted(words, self.sq, self.cq)
    }
}

impl Ready {
    pub(super) fn rings(&self) -> Rings<'_> {
        self.shared.rings()
    }

    /// Rings the client's doorbell if it sleeps.
    pub(super) fn wake_client(&self) {
        if self.rings().client_needs_wake() {
            let _ = self.client_bell.signal();
        }
    }
}

impl Conn {
    pub(super) fn socket_fd(&self) -> i32 {
        self.socket.as_raw_fd()
    }

    pub(super) fn bell_fd(&self) -> Option<i32> {
        self.ready.as_ref().map(|r| r.owner_bell.fd().as_raw_fd())
    }

    /// Marks the owner idle in this client's rings; whether a submission is already there.
    pub(super) fn go_idle(&self) -> bool {
        self.ready
            .as_ref()
            .is_some_and(|r| r.rings().owner_idle(r.sq_head))
    }

    /// Whether a submission waits in this client's ring (a hint, for spinning).
    pub(super) fn submission_waiting(&self) -> bool {
        self.ready
            .as_ref()
            .is_some_and(|r| r.rings().submission_waiting(r.sq_head))
    }

    pub(super) fn awake(&self) {
        if let Some(r) = &self.ready {
            r.rings().owner_awake();
        }
    }

    pub(super) fn drain_bell(&self) {
        if let Some(r) = &self.ready {
            crate::client::drain(&r.owner_bell);
        }
    }

    pub(super) fn pool_bytes(&self) -> u64 {
        self.ready
            .as_ref()
            .map_or(0, |r| r.pool.mapping().len() as u64)
    }

    pub(super) fn ready_mut(&mut self) -> Option<&mut Ready> {
        self.ready.as_mut()
    }

    /// Sends `msg` without blocking; `false` when the client cannot take it (gone, or not
    /// reading its socket).
    pub(super) fn send(&self, msg: &Msg) -> bool {
        let mut buf = [0u8; MAX_MESSAGE];
        let n = proto::encode(msg, &mut buf);
        socket::send(
            self.socket.as_raw_fd(),
            &buf[..n],
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        )
        .is_ok()
    }

    pub(super) fn event(&self, kind: EventKind, detail: u64) {
        let _ = self.send(&Msg::Event { kind, detail });
    }

    pub(super) fn figures(&self, streams: u32) -> ClientFigures {
        ClientFigures {
            client: self.id,
            pid: self.pid,
            uid: self.uid,
            name: Name::lossy(&self.name),
            streams,
            in_flight: self.ready.as_ref().map_or(0, |r| r.in_flight),
            frames: self.ready.as_ref().map_or(0, |r| r.frames),
            pool_bytes: self.pool_bytes(),
        }
    }
}

/// How a connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// It hung up (exited, crashed, was killed).
    Vanished,
    /// It broke the protocol or its rings: told why, then closed.
    Misbehaved,
    /// Refused at the door (counted there).
    Refused,
}

impl Owner {
    /// Accepts every waiting connection: a peer not allowed is told and closed.
    pub(super) fn accept(&mut self) -> Result<(), super::Error> {
        loop {
            let fd = match socket::accept4(
                self.listener.as_raw_fd(),
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            ) {
                Ok(fd) => fd,
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => return Ok(()),
                // A peer that went before it was accepted, or descriptors exhausted for now:
                // the next turn tries again.
                Err(
                    nix::errno::Errno::ECONNABORTED
                    | nix::errno::Errno::EMFILE
                    | nix::errno::Errno::ENFILE
                    | nix::errno::Errno::ENOBUFS
                    | nix::errno::Errno::ENOMEM
                    | nix::errno::Errno::EPROTO,
                ) => return Ok(()),
                Err(e) => {
                    return Err(super::Error::Io {
                        what: "accept",
                        source: e.into(),
                    })
                }
            };
            // SAFETY: accept4 returned a new descriptor owned by nothing else.
            let socket = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            let Ok(cred) = socket::getsockopt(&socket, sockopt::PeerCredentials) else {
                self.figures.refused += 1;
                continue;
            };
            let (pid, uid, gid) = (cred.pid() as u32, cred.uid(), cred.gid());
            let mut conn = Conn {
                id: self.next_client,
                socket,
                pid,
                uid,
                name: String::new(),
                greeting_until: Instant::now() + GREETING,
                ready: None,
                refusal: None,
            };
            let live = self
                .conns
                .iter()
                .flatten()
                .filter(|c| c.refusal.is_none())
                .count();
            if !self.config.access.allows(uid, gid) {
                self.figures.refused += 1;
                #[cfg(feature = "tracing")]
                tracing::warn!(
                    pid,
                    uid,
                    gid,
                    "client refused: its uid and gid are not allowed"
                );
                conn.refusal = Some(error(
                    Code::Refused,
                    true,
                    format!(
                        "uid {uid} (gid {gid}) may not use this device: its owner allows uids \
                         {:?} and gids {:?} (userdma serve --allow-uid / --allow-gid)",
                        self.config.access.uids, self.config.access.gids
                    ),
                ));
            } else if live >= self.config.limits.clients as usize {
                self.figures.refused += 1;
                #[cfg(feature = "tracing")]
                tracing::warn!(pid, uid, live, "client refused: the owner serves its limit");
                conn.refusal = Some(error(
                    Code::Busy,
                    true,
                    format!(
                        "the owner serves its limit of {live} clients: try again when one \
                         leaves, or raise --max-clients"
                    ),
                ));
            }
            self.next_client += 1;
            conn.name = format!("pid{pid}");
            match self.conns.iter().position(Option::is_none) {
                Some(slot) => self.conns[slot] = Some(conn),
                None => self.conns.push(Some(conn)),
            }
        }
    }

    /// Reads every waiting control message of every client and answers it; closes clients
    /// that hung up, misbehaved or never said hello.
    pub(super) fn control(&mut self) {
        for slot in 0..self.conns.len() {
            while let Some(conn) = &self.conns[slot] {
                if conn.ready.is_none() && Instant::now() > conn.greeting_until {
                    if conn.refusal.is_some() {
                        self.close(slot, Ending::Refused, None);
                        break;
                    }
                    self.close(
                        slot,
                        Ending::Misbehaved,
                        Some(error(
                            Code::Timeout,
                            true,
                            "no hello within 5 s: a client says hello first".into(),
                        )),
                    );
                    break;
                }
                let mut buf = [0u8; MAX_MESSAGE + 1];
                let n =
                    match socket::recv(conn.socket.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
                        Ok(0) => {
                            self.close(slot, Ending::Vanished, None);
                            break;
                        }
                        Ok(n) => n,
                        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => break,
                        Err(_) => {
                            self.close(slot, Ending::Vanished, None);
                            break;
                        }
                    };
                if let Some(refusal) = conn.refusal.clone() {
                    self.close(slot, Ending::Refused, Some(refusal));
                    break;
                }
                let msg = match proto::decode(&buf[..n]) {
                    Ok(m) => m,
                    Err(e) => {
                        self.close(
                            slot,
                            Ending::Misbehaved,
                            Some(error(Code::InvalidArgument, true, format!("{e}"))),
                        );
                        break;
                    }
                };
                self.handle(slot, msg);
            }
        }
    }

    /// Answers one message of the client in `slot`.
    fn handle(&mut self, slot: usize, msg: Msg) {
        let Some(conn) = &self.conns[slot] else {
            return;
        };
        let greeted = conn.ready.is_some();
        match msg {
            Msg::Hello { pool_bytes, name } if !greeted => {
                if let Err(e) = self.welcome(slot, pool_bytes, name.as_str()) {
                    self.close(slot, Ending::Misbehaved, Some(e.into_msg()));
                }
            }
            Msg::Declare {
                priority,
                period_ns,
                max_wait_ns,
                name,
                model,
            } if greeted => {
                let reply = match self.admit(
                    slot,
                    priority,
                    period_ns,
                    max_wait_ns,
                    name.as_str(),
                    model.as_str(),
                ) {
                    Ok(m) => m,
                    Err(e) => e.into_msg(),
                };
                self.reply(slot, &reply);
            }
            Msg::Close { stream } if greeted => {
                let id = conn.id;
                match self
                    .streams
                    .iter_mut()
                    .find(|s| s.client == id && s.number == stream && !s.closing)
                {
                    Some(s) => {
                        s.closing = true;
                        s.reply_closed = true;
                        self.drop_waiting_of(id, Some(stream), chan::STATUS_CLOSED);
                    }
                    None => {
                        let e = error(
                            Code::NotFound,
                            false,
                            format!("stream {stream} is not one of this client's open streams"),
                        );
                        self.reply(slot, &e);
                    }
                }
            }
            Msg::Stats if greeted => self.stats(slot),
            other => {
                let what = if greeted {
                    "only Declare, Close and Stats come from a client after its welcome"
                } else {
                    "a client says hello first"
                };
                self.close(
                    slot,
                    Ending::Misbehaved,
                    Some(error(
                        Code::InvalidArgument,
                        true,
                        format!("unexpected {}: {what}", kind_name(&other)),
                    )),
                );
            }
        }
    }

    /// Sends `msg` to the client in `slot`; closes it if it cannot take it.
    pub(super) fn reply(&mut self, slot: usize, msg: &Msg) {
        let Some(conn) = &self.conns[slot] else {
            return;
        };
        if !conn.send(msg) {
            self.close(slot, Ending::Vanished, None);
        }
    }

    /// The stats answer for the client in `slot`: its streams (every stream, for an
    /// administrator), its own figures (every client's, for an administrator), the device's
    /// and the owner's totals, last.
    fn stats(&mut self, slot: usize) {
        let Some(conn) = &self.conns[slot] else {
            return;
        };
        let id = conn.id;
        let admin = self.config.admins.contains(&conn.uid);
        let mut msgs = Vec::new();
        // Its own first, then the others' (of clients still here, or gone with frames of
        // theirs still on the device).
        let own = self.streams.iter().filter(|s| s.client == id);
        let others = self.streams.iter().filter(|s| admin && s.client != id);
        for s in own.chain(others) {
            // 0: none (not yet stated, or unbounded under its policy at some point).
            let bound = if s.stated == u64::MAX { 0 } else { s.stated };
            msgs.push(Msg::StreamStats(StreamFigures {
                stream: s.number,
                client: s.client,
                name: Name::lossy(&s.name),
                frames: s.frames,
                failed: s.failed,
                lost: s.lost,
                latency_p50_ns: s.latency.value_at_quantile(0.5),
                latency_p99_ns: s.latency.value_at_quantile(0.99),
                latency_max_ns: s.latency.max(),
                max_head_wait_ns: s.max_head_wait,
                bound_ns: bound,
                frame_ns: s.frame_ns,
                period_ns: s.period_ns,
            }));
        }
        msgs.extend(
            self.client_figures()
                .into_iter()
                .filter(|c| c.client == id || admin)
                .map(Msg::ClientStats),
        );
        msgs.push(Msg::DeviceStats(self.device_figures()));
        msgs.push(Msg::OwnerStats(self.figures()));
        for m in &msgs {
            self.reply(slot, m);
        }
    }

    /// Closes the client in `slot`: told `why` first if given; its waiting frames dropped, its
    /// streams closing (they finish what is on the device, then go, and its pool with them).
    pub(super) fn close(&mut self, slot: usize, ending: Ending, why: Option<Msg>) {
        let Some(conn) = self.conns[slot].take() else {
            return;
        };
        #[cfg(feature = "tracing")]
        let told = match &why {
            Some(Msg::Error { text, .. }) => Some(text.clone()),
            _ => None,
        };
        if let Some(msg) = why {
            let _ = conn.send(&msg);
        }
        // Frames out: taken and not completed, still in its submission ring, or waiting or
        // running for one of its streams.
        let busy =
            conn.ready
                .as_ref()
                .is_some_and(|r| r.in_flight > 0 || r.rings().submission_waiting(r.sq_head))
                || self.streams.iter().any(|s| {
                    s.client == conn.id && !(s.waiting.is_empty() && s.on_device.is_empty())
                });
        match ending {
            // A client that hangs up with nothing out has simply left.
            Ending::Vanished if busy => self.figures.vanished += 1,
            Ending::Vanished => self.figures.left += 1,
            Ending::Misbehaved => self.figures.closed += 1,
            Ending::Refused => {}
        }
        #[cfg(feature = "tracing")]
        report_close(&conn, ending, busy, told.as_deref());
        for s in &mut self.streams {
            if s.client == conn.id {
                s.closing = true;
                s.reply_closed = false;
                s.waiting.clear();
            }
        }
        drop(conn);
        self.retire_streams();
    }
}

/// A client's connection ended: a client that left with nothing out at `info`, one that
/// vanished with frames out or was closed for breaking the protocol at `warn` (with what it was
/// told), one refused at the door at `debug` (its refusal was reported when it came).
#[cfg(feature = "tracing")]
#[cold]
fn report_close(conn: &Conn, ending: Ending, busy: bool, told: Option<&str>) {
    let (client, pid, uid, name) = (conn.id, conn.pid, conn.uid, conn.name.as_str());
    match ending {
        Ending::Vanished if busy => tracing::warn!(
            client,
            pid,
            uid,
            name,
            "client vanished with frames out (they are dropped, its streams retired)"
        ),
        Ending::Vanished => tracing::info!(client, pid, uid, name, "client left"),
        Ending::Misbehaved => tracing::warn!(
            client,
            pid,
            uid,
            name,
            why = told.unwrap_or(""),
            "client closed"
        ),
        Ending::Refused => tracing::debug!(client, pid, uid, "refused client closed"),
    }
}

impl Conn {
    fn socket_borrow(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.socket.as_fd()
    }
}

/// An error message.
pub(super) fn error(code: Code, fatal: bool, text: String) -> Msg {
    Msg::Error {
        code: code as u32,
        fatal,
        text,
    }
}

/// A request refused: the error message the client gets, kept small until it is sent (a
/// [`Msg`] is as large as its largest kind).
#[derive(Debug)]
pub(super) struct Refusal {
    code: Code,
    fatal: bool,
    text: String,
}

impl Refusal {
    fn into_msg(self) -> Msg {
        error(self.code, self.fatal, self.text)
    }
}

/// A refusal.
fn refusal(code: Code, fatal: bool, text: String) -> Refusal {
    Refusal { code, fatal, text }
}

fn kind_name(m: &Msg) -> &'static str {
    match m {
        Msg::Hello { .. } => "Hello",
        Msg::Welcome { .. } => "Welcome",
        Msg::Declare { .. } => "Declare",
        Msg::Declared { .. } => "Declared",
        Msg::Close { .. } => "Close",
        Msg::Closed { .. } => "Closed",
        Msg::Stats => "Stats",
        Msg::StreamStats(_) => "StreamStats",
        Msg::ClientStats(_) => "ClientStats",
        Msg::DeviceStats(_) => "DeviceStats",
        Msg::OwnerStats(_) => "OwnerStats",
        Msg::Event { .. } => "Event",
        Msg::Error { .. } => "Error",
    }
}

/// The first run of `n` free queues.
fn free_run(used: &[bool], n: usize) -> Option<usize> {
    (0..=used.len().checked_sub(n)?).find(|&b| used[b..b + n].iter().all(|&u| !u))
}
