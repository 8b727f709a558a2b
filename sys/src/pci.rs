//! PCI configuration space (`<linux/pci_regs.h>`) and the flag bits of the sysfs `resource` file.
//!
//! Register offsets and structure sizes are `u16` (configuration space is 256 bytes, 4096 for PCI
//! Express). Each bit mask has the width of the register it belongs to: `u16` for Command, Status,
//! the MSI/MSI-X Message Control registers and the PCI Express Capabilities, Device Control and
//! Link Status registers, `u8` for capability ids and the header type, `u32` for BARs, the MSI-X
//! Table/PBA registers and the PCI Express Device and Link Capabilities registers. Through VFIO,
//! configuration space is the region [`crate::vfio::VFIO_PCI_CONFIG_REGION_INDEX`]; through sysfs
//! it is the device's `config` file.
//!
//! Capabilities form a list: if [`PCI_STATUS`] has [`PCI_STATUS_CAP_LIST`], the byte at
//! [`PCI_CAPABILITY_LIST`] is the offset of the first one; each capability starts with its id
//! ([`PCI_CAP_LIST_ID`]) and the offset of the next ([`PCI_CAP_LIST_NEXT`]), 0 ending the list.

// ---- standard header (type 0) ----

/// Size of the configuration space of a conventional PCI function.
pub const PCI_CFG_SPACE_SIZE: u16 = 256;
/// Size of the configuration space of a PCI Express function.
pub const PCI_CFG_SPACE_EXP_SIZE: u16 = 4096;
/// Size of the standard header that precedes device-specific registers.
pub const PCI_STD_HEADER_SIZEOF: u16 = 64;
/// Number of BARs in a type 0 header.
pub const PCI_STD_NUM_BARS: u16 = 6;

/// Vendor ID (16 bits).
pub const PCI_VENDOR_ID: u16 = 0x00;
/// Device ID (16 bits).
pub const PCI_DEVICE_ID: u16 = 0x02;
/// Command register (16 bits).
pub const PCI_COMMAND: u16 = 0x04;
/// Command: respond to I/O space accesses.
pub const PCI_COMMAND_IO: u16 = 0x1;
/// Command: respond to memory space accesses (BARs readable/writable).
pub const PCI_COMMAND_MEMORY: u16 = 0x2;
/// Command: bus mastering, which the device needs to perform DMA.
pub const PCI_COMMAND_MASTER: u16 = 0x4;
/// Command: INTx emulation disabled.
pub const PCI_COMMAND_INTX_DISABLE: u16 = 0x400;
/// Status register (16 bits).
pub const PCI_STATUS: u16 = 0x06;
/// Status: INTx interrupt pending.
pub const PCI_STATUS_INTERRUPT: u16 = 0x08;
/// Status: the function has a capability list.
pub const PCI_STATUS_CAP_LIST: u16 = 0x10;
/// Revision ID (8 bits) followed by the 24-bit class code; read 32 bits here for both.
pub const PCI_CLASS_REVISION: u16 = 0x08;
/// Revision ID (8 bits).
pub const PCI_REVISION_ID: u16 = 0x08;
/// Programming interface (8 bits), the low byte of the 24-bit class code that ends at 0x0b.
pub const PCI_CLASS_PROG: u16 = 0x09;
/// Header type (8 bits; bit 7 is the multi-function flag).
pub const PCI_HEADER_TYPE: u16 = 0x0e;
/// Header type without the multi-function bit.
pub const PCI_HEADER_TYPE_MASK: u8 = 0x7f;
/// Header type of an endpoint (type 0).
pub const PCI_HEADER_TYPE_NORMAL: u8 = 0;
/// First BAR (32 bits); BAR n is at `PCI_BASE_ADDRESS_0 + 4 * n`.
pub const PCI_BASE_ADDRESS_0: u16 = 0x10;
/// BAR bit 0: 1 for I/O space, 0 for memory.
pub const PCI_BASE_ADDRESS_SPACE_IO: u32 = 0x01;
/// BAR bits 1-2: memory BAR type.
pub const PCI_BASE_ADDRESS_MEM_TYPE_MASK: u32 = 0x06;
/// Memory BAR type: 64-bit, using this BAR and the next.
pub const PCI_BASE_ADDRESS_MEM_TYPE_64: u32 = 0x04;
/// Memory BAR bit 3: prefetchable.
pub const PCI_BASE_ADDRESS_MEM_PREFETCH: u32 = 0x08;
/// Subsystem vendor ID (16 bits).
pub const PCI_SUBSYSTEM_VENDOR_ID: u16 = 0x2c;
/// Subsystem ID (16 bits).
pub const PCI_SUBSYSTEM_ID: u16 = 0x2e;
/// Offset of the first capability (8 bits), valid if [`PCI_STATUS_CAP_LIST`] is set.
pub const PCI_CAPABILITY_LIST: u16 = 0x34;
/// Interrupt pin (8 bits; 0: no INTx, 1-4: INTA-INTD).
pub const PCI_INTERRUPT_PIN: u16 = 0x3d;

