//! The configuration-space registers and `resource` flags that discovery reads, taken from
//! [`userdma_sys::pci`], where each value is checked against the kernel's headers.
//!
//! Bit masks and capability ids are used with the types `userdma-sys` gives them (the width of
//! their register). Register offsets and structure sizes are `u16` there; the parsers here index
//! byte slices with them, so they are widened to `usize` once, in this file (a lossless widening
//! of a constant). The only number spelled here is [`PCI_FIND_CAP_TTL`], which no kernel ABI
//! header defines.

use userdma_sys::pci as sys;

pub(crate) use userdma_sys::pci::{
    IORESOURCE_DISABLED, IORESOURCE_IO, IORESOURCE_MEM, IORESOURCE_MEM_64, IORESOURCE_PREFETCH,
    IORESOURCE_READONLY, IORESOURCE_UNSET, PCI_CAP_ID_EXP, PCI_CAP_ID_MSI, PCI_CAP_ID_MSIX,
    PCI_EXP_FLAGS_TYPE, PCI_EXP_FLAGS_VERS, PCI_EXP_LNKCAP_MLW, PCI_EXP_LNKCAP_SLS,
    PCI_EXP_LNKSTA_CLS, PCI_EXP_LNKSTA_NLW, PCI_HEADER_TYPE_MASK, PCI_MSIX_FLAGS_ENABLE,
    PCI_MSIX_FLAGS_MASKALL, PCI_MSIX_FLAGS_QSIZE, PCI_MSIX_TABLE_BIR, PCI_MSIX_TABLE_OFFSET,
    PCI_MSI_FLAGS_64BIT, PCI_MSI_FLAGS_ENABLE, PCI_MSI_FLAGS_MASKBIT, PCI_MSI_FLAGS_QMASK,
    PCI_STATUS_CAP_LIST,
};

// ---- sizes and offsets as slice indices ----

/// [`sys::PCI_STD_HEADER_SIZEOF`] as an index.
pub(crate) const PCI_STD_HEADER_SIZEOF: usize = sys::PCI_STD_HEADER_SIZEOF as usize;
/// [`sys::PCI_CFG_SPACE_SIZE`] as an index.
pub(crate) const PCI_CFG_SPACE_SIZE: usize = sys::PCI_CFG_SPACE_SIZE as usize;
/// [`sys::PCI_VENDOR_ID`] as an index.
pub(crate) const PCI_VENDOR_ID: usize = sys::PCI_VENDOR_ID as usize;
/// [`sys::PCI_DEVICE_ID`] as an index.
pub(crate) const PCI_DEVICE_ID: usize = sys::PCI_DEVICE_ID as usize;
/// [`sys::PCI_STATUS`] as an index.
pub(crate) const PCI_STATUS: usize = sys::PCI_STATUS as usize;
/// [`sys::PCI_REVISION_ID`] as an index.
pub(crate) const PCI_REVISION_ID: usize = sys::PCI_REVISION_ID as usize;
/// [`sys::PCI_CLASS_PROG`] as an index.
pub(crate) const PCI_CLASS_PROG: usize = sys::PCI_CLASS_PROG as usize;
/// [`sys::PCI_HEADER_TYPE`] as an index.
pub(crate) const PCI_HEADER_TYPE: usize = sys::PCI_HEADER_TYPE as usize;
/// [`sys::PCI_CAPABILITY_LIST`] as an index.
pub(crate) const PCI_CAPABILITY_LIST: usize = sys::PCI_CAPABILITY_LIST as usize;
/// [`sys::PCI_INTERRUPT_PIN`] as an index.
pub(crate) const PCI_INTERRUPT_PIN: usize = sys::PCI_INTERRUPT_PIN as usize;

/// [`sys::PCI_CAP_LIST_ID`] as an index, relative to the capability.
pub(crate) const PCI_CAP_LIST_ID: usize = sys::PCI_CAP_LIST_ID as usize;
/// [`sys::PCI_CAP_LIST_NEXT`] as an index, relative to the capability.
pub(crate) const PCI_CAP_LIST_NEXT: usize = sys::PCI_CAP_LIST_NEXT as usize;

/// [`sys::PCI_MSI_FLAGS`] as an index, relative to the capability.
pub(crate) const PCI_MSI_FLAGS: usize = sys::PCI_MSI_FLAGS as usize;

/// [`sys::PCI_MSIX_FLAGS`] as an index, relative to the capability.
pub(crate) const PCI_MSIX_FLAGS: usize = sys::PCI_MSIX_FLAGS as usize;
/// [`sys::PCI_MSIX_TABLE`] as an index, relative to the capability.
pub(crate) const PCI_MSIX_TABLE: usize = sys::PCI_MSIX_TABLE as usize;
/// [`sys::PCI_MSIX_PBA`] as an index, relative to the capability.
pub(crate) const PCI_MSIX_PBA: usize = sys::PCI_MSIX_PBA as usize;
/// [`sys::PCI_CAP_MSIX_SIZEOF`] as a length.
pub(crate) const PCI_CAP_MSIX_SIZEOF: usize = sys::PCI_CAP_MSIX_SIZEOF as usize;

/// [`sys::PCI_EXP_FLAGS`] as an index, relative to the capability.
pub(crate) const PCI_EXP_FLAGS: usize = sys::PCI_EXP_FLAGS as usize;
/// [`sys::PCI_EXP_LNKCAP`] as an index, relative to the capability.
pub(crate) const PCI_EXP_LNKCAP: usize = sys::PCI_EXP_LNKCAP as usize;
/// [`sys::PCI_EXP_LNKSTA`] as an index, relative to the capability.
pub(crate) const PCI_EXP_LNKSTA: usize = sys::PCI_EXP_LNKSTA as usize;

// ---- kernel behaviour, not ABI ----

/// The kernel's bound on capability-list hops (`PCI_FIND_CAP_TTL`, a `#define` of the
/// kernel-internal drivers/pci/pci.h, in no uapi header): 48 dword slots fit between the header
/// and the end of conventional configuration space, so a longer walk is a loop.
pub(crate) const PCI_FIND_CAP_TTL: usize = 48;

// The bound above is the number of dword slots between the header and the end of conventional
// configuration space.
const _: () = assert!(PCI_FIND_CAP_TTL == (PCI_CFG_SPACE_SIZE - PCI_STD_HEADER_SIZEOF) / 4);
