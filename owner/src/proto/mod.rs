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

mod wire;
pub use wire::{decode, encode};

#[cfg(test)]
mod tests;
