//! What happens to a device while it runs: [`Events`], the handle an application polls or
//! waits on to learn that the device was taken away ([`Event::Removal`]: hot-unplug, the
//! administrator's unbind or `remove`, the loopback device's [`remove`](super::Loopback::remove))
//! or reported an error ([`Event::Error`]: a PCIe AER error interrupt).
//!
//! Every backend owns one [`Source`]; [`Device::events`](super::Device::events) hands out a new
//! subscriber each call, with an eventfd of its own (so several threads and event loops each see
//! every event) and a cursor (so each sees each error once). No callbacks: a subscriber is
//! polled ([`Events::try_next`]), waited on ([`Events::wait`]) or put into the caller's own
//! epoll/io_uring loop ([`AsFd`]: readable while an event is unread).
//!
//! A removal is also seen by every queue of the device: the source implements
//! [`ring::Presence`], which queues opened through [`open_queue`](super::open_queue) hold, and it
//! signals every interrupt vector of the device when the removal is reported, so a thread asleep
//! in [`Queue::wait`](ring::Queue::wait) or [`ring::wait_any`] wakes and gets
//! [`ring::Error::Removed`].
//!
//! The order of a removal, in every backend: the device is first made unable to touch memory
//! (bus mastering off, or the engine stopped), then the removal is published (a queue that sees
//! it may hand its buffers back), then the interrupt vectors and subscribers are signalled.

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::{irq, ring};

/// Something that happened to a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase", tag = "event"))]
#[non_exhaustive]
pub enum Event {
    /// The device was taken away (or asked back by the kernel, which waits for the process to
    /// let go of it). Its queues are stopped; every later operation on it fails with a removal
    /// error. Reported once per subscriber, before any later error.
    Removal,
    /// The device reported `count` errors (AER error interrupts) since this subscriber last
    /// looked, `total` in all.
    Error {
        /// New since the last [`Events::try_next`] or [`Events::wait`] of this subscriber.
        count: u64,
        /// Since the device was opened.
        total: u64,
    },
}

/// The state every subscriber reads.
#[derive(Debug)]
struct Shared {
    /// The device's name, for messages.
    name: String,
    /// Set once, when the removal is reported.
    removed: AtomicBool,
    /// Error interrupts reported.
    errors: AtomicU64,
    /// Subscribers' eventfds, signalled on every event.
    subscribers: Mutex<Vec<Weak<irq::EventFd>>>,
    /// The device's interrupt vectors (duplicates of the eventfds its queues wait on),
    /// signalled when the removal is reported so that sleeping waits wake up and see it.
    vectors: Mutex<Vec<irq::EventFd>>,
}

/// The device side: what a backend holds and reports through. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Source {
    shared: Arc<Shared>,
}

