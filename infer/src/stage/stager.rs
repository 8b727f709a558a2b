//! [`Stager`]: reads into and writes from pool buffers with io_uring `READ_FIXED` /
//! `WRITE_FIXED`, many in flight, each buffer held by the stager until its completion.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::sync::Arc;

use io_uring::{opcode, squeue, types, IoUring};

use super::slots::{Slots, CANCEL_BIT};
use super::{shim, Error, File, Fixed, Layout, Mode, Refused, MAX_DEPTH};
use userdma::pool::{OwnedBuffer, Pool};

/// How a [`Stager`] is set up. Built with chained setters from [`Config::default`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    depth: u32,
}

impl Default for Config {
    /// 32 requests in flight.
    fn default() -> Self {
        Config { depth: 32 }
    }
}

impl Config {
    /// Requests in flight at most (1 ..= [`MAX_DEPTH`]).
    #[must_use]
    pub fn depth(mut self, depth: u32) -> Self {
        self.depth = depth;
        self
    }

    /// The depth.
    pub fn queue_depth(&self) -> u32 {
        self.depth
    }
}

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// File to buffer.
    Read,
    /// Buffer to file.
    Write,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Read => "read",
            Op::Write => "write",
        })
    }
}

/// Names one request from submission to completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket(u64);

impl Ticket {
    /// The number (unique among the requests in flight).
    pub fn raw(self) -> u64 {
        self.0
    }
}

/// Bytes a completed request moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// Bytes moved.
    pub bytes: usize,
    /// Bytes asked for.
    pub requested: usize,
}

impl Transfer {
    /// Whether fewer bytes moved than asked: for a read, the file ends at `offset + bytes`.
    pub fn is_short(&self) -> bool {
        self.bytes < self.requested
    }
}

/// A finished request: its ticket, the buffer back, and what happened.
#[derive(Debug)]
pub struct Completion {
    /// The request's ticket.
    pub ticket: Ticket,
    /// Read or write.
    pub op: Op,
    /// File offset of the request.
    pub offset: u64,
    /// The buffer; after a read its length is the bytes read.
    pub buffer: OwnedBuffer,
    /// Bytes moved, or why not.
    pub result: Result<Transfer, Error>,
    file: File,
}

impl Completion {
    /// The buffer, if the request moved every byte asked for.
    ///
    /// # Errors
    /// The request's error; [`Error::Eof`] for a read that found no data, [`Error::ShortRead`]
    /// for one that found fewer bytes than asked.
    pub fn into_full(self) -> Result<OwnedBuffer, Error> {
        let transfer = self.result?;
        if !transfer.is_short() {
            return Ok(self.buffer);
        }
        let path = self.file.path().to_owned();
        Err(if transfer.bytes == 0 {
            Error::Eof {
                path,
                offset: self.offset,
            }
        } else {
            Error::ShortRead {
                path,
                offset: self.offset,
                wanted: transfer.requested,
                got: transfer.bytes,
                end: self.offset + transfer.bytes as u64,
            }
        })
    }

    /// The file of the request.
    pub fn file(&self) -> &File {
        &self.file
    }
}

/// A request in flight: everything it needs to be resubmitted or completed.
#[derive(Debug)]
struct InFlight {
    op: Op,
    file: File,
    offset: u64,
    wanted: usize,
    done: usize,
    fixed: Fixed,
    cancelled: bool,
    /// Resume short transfers of streams too (sockets, pipes): [`Stager::recv_exact`].
    exact: bool,
    /// The buffer's address (kept as an integer so the stager stays `Send`).
    addr: usize,
    /// The buffer; `None` for a request on a lent buffer ([`Stager::read_lent`]), which the
    /// caller keeps and the stager waits for before returning.
    buffer: Option<OwnedBuffer>,
}

