//! Receiving from sockets straight into pool buffers through io_uring: a real loopback TCP
//! connection and a Unix socketpair, data checked byte for byte; short receives, receives
//! resumed until full, the peer's close as the end of the stream; a receive held in flight
//! until cancelled hands its buffer back; dropping the stager with receives in flight.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use userdma::memory::PageSize;
use userdma::pool::Pool;
use userdma::Runtime;
use userdma_infer::stage::{self, Direct, Error, File, Stager};
use userdma_loopback::{self as loopback, LoopbackRuntime};

const KIB: usize = 1 << 10;

fn runtime() -> Runtime {
    Runtime::loopback(loopback::Config::default()).expect("loopback runtime")
}

fn pool(runtime: &Runtime) -> Arc<Pool> {
    runtime.pool(8 << 20, PageSize::Base).expect("pool")
}

/// Byte `i` of every stream.
fn pattern(i: usize) -> u8 {
    ((i as u64).wrapping_mul(0x9e37_79b9) >> 11) as u8
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(pattern).collect()
}

/// A connected TCP pair on the loopback interface: (ours, the peer).
fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let ours = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
    let (peer, _) = listener.accept().expect("accept");
    (ours, peer)
}

/// The peer writes `bytes` in uneven pieces, then closes its end.
fn send_in_pieces(
    mut peer: impl Write + Send + 'static,
    bytes: Vec<u8>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut at = 0;
        let mut piece = 1000;
        while at < bytes.len() {
            let end = (at + piece).min(bytes.len());
            peer.write_all(&bytes[at..end]).expect("peer write");
            at = end;
            piece = piece * 7 % 65_521 + 1;
        }
        // Dropping `peer` closes it: the receiver sees the end of the stream.
    })
}

/// Receives with plain `recv` until the end of the stream; checks every byte; returns the
/// bytes and how many receives came back short.
fn recv_until_end(stager: &mut Stager, socket: &File, chunk: usize) -> (usize, usize) {
    let pool = stager.pool().clone();
    let mut at = 0;
    let mut short = 0;
    loop {
        let ticket = stager
            .recv(socket, pool.alloc_owned(chunk).expect("buffer"))
            .expect("queued");
        let done = stager.wait().expect("completion");
        assert_eq!(done.ticket, ticket);
        let transfer = done.result.as_ref().expect("received");
        assert_eq!(done.buffer.len(), transfer.bytes);
        if transfer.bytes == 0 {
            return (at, short);
        }
        if transfer.is_short() {
            short += 1;
        }
        let mut got = vec![0u8; transfer.bytes];
        done.buffer.read(0, &mut got).expect("read back");
        for (i, b) in got.iter().enumerate() {
            assert_eq!(*b, pattern(at + i), "byte {} of the stream", at + i);
        }
        at += transfer.bytes;
    }
}

/// Receives with `recv_exact` (one at a time: receives on one stream are not ordered among
/// themselves); every buffer is full except the last, cut by the peer's close.
fn recv_exact_until_end(stager: &mut Stager, socket: &File, chunk: usize, total: usize) {
    let pool = stager.pool().clone();
    let expected = data(total);
    let mut at = 0;
    loop {
        let ticket = stager
            .recv_exact(socket, pool.alloc_owned(chunk).expect("buffer"))
            .expect("queued");
        let done = stager.wait().expect("completion");
        assert_eq!(done.ticket, ticket);
        let transfer = *done.result.as_ref().expect("received");
        if at + chunk <= total {
            assert!(!transfer.is_short(), "a full chunk is resumed until full");
        }
        let mut got = vec![0u8; transfer.bytes];
        done.buffer.read(0, &mut got).expect("read back");
        assert!(
            got == expected[at..at + transfer.bytes],
            "bytes {at}.. differ"
        );
        at += transfer.bytes;
        if transfer.is_short() {
            let err = done.into_full().expect_err("the peer closed inside it");
            if transfer.bytes == 0 {
                assert!(matches!(err, Error::Eof { .. }), "{err}");
            } else {
                assert!(matches!(err, Error::ShortRead { .. }), "{err}");
            }
            break;
        }
    }
    assert_eq!(at, total);
}