impl Source {
    /// A source for the device named `name`, with nothing reported yet.
    pub fn new(name: impl Into<String>) -> Source {
        Source {
            shared: Arc::new(Shared {
                name: name.into(),
                removed: AtomicBool::new(false),
                errors: AtomicU64::new(0),
                subscribers: Mutex::new(Vec::new()),
                vectors: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A new subscriber (see [`Device::events`](super::Device::events)): sees the removal if it
    /// already happened, and errors from now on.
    pub fn subscribe(&self) -> Result<Events, irq::Error> {
        let fd = Arc::new(irq::EventFd::new()?);
        let seen = self.shared.errors.load(Ordering::Acquire);
        let mut subscribers = lock(&self.shared.subscribers);
        subscribers.retain(|s| s.strong_count() > 0);
        subscribers.push(Arc::downgrade(&fd));
        drop(subscribers);
        // A removal before the subscription is registered: make the new fd readable too (a
        // removal after it signals the fd through the list).
        if self.is_removed() {
            fd.signal()?;
        }
        Ok(Events {
            shared: Arc::clone(&self.shared),
            fd,
            seen_errors: seen,
            removal_seen: false,
        })
    }

    /// Adds a duplicate of an interrupt vector's eventfd to signal when the removal is
    /// reported.
    pub fn watch_vector(&self, vector: &irq::EventFd) -> Result<(), irq::Error> {
        let fd = vector.try_clone()?;
        if self.is_removed() {
            fd.signal()?;
        }
        lock(&self.shared.vectors).push(fd);
        Ok(())
    }

    /// Forgets the vectors given to [`Source::watch_vector`] (their interrupts were disabled).
    pub fn forget_vectors(&self) {
        lock(&self.shared.vectors).clear();
    }

    /// Whether the removal was reported.
    pub fn is_removed(&self) -> bool {
        // Acquire: pairs with the Release store in `report_removal`; what the backend did
        // before reporting (bus mastering off, the engine stopped) happened before.
        self.shared.removed.load(Ordering::Acquire)
    }

    /// Reports the removal (once; later calls do nothing): call it only after the device can
    /// no longer read or write memory, because queues that see it hand their buffers back.
    /// Returns whether this call reported it.
    pub fn report_removal(&self) -> bool {
        // AcqRel: Release publishes what the backend did before (see `is_removed`); the swap
        // decides which of two racing reports signals.
        if self.shared.removed.swap(true, Ordering::AcqRel) {
            return false;
        }
        #[cfg(feature = "tracing")]
        tracing::warn!(device = %self.shared.name, "device removed");
        for vector in lock(&self.shared.vectors).iter() {
            // A full counter is nonzero already: the waiter wakes anyway.
            let _ = vector.signal();
        }
        self.signal_subscribers();
        true
    }

    /// Reports one error interrupt.
    pub fn report_error(&self) {
        // Release: a subscriber that sees the new count (Acquire in `try_next`) sees what was
        // recorded before it.
        self.shared.errors.fetch_add(1, Ordering::Release);
        // Relaxed: a figure for the event's reader (reports racing with this one may be in
        // it); nothing is published through it.
        #[cfg(feature = "tracing")]
        tracing::error!(
            device = %self.shared.name,
            total = self.shared.errors.load(Ordering::Relaxed),
            "device error interrupt"
        );
        self.signal_subscribers();
    }

    fn signal_subscribers(&self) {
        let mut subscribers = lock(&self.shared.subscribers);
        subscribers.retain(|s| match s.upgrade() {
            Some(fd) => {
                let _ = fd.signal();
                true
            }
            None => false,
        });
    }

    /// The [`ring::Presence`] a queue of this device holds.
    pub fn presence(&self) -> Arc<dyn ring::Presence> {
        Arc::new(self.clone())
    }
}

impl ring::Presence for Source {
    fn is_gone(&self) -> bool {
        self.is_removed()
    }
}

/// One subscriber to a device's events (see the module docs). `Send`; not `Clone` (each
/// subscriber has its own cursor: ask the device for another).
pub struct Events {
    shared: Arc<Shared>,
    fd: Arc<irq::EventFd>,
    /// Errors already reported to this subscriber.
    seen_errors: u64,
    /// The removal was already reported to this subscriber.
    removal_seen: bool,
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events")
            .field("device", &self.shared.name)
            .field("removed", &self.removed())
            .field("errors", &self.errors())
            .finish_non_exhaustive()
    }
}

impl Events {
    /// Whether the device was removed.
    pub fn removed(&self) -> bool {
        // Acquire: pairs with the Release in `Source::report_removal`.
        self.shared.removed.load(Ordering::Acquire)
    }

    /// Error interrupts the device reported since it was opened.
    pub fn errors(&self) -> u64 {
        self.shared.errors.load(Ordering::Acquire)
    }

    /// The device's name.
    pub fn device(&self) -> &str {
        &self.shared.name
    }

    /// The next event this subscriber has not seen, without waiting: the removal first, then
    /// errors (all new ones as one event).
    pub fn try_next(&mut self) -> Option<Event> {
        // Drain the fd first: an event reported after this read signals it again, so it is
        // never left unread while the fd reads empty.
        let _ = self.fd.try_read();
        if !self.removal_seen && self.removed() {
            self.removal_seen = true;
            // The errors are still there for the next call: make the fd readable for them.
            if self.errors() > self.seen_errors {
                let _ = self.fd.signal();
            }
            return Some(Event::Removal);
        }
        let total = self.errors();
        if total > self.seen_errors {
            let count = total - self.seen_errors;
            self.seen_errors = total;
            return Some(Event::Error { count, total });
        }
        None
    }

    /// Waits up to `timeout` (`None`: forever) for an event this subscriber has not seen;
    /// `Ok(None)` on timeout.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<Option<Event>, irq::Error> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if let Some(event) = self.try_next() {
                return Ok(Some(event));
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Ok(None);
            }
            self.fd
                .wait_readable(left.or(timeout.filter(|_| deadline.is_none())))?;
        }
    }
}

