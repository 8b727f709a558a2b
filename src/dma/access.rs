//! What a device may do with a mapping ([`Access`]): read and write it, only read it (memory it
//! must not change: weights, a frame another driver owns), or only write it (a buffer it
//! fills). The IOMMU enforces it (type1's `VFIO_DMA_MAP_FLAG_READ`/`_WRITE`, iommufd's
//! `IOMMU_IOAS_MAP_READABLE`/`_WRITEABLE`), as does the software IOMMU's table for the loopback
//! NPU; a physical-address space cannot, and refuses anything but read-write.

use std::fmt;

/// What the device may do with a mapping, from the device's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Access {
    /// The device reads and writes it.
    #[default]
    ReadWrite,
    /// The device only reads it: a device write is refused (an IOMMU fault; an error
    /// completion on the loopback NPU) and the memory is unchanged.
    ReadOnly,
    /// The device only writes it: a device read is refused.
    WriteOnly,
}

impl Access {
    /// Whether the device may read the memory.
    pub fn device_reads(self) -> bool {
        self != Access::WriteOnly
    }

    /// Whether the device may write the memory.
    pub fn device_writes(self) -> bool {
        self != Access::ReadOnly
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::ReadWrite => "read-write",
            Access::ReadOnly => "device-read-only",
            Access::WriteOnly => "device-write-only",
        })
    }
}
