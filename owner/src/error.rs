//! What a client's calls fail with.

use std::io;
use std::path::PathBuf;

use crate::{chan, proto};

/// A client's error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No owner at the socket.
    #[error(
        "cannot connect to a device owner at {path}: {source} (is one running? start it with \
         `userdma serve`, or wait for it with Client::connect_wait)"
    )]
    Connect {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A system call on the connection failed.
    #[error("{what} failed: {source}")]
    Io {
        /// What was done.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
    /// The owner sent a message this client cannot read.
    #[error("the owner's message was refused: {0}")]
    Proto(#[from] proto::ProtoError),
    /// The owner refused a request.
    #[error("the owner refused: {text}")]
    Owner {
        /// Its [`userdma::Code`] number.
        code: u32,
        /// Its message.
        text: String,
    },
    /// A message out of turn.
    #[error("expected {expected} from the owner, got {got}")]
    Unexpected {
        /// What was expected.
        expected: &'static str,
        /// What came.
        got: String,
    },
    /// The descriptors of the welcome.
    #[error("the owner's pool and rings: {0}")]
    Share(#[from] userdma::share::Error),
    /// The pool.
    #[error("the shared pool: {0}")]
    Pool(#[from] userdma::pool::Error),
    /// The DMA view of the pool.
    #[error("the shared pool's mapping: {0}")]
    Dma(#[from] userdma::dma::Error),
    /// The rings.
    #[error("the rings: {0}")]
    Rings(#[from] chan::Error),
    /// The submission ring is full.
    #[error(
        "the submission ring is full ({in_flight} frames taken and not completed, the owner \
         allows {limit}): take completions (Client::wait) before submitting more"
    )]
    Full {
        /// Frames out.
        in_flight: u32,
        /// The limit.
        limit: u32,
    },
    /// The owner went away.
    #[error(
        "the device owner closed the connection ({why}): reconnect with Client::connect_wait \
         once it is back"
    )]
    Gone {
        /// What was seen.
        why: &'static str,
    },
    /// Nothing within the time given.
    #[error("nothing from the owner within {0:?}")]
    Timeout(std::time::Duration),
    /// A stream this client did not declare.
    #[error("stream {stream} is not one of this client's (declare it first)")]
    Stream {
        /// The number given.
        stream: u32,
    },
    /// A buffer that cannot carry the frame.
    #[error(
        "the {what} buffer holds {len} bytes, the stream's model needs {needed}: allocate it \
         from Client::pool with at least that length"
    )]
    ShortBuffer {
        /// "input" or "result".
        what: &'static str,
        /// Its length.
        len: usize,
        /// The model's bytes.
        needed: u64,
    },
    /// A buffer of another pool.
    #[error("the {what} buffer is not from this client's pool (Client::pool)")]
    ForeignBuffer {
        /// "input" or "result".
        what: &'static str,
    },
}

impl Error {
    /// The error's [`userdma::Code`].
    pub fn code(&self) -> userdma::Code {
        use userdma::Code;
        match self {
            Error::Connect { .. } | Error::Gone { .. } => Code::NotFound,
            Error::Io { .. } => Code::System,
            Error::Proto(_) | Error::Unexpected { .. } | Error::Rings(_) => Code::Device,
            Error::Owner { code, .. } => code_of(*code),
            Error::Share(e) => e.code(),
            Error::Pool(e) => e.code(),
            Error::Dma(e) => e.code(),
            Error::Full { .. } => Code::Busy,
            Error::Timeout(_) => Code::Timeout,
            Error::Stream { .. } | Error::ShortBuffer { .. } | Error::ForeignBuffer { .. } => {
                Code::InvalidArgument
            }
        }
    }
}

/// The code with number `n` (an owner's), [`userdma::Code::Refused`] for one this build
/// does not know.
pub(crate) fn code_of(n: u32) -> userdma::Code {
    i32::try_from(n)
        .ok()
        .and_then(userdma::Code::from_raw)
        .unwrap_or(userdma::Code::Refused)
}
