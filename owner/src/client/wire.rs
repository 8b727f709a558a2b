//! The control socket: one message per packet, sent and received with the errors a client
//! reports; the doorbells' eventfds drained.

#[allow(clippy::wildcard_imports)] // the client's imports
use super::*;

pub(super) fn io_err(what: &'static str, e: impl Into<io::Error>) -> Error {
    Error::Io {
        what,
        source: e.into(),
    }
}

pub(super) fn poll_timeout(left: Option<Duration>) -> PollTimeout {
    match left {
        None => PollTimeout::NONE,
        Some(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
        }
    }
}

/// Reads a doorbell's count back to zero.
pub(crate) fn drain(bell: &Fence) {
    let mut buf = [0u8; 8];
    // A nonblocking eventfd: EAGAIN when already zero, nothing to do.
    let _ = nix::unistd::read(bell.fd(), &mut buf);
}

pub(super) fn wait_readable(socket: &OwnedFd, timeout: Option<Duration>) -> Result<(), Error> {
    let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
    loop {
        match poll(&mut fds, poll_timeout(timeout)) {
            Ok(0) => return Err(Error::Timeout(timeout.unwrap_or_default())),
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io_err("waiting for the owner", e)),
        }
    }
}

/// Sends one message.
pub(crate) fn send(socket: &OwnedFd, msg: &Msg) -> Result<(), Error> {
    let mut buf = [0u8; MAX_MESSAGE];
    let n = proto::encode(msg, &mut buf);
    match socket::send(socket.as_raw_fd(), &buf[..n], MsgFlags::MSG_NOSIGNAL) {
        Ok(_) => Ok(()),
        Err(nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET) => Err(Error::Gone {
            why: "the socket closed",
        }),
        Err(e) => Err(io_err("sending to the owner", e)),
    }
}

/// Receives one message, waiting up to `timeout`.
pub(super) fn recv(socket: &OwnedFd, timeout: Option<Duration>) -> Result<Msg, Error> {
    if timeout != Some(Duration::ZERO) {
        wait_readable(socket, timeout)?;
    }
    let mut buf = [0u8; MAX_MESSAGE + 1];
    let n = match socket::recv(socket.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
        Ok(n) => n,
        Err(nix::errno::Errno::ECONNRESET) => {
            return Err(Error::Gone {
                why: "the socket was reset",
            })
        }
        Err(e) => return Err(io_err("receiving from the owner", e)),
    };
    if n == 0 {
        return Err(Error::Gone {
            why: "end of the connection",
        });
    }
    Ok(proto::decode(&buf[..n])?)
}
