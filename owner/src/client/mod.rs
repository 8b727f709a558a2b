//! A client of the device owner: connect, declare streams, take buffers from the pool the
//! owner made for it, submit frames and take their completions through the shared rings.
//!
//! ```no_run
//! use std::time::Duration;
//! use userdma_owner::{Client, Options, StreamDecl};
//!
//! let mut client = Client::connect("/run/userdma/owner.sock", &Options::default())?;
//! let stream = client.declare(&StreamDecl::new("camera0", "yolov5s").priority(1).period(Duration::from_millis(40)))?;
//! let pool = std::sync::Arc::clone(client.pool());
//! let input = pool.alloc(stream.input_bytes as usize)?;
//! let result = pool.alloc(stream.result_bytes as usize)?;
//! input.write(0, &[0u8; 64])?;
//! client.submit(&stream, &input, &result, 1)?;
//! let done = client.wait(Some(Duration::from_secs(5)))?;
//! assert_eq!(done.tag, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A frame costs no system call while the owner is busy: the submission goes into the ring
//! and the owner's doorbell is rung only when the owner sleeps; [`Client::wait`] sleeps on
//! the completion doorbell only when nothing has completed. The input and result buffers stay
//! the client's own: the device reads the input and writes the result where they are.
//!
//! **Who checks a frame's buffers.** The owner refuses ([`crate::chan::STATUS_REFUSED`]) a
//! frame of a stream that is not this client's, or whose input or result span (the stream's
//! `input_bytes` or `result_bytes` from the offset named) is not inside this client's pool's
//! buffer area, does not start where a buffer may start ([`userdma::pool::MIN_ALIGN`]) or is
//! not contiguous for the device: so a frame reaches no memory but this client's own pool.
//! Which buffer an offset starts, how long it is and whether it is still allocated, the owner
//! cannot know: buffers are allocated in this process, from the pool's shared lists, which the
//! owner does not trust. The client checks that before anything is sent: [`Client::submit`]
//! takes the buffers themselves, [`Client::submit_spans`] the buffers a binding knows (the C
//! library's table of the buffers it gave out), and refuses a buffer shorter than the stream
//! needs, or one it does not know. [`Client::submit_offsets`] sends bare offsets: only the
//! owner's checks apply, and a buffer too short for the stream has the device read or write
//! past its end into this client's next buffers.
//!
//! The input and the result may be the same buffer: the device reads the whole input before it
//! writes any of the result.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr};
use userdma::dma::{SoftIommu, Space};
use userdma::fence::Fence;
use userdma::memory::Region;
use userdma::pool::{Exhaustion, Pool};
use userdma::share::{self, Received};

use crate::chan::{Completion, Rings};
use crate::proto::{
    self, ClientFigures, DeviceFigures, EventKind, Msg, Name, OwnerFigures, StreamFigures,
    MAX_MESSAGE,
};
use crate::Error;

mod connect;
mod frames;
mod wire;

pub(crate) use wire::{drain, send};
use wire::{io_err, poll_timeout, recv, wait_readable};

/// How long a request waits for the owner's answer.
const ANSWER: Duration = Duration::from_secs(30);
/// The longest a wait spins before it sleeps (adapted down when spinning does not pay).
const SPIN: Duration = Duration::from_micros(20);

/// What a client asks for when it connects.
#[derive(Debug, Clone)]
pub struct Options {
    /// Its pool's bytes (the owner caps it at its limit).
    pub pool_bytes: u64,
    /// Its name in the owner's accounting.
    pub name: String,
}

impl Default for Options {
    /// A 16 MiB pool, named after the program.
    fn default() -> Options {
        let name = std::env::args()
            .next()
            .and_then(|a| {
                Path::new(&a)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "client".into());
        let mut name = name;
        while name.len() > proto::NAME {
            name.pop();
        }
        Options {
            pool_bytes: 16 << 20,
            name,
        }
    }
}

/// A stream to declare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamDecl {
    /// Its name (unique among the client's streams, at most 32 bytes).
    pub name: String,
    /// The model, by name in the owner's catalogue.
    pub model: String,
    /// Higher runs first.
    pub priority: u8,
    /// Its frames' period (`None`: as fast as possible).
    pub period: Option<Duration>,
    /// A frame that has waited this long runs next, whatever its priority.
    pub max_wait: Option<Duration>,
}

impl StreamDecl {
    /// A stream of `model`, priority 0, as fast as possible, no maximum wait.
    pub fn new(name: &str, model: &str) -> StreamDecl {
        StreamDecl {
            name: name.into(),
            model: model.into(),
            priority: 0,
            period: None,
            max_wait: None,
        }
    }

    /// With priority `p`.
    #[must_use]
    pub fn priority(mut self, p: u8) -> StreamDecl {
        self.priority = p;
        self
    }

