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
//! The host keeps the IOVA allocation and its own table in a [`dma::SoftIommu`]; a watcher on it
//! ([`dma::SoftIommu::watch`]) mirrors every change into the child as it happens, in the table's
//! order: a new mapping is in the child's table before `map` returns, and a dropped one is out
//! of it before the drop returns (and so before its IOVAs can be reused) — the synchronous
//! unmap of an IOMMU, with no polling and no work on the doorbell path. The child holds its own
//! `mmap` of each file, so even a late access can only reach pages of a file the host once
//! mapped for the device, never other host memory.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bar::{map_fd, RegisterFile};
use super::cost::Cost;
use super::engine::{Engine, Settings};
use super::ops::{Dram, Span, Translate};
use super::shim;
use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::u64_of;
use crate::Error as LoopbackError;
use userdma::device::Error;
use userdma::dma::{self, IovaRange, Mapping, Space};
use userdma::memory::{PageSize, Region};

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

/// The child process and its control channel.
#[derive(Debug)]
pub(super) struct Remote {
    child: Mutex<Child>,
    channel: Arc<Channel>,
}

impl Remote {
    /// The child's process id.
    pub(super) fn id(&self) -> u32 {
        self.child.lock().unwrap_or_else(|p| p.into_inner()).id()
    }

    /// Whether the child is still running.
    pub(super) fn is_running(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        matches!(child.try_wait(), Ok(None))
    }

    /// How the child ended, if it did.
    pub(super) fn exit_status(&self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        child.try_wait().ok().flatten()
    }