// ---- capability list ----

/// Offset, within a capability, of its id (8 bits).
pub const PCI_CAP_LIST_ID: u16 = 0;
/// Offset, within a capability, of the next capability's offset (8 bits).
pub const PCI_CAP_LIST_NEXT: u16 = 1;
/// Capability id: power management.
pub const PCI_CAP_ID_PM: u8 = 0x01;
/// Capability id: MSI.
pub const PCI_CAP_ID_MSI: u8 = 0x05;
/// Capability id: vendor specific.
pub const PCI_CAP_ID_VNDR: u8 = 0x09;
/// Capability id: PCI Express.
pub const PCI_CAP_ID_EXP: u8 = 0x10;
/// Capability id: MSI-X.
pub const PCI_CAP_ID_MSIX: u8 = 0x11;

// ---- MSI capability ----

/// MSI: offset of Message Control (16 bits) within the capability.
pub const PCI_MSI_FLAGS: u16 = 0x02;
/// MSI Message Control: MSI enabled.
pub const PCI_MSI_FLAGS_ENABLE: u16 = 0x0001;
/// MSI Message Control: log2 of the vectors the function can use (bits 1-3).
pub const PCI_MSI_FLAGS_QMASK: u16 = 0x000e;
/// MSI Message Control: log2 of the vectors enabled (bits 4-6).
pub const PCI_MSI_FLAGS_QSIZE: u16 = 0x0070;
/// MSI Message Control: 64-bit message address.
pub const PCI_MSI_FLAGS_64BIT: u16 = 0x0080;
/// MSI Message Control: per-vector masking.
pub const PCI_MSI_FLAGS_MASKBIT: u16 = 0x0100;

// ---- MSI-X capability ----

/// MSI-X: offset of Message Control (16 bits) within the capability.
pub const PCI_MSIX_FLAGS: u16 = 2;
/// MSI-X Message Control: table size minus one (bits 0-10).
pub const PCI_MSIX_FLAGS_QSIZE: u16 = 0x07ff;
/// MSI-X Message Control: all vectors masked.
pub const PCI_MSIX_FLAGS_MASKALL: u16 = 0x4000;
/// MSI-X Message Control: MSI-X enabled.
pub const PCI_MSIX_FLAGS_ENABLE: u16 = 0x8000;
/// MSI-X: offset of the Table register (32 bits): BAR index and offset of the vector table.
pub const PCI_MSIX_TABLE: u16 = 4;
/// MSI-X Table/PBA register: BAR index (bits 0-2).
pub const PCI_MSIX_TABLE_BIR: u32 = 0x0000_0007;
/// MSI-X Table/PBA register: offset within the BAR (8-byte aligned).
pub const PCI_MSIX_TABLE_OFFSET: u32 = 0xffff_fff8;
/// MSI-X: offset of the PBA register (32 bits): BAR index and offset of the pending bit array.
pub const PCI_MSIX_PBA: u16 = 8;
/// Size of one MSI-X table entry in the BAR.
pub const PCI_MSIX_ENTRY_SIZE: u16 = 16;
/// Size of the MSI-X capability structure (up to and including the PBA register).
pub const PCI_CAP_MSIX_SIZEOF: u16 = 12;

