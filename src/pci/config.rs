//! Configuration space: header fields and the capability list, parsed from the bytes of a
//! device's sysfs `config` file.
//!
//! sysfs gives root the whole space (256 or 4096 bytes) and everyone else the 64-byte header, so
//! every reader here returns `None` (or [`Walk::Truncated`]) for bytes it was not given rather than
//! failing: a short file means "unknown", not "broken".

use super::regs::*;
use super::{Capabilities, Capability, CapabilityKind, Express, Link, Malformed, Msi, MsiX, Walk};

/// A function's configuration space as read from sysfs `config`: any length, possibly truncated.
///
/// ```
/// use userdma::pci::ConfigSpace;
/// let mut bytes = [0u8; 64];
/// bytes[..4].copy_from_slice(&[0xf4, 0x1a, 0x41, 0x10]); // 1af4:1041
/// bytes[0x09..0x0c].copy_from_slice(&[0x00, 0x00, 0x02]); // class 020000
/// let config = ConfigSpace::new(&bytes);
/// assert_eq!(config.vendor_id(), Some(0x1af4));
/// assert_eq!(config.class(), Some(0x02_00_00));
/// assert!(config.capabilities().is_known()); // status says: no capability list
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ConfigSpace<'a> {
    bytes: &'a [u8],
}