    /// Stops the child: closes the socket, waits up to `timeout` for it to exit, then kills it.
    pub(super) fn stop(&self, timeout: Duration) {
        self.channel.close();
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let start = Instant::now();
        while start.elapsed() < timeout {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// What the child needs to start.
#[derive(Debug)]
pub(super) struct Hello<'a> {
    pub(super) settings: &'a Settings,
    pub(super) file: &'a RegisterFile,
    pub(super) dram: &'a Region,
    pub(super) irqs: Vec<BorrowedFd<'a>>,
}

/// Starts `program` as the device process and hands it the device.
pub(super) fn spawn(program: &Program, hello: Hello<'_>) -> Result<Remote, Error> {
    let spawn_error = |source| LoopbackError::Spawn {
        program: program.path.clone(),
        source,
    };
    let (host_end, child_end) = shim::seqpacket_pair().map_err(spawn_error)?;
    shim::set_recv_timeout(host_end.as_fd(), REPLY_TIMEOUT).map_err(spawn_error)?;
    let raw = child_end.as_raw_fd();
    let mut command = Command::new(&program.path);
    command
        .args(&program.args)
        .env(SOCKET_ENV, raw.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // SAFETY: the closure runs in the child between fork and exec and only calls `fcntl`, which
    // is async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || shim::clear_cloexec(raw));
    }
    let child = command.spawn().map_err(spawn_error)?;
    drop(child_end);
    let remote = Remote {
        child: Mutex::new(child),
        channel: Arc::new(Channel {
            socket: Mutex::new(Some(host_end)),
        }),
    };
    let s = hello.settings;
    let message: Message = [
        HELLO,
        u64::from(s.queues),
        u64::from(s.max_depth),
        u64::from(s.dma_mask_bits),
        u64_of(hello.dram.len()),
        s.cost.dma_bytes_per_sec,
        s.cost.descriptor_ns,
        s.cost.compute_bytes_per_sec,
        s.cost.context_switch_ns,
        u64::from(s.max_burst),
        u64::try_from(s.idle_spin.as_nanos()).unwrap_or(u64::MAX),
        s.cpu.map_or(0, |cpu| u64::from(cpu) + 1),
        s.cost.mmio_read_ns,
        s.cost.sram_bytes,
        s.cost.dram_bytes_per_sec,
        s.cost.fence_ns,
    ];
    let (Some(file_fd), Some(dram_fd)) = (hello.file.region().fd(), hello.dram.fd()) else {
        return Err(LoopbackError::Protocol {
            operation: "HELLO",
            defect: "the device memory is not shareable",
        }
        .into());
    };
    let mut fds = vec![file_fd, dram_fd];
    fds.extend(hello.irqs);
    match remote.channel.request("HELLO", &message, &fds) {
        Ok(()) => Ok(remote),
        Err(err) => {
            remote.stop(Duration::from_secs(1));
            let pinning = matches!(LoopbackError::of(&err), Some(LoopbackError::Control { operation: "HELLO", source })
                if source.raw_os_error() == Some(libc::EINVAL));
            if pinning && s.cpu.is_some() {
                // The one HELLO the device refuses with EINVAL: it could not take that CPU.
                return Err(super::config::bad_engine_cpu(s.cpu));
            }
            let stopped = matches!(
                LoopbackError::of(&err),
                Some(LoopbackError::Stopped { .. } | LoopbackError::Control { .. })
            );
            match remote.exit_status() {
                Some(exit) if stopped => Err(LoopbackError::Stopped { exit: Some(exit) }.into()),
                _ => Err(err),
            }
        }
    }
}

/// The out-of-process device's DMA space: the host's [`dma::SoftIommu`] table (IOVA allocation,
/// the host's own view), mirrored into the device process by a watcher on it (see the module
/// docs).
#[derive(Debug)]
pub(super) struct RemoteSpace {
    table: dma::SoftIommu,
    /// The watcher's registration ([`dma::SoftIommu::watch`]): the mirroring stops with it.
    _mirror: Box<dyn std::fmt::Debug + Send + Sync>,
}

impl RemoteSpace {
    /// The space over `table`, mirrored into `remote`'s table from now on.
    pub(super) fn new(table: dma::SoftIommu, remote: &Remote) -> Result<RemoteSpace, Error> {
        let channel = Arc::clone(&remote.channel);
        let mirror = table
            .watch(move |change| match change.mapped() {
                Some((region, offset)) => mirror_map(&channel, change.range(), region, offset),
                None => mirror_unmap(&channel, change.range()),
            })
            .map_err(|source| Error::Map {
                what: "translation table",
                source,
            })?;
        Ok(RemoteSpace {
            table,
            _mirror: Box::new(mirror),
        })
    }
}

/// A failed request as the `io::Error` a watcher returns.
fn as_io(err: Error) -> io::Error {
    match LoopbackError::from_device(err) {
        Ok(LoopbackError::Control { source, .. }) => source,
        Ok(other) => io::Error::other(other),
        Err(other) => io::Error::other(other),
    }
}

/// Tells the device process that `range` maps `region` from `offset` (called under the host
/// table's lock, so the child sees the changes in the table's order).
fn mirror_map(
    channel: &Channel,
    range: IovaRange,
    region: &Region,
    offset: usize,
) -> io::Result<()> {
    let Some(fd) = region.fd() else {
        return Err(io::Error::new(io::ErrorKind::Unsupported, NOT_SHAREABLE));
    };
    let len = u64::try_from(range.size()).unwrap_or(u64::MAX);
    let message: Message = [
        MAP,
        range.start,
        len,
        u64_of(offset),
        u64_of(region.len()),
        u64_of(region.page_size().bytes()),
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ];
    channel.request("MAP", &message, &[fd]).map_err(as_io)
}

/// Tells the device process that `range` is no longer mapped (as `mirror_map`).
fn mirror_unmap(channel: &Channel, range: IovaRange) -> io::Result<()> {
    let mut message = [0u64; WORDS];
    message[0] = UNMAP;
    message[1] = range.start;
    channel.request("UNMAP", &message, &[]).map_err(as_io)
}

/// Why a region without a file cannot be mapped for an out-of-process device.
const NOT_SHAREABLE: &str = "an out-of-process loopback device reaches host memory only through \
    shared files: build the region with .memfd() (or on a hugetlbfs file)";

impl Space for RemoteSpace {
    fn map(&self, region: Arc<Region>) -> Result<Mapping, dma::Error> {
        if region.fd().is_none() {
            return Err(dma::Error::NotShareable {
                kind: dma::Kind::SoftIommu,
                len: u64_of(region.len()),
            });
        }
        self.table.map(region)
    }

    fn stats(&self) -> dma::Stats {
        self.table.stats()
    }

    fn kind(&self) -> dma::Kind {
        dma::Kind::SoftIommu
    }

    fn dma_mask_bits(&self) -> u32 {
        self.table.dma_mask_bits()
    }
}

/// One mapping in the device process's table.
#[derive(Debug)]
struct Entry {
    /// The last IOVA.
    last: u64,
    /// Where the first IOVA is in the region.
    offset: usize,
    region: Arc<Region>,
}

/// The device process's translation table: IOVA ranges to regions mapped from the host's files.
#[derive(Debug, Default)]
struct ChildTable {
    /// First IOVA -> the mapping.
    entries: Mutex<BTreeMap<u64, Entry>>,
    /// Moves on every change of `entries`.
    generation: AtomicU64,
}

impl ChildTable {
    /// Runs `f` on the entries under the lock, then records a change.
    fn change<R>(&self, f: impl FnOnce(&mut BTreeMap<u64, Entry>) -> R) -> R {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let result = f(&mut entries);
        // Release, under the lock: pairs with the Acquire in `generation`; an engine that sees
        // the old value after the change was acknowledged cannot happen, since the host hears
        // the acknowledgement only after this store.
        self.generation.fetch_add(1, Ordering::Release);
        result
    }
}

impl Translate for ChildTable {
    fn piece(&self, iova: u64) -> Option<(u64, u64, Span)> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (&start, entry) = entries.range(..=iova).next_back()?;
        if iova > entry.last {
            return None;
        }
        let len = usize::try_from(entry.last - start).ok()?.checked_add(1)?;
        let span = Span::in_region(Arc::clone(&entry.region), entry.offset, len)?;
        Some((start, entry.last, span))
    }

    fn generation(&self) -> u64 {
        // Acquire: pairs with the Release increment in `change`.
        self.generation.load(Ordering::Acquire)
    }
}

/// The page size of `bytes`-byte pages.
fn page_size_of(bytes: u64) -> Option<PageSize> {
    if usize::try_from(bytes).ok()? == PageSize::Base.bytes() {
        return Some(PageSize::Base);
    }
    PageSize::from_huge_bytes(bytes)
}

/// Runs a `MAP` request in the child.
fn child_map(table: &ChildTable, m: &Message, mut fds: Vec<OwnedFd>) -> Result<(), i32> {
    let (iova, len, offset, file_len, page) = (m[1], m[2], m[3], m[4], m[5]);
    let fd = fds.pop().ok_or(libc::EBADF)?;
    let page_size = page_size_of(page).ok_or(libc::EINVAL)?;
    let file_len = usize::try_from(file_len).map_err(|_| libc::EINVAL)?;
    let offset = usize::try_from(offset).map_err(|_| libc::EINVAL)?;
    let last = iova
        .checked_add(len.checked_sub(1).ok_or(libc::EINVAL)?)
        .ok_or(libc::EINVAL)?;
    let end = offset
        .checked_add(usize::try_from(len).map_err(|_| libc::EINVAL)?)
        .ok_or(libc::EINVAL)?;
    if end > file_len {
        return Err(libc::EINVAL);
    }
    let region = map_fd("mapped region", fd, file_len, page_size).map_err(|_| libc::ENOMEM)?;
    table.change(|entries| {
        if entries
            .range(..=last)
            .next_back()
            .is_some_and(|(_, entry)| entry.last >= iova)
        {
            return Err(libc::EEXIST);
        }
        entries.insert(
            iova,
            Entry {
                last,
                offset,
                region: Arc::new(region),
            },
        );
        Ok(())
    })
}

/// The descriptor number in [`SOCKET_ENV`], checked to be a socket.
fn inherited_socket() -> Result<OwnedFd, Error> {
    let not_device = |defect| LoopbackError::NotDeviceProcess {
        variable: SOCKET_ENV,
        defect,
    };
    let text = std::env::var(SOCKET_ENV).map_err(|_| not_device("not set"))?;
    let raw: i32 = text.parse().map_err(|_| not_device("not a number"))?;
    if raw < 0 {
        return Err(not_device("negative").into());
    }
    shim::check_socket(raw).map_err(|_| not_device("not an open socket"))?;
    // SAFETY: the parent passed this descriptor, open (checked just above), for this process to
    // own; nothing else in the process uses its number (the environment names it only for us).
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Sends an `ACK` of `tag` with `status` (0: done, else an errno).
fn ack(socket: BorrowedFd<'_>, tag: u64, status: i32) -> Result<(), Error> {
    let mut message = [0u64; WORDS];
    message[0] = ACK;
    message[1] = tag;
    message[2] = u64::try_from(status).unwrap_or(u64::from(libc::EIO.unsigned_abs()));
    shim::send(socket, &encode(&message), &[])
        .map_err(|source| LoopbackError::Control {
            operation: "ACK",
            source,
        })
        .map_err(Into::into)
}

/// The device process's main: serves the device the parent hands over the socket in
/// [`SOCKET_ENV`] until the parent closes it. The `userdma` tool's hidden
/// `loopback-device` subcommand calls this; any program (or a test in a re-executed test
/// binary) can, to be a device process.
pub fn serve_process() -> Result<(), Error> {
    let socket = inherited_socket()?;
    let mut buf = [0u8; WORDS * 8];
    let recv = |buf: &mut [u8]| {
        shim::recv(socket.as_fd(), buf).map_err(|source| LoopbackError::Control {
            operation: "receiving",
            source,
        })
    };
    let (n, mut fds) = recv(&mut buf)?;
    let malformed = |defect| LoopbackError::Protocol {
        operation: "HELLO",
        defect,
    };
    let m = decode(&buf[..n]).ok_or(malformed("wrong length"))?;
    if m[0] != HELLO {
        return Err(malformed("not a HELLO").into());
    }
    let queues = u16::try_from(m[1]).map_err(|_| malformed("queue count"))?;
    if fds.len() != 2 + usize::from(queues) {
        return Err(malformed("wrong number of descriptors").into());
    }
    let irqs = fds.split_off(2);
    let dram_fd = fds.pop().ok_or(malformed("no device memory"))?;
    let file_fd = fds.pop().ok_or(malformed("no register file"))?;
    let settings = Settings {
        queues,
        max_depth: u32::try_from(m[2]).map_err(|_| malformed("max depth"))?,
        dma_mask_bits: u32::try_from(m[3]).map_err(|_| malformed("DMA mask"))?,
        cost: Cost {
            dma_bytes_per_sec: m[5],
            descriptor_ns: m[6],
            compute_bytes_per_sec: m[7],
            context_switch_ns: m[8],
            mmio_read_ns: m[12],
            sram_bytes: m[13],
            dram_bytes_per_sec: m[14],
            fence_ns: m[15],
            // Host-side costs: the mapping thread pays them, never the engine.
            map_page_ns: 0,
            unmap_page_ns: 0,
        },
        max_burst: u32::try_from(m[9]).map_err(|_| malformed("max burst"))?,
        idle_spin: Duration::from_nanos(m[10]),
        cpu: match m[11] {
            0 => None,
            cpu => Some(u32::try_from(cpu - 1).map_err(|_| malformed("engine CPU"))?),
        },
        // Injections from the start are not passed to a device process (`Config::inject`).
        faults: Vec::new(),
    };
    if let Some(cpu) = settings.cpu {
        // The whole process runs there: the engine thread spawned below inherits the mask,
        // and threads started before (a test harness's, a sanitizer runtime's) are moved. A
        // CPU the process may not use is the host's configuration error: say so (EINVAL) and
        // stop.
        if shim::pin_process_to_cpu(cpu).is_err() {
            ack(socket.as_fd(), HELLO, libc::EINVAL)?;
            return Err(super::config::bad_engine_cpu(Some(cpu)));
        }
    }
    let dram_len = usize::try_from(m[4]).map_err(|_| malformed("device memory size"))?;
    let file = Arc::new(RegisterFile::from_fd(file_fd)?);
    let dram = Arc::new(map_fd("device memory", dram_fd, dram_len, PageSize::Base)?);
    let table = Arc::new(ChildTable::default());
    let engine = Engine::new(
        settings,
        Arc::clone(&file),
        Dram {
            ptr: dram.as_ptr(),
            len: dram.len(),
        },
        Arc::clone(&table) as Arc<dyn Translate>,
        irqs,
    );
    let keep = Arc::clone(&dram);
    let thread = std::thread::Builder::new()
        .name("loopback-engine".into())
        .spawn(move || {
            engine.run();
            drop(keep);
        })
        .map_err(|source| LoopbackError::Thread { source })?;
    ack(socket.as_fd(), HELLO, 0)?;
    let result: Result<(), Error> = loop {
        let (n, fds) = match recv(&mut buf) {
            Ok(got) => got,
            Err(err) => break Err(err.into()),
        };
        if n == 0 {
            break Ok(());
        }
        let Some(m) = decode(&buf[..n]) else {
            break Err(LoopbackError::Protocol {
                operation: "receiving",
                defect: "wrong length",
            }
            .into());
        };
        let status = match m[0] {
            MAP => child_map(&table, &m, fds).err().unwrap_or(0),
            UNMAP => table.change(|entries| {
                if entries.remove(&m[1]).is_some() {
                    0
                } else {
                    libc::ENOENT
                }
            }),
            _ => libc::EINVAL,
        };
        if let Err(err) = ack(socket.as_fd(), m[0], status) {
            break Err(err);
        }
    };
    file.request_shutdown();
    // The engine thread only ends when told to; a panic there is a bug already reported.
    let _ = thread.join();
    result
}
