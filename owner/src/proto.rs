//! The control protocol between a client and the device owner: one message per
//! `SOCK_SEQPACKET` packet, a fixed 8-byte header and a fixed payload per kind, every integer
//! little-endian, every name 32 bytes of UTF-8 padded with zeros.
//!
//! ```text
//!   0        4        6        8
//!   | magic  | version| kind   | payload (its length fixed by the kind) ...
//!   "UDOW"     2
//! ```
//!
//! Version 2 (this build): a stream's figures name the stream and its client, a client's
//! figures its name, and a stats answer carries the device's figures ([`Msg::DeviceStats`]).
//! Version 1 had neither; a peer of the other version is refused with both numbers.
//!
//! [`decode`] checks everything a peer controls (magic, version, kind, exact length, names,
//! flags, ranges) and never panics; a message it refuses gets the peer an error and the
//! connection closed, never the owner's end. The descriptors that travel with the welcome
//! go as a separate [`userdma::share`] message.

use thiserror::Error;

/// "UDOW", little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"UDOW");
/// The protocol version this build speaks.
pub const VERSION: u16 = 2;
/// The header's length.
pub const HEADER: usize = 8;
/// A name's bytes on the wire.
pub const NAME: usize = 32;
/// An error message's text bytes on the wire.
pub const TEXT: usize = 192;
/// The longest message.
pub const MAX_MESSAGE: usize = HEADER + 8 + TEXT;

/// A name of at most [`NAME`] bytes of UTF-8 with no NUL, held as its wire bytes (so a
/// figures struct that carries one stays `Copy`).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Name {
    bytes: [u8; NAME],
    len: u8,
}

impl Name {
    /// `text` as a name.
    ///
    /// # Errors
    /// [`ProtoError::Name`] for more than [`NAME`] bytes or a NUL.
    pub fn new(text: &str) -> Result<Name, ProtoError> {
        if text.len() > NAME || text.contains('\0') {
            return Err(ProtoError::Name {
                len: text.len(),
                why: "at most 32 bytes of UTF-8 with no NUL",
            });
        }
        let mut bytes = [0u8; NAME];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Ok(Name {
            bytes,
            // At most NAME (32) bytes: fits.
            len: text.len() as u8,
        })
    }