fn stream_file(fd: impl Into<OwnedFd>, name: &str) -> File {
    let file = File::from_stream(fd, name);
    assert!(!file.is_regular());
    assert_eq!(file.mode(), stage::Mode::Buffered);
    file
}

#[test]
fn tcp_over_loopback_lands_in_pool_buffers_byte_for_byte() {
    let rt = runtime();
    let mut stager = Stager::new(pool(&rt), stage::Config::default().depth(4)).expect("stager");
    let total = 1_000_003;
    let (ours, peer) = tcp_pair();
    let sender = send_in_pieces(peer, data(total));
    let socket = stream_file(ours, "tcp 127.0.0.1");
    let (got, _short) = recv_until_end(&mut stager, &socket, 64 * KIB);
    assert_eq!(got, total, "every byte, then the end of the stream");
    sender.join().expect("sender");

    let (ours, peer) = tcp_pair();
    let sender = send_in_pieces(peer, data(total));
    let socket = stream_file(ours, "tcp 127.0.0.1");
    recv_exact_until_end(&mut stager, &socket, 64 * KIB, total);
    sender.join().expect("sender");
}

#[test]
fn a_unix_socketpair_lands_in_pool_buffers_byte_for_byte() {
    let rt = runtime();
    let mut stager = Stager::new(pool(&rt), stage::Config::default().depth(4)).expect("stager");
    let total = 777_777;
    let (ours, peer) = UnixStream::pair().expect("socketpair");
    let sender = send_in_pieces(peer, data(total));
    let socket = stream_file(ours, "socketpair");
    let (got, _) = recv_until_end(&mut stager, &socket, 32 * KIB);
    assert_eq!(got, total);
    sender.join().expect("sender");

    let (ours, peer) = UnixStream::pair().expect("socketpair");
    let sender = send_in_pieces(peer, data(total));
    let socket = stream_file(ours, "socketpair");
    recv_exact_until_end(&mut stager, &socket, 32 * KIB, total);
    sender.join().expect("sender");
}

#[test]
fn a_short_receive_says_how_many_bytes_and_recv_exact_waits_for_the_rest() {
    let rt = runtime();
    let pool = pool(&rt);
    let mut stager = Stager::new(pool.clone(), stage::Config::default()).expect("stager");
    let (ours, mut peer) = UnixStream::pair().expect("socketpair");
    let socket = stream_file(ours, "socketpair");
    peer.write_all(b"hello").expect("write");
    stager
        .recv(&socket, pool.alloc_owned(4 * KIB).expect("b"))
        .expect("queued");
    let done = stager.wait().expect("completion");
    let transfer = *done.result.as_ref().expect("ok");
    assert_eq!((transfer.bytes, transfer.requested), (5, 4 * KIB));
    let mut text = [0u8; 5];
    done.buffer.read(0, &mut text).expect("read");
    assert_eq!(&text, b"hello");

    // recv_exact holds on through short pieces until the buffer is full.
    let ticket = stager
        .recv_exact(&socket, pool.alloc_owned(12).expect("b"))
        .expect("queued");
    peer.write_all(b"frame").expect("write");
    stager.submit().expect("submit");
    std::thread::sleep(Duration::from_millis(20));
    peer.write_all(b" number").expect("write");
    let done = stager.wait().expect("completion");
    assert_eq!(done.ticket, ticket);
    let buffer = done.into_full().expect("full");
    let mut text = [0u8; 12];
    buffer.read(0, &mut text).expect("read");
    assert_eq!(&text, b"frame number");

    // The peer closing inside a recv_exact: a short read that says so.
    peer.write_all(b"cut").expect("write");
    drop(peer);
    stager.recv_exact(&socket, buffer).expect("queued");
    let err = stager
        .wait()
        .expect("completion")
        .into_full()
        .expect_err("short");
    assert!(
        matches!(
            err,
            Error::ShortRead {
                got: 3,
                wanted: 12,
                ..
            }
        ),
        "{err}"
    );
    // And after that, the end of the stream.
    stager
        .recv(&socket, pool.alloc_owned(64).expect("b"))
        .expect("queued");
    let done = stager.wait().expect("completion");
    assert_eq!(done.result.as_ref().expect("ok").bytes, 0);
    assert!(matches!(done.into_full(), Err(Error::Eof { .. })));
}

