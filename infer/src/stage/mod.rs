//! Zero-copy staging: files read straight into pool buffers, and written straight out of
//! them, through io_uring with the pool's memory registered as fixed buffers.
//!
//! ```text
//!   Stager::new(pool)        pool arena -> fixed buffers (IORING_REGISTER_BUFFERS), once
//!   File::open(path, Direct::Prefer)
//!                            statx(STATX_DIOALIGN) or the block device's logical block size
//!                            -> O_DIRECT with its alignment, or buffered (and why)
//!   stager.read(&file, offset, buffer)   buffer moves into the stager; READ_FIXED queued
//!   stager.submit() / wait()             many in flight (the depth); completions matched to
//!                            their buffers by ticket; short reads resubmitted; EOF reported
//!   Completion { ticket, buffer, result }  the buffer comes back only here
//! ```
//!
//! # Design
//!
//! **Fixed buffers.** The pool's arena is registered with the ring in pieces of
//! [`MAX_FIXED_BUFFER_BYTES`] (1 GiB, the kernel's limit per buffer) or, for a smaller arena,
//! one piece covering it all; at most [`MAX_FIXED_BUFFERS`] (16,384) pieces. Pieces are aligned
//! in the arena to their size, and every pool block is aligned (in the arena) to its own size,
//! so a buffer of up to 1 GiB lies in exactly one piece: [`Stager::fixed`] gives its index and
//! offset. The kernel pins the registered pages once; no read pins or unpins anything.
//!
//! **O_DIRECT where it works.** [`File::open`] asks `statx(STATX_DIOALIGN)` (Linux 6.1) for
//! the file's direct-I/O alignment, or, where the file system does not answer, the logical
//! block size of the block device under it. Where neither knows (tmpfs, network and fuse file
//! systems) or the open fails, the file is read buffered — one copy in the kernel, none in
//! user space — and [`File::mode`] / [`File::fallback`] say which path runs and why. A request
//! whose offset, length or buffer address is not aligned for direct I/O is refused before it
//! reaches the kernel ([`Error::Misaligned`] names the alignment). Buffers for direct I/O come
//! from a page-aligned pool: a VFIO or UIO device's by default; on a device that takes 256-byte
//! alignment (the loopback NPU), whose pools are cache-coloured by default, ask for one with
//! `pool::Config::colouring(false)` through `Runtime::pool_with` (a pipeline's own pool is
//! page aligned already).
//!
//! **Buffers in flight belong to the stager.** [`Stager::read`] and [`Stager::write`] take
//! the [`OwnedBuffer`] by value and give it back only in its [`Completion`]: the kernel can
//! never write into a buffer the program has freed or reused. A refused request hands the
//! buffer back in [`Refused`]. Dropping a stager with requests in flight cancels them and waits
//! for every completion before the buffers go back to the pool; if the ring cannot be waited
//! on, the buffers are leaked instead (the pool then keeps its mapping, see
//! [`pool::leaked_mappings`](userdma::pool::leaked_mappings)).
//!
//! **Short reads and EOF.** A read of a regular file that returns fewer bytes than asked is
//! resubmitted for the rest (when the rest is still aligned, for direct I/O); a read that
//! returns nothing has reached the end of the file. A short read of a pipe, FIFO or device
//! completes as it is (that is what was there). [`Transfer`] reports the bytes moved; the buffer's length is
//! set to them; [`Completion::into_full`] turns a short read into [`Error::ShortRead`] /
//! [`Error::Eof`].
//!
//! **Pipeline frames.** [`FrameSource`] reads frame `i` of a file (at `i × frame_bytes`)
//! straight into a pipeline slot's input buffer from the preprocess callback, and
//! [`FrameSink`] writes each result straight from the slot's host result buffer from
//! postprocess, with a stager made over [`Pipeline::pool`](crate::pipeline::Pipeline::pool).
//! The slot stays the pipeline's: each request is waited for before the callback returns. The
//! end of the file at a frame boundary ends the source ([`Pull::End`]); a file ending inside
//! a frame is [`Error::ShortFrame`]; a result read in place from device memory is refused by
//! the sink ([`Error::InPlaceResult`]).
//!
//! **Sockets.** [`File::from_stream`] wraps a connected TCP or Unix stream socket (or a
//! pipe); [`Stager::recv`] receives into a pool buffer with the same `READ_FIXED` and the
//! same ownership as a file read: the buffer is the stager's until its completion, a receive
//! waiting for data can be cancelled (the buffer comes back with [`Error::Cancelled`]), and
//! dropping the stager cancels and waits. A short receive is normal on a socket: the
//! completion says how many bytes came; [`Stager::recv_exact`] resubmits for the rest until
//! the buffer is full. The peer's close is a receive of 0 bytes (the end of the stream).
//!
//! **Limits.** io_uring charges registered buffers to `RLIMIT_MEMLOCK` (unless the process has
//! `CAP_IPC_LOCK`), on top of what `mlock` already counts: [`Error::MemlockLimit`] says how many
//! bytes are needed and how to raise the limit. A kernel without io_uring, or with it disabled
//! by `/proc/sys/kernel/io_uring_disabled`, gives [`Error::Unavailable`] / [`Error::Disabled`];
//! memory the kernel refuses to register (file-backed mappings on older kernels),
//! [`Error::Register`].
//!
//! ```no_run
//! use userdma_loopback::{self as loopback, LoopbackRuntime};
//! use userdma::memory::PageSize;
//! use userdma_infer::stage::{self, Direct, File, Stager};
//! use userdma::Runtime;
//!
//! # fn main() -> Result<(), userdma_infer::Error> {
//! let runtime = Runtime::loopback(loopback::Config::default())?;
//! let pool = runtime.pool(64 << 20, PageSize::Base)?;
//! let mut stager = Stager::new(pool.clone(), stage::Config::default().depth(16))?;
//! let file = File::open("weights.bin", Direct::Prefer)?;
//! println!("{} path", file.mode());
//! let ticket = stager.read(&file, 0, pool.alloc_owned(1 << 20)?)?;
//! stager.submit()?;
//! let done = stager.wait()?;
//! assert_eq!(done.ticket, ticket);
//! let buffer = done.into_full()?; // 1 MiB of the file, in DMA memory, no user-space copy
//! # drop(buffer);
//! # Ok(())
//! # }
//! ```

