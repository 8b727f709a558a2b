//! Why `userdma demo transfers` fails, and its exit code.

use std::io;

use userdma::{memory, pool, ring};
use userdma_loopback::{self as loopback, StatusCode};

use crate::exit;

/// Why `userdma demo transfers` failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DemoError {
    /// Starting or driving the loopback device, its memory or its pool failed.
    #[error("the loopback device failed")]
    Runtime(#[from] userdma::Error),
    /// A queue operation failed.
    #[error("queue {queue} failed")]
    Ring {
        /// The queue.
        queue: u16,
        /// The cause.
        #[source]
        source: ring::Error,
    },
    /// A descriptor completed with an error status.
    #[error("transfer {transfer} on queue {queue}: the device completed a descriptor with status {code} ({})", code_name(*.code))]
    Failed {
        /// The queue.
        queue: u16,
        /// The transfer's number.
        transfer: u64,
        /// The status code.
        code: u16,
    },
    /// Data came back different from what was sent through the transform.
    #[error("transfer {transfer} on queue {queue}: byte {offset} came back wrong")]
    Corrupted {
        /// The queue.
        queue: u16,
        /// The transfer's number.
        transfer: u64,
        /// The first wrong byte.
        offset: usize,
    },
    /// The host's reference computation refused a transfer (its size is not a positive
    /// multiple of 4 bytes).
    #[error("cannot compute the expected bytes of a transfer on the host")]
    Reference(#[source] loopback::reference::Error),
    /// Reading or setting a thread's CPU affinity failed.
    #[error(
        "cannot restrict the host threads to CPUs {cpus:?}, away from the engine's: check \
         the CPUs this process may use (`taskset -p <pid>`), or pass --no-pin"
    )]
    Affinity {
        /// The CPUs asked for (empty: reading the allowed set failed).
        cpus: Vec<usize>,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Finding this executable (for `--process`) failed.
    #[error("cannot find this executable to run the device process")]
    Executable(#[source] io::Error),
    /// A host thread panicked.
    #[error("a host thread panicked")]
    Thread,
    /// Writing the output failed.
    #[error("cannot write the output")]
    Output(#[source] io::Error),
    /// Encoding JSON failed.
    #[error("cannot encode the output as JSON")]
    Json(#[source] serde_json::Error),
}

impl From<pool::Error> for DemoError {
    fn from(err: pool::Error) -> DemoError {
        DemoError::Runtime(err.into())
    }
}

impl From<userdma::device::Error> for DemoError {
    fn from(err: userdma::device::Error) -> DemoError {
        DemoError::Runtime(err.into())
    }
}

impl DemoError {
    /// The documented exit code for this failure.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            DemoError::Runtime(userdma::Error::Memory(memory::Error::Lock { .. })) => exit::REFUSED,
            _ => exit::FAILURE,
        }
    }
}

/// A status code's name.
fn code_name(code: u16) -> String {
    StatusCode::from_raw(code).map_or_else(|| "unknown".to_owned(), |c| format!("{c:?}"))
}
