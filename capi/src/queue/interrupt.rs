//! A queue's interrupt for the caller's own event loop: its eventfd (lent as a descriptor of
//! the caller's: [`Lent`]), arming and disarming it.

use std::ffi::c_int;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, RawFd};

use super::lifecycle::{udma_queue, with_queue};
use crate::abi;
use crate::error::{call, lib, udma_status, Fail};

/// The descriptor `udma_queue_interrupt_fd` lends the caller: a duplicate
/// (`F_DUPFD_CLOEXEC`) of the queue's eventfd, so the same open file description (the same
/// counter, readiness and nonblocking flag), under a number of its own. The library keeps
/// only the number, not an owned fd: the caller may close it, and the number may then name
/// another file. The queue's own eventfd is never lent, so its owner (the queue) cannot have
/// it closed under it.
#[derive(Debug)]
pub(super) struct Lent {
    fd: RawFd,
}

impl Lent {
    /// Lends a duplicate of `own`, the queue's eventfd.
    fn new(own: BorrowedFd<'_>) -> io::Result<Lent> {
        Ok(Lent {
            fd: own.try_clone_to_owned()?.into_raw_fd(),
        })
    }

    /// Whether the lent number still names the open file description of `own`; `None` when
    /// the kernel cannot tell (no `kcmp`).
    fn is_still(&self, own: BorrowedFd<'_>) -> Option<bool> {
        same_file(self.fd, own.as_raw_fd())
    }

    /// At the queue's destroy, while `own` (the queue's eventfd) is still open: closes the
    /// lent number if it still names the eventfd, and leaves it alone if the caller closed it
    /// (whatever file took the number since is not the library's). Without `kcmp` it cannot
    /// tell, and leaves the number open: one descriptor leaked per queue whose fd was lent.
    pub(super) fn give_back(self, own: BorrowedFd<'_>) {
        if self.is_still(own) == Some(true) {
            // SAFETY: `close` touches no memory of ours. The number names the open file
            // description the library lent (kcmp said so just now), which the caller was
            // told the library closes at destroy; no `OwnedFd` of ours holds this number
            // (`Lent::new` gave it up), so nothing closes it twice. Its result is ignored:
            // EBADF would mean the caller closed it concurrently with the destroy (which the
            // header forbids), and there is nothing else to do about an EINTR or EIO on an
            // eventfd.
            unsafe { libc::close(self.fd) };
        }
    }
}

/// `kcmp(2)`'s `KCMP_FILE` (`enum kcmp_type` in linux/kcmp.h, its first value; the libc crate
/// does not define it for Linux). Pinned by `tests::kcmp_file_compares_open_files`.
const KCMP_FILE: c_int = 0;

/// Whether descriptors `a` and `b` of this process name the same open file description
/// (`kcmp(2)` `KCMP_FILE`): `Some(false)` also when either is not open; `None` when the
/// kernel does not answer (`ENOSYS`: built without `CONFIG_KCMP`; `EPERM`: refused by a
/// seccomp filter, as container runtimes' default profiles do).
fn same_file(a: RawFd, b: RawFd) -> Option<bool> {
    let pid = libc::pid_t::try_from(std::process::id()).ok()?;
    // SAFETY: kcmp takes two pids, a type and two descriptor numbers, and touches no memory
    // of ours.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, a, b) };
    if r == 0 {
        return Some(true);
    }
    if r > 0 {
        return Some(false);
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EBADF) => Some(false),
        _ => None,
    }
}

