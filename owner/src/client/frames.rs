//! Frames: submitting them (with the buffers, with the spans a binding knows, or by bare
//! offsets; who checks what is in the [module docs](super)) and taking their completions.

use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags};
use userdma::pool::Buffer;

use super::{drain, io_err, poll_timeout, Client, Span, Stream};
use crate::chan::{Completion, Submission};
use crate::Error;

impl Client {
    /// Submits a frame of `stream`: the device reads `input` and writes the result into
    /// `result` (both from [`Client::pool`], at least the stream's `input_bytes` and
    /// `result_bytes` long; they may be the same buffer); the completion carries `tag`.
    ///
    /// # Errors
    /// [`Error::Full`] when this client has its limit of frames out (take completions);
    /// [`Error::ShortBuffer`] for a buffer shorter than the stream needs and
    /// [`Error::ForeignBuffer`] for one of another pool (nothing is sent); [`Error::Gone`]
    /// after the owner left. A stream that is not this client's is not an error here: the
    /// owner refuses the frame ([`crate::chan::STATUS_REFUSED`]).
    pub fn submit(
        &mut self,
        stream: &Stream,
        input: &Buffer<'_>,
        result: &Buffer<'_>,
        tag: u64,
    ) -> Result<(), Error> {
        for (what, b, needed) in [
            ("input", input, stream.input_bytes),
            ("result", result, stream.result_bytes),
        ] {
            if !b.is_from(&self.pool) {
                return Err(Error::ForeignBuffer { what });
            }
            if (b.len() as u64) < needed {
                return Err(Error::ShortBuffer {
                    what,
                    len: b.len(),
                    needed,
                });
            }
        }
        self.submit_offsets(
            stream.id,
            input.offset() as u64,
            result.offset() as u64,
            tag,
        )
    }

    /// Submits a frame of stream number `stream` whose buffers the caller names as it knows
    /// them: `Some` span for a buffer of [`Client::pool`] it allocated and has not freed
    /// (where the buffer starts, and its length), `None` for an offset that is no such
    /// buffer. The binding of a language that cannot hold a [`Buffer`] (the C library, with
    /// its table of the buffers it gave out) submits this way.
    ///
    /// A frame of a stream this client did not declare (or closed), with a `None` buffer, or
    /// with a buffer shorter than the stream's `input_bytes` or `result_bytes` is refused
    /// here: nothing is sent, nothing is read or written, and it completes with
    /// [`crate::chan::STATUS_REFUSED`] and `tag` as a frame the owner refuses does (it counts
    /// as in flight until its completion is taken). Otherwise the frame goes as
    /// [`Client::submit_offsets`] sends it, and the owner checks the spans lie in this
    /// client's pool. The input and the result may be the same buffer.
    ///
    /// # Errors
    /// [`Error::Full`] when this client has its limit of frames out (take completions);
    /// [`Error::Gone`] after the owner left.
    pub fn submit_spans(
        &mut self,
        stream: u32,
        input: Option<Span>,
        result: Option<Span>,
        tag: u64,
    ) -> Result<(), Error> {
        let fits = |span: Option<Span>, needed: u64| span.filter(|s| s.len >= needed);
        let spans = self.streams.iter().find(|s| s.id == stream).and_then(|s| {
            Some((
                fits(input, s.input_bytes)?.offset,
                fits(result, s.result_bytes)?.offset,
            ))
        });
        match spans {
            Some((input, result)) => self.submit_offsets(stream, input, result, tag),
            None => self.refuse(stream, tag),
        }
    }

    /// Completes a frame of `stream` with `tag` as refused, without sending it: it takes a
    /// place among the frames out, as a frame the owner refuses does until its completion is
    /// taken.
    fn refuse(&mut self, stream: u32, tag: u64) -> Result<(), Error> {
        self.room()?;
        self.refused.push_back(Completion {
            stream,
            status: crate::chan::STATUS_REFUSED,
            tag,
            latency_ns: 0,
            wait_ns: 0,
        });
        self.in_flight += 1;
        Ok(())
    }

