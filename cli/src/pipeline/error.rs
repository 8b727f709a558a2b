//! Why `userdma pipeline` (and the case study, which shares its errors) fails, and its exit
//! code.

use userdma_infer::pipeline;
use userdma_infer::stats;

use crate::exit;

/// Why the command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The library failed.
    #[error(transparent)]
    Library(#[from] userdma_infer::Error),
    /// The model could not be built.
    #[error(transparent)]
    Model(#[from] pipeline::ModelError),
    /// Some frames came back wrong.
    #[error("{wrong} of {frames} frames came back wrong (first: frame {first}); the device or the plan is broken")]
    Wrong {
        /// Wrong frames.
        wrong: u64,
        /// Frames run.
        frames: u64,
        /// The first wrong one.
        first: u64,
    },
    /// Writing the output failed.
    #[error("cannot write the output")]
    Output(#[from] std::io::Error),
    /// Writing a file an option names failed.
    #[error(
        "cannot write {option} file {}: {error} (give a path in a directory you may write to)",
        path.display()
    )]
    WriteFile {
        /// The option (`--metrics`).
        option: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// Why (in the message, not a `source`, which the one-line chain would repeat).
        error: std::io::Error,
    },
    /// Drawing a plot failed.
    #[error(transparent)]
    Plot(#[from] stats::Error),
    /// Encoding JSON failed.
    #[error("cannot encode the output as JSON")]
    Json(#[from] serde_json::Error),
    /// Two `--stream`s with one name.
    #[error("two streams named {name:?}: give each --stream its own name")]
    DuplicateStream {
        /// The name.
        name: String,
    },
    /// More streams on one device than the case study gives queues.
    #[error(
        "{count} streams on one device: a device takes at most {max}: use fewer streams or more \
         --devices"
    )]
    StreamsPerDevice {
        /// Streams on the busiest device.
        count: usize,
        /// The most one device takes.
        max: usize,
    },
    /// More streams than one run schedules.
    #[error(
        "{count} streams: a run of the case schedules at most {max} in all (the before run \
         puts every stream under one round-robin scheduler, whatever --devices): give at most \
         {max}"
    )]
    TooManyStreams {
        /// Streams given.
        count: usize,
        /// The most a run takes.
        max: usize,
    },
    /// The scheduler refused the streams or the policy the options make. (Its message is
    /// this one's start: not a `source`, which would repeat it in the one-line chain.)
    #[error("{0}: change --k, --max-wait-ms or the streams")]
    Schedule(userdma_infer::sched::Error),
    /// The device owner (`serve`) or a client of it failed.
    #[error("{0}")]
    Owner(String),
    /// Options that cannot go together or that the command does not take (what to do is in
    /// the message).
    #[error("{0}")]
    Usage(String),
    /// A client of the device owner failed.
    #[error(transparent)]
    Client(#[from] userdma_owner::Error),
}

impl From<userdma::pool::Error> for Error {
    fn from(e: userdma::pool::Error) -> Error {
        Error::Library(userdma::Error::from(e).into())
    }
}

impl From<userdma::Error> for Error {
    fn from(e: userdma::Error) -> Error {
        Error::Library(e.into())
    }
}

impl Error {
    /// The exit code: 1 for wrong frames and library failures, 2 for a model that cannot be
    /// built from the arguments, streams or a policy the options make wrong, and a library
    /// failure that is a bad argument.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Error::Model(_)
            | Error::DuplicateStream { .. }
            | Error::StreamsPerDevice { .. }
            | Error::TooManyStreams { .. }
            | Error::Usage(_)
            | Error::Schedule(_) => exit::USAGE,
            Error::Library(e) if e.code() == userdma::Code::InvalidArgument => exit::USAGE,
            _ => exit::FAILURE,
        }
    }
}
