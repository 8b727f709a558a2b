//! `irq::Waiter`: the same behaviour from the io_uring and the epoll backend, each built
//! explicitly. The io_uring tests run with the `io-uring` feature (`cargo test -p userdma
//! --features io-uring`) and need a kernel that allows io_uring (`sysctl
//! kernel.io_uring_disabled=0`, no seccomp filter denying it); without the feature, asking for
//! io_uring is an error that says how to get it, and the default waiter is epoll's.
#![cfg(not(loom))]

use std::thread;
use std::time::{Duration, Instant};

use userdma::irq::{Error, EventFd, Kind, Waiter};

fn make(kind: Kind) -> Waiter {
    let waiter = match kind {
        Kind::IoUring => Waiter::with_io_uring().unwrap_or_else(|err| {
            panic!("io_uring is needed for this test ({err}); enable it with `sysctl kernel.io_uring_disabled=0`")
        }),
        Kind::Epoll => Waiter::with_epoll().unwrap(),
    };
    assert_eq!(waiter.kind(), kind);
    waiter
}

fn sorted(tokens: &[u64]) -> Vec<u64> {
    let mut tokens = tokens.to_vec();
    tokens.sort_unstable();
    tokens
}

fn reports_exactly_the_readable_fds(kind: Kind) {
    let mut waiter = make(kind);
    let fds: Vec<EventFd> = (0..3).map(|_| EventFd::new().unwrap()).collect();
    for (i, fd) in fds.iter().enumerate() {
        waiter.add(fd, 100 + i as u64).unwrap();
    }
    assert_eq!(waiter.len(), 3);
    let start = Instant::now();
    assert!(waiter
        .wait(Some(Duration::from_millis(20)))
        .unwrap()
        .is_empty());
    assert!(
        start.elapsed() >= Duration::from_millis(20),
        "{kind}: waited the timeout"
    );

    fds[1].signal().unwrap();
    assert_eq!(waiter.wait(Some(Duration::from_secs(1))).unwrap(), &[101]);
    // Level-triggered: still readable, reported again.
    assert_eq!(waiter.wait(Some(Duration::ZERO)).unwrap(), &[101]);
    fds[2].signal().unwrap();
    assert_eq!(
        sorted(waiter.wait(Some(Duration::from_secs(1))).unwrap()),
        vec![101, 102]
    );
    fds[1].try_read().unwrap();
    fds[2].try_read().unwrap();
    assert!(waiter
        .wait(Some(Duration::from_millis(1)))
        .unwrap()
        .is_empty());
}

fn registrations_are_managed(kind: Kind) {
    let mut waiter = make(kind);
    let a = EventFd::new().unwrap();
    let b = EventFd::new().unwrap();
    waiter.add(&a, 1).unwrap();
    assert!(matches!(
        waiter.add(&b, 1),
        Err(Error::DuplicateToken { token: 1 })
    ));
    assert!(matches!(
        waiter.remove(7),
        Err(Error::UnknownToken { token: 7 })
    ));
    waiter.add(&b, 2).unwrap();
    // Armed (a wait ran), then removed: a later signal is not reported.
    assert!(waiter.wait(Some(Duration::ZERO)).unwrap().is_empty());
    waiter.remove(1).unwrap();
    a.signal().unwrap();
    assert!(waiter
        .wait(Some(Duration::from_millis(5)))
        .unwrap()
        .is_empty());
    // The token can be reused, for another fd.
    let c = EventFd::new().unwrap();
    waiter.add(&c, 1).unwrap();
    c.signal().unwrap();
    assert_eq!(waiter.wait(Some(Duration::from_secs(1))).unwrap(), &[1]);
    // The waiter keeps its own fd: closing the caller's does not end the registration.
    let d = EventFd::new().unwrap();
    let signaller = d.try_clone().unwrap();
    waiter.add(&d, 9).unwrap();
    drop(d);
    c.try_read().unwrap();
    signaller.signal().unwrap();
    assert_eq!(waiter.wait(Some(Duration::from_secs(1))).unwrap(), &[9]);
    assert_eq!(waiter.len(), 3);
    assert!(!waiter.is_empty());
}

fn wakes_a_thread_sleeping_forever(kind: Kind) {
    let mut waiter = make(kind);
    let fds: Vec<EventFd> = (0..100).map(|_| EventFd::new().unwrap()).collect();
    for (i, fd) in fds.iter().enumerate() {
        waiter.add(fd, i as u64).unwrap();
    }
    // More fds than io_uring submission entries: arming takes several submits.
    let signaller = fds[77].try_clone().unwrap();
    let handle = thread::spawn(move || {
        thread::sleep(Duration::from_millis(10));
        signaller.signal().unwrap();
    });
    assert_eq!(waiter.wait(None).unwrap(), &[77]);
    handle.join().unwrap();
}

#[test]
#[cfg(feature = "io-uring")]
fn io_uring_reports_exactly_the_readable_fds() {
    reports_exactly_the_readable_fds(Kind::IoUring);
}

#[test]
fn epoll_reports_exactly_the_readable_fds() {
    reports_exactly_the_readable_fds(Kind::Epoll);
}

#[test]
#[cfg(feature = "io-uring")]
fn io_uring_registrations_are_managed() {
    registrations_are_managed(Kind::IoUring);
}

#[test]
fn epoll_registrations_are_managed() {
    registrations_are_managed(Kind::Epoll);
}

#[test]
#[cfg(feature = "io-uring")]
fn io_uring_wakes_a_thread_sleeping_forever() {
    wakes_a_thread_sleeping_forever(Kind::IoUring);
}

#[test]
fn epoll_wakes_a_thread_sleeping_forever() {
    wakes_a_thread_sleeping_forever(Kind::Epoll);
}

#[test]
#[cfg(feature = "io-uring")]
fn default_waiter_prefers_io_uring_where_allowed() {
    let waiter = Waiter::new().unwrap();
    let io_uring_allowed = Waiter::with_io_uring().is_ok();
    let expect = if io_uring_allowed {
        Kind::IoUring
    } else {
        Kind::Epoll
    };
    assert_eq!(waiter.kind(), expect);
}

#[test]
#[cfg(not(feature = "io-uring"))]
fn without_the_feature_io_uring_is_an_error_and_the_default_is_epoll() {
    let err = Waiter::with_io_uring().expect_err("no io_uring backend in this build");
    assert!(matches!(err, Error::IoUringNotBuilt), "{err:?}");
    assert_eq!(err.code(), userdma::Code::Unsupported);
    assert!(err.to_string().contains("`io-uring` feature"), "{err}");
    assert_eq!(Waiter::new().unwrap().kind(), Kind::Epoll);
}
