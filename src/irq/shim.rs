//! The raw system calls of this module, one function each, errno turned into `io::Error` here.
//! Each takes and returns owned or borrowed fds, so everything above is safe code.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)`.
pub(super) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new fd we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, 0)`: a second fd for the same open file.
pub(super) fn dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

/// `read(fd, &mut u64, 8)` on a nonblocking eventfd: `Ok(None)` when the counter is zero.
pub(super) fn read_u64(fd: BorrowedFd<'_>) -> io::Result<Option<u64>> {
    let mut value = 0u64;
    loop {
        // SAFETY: `value` is a writable 8-byte buffer; the fd is open (borrowed).
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                (&raw mut value).cast::<libc::c_void>(),
                std::mem::size_of::<u64>(),
            )
        };
        if n == 8 {
            return Ok(Some(value));
        }
        if n >= 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "eventfd read returned other than 8 bytes",
            ));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(None),
            _ => return Err(err),
        }
    }
}

/// `write(fd, &u64, 8)` on a nonblocking eventfd. `Ok(false)` when the counter is so close to
/// its maximum that the kernel refused (`EAGAIN`): it is then nonzero, so readers wake anyway.
pub(super) fn write_u64(fd: BorrowedFd<'_>, value: u64) -> io::Result<bool> {
    loop {
        // SAFETY: `value` is a readable 8-byte buffer; the fd is open (borrowed).
        let n = unsafe {
            libc::write(
                fd.as_raw_fd(),
                (&raw const value).cast::<libc::c_void>(),
                std::mem::size_of::<u64>(),
            )
        };
        if n == 8 {
            return Ok(true);
        }
        if n >= 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "eventfd write took other than 8 bytes",
            ));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// What `/proc/self/fd/<fd>` links to (`anon_inode:[eventfd]` for an eventfd).
pub(super) fn fd_target(fd: BorrowedFd<'_>) -> io::Result<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Sets `O_NONBLOCK` on the open file and `FD_CLOEXEC` on the descriptor.
pub(super) fn set_nonblocking_cloexec(fd: BorrowedFd<'_>) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl with F_GETFL / F_SETFL / F_SETFD takes and returns integers only; the fd
    // is open (borrowed).
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(raw, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `poll` for `POLLIN` on one fd, up to `timeout_ms` (-1: forever). `Ok(true)` if readable
/// (or in an error state a read will report). `EINTR` comes back as an error of kind
/// `Interrupted` for the caller to retry with the time left.
pub(super) fn poll_in(fd: BorrowedFd<'_>, timeout_ms: libc::c_int) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid pollfd; the fd is open (borrowed).
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n > 0 && pfd.revents != 0)
}

/// `epoll_create1(EPOLL_CLOEXEC)`.
pub(super) fn epoll_create() -> io::Result<OwnedFd> {
    // SAFETY: no pointers; a non-negative result is a new fd we own.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `epoll_ctl(epfd, op, fd, {events, data})`.
pub(super) fn epoll_ctl(
    epoll: BorrowedFd<'_>,
    op: libc::c_int,
    fd: BorrowedFd<'_>,
    events: u32,
    data: u64,
) -> io::Result<()> {
    let mut event = libc::epoll_event { events, u64: data };
    // SAFETY: `event` is a valid epoll_event (ignored for EPOLL_CTL_DEL); both fds are open.
    let rc = unsafe { libc::epoll_ctl(epoll.as_raw_fd(), op, fd.as_raw_fd(), &mut event) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `epoll_wait` into `events`, up to `timeout_ms` (-1: forever); returns how many were filled.
/// `EINTR` is an error of kind `Interrupted`.
pub(super) fn epoll_wait(
    epoll: BorrowedFd<'_>,
    events: &mut [libc::epoll_event],
    timeout_ms: libc::c_int,
) -> io::Result<usize> {
    let max = libc::c_int::try_from(events.len()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `events` is a writable array of at least `max` epoll_events; the fd is open.
    let n = unsafe { libc::epoll_wait(epoll.as_raw_fd(), events.as_mut_ptr(), max, timeout_ms) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// A timeout as `poll`/`epoll_wait` milliseconds, rounded up so a short timeout never becomes a
/// non-blocking check; `None` (forever) is -1, and very long ones are capped.
pub(super) fn timeout_ms(timeout: Option<std::time::Duration>) -> libc::c_int {
    match timeout {
        None => -1,
        Some(t) => {
            let ms = t.as_nanos().div_ceil(1_000_000);
            libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
        }
    }
}
