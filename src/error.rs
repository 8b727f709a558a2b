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
//! The inference layer (the `userdma-infer` package) has an error of its own that wraps this
//! one beside the planner's, the pipeline's, the scheduler's and staging's.

#[cfg(not(loom))]
use crate::{device, dma, dmabuf, fence, irq, memory, mmio, pci, pool, ring, share};

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
    /// A dma-buf export or import.
    #[error(transparent)]
    DmaBuf(#[from] dmabuf::Error),
    /// A fence.
    #[error(transparent)]
    Fence(#[from] fence::Error),
    /// Passing descriptors to another process.
    #[error(transparent)]
    Share(#[from] share::Error),
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
}

/// What kind of failure an [`Error`] is: stable numbers, never reused (new kinds get new
/// numbers). 0 is success in the C API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
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
    /// Every code, in number order.
    pub const ALL: [Code; 10] = [
        Code::InvalidArgument,
        Code::NotFound,
        Code::Refused,
        Code::Busy,
        Code::Exhausted,
        Code::Timeout,
        Code::Device,
        Code::Unsupported,
        Code::System,
        Code::Removed,
    ];

    /// The number.
    pub fn raw(self) -> i32 {
        self as i32
    }

    /// The code numbered `n` (one another process or an older build sent), if there is one.
    pub fn from_raw(n: i32) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.raw() == n)
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
            Error::DmaBuf(e) => e.code(),
            Error::Fence(e) => e.code(),
            Error::Share(e) => e.code(),
            Error::Unsupported { .. } => Code::Unsupported,
        }
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

#[cfg(all(test, not(loom)))]
mod tests;
