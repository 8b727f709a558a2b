//! [`Stager`]: reads into and writes from pool buffers with io_uring `READ_FIXED` /
//! `WRITE_FIXED`, many in flight, each buffer held by the stager until its completion.
//!
//! | module | owns |
//! |---|---|
//! | this one | [`Stager`]: the ring, its registered buffers, the table of requests in flight; [`Config`] |
//! | `request` | [`Op`], [`Ticket`], [`Transfer`], [`Completion`] |
//! | `submit` | requests queued: reads, writes, receives, their checks, submission, cancelling |
//! | `lent` | a read or write into a buffer the caller keeps, waited for before returning |
//! | `complete` | completions reaped and matched to their requests, short transfers resumed |

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::sync::Arc;

use super::slots::Slots;
use super::{shim, Error, File, Fixed, Layout, MAX_DEPTH};
use io_uring::IoUring;
use userdma::pool::{OwnedBuffer, Pool};

mod complete;
mod lent;
mod request;
mod submit;

pub use self::request::{Completion, Op, Ticket, Transfer};

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
        if !buffer.is_from(&self.pool) {
            return None;
        }
        self.layout
            .locate(buffer.as_buffer().offset(), buffer.capacity())
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