    /// `text` made a name: cut to [`NAME`] bytes at a character boundary, NULs dropped (for
    /// names the owner makes itself, such as its device's identity).
    pub fn lossy(text: &str) -> Name {
        let clean: String = text.chars().filter(|&c| c != '\0').collect();
        let mut end = clean.len().min(NAME);
        while !clean.is_char_boundary(end) {
            end -= 1;
        }
        Name::new(&clean[..end]).unwrap_or_default()
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Checked UTF-8 when made (`new`, `decode`): the fallback is never taken.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the owner tells every client of the device ([`Msg::Event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The device was reset after a fault: frames in flight came back lost (status
    /// [`crate::chan::STATUS_LOST`]); submit them again.
    Reset = 1,
    /// The device was removed: no more frames run; reconnect to an owner of another device.
    Removed = 2,
    /// The owner is shutting down: reconnect when it is back ([`crate::Client::connect_wait`]).
    Shutdown = 3,
}

impl EventKind {
    fn from_u32(v: u32) -> Option<EventKind> {
        match v {
            1 => Some(EventKind::Reset),
            2 => Some(EventKind::Removed),
            3 => Some(EventKind::Shutdown),
            _ => None,
        }
    }
}

/// One stream's figures as the owner counts them ([`Msg::StreamStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamFigures {
    /// The client's stream number.
    pub stream: u32,
    /// The owner's number for the stream's client ([`ClientFigures::client`]).
    pub client: u64,
    /// The stream's name, as its client declared it.
    pub name: Name,
    /// Frames finished.
    pub frames: u64,
    /// Frames the device failed.
    pub failed: u64,
    /// Frames lost to device faults (handed back lost).
    pub lost: u64,
    /// Latency from the owner taking the frame to its completion posted, ns: p50, p99, max.
    pub latency_p50_ns: u64,
    /// p99.
    pub latency_p99_ns: u64,
    /// Max.
    pub latency_max_ns: u64,
    /// The longest wait as the scheduler's bounds count it, ns.
    pub max_head_wait_ns: u64,
    /// The stated bound on that wait from the frame times measured so far (0: none).
    pub bound_ns: u64,
    /// The longest device time of one of its frames seen so far, ns.
    pub frame_ns: u64,
    /// The period it declared, ns (0: as fast as possible).
    pub period_ns: u64,
}

/// One client as the owner accounts for it ([`Msg::ClientStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientFigures {
    /// The owner's number for the client.
    pub client: u64,
    /// Its process id and user id (from `SO_PEERCRED`).
    pub pid: u32,
    /// Its user id.
    pub uid: u32,
    /// Its name, as it said hello (`pid<N>` before its hello).
    pub name: Name,
    /// Streams declared.
    pub streams: u32,
    /// Frames taken and not yet completed.
    pub in_flight: u32,
    /// Frames completed.
    pub frames: u64,
    /// Bytes of its pool.
    pub pool_bytes: u64,
}

/// The owner's totals ([`Msg::OwnerStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OwnerFigures {
    /// Clients connected.
    pub clients: u32,
    /// Streams over all clients.
    pub streams: u32,
    /// Frames in flight on the device.
    pub in_flight: u32,
    /// Clients whose memory is still held for frames of theirs in flight (they left).
    pub departing: u32,
    /// Bytes of client pools mapped for the device.
    pub mapped_bytes: u64,
    /// Frames completed since the owner started.
    pub frames: u64,
    /// Context switches the scheduler caused.
    pub switches: u64,
    /// Clients refused at the door (`SO_PEERCRED`) and closed for bad messages.
    pub refused: u64,
    /// Closed for bad messages or limits.
    pub closed: u64,
    /// Clients that hung up with frames out (crashed, killed).
    pub vanished: u64,
    /// Clients that hung up with nothing out (done).
    pub left: u64,
    /// Device resets.
    pub resets: u64,
}

/// One unit of the device, as its counters count it ([`DeviceCounters`]). Every figure
/// grows from the device's start; a share or rate over an interval is the growth over the
/// interval's length ([`DeviceFigures::clock_ns`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UnitFigures {
    /// Nanoseconds the unit spent executing descriptors.
    pub busy_ns: u64,
    /// Descriptors it executed.
    pub descriptors: u64,
    /// Bytes moved or computed by its successful descriptors.
    pub bytes: u64,
    /// Times it took a descriptor of another context than its previous one.
    pub context_switches: u64,
    /// Its descriptors that completed with an error.
    pub errors: u64,
}

/// The device's own counters, as its driver reads them (`server::CounterSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceCounters {
    /// The copy engine.
    pub copy: UnitFigures,
    /// The compute unit.
    pub compute: UnitFigures,
    /// Bytes compute descriptors were served from device SRAM, over every queue.
    pub sram_hits: u64,
    /// Bytes compute descriptors touched with a working set declared, over every queue
    /// (`sram_hits / sram_touched` is the device's SRAM hit rate).
    pub sram_touched: u64,
}