    /// Frames every `period`.
    #[must_use]
    pub fn period(mut self, period: Duration) -> StreamDecl {
        self.period = Some(period);
        self
    }

    /// A maximum wait.
    #[must_use]
    pub fn max_wait(mut self, wait: Duration) -> StreamDecl {
        self.max_wait = Some(wait);
        self
    }
}

/// A buffer of [`Client::pool`] as a binding that keeps its own table of buffers knows it
/// ([`Client::submit_spans`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Where the buffer starts in the pool's region ([`userdma::pool::Buffer::offset`]).
    pub offset: u64,
    /// Its length ([`userdma::pool::Buffer::len`]): what was asked for, which the device may
    /// read or write whole.
    pub len: u64,
}

/// A declared stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    /// Its number in submissions and completions.
    pub id: u32,
    /// Its name.
    pub name: String,
    /// An input buffer's least length.
    pub input_bytes: u64,
    /// A result buffer's least length.
    pub result_bytes: u64,
}

/// Something the owner told every client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// What.
    pub kind: EventKind,
    /// The fault's code, or 0.
    pub detail: u64,
}

/// A stats answer: this client's streams, what else the owner shows it, the device's figures
/// and the owner's totals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// One per stream of this client.
    pub streams: Vec<StreamFigures>,
    /// Every other client's streams, for an administrator (the owner's `Config::admins`:
    /// uid 0 and the owner's own); empty for anyone else.
    pub others: Vec<StreamFigures>,
    /// This client (and every other, for an administrator).
    pub clients: Vec<ClientFigures>,
    /// The owner's device: its busy time per unit, descriptors, switches, SRAM hits.
    pub device: DeviceFigures,
    /// The owner's totals.
    pub owner: OwnerFigures,
}

impl Stats {
    /// Whether the owner showed this client everything (every client and stream), as it
    /// does an administrator; `false` when it holds clients or streams it did not show.
    pub fn sees_all(&self) -> bool {
        self.clients.len() >= self.owner.clients as usize
            && self.streams.len() + self.others.len() >= self.owner.streams as usize
    }
}

/// A connection to a device owner. See the module docs.
#[derive(Debug)]
pub struct Client {
    socket: OwnedFd,
    id: u64,
    pool: Arc<Pool>,
    /// The rings' memory (mapped here; `rings` points into it).
    rings_region: Region,
    rings_words: NonNull<AtomicU64>,
    rings_len: usize,
    /// Rung to wake the owner; rung by the owner to wake this client.
    owner_bell: Fence,
    bell: Fence,
    streams: Vec<Stream>,
    events: VecDeque<Event>,
    /// Frames the client refused before sending them ([`Client::submit_spans`]): their
    /// completions, taken before the ring's.
    refused: VecDeque<Completion>,
    max_streams: u32,
    max_in_flight: u32,
    in_flight: u32,
    gone: Option<&'static str>,
    /// How long a wait spins before it sleeps on the doorbell.
    spin: crate::spin::Spin,
    /// The longest a request waits for the owner's answer.
    answer: Duration,
}

// SAFETY: `rings_words` points into `rings_region`, owned by the client and mapped for its
// life; the words are atomics every thread may touch. Nothing else is tied to a thread.
unsafe impl Send for Client {}

