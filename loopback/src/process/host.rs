//! The host's side of the device process: starting it and handing it the device (`HELLO`),
//! stopping it, and the DMA space whose every change is mirrored into its table (`MAP`,
//! `UNMAP`) as it happens.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Channel, Message, Program, HELLO, MAP, REPLY_TIMEOUT, SOCKET_ENV, UNMAP, WORDS};
use crate::bar::RegisterFile;
use crate::engine::Settings;
use crate::shim;
use crate::sync::Mutex;
use crate::u64_of;
use crate::Error as LoopbackError;
use userdma::device::Error;
use userdma::dma::{self, IovaRange, Mapping, Space};
use userdma::memory::Region;

/// The child process and its control channel.
#[derive(Debug)]
pub(crate) struct Remote {
    child: Mutex<Child>,
    channel: Arc<Channel>,
}

impl Remote {
    /// The child's process id.
    pub(crate) fn id(&self) -> u32 {
        self.child.lock().unwrap_or_else(|p| p.into_inner()).id()
    }

    /// Whether the child is still running.
    pub(crate) fn is_running(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        matches!(child.try_wait(), Ok(None))
    }

    /// How the child ended, if it did.
    pub(crate) fn exit_status(&self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        child.try_wait().ok().flatten()
    }

    /// Stops the child: closes the socket, waits up to `timeout` for it to exit, then kills it.
    pub(crate) fn stop(&self, timeout: Duration) {
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
pub(crate) struct Hello<'a> {
    pub(crate) settings: &'a Settings,
    pub(crate) file: &'a RegisterFile,
    pub(crate) dram: &'a Region,
    pub(crate) irqs: Vec<BorrowedFd<'a>>,
}

/// Starts `program` as the device process and hands it the device.
pub(crate) fn spawn(program: &Program, hello: Hello<'_>) -> Result<Remote, Error> {
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
                return Err(crate::config::bad_engine_cpu(s.cpu));
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
/// the host's own view), mirrored into the device process by a watcher on it (see the
/// [`process`](super) module docs).
#[derive(Debug)]
pub(crate) struct RemoteSpace {
    table: dma::SoftIommu,
    /// The watcher's registration ([`dma::SoftIommu::watch`]): the mirroring stops with it.
    _mirror: Box<dyn std::fmt::Debug + Send + Sync>,
}

impl RemoteSpace {
    /// The space over `table`, mirrored into `remote`'s table from now on.
    pub(crate) fn new(table: dma::SoftIommu, remote: &Remote) -> Result<RemoteSpace, Error> {
        let channel = Arc::clone(&remote.channel);
        let mirror = table
            .watch(move |change| match change.mapped() {
                Some(_) if change.access() != Some(dma::Access::ReadWrite) => {
                    Err(io::Error::new(io::ErrorKind::Unsupported, NOT_READ_WRITE))
                }
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

/// Why a device-read-only or -write-only mapping is refused when the device runs in a
/// process of its own.
const NOT_READ_WRITE: &str = "the loopback NPU in a separate process maps memory read-write \
     only (its table mirrors no access modes): run it as a thread for device-read-only or \
     device-write-only mappings";

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
        self.map_with(region, dma::Access::ReadWrite)
    }

    /// A mode other than read-write is refused by the mirror (the device process's table has
    /// none), with what to do.
    fn map_with(&self, region: Arc<Region>, access: dma::Access) -> Result<Mapping, dma::Error> {
        if region.fd().is_none() {
            return Err(dma::Error::NotShareable {
                kind: dma::Kind::SoftIommu,
                len: u64_of(region.len()),
            });
        }
        self.table.map_with(region, access)
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
