//! The message format against malformed input, and whole messages over a socket pair.

use std::os::fd::AsFd;
use std::time::Duration;

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

use super::*;
use crate::memory::Backing;

fn pair() -> (OwnedFd, OwnedFd) {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap()
}

/// `n` pipes: the read ends to hand over, and the write ends, which fail with `EPIPE` once every
/// copy of their read end is closed (Rust ignores SIGPIPE), so a test sees whether descriptors
/// it gave away were closed, whatever other tests open meanwhile. Close-on-exec: a process
/// another thread spawns must not inherit a read end and keep it open.
fn pipes(n: usize) -> (Vec<OwnedFd>, Vec<OwnedFd>) {
    (0..n)
        .map(|_| nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap())
        .unzip()
}

fn all_closed(writers: &[OwnedFd]) -> bool {
    writers
        .iter()
        .all(|w| nix::unistd::write(w, b"x") == Err(nix::errno::Errno::EPIPE))
}

fn memfd_region(len: usize) -> Region {
    Region::builder(len)
        .page_size(PageSize::Base)
        .backing(Backing::Memfd)
        .lock(false)
        .build()
        .unwrap()
}

fn header(count: u16) -> Vec<u8> {
    let mut bytes = b"UDMS".to_vec();
    bytes.extend_from_slice(&1u16.to_le_bytes());
    bytes.extend_from_slice(&count.to_le_bytes());
    bytes
}

fn item(kind: u8, page_log2: u8, len: u64) -> Vec<u8> {
    let mut bytes = vec![kind, page_log2, 0, 0, 0, 0, 0, 0];
    bytes.extend_from_slice(&len.to_le_bytes());
    bytes
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: sends descriptors over a SOCK_SEQPACKET socket pair, which Miri does not emulate"
)]
fn a_region_and_a_fence_cross_to_the_other_end() {
    let (a, b) = pair();
    let region = memfd_region(8192);
    let fence = Fence::new().unwrap();
    send(a.as_fd(), &[Item::Region(&region), Item::Fence(&fence)]).unwrap();
    let mut got = recv(b.as_fd()).unwrap();
    assert_eq!(got.len(), 2);
    let Received::Fence(their_fence) = got.pop().unwrap() else {
        panic!("the second item is the fence")
    };
    let their_region = got.pop().unwrap().into_region().unwrap();
    assert_eq!(their_region.len(), 8192);
    // SAFETY: both are mappings of the same memfd, owned by this test.
    unsafe {
        region.as_ptr().as_ptr().add(4000).write(0x77);
        assert_eq!(
            their_region.as_ptr().as_ptr().add(4000).read_volatile(),
            0x77
        );
    }
    assert!(!their_fence.is_signalled().unwrap());
    fence.signal().unwrap();
    their_fence.wait(Some(Duration::from_secs(5))).unwrap();
}

#[test]
fn memory_without_a_file_cannot_be_sent() {
    let anonymous = Region::builder(4096)
        .page_size(PageSize::Base)
        .lock(false)
        .build()
        .unwrap();
    let err = encode(&[Item::Region(&anonymous)]).unwrap_err();
    assert!(matches!(err, Error::NoFile), "{err}");
    let err = encode(&[]).unwrap_err();
    assert!(matches!(err, Error::Count { count: 0 }), "{err}");
}

