//! Interrupts as eventfds, and waiting on many of them at once.
//!
//! A device's interrupt vector reaches user space as an [`EventFd`]: VFIO writes the eventfd
//! given to `VFIO_DEVICE_SET_IRQS` when the device raises MSI/MSI-X, UIO's `read` on the device
//! node plays the same role, and the loopback device's engine thread writes it directly. A
//! thread serving several hardware queues waits on all their eventfds with one [`Waiter`]
//! (io_uring, or epoll where io_uring is not allowed).

use std::io;
use std::os::fd::RawFd;
use std::path::PathBuf;

mod eventfd;
#[cfg(not(loom))]
pub(crate) mod reactor;
mod shim;
mod waiter;

pub use self::eventfd::EventFd;
pub use self::waiter::{Kind, Waiter};

/// What went wrong in this module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `eventfd(2)` failed.
    #[error("creating an eventfd failed: too many open files? (raise `ulimit -n`)")]
    Create {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Duplicating an eventfd failed.
    #[error("duplicating eventfd {fd} failed: too many open files? (raise `ulimit -n`)")]
    Duplicate {
        /// The fd duplicated.
        fd: RawFd,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A file descriptor given as an eventfd is something else.
    #[error(
        "fd {fd} is not an eventfd (it is {found:?}): pass the fd eventfd(2) returned, or one \
         duplicated from it"
    )]
    NotEventFd {
        /// The fd given.
        fd: RawFd,
        /// What `/proc/self/fd/<fd>` names.
        found: PathBuf,
    },

    /// What a file descriptor is could not be found out, or it could not be made nonblocking.
    #[error(
        "inspecting or configuring fd {fd} as an eventfd failed (reading /proc/self/fd: is /proc \
         mounted?)"
    )]
    Adopt {
        /// The fd given.
        fd: RawFd,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// Writing (signalling) an eventfd failed.
    #[error("signalling eventfd {fd} failed")]
    Signal {
        /// The eventfd.
        fd: RawFd,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Reading an eventfd failed.
    #[error("reading eventfd {fd} failed")]
    Read {
        /// The eventfd.
        fd: RawFd,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// `poll(2)` on an eventfd failed.
    #[error("waiting on eventfd {fd} with poll failed")]
    Poll {
        /// The eventfd.
        fd: RawFd,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// `io_uring_setup` failed.
    #[error("setting up an io_uring failed (ENOSYS: kernel without io_uring; EPERM: disabled by the `kernel.io_uring_disabled` sysctl or a seccomp filter): use `Waiter::with_epoll`, or `Waiter::new` which falls back to it")]
    RingSetup {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// An io_uring waiter was asked for in a build without the `io-uring` feature.
    #[error("this build of userdma has no io_uring waiter: build with the `io-uring` feature, or use `Waiter::with_epoll` (what `Waiter::new` gives in this build)")]
    IoUringNotBuilt,

    /// `epoll_create1` failed.
    #[error("creating an epoll instance failed: too many open files? (raise `ulimit -n`)")]
    EpollSetup {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Registering an fd with a waiter failed.
    #[error("registering fd {fd} under token {token} with the waiter failed")]
    Register {
        /// The caller's token.
        token: u64,
        /// The fd given.
        fd: RawFd,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// A token is already registered with the waiter.
    #[error("token {token} is already registered with this waiter: remove it first or use another token")]
    DuplicateToken {
        /// The token.
        token: u64,
    },

    /// A token is not registered with the waiter.
    #[error("token {token} is not registered with this waiter")]
    UnknownToken {
        /// The token.
        token: u64,
    },

    /// Removing a registration failed.
    #[error("removing token {token} from the waiter failed")]
    Deregister {
        /// The token.
        token: u64,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// Waiting failed.
    #[error("waiting for interrupts with {kind} failed")]
    Wait {
        /// The mechanism.
        kind: Kind,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// The background thread that wakes futures could not be started.
    #[error("starting the interrupt reactor thread failed")]
    Reactor {
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::Duplicate { .. } | Error::DuplicateToken { .. } | Error::NotEventFd { .. } => {
                Code::InvalidArgument
            }
            Error::UnknownToken { .. } => Code::NotFound,
            Error::IoUringNotBuilt => Code::Unsupported,
            Error::Create { .. }
            | Error::Adopt { .. }
            | Error::Signal { .. }
            | Error::Read { .. }
            | Error::Poll { .. }
            | Error::RingSetup { .. }
            | Error::EpollSetup { .. }
            | Error::Register { .. }
            | Error::Deregister { .. }
            | Error::Wait { .. }
            | Error::Reactor { .. } => Code::System,
        }
    }
}
