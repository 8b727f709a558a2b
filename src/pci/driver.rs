//! The user-space drivers a device can be bound to, and which drivers VFIO tolerates.

use std::fmt;
use std::str::FromStr;

use super::BindError;

/// A user-space driver a device can be bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Driver {
    /// `vfio-pci`: VFIO, with IOMMU isolation (or no-IOMMU mode).
    #[cfg_attr(feature = "serde", serde(rename = "vfio-pci"))]
    VfioPci,
    /// `uio_pci_generic`: UIO, BAR access and INTx, DMA by physical address.
    #[cfg_attr(feature = "serde", serde(rename = "uio_pci_generic"))]
    UioPciGeneric,
}

impl Driver {
    /// The kernel's name for the driver (its directory in `bus/pci/drivers`, and what
    /// `modprobe` accepts).
    pub fn name(self) -> &'static str {
        match self {
            Self::VfioPci => "vfio-pci",
            Self::UioPciGeneric => "uio_pci_generic",
        }
    }
}

impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Driver {
    type Err = BindError;

    /// Accepts the kernel names and their `-`/`_` spellings (`vfio_pci`, `uio-pci-generic`).
    fn from_str(s: &str) -> Result<Self, BindError> {
        match s.replace('_', "-").as_str() {
            "vfio-pci" => Ok(Self::VfioPci),
            "uio-pci-generic" => Ok(Self::UioPciGeneric),
            _ => Err(BindError::UnknownDriver {
                name: s.chars().take(64).collect(),
            }),
        }
    }
}

/// Drivers that may hold other members of a group given to VFIO: VFIO itself (and its
/// device-specific variants, named `*_vfio_pci`), `pci-stub`, and `pcieport` (bridges the kernel
/// keeps for VFIO's benefit).
pub fn vfio_compatible(driver: &str) -> bool {
    matches!(driver, "vfio-pci" | "pci-stub" | "pcieport") || driver.ends_with("vfio_pci")
}

/// Drivers that hand a device to user space (or park it): those
/// [`Binder::unbind`](super::Binder::unbind) returns a device from.
pub fn user_space_driver(driver: &str) -> bool {
    matches!(
        driver,
        "vfio-pci" | "uio_pci_generic" | "igb_uio" | "pci-stub"
    ) || driver.ends_with("vfio_pci")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names() {
        assert_eq!("vfio-pci".parse::<Driver>().unwrap(), Driver::VfioPci);
        assert_eq!("vfio_pci".parse::<Driver>().unwrap(), Driver::VfioPci);
        assert_eq!(
            "uio_pci_generic".parse::<Driver>().unwrap(),
            Driver::UioPciGeneric
        );
        assert_eq!(
            "uio-pci-generic".parse::<Driver>().unwrap(),
            Driver::UioPciGeneric
        );
        let e = "nvme".parse::<Driver>().unwrap_err();
        assert!(e.to_string().contains("\"nvme\"") && e.to_string().contains("vfio-pci"));
        assert_eq!(Driver::UioPciGeneric.to_string(), "uio_pci_generic");
        #[cfg(feature = "serde")]
        assert_eq!(
            serde_json::to_string(&Driver::VfioPci).unwrap(),
            "\"vfio-pci\""
        );
    }

    #[test]
    fn driver_classes() {
        for d in ["vfio-pci", "pci-stub", "pcieport", "mlx5_vfio_pci"] {
            assert!(vfio_compatible(d), "{d}");
        }
        for d in ["nvme", "i801_smbus", "uio_pci_generic", "virtio-pci"] {
            assert!(!vfio_compatible(d), "{d}");
        }
        assert!(user_space_driver("uio_pci_generic") && user_space_driver("vfio-pci"));
        assert!(!user_space_driver("nvme"));
    }
}
