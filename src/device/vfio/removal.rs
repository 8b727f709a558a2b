//! What a [`Vfio`](super::Vfio) device does when the kernel asks for it back, and when it
//! reports an error.
//!
//! vfio-pci signals the **request** interrupt (`VFIO_PCI_REQ_IRQ_INDEX`) when it wants the
//! device released: a hot-unplug, `echo 1 > /sys/bus/pci/devices/BDF/remove`, an unbind. The
//! kernel then waits (re-signalling every few seconds) until every open file of the device is
//! closed, and the mappings of its BARs count as open files. It signals the **error** interrupt
//! (`VFIO_PCI_ERR_IRQ_INDEX`) on a PCIe AER error. Both are eventfds given to
//! `VFIO_DEVICE_SET_IRQS` at open, watched by one monitor thread per device.
//!
//! On the request, the monitor cuts the device off, in this order:
//!
//! 1. **bus mastering off** (the command register, through the device fd): the device starts no
//!    more DMA, so no buffer can be written behind the host's back from here on;
//! 2. **the BARs are cut off** ([`Bar::cut_off`]): each mapped area is replaced in place by
//!    memory that reads all-ones, so register blocks the application still holds read what a
//!    removed PCIe device reads and their writes reach no device (they land in that memory),
//!    and the mappings stop holding the device;
//! 3. **the removal is reported** ([`Source::report_removal`]): subscribers' eventfds and every
//!    interrupt vector are signalled, so queues waiting on the device wake with
//!    [`ring::Error::Removed`](crate::ring::Error::Removed) and hand their buffers back on
//!    shutdown (safe, after step 1), and whoever sees the event finds the BARs cut off;
//! 4. **the device fd is released**: `/dev/null` is put in its place (`dup3`), so the kernel's
//!    last reference goes and the removal completes, while the descriptor number the rest of
//!    the backend uses stays valid (`pread`/`pwrite`/ioctls on it fail instead of reaching
//!    another file that reused the number).
//!
//! Every later call that needs the device fails with [`Error::Removed`](crate::device::Error::Removed).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::bar::Bar;
use crate::device::{config, Source};
use crate::irq;
use crate::mmio::{Block, FileBacked};
use crate::pci::Bdf;
use crate::sync::Mutex;

/// The BARs mapped so far, shared with the monitor (which cuts them off).
pub(super) type Bars = Arc<Mutex<Vec<Option<Arc<Bar>>>>>;

/// What the monitor needs to cut the device off.
pub(super) struct Cutoff {
    pub(super) bdf: Bdf,
    pub(super) device: Arc<OwnedFd>,
    pub(super) config: Block<FileBacked<Arc<OwnedFd>>>,
    pub(super) bars: Bars,
    pub(super) events: Source,
}

impl Cutoff {
    /// Cuts the device off (the steps of the module docs). Runs once: a second request finds
    /// the removal reported and does nothing.
    pub(super) fn run(&self) {
        if self.events.is_removed() {
            return;
        }
        // 1. A device already gone fails the write: nothing of it can DMA then either.
        let _ = config::set_bus_master(&self.config, self.bdf, false);
        // 2. Held under the lock until the report: `bar_of` maps no new BAR once the removal
        // is reported, and one it mapped before is in the list.
        let bars = self
            .bars
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for bar in bars.iter().flatten() {
            if let Err(err) = bar.cut_off() {
                eprintln!(
                    "warning: {}: cutting off a BAR mapping failed ({err}): the kernel waits for this process to exit to finish removing the device",
                    self.bdf
                );
            }
        }
        // 3.
        self.events.report_removal();
        drop(bars);
        // 4.
        if let Err(err) = release(self.device.as_fd()) {
            eprintln!(
                "warning: {}: releasing the device fd failed ({err}): the kernel waits for this process to exit to finish removing the device",
                self.bdf
            );
        }
    }
}

