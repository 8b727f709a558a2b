//! The C types of a device owner's client: its handle, statuses, options, buffers,
//! completions, figures and events, with the layouts C compiles against.

use std::ffi::{c_char, c_void};

use userdma_owner::chan;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi;

/// A connection to a device owner, made by `udma_owner_connect`, closed by
/// `udma_owner_disconnect`.
#[derive(Debug)]
pub struct udma_owner_client {
    _opaque: [u8; 0],
}

/// A completion's `status`: the frame ran, or why not.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_owner_status {
    /// The frame ran; its result is in the result buffer.
    UDMA_OWNER_STATUS_OK = 0,
    /// The device failed the frame; the result buffer holds no result.
    UDMA_OWNER_STATUS_FAILED = 1,
    /// The frame was in flight when the device was reset: submit it again.
    UDMA_OWNER_STATUS_LOST = 2,
    /// The owner refused the submission: a stream this client did not declare (or closed), or
    /// an input or result span outside this client's pool or shorter than the model needs.
    /// Nothing was read or written.
    UDMA_OWNER_STATUS_REFUSED = 3,
    /// The device was removed: no more frames run.
    UDMA_OWNER_STATUS_REMOVED = 4,
    /// The stream was closed before the frame ran.
    UDMA_OWNER_STATUS_CLOSED = 5,
}

const _: () = {
    assert!(udma_owner_status::UDMA_OWNER_STATUS_OK as u32 == chan::STATUS_OK);
    assert!(udma_owner_status::UDMA_OWNER_STATUS_FAILED as u32 == chan::STATUS_FAILED);
    assert!(udma_owner_status::UDMA_OWNER_STATUS_LOST as u32 == chan::STATUS_LOST);
    assert!(udma_owner_status::UDMA_OWNER_STATUS_REFUSED as u32 == chan::STATUS_REFUSED);
    assert!(udma_owner_status::UDMA_OWNER_STATUS_REMOVED as u32 == chan::STATUS_REMOVED);
    assert!(udma_owner_status::UDMA_OWNER_STATUS_CLOSED as u32 == chan::STATUS_CLOSED);
};

/// A `udma_owner_event`'s `kind`: what the owner told its clients.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_owner_event_kind {
    /// No event waiting.
    UDMA_OWNER_EVENT_NONE = 0,
    /// The device was reset after a fault (`detail`: the fault's code): frames in flight
    /// completed with `UDMA_OWNER_STATUS_LOST`; submit them again.
    UDMA_OWNER_EVENT_RESET = 1,
    /// The device was removed: no more frames run; connect to an owner of another device.
    UDMA_OWNER_EVENT_REMOVED = 2,
    /// The owner is shutting down: disconnect, and connect again (with `wait_ns`) once it is
    /// back.
    UDMA_OWNER_EVENT_SHUTDOWN = 3,
}

/// How to connect (`udma_owner_connect`). Zero is the default for every field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_owner_options {
    /// `sizeof(udma_owner_options)`.
    pub size: usize,
    /// Bytes of the pool the owner makes for this client (it may give less: its limit);
    /// 0: 16 MiB.
    pub pool_bytes: u64,
    /// This client's name in the owner's accounting, 1 to 32 bytes of UTF-8 (copied); NULL:
    /// the program's name.
    pub name: *const c_char,
    /// How long to keep trying while no owner listens at the socket, in ns (for a program
    /// started before its owner, or reconnecting while it restarts); 0: try once;
    /// `UDMA_TIMEOUT_INFINITE`: until one does.
    pub wait_ns: u64,
}

impl Default for udma_owner_options {
    fn default() -> udma_owner_options {
        udma_owner_options {
            size: 0,
            pool_bytes: 0,
            name: std::ptr::null(),
            wait_ns: 0,
        }
    }
}

// SAFETY: `repr(C)`, integers and a raw pointer (any bit pattern is a valid raw pointer value;
// read as a C string after a NULL check), 8 * 4 = 32 bytes with no padding.
unsafe impl abi::Bytes for udma_owner_options {}
abi::sized!(udma_owner_options);

/// A stream to declare (`udma_owner_declare`). Zero is the default for every field but `name`
/// and `model`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_owner_stream_options {
    /// `sizeof(udma_owner_stream_options)`.
    pub size: usize,
    /// Its name, unique among this client's streams, 1 to 32 bytes of UTF-8 (copied).
    pub name: *const c_char,
    /// The model its frames run, by name in the owner's catalogue, 1 to 32 bytes (copied).
    pub model: *const c_char,
    /// Its frames' period in ns (the owner's bounds count with it); 0: as fast as possible.
    pub period_ns: u64,
    /// A frame that has waited this long runs next, whatever its priority; 0: no maximum.
    pub max_wait_ns: u64,
    /// Higher runs first, 0 to 255.
    pub priority: u32,
    /// Zero.
    pub reserved: u32,
}

impl Default for udma_owner_stream_options {
    fn default() -> udma_owner_stream_options {
        udma_owner_stream_options {
            size: 0,
            name: std::ptr::null(),
            model: std::ptr::null(),
            period_ns: 0,
            max_wait_ns: 0,
            priority: 0,
            reserved: 0,
        }
    }
}

// SAFETY: `repr(C)`, two raw pointers (any bit pattern is a valid raw pointer value; read as
// C strings after a NULL check) and integers, 8 * 5 + 4 + 4 = 48 bytes with no padding.
unsafe impl abi::Bytes for udma_owner_stream_options {}
abi::sized!(udma_owner_stream_options);

