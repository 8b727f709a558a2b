//! The cross-process message of `userdma::share` from a hostile peer: any bytes with any number
//! of descriptors (pipes, eventfds, memfds of any length) must decode to items or to an error,
//! never panic; on error every descriptor is closed; what decodes matches the records, each
//! item owning one descriptor; and every message `encode` makes decodes back to what was sent.

#![no_main]

use std::os::fd::OwnedFd;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::share::{decode, decode_records, Received, MAX_ITEMS};

#[derive(Debug, Arbitrary)]
enum Fd {
    Pipe,
    Event,
    Memfd(u16),
}

#[derive(Debug, Arbitrary)]
struct Input {
    bytes: Vec<u8>,
    fds: Vec<Fd>,
    /// Build the header from these instead of taking `bytes` as they are.
    wellformed: Option<(u16, Vec<(u8, u8, u64)>)>,
}

fn make(fd: &Fd) -> (OwnedFd, Option<OwnedFd>) {
    match fd {
        // Close-on-exec, every one: libFuzzer forks a symbolizer when it reports new coverage,
        // and a read end that child inherited would stay open whatever the decoder did.
        Fd::Pipe => {
            let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
            (r, Some(w))
        }
        Fd::Event => (
            nix::sys::eventfd::EventFd::from_flags(nix::sys::eventfd::EfdFlags::EFD_CLOEXEC)
                .unwrap()
                .into(),
            None,
        ),
        Fd::Memfd(pages) => {
            let fd = nix::sys::memfd::memfd_create(c"fuzz", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .unwrap();
            nix::unistd::ftruncate(&fd, i64::from(*pages) * 4096).unwrap();
            (fd, None)
        }
    }
}

fuzz_target!(|input: Input| {
    // libFuzzer's main is not Rust's, which would have ignored SIGPIPE: the EPIPE check below
    // must not kill the process.
    // SAFETY: setting a signal's disposition to ignore; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let bytes = match &input.wellformed {
        None => input.bytes.clone(),
        Some((version, items)) => {
            let mut b = b"UDMS".to_vec();
            b.extend_from_slice(&version.to_le_bytes());
            b.extend_from_slice(&(items.len() as u16).to_le_bytes());
            for (kind, log2, len) in items {
                b.extend_from_slice(&[*kind, *log2, 0, 0, 0, 0, 0, 0]);
                b.extend_from_slice(&len.to_le_bytes());
            }
            b
        }
    };
    let made: Vec<(OwnedFd, Option<OwnedFd>)> =
        input.fds.iter().take(MAX_ITEMS + 4).map(make).collect();
    let count = made.len();
    let (fds, writers): (Vec<OwnedFd>, Vec<Option<OwnedFd>>) = made.into_iter().unzip();
    let records = decode_records(&bytes, count);
    match decode(&bytes, fds) {
        Ok(items) => {
            let records = records.expect("decode accepted what decode_records refused");
            assert_eq!(items.len(), records.len());
            assert_eq!(items.len(), count);
            for (item, record) in items.iter().zip(&records) {
                match item {
                    Received::Region { len, page_size, .. } => {
                        assert_eq!(record.kind, 1);
                        assert_eq!(*len as u64, record.len);
                        assert_eq!(Some(*page_size), record.page_size);
                    }
                    Received::DmaBuf(buf) => {
                        assert_eq!(record.kind, 2);
                        assert_eq!(buf.len() as u64, record.len);
                    }
                    Received::Fence(_) => assert_eq!(record.kind, 3),
                }
            }
        }
        Err(_) => {
            // Every descriptor given was closed: a pipe's write end now fails with EPIPE.
            for w in writers.iter().flatten() {
                assert_eq!(
                    nix::unistd::write(w, b"x"),
                    Err(nix::errno::Errno::EPIPE),
                    "a refused message left a descriptor open"
                );
            }
        }
    }
});
