//! UIO (`drivers/uio/uio.c`): the user-space I/O device nodes, as `uio_pci_generic` provides them.
//!
//! UIO has no uapi header; its ABI is the device node protocol and the sysfs layout, both fixed by
//! `drivers/uio/uio.c` and documented in `Documentation/driver-api/uio-howto.rst`:
//!
//! * `read` on `/dev/uioN` blocks until an interrupt, then returns the total interrupt count as one
//!   native-endian `i32`. Any other read size fails with `EINVAL`.
//! * `write` of one native-endian `i32` ([`UIO_IRQ_ENABLE`] or [`UIO_IRQ_DISABLE`]) re-enables or
//!   masks the interrupt, for drivers that implement `irqcontrol`. Any other write size fails with
//!   `EINVAL`. `uio_pci_generic` does not implement it (the write fails with `ENOSYS`): its
//!   handler masks INTx with [`crate::pci::PCI_COMMAND_INTX_DISABLE`], and user space unmasks by
//!   clearing that bit in the config-space command register (the sysfs `config` file).
//! * `poll`/`epoll` report the fd readable when the count changed since the last read.
//! * `/sys/class/uio/uioN/maps/mapM/{addr,size,offset,name}` describe memory maps; map `M` is
//!   mapped with `mmap` at offset `M * page size`. `uio_pci_generic` exports its 32-bit
//!   non-prefetchable memory BARs as maps; every BAR can also be mapped through the PCI sysfs
//!   `resource<N>` files, and config space is the sysfs `config` file.
//! * `/sys/class/uio/uioN/device` links to the underlying PCI device.

/// Directory of UIO devices in sysfs: one `uio<N>` entry per device.
pub const UIO_CLASS_DIR: &str = "/sys/class/uio";
/// Prefix of a UIO device node: `/dev/uio<N>`.
pub const UIO_DEV_PREFIX: &str = "/dev/uio";
/// Prefix of a UIO device's directory name under [`UIO_CLASS_DIR`] (`uio<N>`).
pub const UIO_NAME_PREFIX: &str = "uio";
/// Subdirectory of a UIO device's sysfs directory that holds its memory maps (`map<M>`).
pub const UIO_MAPS_DIR: &str = "maps";
/// The PCI UIO driver's name (for `driver_override` and `/sys/bus/pci/drivers/`).
pub const UIO_PCI_GENERIC_DRIVER: &str = "uio_pci_generic";

/// The type of the interrupt count a `read` returns and of the control word a `write` takes.
pub type IrqWord = i32;
/// Value written to `/dev/uioN` to enable (unmask) the interrupt.
pub const UIO_IRQ_ENABLE: IrqWord = 1;
/// Value written to `/dev/uioN` to disable (mask) the interrupt.
pub const UIO_IRQ_DISABLE: IrqWord = 0;
/// The only size `read` (interrupt count) and `write` (enable/disable) accept: 4 bytes.
pub const UIO_IRQ_WORD_SIZE: usize = core::mem::size_of::<IrqWord>();

const _: () = assert!(
    UIO_IRQ_WORD_SIZE == 4,
    "a UIO interrupt word is not 4 bytes"
);