/// The owner's device ([`Msg::DeviceStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceFigures {
    /// The device, as its engine names itself (cut to [`NAME`] bytes).
    pub device: Name,
    /// The owner's clock when it read the figures, ns since it started: the interval
    /// between two answers, for shares and rates.
    pub clock_ns: u64,
    /// The device's counters (`None`: the owner was given no way to read them).
    pub counters: Option<DeviceCounters>,
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Client → owner, first: who it is and how large a pool it wants.
    Hello {
        /// Its pool's bytes (the owner caps it at its per-client limit).
        pool_bytes: u64,
        /// Its name in the owner's accounting.
        name: Name,
    },
    /// Owner → client: accepted; a [`userdma::share`] message follows with the pool's region,
    /// the rings' region, the submission doorbell and the completion doorbell.
    Welcome {
        /// The owner's number for the client.
        client: u64,
        /// The pool's bytes.
        pool_bytes: u64,
        /// Submission ring entries.
        sq_entries: u32,
        /// Completion ring entries.
        cq_entries: u32,
        /// The most streams this client may declare.
        max_streams: u32,
        /// The most frames it may have taken and not completed.
        max_in_flight: u32,
    },
    /// Client → owner: a stream.
    Declare {
        /// Higher runs first.
        priority: u8,
        /// Its frames' period, ns (0: as fast as possible).
        period_ns: u64,
        /// Its maximum wait, ns (0: none).
        max_wait_ns: u64,
        /// Its name (unique among the client's streams).
        name: Name,
        /// The model, by name in the owner's catalogue.
        model: Name,
    },
    /// Owner → client: the stream is ready.
    Declared {
        /// Its number in submissions.
        stream: u32,
        /// The model's input bytes (an input buffer's least length).
        input_bytes: u64,
        /// The model's result bytes.
        result_bytes: u64,
    },
    /// Client → owner: no more frames of `stream`; its frames in flight finish first.
    Close {
        /// The stream.
        stream: u32,
    },
    /// Owner → client: `stream` is closed, every frame of it completed.
    Closed {
        /// The stream.
        stream: u32,
    },
    /// Client → owner: this client's figures, then the device's and the owner's.
    Stats,
    /// Owner → client: one stream's figures (one message per stream of the asker; of every
    /// client, for an asker the owner allows to see them all).
    StreamStats(StreamFigures),
    /// Owner → client: one client's figures (every client's for an asker the owner allows
    /// to see them all, else its own).
    ClientStats(ClientFigures),
    /// Owner → client: the device's figures, before the owner's totals.
    DeviceStats(DeviceFigures),
    /// Owner → client: the owner's totals, last of a stats reply.
    OwnerStats(OwnerFigures),
    /// Owner → every client: something happened to the device or the owner.
    Event {
        /// What.
        kind: EventKind,
        /// The fault's error code, or 0.
        detail: u64,
    },
    /// Owner → client: a request failed. `fatal`: the owner closes the connection.
    Error {
        /// The [`userdma::Code`] number.
        code: u32,
        /// The connection is closed after it.
        fatal: bool,
        /// What went wrong and what to do.
        text: String,
    },
}

const K_HELLO: u16 = 1;
const K_WELCOME: u16 = 2;
const K_DECLARE: u16 = 3;
const K_DECLARED: u16 = 4;
const K_CLOSE: u16 = 5;
const K_CLOSED: u16 = 6;
const K_STATS: u16 = 7;
const K_STREAM_STATS: u16 = 8;
const K_CLIENT_STATS: u16 = 9;
const K_OWNER_STATS: u16 = 10;
const K_EVENT: u16 = 11;
const K_ERROR: u16 = 12;
const K_DEVICE_STATS: u16 = 13;

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtoError {
    /// Shorter than a header.
    #[error("a {len}-byte message is shorter than the 8-byte header: not a userdma owner message")]
    Short {
        /// Its length.
        len: usize,
    },
    /// Not our magic.
    #[error("magic {found:#010x} is not the owner protocol's (\"UDOW\"): is this socket a userdma owner?")]
    Magic {
        /// What came.
        found: u32,
    },
    /// Another version.
    #[error("protocol version {found}, this build speaks {VERSION}: use a client and owner of one release")]
    Version {
        /// What came.
        found: u16,
    },
    /// An unknown kind.
    #[error("message kind {kind} is not one of the protocol's (1 to 13)")]
    Kind {
        /// What came.
        kind: u16,
    },
    /// The wrong length for its kind.
    #[error("a message of kind {kind} carries {len} bytes of payload, that kind has {expected}")]
    Length {
        /// The kind.
        kind: u16,
        /// What came.
        len: usize,
        /// What the kind has.
        expected: usize,
    },
    /// A name that is not one.
    #[error("a name of {len} bytes is not {why}")]
    Name {
        /// Its bytes up to the first NUL.
        len: usize,
        /// What a name must be.
        why: &'static str,
    },
    /// A field out of its range.
    #[error("field {field} is {value}: {why}")]
    Field {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What it must be.
        why: &'static str,
    },
}

