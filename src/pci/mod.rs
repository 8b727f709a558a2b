//! PCI addresses, sysfs discovery, IOMMU groups and driver binding.
//!
//! | file | concept |
//! |---|---|
//! | `bdf` | [`Bdf`]: a PCI address, strict parsing and canonical printing |
//! | `sysfs` | [`Sysfs`]: reading devices from a sysfs tree (`/sys` or a test fixture) |
//! | `device` | [`DeviceInfo`]: what sysfs says about one function |
//! | `config` | [`ConfigSpace`]: header fields, and the walk of the capability list |
//! | `capability` | [`Capabilities`]: what the walk found, MSI / MSI-X / PCIe decoded |
//! | `resource` | [`Resource`]: BARs and ROM from the `resource` file |
//! | `iommu` | [`Iommu`], [`IommuGroup`], and which [`DmaPath`]s a device can use |
//! | `driver` | [`Driver`]: the user-space drivers, and which drivers VFIO tolerates in a group |
//! | `kernel` | [`Kernel`]: the sysfs writes binding makes ([`LiveKernel`], or a test double) |
//! | `bind` | [`Binder`]: moving a device to `vfio-pci` / `uio_pci_generic` and back |
//! | `rollback` | [`Rollback`]: undoing a failed bind or unbind, and reporting the result |
//!
//! The parsers ([`Bdf::from_str`](std::str::FromStr), [`ConfigSpace::capabilities`],
//! [`parse_resource`]) are pure functions of their input, never
//! panic, and are fuzzed.
//!
//! ```no_run
//! use userdma::pci::{Binder, BindOptions, Driver, Sysfs};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let sysfs = Sysfs::system();
//! let iommu = sysfs.iommu()?;
//! for dev in sysfs.devices()? {
//!     println!("{} {:04x}:{:04x} {:?} {:?}", dev.bdf, dev.vendor, dev.device, dev.driver,
//!              dev.dma_paths(&iommu));
//! }
//! let _report = Binder::system().bind("0000:01:00.0".parse()?, Driver::VfioPci,
//!                                    BindOptions::default())?;
//! # Ok(()) }
//! ```

mod bdf;
mod bind;
mod capability;
mod config;
mod device;
mod driver;
pub mod faults;
mod iommu;
mod kernel;
mod regs;
mod resource;
mod rollback;
mod sysfs;

pub use self::bdf::{Bdf, BdfError};
pub use self::bind::{
    BindError, BindOptions, BindReport, Binder, Change, GroupMember, StepError, UnbindReport,
};
pub use self::capability::{
    Capabilities, Capability, CapabilityKind, Express, Link, Malformed, Msi, MsiX, Walk,
};
pub use self::config::ConfigSpace;
pub use self::device::DeviceInfo;
pub use self::driver::{user_space_driver, vfio_compatible, Driver};
pub use self::iommu::{DmaPath, Iommu, IommuGroup};
pub use self::kernel::{Kernel, LiveKernel};
pub use self::resource::{
    parse_resource, Resource, ResourceError, ResourceKind, ResourceReason, MAX_RESOURCE_LINES,
};
pub use self::rollback::{Rollback, RollbackEntry};
pub use self::sysfs::{Error, Sysfs};