/// A declared stream (`udma_owner_declare`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_owner_stream_info {
    /// `sizeof(udma_owner_stream_info)`.
    pub size: usize,
    /// Its number, for `udma_owner_submit` and in completions.
    pub stream: u32,
    /// Zero.
    pub reserved: u32,
    /// The least length of a frame's input buffer.
    pub input_bytes: u64,
    /// The least length of a frame's result buffer.
    pub result_bytes: u64,
}

abi::sized!(udma_owner_stream_info);

/// A buffer of the client's pool (`udma_owner_alloc`), shared with the owner, who maps it for
/// the device.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_owner_buffer {
    /// `sizeof(udma_owner_buffer)`.
    pub size: usize,
    /// The host address of byte 0, valid until `udma_owner_free` or `udma_owner_disconnect`.
    /// Write an input before submitting it; read a result after its completion is taken: the
    /// device reads and writes it in between.
    pub host: *mut c_void,
    /// Its length, the `len` asked for.
    pub len: usize,
    /// Its offset in the pool: what `udma_owner_submit` and `udma_owner_free` take.
    pub offset: u64,
}

// SAFETY: `repr(C)`, a raw pointer (any bit pattern is a valid raw pointer value) and
// integers, 8 * 4 = 32 bytes with no padding.
unsafe impl abi::Bytes for udma_owner_buffer {}
abi::sized!(udma_owner_buffer);

/// A frame done (`udma_owner_poll`, `udma_owner_wait`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_owner_completion {
    /// `sizeof(udma_owner_completion)`.
    pub size: usize,
    /// The stream, as submitted.
    pub stream: u32,
    /// A `udma_owner_status` (`udma_owner_status_name` names it).
    pub status: u32,
    /// The submission's tag.
    pub tag: u64,
    /// From the owner taking the frame to its completion, in ns.
    pub latency_ns: u64,
    /// From the owner taking the frame to its dispatch to the device, in ns.
    pub wait_ns: u64,
}

abi::sized!(udma_owner_completion);

/// One stream's figures as the owner counts them (`udma_owner_get_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_owner_stream_figures {
    /// `sizeof(udma_owner_stream_figures)`.
    pub size: usize,
    /// The stream's number.
    pub stream: u32,
    /// Zero.
    pub reserved: u32,
    /// Frames finished.
    pub frames: u64,
    /// Frames the device failed.
    pub failed: u64,
    /// Frames lost to device resets.
    pub lost: u64,
    /// Latency from the owner taking a frame to its completion, in ns: the median.
    pub latency_p50_ns: u64,
    /// Its 99th percentile.
    pub latency_p99_ns: u64,
    /// Its maximum.
    pub latency_max_ns: u64,
    /// The longest wait as the owner's scheduler bounds count it, in ns.
    pub max_head_wait_ns: u64,
    /// The bound on that wait the owner states from the frame times measured so far, in ns
    /// (0: none yet).
    pub bound_ns: u64,
    /// The longest device time of one of its frames so far, in ns.
    pub frame_ns: u64,
    /// The period it declared, in ns (0: as fast as possible).
    pub period_ns: u64,
}

abi::sized!(udma_owner_stream_figures);

/// The owner's totals (`udma_owner_get_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_owner_figures {
    /// `sizeof(udma_owner_figures)`.
    pub size: usize,
    /// Clients connected.
    pub clients: u32,
    /// Streams over all clients.
    pub streams: u32,
    /// Frames on the device.
    pub in_flight: u32,
    /// Clients that left whose memory is still held for their frames in flight.
    pub departing: u32,
    /// Bytes of client pools mapped for the device.
    pub mapped_bytes: u64,
    /// Frames completed since the owner started.
    pub frames: u64,
    /// Context switches the owner's scheduler caused.
    pub switches: u64,
    /// Clients refused at the door.
    pub refused: u64,
    /// Clients closed for bad messages or limits.
    pub closed: u64,
    /// Clients that hung up with frames out (crashed, killed).
    pub vanished: u64,
    /// Clients that hung up with nothing out.
    pub left: u64,
    /// Device resets.
    pub resets: u64,
}

abi::sized!(udma_owner_figures);

/// Something the owner told its clients (`udma_owner_next_event`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_owner_event {
    /// `sizeof(udma_owner_event)`.
    pub size: usize,
    /// A `udma_owner_event_kind`.
    pub kind: u32,
    /// Zero.
    pub reserved: u32,
    /// `UDMA_OWNER_EVENT_RESET`: the fault's code; otherwise 0.
    pub detail: u64,
}

abi::sized!(udma_owner_event);

/// A client's state (`udma_owner_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_owner_info {
    /// `sizeof(udma_owner_info)`.
    pub size: usize,
    /// The owner's number for this client.
    pub client: u64,
    /// Bytes of its pool (what the owner gave: at most `udma_owner_options.pool_bytes`).
    pub pool_bytes: u64,
    /// Frames submitted whose completions were not taken.
    pub in_flight: u32,
    /// The most frames it may have in flight (`udma_owner_submit` is busy beyond).
    pub max_in_flight: u32,
    /// The most streams it may declare.
    pub max_streams: u32,
    /// 1 once the owner has closed the connection (its shutdown, or this client refused), 0
    /// before.
    pub gone: u32,
}

abi::sized!(udma_owner_info);

// The layouts the SAFETY comments above count.
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<udma_owner_options>() == 32);
    assert!(size_of::<udma_owner_stream_options>() == 48);
    assert!(size_of::<udma_owner_stream_info>() == 32);
    assert!(size_of::<udma_owner_buffer>() == 32);
    assert!(size_of::<udma_owner_completion>() == 40);
    assert!(size_of::<udma_owner_stream_figures>() == 96);
    assert!(size_of::<udma_owner_figures>() == 88);
    assert!(size_of::<udma_owner_event>() == 24);
    assert!(size_of::<udma_owner_info>() == 40);
};