#[test]
fn malformed_messages_are_refused_with_what_is_wrong() {
    let good = [header(1), item(1, 12, 8192)].concat();
    assert_eq!(decode_records(&good, 1).unwrap()[0].len, 8192);
    let cases: Vec<(Vec<u8>, usize, &str)> = vec![
        (vec![], 0, "shorter"),
        (b"XXXX\x01\x00\x01\x00".to_vec(), 1, "magic"),
        (
            [b"UDMS\x02\x00\x01\x00".to_vec(), item(1, 12, 4096)].concat(),
            1,
            "version 2",
        ),
        (header(0), 0, "1 to 16"),
        (header(17), 17, "1 to 16"),
        (header(2), 2, "shorter"),
        ([good.clone(), vec![0]].concat(), 1, "bytes follow"),
        (good.clone(), 0, "0 descriptors"),
        (good.clone(), 2, "2 descriptors"),
        ([header(1), item(9, 0, 0)].concat(), 1, "kind"),
        ([header(1), item(1, 13, 8192)].concat(), 1, "page size"),
        ([header(1), item(1, 12, 4097)].concat(), 1, "multiple"),
        ([header(1), item(1, 21, 4096)].concat(), 1, "multiple"),
        ([header(1), item(1, 12, 0)].concat(), 1, "multiple"),
        ([header(1), item(2, 0, 0)].concat(), 1, "zero"),
        ([header(1), item(2, 12, 4096)].concat(), 1, "page size"),
        ([header(1), item(3, 0, 5)].concat(), 1, "fence"),
    ];
    for (bytes, fds, says) in cases {
        let err = decode_records(&bytes, fds).unwrap_err();
        assert!(
            err.to_string().contains(says),
            "{bytes:?}: {err} (expected {says:?})"
        );
        assert_eq!(err.code(), crate::Code::InvalidArgument);
    }
    let mut reserved = [header(1), item(3, 0, 0)].concat();
    reserved[HEADER + 5] = 1;
    let err = decode_records(&reserved, 1).unwrap_err();
    assert!(err.to_string().contains("reserved"), "{err}");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: checks the descriptors it brought with fstatfs(2), which Miri does not emulate"
)]
fn a_refused_message_closes_every_descriptor_it_brought() {
    let (readers, writers) = pipes(3);
    // Three descriptors, two items: refused, all three closed.
    let bytes = [header(2), item(3, 0, 0), item(3, 0, 0)].concat();
    let err = decode(&bytes, readers).unwrap_err();
    assert!(
        matches!(err, Error::Descriptors { items: 2, fds: 3 }),
        "{err}"
    );
    assert!(all_closed(&writers));
    // A dma-buf item whose descriptor is a pipe: refused, both closed.
    let (readers, writers) = pipes(2);
    let bytes = [header(2), item(3, 0, 0), item(2, 0, 4096)].concat();
    let err = decode(&bytes, readers).unwrap_err();
    assert!(matches!(err, Error::DmaBuf { .. }), "{err}");
    assert!(all_closed(&writers));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: sends descriptors over a SOCK_SEQPACKET socket pair, which Miri does not emulate"
)]
fn a_peer_sending_too_many_descriptors_gets_an_error_and_leaks_nothing() {
    let (a, b) = pair();
    let (readers, writers) = pipes(MAX_ITEMS + 4);
    let raw: Vec<RawFd> = readers.iter().map(|r| r.as_raw_fd()).collect();
    let bytes = [header(1), item(3, 0, 0)].concat();
    sendmsg::<()>(
        a.as_raw_fd(),
        &[IoSlice::new(&bytes)],
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::empty(),
        None,
    )
    .unwrap();
    drop(readers);
    let err = recv(b.as_fd()).unwrap_err();
    assert!(
        matches!(err, Error::Descriptors { items: 1, fds: 20 }),
        "{err}"
    );
    assert!(all_closed(&writers));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: uses a SOCK_SEQPACKET socket pair, which Miri does not emulate"
)]
fn a_closed_peer_is_reported() {
    let (a, b) = pair();
    drop(a);
    assert!(matches!(recv(b.as_fd()), Err(Error::Closed)));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: fstatfs on an eventfd and a memfd, which Miri does not emulate"
)]
fn a_dma_buf_record_that_is_not_one_is_refused_before_it_is_sent() {
    let (ours, theirs) = pair();
    let not_a_dmabuf = Fence::new().unwrap().into_fd();
    let record = Record {
        kind: KIND_DMABUF,
        page_size: None,
        len: u64::MAX,
    };
    let err = send_records(ours.as_fd(), &[(record, not_a_dmabuf.as_fd())]).unwrap_err();
    assert!(matches!(err, Error::DmaBuf { .. }), "{err}");
    // Nothing reached the other end.
    let flags = nix::sys::socket::MsgFlags::MSG_DONTWAIT;
    let mut byte = [0u8; 1];
    let got = nix::sys::socket::recv(theirs.as_raw_fd(), &mut byte, flags);
    assert_eq!(got, Err(nix::errno::Errno::EAGAIN));
    // A fence record may carry it (a receiver makes any descriptor a fence).
    let fence = Record {
        kind: KIND_FENCE,
        page_size: None,
        len: 0,
    };
    send_records(ours.as_fd(), &[(fence, not_a_dmabuf.as_fd())]).unwrap();
}