/// Encodes `msg` into `out` (at least [`MAX_MESSAGE`] bytes); returns the message's length.
///
/// # Panics
/// If `out` is shorter than [`MAX_MESSAGE`] (a caller's bug: the buffer is its own).
pub fn encode(msg: &Msg, out: &mut [u8]) -> usize {
    let mut w = Writer { out, at: HEADER };
    let kind = match msg {
        Msg::Hello { pool_bytes, name } => {
            w.u64(*pool_bytes);
            w.name(name);
            K_HELLO
        }
        Msg::Welcome {
            client,
            pool_bytes,
            sq_entries,
            cq_entries,
            max_streams,
            max_in_flight,
        } => {
            w.u64(*client);
            w.u64(*pool_bytes);
            w.u32(*sq_entries);
            w.u32(*cq_entries);
            w.u32(*max_streams);
            w.u32(*max_in_flight);
            K_WELCOME
        }
        Msg::Declare {
            priority,
            period_ns,
            max_wait_ns,
            name,
            model,
        } => {
            w.u64(u64::from(*priority));
            w.u64(*period_ns);
            w.u64(*max_wait_ns);
            w.name(name);
            w.name(model);
            K_DECLARE
        }
        Msg::Declared {
            stream,
            input_bytes,
            result_bytes,
        } => {
            w.u64(u64::from(*stream));
            w.u64(*input_bytes);
            w.u64(*result_bytes);
            K_DECLARED
        }
        Msg::Close { stream } => {
            w.u64(u64::from(*stream));
            K_CLOSE
        }
        Msg::Closed { stream } => {
            w.u64(u64::from(*stream));
            K_CLOSED
        }
        Msg::Stats => K_STATS,
        Msg::StreamStats(s) => {
            w.u64(u64::from(s.stream));
            w.u64(s.client);
            w.name(&s.name);
            for v in [
                s.frames,
                s.failed,
                s.lost,
                s.latency_p50_ns,
                s.latency_p99_ns,
                s.latency_max_ns,
                s.max_head_wait_ns,
                s.bound_ns,
                s.frame_ns,
                s.period_ns,
            ] {
                w.u64(v);
            }
            K_STREAM_STATS
        }
        Msg::ClientStats(c) => {
            w.u64(c.client);
            w.u32(c.pid);
            w.u32(c.uid);
            w.name(&c.name);
            w.u32(c.streams);
            w.u32(c.in_flight);
            w.u64(c.frames);
            w.u64(c.pool_bytes);
            K_CLIENT_STATS
        }
        Msg::DeviceStats(d) => {
            w.name(&d.device);
            w.u64(d.clock_ns);
            w.u64(u64::from(d.counters.is_some()));
            let c = d.counters.unwrap_or_default();
            for u in [c.copy, c.compute] {
                for v in [
                    u.busy_ns,
                    u.descriptors,
                    u.bytes,
                    u.context_switches,
                    u.errors,
                ] {
                    w.u64(v);
                }
            }
            w.u64(c.sram_hits);
            w.u64(c.sram_touched);
            K_DEVICE_STATS
        }
        Msg::OwnerStats(o) => {
            w.u32(o.clients);
            w.u32(o.streams);
            w.u32(o.in_flight);
            w.u32(o.departing);
            for v in [
                o.mapped_bytes,
                o.frames,
                o.switches,
                o.refused,
                o.closed,
                o.vanished,
                o.left,
                o.resets,
            ] {
                w.u64(v);
            }
            K_OWNER_STATS
        }
        Msg::Event { kind, detail } => {
            w.u64(*kind as u64);
            w.u64(*detail);
            K_EVENT
        }
        Msg::Error { code, fatal, text } => {
            w.u32(*code);
            w.u32(u32::from(*fatal));
            // Cut at a character boundary to fit.
            let mut end = text.len().min(TEXT);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            w.bytes(&text.as_bytes()[..end], TEXT);
            K_ERROR
        }
    };
    let len = w.at;
    out[..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..6].copy_from_slice(&VERSION.to_le_bytes());
    out[6..8].copy_from_slice(&kind.to_le_bytes());
    len
}

