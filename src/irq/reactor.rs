//! The interrupt reactor behind the crate's futures: one background thread that waits on every
//! eventfd a pending future is waiting for (with a [`Waiter`]) and wakes that future's `Waker`
//! when its eventfd becomes readable. It makes the futures executor-agnostic: they work under
//! tokio, `futures::executor` or any other executor, none of which knows about eventfds.
//!
//! Registrations are one-shot: a future registers (eventfd, waker) under its key each time it
//! returns `Pending`, the reactor wakes it once and forgets it. The thread is started on first
//! use and lives for the rest of the process.
//!
//! `std::sync` items are used directly here (not the loom facade): this is process-global
//! plumbing around system calls, which loom cannot model; the ring's protocol is modelled
//! without it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Waker;

use super::{Error, EventFd, Waiter};

/// A request to the reactor thread, applied in order.
#[derive(Debug)]
enum Request {
    /// Wake `Waker` once `EventFd` is readable; replaces an earlier registration of the key.
    Add(u64, Arc<EventFd>, Waker),
    /// Forget the key's registration, if any.
    Cancel(u64),
}

/// The handle futures use.
#[derive(Debug)]
pub(crate) struct Reactor {
    requests: Arc<Mutex<Vec<Request>>>,
    control: Arc<EventFd>,
}

/// The waiter token of the control eventfd (keys count up from 0 and never reach it).
const CONTROL: u64 = u64::MAX;

static REACTOR: OnceLock<Reactor> = OnceLock::new();
static START: Mutex<()> = Mutex::new(());
static KEYS: AtomicU64 = AtomicU64::new(0);

/// A key no other registration uses.
pub(crate) fn next_key() -> u64 {
    // Relaxed: only uniqueness matters, which the atomic increment gives.
    KEYS.fetch_add(1, Ordering::Relaxed)
}

/// The process's reactor, started on first use.
pub(crate) fn global() -> Result<&'static Reactor, Error> {
    if let Some(reactor) = REACTOR.get() {
        return Ok(reactor);
    }
    // One thread starts it; a poisoned lock only means another start panicked.
    let _guard = START
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(reactor) = REACTOR.get() {
        return Ok(reactor);
    }
    let reactor = Reactor::start()?;
    Ok(REACTOR.get_or_init(|| reactor))
}

impl Reactor {
    fn start() -> Result<Reactor, Error> {
        let control = Arc::new(EventFd::new()?);
        let mut waiter = Waiter::new()?;
        waiter.add(&*control, CONTROL)?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let thread_requests = Arc::clone(&requests);
        let thread_control = Arc::clone(&control);
        std::thread::Builder::new()
            .name("userdma-irq".into())
            .spawn(move || run(waiter, &thread_requests, &thread_control))
            .map_err(|source| Error::Reactor { source })?;
        Ok(Reactor { requests, control })
    }

    fn send(&self, request: Request) -> Result<(), Error> {
        self.requests
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(request);
        self.control.signal()
    }

    /// Wakes `waker` once `event` is readable (at once if it is now). Replaces the key's earlier
    /// registration.
    pub(crate) fn register(
        &self,
        key: u64,
        event: Arc<EventFd>,
        waker: Waker,
    ) -> Result<(), Error> {
        self.send(Request::Add(key, event, waker))
    }

    /// Forgets the key's registration (a future dropped while pending).
    pub(crate) fn cancel(&self, key: u64) {
        // Best effort: if the control eventfd cannot be signalled, the registration is dropped
        // at the reactor's next wake-up, or fires once, waking a waker nobody waits on.
        let _ = self.send(Request::Cancel(key));
    }
}

/// The reactor thread.
fn run(mut waiter: Waiter, requests: &Mutex<Vec<Request>>, control: &EventFd) {
    let mut wakers: HashMap<u64, Waker> = HashMap::new();
    let mut ready = Vec::new();
    loop {
        ready.clear();
        match waiter.wait(None) {
            Ok(tokens) => ready.extend_from_slice(tokens),
            Err(_) => {
                // The waiter is broken (it should not be): wake everyone, so their futures poll
                // the queue again instead of hanging, and keep serving the control fd.
                for (_, waker) in wakers.drain() {
                    waker.wake();
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
        }
        for &token in &ready {
            if token == CONTROL {
                continue;
            }
            let _ = waiter.remove(token);
            if let Some(waker) = wakers.remove(&token) {
                waker.wake();
            }
        }
        if ready.contains(&CONTROL) {
            let _ = control.try_read();
            let batch = std::mem::take(
                &mut *requests
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            );
            for request in batch {
                match request {
                    Request::Add(key, event, waker) => {
                        if wakers.remove(&key).is_some() {
                            let _ = waiter.remove(key);
                        }
                        match waiter.add(&*event, key) {
                            Ok(()) => {
                                wakers.insert(key, waker);
                            }
                            // Cannot watch it: wake at once, the future polls and retries.
                            Err(_) => waker.wake(),
                        }
                    }
                    Request::Cancel(key) => {
                        if wakers.remove(&key).is_some() {
                            let _ = waiter.remove(key);
                        }
                    }
                }
            }
        }
    }
}