/// The queue's interrupt, for the caller's own epoll loop: a descriptor of the queue's
/// eventfd, readable when the interrupt fires; `udma_queue_arm`, then sleep until the fd is
/// readable (unless `arm` said a completion is ready), then `udma_queue_disarm` and
/// `udma_queue_poll`.
///
/// The descriptor is lent: a duplicate of the eventfd the queue owns (the same counter), the
/// same number on every call while it is open, closed by `udma_queue_destroy`. Closing it
/// yourself is harmless (the queue keeps working; a later call lends a new number), and
/// `udma_queue_destroy` then leaves alone whatever file took the number since: it closes the
/// number only if it still names the eventfd it lent (asked of the kernel with `kcmp(2)`;
/// where the kernel does not allow `kcmp`, the lent number is left open at destroy, a
/// leak of one descriptor, and a later call returns the same number even if closed). Do not
/// use it after `udma_queue_destroy`, nor close it while another thread destroys the queue.
///
/// Errors: `UDMA_ERR_UNSUPPORTED` for a queue made with `UDMA_QUEUE_POLL`; `UDMA_ERR_SYSTEM`
/// when the process has no descriptor to spare.
///
/// # Safety
/// `fd` points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_interrupt_fd(
    queue: *const udma_queue,
    fd: *mut c_int,
) -> udma_status {
    call("udma_queue_interrupt_fd", || {
        let out = abi::out(fd, "fd")?;
        let raw = with_queue(queue, |entry, q| {
            let own = q.interrupt().ok_or_else(|| {
                Fail::new(
                    udma_status::UDMA_ERR_UNSUPPORTED,
                    "the queue was made with UDMA_QUEUE_POLL: it has no interrupt",
                )
            })?;
            // Under the queue's lock (locks: the queue, then its lent fd), so two calls lend
            // one number and a destroy finds it.
            let mut lent = entry.lent();
            // A number the caller closed (kcmp: not the eventfd any more) is forgotten, and a
            // new one lent; without kcmp the number is kept.
            if let Some(l) = lent.as_ref() {
                if l.is_still(own.as_fd()) == Some(false) {
                    *lent = None;
                }
            }
            if let Some(l) = lent.as_ref() {
                return Ok(l.fd);
            }
            let l = Lent::new(own.as_fd()).map_err(|e| {
                Fail::new(
                    udma_status::UDMA_ERR_SYSTEM,
                    format!(
                        "duplicating the queue's interrupt eventfd to lend it: {e} (close \
                         descriptors the process no longer needs, or raise RLIMIT_NOFILE)"
                    ),
                )
            })?;
            let raw = l.fd;
            *lent = Some(l);
            Ok(raw)
        })?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(raw) };
        Ok(())
    })
}

/// Asks the device to raise the queue's interrupt for its next completion (draining stale
/// signals first). `*ready` says a completion is there already: do not sleep then.
///
/// # Safety
/// `ready` points to a writable `bool`.
#[no_mangle]
pub unsafe extern "C" fn udma_queue_arm(queue: *mut udma_queue, ready: *mut bool) -> udma_status {
    call("udma_queue_arm", || {
        let out = abi::out(ready, "ready")?;
        let got = with_queue(queue, |_, q| q.arm_interrupt().map_err(lib))?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(got) };
        Ok(())
    })
}

/// Stops the device raising the queue's interrupt (after a wake-up).
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_queue_disarm(queue: *mut udma_queue) -> udma_status {
    call("udma_queue_disarm", || {
        with_queue(queue, |_, q| {
            q.disarm_interrupt();
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};

    use super::*;

    fn eventfd() -> OwnedFd {
        udma::irq::EventFd::new()
            .expect("an eventfd")
            .as_fd()
            .try_clone_to_owned()
            .expect("a duplicate")
    }

    /// With the wrong `kcmp_type` (`KCMP_VM` is 1, the process's memory, the same for every
    /// pair of our descriptors), two eventfds would compare equal.
    #[test]
    #[cfg_attr(miri, ignore = "Miri: kcmp(2) is a system call Miri does not emulate")]
    fn kcmp_file_compares_open_files() {
        let a = eventfd();
        let b = eventfd();
        let dup = a.try_clone().expect("a duplicate");
        let same = same_file(a.as_raw_fd(), dup.as_raw_fd())
            .expect("kcmp(2) refused here: this test needs it");
        assert!(same, "a duplicate is the same open file");
        assert_eq!(same_file(a.as_raw_fd(), b.as_raw_fd()), Some(false));
        let closed = b.as_raw_fd();
        drop(b);
        assert_eq!(
            same_file(a.as_raw_fd(), closed),
            Some(false),
            "a closed number"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: kcmp(2) is a system call Miri does not emulate")]
    fn a_lent_number_is_closed_at_give_back_only_while_it_is_still_the_eventfd() {
        let own = eventfd();
        let lent = Lent::new(own.as_fd()).expect("lent");
        assert_eq!(
            lent.is_still(own.as_fd()),
            Some(true),
            "kcmp(2) refused here: this test needs it"
        );
        let number = lent.fd;
        lent.give_back(own.as_fd());
        // Closed (or taken since by another test's file): no longer the eventfd.
        assert_eq!(same_file(number, own.as_raw_fd()), Some(false), "closed");

        // The caller closed it, and another file took the number (in one step, with dup3, so
        // that no other test's descriptor gets the number in between): left alone.
        let lent = Lent::new(own.as_fd()).expect("lent");
        let number = lent.fd;
        let other = eventfd();
        // SAFETY: dup3 onto the lent number, which nothing else owns (as a caller may do).
        let onto = unsafe { libc::dup3(other.as_raw_fd(), number, libc::O_CLOEXEC) };
        assert_eq!(onto, number);
        lent.give_back(own.as_fd());
        assert_eq!(
            same_file(number, other.as_raw_fd()),
            Some(true),
            "left open"
        );
        // SAFETY: `number` is the duplicate dup3 made, which nothing else owns.
        assert_eq!(unsafe { libc::close(number) }, 0);
    }
}