impl AsFd for Events {
    /// Readable while an event is unread by this subscriber (until [`Events::try_next`] or
    /// [`Events::wait`] returns it).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update is one push, clear or retain: a poisoned list is still consistent.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscriber_sees_the_removal_once_then_errors() {
        let source = Source::new("dev0");
        let mut events = source.subscribe().unwrap();
        assert_eq!(events.try_next(), None);
        source.report_error();
        assert!(source.report_removal());
        assert!(!source.report_removal(), "reported once");
        assert_eq!(
            events.wait(Some(Duration::ZERO)).unwrap(),
            Some(Event::Removal)
        );
        assert_eq!(events.try_next(), Some(Event::Error { count: 1, total: 1 }));
        assert_eq!(events.try_next(), None);
        assert!(events.removed());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: waits on the event fd with poll(2), which Miri does not emulate"
    )]
    fn every_subscriber_sees_every_event_and_late_ones_see_the_removal() {
        let source = Source::new("dev0");
        let mut a = source.subscribe().unwrap();
        let mut b = source.subscribe().unwrap();
        source.report_error();
        source.report_error();
        assert_eq!(a.try_next(), Some(Event::Error { count: 2, total: 2 }));
        assert_eq!(b.try_next(), Some(Event::Error { count: 2, total: 2 }));
        source.report_removal();
        let mut late = source.subscribe().unwrap();
        assert!(irq_readable(&late));
        assert_eq!(late.try_next(), Some(Event::Removal));
        assert_eq!(
            late.try_next(),
            None,
            "errors before it subscribed are not new to it"
        );
        assert_eq!(a.try_next(), Some(Event::Removal));
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: waits on the event fd with poll(2), which Miri does not emulate"
    )]
    fn the_fd_is_readable_while_an_event_is_unread() {
        let source = Source::new("dev0");
        let mut events = source.subscribe().unwrap();
        assert!(!irq_readable(&events));
        source.report_error();
        assert!(irq_readable(&events));
        events.try_next();
        assert!(!irq_readable(&events));
        assert_eq!(events.wait(Some(Duration::from_millis(1))).unwrap(), None);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: waits on the event fd with poll(2), which Miri does not emulate"
    )]
    fn the_removal_wakes_a_vector_and_a_waiting_thread() {
        let source = Source::new("dev0");
        let vector = irq::EventFd::new().unwrap();
        source.watch_vector(&vector).unwrap();
        let mut events = source.subscribe().unwrap();
        let waiter = std::thread::spawn(move || events.wait(Some(Duration::from_secs(10))));
        std::thread::sleep(Duration::from_millis(20));
        source.report_removal();
        assert_eq!(waiter.join().unwrap().unwrap(), Some(Event::Removal));
        assert_eq!(vector.try_read().unwrap(), Some(1));
        let presence = source.presence();
        assert!(presence.is_gone());
    }

    fn irq_readable(events: &Events) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout};
        let mut fds = [PollFd::new(events.as_fd(), PollFlags::POLLIN)];
        nix::poll::poll(&mut fds, PollTimeout::ZERO) == Ok(1)
    }
}
