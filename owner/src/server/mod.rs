//! The device owner: one process opens a device and runs every client's streams on it
//! under one [`Scheduler`].
//!
//! ```text
//!   client A ──socket (control)──┐                       ┌── pipeline A/live  ─┐
//!            ══rings (frames)════╡   Owner: one thread   ├── pipeline A/batch ─┼─ device
//!   client B ──socket──────────┐ │   accept, control,    └── pipeline B/cam   ─┘
//!            ══rings═══════════╧═╡   take, decide, reap
//! ```
//!
//! - **Access**: a connecting peer's uid and gid come from `SO_PEERCRED`; one not in the
//!   allow-list ([`Access`]) gets an error and is closed. The socket file gets [`Config::mode`].
//! - **Memory**: each client gets a pool of its own (a sealed memfd, mapped into the device's
//!   DMA space once, [`Pool::create_shared`] over it) and rings of its own. A submission names
//!   its input and result by offset in that pool; the owner checks each against the pool's
//!   buffer area and the model's sizes, so a client reaches nothing but its own memory. The
//!   owner never allocates from a client's pool nor trusts its metadata.
//! - **Frames**: the owner takes submissions from every client's ring (up to the client's
//!   in-flight limit and the room in its completion ring), queues them per stream with their
//!   arrival time on the owner's clock, and each time the device can take a frame asks the
//!   scheduler whose goes; the frame runs through that stream's pipeline straight from and to
//!   the client's buffers ([`Pipeline::try_submit_spans`]), and its completion goes into the
//!   client's completion ring.
//! - **Crashes**: a client's socket hanging up (it exited or was killed) is seen at once: its
//!   waiting frames are dropped, its frames on the device finish (their results discarded),
//!   then its pipelines are shut down and its pool unmapped. Nothing of its memory is reused
//!   or unmapped while the device may still touch it.
//! - **Faults**: a device that stops answering or breaks its protocol is reset; every
//!   pipeline takes its slots back, frames in flight complete as lost
//!   ([`crate::chan::STATUS_LOST`]) and every client hears [`EventKind::Reset`]; a removed
//!   device is told as [`EventKind::Removed`] and refuses frames from then on.
//!
//! The loop allocates nothing per frame: per-stream queues, poll sets and completion buffers
//! are sized when a client or stream is admitted.

mod config;
mod conn;
mod counters;
mod frames;
mod listen;

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::pool::Pool;
use userdma_infer::accel::{Accelerator, HostSpan};
use userdma_infer::pipeline::Pipeline;
use userdma_infer::sched::{Nanos, Scheduler};

use crate::proto::{ClientFigures, DeviceFigures, EventKind, Name, OwnerFigures};

pub use self::config::{Access, Config, Entry, Error, Limits};
pub use self::conn::Conn;
pub use self::counters::{CounterSource, LoopbackCounters};

/// A frame taken from a client, waiting for the device.
#[derive(Debug, Clone, Copy)]
struct Pending {
    input: HostSpan,
    result: HostSpan,
    tag: u64,
    arrival: Nanos,
}

/// A frame on the device.
#[derive(Debug, Clone, Copy)]
struct OnDevice {
    tag: u64,
    arrival: Nanos,
    dispatch: Nanos,
}

/// One client's stream, as the owner runs it.
#[derive(Debug)]
struct OStream {
    /// The client's connection id and its slot in `Owner::conns`.
    client: u64,
    slot: usize,
    /// Its number for the client.
    number: u32,
    name: String,
    priority: u8,
    max_wait: Option<Nanos>,
    period_ns: u64,
    context: u32,
    queues: (u16, u16),
    pipeline: Pipeline,
    /// Keeps the client's pool mapped while frames of this stream may touch it.
    pool: Arc<Pool>,
    waiting: VecDeque<Pending>,
    on_device: VecDeque<OnDevice>,
    /// Latency from taking a frame to posting its completion, ns (allocated once: recording
    /// allocates nothing).
    latency: hdrhistogram::Histogram<u64>,
    frames: u64,
    failed: u64,
    lost: u64,
    max_head_wait: Nanos,
    last_dispatch: Nanos,
    /// The longest a frame of it held the device as the scheduler sees it: from its
    /// dispatch to the next decision, when the next frame was already waiting as it finished
    /// (the device time and the loop's own, as the bounds count it).
    frame_ns: Nanos,
    /// The largest wait bound in force over its life (the stream sets it ran with, the
    /// service times seen); `u64::MAX`: unbounded at some point; 0: none stated yet.
    stated: Nanos,
    /// No more frames: removed once nothing of it is on the device (and the client told,
    /// if it asked).
    closing: bool,
    reply_closed: bool,
}

