//! [`EventFd`]: one interrupt vector as an eventfd. VFIO signals a device's MSI/MSI-X vector by
//! writing the eventfd given to `VFIO_DEVICE_SET_IRQS`; the loopback device writes it from its
//! engine thread. The host reads it to learn that the device raised the interrupt.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use super::{shim, Error};

/// An owned, nonblocking, close-on-exec eventfd. Its counter is the number of interrupts raised
/// since it was last read; reading returns the count and resets it to zero.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new eventfd with its counter at zero.
    pub fn new() -> Result<EventFd, Error> {
        let fd = shim::eventfd().map_err(|source| Error::Create { source })?;
        Ok(EventFd { fd })
    }

    /// A second handle to the same eventfd (`dup`): one for the device side to signal, one for
    /// the host to wait on.
    pub fn try_clone(&self) -> Result<EventFd, Error> {
        let fd = shim::dup(self.fd.as_fd()).map_err(|source| Error::Duplicate {
            fd: self.fd.as_raw_fd(),
            source,
        })?;
        Ok(EventFd { fd })
    }

    /// Adds `count` to the counter (raises the interrupt `count` times). Never blocks: if the
    /// counter is at its maximum, it is nonzero already and readers wake anyway.
    pub fn write(&self, count: u64) -> Result<(), Error> {
        shim::write_u64(self.fd.as_fd(), count)
            .map(|_| ())
            .map_err(|source| Error::Signal {
                fd: self.fd.as_raw_fd(),
                source,
            })
    }

    /// Raises the interrupt once.
    pub fn signal(&self) -> Result<(), Error> {
        self.write(1)
    }

    /// The counter, reset to zero; `None` if it was zero. Never blocks.
    pub fn try_read(&self) -> Result<Option<u64>, Error> {
        shim::read_u64(self.fd.as_fd()).map_err(|source| Error::Read {
            fd: self.fd.as_raw_fd(),
            source,
        })
    }

    /// Waits until the counter is nonzero, then reads and resets it.
    pub fn read(&self) -> Result<u64, Error> {
        loop {
            if let Some(count) = self.wait(None)? {
                return Ok(count);
            }
        }
    }

    /// Waits up to `timeout` (`None`: forever) for the counter to become nonzero, then reads and
    /// resets it; `Ok(None)` on timeout.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<Option<u64>, Error> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if let Some(count) = self.try_read()? {
                return Ok(Some(count));
            }
            let left = remaining(timeout, deadline);
            if left == Some(Duration::ZERO) {
                return Ok(None);
            }
            // Readable now, or woken and another reader took the count first: loop and see.
            self.wait_readable(left)?;
        }
    }

    /// Waits up to `timeout` (`None`: forever) for the counter to be nonzero, without reading
    /// it; `Ok(false)` on timeout.
    pub fn wait_readable(&self, timeout: Option<Duration>) -> Result<bool, Error> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            let left = remaining(timeout, deadline);
            match shim::poll_in(self.fd.as_fd(), shim::timeout_ms(left)) {
                Ok(ready) => return Ok(ready),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {
                    if left == Some(Duration::ZERO) {
                        return Ok(false);
                    }
                }
                Err(source) => {
                    return Err(Error::Poll {
                        fd: self.fd.as_raw_fd(),
                        source,
                    })
                }
            }
        }
    }
}

/// The time left until `deadline`: `None` for no timeout, zero once passed. A timeout too long
/// to add to now (no deadline) counts as no timeout.
pub(super) fn remaining(timeout: Option<Duration>, deadline: Option<Instant>) -> Option<Duration> {
    timeout?;
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// What `/proc/self/fd/<fd>` names for an eventfd.
const EVENTFD_TARGET: &str = "anon_inode:[eventfd]";

/// Adopts an eventfd made elsewhere (by a C SDK, received over a socket, a VFIO interrupt's fd
/// kept by another library). Checked: the fd must be an eventfd, as `/proc/self/fd` names it
/// (`anon_inode:[eventfd]`), otherwise [`Error::NotEventFd`]; it is then made nonblocking (on
/// its open file, so every duplicate of it too) and close-on-exec, as [`EventFd::new`] makes
/// them. On an error the fd is closed: duplicate it first to keep it.
impl TryFrom<OwnedFd> for EventFd {
    type Error = Error;

    fn try_from(fd: OwnedFd) -> Result<EventFd, Error> {
        let raw = fd.as_raw_fd();
        let adopt = |source| Error::Adopt { fd: raw, source };
        let found = shim::fd_target(fd.as_fd()).map_err(adopt)?;
        if found.as_os_str() != EVENTFD_TARGET {
            return Err(Error::NotEventFd { fd: raw, found });
        }
        shim::set_nonblocking_cloexec(fd.as_fd()).map_err(adopt)?;
        Ok(EventFd { fd })
    }
}

impl From<EventFd> for OwnedFd {
    fn from(event: EventFd) -> OwnedFd {
        event.fd
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::os::fd::FromRawFd;

    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: tells eventfds apart by /proc/self/fd, which shows the interpreter's own descriptors, not Miri's emulated ones"
    )]
    fn an_eventfd_from_elsewhere_is_adopted_nonblocking() {
        // A blocking eventfd, as a C library might make it.
        // SAFETY: eventfd takes no pointers; a non-negative result is a new fd we own.
        let raw = unsafe { libc::eventfd(0, 0) };
        assert!(raw >= 0, "eventfd: {}", io::Error::last_os_error());
        // SAFETY: just created, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let irq = EventFd::try_from(fd).unwrap();
        // Nonblocking now: an empty counter reads as None instead of blocking the test.
        assert_eq!(irq.try_read().unwrap(), None);
        irq.write(3).unwrap();
        assert_eq!(irq.try_read().unwrap(), Some(3));
        // SAFETY: F_GETFD on an open fd.
        let flags = unsafe { libc::fcntl(irq.as_raw_fd(), libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        // A round trip through OwnedFd keeps it an eventfd.
        let again = EventFd::try_from(OwnedFd::from(irq.try_clone().unwrap())).unwrap();
        again.signal().unwrap();
        assert_eq!(irq.try_read().unwrap(), Some(1));
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: tells eventfds apart by /proc/self/fd, which shows the interpreter's own descriptors, not Miri's emulated ones"
    )]
    fn other_fds_are_refused() {
        let file = std::fs::File::open("/proc/self/status").unwrap();
        let raw = file.as_raw_fd();
        let err = EventFd::try_from(OwnedFd::from(file)).unwrap_err();
        match err {
            Error::NotEventFd { fd, found } => {
                assert_eq!(fd, raw);
                assert!(found.ends_with("status"), "{found:?}");
            }
            other => panic!("not NotEventFd: {other}"),
        }
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(matches!(
            EventFd::try_from(OwnedFd::from(a)),
            Err(Error::NotEventFd { .. })
        ));
    }
}
