//! The system calls of this module, through `nix`, one function each, its `Errno` turned
//! into `io::Error` here. Each takes and returns owned or borrowed fds, so everything above
//! is safe code, and this module has no `unsafe` of its own.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

/// `eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)`.
pub(super) fn eventfd() -> io::Result<OwnedFd> {
    let fd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
    Ok(OwnedFd::from(fd))
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, 0)`: a second fd for the same open file.
pub(super) fn dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

/// `read(fd, &mut u64, 8)` on a nonblocking eventfd: `Ok(None)` when the counter is zero.
pub(super) fn read_u64(fd: BorrowedFd<'_>) -> io::Result<Option<u64>> {
    let mut value = [0u8; 8];
    loop {
        match nix::unistd::read(fd, &mut value) {
            Ok(8) => return Ok(Some(u64::from_ne_bytes(value))),
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "eventfd read returned other than 8 bytes",
                ))
            }
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return Ok(None),
            Err(errno) => return Err(errno.into()),
        }
    }
}

/// `write(fd, &u64, 8)` on a nonblocking eventfd. `Ok(false)` when the counter is so close to
/// its maximum that the kernel refused (`EAGAIN`): it is then nonzero, so readers wake anyway.
pub(super) fn write_u64(fd: BorrowedFd<'_>, value: u64) -> io::Result<bool> {
    loop {
        match nix::unistd::write(fd, &value.to_ne_bytes()) {
            Ok(8) => return Ok(true),
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "eventfd write took other than 8 bytes",
                ))
            }
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN) => return Ok(false),
            Err(errno) => return Err(errno.into()),
        }
    }
}

/// What `/proc/self/fd/<fd>` links to (`anon_inode:[eventfd]` for an eventfd).
pub(super) fn fd_target(fd: BorrowedFd<'_>) -> io::Result<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Sets `O_NONBLOCK` on the open file and `FD_CLOEXEC` on the descriptor.
pub(super) fn set_nonblocking_cloexec(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    Ok(())
}

/// `poll` for `POLLIN` on one fd, up to `timeout_ms` (-1: forever). `Ok(true)` if readable
/// (or in an error state a read will report). `EINTR` comes back as an error of kind
/// `Interrupted` for the caller to retry with the time left.
pub(super) fn poll_in(fd: BorrowedFd<'_>, timeout_ms: i32) -> io::Result<bool> {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let n = nix::poll::poll(&mut fds, poll_timeout(timeout_ms))?;
    Ok(n > 0 && fds[0].revents().is_some_and(|r| !r.is_empty()))
}

/// `epoll_create1(EPOLL_CLOEXEC)`.
pub(super) fn epoll_create() -> io::Result<Epoll> {
    Ok(Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?)
}

/// `epoll_ctl(EPOLL_CTL_ADD)` for `EPOLLIN` (level-triggered) with `data`.
pub(super) fn epoll_add(epoll: &Epoll, fd: BorrowedFd<'_>, data: u64) -> io::Result<()> {
    Ok(epoll.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, data))?)
}

/// `epoll_ctl(EPOLL_CTL_DEL)`.
pub(super) fn epoll_delete(epoll: &Epoll, fd: BorrowedFd<'_>) -> io::Result<()> {
    Ok(epoll.delete(fd)?)
}

/// `epoll_wait` into `events`, up to `timeout_ms` (-1: forever); returns how many were filled.
/// `EINTR` is an error of kind `Interrupted`.
pub(super) fn epoll_wait(
    epoll: &Epoll,
    events: &mut [EpollEvent],
    timeout_ms: i32,
) -> io::Result<usize> {
    // The kernel takes at most INT_MAX events; more slots than that are never filled.
    let max = events.len().min(i32::MAX as usize);
    let timeout = EpollTimeout::try_from(timeout_ms).unwrap_or(EpollTimeout::NONE);
    Ok(epoll.wait(&mut events[..max], timeout)?)
}

/// `timeout_ms` as nix's poll timeout: negative is forever (nix has no other negative).
fn poll_timeout(timeout_ms: i32) -> PollTimeout {
    PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::NONE)
}

/// A timeout as `poll`/`epoll_wait` milliseconds, rounded up so a short timeout never becomes a
/// non-blocking check; `None` (forever) is -1, and very long ones are capped.
pub(super) fn timeout_ms(timeout: Option<std::time::Duration>) -> i32 {
    match timeout {
        None => -1,
        Some(t) => {
            let ms = t.as_nanos().div_ceil(1_000_000);
            i32::try_from(ms).unwrap_or(i32::MAX)
        }
    }
}
