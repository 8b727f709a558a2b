//! The system calls the loopback device makes: futex wait/wake on its shared register
//! memory, eventfd signalling, the monotonic clock, and a `SOCK_SEQPACKET` socket pair that carries file descriptors
//! (`SCM_RIGHTS`) to the device process. One small function per call, through `nix` where it
//! has the call (the futex is a raw `libc::syscall`: `nix` has no futex); errno becomes
//! `io::Error` here.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sched::{sched_setaffinity, CpuSet};
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, socketpair, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use nix::sys::stat::{fstat, SFlag};
use nix::sys::time::TimeVal;
use nix::unistd::Pid;

use crate::sync::AtomicU32;

/// The most descriptors one message carries.
pub(super) const MAX_FDS: usize = 64;

/// The set of `cpu` alone. A CPU past the set's size is EINVAL, as the kernel says of a CPU it
/// does not have.
fn only(cpu: u32) -> io::Result<CpuSet> {
    let cpu = usize::try_from(cpu).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut set = CpuSet::new();
    set.set(cpu)?;
    Ok(set)
}

/// Restricts the calling thread to `cpu` (`sched_setaffinity`).
pub(super) fn pin_to_cpu(cpu: u32) -> io::Result<()> {
    Ok(sched_setaffinity(Pid::from_raw(0), &only(cpu)?)?)
}

/// Pins every thread of this process to `cpu`: the calling thread (its error returned), then
/// every other one `/proc/self/task` lists (a harness's or a sanitizer runtime's threads, started
/// before the device process knew its CPU; one that exits meanwhile is skipped).
pub(super) fn pin_process_to_cpu(cpu: u32) -> io::Result<()> {
    let set = only(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &set)?;
    let me = nix::unistd::gettid();
    for entry in std::fs::read_dir("/proc/self/task")?.flatten() {
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
            .map(Pid::from_raw)
            .filter(|&tid| tid != me)
        else {
            continue;
        };
        match sched_setaffinity(tid, &set) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

/// `clock_gettime(CLOCK_MONOTONIC)` in nanoseconds (the clock every process of the machine
/// shares, which the activity records are stamped in).
pub(super) fn monotonic_ns() -> io::Result<u64> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)?;
    // CLOCK_MONOTONIC is never negative; a value that were would read as 0.
    let secs = u64::try_from(now.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec()).unwrap_or(0);
    Ok(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
}

/// Sets the calling thread's timer slack (`prctl(PR_SET_TIMERSLACK)`): how late the kernel may
/// end its sleeps to batch wake-ups (50 µs by default), here made small so a modelled wait
/// ends when it should.
pub(super) fn set_timer_slack(ns: u64) -> io::Result<()> {
    let ns = libc::c_ulong::try_from(ns.max(1)).unwrap_or(libc::c_ulong::MAX);
    Ok(nix::sys::prctl::set_timerslack(ns)?)
}

/// `FUTEX_WAIT` (shared, not `_PRIVATE`: the word may be in memory another process maps): sleeps
/// while `*word == expected`, up to `timeout`. Returns normally on a wake-up, a changed value
/// (`EAGAIN`), a signal (`EINTR`) or the timeout; callers re-check their condition.
pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let spec = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        // Below 10^9: fits every c_long.
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let spec_ptr = spec
        .as_ref()
        .map_or(ptr::null(), |s| s as *const libc::timespec);
    // SAFETY: `word` is a live, aligned 32-bit atomic for the call; the kernel only reads it
    // (and compares it with `expected`); `spec_ptr` is null or points at a timespec that lives
    // until the call returns.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            spec_ptr,
            ptr::null::<u32>(),
            0u32,
        )
    };
    // EAGAIN (value changed), EINTR and ETIMEDOUT all mean "look again"; the only other errors
    // (EFAULT, EINVAL) would be bugs in the arguments above, and a spurious return is harmless.
}

