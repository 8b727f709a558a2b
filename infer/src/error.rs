//! The inference layer's one [`Error`]: a driver failure ([`userdma::Error`], passed through
//! whole) or a refusal of this layer's own (the planner's, a model's, a pipeline's, a
//! scheduler's, the streams', staging's), or the caller's own failure from a callback.
//! [`Error::code`] gives the same stable [`Code`] numbers as the driver.
//!
//! Each module's error gives its `Code` beside its enum, exhaustively; the planner's is given
//! here ([`plan_code`]) because the `userdma-plan` package depends on nothing of the driver,
//! not even [`Code`].

use userdma::{device, dma, dmabuf, fence, irq, memory, mmio, pci, pool, ring, share, Code};

use crate::{pipeline, plan, sched, stage};

/// Any failure of the inference layer. Its `Display` is the failing module's message; the
/// cause chain is intact.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The driver failed (a device, a DMA space, a pool, a ring, ...).
    #[error(transparent)]
    Driver(#[from] userdma::Error),
    /// Staging files through io_uring.
    #[error(transparent)]
    Stage(#[from] stage::Error),
    /// The planner refused its tensors or options.
    #[error(transparent)]
    Plan(#[from] plan::Error),
    /// A model the pipeline cannot run.
    #[error(transparent)]
    Model(#[from] pipeline::ModelError),
    /// A pipeline setting out of range (a depth, a batch, queues), or a request outside a
    /// result.
    #[error(transparent)]
    Pipeline(#[from] pipeline::Error),
    /// A scheduler refused its streams or policy.
    #[error(transparent)]
    Sched(#[from] sched::Error),
    /// Streams on devices refused their streams or settings.
    #[error(transparent)]
    Streams(#[from] sched::streams::Error),
    /// The caller's own code failed: a `preprocess` or fill callback ([`Pipeline::try_submit`],
    /// [`Streams::run`]) returned this for a reason of its own (a camera frame that did not
    /// come, a file that would not read), handed back as it was. Its code is
    /// [`Code::InvalidArgument`]: the frame's input could not be made; match the variant for
    /// the cause.
    ///
    /// [`Pipeline::try_submit`]: crate::pipeline::Pipeline::try_submit
    /// [`Streams::run`]: crate::sched::streams::Streams::run
    #[error("{0}")]
    Caller(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A trace ([`crate::trace::Trace::save`]) could not be written to its file. Its code is
    /// [`Code::System`].
    #[error(
        "could not write the trace to {}: {error} (check that its directory exists and is \
         writable)",
        path.display()
    )]
    Trace {
        /// The file.
        path: std::path::PathBuf,
        /// What the system said (in the message, not a `source`: a one-line chain would say
        /// it twice).
        error: std::io::Error,
    },
}

impl Error {
    /// The caller's own failure, from a callback ([`Error::Caller`]).
    pub fn caller(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Error {
        Error::Caller(error.into())
    }

    /// The kind of failure, as a stable number: the wrapped error's own code.
    pub fn code(&self) -> Code {
        match self {
            Error::Driver(e) => e.code(),
            Error::Stage(e) => e.code(),
            Error::Plan(e) => plan_code(e),
            Error::Model(e) => e.code(),
            Error::Pipeline(e) => e.code(),
            Error::Sched(e) => e.code(),
            Error::Streams(e) => e.code(),
            Error::Caller(_) => Code::InvalidArgument,
            Error::Trace { .. } => Code::System,
        }
    }

    /// The driver's error, when it is one.
    pub fn as_driver(&self) -> Option<&userdma::Error> {
        match self {
            Error::Driver(e) => Some(e),
            _ => None,
        }
    }
}

/// A driver module's error converts straight into this one (through [`userdma::Error`]), so
/// `?` works on driver calls inside the inference layer and in programs that use it.
macro_rules! through_driver {
    ($($module:ident),*) => {$(
        impl From<$module::Error> for Error {
            fn from(e: $module::Error) -> Error {
                Error::Driver(e.into())
            }
        }
    )*};
}
through_driver!(device, dma, dmabuf, fence, irq, memory, mmio, pci, pool, ring, share);

impl<D, T> From<ring::Rejected<D, T>> for Error {
    /// Keeps the cause; the descriptor and payload are dropped (take them from the
    /// [`ring::Rejected`] first to keep them).
    fn from(rejected: ring::Rejected<D, T>) -> Error {
        Error::Driver(rejected.into())
    }
}

impl From<stage::Refused> for Error {
    /// Keeps the reason; the buffer goes back to its pool.
    fn from(refused: stage::Refused) -> Error {
        Error::Stage(refused.error)
    }
}

/// The code of a planner's refusal ([`plan::Error`]), given here because `userdma-plan`
/// depends on nothing of the driver. Exhaustive like a module's own `code()`: `plan::Error` is
/// not `#[non_exhaustive]`, so a new planner variant fails to compile here until it has its
/// code. Every one is a refusal of the caller's tensors or options.
pub fn plan_code(e: &plan::Error) -> Code {
    use plan::Error as E;
    match e {
        E::TooManyTensors { .. }
        | E::Alignment { .. }
        | E::ZeroSize { .. }
        | E::Interval { .. }
        | E::DuplicateId { .. }
        | E::UnknownInput { .. }
        | E::Misaligned { .. }
        | E::FixedCollision { .. }
        | E::Overflow { .. } => Code::InvalidArgument,
    }
}

#[cfg(test)]
mod tests;
