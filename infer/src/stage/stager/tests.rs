use std::io::Write;
use std::os::unix::net::UnixStream;

use super::*;
use crate::stage::Direct;
use userdma::memory::PageSize;
use userdma::Runtime;
use userdma_loopback::{self as loopback, LoopbackRuntime};

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: reads through io_uring, which Miri does not emulate"
)]
fn a_lent_read_completes_while_owned_requests_stay_in_flight() {
    let rt = Runtime::loopback(loopback::Config::default()).expect("loopback runtime");
    let pool = rt.pool(8 << 20, PageSize::Base).expect("pool");
    let mut stager = Stager::new(pool.clone(), Config::default().depth(4)).expect("stager");
    // An owned receive that stays in flight until the peer writes.
    let (ours, mut peer) = UnixStream::pair().expect("socketpair");
    let socket = File::from_stream(ours, "socketpair");
    let pending = stager
        .recv(&socket, pool.alloc_owned(64).expect("b"))
        .expect("queued");
    stager.submit().expect("submit");
    // A lent read of a file meanwhile: it returns with its own result only.
    let dir = std::path::PathBuf::from("/dev/shm/userdma-stager-unit");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(format!("lent-{}", std::process::id()));
    std::fs::write(&path, b"lent bytes here").expect("write");
    let file = File::open(&path, Direct::Off).expect("open");
    let lent = pool.alloc_owned(10).expect("b");
    let transfer = stager.read_lent(&file, 5, &lent, 10).expect("lent read");
    assert_eq!(transfer.bytes, 10);
    let mut got = [0u8; 10];
    lent.read(0, &mut got).expect("read back");
    assert_eq!(&got, b"bytes here");
    assert_eq!(stager.in_flight(), 1, "the receive is still in flight");
    assert!(stager.try_wait().expect("poll").is_none());
    // Too long for its buffer: refused before the kernel sees it.
    assert!(matches!(
        stager.read_lent(&file, 0, &lent, 11),
        Err(Error::Length {
            len: 11,
            buffer: 10
        })
    ));
    // The owned receive then completes through wait(), as always.
    peer.write_all(b"late").expect("write");
    let done = stager.wait().expect("completion");
    assert_eq!(done.ticket, pending);
    assert_eq!(done.result.expect("ok").bytes, 4);
    assert!(stager.lent.is_empty());
    std::fs::remove_file(path).ok();
}