// ---- PCI Express capability ----

/// PCIe: offset of the PCI Express Capabilities register (16 bits) within the capability.
pub const PCI_EXP_FLAGS: u16 = 0x02;
/// PCIe Capabilities: capability version (bits 0-3).
pub const PCI_EXP_FLAGS_VERS: u16 = 0x000f;
/// PCIe Capabilities: device/port type (bits 4-7, `PCI_EXP_TYPE_*`).
pub const PCI_EXP_FLAGS_TYPE: u16 = 0x00f0;
/// PCIe: offset of Device Capabilities (32 bits) within the capability.
pub const PCI_EXP_DEVCAP: u16 = 0x04;
/// PCIe Device Capabilities: function level reset supported.
pub const PCI_EXP_DEVCAP_FLR: u32 = 0x1000_0000;
/// PCIe: offset of Device Control (16 bits) within the capability.
pub const PCI_EXP_DEVCTL: u16 = 0x08;
/// PCIe Device Control: Max_Payload_Size (bits 5-7).
pub const PCI_EXP_DEVCTL_PAYLOAD: u16 = 0x00e0;
/// PCIe Device Control: Max_Read_Request_Size (bits 12-14).
pub const PCI_EXP_DEVCTL_READRQ: u16 = 0x7000;
/// PCIe: offset of Link Capabilities (32 bits) within the capability.
pub const PCI_EXP_LNKCAP: u16 = 0x0c;
/// PCIe Link Capabilities: maximum link speed code (bits 0-3).
pub const PCI_EXP_LNKCAP_SLS: u32 = 0x0000_000f;
/// PCIe Link Capabilities: maximum link width (bits 4-9).
pub const PCI_EXP_LNKCAP_MLW: u32 = 0x0000_03f0;
/// PCIe: offset of Link Status (16 bits) within the capability.
pub const PCI_EXP_LNKSTA: u16 = 0x12;
/// PCIe Link Status: current link speed code (bits 0-3).
pub const PCI_EXP_LNKSTA_CLS: u16 = 0x000f;
/// PCIe Link Status: negotiated link width (bits 4-9).
pub const PCI_EXP_LNKSTA_NLW: u16 = 0x03f0;

// ---- sysfs ----

/// Directory of PCI devices, one entry per `DDDD:BB:DD.F` address.
pub const PCI_SYSFS_DEVICES: &str = "/sys/bus/pci/devices";
/// Directory of PCI drivers, each with `bind`, `unbind` and `new_id`.
pub const PCI_SYSFS_DRIVERS: &str = "/sys/bus/pci/drivers";

// ---- flags of the sysfs `resource` file ----
//
// Each line of `/sys/bus/pci/devices/<bdf>/resource` is `start end flags` in hex (`0x%016llx`), one
// line per resource (BARs 0-5, then the ROM, then bridge windows). The flag bits are the kernel's
// `IORESOURCE_*` from include/linux/ioport.h, which is not a uapi header: they are ABI through this
// file only, and no installed header defines them.

/// `resource` flags: an I/O port range.
pub const IORESOURCE_IO: u64 = 0x0000_0100;
/// `resource` flags: a memory range (mappable through `resource<N>`).
pub const IORESOURCE_MEM: u64 = 0x0000_0200;
/// `resource` flags: prefetchable memory.
pub const IORESOURCE_PREFETCH: u64 = 0x0000_2000;
/// `resource` flags: read-only (the expansion ROM).
pub const IORESOURCE_READONLY: u64 = 0x0000_4000;
/// `resource` flags: a 64-bit memory BAR.
pub const IORESOURCE_MEM_64: u64 = 0x0010_0000;
/// `resource` flags: the resource is disabled (e.g. a bridge window that forwards nothing).
pub const IORESOURCE_DISABLED: u64 = 0x1000_0000;
/// `resource` flags: no address is assigned yet.
pub const IORESOURCE_UNSET: u64 = 0x2000_0000;
