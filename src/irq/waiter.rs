//! [`Waiter`]: one thread waiting on many interrupt eventfds at once, through io_uring (a
//! `POLL_ADD` per fd and one `io_uring_enter` with a timeout) or, where io_uring cannot be set up
//! (`ENOSYS`: an old kernel; `EPERM`: disabled by sysctl or a seccomp filter), epoll. The
//! io_uring backend is built with the `io-uring` feature; without it every waiter is epoll's.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

#[cfg(feature = "io-uring")]
use io_uring::{opcode, types, IoUring};

use super::eventfd::remaining;
use super::{shim, Error};

/// Which mechanism a [`Waiter`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// io_uring: one `POLL_ADD` per registered fd, `io_uring_enter` with a timeout.
    IoUring,
    /// epoll: level-triggered `EPOLLIN` per fd, `epoll_wait`.
    Epoll,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::IoUring => "io_uring",
            Kind::Epoll => "epoll",
        })
    }
}

/// One registered fd: the caller's token and our own duplicate of the fd (so the registration
/// stays valid whatever the caller does with theirs).
#[derive(Debug)]
struct Slot {
    token: u64,
    fd: OwnedFd,
    /// io_uring only: a `POLL_ADD` for this slot is in flight.
    #[cfg_attr(not(feature = "io-uring"), allow(dead_code))]
    armed: bool,
}

/// The registrations, by slot; a slot's generation changes each time it is reused, so a stale
/// completion (for an fd removed since) is recognised and ignored.
#[derive(Debug, Default)]
struct Table {
    slots: Vec<Option<Slot>>,
    generations: Vec<u32>,
    free: Vec<usize>,
    by_token: HashMap<u64, usize>,
}

impl Table {
    /// The kernel-side key of a slot: index in the low half, generation in the high half.
    fn key(&self, index: usize) -> u64 {
        (u64::from(self.generations[index]) << 32) | index as u64
    }

    /// The slot a key names, if it is still the same registration.
    fn lookup(&mut self, key: u64) -> Option<&mut Slot> {
        let index = usize::try_from(key & u64::from(u32::MAX)).ok()?;
        let generation = (key >> 32) as u32;
        if self.generations.get(index) != Some(&generation) {
            return None;
        }
        self.slots.get_mut(index)?.as_mut()
    }

    fn insert(&mut self, token: u64, fd: OwnedFd) -> Result<usize, Error> {
        if self.by_token.contains_key(&token) {
            return Err(Error::DuplicateToken { token });
        }
        let slot = Slot {
            token,
            fd,
            armed: false,
        };
        let index = match self.free.pop() {
            Some(index) => {
                self.slots[index] = Some(slot);
                index
            }
            None => {
                self.slots.push(Some(slot));
                self.generations.push(0);
                self.slots.len() - 1
            }
        };
        self.by_token.insert(token, index);
        Ok(index)
    }

    fn remove(&mut self, token: u64) -> Result<(usize, Slot), Error> {
        let index = self
            .by_token
            .remove(&token)
            .ok_or(Error::UnknownToken { token })?;
        let slot = self.slots[index]
            .take()
            .ok_or(Error::UnknownToken { token })?;
        self.generations[index] = self.generations[index].wrapping_add(1);
        self.free.push(index);
        Ok((index, slot))
    }
}

/// The mechanism behind a waiter.
enum Backend {
    #[cfg(feature = "io-uring")]
    Uring(Box<IoUring>),
    Epoll(nix::sys::epoll::Epoll),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            #[cfg(feature = "io-uring")]
            Backend::Uring(ring) => write!(f, "Uring(fd {})", ring.as_raw_fd()),
            Backend::Epoll(fd) => write!(f, "Epoll({fd:?})"),
        }
    }
}

/// The `user_data` of a `POLL_REMOVE`, whose own completion is ignored.
#[cfg(feature = "io-uring")]
const REMOVE: u64 = u64::MAX;

/// Submission-queue entries of the ring; more registrations are armed in several submits.
#[cfg(feature = "io-uring")]
const RING_ENTRIES: u32 = 64;

/// Waits on many fds (interrupt eventfds, usually) at once and says which are readable.
/// Level-triggered: an fd still readable at the next [`Waiter::wait`] is reported again, so
/// the caller reads (resets) the eventfds it handles. Register each fd with a token of your
/// choice; [`Waiter::wait`] returns the tokens of the readable ones.
///
/// ```
/// use std::time::Duration;
/// use userdma::irq::{EventFd, Waiter};
///
/// # fn main() -> Result<(), userdma::irq::Error> {
/// let (a, b) = (EventFd::new()?, EventFd::new()?);
/// let mut waiter = Waiter::new()?; // io_uring, or epoll where io_uring is not allowed
/// waiter.add(&a, 1)?;
/// waiter.add(&b, 2)?;
/// b.signal()?;
/// assert_eq!(waiter.wait(Some(Duration::from_secs(1)))?, &[2]);
/// b.try_read()?;
/// assert!(waiter.wait(Some(Duration::from_millis(1)))?.is_empty());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Waiter {
    backend: Backend,
    table: Table,
    ready: Vec<u64>,
    events: Vec<nix::sys::epoll::EpollEvent>,
}

