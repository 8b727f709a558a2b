//! Fences across processes: a point of completion as a file descriptor any process can poll.
//!
//! A [`Fence`] is signalled once and stays signalled; waiting is `poll` for `POLLIN`, so any
//! process holding the descriptor (passed over a Unix socket, [`crate::share`]) can wait for it,
//! from Rust, C, an event loop or another driver's API that takes a pollable fd. Two sources:
//!
//! - [`Fence::new`]: an `eventfd` this process signals ([`Fence::signal`]) when the work it
//!   stands for is done: a queue's completions up to a point, a pipeline's frame
//!   ([`Timeline`] keeps one per point and signals them in order).
//! - [`Fence::from_fd`]: another driver's fence to wait for: a `sync_file` (DRM, V4L2's
//!   out-fences, [`crate::dmabuf::DmaBuf::fence`]), another process's eventfd. A submission that
//!   must not start before it waits on it ([`Fence::wait`]) first.
//!
//! Nothing reads the eventfd: a read would reset it for every other waiter.

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

/// A completion as a pollable file descriptor. See the module documentation.
#[derive(Debug)]
pub struct Fence {
    fd: OwnedFd,
    /// This process may signal it (an eventfd).
    signalable: bool,
}

impl Fence {
    /// A new, unsignalled fence this process signals (an `eventfd`, close-on-exec).
    ///
    /// # Errors
    /// [`Error::Create`] when the process is out of descriptors.
    pub fn new() -> Result<Fence, Error> {
        let event = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| Error::Create { source: e.into() })?;
        Ok(Fence {
            fd: OwnedFd::from(event),
            signalable: true,
        })
    }

    /// Another driver's or process's fence, to wait for: any descriptor that becomes readable
    /// (`POLLIN`) when signalled, such as a `sync_file` or an eventfd. An eventfd may also be
    /// signalled from here ([`Fence::signal`]).
    pub fn from_fd(fd: OwnedFd) -> Fence {
        let link = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let signalable = link.is_ok_and(|target| target.as_os_str() == "anon_inode:[eventfd]");
        Fence { fd, signalable }
    }

    /// Signals it: every waiter, in every process, wakes and sees it signalled from now on.
    /// Signalling again changes nothing.
    ///
    /// # Errors
    /// [`Error::NotSignalable`] for another driver's fence (a `sync_file` signals itself);
    /// [`Error::Signal`] when the write fails.
    pub fn signal(&self) -> Result<(), Error> {
        if !self.signalable {
            return Err(Error::NotSignalable);
        }
        // An eventfd whose counter cannot take 1 more is signalled already (its counter is
        // not 0); a write would block on one made without EFD_NONBLOCK (another process's,
        // say), so it is not written. (Only a writer racing it to the maximum can make the
        // write below wait, and then only until a waiter reads the counter.)
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLOUT)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(Error::Signal { source: e.into() }),
        }
        match nix::unistd::write(&self.fd, &1u64.to_ne_bytes()) {
            Ok(_) => Ok(()),
            // The counter is at its maximum: signalled already.
            Err(nix::errno::Errno::EAGAIN) => Ok(()),
            Err(e) => Err(Error::Signal { source: e.into() }),
        }
    }

    /// Whether it is signalled, without waiting.
    ///
    /// # Errors
    /// [`Error::Wait`] when `poll` fails.
    pub fn is_signalled(&self) -> Result<bool, Error> {
        self.poll_once(PollTimeout::ZERO)
    }

    /// Waits until it is signalled, at most `timeout` (`None`: no limit).
    ///
    /// # Errors
    /// [`Error::Timeout`] when the time passes first; [`Error::Wait`] when `poll` fails.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<(), Error> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let left = match deadline {
                None => PollTimeout::NONE,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    // Rounded up so that a wait never ends before its deadline.
                    let ms = left.as_nanos().div_ceil(1_000_000);
                    PollTimeout::try_from(ms.min(i32::MAX as u128) as i32)
                        .unwrap_or(PollTimeout::MAX)
                }
            };
            if self.poll_once(left)? {
                return Ok(());
            }
            if let Some(deadline) = deadline {
                if Instant::now() >= deadline {
                    return Err(Error::Timeout {
                        waited: timeout.unwrap_or_default(),
                    });
                }
            }
        }
    }

    fn poll_once(&self, timeout: PollTimeout) -> Result<bool, Error> {
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) => Ok(false),
            Ok(_) => {
                let revents = fds[0].revents().unwrap_or(PollFlags::empty());
                if revents.intersects(PollFlags::POLLERR | PollFlags::POLLNVAL) {
                    return Err(Error::Wait {
                        source: io::Error::from_raw_os_error(libc::EBADF),
                    });
                }
                Ok(revents.contains(PollFlags::POLLIN))
            }
            Err(nix::errno::Errno::EINTR) => Ok(false),
            Err(e) => Err(Error::Wait { source: e.into() }),
        }
    }

    /// Whether this process may signal it.
    pub fn is_signalable(&self) -> bool {
        self.signalable
    }

    /// The descriptor, to poll or to pass to another process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The descriptor, owned.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Another descriptor of the same fence (`dup`).
    ///
    /// # Errors
    /// [`Error::Create`] when the process is out of descriptors.
    pub fn try_clone(&self) -> Result<Fence, Error> {
        Ok(Fence {
            fd: self
                .fd
                .try_clone()
                .map_err(|source| Error::Create { source })?,
            signalable: self.signalable,
        })
    }
}

