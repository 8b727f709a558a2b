//! The crate's one [`Error`]: every module's error converts into it with `?`, and
//! [`Error::code`] gives a stable number for it ([`Code`], what the C API returns).
//!
//! Each module keeps its own error enum (one variant per failing operation, with the addresses,
//! sizes and causes involved); this type wraps them without losing anything, so
//! `std::error::Error::source` walks down to the system call that failed.

use crate::{device, dma, irq, memory, mmio, pci, pool, ring, stage};

/// Any failure of the crate. Its `Display` is the failing module's message; the cause chain is
/// intact.
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
    /// A setting out of range (a pipeline depth, a model that does not fit its arena).
    #[error("{what}: {hint}")]
    Invalid {
        /// What is wrong.
        what: String,
        /// What to do.
        hint: &'static str,
    },
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
    /// In use: a queue already open, a device held by another process.
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

impl Error {
    /// The kind of failure, as a stable number.
    pub fn code(&self) -> Code {
        match self {
            Error::Pci(e) => pci_code(e),
            Error::Memory(e) => memory_code(e),
            Error::Dma(e) => dma_code(e),
            Error::Mmio(e) => mmio_code(e),
            Error::Irq(e) => irq_code(e),
            Error::Device(e) => device_code(e),
            Error::Ring(e) => ring_code(e),
            Error::Pool(e) => pool_code(e),
            Error::Stage(e) => stage_code(e),
            Error::Unsupported { .. } => Code::Unsupported,
            Error::Invalid { .. } => Code::InvalidArgument,
        }
    }
}

impl<D, T> From<ring::Rejected<D, T>> for Error {
    /// Keeps the cause; the descriptor and payload are dropped (take them from the
    /// [`ring::Rejected`] first to keep them).
    fn from(rejected: ring::Rejected<D, T>) -> Error {
        Error::Ring(rejected.error)
    }
}

impl From<stage::Refused> for Error {
    /// Keeps the reason; the buffer goes back to its pool.
    fn from(refused: stage::Refused) -> Error {
        Error::Stage(refused.error)
    }
}

fn stage_code(e: &stage::Error) -> Code {
    use stage::Error as E;
    match e {
        E::Depth { .. }
        | E::Misaligned { .. }
        | E::Empty
        | E::Offset { .. }
        | E::NotRegistered { .. }
        | E::ReadOnly { .. }
        | E::Length { .. }
        | E::NotAStream { .. }
        | E::ShortFrame { .. }
        | E::InPlaceResult { .. }
        | E::ShortRead { .. }
        | E::Eof { .. } => Code::InvalidArgument,
        E::Unavailable { .. } | E::DirectUnsupported { .. } => Code::Unsupported,
        E::Disabled { .. } | E::MemlockLimit { .. } | E::Register { .. } => Code::Refused,
        E::TooManyFixedBuffers { .. } | E::Full { .. } => Code::Exhausted,
        E::Open { source, .. } | E::Stat { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Code::NotFound
        }
        _ => Code::System,
    }
}

fn pci_code(e: &pci::Error) -> Code {
    use pci::Error as E;
    match e {
        E::NotFound { .. } | E::NoPciBus { .. } => Code::NotFound,
        _ => Code::System,
    }
}

fn memory_code(e: &memory::Error) -> Code {
    use memory::Error as E;
    match e {
        E::InvalidLength { .. } | E::UnsupportedPageSize { .. } | E::NotHugetlbfs { .. } => {
            Code::InvalidArgument
        }
        E::HugepagesUnavailable { .. }
        | E::ReserveShort { .. }
        | E::HostMemory { .. }
        | E::HostAlloc { .. } => Code::Exhausted,
        E::Lock { .. } => Code::Refused,
        E::NoSuchPool { .. } | E::NoSuchNode { .. } => Code::NotFound,
        E::NotContiguous { .. } | E::PhysicalAddressHidden => Code::Unsupported,
        _ => Code::System,
    }
}

fn dma_code(e: &dma::Error) -> Code {
    use dma::Error as E;
    match e {
        E::InvalidDmaMask { .. }
        | E::InvalidIovaRequest { .. }
        | E::OutOfBounds { .. }
        | E::Misaligned { .. }
        | E::BeyondMask { .. } => Code::InvalidArgument,
        E::IovaExhausted { .. } | E::MappingLimit { .. } => Code::Exhausted,
        E::UnknownIova { .. } => Code::NotFound,
        E::Refused { .. } => Code::Refused,
        E::NotShareable { .. } | E::IommuPageSize { .. } => Code::Unsupported,
        _ => Code::System,
    }
}

fn mmio_code(e: &mmio::Error) -> Code {
    use mmio::Error as E;
    match e {
        E::OutOfBounds { .. } | E::Misaligned { .. } | E::UnalignedBase { .. } => {
            Code::InvalidArgument
        }
        _ => Code::System,
    }
}