/// The device owner. See the module docs.
pub struct Owner {
    device: Arc<dyn Accelerator>,
    config: Config,
    listener: OwnedFd,
    conns: Vec<Option<Conn>>,
    streams: Vec<OStream>,
    scheduler: Option<Scheduler>,
    oldest: Vec<Option<Nanos>>,
    /// Queue ids in use.
    queues_used: Vec<bool>,
    next_client: u64,
    start: Instant,
    figures: OwnerFigures,
    switches_before: u64,
    removed: bool,
    /// When the device last showed progress while busy.
    progress: Instant,
    /// The last dispatch: its stream (client, number) and when; the last completion.
    last_dispatch: Option<((u64, u32), Nanos)>,
    last_done: Nanos,
    /// A frame was waiting when the last frame finished.
    waiting_at_done: bool,
    /// The longest any frame held the device (every stream's service time in the bounds).
    service_ns: Nanos,
    /// Scratch: finished frames of one poll (stream-local frame order), reused.
    finished: Vec<(u32, Option<u32>)>,
    /// Scratch: the poll set, reused.
    pollfds: Vec<libc::pollfd>,
    /// How long the loop spins before it sleeps.
    spin: crate::spin::Spin,
    tokens: Vec<Token>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Listener,
    Socket(usize),
    Bell(usize),
    Irq,
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owner")
            .field("device", &self.device.identity())
            .field("socket", &self.config.socket)
            .field("clients", &self.conns.iter().flatten().count())
            .field("streams", &self.streams.len())
            .finish()
    }
}

impl Owner {
    /// Opens the socket of `config` for `device`.
    ///
    /// # Errors
    /// [`Error::Listen`] when the path is taken by a running owner or cannot be bound;
    /// [`Error::Config`] for no models, an `in_flight` of 0, limits of 0.
    pub fn bind(device: Arc<dyn Accelerator>, config: Config) -> Result<Owner, Error> {
        if config.models.is_empty() {
            return Err(Error::Config(
                "no models: give the owner at least one (Config::model)".into(),
            ));
        }
        if config.in_flight == 0 {
            return Err(Error::Config(
                "in_flight 0: the device must take at least one frame".into(),
            ));
        }
        let l = config.limits;
        if l.clients == 0 || l.streams == 0 || l.in_flight == 0 || l.pool_bytes < (1 << 20) {
            return Err(Error::Config(format!(
                "limits {l:?}: every limit must be at least 1, and a pool at least 1 MiB"
            )));
        }
        if l.in_flight > crate::chan::MAX_ENTRIES {
            return Err(Error::Config(format!(
                "in_flight limit {} above the rings' most, {}",
                l.in_flight,
                crate::chan::MAX_ENTRIES
            )));
        }
        let listener = listen::listen(&config.socket, config.mode)?;
        let queues = usize::from(device.capabilities().queues);
        Ok(Owner {
            device,
            listener,
            conns: Vec::new(),
            streams: Vec::new(),
            scheduler: None,
            oldest: Vec::with_capacity(userdma_infer::sched::MAX_STREAMS),
            queues_used: vec![false; queues],
            next_client: 1,
            start: Instant::now(),
            figures: OwnerFigures::default(),
            switches_before: 0,
            removed: false,
            progress: Instant::now(),
            last_dispatch: None,
            last_done: 0,
            waiting_at_done: false,
            service_ns: 0,
            finished: Vec::with_capacity(64),
            pollfds: Vec::with_capacity(64),
            spin: crate::spin::Spin::new(Duration::from_micros(20)),
            tokens: Vec::with_capacity(64),
            config,
        })
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.config.socket
    }

    /// The owner's totals now.
    pub fn figures(&self) -> OwnerFigures {
        let mut f = self.figures;
        f.clients = self.conns.iter().flatten().count() as u32;
        f.streams = self.streams.len() as u32;
        f.in_flight = self
            .streams
            .iter()
            .map(|s| s.on_device.len())
            .sum::<usize>() as u32;
        // Clients that left with frames still on the device: their pools, held by their
        // streams until those frames are off it.
        let mut departed: Vec<&Arc<Pool>> = Vec::new();
        for s in &self.streams {
            if !self.conn_alive(s.client, s.slot)
                && !departed.iter().any(|p| Arc::ptr_eq(p, &s.pool))
            {
                departed.push(&s.pool);
            }
        }
        f.departing = departed.len() as u32;
        f.mapped_bytes = self
            .conns
            .iter()
            .flatten()
            .map(|c| c.pool_bytes())
            .chain(departed.iter().map(|p| p.mapping().len() as u64))
            .sum();
        f.switches = self.switches_before + self.scheduler.as_ref().map_or(0, |s| s.switches());
        f
    }