impl Waiter {
    /// An io_uring waiter, or an epoll one if io_uring cannot be set up here (`ENOSYS`,
    /// `EPERM`) or this build has no io_uring backend (the `io-uring` feature is off). Any
    /// other io_uring failure (out of memory, too many open files) is an error.
    pub fn new() -> Result<Waiter, Error> {
        #[cfg(feature = "io-uring")]
        {
            match Waiter::with_io_uring() {
                Ok(waiter) => Ok(waiter),
                Err(Error::RingSetup { source })
                    if matches!(source.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) =>
                {
                    Waiter::with_epoll()
                }
                Err(err) => Err(err),
            }
        }
        #[cfg(not(feature = "io-uring"))]
        Waiter::with_epoll()
    }

    /// An io_uring waiter, with no fallback; [`Error::IoUringNotBuilt`] in a build without the
    /// `io-uring` feature.
    pub fn with_io_uring() -> Result<Waiter, Error> {
        #[cfg(feature = "io-uring")]
        {
            let ring = IoUring::new(RING_ENTRIES).map_err(|source| Error::RingSetup { source })?;
            Ok(Waiter::from_backend(Backend::Uring(Box::new(ring))))
        }
        #[cfg(not(feature = "io-uring"))]
        Err(Error::IoUringNotBuilt)
    }

    /// An epoll waiter.
    pub fn with_epoll() -> Result<Waiter, Error> {
        let fd = shim::epoll_create().map_err(|source| Error::EpollSetup { source })?;
        Ok(Waiter::from_backend(Backend::Epoll(fd)))
    }