impl<'a> ConfigSpace<'a> {
    /// Wraps the bytes of a `config` file.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    /// How many bytes were read.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether nothing was read.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn u8_at(&self, offset: usize) -> Option<u8> {
        self.bytes.get(offset).copied()
    }

    fn u16_at(&self, offset: usize) -> Option<u16> {
        let b = self.bytes.get(offset..offset.checked_add(2)?)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32_at(&self, offset: usize) -> Option<u32> {
        let b = self.bytes.get(offset..offset.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Vendor ID (`0xffff` when the device does not respond).
    pub fn vendor_id(&self) -> Option<u16> {
        self.u16_at(PCI_VENDOR_ID)
    }

    /// Device ID.
    pub fn device_id(&self) -> Option<u16> {
        self.u16_at(PCI_DEVICE_ID)
    }

    /// Revision ID.
    pub fn revision(&self) -> Option<u8> {
        self.u8_at(PCI_REVISION_ID)
    }

    /// The 24-bit class code: base class, subclass, programming interface (as sysfs `class`).
    pub fn class(&self) -> Option<u32> {
        let b = self.bytes.get(PCI_CLASS_PROG..PCI_CLASS_PROG + 3)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], 0]))
    }

    /// Header type without the multi-function bit: 0 = device, 1 = PCI bridge, 2 = CardBus bridge.
    pub fn header_type(&self) -> Option<u8> {
        Some(self.u8_at(PCI_HEADER_TYPE)? & PCI_HEADER_TYPE_MASK)
    }

    /// Legacy interrupt pin: 0 = none, 1..=4 = INTA#..INTD#.
    pub fn interrupt_pin(&self) -> Option<u8> {
        self.u8_at(PCI_INTERRUPT_PIN)
    }

    /// Walks the capability list.
    ///
    /// The walk follows the kernel's rules: the list exists only if bit 4 of the status register
    /// is set; it starts at the pointer at `0x34`; a pointer's low two bits are reserved and masked
    /// off (as the PCI specification tells software to do); a pointer of 0 ends the list; a
    /// non-zero pointer into the 64-byte header, a capability ID of `0xff` (a device that does not
    /// respond) or a revisited capability (a loop; at most 48 hops fit in 256 bytes) makes the list
    /// [`Walk::Malformed`]. Bytes beyond the end of a short read make it [`Walk::Truncated`].
    /// Capabilities found before the walk stopped are kept. Never panics, always terminates.
    pub fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities {
            walk: Walk::Complete,
            entries: Vec::new(),
        };
        let Some(status) = self.u16_at(PCI_STATUS) else {
            caps.walk = self.short(PCI_STATUS + 2);
            return caps;
        };
        if status & PCI_STATUS_CAP_LIST == 0 {
            return caps;
        }
        let Some(first) = self.u8_at(PCI_CAPABILITY_LIST) else {
            caps.walk = self.short(PCI_CAPABILITY_LIST + 1);
            return caps;
        };
        let mut from = PCI_CAPABILITY_LIST;
        let mut pointer = first;
        let mut visited = [false; PCI_CFG_SPACE_SIZE / 4];
        for _ in 0..=PCI_FIND_CAP_TTL {
            let offset = pointer & !3;
            if offset == 0 {
                return caps;
            }
            let at = usize::from(offset);
            if at < PCI_STD_HEADER_SIZEOF {
                caps.walk = Walk::Malformed(Malformed::PointerIntoHeader { from, pointer });
                return caps;
            }
            if std::mem::replace(&mut visited[at / 4], true) {
                caps.walk = Walk::Malformed(Malformed::Loop { offset });
                return caps;
            }
            let (Some(id), Some(next)) = (
                self.u8_at(at + PCI_CAP_LIST_ID),
                self.u8_at(at + PCI_CAP_LIST_NEXT),
            ) else {
                caps.walk = self.short(at + 2);
                return caps;
            };
            if id == 0xff {
                caps.walk = Walk::Malformed(Malformed::InvalidId { offset });
                return caps;
            }
            let kind = match self.kind(id, at) {
                Ok(kind) => kind,
                Err(walk) => {
                    caps.walk = walk;
                    return caps;
                }
            };
            caps.entries.push(Capability { offset, id, kind });
            from = at + PCI_CAP_LIST_NEXT;
            pointer = next;
        }
        // Unreachable in practice: 48 distinct dword slots exist and a revisit is caught above.
        caps.walk = Walk::Malformed(Malformed::Loop {
            offset: pointer & !3,
        });
        caps
    }

    /// The walk result for needing `needed` bytes: truncated if the read was short of
    /// conventional configuration space, malformed if the structure runs past its end.
    fn short(&self, needed: usize) -> Walk {
        if self.bytes.len() < PCI_CFG_SPACE_SIZE {
            Walk::Truncated {
                needed,
                available: self.bytes.len(),
            }
        } else {
            Walk::Malformed(Malformed::PastEnd { needed })
        }
    }

    fn kind(&self, id: u8, at: usize) -> Result<CapabilityKind, Walk> {
        let need = |n: usize| self.short(at + n);
        Ok(match id {
            PCI_CAP_ID_MSI => {
                let flags = self.u16_at(at + PCI_MSI_FLAGS).ok_or_else(|| need(4))?;
                let log2 = (flags & PCI_MSI_FLAGS_QMASK) >> 1;
                CapabilityKind::Msi(Msi {
                    // Encodings 6 and 7 are reserved; the most a function may ask for is 32.
                    vectors: 1 << log2.min(5),
                    is_64bit: flags & PCI_MSI_FLAGS_64BIT != 0,
                    per_vector_masking: flags & PCI_MSI_FLAGS_MASKBIT != 0,
                    enabled: flags & PCI_MSI_FLAGS_ENABLE != 0,
                })
            }
            PCI_CAP_ID_MSIX => {
                let flags = self.u16_at(at + PCI_MSIX_FLAGS);
                let table = self.u32_at(at + PCI_MSIX_TABLE);
                let pba = self.u32_at(at + PCI_MSIX_PBA);
                let (Some(flags), Some(table), Some(pba)) = (flags, table, pba) else {
                    return Err(need(PCI_CAP_MSIX_SIZEOF));
                };
                CapabilityKind::MsiX(MsiX {
                    table_size: (flags & PCI_MSIX_FLAGS_QSIZE) + 1,
                    enabled: flags & PCI_MSIX_FLAGS_ENABLE != 0,
                    masked: flags & PCI_MSIX_FLAGS_MASKALL != 0,
                    table_bar: bir(table),
                    table_offset: table & PCI_MSIX_TABLE_OFFSET,
                    pba_bar: bir(pba),
                    pba_offset: pba & PCI_MSIX_TABLE_OFFSET,
                })
            }
            PCI_CAP_ID_EXP => {
                let flags = self.u16_at(at + PCI_EXP_FLAGS).ok_or_else(|| need(4))?;
                let max = self.u32_at(at + PCI_EXP_LNKCAP).map(|cap| Link {
                    speed: low8(cap & PCI_EXP_LNKCAP_SLS),
                    width: low8((cap & PCI_EXP_LNKCAP_MLW) >> 4),
                });
                let current = self.u16_at(at + PCI_EXP_LNKSTA).map(|sta| Link {
                    speed: low8(u32::from(sta & PCI_EXP_LNKSTA_CLS)),
                    width: low8(u32::from((sta & PCI_EXP_LNKSTA_NLW) >> 4)),
                });
                let link = |l: Option<Link>| l.filter(|l| l.speed != 0 && l.width != 0);
                CapabilityKind::Express(Express {
                    version: low8(u32::from(flags & PCI_EXP_FLAGS_VERS)),
                    port_type: low8(u32::from((flags & PCI_EXP_FLAGS_TYPE) >> 4)),
                    max_link: link(max),
                    link: link(current),
                })
            }
            _ => CapabilityKind::Other,
        })
    }
}