    /// Every connected client's figures now, as [`crate::proto::Msg::ClientStats`] gives them: what
    /// an embedding program (a test, a status page) reads between turns without a socket.
    pub fn client_figures(&self) -> Vec<ClientFigures> {
        self.conns
            .iter()
            .flatten()
            .map(|c| {
                let n = self.streams.iter().filter(|s| s.client == c.id).count() as u32;
                c.figures(n)
            })
            .collect()
    }

    /// The device's figures now: its name, the owner's clock, its counters if the owner can
    /// read them ([`Config::counters`]).
    pub fn device_figures(&self) -> DeviceFigures {
        DeviceFigures {
            device: Name::lossy(&self.device.identity()),
            clock_ns: self.now(),
            counters: self.config.counters.as_ref().and_then(|c| c.read()),
        }
    }

    fn conn_alive(&self, id: u64, slot: usize) -> bool {
        self.conns
            .get(slot)
            .and_then(Option::as_ref)
            .is_some_and(|c| c.id == id)
    }

    /// Runs until `stop` is set: then tells every client the owner is shutting down, lets the
    /// frames on the device finish (their completions posted) and closes every connection.
    ///
    /// # Errors
    /// A system call of the loop failing (a client's misbehaviour never ends the loop).
    pub fn run(&mut self, stop: &AtomicBool) -> Result<(), Error> {
        while !stop.load(Ordering::Relaxed) {
            self.turn(Duration::from_millis(100))?;
        }
        self.shutdown()
    }

    /// One turn of the loop: accept, read control messages, take submissions, dispatch,
    /// reap; sleeps up to `sleep` when there is nothing to do.
    ///
    /// # Errors
    /// As [`Owner::run`].
    pub fn turn(&mut self, sleep: Duration) -> Result<(), Error> {
        self.accept()?;
        self.control();
        let took = self.take_submissions();
        let dispatched = self.dispatch();
        let reaped = self.reap();
        self.retire_streams();
        self.check_overdue();
        if took || dispatched || reaped {
            return Ok(());
        }
        // A frame on the device or a client with frames out: what comes next may be moments
        // away; spin for it before paying a sleep's two wake-ups.
        let busy = self.streams.iter().any(|s| !s.on_device.is_empty());
        let expecting = busy
            || self
                .conns
                .iter()
                .flatten()
                .any(|c| c.ready.as_ref().is_some_and(|r| r.in_flight > 0));
        if expecting {
            let mut spin = self.spin;
            // A completion is taken (reaped) as soon as it is seen.
            let caught = spin
                .spin(|| self.conns.iter().flatten().any(Conn::submission_waiting) || self.reap());
            self.spin = spin;
            if caught {
                return Ok(());
            }
        }
        let slept = Instant::now();
        self.sleep(sleep)?;
        if expecting {
            self.spin.slept(slept.elapsed());
        }
        Ok(())
    }

