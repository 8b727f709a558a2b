//! Why [`Scheduler::new`](super::Scheduler::new) refused its streams or policy: [`Error`].

/// Why [`Scheduler::new`](super::Scheduler::new) refused its streams or policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No streams.
    #[error("no streams: give the scheduler at least one stream")]
    NoStreams,
    /// More streams than [`MAX_STREAMS`](super::MAX_STREAMS).
    #[error(
        "{count} streams: a scheduler takes at most {max}; run one scheduler per device, or \
         merge streams that share a context"
    )]
    TooManyStreams {
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// `Batch { k: 0 }`.
    #[error(
        "batch switching with K = 0: K is how many frames a stream runs before another may, \
         use K >= 1 (K = 1 gives up the device after every frame)"
    )]
    ZeroBatch,
    /// A maximum wait of zero.
    #[error(
        "stream {stream:?}: a maximum wait of 0 would force every frame; give a positive \
         wait, or none for no maximum"
    )]
    ZeroMaxWait {
        /// The stream's name.
        stream: String,
    },
    /// A stream with an empty name.
    #[error("stream {index} has an empty name: name every stream, reports use the names")]
    EmptyName {
        /// Its index.
        index: usize,
    },
    /// Two streams with one name.
    #[error("streams {first} and {second} are both named {name:?}: give each stream its own name")]
    DuplicateName {
        /// The name.
        name: String,
        /// The first stream with it.
        first: usize,
        /// The second.
        second: usize,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](userdma::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> userdma::Code {
        match self {
            Error::NoStreams
            | Error::TooManyStreams { .. }
            | Error::ZeroBatch
            | Error::ZeroMaxWait { .. }
            | Error::EmptyName { .. }
            | Error::DuplicateName { .. } => userdma::Code::InvalidArgument,
        }
    }
}
