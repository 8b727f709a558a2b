//! Opening a PCI function by BDF: through VFIO or UIO (`udma_pci_backend`), with its options
//! (`udma_pci_options`: flags, DMA mask, the interrupts to enable at open).

use std::ffi::{c_char, CStr};
use std::sync::Arc;

use udma::device::{self, vfio};
use udma::{pci, Runtime};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::{register, udma_device};
use crate::abi;
use crate::error::{call, lib, udma_status, Fail};

/// `udma_pci_options.backend`: which kernel driver's interface to use.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_pci_backend {
    /// The one the function is bound to: vfio-pci or uio_pci_generic (the default).
    UDMA_PCI_AUTO = 0,
    /// vfio-pci.
    UDMA_PCI_VFIO = 1,
    /// uio_pci_generic (no IOMMU: physical addresses, pinned memory).
    UDMA_PCI_UIO = 2,
}

/// `udma_pci_options.irq_kind`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_irq_kind {
    /// No interrupts enabled at open (the default).
    UDMA_IRQ_NONE = 0,
    /// Legacy INTx (one vector).
    UDMA_IRQ_INTX = 1,
    /// MSI (up to 32 vectors).
    UDMA_IRQ_MSI = 2,
    /// MSI-X (up to 2048 vectors).
    UDMA_IRQ_MSIX = 3,
}

/// `udma_pci_options.flags`: allow VFIO's no-IOMMU mode (no isolation; the device reaches
/// physical addresses). Off by default; the kernel must allow it too
/// (`enable_unsafe_noiommu_mode`).
pub const UDMA_PCI_ALLOW_NOIOMMU: u32 = 1;
/// `udma_pci_options.flags`: use VFIO's container interface even where iommufd exists.
pub const UDMA_PCI_NO_IOMMUFD: u32 = 2;

/// How to open a PCI function. Zero is the default for every field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_pci_options {
    /// `sizeof(udma_pci_options)`.
    pub size: usize,
    /// A `udma_pci_backend`; 0: `UDMA_PCI_AUTO`.
    pub backend: u32,
    /// `UDMA_PCI_ALLOW_NOIOMMU`, `UDMA_PCI_NO_IOMMUFD` (VFIO only), or 0.
    pub flags: u32,
    /// The device's DMA mask width (QEMU's edu: 28); 0: 64 for VFIO, 32 for UIO.
    pub dma_mask_bits: u32,
    /// A `udma_irq_kind` to enable at open (VFIO only); 0: none.
    pub irq_kind: u32,
    /// How many vectors of `irq_kind`.
    pub irq_count: u32,
    /// Zero.
    pub reserved: u32,
}

abi::sized!(udma_pci_options);

fn vfio_options(o: &udma_pci_options) -> Result<vfio::Options, Fail> {
    let mut options = vfio::Options::new()
        .allow_noiommu(o.flags & UDMA_PCI_ALLOW_NOIOMMU != 0)
        .iommufd(o.flags & UDMA_PCI_NO_IOMMUFD == 0);
    if o.dma_mask_bits != 0 {
        options = options.dma_mask_bits(o.dma_mask_bits);
    }
    let kind = match o.irq_kind {
        0 => None,
        1 => Some(vfio::IrqKind::Intx),
        2 => Some(vfio::IrqKind::Msi),
        3 => Some(vfio::IrqKind::MsiX),
        other => {
            return Err(Fail::invalid(format!(
                "irq_kind {other} is not a udma_irq_kind (0 to 3)"
            )))
        }
    };
    if let Some(kind) = kind {
        options = options.interrupts(kind, o.irq_count.max(1));
    }
    Ok(options)
}

fn open_pci(bdf: pci::Bdf, o: &udma_pci_options) -> Result<Runtime, Fail> {
    if o.flags & !(UDMA_PCI_ALLOW_NOIOMMU | UDMA_PCI_NO_IOMMUFD) != 0 {
        return Err(Fail::invalid(format!(
            "flags {:#x} has bits that are not UDMA_PCI_* flags",
            o.flags
        )));
    }
    let uio = |o: &udma_pci_options| -> Result<Runtime, Fail> {
        if o.flags != 0 || o.irq_kind != 0 {
            return Err(Fail::invalid(
                "UIO takes no flags and no irq_kind (those are VFIO's): clear them, or bind \
                 the function to vfio-pci",
            ));
        }
        let bits = if o.dma_mask_bits == 0 {
            32
        } else {
            o.dma_mask_bits
        };
        let uio = device::Uio::open_with(bdf, bits).map_err(lib)?;
        Ok(Runtime::from_device(Arc::new(uio)))
    };
    match o.backend {
        0 => {
            let driver = pci::Sysfs::system()
                .driver(bdf)
                .map_err(|e| lib(device::Error::Sysfs { bdf, source: e }))?;
            match driver.as_deref() {
                Some(d) if d == pci::Driver::VfioPci.name() || d.ends_with("vfio_pci") => {
                    Runtime::open_vfio(bdf, &vfio_options(o)?).map_err(Fail::from)
                }
                Some(d) if d == pci::Driver::UioPciGeneric.name() => uio(o),
                // Unbound, another driver, no such function: the library's own message.
                _ => Runtime::open(bdf).map_err(Fail::from),
            }
        }
        1 => Runtime::open_vfio(bdf, &vfio_options(o)?).map_err(Fail::from),
        2 => uio(o),
        other => Err(Fail::invalid(format!(
            "backend {other} is not a udma_pci_backend (UDMA_PCI_AUTO 0, UDMA_PCI_VFIO 1, \
             UDMA_PCI_UIO 2)"
        ))),
    }
}

/// Opens the PCI function at `bdf` (`"0000:01:00.0"`, or `"01:00.0"` in domain 0) through
/// VFIO or UIO (`options` may be NULL: the driver it is bound to, VFIO's defaults, no
/// no-IOMMU). The function must be bound to vfio-pci or uio_pci_generic first
/// (`userdma bind`).
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a malformed BDF or options; `UDMA_ERR_NOT_FOUND`
/// for no such function, or one bound to no driver or another one (the message names the
/// `userdma bind` command); `UDMA_ERR_REFUSED` for no-IOMMU mode not allowed, an IOMMU group
/// not viable, or permission; `UDMA_ERR_BUSY` for a device (its IOMMU group) another process
/// or a VM holds.
///
/// # Safety
/// `bdf` is a NUL-terminated string; `options` is NULL or points to `options->size` readable
/// bytes; `device` points to a writable `udma_device *`.
#[no_mangle]
pub unsafe extern "C" fn udma_device_open_pci(
    bdf: *const c_char,
    options: *const udma_pci_options,
    device: *mut *mut udma_device,
) -> udma_status {
    call("udma_device_open_pci", || {
        let out = abi::out(device, "device")?;
        if bdf.is_null() {
            return Err(Fail::null("bdf"));
        }
        // SAFETY: non-null and NUL-terminated per this function's contract.
        let text = unsafe { CStr::from_ptr(bdf) }.to_string_lossy();
        let parsed: pci::Bdf = text.parse().map_err(|e| {
            Fail::invalid(format!(
                "{text:?} is not a PCI address ({e}): write it as 0000:01:00.0"
            ))
        })?;
        let options = if options.is_null() {
            udma_pci_options::default()
        } else {
            // SAFETY: non-null, and readable per this function's contract.
            unsafe { abi::read(options, "options", udma_pci_options::default())? }
        };
        let runtime = open_pci(parsed, &options).map_err(|f| f.context(parsed))?;
        register(runtime, out)
    })
}