impl AsFd for Fence {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Fences for points of a sequence (a queue's submissions, a pipeline's frames), signalled in
/// order: [`Timeline::fence`] gives the fence of point `n`, [`Timeline::reached`] says every
/// point up to `n` is done and signals their fences. Fences for points already reached are
/// made signalled.
#[derive(Debug, Default)]
pub struct Timeline {
    /// The highest point reached (`None`: none yet).
    reached: Option<u64>,
    /// Fences handed out for points not reached yet, in point order.
    waiting: VecDeque<(u64, Fence)>,
}

impl Timeline {
    /// An empty timeline: no point reached.
    pub fn new() -> Timeline {
        Timeline::default()
    }

    /// A fence for point `point`: signalled once [`Timeline::reached`] passes it (at once if it
    /// has). Fences of one point share one eventfd.
    ///
    /// # Errors
    /// As [`Fence::new`].
    pub fn fence(&mut self, point: u64) -> Result<Fence, Error> {
        if self.reached.is_some_and(|reached| point <= reached) {
            let fence = Fence::new()?;
            fence.signal()?;
            return Ok(fence);
        }
        let at = self.waiting.partition_point(|(p, _)| *p < point);
        if let Some((p, fence)) = self.waiting.get(at) {
            if *p == point {
                return fence.try_clone();
            }
        }
        let fence = Fence::new()?;
        let handed = fence.try_clone()?;
        self.waiting.insert(at, (point, fence));
        Ok(handed)
    }

    /// Every point up to `point` is done: signals their fences. A point lower than one reached
    /// before changes nothing.
    ///
    /// # Errors
    /// As [`Fence::signal`]; the fences before the failing one are signalled and released.
    pub fn reached(&mut self, point: u64) -> Result<(), Error> {
        if self.reached.is_some_and(|reached| point <= reached) {
            return Ok(());
        }
        self.reached = Some(point);
        while self.waiting.front().is_some_and(|(p, _)| *p <= point) {
            if let Some((_, fence)) = self.waiting.pop_front() {
                fence.signal()?;
            }
        }
        Ok(())
    }

    /// The highest point reached.
    pub fn last_reached(&self) -> Option<u64> {
        self.reached
    }

