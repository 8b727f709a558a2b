//! The interrupt relay of a UIO device: a thread that waits on `/dev/uioN` and signals an
//! [`irq::EventFd`] for each interrupt, so that a UIO interrupt is waited on like any other
//! vector (a [`crate::ring::Queue`], an [`irq::Waiter`]). `/dev/uioN` itself cannot be: its
//! `read` takes exactly 4 bytes (the total count), an eventfd's takes 8.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use userdma_sys::uio::{IrqWord, UIO_IRQ_WORD_SIZE};

use crate::device::uio::Error as UioError;
use crate::device::Error;
use crate::irq;
use crate::pci::Bdf;

/// The relay thread and what it shares with the device.
#[derive(Debug)]
pub(super) struct Relay {
    event: irq::EventFd,
    stop: irq::EventFd,
    count: Arc<AtomicU32>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    /// Starts relaying `node`'s interrupts.
    /// Starts the relay over `node`; `gone` runs once, on the relay thread, if the node
    /// fails (the device was removed: the kernel's uio core answers `EIO` to a device it
    /// unregistered) rather than being stopped.
    pub(super) fn start(
        bdf: Bdf,
        node: OwnedFd,
        path: &Path,
        gone: Box<dyn FnOnce() + Send>,
    ) -> Result<Relay, Error> {
        let event = irq::EventFd::new().map_err(|source| Error::Interrupt { vector: 0, source })?;
        let stop = irq::EventFd::new().map_err(|source| Error::Interrupt { vector: 0, source })?;
        let signal = event
            .try_clone()
            .map_err(|source| Error::Interrupt { vector: 0, source })?;
        let stopped = stop
            .try_clone()
            .map_err(|source| Error::Interrupt { vector: 0, source })?;
        let count = Arc::new(AtomicU32::new(0));
        let seen = Arc::clone(&count);
        let path: PathBuf = path.to_owned();
        let thread = std::thread::Builder::new()
            .name(format!("uio-irq-{bdf}"))
            .spawn(move || {
                if relay(&node, &signal, &stopped, &seen) == End::Failed {
                    gone();
                }
            })
            .map_err(|source| UioError::Node {
                bdf,
                path,
                operation: "start the interrupt relay thread for",
                source,
            })?;
        Ok(Relay {
            event,
            stop,
            count,
            thread: Some(thread),
        })
    }

    /// The eventfd signalled once per interrupt.
    pub(super) fn event(&self) -> &irq::EventFd {
        &self.event
    }

    /// The node's total interrupt count, as last read.
    pub(super) fn count(&self) -> u32 {
        // Relaxed: a statistic. The relay stores it before it writes the eventfd, and a waiter
        // loads it after reading the eventfd; those two system calls order the accesses.
        self.count.load(Ordering::Relaxed)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The thread polls `stop` with the node; if signalling fails the thread is left blocked
        // in poll, so do not join it then (it holds only its own fds).
        if self.stop.signal().is_ok() {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// The thread: poll the node and `stop`; on an interrupt read the count and signal `event` with
/// how many came since the last read.
/// Why the relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// It was asked to.
    Stopped,
    /// The node or the eventfd failed.
    Failed,
}

fn relay(node: &OwnedFd, event: &irq::EventFd, stop: &irq::EventFd, seen: &AtomicU32) -> End {
    let mut last: Option<u32> = None;
    loop {
        match poll2(node.as_fd(), stop.as_fd()) {
            Ok((_, true)) => return End::Stopped,
            Ok((true, false)) => {}
            Ok((false, false)) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return End::Failed,
        }
        let Ok(count) = read_word(node.as_fd()) else {
            return End::Failed;
        };
        let new = last.map_or(1, |l| count.wrapping_sub(l).max(1));
        last = Some(count);
        // Relaxed: see `Relay::count`; the eventfd write below publishes it.
        seen.store(count, Ordering::Relaxed);
        if event.write(u64::from(new)).is_err() {
            return End::Failed;
        }
    }
}

/// `poll` on both fds, no timeout: (node readable, stop readable).
fn poll2(node: BorrowedFd<'_>, stop: BorrowedFd<'_>) -> io::Result<(bool, bool)> {
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    let mut fds = [
        PollFd::new(node, PollFlags::POLLIN),
        PollFd::new(stop, PollFlags::POLLIN),
    ];
    nix::poll::poll(&mut fds, PollTimeout::NONE)?;
    let error = PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL;
    let [node, stop] = fds.map(|fd| fd.revents().unwrap_or(PollFlags::empty()));
    if node.intersects(error) {
        return Err(io::Error::from(io::ErrorKind::BrokenPipe));
    }
    Ok((
        node.contains(PollFlags::POLLIN),
        stop.contains(PollFlags::POLLIN),
    ))
}

/// One `read` of the interrupt count (exactly 4 bytes, as UIO requires).
fn read_word(node: BorrowedFd<'_>) -> io::Result<u32> {
    let mut word = [0u8; UIO_IRQ_WORD_SIZE];
    let n = nix::unistd::read(node, &mut word)?;
    if n != word.len() {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    Ok(u32::from_ne_bytes(word))
}

/// The word type is `i32` in the ABI; counts are read as `u32` (they only grow).
const _: () = assert!(std::mem::size_of::<IrqWord>() == std::mem::size_of::<u32>());