#[test]
fn a_receive_in_flight_until_cancelled_hands_its_buffer_back() {
    let rt = runtime();
    let pool = pool(&rt);
    let mut stager = Stager::new(pool.clone(), stage::Config::default()).expect("stager");
    let (ours, peer) = tcp_pair();
    let socket = stream_file(ours, "tcp 127.0.0.1");
    let buffer = pool.alloc_owned(4 * KIB).expect("b");
    let address = buffer.as_ptr();
    let ticket = stager.recv(&socket, buffer).expect("queued");
    stager.submit().expect("submit");
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        stager.try_wait().expect("poll").is_none(),
        "nothing was sent: still in flight"
    );
    assert_eq!(stager.in_flight(), 1);
    assert!(stager.cancel(ticket).expect("cancel"));
    let done = stager.wait().expect("completion");
    assert_eq!(done.ticket, ticket);
    assert!(
        matches!(done.result, Err(Error::Cancelled { .. })),
        "{:?}",
        done.result
    );
    assert_eq!(done.buffer.as_ptr(), address, "the same buffer came back");
    assert_eq!(stager.in_flight(), 0);
    drop(peer);
}

#[test]
fn dropping_the_stager_with_receives_in_flight_is_safe() {
    let rt = runtime();
    let pool = pool(&rt);
    let mut stager = Stager::new(pool.clone(), stage::Config::default().depth(8)).expect("stager");
    let (ours, mut peer) = UnixStream::pair().expect("socketpair");
    let mut reader = ours.try_clone().expect("clone");
    let socket = stream_file(ours, "socketpair");
    for _ in 0..8 {
        let buffer = pool.alloc_owned(4 * KIB).expect("b");
        buffer.write(0, &[0xaa; 16]).expect("fill");
        stager.recv(&socket, buffer).expect("queued");
    }
    stager.submit().expect("submit");
    std::thread::sleep(Duration::from_millis(20));
    drop(stager); // cancels all eight and waits for their completions
                  // Nothing receives into the pool any more: what is sent now stays in the socket.
    peer.write_all(b"after drop").expect("write");
    let mut back = [0u8; 10];
    reader.read_exact(&mut back).expect("still in the socket");
    assert_eq!(&back, b"after drop");
    let reused = pool.alloc_owned(4 * KIB).expect("b");
    let mut head = [0u8; 16];
    reused.read(0, &mut head).expect("read");
    assert_eq!(head, [0xaa; 16], "the buffers came back untouched");
    assert_eq!(userdma::pool::leaked_mappings(), 0);
}

#[test]
fn a_regular_file_is_not_a_stream() {
    let rt = runtime();
    let pool = pool(&rt);
    let mut stager = Stager::new(pool.clone(), stage::Config::default()).expect("stager");
    let dir = std::path::PathBuf::from("/dev/shm/userdma-stage-sockets");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(format!("regular-{}", std::process::id()));
    std::fs::write(&path, b"not a socket").expect("write");
    let file = File::open(&path, Direct::Off).expect("open");
    let refused = stager
        .recv(&file, pool.alloc_owned(64).expect("b"))
        .expect_err("a regular file");
    assert!(
        matches!(refused.error, Error::NotAStream { .. }),
        "{refused}"
    );
    assert_eq!(refused.buffer.len(), 64, "the buffer came back");
    std::fs::remove_file(path).ok();
}
