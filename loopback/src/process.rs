//! Out-of-process mode: the engine runs in a child process that reaches the host only through
//! shared memory — the register file and the device memory (memfds), and each DMA-mapped region
//! (a memfd or hugetlbfs file) — the shape of a device behind a real IOMMU.
//!
//! The host starts the child by re-executing a program (the `userdma` tool's hidden
//! `loopback-device` subcommand, or any program whose main, or a test, calls [`serve_process`])
//! with one end of a `SOCK_SEQPACKET` socket pair inherited and its number in
//! `USERDMA_LOOPBACK_SOCKET`. Over that socket it sends, with the file descriptors attached
//! (`SCM_RIGHTS`):
//!
//! | message | words after the tag | descriptors | the child |
//! |---|---|---|---|
//! | `HELLO` (1) | queues, max depth, DMA mask bits, device memory bytes, the four cost figures, max burst, idle spin ns, engine CPU + 1 (0: not pinned) | register file, device memory, one eventfd per queue | maps them, starts the engine |
//! | `MAP` (2) | IOVA, length, offset in the file, file length, page size | the region's file | maps it into its translation table |
//! | `UNMAP` (3) | IOVA | — | removes the entry |
//!
//! and the child answers each with `ACK` (4) and a status word (0: done). Closing the socket
//! (the host dropping the device, or dying) stops the child.
//!
//! The host keeps the IOVA allocation and its own table in a
//! [`dma::SoftIommu`](userdma::dma::SoftIommu); a watcher on it
//! ([`dma::SoftIommu::watch`](userdma::dma::SoftIommu::watch)) mirrors every change into the child
//! as it happens, in the table's order: a new mapping is in the child's table before `map` returns,
//! and a dropped one is out of it before the drop returns (and so before its IOVAs can be reused) —
//! the synchronous unmap of an IOMMU, with no polling and no work on the doorbell path. The child
//! holds its own `mmap` of each file, so even a late access can only reach pages of a file the host
//! once mapped for the device, never other host memory.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use super::shim;
use crate::sync::Mutex;
use crate::Error as LoopbackError;
use userdma::device::Error;

mod child;
mod host;

pub use self::child::serve_process;
pub(crate) use self::host::{spawn, Hello, Remote, RemoteSpace};

/// The environment variable that carries the control socket's descriptor number.
pub const SOCKET_ENV: &str = "USERDMA_LOOPBACK_SOCKET";

const HELLO: u64 = 1;
const MAP: u64 = 2;
const UNMAP: u64 = 3;
const ACK: u64 = 4;
/// Words per message.
const WORDS: usize = 16;
/// How long the host waits for one answer from the child.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// The program the device process runs: `path` with `args`.
///
/// By default the arguments are `loopback-device`, the hidden subcommand of the `userdma`
/// command-line tool (the userdma-cli package). Any program whose main calls [`serve_process`]
/// can be the device process, with the arguments it needs ([`Program::args`]): a test binary,
/// for one, re-executed to run only a test that calls it (the library's integration tests do
/// this, tests/common/device_process.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    path: PathBuf,
    args: Vec<OsString>,
}

impl Program {
    /// `path loopback-device` (the `userdma` tool's device-process subcommand).
    pub fn new(path: impl Into<PathBuf>) -> Program {
        Program {
            path: path.into(),
            args: vec![OsString::from("loopback-device")],
        }
    }

    /// The running executable with `loopback-device` (for the `userdma` tool itself).
    pub fn current_exe() -> io::Result<Program> {
        Ok(Program::new(std::env::current_exe()?))
    }

    /// Replaces the arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Program
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }

    /// The program's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// One message: a tag and fifteen words, little-endian.
type Message = [u64; WORDS];

fn encode(message: &Message) -> [u8; WORDS * 8] {
    let mut bytes = [0u8; WORDS * 8];
    for (chunk, word) in bytes.chunks_exact_mut(8).zip(message) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    bytes
}

fn decode(bytes: &[u8]) -> Option<Message> {
    if bytes.len() != WORDS * 8 {
        return None;
    }
    let mut message = [0u64; WORDS];
    for (word, chunk) in message.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        *word = u64::from_le_bytes(b);
    }
    Some(message)
}

/// The host's end of the control socket: one request and its answer at a time.
#[derive(Debug)]
pub(super) struct Channel {
    socket: Mutex<Option<OwnedFd>>,
}

impl Channel {
    /// Sends `message` with `fds` and waits for the child's `ACK`.
    fn request(
        &self,
        operation: &'static str,
        message: &Message,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), Error> {
        let guard = self
            .socket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(socket) = guard.as_ref() else {
            return Err(LoopbackError::Stopped { exit: None }.into());
        };
        let control = |source| LoopbackError::Control { operation, source };
        shim::send(socket.as_fd(), &encode(message), fds).map_err(control)?;
        let mut buf = [0u8; WORDS * 8];
        let (n, _) = shim::recv(socket.as_fd(), &mut buf).map_err(control)?;
        if n == 0 {
            return Err(LoopbackError::Stopped { exit: None }.into());
        }
        let reply = decode(&buf[..n]).ok_or(LoopbackError::Protocol {
            operation,
            defect: "wrong length",
        })?;
        match reply {
            [ACK, tag, 0, ..] if tag == message[0] => Ok(()),
            [ACK, tag, errno, ..] if tag == message[0] => Err(control(
                io::Error::from_raw_os_error(i32::try_from(errno).unwrap_or(libc::EIO)),
            )
            .into()),
            _ => Err(LoopbackError::Protocol {
                operation,
                defect: "not an acknowledgement of the request",
            }
            .into()),
        }
    }

    /// Closes the socket: the child stops.
    pub(super) fn close(&self) {
        let mut guard = self
            .socket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        guard.take();
    }
}
