//! The device process's side: its translation table of regions mapped from the host's files,
//! and its main ([`serve_process`]), which starts the engine on the device the host hands over
//! and serves the host's `MAP` and `UNMAP` requests until the host closes the socket.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use super::{decode, encode, Message, ACK, HELLO, MAP, SOCKET_ENV, UNMAP, WORDS};
use crate::bar::{map_fd, RegisterFile};
use crate::cost::Cost;
use crate::engine::{Engine, Settings};
use crate::ops::{Dram, Span, Translate};
use crate::shim;
use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::Error as LoopbackError;
use userdma::device::Error;
use userdma::dma::Access;
use userdma::memory::{PageSize, Region};

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
        let span = Span::in_region(
            Arc::clone(&entry.region),
            entry.offset,
            len,
            Access::ReadWrite,
        )?;
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
            return Err(crate::config::bad_engine_cpu(Some(cpu)));
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