    fn from_backend(backend: Backend) -> Waiter {
        Waiter {
            backend,
            table: Table::default(),
            ready: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Which mechanism this waiter uses.
    pub fn kind(&self) -> Kind {
        match self.backend {
            #[cfg(feature = "io-uring")]
            Backend::Uring(_) => Kind::IoUring,
            Backend::Epoll(_) => Kind::Epoll,
        }
    }

    /// How many fds are registered.
    pub fn len(&self) -> usize {
        self.table.by_token.len()
    }

    /// Whether no fd is registered.
    pub fn is_empty(&self) -> bool {
        self.table.by_token.is_empty()
    }

    /// Watches `fd` for readability under `token` (unique among the registrations). The waiter
    /// keeps its own duplicate of the fd, so the caller's may be closed at any time (remove the
    /// registration to stop watching).
    pub fn add(&mut self, fd: impl AsFd, token: u64) -> Result<(), Error> {
        let fd = fd.as_fd();
        let raw = fd.as_raw_fd();
        let own = shim::dup(fd).map_err(|source| Error::Register {
            token,
            fd: raw,
            source,
        })?;
        let index = self.table.insert(token, own)?;
        // Room for every registration's readiness now, while setting up: a wait then never
        // allocates (a wait reports each registration at most once, and epoll fills one event
        // per registration at most).
        let registered = self.table.slots.len();
        self.ready
            .reserve(registered.saturating_sub(self.ready.len()));
        self.events
            .reserve(registered.saturating_sub(self.events.len()));
        #[cfg_attr(not(feature = "io-uring"), allow(irrefutable_let_patterns))]
        if let Backend::Epoll(epoll) = &self.backend {
            let key = self.table.key(index);
            let slot_fd = self.table.slots[index]
                .as_ref()
                .map(|slot| slot.fd.as_fd())
                .ok_or(Error::UnknownToken { token })?;
            if let Err(source) = shim::epoll_add(epoll, slot_fd, key) {
                // Undo the table entry: the fd is not watched.
                let _ = self.table.remove(token);
                return Err(Error::Register {
                    token,
                    fd: raw,
                    source,
                });
            }
        }
        // io_uring: the POLL_ADD is submitted by the next `wait`.
        Ok(())
    }

    /// Stops watching the fd registered under `token`.
    pub fn remove(&mut self, token: u64) -> Result<(), Error> {
        #[cfg_attr(not(feature = "io-uring"), allow(unused_variables))]
        let (index, slot) = self.table.remove(token)?;
        match &mut self.backend {
            Backend::Epoll(epoll) => {
                shim::epoll_delete(epoll, slot.fd.as_fd())
                    .map_err(|source| Error::Deregister { token, source })?;
            }
            #[cfg(feature = "io-uring")]
            Backend::Uring(ring) => {
                if slot.armed {
                    // The key still has the old generation: the table bumped it on removal.
                    let old_key = (u64::from(self.table.generations[index].wrapping_sub(1)) << 32)
                        | index as u64;
                    let entry = opcode::PollRemove::new(old_key).build().user_data(REMOVE);
                    push(ring, &entry).map_err(|source| Error::Deregister { token, source })?;
                    // Its completion (and the poll's, -ECANCELED, with a stale key) are
                    // skipped by `wait`. The kernel holds its own reference to the file, so
                    // closing our fd now (dropping `slot`) is fine.
                }
            }
        }
        Ok(())
    }

    /// Waits up to `timeout` (`None`: forever) until at least one registered fd is readable, and
    /// returns the tokens of the readable ones (empty on timeout). Does not read the fds.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<&[u64], Error> {
        self.ready.clear();
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        match &mut self.backend {
            Backend::Epoll(epoll) => wait_epoll(
                epoll,
                &mut self.table,
                &mut self.events,
                &mut self.ready,
                timeout,
                deadline,
            )?,
            #[cfg(feature = "io-uring")]
            Backend::Uring(ring) => {
                wait_uring(ring, &mut self.table, &mut self.ready, timeout, deadline)?
            }
        }
        Ok(&self.ready)
    }
}

fn wait_epoll(
    epoll: &nix::sys::epoll::Epoll,
    table: &mut Table,
    events: &mut Vec<nix::sys::epoll::EpollEvent>,
    ready: &mut Vec<u64>,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
) -> Result<(), Error> {
    events.resize(
        table.slots.len().max(1),
        nix::sys::epoll::EpollEvent::empty(),
    );
    loop {
        let left = remaining(timeout, deadline);
        match shim::epoll_wait(epoll, events, shim::timeout_ms(left)) {
            Ok(n) => {
                for event in &events[..n] {
                    if let Some(slot) = table.lookup(event.data()) {
                        ready.push(slot.token);
                    }
                }
                return Ok(());
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {
                if left == Some(Duration::ZERO) {
                    return Ok(());
                }
            }
            Err(source) => {
                return Err(Error::Wait {
                    kind: Kind::Epoll,
                    source,
                })
            }
        }
    }
}

/// Pushes one entry, submitting what is queued first if the submission queue is full.
#[cfg(feature = "io-uring")]
fn push(ring: &mut IoUring, entry: &io_uring::squeue::Entry) -> io::Result<()> {
    // SAFETY: the entries pushed here are POLL_ADD (an fd and an event mask, no buffers) and
    // POLL_REMOVE (a key): nothing the kernel reads or writes through a pointer of ours. The
    // fd of a POLL_ADD is ours and open; the kernel takes its own reference to the file.
    let pushed = unsafe { ring.submission().push(entry) };
    if pushed.is_ok() {
        return Ok(());
    }
    ring.submit()?;
    // SAFETY: as above.
    unsafe { ring.submission().push(entry) }
        .map_err(|_| io::Error::other("io_uring submission queue full after submitting"))
}

#[cfg(feature = "io-uring")]
fn wait_uring(
    ring: &mut IoUring,
    table: &mut Table,
    ready: &mut Vec<u64>,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
) -> Result<(), Error> {
    let fail = |source| Error::Wait {
        kind: Kind::IoUring,
        source,
    };
    loop {
        arm(ring, table).map_err(fail)?;
        let left = remaining(timeout, deadline);
        let result = match left {
            None => ring.submit_and_wait(1),
            Some(left) => {
                let ts = types::Timespec::from(left);
                let args = types::SubmitArgs::new().timespec(&ts);
                ring.submitter().submit_with_args(1, &args)
            }
        };
        match result {
            Ok(_) => {}
            Err(err) if matches!(err.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
            Err(err) if err.raw_os_error() == Some(libc::EBUSY) => {
                // Completion queue overflow backlog: reaping below makes room.
            }
            Err(source) => return Err(fail(source)),
        }
        for cqe in ring.completion() {
            let key = cqe.user_data();
            if key == REMOVE {
                continue;
            }
            if let Some(slot) = table.lookup(key) {
                slot.armed = false;
                // Readable, or an error a read of the fd will report: either way the caller
                // should look. A cancelled poll (-ECANCELED) is only re-armed.
                if cqe.result() != -libc::ECANCELED {
                    ready.push(slot.token);
                }
            }
        }
        if !ready.is_empty() || remaining(timeout, deadline) == Some(Duration::ZERO) {
            return Ok(());
        }
        // Nothing yet (a wake-up for a cancelled poll): re-arm and wait for the time left.
    }
}

/// Arms every registration whose poll is not in flight (new ones, and those reported by the
/// previous wait): a one-shot `POLL_ADD` completes at once if the fd is readable now, which makes
/// the waiter level-triggered.
#[cfg(feature = "io-uring")]
fn arm(ring: &mut IoUring, table: &mut Table) -> io::Result<()> {
    for index in 0..table.slots.len() {
        let key = table.key(index);
        if let Some(slot) = table.slots[index].as_mut() {
            if !slot.armed {
                let entry =
                    opcode::PollAdd::new(types::Fd(slot.fd.as_raw_fd()), libc::POLLIN as u32)
                        .build()
                        .user_data(key);
                push(ring, &entry)?;
                slot.armed = true;
            }
        }
    }
    Ok(())
}
