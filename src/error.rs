//! The crate's one [`Error`]: every module's error converts into it with `?`, and
//! [`Error::code`] gives a stable number for it ([`Code`], what the C API returns).
//!
//! Each module keeps its own error enum (one variant per failing operation, with the addresses,
//! sizes and causes involved) and gives each variant's [`Code`] beside it: a `code()` next to
//! the enum, an exhaustive match naming every variant, so that a new variant cannot silently
//! become [`Code::System`]; a variant that wraps another module's error asks that error. This
//! type wraps them without losing anything, so `std::error::Error::source` walks down to the
//! system call that failed, and [`Error::code`] asks the wrapped error for its code.
//!
//! The planner's error is the one exception: the `userdma-plan` package depends on nothing of
//! this crate (not even [`Code`]), so its codes are given here, by [`plan_code`], as
//! exhaustively.

#[cfg(not(loom))]
use crate::{device, dma, irq, memory, mmio, pci, pipeline, plan, pool, ring, sched, stage};

/// Any failure of the crate. Its `Display` is the failing module's message; the cause chain is
/// intact.
#[cfg(not(loom))]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// PCI discovery or binding.
    #[error(transparent)]
    Pci(#[from] pci::Error),
    /// Pinned host memory.
    #[error(transparent)]
    Memory(#[from] memory::Error),
    /// A DMA address space.
    #[error(transparent)]
    Dma(#[from] dma::Error),
    /// Register access.
    #[error(transparent)]
    Mmio(#[from] mmio::Error),
    /// Interrupts.
    #[error(transparent)]
    Irq(#[from] irq::Error),
    /// A device backend.
    #[error(transparent)]
    Device(#[from] device::Error),
    /// A descriptor ring.
    #[error(transparent)]
    Ring(#[from] ring::Error),
    /// The buffer pool.
    #[error(transparent)]
    Pool(#[from] pool::Error),
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
    /// A runtime asked for something its device does not have.
    #[error("{device} has no {what}: {hint}")]
    Unsupported {
        /// The device.
        device: String,
        /// What it lacks.
        what: &'static str,
        /// What to do instead.
        hint: &'static str,
    },
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
}

#[cfg(not(loom))]
impl Error {
    /// The caller's own failure, from a callback ([`Error::Caller`]).
    pub fn caller(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Error {
        Error::Caller(error.into())
    }
}

/// What kind of failure an [`Error`] is: stable numbers, never reused (new kinds get new
/// numbers). 0 is success in the C API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[repr(i32)]
pub enum Code {
    /// An argument or configuration out of range, malformed input.
    InvalidArgument = 1,
    /// No such device, BAR, queue, vector, mapping or pool.
    NotFound = 2,
    /// Refused: permission, an IOMMU group not viable, a policy (no-IOMMU not allowed).
    Refused = 3,
    /// In use: a queue already open, a device held by another process, an IOVA range taken.
    Busy = 4,
    /// Out of something: buffers, IOVA space, device memory, ring slots, hugepages.
    Exhausted = 5,
    /// A wait passed its deadline.
    Timeout = 6,
    /// The device misbehaved: a fault, an error completion, a protocol violation, it stopped.
    Device = 7,
    /// The device or kernel cannot do it.
    Unsupported = 8,
    /// A system call failed for another reason.
    System = 9,
    /// The device was removed (hot-unplugged, unbound, asked back by the kernel): drop what
    /// uses it and open it again once it is back.
    Removed = 10,
}

impl Code {
    /// The number.
    pub fn raw(self) -> i32 {
        self as i32
    }
}

#[cfg(not(loom))]
impl Error {
    /// The kind of failure, as a stable number: the wrapped module error's own code.
    pub fn code(&self) -> Code {
        match self {
            Error::Pci(e) => e.code(),
            Error::Memory(e) => e.code(),
            Error::Dma(e) => e.code(),
            Error::Mmio(e) => e.code(),
            Error::Irq(e) => e.code(),
            Error::Device(e) => e.code(),
            Error::Ring(e) => e.code(),
            Error::Pool(e) => e.code(),
            Error::Stage(e) => e.code(),
            Error::Plan(e) => plan_code(e),
            Error::Model(e) => e.code(),
            Error::Pipeline(e) => e.code(),
            Error::Sched(e) => e.code(),
            Error::Streams(e) => e.code(),
            Error::Unsupported { .. } => Code::Unsupported,
            Error::Caller(_) => Code::InvalidArgument,
        }
    }
}

/// The code of a planner's refusal ([`plan::Error`]), given here because `userdma-plan`
/// depends on nothing of this crate. Exhaustive like a module's own `code()`: `plan::Error` is
/// not `#[non_exhaustive]`, so a new planner variant fails to compile here until it has its
/// code. Every one is a refusal of the caller's tensors or options.
#[cfg(not(loom))]
pub(crate) fn plan_code(e: &plan::Error) -> Code {
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

#[cfg(not(loom))]
impl<D, T> From<ring::Rejected<D, T>> for Error {
    /// Keeps the cause; the descriptor and payload are dropped (take them from the
    /// [`ring::Rejected`] first to keep them).
    fn from(rejected: ring::Rejected<D, T>) -> Error {
        Error::Ring(rejected.error)
    }
}

#[cfg(not(loom))]
impl From<stage::Refused> for Error {
    /// Keeps the reason; the buffer goes back to its pool.
    fn from(refused: stage::Refused) -> Error {
        Error::Stage(refused.error)
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
