//! Completions ([`Stager::wait`], [`Stager::try_wait`]): reaped from the ring, matched to
//! their requests, short transfers resumed, and each finished request's buffer handed back
//! in its [`Completion`] (or its result to the call that lent it).

use std::io;

use super::{Completion, Op, Stager, Ticket, Transfer};
use crate::stage::slots::CANCEL_BIT;
use crate::stage::{Error, Mode};

impl Stager {
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
    #[inline]
    pub(super) fn reap(&mut self) {
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