use std::io;
use std::path::PathBuf;

use userdma::pool::OwnedBuffer;

mod file;
mod frames;
mod layout;
mod shim;
mod slots;
mod stager;

pub use self::file::{Alignment, Direct, File, Mode};
pub use self::frames::{FrameSink, FrameSource, Pull};
pub use self::layout::{Fixed, Layout, MAX_FIXED_BUFFERS, MAX_FIXED_BUFFER_BYTES};
pub use self::shim::process_cpu_time;
pub use self::stager::{Completion, Config, Op, Stager, Ticket, Transfer};

/// The largest queue depth a [`Stager`] accepts.
pub const MAX_DEPTH: u32 = 4096;

/// Errors of the stage module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kernel has no io_uring.
    #[error(
        "this kernel has no io_uring (io_uring_setup: {source}): use a kernel built with \
         CONFIG_IO_URING (Linux 5.1 or later)"
    )]
    Unavailable {
        /// What `io_uring_setup` returned.
        #[source]
        source: io::Error,
    },
    /// io_uring is disabled by `/proc/sys/kernel/io_uring_disabled`.
    #[error(
        "io_uring is disabled here (/proc/sys/kernel/io_uring_disabled = {value}): set it to 0 \
         (`sysctl kernel.io_uring_disabled=0`), or for 1 add this user to the group in \
         /proc/sys/kernel/io_uring_group"
    )]
    Disabled {
        /// The sysctl's value (1: only the io_uring group and CAP_SYS_ADMIN, 2: nobody).
        value: u32,
        /// What `io_uring_setup` returned.
        #[source]
        source: io::Error,
    },
    /// `io_uring_setup` failed for another reason.
    #[error("cannot create an io_uring of {entries} entries")]
    RingSetup {
        /// Submission queue entries asked for.
        entries: u32,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The queue depth is out of range.
    #[error("stage queue depth {depth} is out of range: use 1 ..= {max}")]
    Depth {
        /// The depth given.
        depth: u32,
        /// The largest accepted.
        max: u32,
    },
    /// The pool needs more fixed buffers than the kernel allows.
    #[error(
        "the pool's {bytes}-byte arena needs {needed} fixed buffers of at most {piece} bytes; \
         io_uring registers at most {max}: use a smaller pool"
    )]
    TooManyFixedBuffers {
        /// Arena bytes.
        bytes: u64,
        /// Bytes per fixed buffer.
        piece: u64,
        /// Fixed buffers needed.
        needed: u64,
        /// The kernel's limit.
        max: u64,
    },
    /// Registering the pool's memory would exceed `RLIMIT_MEMLOCK`.
    #[error(
        "registering {needed} bytes of pool memory with io_uring exceeds RLIMIT_MEMLOCK \
         ({limit} bytes; io_uring counts registered buffers on top of mlock): raise it to at \
         least {needed} bytes plus what the process already locks (`ulimit -l` in KiB, \
         LimitMEMLOCK= in a systemd unit, memlock in /etc/security/limits.conf), or give the \
         process CAP_IPC_LOCK"
    )]
    MemlockLimit {
        /// Bytes the registration pins.
        needed: u64,
        /// The soft limit in bytes (`u64::MAX`: unlimited).
        limit: u64,
        /// What the registration returned.
        #[source]
        source: io::Error,
    },
    /// The kernel refused to register the pool's memory.
    #[error(
        "io_uring refused to register {buffers} fixed buffers ({bytes} bytes) of pool memory: \
         older kernels refuse file-backed (memfd) memory; build the pool over anonymous or \
         hugetlb memory"
    )]
    Register {
        /// Fixed buffers.
        buffers: u32,
        /// Their bytes.
        bytes: u64,
        /// What the registration returned.
        #[source]
        source: io::Error,
    },
    /// Opening a file failed.
    #[error("cannot open {path}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// `statx` on a file failed.
    #[error("cannot stat {path}")]
    Stat {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Direct I/O was required, but the file's file system does not support it.
    #[error("{path}: direct I/O (O_DIRECT) is not available: {reason}; open it with Direct::Prefer to fall back to buffered reads")]
    DirectUnsupported {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: &'static str,
    },
    /// A direct-I/O request is not aligned.
    #[error(
        "{path}: direct I/O needs the {what} aligned to {align} bytes, got {value:#x}: {}, or \
         open the file with Direct::Off",
        misaligned_fix(.what, *.align)
    )]
    Misaligned {
        /// The file.
        path: PathBuf,
        /// `"file offset"`, `"length"` or `"buffer address"`.
        what: &'static str,
        /// The misaligned value.
        value: u64,
        /// The alignment needed.
        align: u32,
    },
    /// A request longer than its buffer.
    #[error("a request of {len} bytes does not fit its {buffer}-byte buffer: ask for at most the buffer's length")]
    Length {
        /// Bytes asked for.
        len: usize,
        /// The buffer's length.
        buffer: usize,
    },
    /// A receive from a regular file.
    #[error("{path} is a regular file, not a stream: receive from a socket or pipe (File::from_stream), or read the file with Stager::read")]
    NotAStream {
        /// The file.
        path: PathBuf,
    },
    /// The file ends inside a frame.
    #[error(
        "{path} ends inside frame {frame}: {got} of its {frame_bytes} bytes are there (the \
         file is not a whole number of frames)"
    )]
    ShortFrame {
        /// The file.
        path: PathBuf,
        /// The frame's index in the file.
        frame: u64,
        /// Bytes of it in the file.
        got: usize,
        /// Bytes per frame.
        frame_bytes: usize,
    },
    /// A write stopped short.
    #[error("wrote {got} of {wanted} bytes at offset {offset:#x} of {path} (is the disk full?)")]
    ShortWrite {
        /// The file.
        path: PathBuf,
        /// Offset of the request.
        offset: u64,
        /// Bytes asked for.
        wanted: usize,
        /// Bytes written.
        got: usize,
    },
    /// A pipeline result read in place from device memory, given to a [`FrameSink`].
    #[error(
        "the result to write to {path} is read in place from device memory and has no host \
         buffer to write from: build the pipeline with Results::Copy to write results to a file"
    )]
    InPlaceResult {
        /// The sink's file.
        path: PathBuf,
    },
    /// A request of zero bytes.
    #[error("a stage request needs at least one byte: set the buffer's length first")]
    Empty,
    /// A request beyond the largest file offset.
    #[error(
        "a {len}-byte request at offset {offset:#x} ends beyond the largest file offset (2^63 - 1)"
    )]
    Offset {
        /// Offset asked for.
        offset: u64,
        /// Length.
        len: usize,
    },
    /// The buffer is not from the stager's pool, or lies in no single fixed buffer.
    #[error(
        "the buffer (mapping offset {offset:#x}, {len} bytes) is not inside one fixed buffer of \
         this stager's pool: allocate it from the pool the stager was made with, at most 1 GiB"
    )]
    NotRegistered {
        /// The buffer's offset in its pool's mapping.
        offset: usize,
        /// Its length.
        len: usize,
    },
    /// Writing to a file opened read-only.
    #[error("{path} was opened read-only: open it with File::create to write")]
    ReadOnly {
        /// The file.
        path: PathBuf,
    },
    /// As many requests as the depth are in flight.
    #[error("{depth} requests are in flight, the stager's depth: wait() for a completion first")]
    Full {
        /// The depth.
        depth: u32,
    },
    /// Waiting with nothing in flight.
    #[error("nothing is in flight: submit a read or write before waiting")]
    Idle,
    /// Submitting to or waiting on the ring failed.
    #[error("io_uring_enter failed")]
    Enter(#[source] io::Error),
    /// The kernel completed a request with an error.
    #[error("{op} of {len} bytes at offset {offset:#x} of {path} failed")]
    Io {
        /// Read or write.
        op: Op,
        /// The file.
        path: PathBuf,
        /// Offset of the request.
        offset: u64,
        /// Bytes asked for.
        len: usize,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// The request was cancelled before it completed.
    #[error("the {op} at offset {offset:#x} of {path} was cancelled")]
    Cancelled {
        /// Read or write.
        op: Op,
        /// The file.
        path: PathBuf,
        /// Offset of the request.
        offset: u64,
    },
    /// A read stopped short of what was asked (the file ends inside it).
    #[error(
        "read {got} of {wanted} bytes at offset {offset:#x} of {path}: the file ends there \
         (it is {end} bytes long or was cut short)"
    )]
    ShortRead {
        /// The file.
        path: PathBuf,
        /// Offset of the request.
        offset: u64,
        /// Bytes asked for.
        wanted: usize,
        /// Bytes read.
        got: usize,
        /// Where the data ended.
        end: u64,
    },
    /// A read at or past the end of the file.
    #[error("offset {offset:#x} is at or past the end of {path}: nothing to read")]
    Eof {
        /// The file.
        path: PathBuf,
        /// Offset of the request.
        offset: u64,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](userdma::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> userdma::Code {
        use userdma::Code;
        match self {
            Error::Depth { .. }
            | Error::Misaligned { .. }
            | Error::Empty
            | Error::Offset { .. }
            | Error::NotRegistered { .. }
            | Error::ReadOnly { .. }
            | Error::Length { .. }
            | Error::NotAStream { .. }
            | Error::ShortFrame { .. }
            | Error::InPlaceResult { .. }
            | Error::ShortRead { .. }
            | Error::Eof { .. } => Code::InvalidArgument,
            // A wait with nothing to wait for: the caller's sequence of calls is wrong.
            Error::Idle => Code::InvalidArgument,
            Error::Unavailable { .. } | Error::DirectUnsupported { .. } => Code::Unsupported,
            Error::Disabled { .. } | Error::MemlockLimit { .. } | Error::Register { .. } => {
                Code::Refused
            }
            Error::TooManyFixedBuffers { .. } | Error::Full { .. } => Code::Exhausted,
            Error::Open { source, .. } | Error::Stat { source, .. }
                if source.kind() == io::ErrorKind::NotFound =>
            {
                Code::NotFound
            }
            // A system call failed, or the kernel completed a request with an error, short,
            // or cancelled (on the caller's `cancel`, or the kernel's own).
            Error::Open { .. }
            | Error::Stat { .. }
            | Error::RingSetup { .. }
            | Error::Enter(_)
            | Error::Io { .. }
            | Error::ShortWrite { .. }
            | Error::Cancelled { .. } => Code::System,
        }
    }
}

/// A request the stager did not take: the reason, and the buffer back.
pub struct Refused {
    /// Why.
    pub error: Error,
    /// The buffer, untouched.
    pub buffer: OwnedBuffer,
}

impl std::fmt::Debug for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refused")
            .field("error", &self.error)
            .field("buffer", &self.buffer)
            .finish()
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

impl From<Refused> for Error {
    /// Keeps the reason; the buffer goes back to its pool.
    fn from(refused: Refused) -> Error {
        refused.error
    }
}

/// What to do about a misaligned direct-I/O request ([`Error::Misaligned`]).
fn misaligned_fix(what: &str, align: u32) -> String {
    if what == "buffer address" {
        // A coloured pool's buffers of 4 KiB and up are 256-byte aligned only.
        "take the buffer from a page-aligned pool (pool::Config::colouring(false) through \
         Runtime::pool_with; a device that takes 256-byte alignment, such as the loopback NPU, \
         gets cache-coloured pools by default)"
            .to_string()
    } else {
        format!("round it to a multiple of {align}")
    }
}
