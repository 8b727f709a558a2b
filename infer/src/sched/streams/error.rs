//! Why [`Streams`](super::Streams) refused its streams or settings: [`Error`].

use std::fmt;
use std::time::Duration;

/// Why [`Streams::new`](super::Streams::new) or
/// [`Streams::with_recovery`](super::Streams::with_recovery) refused its input (converts into
/// [`crate::Error`]). Each variant names the stream or the setting and says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An `in_flight` of 0.
    #[error(
        "0 frames in flight: allow at least 1 frame on the device (1 keeps the scheduler's \
         bounds)"
    )]
    ZeroInFlight,
    /// No streams.
    #[error("no streams: give Streams::new at least one stream")]
    NoStreams,
    /// A stream whose context is not its pipeline's.
    #[error(
        "stream {stream:?} in context {context} over a pipeline in context {pipeline}: build \
         each stream's pipeline with Config::context equal to its spec's"
    )]
    Context {
        /// The stream's name.
        stream: String,
        /// Its spec's context.
        context: u32,
        /// Its pipeline's context.
        pipeline: u32,
    },
    /// A periodic stream with a period of 0.
    #[error(
        "stream {stream:?} with a period of 0 ns: give a periodic stream a period of at least \
         1 ns, or make it Asap"
    )]
    ZeroPeriod {
        /// The stream's name.
        stream: String,
    },
    /// Two streams with one name (over all devices; indices in the order given).
    #[error(
        "streams {first} and {second} are both named {name:?}: give each stream its own name, \
         reports use the names"
    )]
    DuplicateName {
        /// The name.
        name: String,
        /// The first stream with it.
        first: usize,
        /// The second.
        second: usize,
    },
    /// A device's scheduler refused its streams or the policy.
    #[error("{}{source}", OnDevice(*device))]
    Scheduler {
        /// The device, in the order its first stream was given (`None` when every stream is
        /// on one device).
        device: Option<usize>,
        /// What the scheduler refused, and what to change.
        #[source]
        source: crate::sched::Error,
    },
    /// A recovery that allows no fault or no reset.
    #[error(
        "a recovery with max_faults {max_faults} and max_resets {max_resets}: allow at least 1 \
         fault in a row and 1 reset per fault"
    )]
    Recovery {
        /// [`Recovery::max_faults`](super::Recovery::max_faults).
        max_faults: u32,
        /// [`Recovery::max_resets`](super::Recovery::max_resets).
        max_resets: u32,
    },
    /// A back-off of 0 or longer than its maximum.
    #[error(
        "a back-off of {backoff:?} with a maximum of {max_backoff:?}: give a back-off above 0 \
         and at most max_backoff (10 ms and 1 s by default)"
    )]
    Backoff {
        /// The first back-off asked for ([`Recovery`](super::Recovery)`::backoff`).
        backoff: Duration,
        /// The longest ([`Recovery::max_backoff`](super::Recovery::max_backoff)).
        max_backoff: Duration,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](userdma::Code); a scheduler's refusal gives its
    /// own. Exhaustive: a new variant must be given its code here.
    pub fn code(&self) -> userdma::Code {
        match self {
            Error::ZeroInFlight
            | Error::NoStreams
            | Error::Context { .. }
            | Error::ZeroPeriod { .. }
            | Error::DuplicateName { .. }
            | Error::Recovery { .. }
            | Error::Backoff { .. } => userdma::Code::InvalidArgument,
            Error::Scheduler { source, .. } => source.code(),
        }
    }
}

/// `device N: ` before a scheduler's message when there are several devices.
struct OnDevice(Option<usize>);

impl fmt::Display for OnDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(device) => write!(f, "device {device}: "),
            None => Ok(()),
        }
    }
}
