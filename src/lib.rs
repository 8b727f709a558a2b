//! userdma: drive PCIe accelerators from Linux user space.
//!
//! The crate opens a device through VFIO or UIO (or a software loopback device with the same
//! contract), maps its BARs and pinned hugepage memory into the process, hands out DMA-capable
//! buffers, and moves data through descriptor rings. This file is the table of contents; each
//! module documents one concept.
//!
//! | module | owns |
//! |---|---|
//! | [`pci`] | PCI addresses (BDF), sysfs discovery, IOMMU groups, driver binding |
//!
//! The kernel ABI (structs, ioctl numbers, constants) lives in the `userdma-sys` crate, re-exported
//! as [`sys`].

pub use userdma_sys as sys;

pub mod pci;

mod sync;