/// Reads files into, and writes them from, buffers of one [`Pool`], with the pool's memory
/// registered as io_uring fixed buffers (see the [module documentation](super)).
///
/// A buffer given to [`Stager::read`] / [`Stager::write`] belongs to the stager until its
/// [`Completion`]; dropping the stager cancels what is in flight and waits for it.
pub struct Stager {
    /// Declared first: dropped (closed, unregistering the buffers) before the pool.
    ring: IoUring,
    slots: Slots<InFlight>,
    ready: VecDeque<Completion>,
    /// Reaped `(user_data, result)` pairs, reused.
    scratch: Vec<(u64, i32)>,
    /// Completions of requests on lent buffers, taken by the call that made them.
    lent: Vec<(u64, Result<Transfer, Error>)>,
    layout: Layout,
    depth: u32,
    pool: Arc<Pool>,
}

impl fmt::Debug for Stager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stager")
            .field("depth", &self.depth)
            .field("in_flight", &self.slots.len())
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl Stager {
    /// A stager over `pool`: an io_uring of `2 × depth` submission entries with the pool's
    /// arena registered as fixed buffers.
    ///
    /// # Errors
    /// [`Error::Depth`]; [`Error::Unavailable`] / [`Error::Disabled`] / [`Error::RingSetup`]
    /// (no io_uring here); [`Error::TooManyFixedBuffers`]; [`Error::MemlockLimit`] /
    /// [`Error::Register`] (the registration refused).
    pub fn new(pool: Arc<Pool>, config: Config) -> Result<Stager, Error> {
        let depth = config.depth;
        if depth == 0 || depth > MAX_DEPTH {
            return Err(Error::Depth {
                depth,
                max: MAX_DEPTH,
            });
        }
        let layout = Layout::new(pool.arena_offset(), pool.arena_len())?;
        let entries = depth * 2;
        let ring = IoUring::new(entries).map_err(|source| setup_error(entries, source))?;
        let base = pool.mapping().as_ptr().as_ptr();
        let iovecs: Vec<libc::iovec> = (0..layout.count())
            .filter_map(|i| layout.piece(i))
            .map(|(offset, len)| libc::iovec {
                iov_base: base.wrapping_add(offset).cast(),
                iov_len: len,
            })
            .collect();
        // SAFETY: every iovec lies inside the pool's mapping (the layout covers the arena,
        // which the mapping holds), readable and writable; the mapping stays mapped while
        // `pool` lives, and `pool` is dropped after `ring` (field order), whose close
        // unregisters the buffers. The kernel only writes them for requests this stager
        // submits, into buffers it holds until their completion.
        let registered = unsafe { ring.submitter().register_buffers(&iovecs) };
        if let Err(source) = registered {
            let bytes = layout.len() as u64;
            return Err(if source.raw_os_error() == Some(libc::ENOMEM) {
                Error::MemlockLimit {
                    needed: bytes,
                    limit: shim::memlock_limit().unwrap_or(0),
                    source,
                }
            } else {
                Error::Register {
                    buffers: layout.count(),
                    bytes,
                    source,
                }
            });
        }
        Ok(Stager {
            ring,
            slots: Slots::new(depth),
            ready: VecDeque::with_capacity(depth as usize),
            scratch: Vec::with_capacity(entries as usize),
            lent: Vec::with_capacity(1),
            layout,
            depth,
            pool,
        })
    }

    /// The pool whose buffers this stager moves.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The fixed-buffer layout of the pool's memory.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Requests in flight at most.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Requests submitted and not yet handed back by [`Stager::wait`] (reaped completions
    /// waiting to be taken count too).
    pub fn in_flight(&self) -> usize {
        self.slots.len() + self.ready.len()
    }

    /// Where `buffer` lies in the registered memory (`None`: not from this stager's pool).
    pub fn fixed(&self, buffer: &OwnedBuffer) -> Option<Fixed> {
        if !Arc::ptr_eq(buffer.pool(), &self.pool) {
            return None;
        }
        self.layout
            .locate(buffer.as_buffer().offset(), buffer.capacity())
    }

    /// Queues a read of `buffer.len()` bytes at `offset` of `file` into `buffer`; it reaches
    /// the kernel at the next [`Stager::submit`] or [`Stager::wait`]. The buffer comes back in
    /// the request's [`Completion`], its length set to the bytes read.
    ///
    /// # Errors
    /// [`Refused`] (with the buffer): [`Error::Full`] at the depth, [`Error::Empty`],
    /// [`Error::Offset`], [`Error::NotRegistered`], [`Error::Misaligned`] for direct I/O.
    pub fn read(
        &mut self,
        file: &File,
        offset: u64,
        buffer: OwnedBuffer,
    ) -> Result<Ticket, Refused> {
        self.start(Op::Read, file, offset, buffer, false)
    }

    /// Queues a write of the buffer's `len()` bytes to `offset` of `file` (opened with
    /// [`File::create`]).
    ///
    /// # Errors
    /// As [`Stager::read`], and [`Error::ReadOnly`].
    pub fn write(
        &mut self,
        file: &File,
        offset: u64,
        buffer: OwnedBuffer,
    ) -> Result<Ticket, Refused> {
        if !file.is_writable() {
            let error = Error::ReadOnly {
                path: file.path().to_owned(),
            };
            return Err(Refused { error, buffer });
        }
        self.start(Op::Write, file, offset, buffer, false)
    }

    /// Queues a receive from the stream `socket` (see [`File::from_stream`]) into `buffer`:
    /// it completes with what arrived, from 1 byte up to `buffer.len()` (a short receive is
    /// normal on a socket: [`Transfer::bytes`] says how many, and the buffer's length is set
    /// to them), or with 0 bytes once the peer has closed its end (end of stream). The buffer
    /// belongs to the stager until the completion, as for [`Stager::read`]; a receive waiting
    /// for data can be [cancelled](Stager::cancel), which hands the buffer back.
    ///
    /// # Errors
    /// [`Refused`] (with the buffer): [`Error::NotAStream`] for a regular file, and as
    /// [`Stager::read`].
    pub fn recv(&mut self, socket: &File, buffer: OwnedBuffer) -> Result<Ticket, Refused> {
        self.start_stream(socket, buffer, false)
    }

    /// As [`Stager::recv`], but a short receive is resubmitted for the rest: the request
    /// completes once the buffer is full, or short only when the peer closed first (then
    /// [`Completion::into_full`] gives [`Error::ShortRead`], or [`Error::Eof`] if nothing came).
    ///
    /// # Errors
    /// As [`Stager::recv`].
    pub fn recv_exact(&mut self, socket: &File, buffer: OwnedBuffer) -> Result<Ticket, Refused> {
        self.start_stream(socket, buffer, true)
    }

    fn start_stream(
        &mut self,
        socket: &File,
        buffer: OwnedBuffer,
        exact: bool,
    ) -> Result<Ticket, Refused> {
        if socket.is_regular() {
            let error = Error::NotAStream {
                path: socket.path().to_owned(),
            };
            return Err(Refused { error, buffer });
        }
        self.start(Op::Read, socket, 0, buffer, exact)
    }

    fn start(
        &mut self,
        op: Op,
        file: &File,
        offset: u64,
        buffer: OwnedBuffer,
        exact: bool,
    ) -> Result<Ticket, Refused> {
        let wanted = buffer.len();
        let fixed = match self.check(file, offset, &buffer, wanted) {
            Ok(fixed) => fixed,
            Err(error) => return Err(Refused { error, buffer }),
        };
        let request = InFlight {
            op,
            file: file.clone(),
            offset,
            wanted,
            done: 0,
            fixed,
            cancelled: false,
            exact,
            addr: buffer.as_ptr().as_ptr() as usize,
            buffer: Some(buffer),
        };
        match self.enqueue(request) {
            Ok(key) => Ok(Ticket(key)),
            Err((error, Some(buffer))) => Err(Refused { error, buffer }),
            Err((error, None)) => unreachable!("a request made with its buffer lost it: {error}"),
        }
    }

    /// Puts `request` in the table and queues it; on failure its buffer comes back (it was
    /// never queued, so the buffer is the caller's again).
    fn enqueue(&mut self, request: InFlight) -> Result<u64, (Error, Option<OwnedBuffer>)> {
        let key = match self.slots.insert(request) {
            Ok(key) => key,
            Err(request) => return Err((Error::Full { depth: self.depth }, request.buffer)),
        };
        if let Err(error) = self.push_io(key) {
            if let Some(request) = self.slots.remove(key) {
                return Err((error, request.buffer));
            }
        }
        Ok(key)
    }

    /// Reads `len` bytes at `offset` of `file` into the first `len` bytes of `buffer`, which
    /// stays the caller's, and waits for the read (other requests in flight go on; their
    /// completions wait in [`Stager::wait`]'s queue). Short reads of a regular file are
    /// resumed as for [`Stager::read`]; the buffer's length is left as it is.
    ///
    /// The kernel writes the buffer only while this call runs: it returns once the read's
    /// completion is in. If the ring cannot be waited on any more (`io_uring_enter` failing
    /// with something other than `EINTR`/`EBUSY`, which a valid ring does not do) the process
    /// aborts, since returning would hand back a buffer the kernel may still write.
    ///
    /// # Errors
    /// As [`Stager::read`], and [`Error::Length`] if `len` exceeds the buffer's length.
    pub(crate) fn read_lent(
        &mut self,
        file: &File,
        offset: u64,
        buffer: &OwnedBuffer,
        len: usize,
    ) -> Result<Transfer, Error> {
        self.lent(Op::Read, file, offset, buffer, len)
    }

    /// Writes the first `len` bytes of `buffer` to `offset` of `file` and waits for the write,
    /// as [`Stager::read_lent`] (the kernel only reads the buffer).
    ///
    /// # Errors
    /// As [`Stager::write`], and [`Error::Length`].
    pub(crate) fn write_lent(
        &mut self,
        file: &File,
        offset: u64,
        buffer: &OwnedBuffer,
        len: usize,
    ) -> Result<Transfer, Error> {
        if !file.is_writable() {
            return Err(Error::ReadOnly {
                path: file.path().to_owned(),
            });
        }
        self.lent(Op::Write, file, offset, buffer, len)
    }

    fn lent(
        &mut self,
        op: Op,
        file: &File,
        offset: u64,
        buffer: &OwnedBuffer,
        len: usize,
    ) -> Result<Transfer, Error> {
        if len > buffer.len() {
            return Err(Error::Length {
                len,
                buffer: buffer.len(),
            });
        }
        let fixed = self.check(file, offset, buffer, len)?;
        let request = InFlight {
            op,
            file: file.clone(),
            offset,
            wanted: len,
            done: 0,
            fixed,
            cancelled: false,
            exact: false,
            addr: buffer.as_ptr().as_ptr() as usize,
            buffer: None,
        };
        let key = self.enqueue(request).map_err(|(error, _)| error)?;
        loop {
            if let Some(i) = self.lent.iter().position(|&(k, _)| k == key) {
                return self.lent.swap_remove(i).1;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => {
                    eprintln!(
                        "userdma: io_uring_enter failed ({e}) while a {op} into a lent pool \
                         buffer was in flight; aborting rather than handing back a buffer the \
                         kernel may still write"
                    );
                    std::process::abort();
                }
            }
            self.reap();
        }
    }

    fn check(
        &self,
        file: &File,
        offset: u64,
        buffer: &OwnedBuffer,
        len: usize,
    ) -> Result<Fixed, Error> {
        if len == 0 {
            return Err(Error::Empty);
        }
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(Error::Offset { offset, len });
        }
        let fixed = self.fixed(buffer).ok_or(Error::NotRegistered {
            offset: buffer.as_buffer().offset(),
            len,
        })?;
        if file.mode() == Mode::Direct {
            file.check(offset, len, buffer.as_ptr().as_ptr() as usize)?;
        }
        Ok(fixed)
    }

    /// Queues the (rest of the) request under `key`.
    fn push_io(&mut self, key: u64) -> Result<(), Error> {
        let Some(r) = self.slots.get(key) else {
            return Ok(());
        };
        let fd = types::Fd(r.file.raw_fd());
        // `done < wanted <= u32::MAX` (a pool buffer's length is a `u32`).
        let len = (r.wanted - r.done) as u32;
        // The kernel only uses the address; Rust never dereferences it.
        let ptr = (r.addr + r.done) as *mut u8;
        // A stream (socket, pipe) has no position: every part of a request reads at `offset`.
        let at = if r.file.is_regular() {
            r.offset + r.done as u64
        } else {
            r.offset
        };
        let entry = match r.op {
            Op::Read => opcode::ReadFixed::new(fd, ptr, len, r.fixed.index)
                .offset(at)
                .build(),
            Op::Write => opcode::WriteFixed::new(fd, ptr, len, r.fixed.index)
                .offset(at)
                .build(),
        };
        self.push(entry.user_data(key))
    }

    /// Pushes one entry, submitting the queue first if it is full.
    fn push(&mut self, entry: squeue::Entry) -> Result<(), Error> {
        // SAFETY: a read or write entry points at `len` bytes of a buffer this stager holds
        // (in `slots`) until the entry's completion is reaped — or, for a lent buffer, of one
        // its caller holds borrowed across `Stager::lent`, which returns only once that
        // completion is reaped (or aborts the process) — inside a registered fixed buffer
        // that outlives the ring; its fd is kept open by the `File` clone held with it. The
        // pool never hands out references to its memory (copies in and out only), so the
        // kernel writing it breaks no Rust aliasing rule. A cancel entry points at nothing.
        if unsafe { self.ring.submission().push(&entry) }.is_ok() {
            return Ok(());
        }
        self.submit()?;
        // SAFETY: as above.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| Error::Enter(io::Error::other("submission queue full after submitting")))
    }

    /// Hands the queued requests to the kernel; returns how many.
    ///
    /// # Errors
    /// [`Error::Enter`].
    pub fn submit(&mut self) -> Result<usize, Error> {
        loop {
            match self.ring.submit() {
                Ok(n) => return Ok(n),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // The completion queue is full: make room, then try again.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => self.reap(),
                Err(e) => return Err(Error::Enter(e)),
            }
        }
    }

    /// Asks the kernel to cancel `ticket`'s request; its completion still comes through
    /// [`Stager::wait`] (with [`Error::Cancelled`], or its result if it finished first), and
    /// the buffer with it. Returns `false` if the request is not in flight.
    ///
    /// # Errors
    /// [`Error::Enter`] if the cancel cannot be queued.
    pub fn cancel(&mut self, ticket: Ticket) -> Result<bool, Error> {
        match self.slots.get_mut(ticket.0) {
            Some(r) if !r.cancelled => r.cancelled = true,
            Some(_) => return Ok(true),
            None => return Ok(false),
        }
        let entry = opcode::AsyncCancel::new(ticket.0)
            .build()
            .user_data(CANCEL_BIT | ticket.0);
        self.push(entry)?;
        Ok(true)
    }

    /// The next completion, waiting for one if none is ready (queued requests are submitted
    /// first).
    ///
    /// # Errors
    /// [`Error::Idle`] with nothing in flight; [`Error::Enter`].
    pub fn wait(&mut self) -> Result<Completion, Error> {
        loop {
            if let Some(done) = self.ready.pop_front() {
                return Ok(done);
            }
            if self.slots.len() == 0 {
                return Err(Error::Idle);
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(e) => return Err(Error::Enter(e)),
            }
            self.reap();
        }
    }

    /// A completion if one is ready, without waiting (queued requests are submitted first).
    ///
    /// # Errors
    /// [`Error::Enter`].
    pub fn try_wait(&mut self) -> Result<Option<Completion>, Error> {
        if self.ready.is_empty() && self.slots.len() > 0 {
            self.submit()?;
            self.reap();
        }
        Ok(self.ready.pop_front())
    }

    /// Moves every completion from the ring into `ready`, resubmitting short transfers.
    fn reap(&mut self) {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend(
            self.ring
                .completion()
                .map(|cqe| (cqe.user_data(), cqe.result())),
        );
        for &(key, res) in &scratch {
            if key & CANCEL_BIT != 0 {
                // The cancel's own completion: the request's comes separately.
                continue;
            }
            self.complete(key, res);
        }
        self.scratch = scratch;
    }

    /// Accounts one completion of the request under `key`.
    fn complete(&mut self, key: u64, res: i32) {
        let Some(r) = self.slots.get_mut(key) else {
            return;
        };
        let outcome = if res < 0 {
            let errno = -res;
            Some(
                if errno == libc::ECANCELED || (errno == libc::EINTR && r.cancelled) {
                    Err(Error::Cancelled {
                        op: r.op,
                        path: r.file.path().to_owned(),
                        offset: r.offset,
                    })
                } else {
                    Err(Error::Io {
                        op: r.op,
                        path: r.file.path().to_owned(),
                        offset: r.offset,
                        len: r.wanted,
                        source: io::Error::from_raw_os_error(errno),
                    })
                },
            )
        } else {
            // `res >= 0`, at most the length asked for.
            r.done = (r.done + res as usize).min(r.wanted);
            let align = r.file.alignment();
            let addr = r.addr + r.done;
            let resumable = r.file.mode() == Mode::Buffered
                || align
                    .check(r.offset + r.done as u64, r.wanted - r.done, addr)
                    .is_none();
            let resumes = r.file.is_regular() || r.exact;
            if res > 0 && r.done < r.wanted && !r.cancelled && resumable && resumes {
                None
            } else {
                Some(Ok(Transfer {
                    bytes: r.done,
                    requested: r.wanted,
                }))
            }
        };
        let result = match outcome {
            Some(result) => result,
            None => match self.push_io(key) {
                Ok(()) => return,
                Err(e) => Err(e),
            },
        };
        if let Some(r) = self.slots.remove(key) {
            let Some(mut buffer) = r.buffer else {
                // A lent buffer: the waiting call takes the result.
                self.lent.push((key, result));
                return;
            };
            if r.op == Op::Read {
                if let Ok(t) = &result {
                    // At most the buffer's length, which was valid.
                    let _ = buffer.set_len(t.bytes);
                }
            }
            self.ready.push_back(Completion {
                ticket: Ticket(key),
                op: r.op,
                offset: r.offset,
                buffer,
                result,
                file: r.file,
            });
        }
    }
}

impl Drop for Stager {
    /// Cancels what is in flight and waits for every completion, so no buffer goes back to the
    /// pool while the kernel may still write it. If the ring cannot be waited on, the buffers
    /// in flight are leaked instead (never freed, so never reused).
    fn drop(&mut self) {
        for key in self.slots.keys() {
            let _ = self.cancel(Ticket(key));
        }
        while self.slots.len() > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
                Err(_) => {
                    for r in self.slots.drain() {
                        userdma::memory::keep_until_exit(r.buffer);
                    }
                    break;
                }
            }
            self.reap();
        }
    }
}

/// The error for a failed `io_uring_setup`.
fn setup_error(entries: u32, source: io::Error) -> Error {
    match source.raw_os_error() {
        Some(libc::ENOSYS) => Error::Unavailable { source },
        Some(libc::EPERM) => match shim::io_uring_disabled() {
            0 => Error::RingSetup { entries, source },
            value => Error::Disabled { value, source },
        },
        _ => Error::RingSetup { entries, source },
    }
}

#[cfg(test)]
mod tests;
