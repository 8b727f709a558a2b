//! What goes wrong opening and driving a VFIO device: [`Error`].

use std::io;
use std::path::PathBuf;

use crate::pci;

/// What went wrong in a VFIO device (converts into [`device::Error`](crate::device::Error)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Opening or querying the VFIO container failed.
    #[error("{operation} on the VFIO container {} failed: is the vfio module loaded, and may this user open it (root, or the udev rules)?", path.display())]
    Container {
        /// The container node.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// The device is in no IOMMU group and no no-IOMMU group either.
    #[error("{bdf} is in no IOMMU group: boot with the IOMMU on (intel_iommu=on / amd_iommu=on), or load vfio with enable_unsafe_noiommu_mode=1 and open with Options::allow_noiommu(true); then bind it to vfio-pci again")]
    NoGroup {
        /// The device.
        bdf: pci::Bdf,
    },

    /// The device is in a no-IOMMU group and the caller did not opt in.
    #[error("{bdf} is in VFIO no-IOMMU group {group}: its DMA is neither translated nor isolated; opt in with vfio::Options::allow_noiommu(true) (CLI: --allow-noiommu) if that is what you want")]
    NoIommuRefused {
        /// The device.
        bdf: pci::Bdf,
        /// The group number.
        group: u32,
    },

    /// Another member of the device's IOMMU group is bound to a host driver.
    #[error("IOMMU group {group} of {bdf} is not viable: {} bound to a host driver; {}", culprit_list(.culprits), bind_hint(.culprits))]
    GroupNotViable {
        /// The device.
        bdf: pci::Bdf,
        /// The group number.
        group: u32,
        /// The members in the way and their drivers (empty when only the kernel said so).
        culprits: Vec<(pci::Bdf, String)>,
    },

    /// The VFIO container does not speak the API version or IOMMU model needed.
    #[error("the VFIO container {} {what}: is the vfio module (and vfio_iommu_type1) loaded and current?", path.display())]
    Unsupported {
        /// The container node.
        path: PathBuf,
        /// What it lacks.
        what: String,
    },

    /// A VFIO ioctl failed.
    #[error("{ioctl} for {bdf} failed: {}", ioctl_hint(.ioctl))]
    Ioctl {
        /// The device.
        bdf: pci::Bdf,
        /// The ioctl.
        ioctl: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// The kernel's description of a region could not be parsed.
    #[error("VFIO region {index} of {bdf}: malformed VFIO_DEVICE_GET_REGION_INFO reply: {defect}")]
    MalformedRegion {
        /// The device.
        bdf: pci::Bdf,
        /// The region index.
        index: u32,
        /// What is wrong.
        defect: super::RegionDefect,
    },

    /// A device shares a container whose DMA space was made for a wider DMA mask.
    #[error("{bdf} needs a {wanted}-bit DMA mask but its shared container's DMA space was made for {space} bits: open the device with the narrowest mask first, or give it its own container")]
    ContainerMask {
        /// The device.
        bdf: pci::Bdf,
        /// The device's mask width.
        wanted: u32,
        /// The space's mask width.
        space: u32,
    },

    /// A shared container is already set to the other IOMMU model (type1 vs no-IOMMU).
    #[error("{bdf} cannot join a container set to {model}: give it its own container")]
    ContainerModel {
        /// The device.
        bdf: pci::Bdf,
        /// The container's model.
        model: &'static str,
    },

    /// Mapping part of a BAR failed.
    #[error("mapping {len:#x} bytes at {offset:#x} of region {index} of {bdf} failed: is the BAR memory (not I/O ports) and enabled?")]
    MapBar {
        /// The device.
        bdf: pci::Bdf,
        /// The region index.
        index: u32,
        /// The offset in the region.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// More interrupt vectors than the device offers, or a kind it lacks.
    #[error("{bdf} offers {available} {kind} vectors, {requested} asked for: ask for at most {available} (or another kind; `userdma info {bdf}` lists them)")]
    NoSuchIrq {
        /// The device.
        bdf: pci::Bdf,
        /// The kind.
        kind: super::IrqKind,
        /// How many were asked for.
        requested: u32,
        /// How many the device has.
        available: u32,
    },

    /// Masking asked of vectors that cannot be masked.
    #[error("{bdf}: {kind} vectors cannot be masked through VFIO (its flags say so); mask in the device instead")]
    NotMaskable {
        /// The device.
        bdf: pci::Bdf,
        /// The kind.
        kind: super::IrqKind,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::NoSuchIrq { .. } | Error::NoGroup { .. } => Code::NotFound,
            Error::NoIommuRefused { .. } | Error::GroupNotViable { .. } => Code::Refused,
            Error::Unsupported { .. } | Error::NotMaskable { .. } => Code::Unsupported,
            Error::MalformedRegion { .. } => Code::Device,
            // The caller put the device in a shared container that cannot take it (a narrower
            // DMA mask, the other IOMMU model): give it its own.
            Error::ContainerMask { .. } | Error::ContainerModel { .. } => Code::InvalidArgument,
            Error::Container { .. } | Error::Ioctl { .. } | Error::MapBar { .. } => Code::System,
        }
    }
}

/// What to do about a failed VFIO ioctl.
fn ioctl_hint(ioctl: &str) -> &'static str {
    match ioctl {
        "VFIO_GROUP_SET_CONTAINER" => "is the group held by another process or container?",
        "VFIO_SET_IOMMU" => "is vfio_iommu_type1 loaded (or no-IOMMU mode enabled)?",
        "VFIO_GROUP_GET_DEVICE_FD" => "is the device open elsewhere, or bound to another driver?",
        "VFIO_DEVICE_BIND_IOMMUFD" | "VFIO_DEVICE_ATTACH_IOMMUFD_PT" => {
            "is the kernel built with CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV?"
        }
        "VFIO_DEVICE_SET_IRQS" => {
            "are the vectors enabled, and is the kind supported (`userdma info`)?"
        }
        "VFIO_DEVICE_RESET" => "the device may not support function reset",
        _ => "see the cause",
    }
}

/// `0000:00:03.0 (nvme), ...`.
fn culprit_list(culprits: &[(pci::Bdf, String)]) -> String {
    if culprits.is_empty() {
        return "a member is".to_owned();
    }
    let names: Vec<String> = culprits.iter().map(|(b, d)| format!("{b} ({d})")).collect();
    format!(
        "{} {}",
        names.join(", "),
        if names.len() == 1 { "is" } else { "are" }
    )
}

/// The bind command for the culprits.
fn bind_hint(culprits: &[(pci::Bdf, String)]) -> String {
    match culprits.first() {
        None => "bind every member of the group to vfio-pci (`userdma bind BDF --driver vfio-pci`)"
            .to_owned(),
        Some((bdf, _)) => format!(
            "bind every member to vfio-pci (`userdma bind {bdf} --driver vfio-pci`) or unbind it"
        ),
    }
}