    /// Submits a frame by bare offsets in the pool's region, unchecked here: only the owner's
    /// checks apply (a completion with [`crate::chan::STATUS_REFUSED`] for a stream not this
    /// client's, or an offset whose span of the stream's `input_bytes` or `result_bytes` is
    /// outside this client's pool, misaligned or not contiguous; see the module docs). The
    /// owner cannot tell which buffer an offset starts nor how long it is: an offset in the
    /// middle of a buffer, of a buffer freed, or of one shorter than the stream needs runs,
    /// and the device reads or writes this client's pool past that buffer's end. Use
    /// [`Client::submit`] with the buffers, or [`Client::submit_spans`] with their lengths.
    ///
    /// # Errors
    /// [`Error::Full`], [`Error::Gone`].
    pub fn submit_offsets(
        &mut self,
        stream: u32,
        input: u64,
        result: u64,
        tag: u64,
    ) -> Result<(), Error> {
        self.room()?;
        let rings = self.rings()?;
        if !rings.submit(&Submission {
            stream,
            input,
            result,
            tag,
        }) {
            return Err(Error::Full {
                in_flight: self.in_flight,
                limit: self.max_in_flight,
            });
        }
        if rings.owner_needs_wake() {
            self.owner_bell
                .signal()
                .map_err(|e| io_err("ringing the owner's doorbell", io::Error::other(e)))?;
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Takes one completion, without waiting: a frame refused before it was sent
    /// ([`Client::submit_spans`]) first, then the owner's.
    pub fn poll(&mut self) -> Option<Completion> {
        let c = match self.refused.pop_front() {
            Some(c) => c,
            None => self.rings().ok()?.complete()?,
        };
        self.in_flight = self.in_flight.saturating_sub(1);
        Some(c)
    }

    /// Takes one completion, sleeping until one comes (or `timeout` passes). Events the owner
    /// sends meanwhile are kept for [`Client::events`].
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::Gone`] when the owner left with this client's frames
    /// out (their completions never come).
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<Completion, Error> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(c) = self.poll() {
                return Ok(c);
            }
            if let Some(why) = self.gone {
                return Err(Error::Gone { why });
            }
            let mut spin = self.spin;
            let caught = {
                let rings = self.rings()?;
                spin.spin(|| rings.completions_waiting())
            };
            self.spin = spin;
            if caught {
                continue;
            }
            let rings = self.rings()?;
            if rings.client_idle() {
                rings.client_awake();
                continue;
            }
            let left = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        rings.client_awake();
                        return Err(Error::Timeout(timeout.unwrap_or_default()));
                    }
                    Some(left)
                }
                None => None,
            };
            let slept = Instant::now();
            let (bell, sock) = {
                let mut fds = [
                    PollFd::new(self.bell.fd(), PollFlags::POLLIN),
                    PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
                ];
                let t = poll_timeout(left);
                match poll(&mut fds, t) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => {
                        self.rings()?.client_awake();
                        return Err(io_err("waiting for a completion", e));
                    }
                }
                let r = |f: &PollFd<'_>| f.revents().unwrap_or(PollFlags::empty());
                (r(&fds[0]), r(&fds[1]))
            };
            self.rings()?.client_awake();
            if bell.contains(PollFlags::POLLIN) {
                drain(&self.bell);
                self.spin.slept(slept.elapsed());
            }
            if !sock.is_empty() {
                self.take_messages()?;
            }
        }
    }

    /// Whether a frame may go out now: [`Error::Gone`] after the owner left, [`Error::Full`]
    /// at this client's limit of frames out.
    fn room(&self) -> Result<(), Error> {
        if let Some(why) = self.gone {
            return Err(Error::Gone { why });
        }
        if self.in_flight >= self.max_in_flight {
            return Err(Error::Full {
                in_flight: self.in_flight,
                limit: self.max_in_flight,
            });
        }
        Ok(())
    }
}
