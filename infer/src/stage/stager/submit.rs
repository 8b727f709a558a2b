//! Requests queued ([`Stager::read`], [`Stager::write`], [`Stager::recv`],
//! [`Stager::recv_exact`]): each checked (length, offset, registered buffer, direct-I/O
//! alignment), put in the table of requests in flight with its buffer, and pushed to the
//! submission queue as `READ_FIXED` / `WRITE_FIXED`; handed to the kernel
//! ([`Stager::submit`]) and cancelled ([`Stager::cancel`]).

use std::io;

use io_uring::{opcode, squeue, types};

use super::{InFlight, Op, Stager, Ticket};
use crate::stage::slots::CANCEL_BIT;
use crate::stage::{Error, File, Fixed, Mode, Refused};
use userdma::pool::OwnedBuffer;

impl Stager {
    /// Queues a read of `buffer.len()` bytes at `offset` of `file` into `buffer`; it reaches
    /// the kernel at the next [`Stager::submit`] or [`Stager::wait`]. The buffer comes back in
    /// the request's [`Completion`], its length set to the bytes read.
    ///
    /// # Errors
    /// [`Refused`] (with the buffer): [`Error::Full`] at the depth, [`Error::Empty`],
    /// [`Error::Offset`], [`Error::NotRegistered`], [`Error::Misaligned`] for direct I/O.
    ///
    /// [`Completion`]: super::Completion
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
    ///
    /// [`Transfer::bytes`]: super::Transfer::bytes
    pub fn recv(&mut self, socket: &File, buffer: OwnedBuffer) -> Result<Ticket, Refused> {
        self.start_stream(socket, buffer, false)
    }

    /// As [`Stager::recv`], but a short receive is resubmitted for the rest: the request
    /// completes once the buffer is full, or short only when the peer closed first (then
    /// [`Completion::into_full`] gives [`Error::ShortRead`], or [`Error::Eof`] if nothing came).
    ///
    /// # Errors
    /// As [`Stager::recv`].
    ///
    /// [`Completion::into_full`]: super::Completion::into_full
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
    pub(super) fn enqueue(
        &mut self,
        request: InFlight,
    ) -> Result<u64, (Error, Option<OwnedBuffer>)> {
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

    pub(super) fn check(
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
    pub(super) fn push_io(&mut self, key: u64) -> Result<(), Error> {
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
}