/// Puts `/dev/null` in place of `fd` (same number, close-on-exec), dropping the process's
/// reference to the file `fd` was.
fn release(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    // A raw `libc` call: nix's `dup3` wants the target's `OwnedFd` by `&mut`, and the device
    // fd is the backend's, only borrowed here.
    // SAFETY: both descriptors are open (`null` owned here, `fd` borrowed for the call);
    // dup3 atomically closes what `fd` was and makes it a duplicate of `null`. The number stays
    // owned by its `OwnedFd`, which closes it (now /dev/null) when dropped.
    let ret = unsafe { libc::dup3(null.as_raw_fd(), fd.as_raw_fd(), libc::O_CLOEXEC) };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The monitor thread of a device: waits on its request and error eventfds.
#[derive(Debug)]
pub(super) struct Monitor {
    stop: irq::EventFd,
    thread: Option<JoinHandle<(Option<irq::EventFd>, Option<irq::EventFd>)>>,
}

impl Monitor {
    /// Starts the monitor over `request` and `error` (either may be absent: the device does not
    /// have that interrupt).
    pub(super) fn start(
        cutoff: Cutoff,
        request: Option<irq::EventFd>,
        error: Option<irq::EventFd>,
    ) -> Result<Monitor, irq::Error> {
        let stop = irq::EventFd::new()?;
        let stopped = stop.try_clone()?;
        let name = format!("vfio-events-{}", cutoff.bdf);
        let thread = std::thread::Builder::new()
            .name(name)
            // The eventfds go back to the thread that joins this one, which closes them: the
            // owner may still use them (a test raises them) until it stops the monitor, and a
            // close here would be ordered after those uses only through the kernel.
            .spawn(move || {
                watch(&cutoff, request.as_ref(), error.as_ref(), &stopped);
                (request, error)
            })
            .map_err(|source| irq::Error::Create { source })?;
        Ok(Monitor {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        if self.stop.signal().is_ok() {
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// The monitor's loop: until `stop`, reports each error interrupt and cuts the device off on
/// the first request.
fn watch(
    cutoff: &Cutoff,
    request: Option<&irq::EventFd>,
    error: Option<&irq::EventFd>,
    stop: &irq::EventFd,
) {
    let mut request = request;
    loop {
        let fds = [
            request.map(AsFd::as_fd),
            error.map(AsFd::as_fd),
            Some(stop.as_fd()),
        ];
        let Ok(ready) = poll(&fds) else {
            return;
        };
        if ready[2] {
            return;
        }
        if ready[1] {
            if let Some(error) = error {
                if let Ok(Some(count)) = error.try_read() {
                    for _ in 0..count {
                        cutoff.events.report_error();
                    }
                }
            }
        }
        if ready[0] {
            if let Some(fd) = request {
                let _ = fd.try_read();
            }
            cutoff.run();
            // The kernel re-signals until the release completes: nothing more to do for it.
            request = None;
        }
    }
}

/// Waits for any of `fds` (absent ones ignored) to be readable; which are.
fn poll(fds: &[Option<BorrowedFd<'_>>; 3]) -> std::io::Result<[bool; 3]> {
    use nix::errno::Errno;
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    // The present fds, and which of `fds` each is.
    let which: Vec<usize> = (0..fds.len()).filter(|&i| fds[i].is_some()).collect();
    let mut list: Vec<PollFd<'_>> = fds
        .iter()
        .flatten()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    loop {
        match nix::poll::poll(&mut list, PollTimeout::NONE) {
            Ok(_) => break,
            Err(Errno::EINTR) => continue,
            Err(errno) => return Err(errno.into()),
        }
    }
    let mut ready = [false; 3];
    let wake = PollFlags::POLLIN | PollFlags::POLLERR | PollFlags::POLLHUP;
    for (&i, p) in which.iter().zip(&list) {
        ready[i] = p.revents().is_some_and(|r| r.intersects(wake));
    }
    Ok(ready)
}