impl Client {
    fn rings(&self) -> Result<Rings<'_>, Error> {
        // SAFETY: `rings_words` is the start of `rings_region`'s mapping (page-aligned, so
        // aligned for `AtomicU64`), `rings_len` words long, mapped as long as `self`; every
        // process touches those words only as atomics, valid for any bytes.
        let words =
            unsafe { std::slice::from_raw_parts(self.rings_words.as_ptr(), self.rings_len) };
        let _ = &self.rings_region;
        Ok(Rings::open(words)?)
    }

    /// The owner's number for this client.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The pool to take input and result buffers from (shared with the owner).
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The most frames this client may have taken and not completed.
    pub fn max_in_flight(&self) -> u32 {
        self.max_in_flight
    }

    /// The most streams it may declare.
    pub fn max_streams(&self) -> u32 {
        self.max_streams
    }

    /// Frames submitted whose completions were not taken yet.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Declares a stream.
    ///
    /// # Errors
    /// [`Error::Owner`] for a model the owner does not have, a duplicate name, the client's
    /// stream limit, a device with no room for another stream; [`Error::Proto`] for a name
    /// longer than 32 bytes.
    pub fn declare(&mut self, decl: &StreamDecl) -> Result<Stream, Error> {
        let ns = |d: Option<Duration>| {
            d.map_or(0, |d| {
                u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)
            })
        };
        let msg = Msg::Declare {
            priority: decl.priority,
            period_ns: ns(decl.period),
            max_wait_ns: ns(decl.max_wait),
            name: Name::new(&decl.name)?,
            model: Name::new(&decl.model)?,
        };
        match self.request(&msg)? {
            Msg::Declared {
                stream,
                input_bytes,
                result_bytes,
            } => {
                let s = Stream {
                    id: stream,
                    name: decl.name.clone(),
                    input_bytes,
                    result_bytes,
                };
                self.streams.push(s.clone());
                Ok(s)
            }
            other => Err(Error::Unexpected {
                expected: "the stream declared",
                got: format!("{other:?}"),
            }),
        }
    }

    /// Closes a stream: its frames in flight complete first (their completions arrive as
    /// usual), then the owner frees its pipeline.
    ///
    /// # Errors
    /// [`Error::Stream`] for a stream not this client's; the owner's refusal.
    pub fn close_stream(&mut self, stream: &Stream) -> Result<(), Error> {
        let at = self
            .streams
            .iter()
            .position(|s| s.id == stream.id)
            .ok_or(Error::Stream { stream: stream.id })?;
        match self.request(&Msg::Close { stream: stream.id })? {
            Msg::Closed { .. } => {
                self.streams.remove(at);
                Ok(())
            }
            other => Err(Error::Unexpected {
                expected: "the stream closed",
                got: format!("{other:?}"),
            }),
        }
    }

    /// Events the owner sent (device resets, removal, its shutdown), oldest first; reads any
    /// waiting on the socket without blocking.
    ///
    /// # Errors
    /// A message this client cannot read.
    pub fn events(&mut self) -> Result<Vec<Event>, Error> {
        self.take_messages()?;
        Ok(self.events.drain(..).collect())
    }

    /// Whether the owner has gone (its connection closed).
    pub fn is_gone(&self) -> bool {
        self.gone.is_some()
    }

    /// This client's streams' figures, what else the owner shows it (every client and
    /// stream, to an administrator), the device's figures and the owner's totals.
    ///
    /// # Errors
    /// As a request: [`Error::Gone`], [`Error::Timeout`], [`Error::Proto`].
    pub fn stats(&mut self) -> Result<Stats, Error> {
        let mut streams = Vec::new();
        let mut others = Vec::new();
        let mut clients = Vec::new();
        let mut device = None;
        let mut reply = self.request(&Msg::Stats)?;
        loop {
            match reply {
                Msg::StreamStats(s) if s.client == self.id => streams.push(s),
                Msg::StreamStats(s) => others.push(s),
                Msg::ClientStats(c) => clients.push(c),
                Msg::DeviceStats(d) => device = Some(d),
                Msg::OwnerStats(owner) => {
                    let Some(device) = device else {
                        return Err(Error::Unexpected {
                            expected: "the device's figures before the owner's",
                            got: format!("{:?}", Msg::OwnerStats(owner)),
                        });
                    };
                    return Ok(Stats {
                        streams,
                        others,
                        clients,
                        device,
                        owner,
                    });
                }
                other => {
                    return Err(Error::Unexpected {
                        expected: "stats",
                        got: format!("{other:?}"),
                    })
                }
            }
            reply = self.answer()?;
        }
    }

    /// Reads every message waiting on the socket without blocking: events are kept, a
    /// closed connection marks the owner gone.
    fn take_messages(&mut self) -> Result<(), Error> {
        while self.gone.is_none() {
            let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::ZERO) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io_err("polling the owner's socket", e)),
            }
            match recv(&self.socket, Some(Duration::ZERO)) {
                Ok(Msg::Event { kind, detail }) => self.events.push_back(Event { kind, detail }),
                Ok(other) => {
                    return Err(Error::Unexpected {
                        expected: "an event",
                        got: format!("{other:?}"),
                    })
                }
                Err(Error::Gone { why }) => self.gone = Some(why),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sends `msg` and returns the owner's answer (events meanwhile are kept).
    fn request(&mut self, msg: &Msg) -> Result<Msg, Error> {
        if let Some(why) = self.gone {
            return Err(Error::Gone { why });
        }
        send(&self.socket, msg)?;
        self.answer()
    }

    fn answer(&mut self) -> Result<Msg, Error> {
        loop {
            match recv(&self.socket, Some(self.answer)) {
                Ok(Msg::Event { kind, detail }) => self.events.push_back(Event { kind, detail }),
                Ok(Msg::Error { code, text, fatal }) => {
                    if fatal {
                        self.gone = Some("it closed this client after an error");
                    }
                    return Err(Error::Owner { code, text });
                }
                Ok(other) => return Ok(other),
                Err(Error::Gone { why }) => {
                    self.gone = Some(why);
                    return Err(Error::Gone { why });
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// A path's default: where `userdma serve` listens unless told otherwise.
pub fn default_socket() -> PathBuf {
    std::env::var_os("USERDMA_OWNER_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/userdma/owner.sock"))
}