/// A unit's figures on the wire ([`UnitFigures`]: five u64).
const UNIT: usize = 40;

/// The payload length of each kind.
fn payload_len(kind: u16) -> Option<usize> {
    Some(match kind {
        K_HELLO => 8 + NAME,
        K_WELCOME => 32,
        K_DECLARE => 24 + 2 * NAME,
        K_DECLARED => 24,
        K_CLOSE | K_CLOSED => 8,
        K_STATS => 0,
        K_STREAM_STATS => 16 + NAME + 80,
        K_CLIENT_STATS => 16 + NAME + 24,
        K_DEVICE_STATS => NAME + 16 + 2 * UNIT + 16,
        K_OWNER_STATS => 16 + 64,
        K_EVENT => 16,
        K_ERROR => 8 + TEXT,
        _ => return None,
    })
}

/// Decodes one message, checking everything the peer controls.
///
/// # Errors
/// [`ProtoError`]: what was wrong, for the error message the peer gets.
pub fn decode(bytes: &[u8]) -> Result<Msg, ProtoError> {
    if bytes.len() < HEADER {
        return Err(ProtoError::Short { len: bytes.len() });
    }
    let magic = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
    if magic != MAGIC {
        return Err(ProtoError::Magic { found: magic });
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != VERSION {
        return Err(ProtoError::Version { found: version });
    }
    let kind = u16::from_le_bytes([bytes[6], bytes[7]]);
    let expected = payload_len(kind).ok_or(ProtoError::Kind { kind })?;
    let payload = &bytes[HEADER..];
    if payload.len() != expected {
        return Err(ProtoError::Length {
            kind,
            len: payload.len(),
            expected,
        });
    }
    let mut r = Reader {
        bytes: payload,
        at: 0,
    };
    let msg = match kind {
        K_HELLO => Msg::Hello {
            pool_bytes: r.u64(),
            name: r.name()?,
        },
        K_WELCOME => Msg::Welcome {
            client: r.u64(),
            pool_bytes: r.u64(),
            sq_entries: r.u32(),
            cq_entries: r.u32(),
            max_streams: r.u32(),
            max_in_flight: r.u32(),
        },
        K_DECLARE => {
            let priority = r.u64();
            let priority = u8::try_from(priority).map_err(|_| ProtoError::Field {
                field: "priority",
                value: priority,
                why: "a priority is 0 to 255",
            })?;
            Msg::Declare {
                priority,
                period_ns: r.u64(),
                max_wait_ns: r.u64(),
                name: r.name()?,
                model: r.name()?,
            }
        }
        K_DECLARED => Msg::Declared {
            stream: r.u32_in_u64("stream")?,
            input_bytes: r.u64(),
            result_bytes: r.u64(),
        },
        K_CLOSE => Msg::Close {
            stream: r.u32_in_u64("stream")?,
        },
        K_CLOSED => Msg::Closed {
            stream: r.u32_in_u64("stream")?,
        },
        K_STATS => Msg::Stats,
        K_STREAM_STATS => Msg::StreamStats(StreamFigures {
            stream: r.u32_in_u64("stream")?,
            client: r.u64(),
            name: r.name()?,
            frames: r.u64(),
            failed: r.u64(),
            lost: r.u64(),
            latency_p50_ns: r.u64(),
            latency_p99_ns: r.u64(),
            latency_max_ns: r.u64(),
            max_head_wait_ns: r.u64(),
            bound_ns: r.u64(),
            frame_ns: r.u64(),
            period_ns: r.u64(),
        }),
        K_CLIENT_STATS => Msg::ClientStats(ClientFigures {
            client: r.u64(),
            pid: r.u32(),
            uid: r.u32(),
            name: r.name()?,
            streams: r.u32(),
            in_flight: r.u32(),
            frames: r.u64(),
            pool_bytes: r.u64(),
        }),
        K_DEVICE_STATS => {
            let device = r.name()?;
            let clock_ns = r.u64();
            let known = r.u64();
            let mut unit = || UnitFigures {
                busy_ns: r.u64(),
                descriptors: r.u64(),
                bytes: r.u64(),
                context_switches: r.u64(),
                errors: r.u64(),
            };
            let counters = DeviceCounters {
                copy: unit(),
                compute: unit(),
                sram_hits: r.u64(),
                sram_touched: r.u64(),
            };
            let counters = match known {
                1 => Some(counters),
                // Without counters every counter word is zero: what decodes encodes back to
                // the same bytes.
                0 if counters == DeviceCounters::default() => None,
                0 => {
                    return Err(ProtoError::Field {
                        field: "counters",
                        value: 0,
                        why: "counters absent (0) with counter words that are not zero",
                    })
                }
                _ => {
                    return Err(ProtoError::Field {
                        field: "counters",
                        value: known,
                        why: "0 (absent) or 1 (present)",
                    })
                }
            };
            Msg::DeviceStats(DeviceFigures {
                device,
                clock_ns,
                counters,
            })
        }
        K_OWNER_STATS => Msg::OwnerStats(OwnerFigures {
            clients: r.u32(),
            streams: r.u32(),
            in_flight: r.u32(),
            departing: r.u32(),
            mapped_bytes: r.u64(),
            frames: r.u64(),
            switches: r.u64(),
            refused: r.u64(),
            closed: r.u64(),
            vanished: r.u64(),
            left: r.u64(),
            resets: r.u64(),
        }),
        K_EVENT => {
            let value = r.u64();
            let kind = u32::try_from(value)
                .ok()
                .and_then(EventKind::from_u32)
                .ok_or(ProtoError::Field {
                    field: "event",
                    value,
                    why: "an event is 1 (reset), 2 (removed) or 3 (shutdown)",
                })?;
            Msg::Event {
                kind,
                detail: r.u64(),
            }
        }
        K_ERROR => {
            let code = r.u32();
            let fatal = r.u32();
            if fatal > 1 {
                return Err(ProtoError::Field {
                    field: "fatal",
                    value: u64::from(fatal),
                    why: "0 or 1",
                });
            }
            let raw = r.take(TEXT);
            let end = raw.iter().position(|&b| b == 0).unwrap_or(TEXT);
            // A text cut by the sender mid-character is still shown; replacement characters
            // can make it longer than the wire holds, so it is cut again to fit (at a
            // character boundary): what decodes encodes back to itself.
            let mut text = String::from_utf8_lossy(&raw[..end]).into_owned();
            let mut fit = text.len().min(TEXT);
            while !text.is_char_boundary(fit) {
                fit -= 1;
            }
            text.truncate(fit);
            Msg::Error {
                code,
                fatal: fatal == 1,
                text,
            }
        }
        _ => return Err(ProtoError::Kind { kind }),
    };
    Ok(msg)
}

struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn u64(&mut self, v: u64) {
        self.out[self.at..self.at + 8].copy_from_slice(&v.to_le_bytes());
        self.at += 8;
    }
    fn u32(&mut self, v: u32) {
        self.out[self.at..self.at + 4].copy_from_slice(&v.to_le_bytes());
        self.at += 4;
    }
    fn bytes(&mut self, b: &[u8], width: usize) {
        self.out[self.at..self.at + b.len()].copy_from_slice(b);
        self.out[self.at + b.len()..self.at + width].fill(0);
        self.at += width;
    }
    fn name(&mut self, n: &Name) {
        self.bytes(n.as_str().as_bytes(), NAME);
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    // Lengths were checked against the kind's fixed layout before any read.
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        s
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8 bytes"))
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    fn u32_in_u64(&mut self, field: &'static str) -> Result<u32, ProtoError> {
        let v = self.u64();
        u32::try_from(v).map_err(|_| ProtoError::Field {
            field,
            value: v,
            why: "a stream number fits 32 bits",
        })
    }
    fn name(&mut self) -> Result<Name, ProtoError> {
        let raw = self.take(NAME);
        let end = raw.iter().position(|&b| b == 0).unwrap_or(NAME);
        if raw[end..].iter().any(|&b| b != 0) {
            return Err(ProtoError::Name {
                len: end,
                why: "padded with zeros after its text",
            });
        }
        let text = std::str::from_utf8(&raw[..end]).map_err(|_| ProtoError::Name {
            len: end,
            why: "UTF-8",
        })?;
        Name::new(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(msg: Msg) {
        let mut buf = [0u8; MAX_MESSAGE];
        let n = encode(&msg, &mut buf);
        assert_eq!(decode(&buf[..n]).unwrap(), msg);
        // Every shorter or longer message is refused.
        assert!(decode(&buf[..n - 1]).is_err());
        if n < MAX_MESSAGE {
            assert!(decode(&buf[..n + 1]).is_err());
        }
    }

    #[test]
    fn every_kind_round_trips() {
        let name = Name::new("live").unwrap();
        round(Msg::Hello {
            pool_bytes: 8 << 20,
            name,
        });
        round(Msg::Welcome {
            client: 3,
            pool_bytes: 1 << 24,
            sq_entries: 64,
            cq_entries: 64,
            max_streams: 4,
            max_in_flight: 64,
        });
        round(Msg::Declare {
            priority: 200,
            period_ns: 40_000_000,
            max_wait_ns: 0,
            name,
            model: Name::new("yolov5s").unwrap(),
        });
        round(Msg::Declared {
            stream: 1,
            input_bytes: 1228800,
            result_bytes: 4096,
        });
        round(Msg::Close { stream: 7 });
        round(Msg::Closed { stream: 7 });
        round(Msg::Stats);
        round(Msg::StreamStats(StreamFigures {
            stream: 2,
            client: 9,
            name,
            frames: 10,
            bound_ns: 5,
            ..StreamFigures::default()
        }));
        round(Msg::ClientStats(ClientFigures {
            client: 1,
            pid: 77,
            uid: 0,
            name: Name::new("camera service").unwrap(),
            ..ClientFigures::default()
        }));
        round(Msg::DeviceStats(DeviceFigures {
            device: Name::lossy("loopback NPU owner0"),
            clock_ns: 1_500_000_000,
            counters: Some(DeviceCounters {
                copy: UnitFigures {
                    busy_ns: 3,
                    descriptors: 4,
                    ..UnitFigures::default()
                },
                compute: UnitFigures {
                    errors: 1,
                    context_switches: u64::MAX,
                    ..UnitFigures::default()
                },
                sram_hits: 7,
                sram_touched: 8,
            }),
        }));
        round(Msg::DeviceStats(DeviceFigures {
            device: Name::default(),
            clock_ns: 1,
            counters: None,
        }));
        round(Msg::OwnerStats(OwnerFigures {
            clients: 2,
            resets: 1,
            ..OwnerFigures::default()
        }));
        round(Msg::Event {
            kind: EventKind::Reset,
            detail: 9,
        });
        round(Msg::Error {
            code: 3,
            fatal: true,
            text: "uid 1000 is not allowed".into(),
        });
    }

    #[test]
    fn every_kind_fits_the_longest_message() {
        for kind in 1..=K_DEVICE_STATS {
            let len = payload_len(kind).expect("a kind");
            assert!(HEADER + len <= MAX_MESSAGE, "kind {kind}: {len} bytes");
        }
        assert_eq!(payload_len(K_DEVICE_STATS + 1), None);
    }

    #[test]
    fn names_are_cut_to_fit_and_keep_their_text() {
        let long = "é".repeat(20); // 40 bytes
        let n = Name::lossy(&long);
        assert_eq!(n.as_str(), "é".repeat(16));
        assert_eq!(Name::lossy("a\0b").as_str(), "ab");
        assert_eq!(format!("{:?}", Name::new("x").unwrap()), "\"x\"");
        assert_eq!(Name::default().as_str(), "");
    }

    #[test]
    fn device_counters_are_present_or_all_zero() {
        let mut buf = [0u8; MAX_MESSAGE];
        let figures = DeviceFigures {
            device: Name::new("npu").unwrap(),
            clock_ns: 5,
            counters: None,
        };
        let n = encode(&Msg::DeviceStats(figures), &mut buf);
        let known = HEADER + NAME + 8;
        // A flag that is neither 0 nor 1.
        buf[known] = 2;
        assert!(matches!(
            decode(&buf[..n]),
            Err(ProtoError::Field {
                field: "counters",
                value: 2,
                ..
            })
        ));
        // Absent, with a counter word that is not zero: refused (it would not encode back).
        buf[known] = 0;
        buf[known + 8 + 3] = 1;
        assert!(matches!(
            decode(&buf[..n]),
            Err(ProtoError::Field {
                field: "counters",
                value: 0,
                ..
            })
        ));
        // Present: any counts.
        buf[known] = 1;
        let Ok(Msg::DeviceStats(d)) = decode(&buf[..n]) else {
            panic!("device figures")
        };
        assert_eq!(d.counters.unwrap().copy.busy_ns, 1 << 24);
        // The device's name is checked as every name.
        buf[HEADER + 5] = b'x';
        assert!(matches!(decode(&buf[..n]), Err(ProtoError::Name { .. })));
    }

    #[test]
    fn another_version_is_refused_with_both_numbers() {
        let mut buf = [0u8; MAX_MESSAGE];
        let n = encode(&Msg::Stats, &mut buf);
        buf[4] = 1;
        let e = decode(&buf[..n]).unwrap_err();
        assert_eq!(e, ProtoError::Version { found: 1 });
        assert!(
            e.to_string().contains("version 1, this build speaks 2"),
            "{e}"
        );
    }

    #[test]
    fn hostile_fields_are_refused() {
        let mut buf = [0u8; MAX_MESSAGE];
        let n = encode(&Msg::Close { stream: 1 }, &mut buf);
        buf[HEADER + 4] = 1; // stream above u32
        assert!(matches!(decode(&buf[..n]), Err(ProtoError::Field { .. })));
        let n = encode(
            &Msg::Hello {
                pool_bytes: 1,
                name: Name::new("a").unwrap(),
            },
            &mut buf,
        );
        buf[HEADER + 8 + 2] = b'x'; // text after the padding
        assert!(matches!(decode(&buf[..n]), Err(ProtoError::Name { .. })));
        buf[HEADER + 8] = 0xFF; // not UTF-8
        buf[HEADER + 8 + 2] = 0;
        assert!(matches!(decode(&buf[..n]), Err(ProtoError::Name { .. })));
        buf[6] = 99;
        assert_eq!(decode(&buf[..n]), Err(ProtoError::Kind { kind: 99 }));
        buf[0] = 0;
        assert!(matches!(decode(&buf[..n]), Err(ProtoError::Magic { .. })));
        assert!(matches!(decode(&[1, 2]), Err(ProtoError::Short { len: 2 })));
        assert!(Name::new(&"x".repeat(33)).is_err());
        // An error text cut mid-character still encodes and decodes.
        let long = "é".repeat(200);
        let n = encode(
            &Msg::Error {
                code: 1,
                fatal: false,
                text: long,
            },
            &mut buf,
        );
        assert!(matches!(decode(&buf[..n]), Ok(Msg::Error { .. })));
        // Bytes that are not UTF-8 decode to replacement characters cut to what the wire
        // holds: the message encodes back to itself.
        buf[HEADER + 8..HEADER + 8 + TEXT].fill(0xFF);
        let Ok(m @ Msg::Error { .. }) = decode(&buf[..n]) else {
            panic!("an error message")
        };
        let mut again = [0u8; MAX_MESSAGE];
        let k = encode(&m, &mut again);
        assert_eq!(decode(&again[..k]).unwrap(), m);
    }
}