    /// Tells every client the owner is going, drains the device, closes everything.
    fn shutdown(&mut self) -> Result<(), Error> {
        self.broadcast(EventKind::Shutdown, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        for s in &mut self.streams {
            s.closing = true;
        }
        self.drop_waiting(crate::chan::STATUS_CLOSED);
        while self.streams.iter().any(|s| !s.on_device.is_empty()) && Instant::now() < deadline {
            if !self.reap() {
                self.sleep(Duration::from_millis(5))?;
            }
        }
        self.retire_streams();
        self.conns.clear();
        let _ = std::fs::remove_file(&self.config.socket);
        Ok(())
    }

    fn now(&self) -> Nanos {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Rebuilds the scheduler over the current streams (after one came or went); its switch
    /// count carries over.
    fn reschedule(&mut self) {
        if let Some(old) = self.scheduler.take() {
            self.switches_before += old.switches();
        }
        self.oldest.clear();
        if self.streams.is_empty() {
            return;
        }
        let specs = self
            .streams
            .iter()
            .map(|s| {
                let spec = userdma_infer::sched::StreamSpec::new(
                    format!("{}/{}", s.client, s.name),
                    s.priority,
                    s.context,
                );
                match s.max_wait {
                    Some(w) => spec.with_max_wait(w),
                    None => spec,
                }
            })
            .collect();
        // The specs were checked when each stream was admitted (names unique per client, at
        // most MAX_STREAMS, waits above 0): a refusal here is a bug, reported and survived.
        match Scheduler::new(self.config.policy, specs) {
            Ok(s) => {
                self.oldest.resize(self.streams.len(), None);
                self.scheduler = Some(s);
                self.restate();
            }
            Err(e) => eprintln!("userdma owner: the scheduler refused the streams: {e}"),
        }
    }

    /// Raises every stream's stated bound to the one in force now: the scheduler's formulas
    /// with every stream's service time the longest any frame held the device (its switch
    /// included, so the switch cost is 0), as the case study states its bounds. A wait is
    /// bounded by the bound in force while it lasted, so a stream's largest is what it is
    /// held to.
    fn restate(&mut self) {
        let (Some(scheduler), service) = (&self.scheduler, self.service_ns) else {
            return;
        };
        if service == 0 {
            return;
        }
        let times = vec![service; self.streams.len()];
        for (i, s) in self.streams.iter_mut().enumerate() {
            let b = scheduler
                .wait_bound(userdma_infer::sched::StreamId(i), &times, 0)
                .unwrap_or(u64::MAX);
            s.stated = s.stated.max(b);
        }
    }

    /// Sleeps until a client or the device has something, or `timeout`.
    fn sleep(&mut self, timeout: Duration) -> Result<(), Error> {
        self.pollfds.clear();
        self.tokens.clear();
        let push = |fds: &mut Vec<libc::pollfd>, tokens: &mut Vec<Token>, fd: i32, t| {
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            tokens.push(t);
        };
        push(
            &mut self.pollfds,
            &mut self.tokens,
            self.listener.as_raw_fd(),
            Token::Listener,
        );
        let mut ready = false;
        for (slot, conn) in self.conns.iter().enumerate() {
            let Some(conn) = conn else { continue };
            push(
                &mut self.pollfds,
                &mut self.tokens,
                conn.socket_fd(),
                Token::Socket(slot),
            );
            if let Some(fd) = conn.bell_fd() {
                push(&mut self.pollfds, &mut self.tokens, fd, Token::Bell(slot));
                if conn.go_idle() {
                    ready = true;
                }
            }
        }
        let mut timeout = timeout;
        let mut busy = false;
        for s in &mut self.streams {
            if s.on_device.is_empty() {
                continue;
            }
            busy = true;
            if s.pipeline.finishing() {
                ready = true;
                continue;
            }
            match s.pipeline.interrupt().map(|fd| fd.as_raw_fd()) {
                None => timeout = timeout.min(Duration::from_micros(50)),
                Some(fd) => {
                    match s.pipeline.waitable() {
                        None => ready = true,
                        Some(q) => match q.arm_interrupt() {
                            Ok(true) => ready = true,
                            Ok(false) => {}
                            Err(_) => ready = true,
                        },
                    }
                    push(&mut self.pollfds, &mut self.tokens, fd, Token::Irq);
                }
            }
        }
        if busy {
            // Wake in time to notice a device that stopped answering.
            timeout = timeout.min(Duration::from_millis(50));
        }
        if !ready {
            let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
            let ms = if ms == 0 && !timeout.is_zero() { 1 } else { ms };
            // SAFETY: `pollfds` is a live, initialized array of `len` pollfd structs for the
            // duration of the call; every fd in it is owned by `self` and open.
            let n = unsafe {
                libc::poll(
                    self.pollfds.as_mut_ptr(),
                    self.pollfds.len() as libc::nfds_t,
                    ms,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    self.wake_all();
                    return Err(Error::Io {
                        what: "poll",
                        source: e,
                    });
                }
            }
        }
        self.wake_all();
        for (fd, token) in self.pollfds.iter().zip(&self.tokens) {
            if fd.revents == 0 {
                continue;
            }
            if let Token::Bell(slot) = *token {
                if let Some(Some(conn)) = self.conns.get(slot) {
                    conn.drain_bell();
                }
            }
        }
        Ok(())
    }

    /// Clears every idle flag and disarms the interrupts armed for sleeping.
    fn wake_all(&mut self) {
        for conn in self.conns.iter().flatten() {
            conn.awake();
        }
        for s in &mut self.streams {
            if s.on_device.is_empty() {
                continue;
            }
            if let Some(q) = s.pipeline.waitable() {
                q.disarm_interrupt();
            }
        }
    }

    /// Sends `kind` to every client.
    fn broadcast(&mut self, kind: EventKind, detail: u64) {
        for conn in self.conns.iter().flatten() {
            conn.event(kind, detail);
        }
    }
}