/// `FUTEX_WAKE` of every waiter on `word`.
pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; FUTEX_WAKE does not touch the word's value.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            ptr::null::<libc::timespec>(),
            ptr::null::<u32>(),
            0u32,
        )
    };
    // FUTEX_WAKE fails only on a bad address, which a live reference is not.
}

/// Adds 1 to an eventfd's counter (raises the interrupt). A full counter (`EAGAIN`) is already
/// nonzero: the reader wakes anyway.
pub(super) fn eventfd_signal(fd: BorrowedFd<'_>) -> io::Result<()> {
    match nix::unistd::write(fd, &1u64.to_ne_bytes()) {
        Ok(_) | Err(Errno::EAGAIN) => Ok(()),
        Err(errno) => Err(errno.into()),
    }
}

/// A connected `AF_UNIX` / `SOCK_SEQPACKET` pair, both ends close-on-exec.
pub(super) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?)
}

/// Room for the control message of `MAX_FDS` descriptors, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct ControlBuffer([u8; 512]);

// SAFETY: CMSG_SPACE is a pure size computation.
const _: () = assert!(unsafe { libc::CMSG_SPACE((MAX_FDS * size_of::<RawFd>()) as u32) } <= 512);

/// Sends one message of `bytes` with `fds` attached (`SCM_RIGHTS`).
pub(super) fn send(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::from_raw_os_error(libc::E2BIG));
    }
    let mut raw = [0 as RawFd; MAX_FDS];
    for (slot, fd) in raw.iter_mut().zip(fds) {
        *slot = fd.as_raw_fd();
    }
    let rights = [ControlMessage::ScmRights(&raw[..fds.len()])];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
    let iov = [IoSlice::new(bytes)];
    loop {
        match sendmsg::<UnixAddr>(
            socket.as_raw_fd(),
            &iov,
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(_) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Err(Errno::EINTR) => continue,
            Err(errno) => return Err(errno.into()),
        }
    }
}

/// Receives one message into `buf`, with the descriptors attached to it (close-on-exec).
/// Returns the message length (0: the peer closed the socket).
pub(super) fn recv(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut control = ControlBuffer([0; 512]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = loop {
        match recvmsg::<UnixAddr>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut control.0),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => break msg,
            Err(Errno::EINTR) => continue,
            Err(errno) => return Err(errno.into()),
        }
    };
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            for fd in received {
                // SAFETY: the kernel installed this descriptor in our table for this message
                // (SCM_RIGHTS); nothing else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    // Descriptors of a truncated message are closed (dropped with `fds`), never leaked.
    if msg
        .flags
        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC)
    {
        return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
    }
    Ok((msg.bytes, fds))
}

/// Clears `FD_CLOEXEC` on `fd` so an `exec` keeps it open. Async-signal-safe (one `fcntl`): for
/// use between `fork` and `exec`.
pub(super) fn clear_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: `fd` is the number of a descriptor the parent keeps open across the fork (its
    // socket end); it is borrowed for this one call only.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))?;
    Ok(())
}

/// Checks that `fd` is an open socket (the descriptor number a parent passed in the
/// environment).
pub(super) fn check_socket(fd: RawFd) -> io::Result<()> {
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: borrowed for one `fstat`, which fails with EBADF if the number is not open;
    // nothing is closed or kept.
    let stat = fstat(unsafe { BorrowedFd::borrow_raw(fd) })?;
    if SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFSOCK {
        return Err(io::Error::from_raw_os_error(libc::ENOTSOCK));
    }
    Ok(())
}

/// `SO_RCVTIMEO`: a receive on `socket` fails with `EAGAIN` after `timeout`.
pub(super) fn set_recv_timeout(socket: BorrowedFd<'_>, timeout: Duration) -> io::Result<()> {
    let tv = TimeVal::new(
        libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        // Below 10^6: fits every suseconds_t.
        timeout.subsec_micros() as libc::suseconds_t,
    );
    Ok(setsockopt(&socket, sockopt::ReceiveTimeout, &tv)?)
}