fn irq_code(e: &irq::Error) -> Code {
    use irq::Error as E;
    match e {
        E::Duplicate { .. } | E::DuplicateToken { .. } | E::NotEventFd { .. } => {
            Code::InvalidArgument
        }
        E::UnknownToken { .. } => Code::NotFound,
        _ => Code::System,
    }
}

fn device_code(e: &device::Error) -> Code {
    use device::Error as E;
    match e {
        E::DeviceMemoryRange { .. } | E::QueueDepth { .. } => Code::InvalidArgument,
        E::NoSuchQueue { .. }
        | E::NoSuchBar { .. }
        | E::NoBar { .. }
        | E::NoSuchVector { .. }
        | E::NotBound { .. }
        | E::WrongDriver { .. } => Code::NotFound,
        E::QueueBusy { .. } => Code::Busy,
        E::Removed { .. } => Code::Removed,
        E::Driver { .. } => Code::Device,
        E::Timeout { .. } => Code::Timeout,
        E::NoReset { .. } => Code::Unsupported,
        E::DeviceMemoryExhausted { .. } => Code::Exhausted,
        E::Memory { source, .. } => memory_code(source),
        E::Map { source, .. } => dma_code(source),
        E::Ring { source, .. } => ring_code(source),
        E::Sysfs { source, .. } => pci_code(source),
        E::Loopback(e) => loopback_code(e),
        E::Vfio(e) => vfio_code(e),
        E::Uio(e) => uio_code(e),
        _ => Code::System,
    }
}

fn loopback_code(e: &device::loopback::Error) -> Code {
    use device::loopback::Error as E;
    match e {
        E::Config { .. } => Code::InvalidArgument,
        E::QueueFault { .. } | E::Stopped { .. } | E::Protocol { .. } => Code::Device,
        _ => Code::System,
    }
}

fn vfio_code(e: &device::vfio::Error) -> Code {
    use device::vfio::Error as E;
    match e {
        E::NoSuchIrq { .. } | E::NoGroup { .. } => Code::NotFound,
        E::NoIommuRefused { .. } | E::GroupNotViable { .. } => Code::Refused,
        E::Unsupported { .. } | E::NotMaskable { .. } => Code::Unsupported,
        E::MalformedRegion { .. } => Code::Device,
        _ => Code::System,
    }
}

fn uio_code(e: &device::uio::Error) -> Code {
    use device::uio::Error as E;
    match e {
        E::NoUioNode { .. } => Code::NotFound,
        E::IommuTranslates { .. } => Code::Refused,
        _ => Code::System,
    }
}

fn ring_code(e: &ring::Error) -> Code {
    use ring::Error as E;
    match e {
        E::InvalidDepth { .. }
        | E::EntryType { .. }
        | E::MisalignedMemory { .. }
        | E::MemoryRange { .. }
        | E::NotContiguous { .. }
        | E::InvalidAlign { .. }
        | E::PartAlign { .. }
        | E::MemoryTooSmall { .. }
        | E::DoorbellOffset { .. }
        | E::SameDoorbell { .. } => Code::InvalidArgument,
        E::Full { .. } | E::NoCommandId { .. } | E::CqFull { .. } => Code::Exhausted,
        E::Timeout { .. } => Code::Timeout,
        E::Stalled { .. } => Code::Timeout,
        E::Removed { .. } => Code::Removed,
        E::UnknownCommand { .. }
        | E::LostCompletion { .. }
        | E::DuplicateCompletion { .. }
        | E::WrongCommand { .. }
        | E::Faulted { .. }
        | E::DeviceSqHead { .. }
        | E::CompletionSqHead { .. }
        | E::HostSqTail { .. }
        | E::HostCqHead { .. } => Code::Device,
        _ => Code::System,
    }
}

fn pool_code(e: &pool::Error) -> Code {
    use pool::Error as E;
    match e {
        E::Config { .. }
        | E::ArenaTooSmall { .. }
        | E::ArenaTooLarge { .. }
        | E::Misaligned { .. }
        | E::NotContiguous { .. }
        | E::Length { .. }
        | E::TooLarge { .. }
        | E::Unbatchable { .. }
        | E::BatchFull { .. } => Code::InvalidArgument,
        E::Exhausted { .. } => Code::Exhausted,
        E::NotShareable | E::NotAPool { .. } | E::Version { .. } | E::Incompatible { .. } => {
            Code::Unsupported
        }
        E::CacheSlots { .. } => Code::System,
        E::Access(e) => dma_code(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_errors_convert_with_their_codes_and_messages() {
        let e: Error = pool::Error::Exhausted {
            len: 4096,
            waited: std::time::Duration::ZERO,
        }
        .into();
        assert_eq!(e.code(), Code::Exhausted);
        let e: Error = device::Error::QueueBusy { queue: 3 }.into();
        assert_eq!((e.code(), e.code().raw()), (Code::Busy, 4));
        assert!(e.to_string().contains('3'), "{e}");
        let e: Error = dma::Error::InvalidDmaMask { bits: 99 }.into();
        assert_eq!(e.code(), Code::InvalidArgument);
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
        assert!(boxed.to_string().contains("99"));
    }
}
