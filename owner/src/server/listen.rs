//! The owner's listening socket.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};

use super::Error;

/// Makes the listening socket at `path`: a stale socket left by an owner that died (a
/// sequenced-packet socket nobody listens on) is replaced; one a running owner answers on is
/// not, nor is anything else at the path (a file, a directory, another program's socket).
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
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        // Only a socket is replaced: anything else at the path is someone's file.
        if !meta.file_type().is_socket() {
            return Err(err(
                std::io::Error::from_raw_os_error(libc::EEXIST),
                "it is not a socket (left as it is): give another --socket, or remove it",
            ));
        }
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
            // Nobody listens: an owner that died left it.
            Err(nix::errno::Errno::ECONNREFUSED) => {
                std::fs::remove_file(path).map_err(|e| err(e, "remove the stale socket"))?
            }
            // A socket of another kind (a stream or datagram socket: EPROTOTYPE), or one this
            // process may not reach: another program's, left as it is.
            Err(errno) => {
                return Err(err(
                    errno.into(),
                    "a socket that is not a stale owner's is there (left as it is): give \
                     another --socket, or remove it if it is no longer used",
                ))
            }
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

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    fn refused(path: &Path) -> String {
        match listen(path, 0o600) {
            Ok(_) => panic!("listened at {}", path.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_stale_owner_socket_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner.sock");
        // An owner that died: its socket file stays, nobody listens on it.
        drop(listen(&path, 0o600).unwrap());
        assert!(path.exists());
        let fd = listen(&path, 0o600).expect("the stale socket is replaced");
        drop(fd);
    }

    #[test]
    fn a_running_owner_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner.sock");
        let _running = listen(&path, 0o600).unwrap();
        let message = refused(&path);
        assert!(message.contains("another owner listens there"), "{message}");
    }

    #[test]
    fn a_file_at_the_path_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notes.txt");
        std::fs::write(&path, b"someone's data").unwrap();
        let message = refused(&path);
        assert!(message.contains("not a socket"), "{message}");
        assert_eq!(std::fs::read(&path).unwrap(), b"someone's data");

        let sub = dir.path().join("a-directory");
        std::fs::create_dir(&sub).unwrap();
        let message = refused(&sub);
        assert!(message.contains("not a socket"), "{message}");
        assert!(sub.is_dir());
    }

    #[test]
    fn another_programs_live_socket_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stream.sock");
        // A stream socket someone listens on: a sequenced-packet connect fails (EPROTOTYPE),
        // and that is not a stale owner's socket.
        let other = UnixListener::bind(&path).unwrap();
        let message = refused(&path);
        assert!(message.contains("not a stale owner's"), "{message}");
        assert!(path.exists());
        drop(other);
    }
}
