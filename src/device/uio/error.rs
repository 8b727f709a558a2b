//! What goes wrong opening and driving a UIO device: [`Error`].

use std::io;
use std::path::PathBuf;

use crate::pci;

/// What went wrong in a UIO device (converts into [`device::Error`](crate::device::Error)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A UIO operation failed.
    #[error("{operation} on {} ({bdf}) failed", path.display())]
    Node {
        /// The device.
        bdf: pci::Bdf,
        /// The file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// A device bound to uio_pci_generic has no UIO node.
    #[error("{bdf} has no UIO node under {}: is it bound to uio_pci_generic (`userdma bind {bdf} --driver uio_pci_generic`)?", dir.display())]
    NoUioNode {
        /// The device.
        bdf: pci::Bdf,
        /// Where the node's name was looked for.
        dir: PathBuf,
    },

    /// Physical-address DMA refused because the IOMMU translates the device.
    #[error("{bdf} is in IOMMU group {group} with a translating {domain} domain: physical addresses would fault; boot with iommu=pt (passthrough) for UIO, or bind to vfio-pci (`userdma bind {bdf} --driver vfio-pci`)")]
    IommuTranslates {
        /// The device.
        bdf: pci::Bdf,
        /// The group.
        group: u32,
        /// The domain type (`DMA`, `DMA-FQ`).
        domain: String,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::NoUioNode { .. } => Code::NotFound,
            Error::IommuTranslates { .. } => Code::Refused,
            Error::Node { .. } => Code::System,
        }
    }
}
