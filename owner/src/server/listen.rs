//! The owner's listening socket.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};

use super::Error;

/// Makes the listening socket at `path`: a stale socket left by an owner that died is
/// replaced; one a running owner answers on is not.
pub(super) fn listen(path: &Path, mode: u32) -> Result<OwnedFd, Error> {
    let err = |source: std::io::Error, hint| Error::Listen {
        path: path.to_owned(),
        source,
        hint,
    };
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).map_err(|e| err(e, "make its directory"))?;
        }
    }
    let addr = UnixAddr::new(path).map_err(|e| err(e.into(), "a path of at most 107 bytes"))?;
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| err(e.into(), "sockets"))?;
    if path.exists() {
        let probe = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| err(e.into(), "sockets"))?;
        match socket::connect(probe.as_raw_fd(), &addr) {
            Ok(()) => {
                return Err(err(
                    std::io::Error::from_raw_os_error(libc::EADDRINUSE),
                    "another owner listens there: stop it, or give this one another --socket",
                ))
            }
            Err(_) => std::fs::remove_file(path).map_err(|e| err(e, "remove the stale socket"))?,
        }
    }
    socket::bind(fd.as_raw_fd(), &addr).map_err(|e| err(e.into(), "bind"))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| err(e, "set the socket's mode"))?;
    }
    socket::listen(
        &fd,
        socket::Backlog::new(64).expect("64 is a valid backlog"),
    )
    .map_err(|e| err(e.into(), "listen"))?;
    Ok(fd)
}