    /// Fences handed out and not signalled yet.
    pub fn pending(&self) -> usize {
        self.waiting.len()
    }
}

/// What went wrong with a fence.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No eventfd could be made, or no descriptor duplicated.
    #[error("cannot make a fence (an eventfd)")]
    Create {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// Writing the eventfd failed.
    #[error("cannot signal the fence")]
    Signal {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// `poll` failed, or the descriptor is not pollable.
    #[error("cannot wait for the fence (poll of its descriptor failed)")]
    Wait {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// The wait's time passed.
    #[error("the fence was not signalled within {waited:?}")]
    Timeout {
        /// How long was waited.
        waited: Duration,
    },
    /// Another driver's fence cannot be signalled from here.
    #[error("this fence is another driver's (a sync_file or an fd that is not an eventfd): it signals itself; wait for it instead")]
    NotSignalable,
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code). Exhaustive.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::Create { .. } | Error::Signal { .. } | Error::Wait { .. } => Code::System,
            Error::Timeout { .. } => Code::Timeout,
            Error::NotSignalable => Code::InvalidArgument,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: waits on an eventfd with poll(2), which Miri does not emulate"
    )]
    fn a_fence_signals_once_and_stays_signalled() {
        let fence = Fence::new().unwrap();
        assert!(!fence.is_signalled().unwrap());
        let err = fence.wait(Some(Duration::from_millis(20))).unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        fence.signal().unwrap();
        fence.signal().unwrap();
        assert!(fence.is_signalled().unwrap());
        fence.wait(Some(Duration::ZERO)).unwrap();
        // A duplicate (what another process gets) sees the same state.
        assert!(fence.try_clone().unwrap().is_signalled().unwrap());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: tells eventfds apart by /proc/self/fd, which shows the interpreter's own descriptors, not Miri's emulated ones"
    )]
    fn a_blocking_eventfd_at_its_maximum_is_signalled_without_blocking() {
        // Another process's fence, made without EFD_NONBLOCK, its counter at the largest
        // value it holds (2^64 - 2): a write of 1 would block for good.
        let raw = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC).unwrap();
        let fd = OwnedFd::from(raw);
        nix::unistd::write(&fd, &(u64::MAX - 1).to_ne_bytes()).unwrap();
        let fence = Fence::from_fd(fd);
        assert!(fence.is_signalable());
        let (done, took) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = fence.signal().map_err(|e| e.to_string());
            done.send((r, fence.is_signalled().map_err(|e| e.to_string())))
                .unwrap();
        });
        let (signalled, seen) = took
            .recv_timeout(Duration::from_secs(10))
            .expect("signal returned (it blocked before)");
        signalled.unwrap();
        assert!(seen.unwrap());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: tells eventfds apart by /proc/self/fd, which shows the interpreter's own descriptors, not Miri's emulated ones"
    )]
    fn an_eventfd_passed_in_may_be_signalled_and_another_fd_may_not() {
        let fence = Fence::from_fd(Fence::new().unwrap().into_fd());
        assert!(fence.is_signalable());
        fence.signal().unwrap();
        let (read, _write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let other = Fence::from_fd(read);
        assert!(!other.is_signalable());
        assert!(matches!(other.signal(), Err(Error::NotSignalable)));
        assert!(!other.is_signalled().unwrap());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: waits on an eventfd with poll(2), which Miri does not emulate"
    )]
    fn a_fence_signalled_by_another_thread_wakes_the_waiter() {
        let fence = Fence::new().unwrap();
        let other = fence.try_clone().unwrap();
        let signaller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            other.signal().unwrap();
        });
        fence.wait(Some(Duration::from_secs(10))).unwrap();
        signaller.join().unwrap();
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: waits on an eventfd with poll(2), which Miri does not emulate"
    )]
    fn a_timeline_signals_points_in_order_and_late_fences_come_signalled() {
        let mut timeline = Timeline::new();
        let f5 = timeline.fence(5).unwrap();
        let f2 = timeline.fence(2).unwrap();
        let f2b = timeline.fence(2).unwrap();
        let f9 = timeline.fence(9).unwrap();
        assert_eq!(timeline.pending(), 3);
        timeline.reached(4).unwrap();
        assert!(f2.is_signalled().unwrap() && f2b.is_signalled().unwrap());
        assert!(!f5.is_signalled().unwrap() && !f9.is_signalled().unwrap());
        timeline.reached(3).unwrap();
        assert_eq!(timeline.last_reached(), Some(4));
        timeline.reached(5).unwrap();
        assert!(f5.is_signalled().unwrap() && !f9.is_signalled().unwrap());
        assert!(timeline.fence(1).unwrap().is_signalled().unwrap());
        assert_eq!(timeline.pending(), 1);
        timeline.reached(100).unwrap();
        assert!(f9.is_signalled().unwrap());
        assert_eq!(timeline.pending(), 0);
    }
}
