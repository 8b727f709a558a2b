//! The raw system calls the loopback device makes: futex wait/wake on its shared register
//! memory, eventfd signalling, and a `SOCK_SEQPACKET` socket pair that carries file descriptors
//! (`SCM_RIGHTS`) to the device process. One small function per call; errno becomes
//! `io::Error` here.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::time::Duration;

use crate::sync::AtomicU32;

/// The most descriptors one message carries.
pub(super) const MAX_FDS: usize = 64;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Restricts the calling thread to `cpu` (`sched_setaffinity`).
pub(super) fn pin_to_cpu(cpu: u32) -> io::Result<()> {
    let cpu = usize::try_from(cpu)
        .ok()
        .filter(|&cpu| cpu < libc::CPU_SETSIZE as usize)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: an all-zero cpu_set_t is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu < CPU_SETSIZE`: CPU_SET writes a bit inside the set.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the kernel reads `size_of::<cpu_set_t>()` bytes of `set`, which lives for the
    // call.
    check(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) }).map(drop)
}

/// Sets the calling thread's timer slack (`prctl(PR_SET_TIMERSLACK)`): how late the kernel may
/// end its sleeps to batch wake-ups (50 µs by default), here made small so a modelled wait
/// ends when it should.
pub(super) fn set_timer_slack(ns: u64) -> io::Result<()> {
    let ns = libc::c_ulong::try_from(ns.max(1)).unwrap_or(libc::c_ulong::MAX);
    // SAFETY: PR_SET_TIMERSLACK takes its value as the second argument and reads no memory.
    check(unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns, 0, 0, 0) }).map(drop)
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
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer to an open descriptor.
    let n = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    if n < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::WouldBlock {
            return Ok(());
        }
        return Err(err);
    }
    Ok(())
}

/// A connected `AF_UNIX` / `SOCK_SEQPACKET` pair, both ends close-on-exec.
pub(super) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors the kernel writes.
    check(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: the kernel just returned these descriptors; nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Room for the control message of `MAX_FDS` descriptors, suitably aligned.
#[repr(C, align(8))]
struct ControlBuffer([u8; 512]);

const _: () = assert!((MAX_FDS * size_of::<RawFd>()) + 64 <= 512);

/// Sends one message of `bytes` with `fds` attached (`SCM_RIGHTS`).
pub(super) fn send(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::from_raw_os_error(libc::E2BIG));
    }
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    let mut control = ControlBuffer([0; 512]);
    // SAFETY: a zeroed msghdr is a valid "no name, no control" header.
    let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let data_len = u32::try_from(fds.len() * size_of::<RawFd>())
            .map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: `msg_control` points at `space <= 512` bytes of the aligned buffer, so the
        // first header and its data (CMSG_DATA, `data_len` bytes) are inside it.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(data_len) as usize;
            let data = libc::CMSG_DATA(header).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                data.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: `msg` points at the live iovec, payload and control buffer set up above.
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return if n as usize == bytes.len() {
                Ok(())
            } else {
                Err(io::Error::from(io::ErrorKind::WriteZero))
            };
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Receives one message into `buf`, with the descriptors attached to it (close-on-exec).
/// Returns the message length (0: the peer closed the socket).
pub(super) fn recv(socket: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = ControlBuffer([0; 512]);
    // SAFETY: a zeroed msghdr is a valid "no name, no control" header.
    let mut msg: libc::msghdr = unsafe { MaybeUninit::zeroed().assume_init() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len();
    let n = loop {
        // SAFETY: `msg` points at the live buffer and control buffer set up above.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_controllen` bytes of the control buffer with well-formed
    // headers; CMSG_FIRSTHDR / CMSG_NXTHDR stay inside them, and each SCM_RIGHTS payload holds
    // `(cmsg_len - CMSG_LEN(0)) / sizeof(int)` descriptors the kernel installed for us.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let data = libc::CMSG_DATA(header).cast::<RawFd>();
                for i in 0..bytes / size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
        return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
    }
    Ok((n, fds))
}

/// Clears `FD_CLOEXEC` on `fd` so an `exec` keeps it open. Async-signal-safe (one `fcntl`): for
/// use between `fork` and `exec`.
pub(super) fn clear_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl(F_SETFD) on a descriptor number touches no memory.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }).map(drop)
}

/// Checks that `fd` is an open socket (the descriptor number a parent passed in the
/// environment).
pub(super) fn check_socket(fd: RawFd) -> io::Result<()> {
    let mut stat = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a `struct stat` into the buffer, which has room for one.
    check(unsafe { libc::fstat(fd, stat.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so it initialised the struct.
    let mode = unsafe { stat.assume_init() }.st_mode;
    if mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::from_raw_os_error(libc::ENOTSOCK));
    }
    Ok(())
}

/// `SO_RCVTIMEO`: a receive on `socket` fails with `EAGAIN` after `timeout`.
pub(super) fn set_recv_timeout(socket: BorrowedFd<'_>, timeout: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        // Below 10^6: fits every suseconds_t.
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: passes a pointer to a live timeval and its exact size.
    check(unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    })
    .map(drop)
}
