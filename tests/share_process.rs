//! A pool and fences passed to another process over a Unix socket (`userdma::share`): the
//! parent makes a shared pool and a fence and sends both to a child (this test binary, re-run
//! with an environment variable naming the inherited socket). The child opens the pool from
//! the memfd it received, writes a buffer, and sends back a fence of its own; the parent sees
//! the child's bytes, signals its fence, and waits for the child's. Then a hostile message:
//! the child's receiver refuses it, closes what came with it, and goes on.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use userdma::dma::{SoftIommu, Space};
use userdma::fence::Fence;
use userdma::memory::{PageSize, Region};
use userdma::pool::{Config, Exhaustion, Pool};
use userdma::share::{self, Item, Received};

const ROLE: &str = "USERDMA_SHARE_TEST_ROLE";
const FD: &str = "USERDMA_SHARE_TEST_FD";
const LEN: usize = 4 << 20;
const TEST: &str = "a_pool_and_fences_cross_to_another_process";
const WAIT: Option<Duration> = Some(Duration::from_secs(20));

fn child() {
    let raw: i32 = std::env::var(FD).unwrap().parse().unwrap();
    // SAFETY: the parent made this descriptor inheritable for us and named it; nothing else in
    // this process owns it.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    let mut items = share::recv(socket.as_fd()).expect("the parent's message");
    assert_eq!(items.len(), 2);
    let Received::Fence(go) = items.pop().unwrap() else {
        panic!("a fence second")
    };
    let region = items
        .pop()
        .unwrap()
        .into_region()
        .expect("map the pool's memory");
    let space = SoftIommu::new(48).unwrap();
    let pool = Pool::open_shared(space.map(Arc::new(region)).unwrap(), Exhaustion::Fail)
        .expect("open the parent's pool");
    let buffer = pool.alloc(4096).unwrap();
    buffer.write(0, b"from the child").unwrap();
    let done = Fence::new().unwrap();
    share::send(socket.as_fd(), &[Item::Fence(&done)]).unwrap();
    println!("SHARE AT {}", buffer.offset());
    // The parent reads the bytes, then signals: wait for it, then say done.
    go.wait(WAIT).expect("the parent's fence");
    done.signal().unwrap();
    // A hostile message next: refused, nothing leaked, the socket still usable.
    let err = share::recv(socket.as_fd()).unwrap_err();
    println!("SHARE REFUSED {err}");
    let again = share::recv(socket.as_fd()).expect("a good message after a bad one");
    assert!(matches!(again.as_slice(), [Received::Fence(_)]));
    println!("SHARE END");
    drop(buffer);
}

#[test]
fn a_pool_and_fences_cross_to_another_process() {
    if std::env::var(ROLE).as_deref() == Ok("child") {
        return child();
    }
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    // SAFETY: dup has no memory-safety preconditions; the copy lacks CLOEXEC, so the child
    // inherits it.
    let inherited = unsafe { libc::dup(theirs.as_raw_fd()) };
    assert!(inherited >= 0);
    // SAFETY: just returned by dup, owned by nothing else.
    let inherited = unsafe { OwnedFd::from_raw_fd(inherited) };
    drop(theirs);

    let region = Arc::new(
        Region::builder(LEN)
            .page_size(PageSize::Base)
            .memfd()
            .build()
            .unwrap(),
    );
    let space = SoftIommu::new(48).unwrap();
    let pool = Pool::create_shared(
        space.map(Arc::clone(&region)).unwrap(),
        Config::default().chunk_size(64 << 10),
    )
    .unwrap();
    let go = Fence::new().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, "child")
        .env(FD, inherited.as_raw_fd().to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    drop(inherited);
    share::send(ours.as_fd(), &[Item::Region(&region), Item::Fence(&go)]).unwrap();
    let Some(Received::Fence(done)) = share::recv(ours.as_fd()).unwrap().pop() else {
        panic!("the child's fence")
    };
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut report = |prefix: &str| -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the child ended early"
            );
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].trim().to_owned();
            }
        }
    };
    let at: usize = report("SHARE AT ").parse().unwrap();
    let mut bytes = [0u8; 14];
    // SAFETY: the child's buffer lies inside the shared region; it wrote it before reporting
    // and does not touch it again until the fence.
    unsafe {
        std::ptr::copy_nonoverlapping(region.as_ptr().as_ptr().add(at), bytes.as_mut_ptr(), 14)
    };
    assert_eq!(&bytes, b"from the child");
    assert!(!done.is_signalled().unwrap());
    go.signal().unwrap();
    done.wait(WAIT).expect("the child's fence after ours");

    // A message with more descriptors than items, then a good one.
    let (r, _w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let raw = [r.as_raw_fd(), r.as_raw_fd()];
    let bytes = {
        let mut b = b"UDMS".to_vec();
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
        b.extend_from_slice(&0u64.to_le_bytes());
        b
    };
    nix::sys::socket::sendmsg::<()>(
        ours.as_raw_fd(),
        &[std::io::IoSlice::new(&bytes)],
        &[nix::sys::socket::ControlMessage::ScmRights(&raw)],
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
    .unwrap();
    let refused = report("SHARE REFUSED ");
    assert!(refused.contains("1 items but 2 descriptors"), "{refused}");
    share::send(ours.as_fd(), &[Item::Fence(&go)]).unwrap();
    report("SHARE END");
    assert!(child.wait().unwrap().success());
    drop(pool);
}
