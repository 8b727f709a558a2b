//! The capabilities found in configuration space: the walk's result and the decoded bodies of
//! the ones userdma uses (MSI, MSI-X, PCI Express).

/// The result of walking a capability list: what was found, and whether the walk finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// How the walk ended.
    pub walk: Walk,
    /// The capabilities found, in list order (those before the stop when the walk did not finish).
    pub entries: Vec<Capability>,
}

impl Capabilities {
    /// A list that could not be read at all (no `config` file, or it was unreadable).
    pub fn unreadable(kind: std::io::ErrorKind) -> Self {
        Self {
            walk: Walk::Unreadable(kind),
            entries: Vec::new(),
        }
    }

    /// Whether the whole list was read, so that absence of a capability means it is absent.
    pub fn is_known(&self) -> bool {
        self.walk == Walk::Complete
    }

    /// Whether capability `id` is present: `Some(true)` if found, `Some(false)` if the whole list
    /// was read without finding it, `None` if it was not found in a list that could not be read
    /// to its end.
    pub fn contains(&self, id: u8) -> Option<bool> {
        if self.entries.iter().any(|c| c.id == id) {
            Some(true)
        } else if self.is_known() {
            Some(false)
        } else {
            None
        }
    }

    /// The MSI capability, if found.
    pub fn msi(&self) -> Option<&Msi> {
        self.entries.iter().find_map(|c| match &c.kind {
            CapabilityKind::Msi(m) => Some(m),
            _ => None,
        })
    }

    /// The MSI-X capability, if found.
    pub fn msix(&self) -> Option<&MsiX> {
        self.entries.iter().find_map(|c| match &c.kind {
            CapabilityKind::MsiX(m) => Some(m),
            _ => None,
        })
    }

    /// The PCI Express capability, if found.
    pub fn express(&self) -> Option<&Express> {
        self.entries.iter().find_map(|c| match &c.kind {
            CapabilityKind::Express(e) => Some(e),
            _ => None,
        })
    }
}

/// How a capability walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// The whole list was read.
    Complete,
    /// The read was shorter than the list (unprivileged readers get 64 bytes): capabilities
    /// beyond `available` bytes are unknown.
    Truncated {
        /// Bytes the walk needed.
        needed: usize,
        /// Bytes that were read.
        available: usize,
    },
    /// The `config` file could not be read at all.
    Unreadable(std::io::ErrorKind),
    /// The list is inconsistent; entries after the fault are unknown.
    Malformed(Malformed),
}

/// What was inconsistent in a capability list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// A non-zero pointer (read at config offset `from`) points into the 64-byte header.
    PointerIntoHeader {
        /// Config offset of the pointer byte.
        from: usize,
        /// The pointer value.
        pointer: u8,
    },
    /// The list comes back to the capability at `offset`.
    Loop {
        /// Offset of the capability visited twice.
        offset: u8,
    },
    /// A capability ID of `0xff` at `offset`: the device is not responding (all-ones reads).
    InvalidId {
        /// Offset of the capability.
        offset: u8,
    },
    /// A capability runs past the end of configuration space.
    PastEnd {
        /// Bytes needed.
        needed: usize,
    },
}

/// One entry of the capability list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    /// Offset in configuration space (dword aligned, `>= 0x40`).
    pub offset: u8,
    /// Capability ID (`linux/pci_regs.h` `PCI_CAP_ID_*`).
    pub id: u8,
    /// The decoded body, for the capabilities userdma uses.
    pub kind: CapabilityKind,
}

impl Capability {
    /// The conventional short name of capability `id`, e.g. `"MSI-X"`.
    pub fn name_of(id: u8) -> Option<&'static str> {
        Some(match id {
            0x01 => "Power Management",
            0x02 => "AGP",
            0x03 => "VPD",
            0x04 => "Slot ID",
            0x05 => "MSI",
            0x06 => "CompactPCI Hot Swap",
            0x07 => "PCI-X",
            0x08 => "HyperTransport",
            0x09 => "Vendor Specific",
            0x0a => "Debug Port",
            0x0b => "CompactPCI Central Resource Control",
            0x0c => "PCI Hot-Plug",
            0x0d => "Bridge Subsystem Vendor ID",
            0x0e => "AGP 8x",
            0x0f => "Secure Device",
            0x10 => "PCI Express",
            0x11 => "MSI-X",
            0x12 => "SATA",
            0x13 => "Advanced Features",
            0x14 => "Enhanced Allocation",
            0x15 => "Flattening Portal Bridge",
            _ => return None,
        })
    }
}

/// The decoded body of a capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapabilityKind {
    /// Message Signalled Interrupts.
    Msi(Msi),
    /// MSI-X.
    MsiX(MsiX),
    /// PCI Express.
    Express(Express),
    /// Any other capability (not decoded).
    Other,
}

/// The MSI capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msi {
    /// Vectors the function can request (1, 2, 4, 8, 16 or 32).
    pub vectors: u8,
    /// 64-bit message address.
    pub is_64bit: bool,
    /// Per-vector masking.
    pub per_vector_masking: bool,
    /// Currently enabled.
    pub enabled: bool,
}

/// The MSI-X capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsiX {
    /// Number of table entries (vectors), `1..=2048`.
    pub table_size: u16,
    /// Currently enabled.
    pub enabled: bool,
    /// All vectors masked (function mask).
    pub masked: bool,
    /// BAR holding the vector table.
    pub table_bar: u8,
    /// Offset of the table in that BAR.
    pub table_offset: u32,
    /// BAR holding the pending-bit array.
    pub pba_bar: u8,
    /// Offset of the pending-bit array in that BAR.
    pub pba_offset: u32,
}

/// The PCI Express capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Express {
    /// Capability version (1 or 2).
    pub version: u8,
    /// Device/port type (`PCI_EXP_TYPE_*`): 0 endpoint, 1 legacy endpoint, 4 root port, 9 root
    /// complex integrated endpoint, ...
    pub port_type: u8,
    /// Link capabilities, when the function has a link (and they were read).
    pub max_link: Option<Link>,
    /// Negotiated link, when the link is up (and it was read).
    pub link: Option<Link>,
}

impl Express {
    /// The name of [`port_type`](Self::port_type), e.g. `"Endpoint"`.
    pub fn port_type_name(&self) -> &'static str {
        match self.port_type {
            0x0 => "Endpoint",
            0x1 => "Legacy Endpoint",
            0x4 => "Root Port",
            0x5 => "Upstream Port",
            0x6 => "Downstream Port",
            0x7 => "PCIe to PCI/PCI-X Bridge",
            0x8 => "PCI/PCI-X to PCIe Bridge",
            0x9 => "Root Complex Integrated Endpoint",
            0xa => "Root Complex Event Collector",
            _ => "Reserved",
        }
    }
}

/// A PCI Express link: speed code and lane count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Speed code: 1 = 2.5 GT/s, 2 = 5, 3 = 8, 4 = 16, 5 = 32, 6 = 64.
    pub speed: u8,
    /// Lanes.
    pub width: u8,
}

impl Link {
    /// The speed as text, e.g. `"8 GT/s"`, or `None` for a reserved code.
    pub fn speed_text(&self) -> Option<&'static str> {
        Some(match self.speed {
            1 => "2.5 GT/s",
            2 => "5 GT/s",
            3 => "8 GT/s",
            4 => "16 GT/s",
            5 => "32 GT/s",
            6 => "64 GT/s",
            _ => return None,
        })
    }
}