/// The BAR indicator of an MSI-X table or PBA register: always `0..=7`.
fn bir(register: u32) -> u8 {
    low8(register & PCI_MSIX_TABLE_BIR)
}

/// The low byte of a value already masked to fit in it.
fn low8(v: u32) -> u8 {
    v.to_le_bytes()[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 256-byte config space with the capability list bit set and the first pointer at `first`.
    fn space(first: u8) -> Vec<u8> {
        let mut b = vec![0u8; 256];
        b[PCI_STATUS] = PCI_STATUS_CAP_LIST as u8;
        b[PCI_CAPABILITY_LIST] = first;
        b
    }

    fn cap(b: &mut [u8], at: usize, id: u8, next: u8) {
        b[at] = id;
        b[at + 1] = next;
    }

    #[test]
    fn header_fields() {
        // The first 16 bytes of this machine's virtio-net function.
        let mut b = vec![0u8; 64];
        b[..16].copy_from_slice(&[
            0xf4, 0x1a, 0x41, 0x10, 0x06, 0x04, 0x10, 0x00, 0x01, 0x00, 0x00, 0x02, 0, 0, 0x80, 0,
        ]);
        b[PCI_INTERRUPT_PIN] = 1;
        let c = ConfigSpace::new(&b);
        assert_eq!(c.vendor_id(), Some(0x1af4));
        assert_eq!(c.device_id(), Some(0x1041));
        assert_eq!(c.revision(), Some(1));
        assert_eq!(c.class(), Some(0x020000));
        assert_eq!(c.header_type(), Some(0));
        assert_eq!(c.interrupt_pin(), Some(1));
        let short = ConfigSpace::new(&b[..10]);
        assert_eq!(
            (short.class(), short.header_type(), short.revision()),
            (None, None, Some(1))
        );
        assert!(ConfigSpace::new(&[]).is_empty());
    }

    #[test]
    fn decodes_msi_msix_express() {
        let mut b = space(0x40 | 0x3); // reserved low bits must be masked
        cap(&mut b, 0x40, PCI_CAP_ID_MSI, 0x50);
        b[0x42] = 0x8b; // enabled, log2(vectors) = 5, 64-bit
        cap(&mut b, 0x50, PCI_CAP_ID_MSIX, 0x60);
        b[0x52..0x54].copy_from_slice(&(0x8000u16 | 63).to_le_bytes());
        b[0x54..0x58].copy_from_slice(&(0x2000u32 | 1).to_le_bytes());
        b[0x58..0x5c].copy_from_slice(&(0x3000u32 | 2).to_le_bytes());
        cap(&mut b, 0x60, PCI_CAP_ID_EXP, 0x00);
        b[0x62] = 0x02; // version 2, endpoint
        b[0x60 + PCI_EXP_LNKCAP] = 0x84; // 16 GT/s x8
        b[0x60 + PCI_EXP_LNKSTA..0x60 + PCI_EXP_LNKSTA + 2]
            .copy_from_slice(&0x0043u16.to_le_bytes());
        let caps = ConfigSpace::new(&b).capabilities();
        assert_eq!(caps.walk, Walk::Complete);
        assert_eq!(
            caps.entries.iter().map(|c| c.offset).collect::<Vec<_>>(),
            [0x40, 0x50, 0x60]
        );
        let msi = caps.msi().unwrap();
        // 0x8b: enable (bit 0), QMASK bits 1..3 = 0b101 -> 32 vectors, 64-bit (bit 7).
        assert_eq!(
            (
                msi.vectors,
                msi.is_64bit,
                msi.enabled,
                msi.per_vector_masking
            ),
            (32, true, true, false)
        );
        let x = caps.msix().unwrap();
        assert_eq!((x.table_size, x.enabled, x.masked), (64, true, false));
        assert_eq!(
            (x.table_bar, x.table_offset, x.pba_bar, x.pba_offset),
            (1, 0x2000, 2, 0x3000)
        );
        let e = caps.express().unwrap();
        assert_eq!(
            (e.version, e.port_type, e.port_type_name()),
            (2, 0, "Endpoint")
        );
        assert_eq!(e.max_link, Some(Link { speed: 4, width: 8 }));
        assert_eq!(e.link, Some(Link { speed: 3, width: 4 }));
        assert_eq!(e.link.unwrap().speed_text(), Some("8 GT/s"));
        assert_eq!(caps.contains(PCI_CAP_ID_MSIX), Some(true));
        assert_eq!(caps.contains(0x01), Some(false));
    }

    #[test]
    fn no_capability_list() {
        let mut b = space(0x40);
        b[PCI_STATUS] = 0;
        let caps = ConfigSpace::new(&b).capabilities();
        assert!(caps.is_known());
        assert!(caps.entries.is_empty());
        assert_eq!(caps.contains(PCI_CAP_ID_MSI), Some(false));
    }

    #[test]
    fn truncated_reads_are_unknown_not_errors() {
        let mut b = space(0x40);
        cap(&mut b, 0x40, PCI_CAP_ID_MSI, 0);
        let caps = ConfigSpace::new(&b[..64]).capabilities();
        assert_eq!(
            caps.walk,
            Walk::Truncated {
                needed: 0x42,
                available: 64
            }
        );
        assert_eq!(caps.contains(PCI_CAP_ID_MSI), None);
        assert!(!caps.is_known());
        // Header itself cut short.
        assert!(matches!(
            ConfigSpace::new(&b[..5]).capabilities().walk,
            Walk::Truncated { .. }
        ));
        assert!(matches!(
            ConfigSpace::new(&b[..0x34]).capabilities().walk,
            Walk::Truncated { .. }
        ));
        // Body of an MSI-X capability cut short.
        let mut b = space(0x40);
        cap(&mut b, 0x40, PCI_CAP_ID_MSIX, 0);
        let caps = ConfigSpace::new(&b[..0x48]).capabilities();
        assert_eq!(
            caps.walk,
            Walk::Truncated {
                needed: 0x4c,
                available: 0x48
            }
        );
    }

    #[test]
    fn loops_pointers_into_header_and_dead_devices_are_malformed() {
        let mut b = space(0x40);
        cap(&mut b, 0x40, 0x01, 0x50);
        cap(&mut b, 0x50, 0x09, 0x40);
        let caps = ConfigSpace::new(&b).capabilities();
        assert_eq!(caps.walk, Walk::Malformed(Malformed::Loop { offset: 0x40 }));
        assert_eq!(caps.entries.len(), 2);

        let mut b = space(0x40);
        cap(&mut b, 0x40, 0x01, 0x41); // points to itself once masked
        assert_eq!(
            ConfigSpace::new(&b).capabilities().walk,
            Walk::Malformed(Malformed::Loop { offset: 0x40 })
        );

        let mut b = space(0x40);
        cap(&mut b, 0x40, 0x01, 0x10);
        assert_eq!(
            ConfigSpace::new(&b).capabilities().walk,
            Walk::Malformed(Malformed::PointerIntoHeader {
                from: 0x41,
                pointer: 0x10
            })
        );
        let b = space(0x3c);
        assert_eq!(
            ConfigSpace::new(&b).capabilities().walk,
            Walk::Malformed(Malformed::PointerIntoHeader {
                from: 0x34,
                pointer: 0x3c
            })
        );

        let b = vec![0xffu8; 256];
        assert_eq!(
            ConfigSpace::new(&b).capabilities().walk,
            Walk::Malformed(Malformed::InvalidId { offset: 0xfc })
        );

        let mut b = space(0xfc);
        cap(&mut b, 0xfc, PCI_CAP_ID_MSIX, 0);
        assert_eq!(
            ConfigSpace::new(&b).capabilities().walk,
            Walk::Malformed(Malformed::PastEnd { needed: 0xfc + 12 })
        );
    }

    #[test]
    fn longest_possible_chain_is_complete() {
        // Every dword slot from 0x40 to 0xfc, in order: 48 capabilities.
        let mut b = space(0x40);
        for at in (0x40..0x100).step_by(4) {
            let next = if at == 0xfc { 0 } else { (at + 4) as u8 };
            cap(&mut b, at, 0x09, next);
        }
        let caps = ConfigSpace::new(&b).capabilities();
        assert_eq!(caps.walk, Walk::Complete);
        assert_eq!(caps.entries.len(), PCI_FIND_CAP_TTL);
    }

    #[test]
    fn names() {
        assert_eq!(Capability::name_of(PCI_CAP_ID_MSIX), Some("MSI-X"));
        assert_eq!(Capability::name_of(0xee), None);
        assert_eq!(Link { speed: 9, width: 1 }.speed_text(), None);
    }
}
