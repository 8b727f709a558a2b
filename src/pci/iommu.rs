//! IOMMU state, IOMMU groups, and which user-space DMA paths a device can use.

use std::fmt;
use std::path::PathBuf;

use super::sysfs::{is_not_found, read_optional, Error};
use super::{Bdf, DeviceInfo, Sysfs};

/// The name the kernel gives the fake IOMMU groups VFIO creates in no-IOMMU mode.
const NOIOMMU_GROUP_NAME: &str = "vfio-noiommu";

/// An IOMMU group: the functions the IOMMU cannot isolate from one another, which VFIO hands to
/// user space together (`/sys/kernel/iommu_groups/N`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IommuGroup {
    /// The group number (`N` in `/dev/vfio/N`).
    pub number: u32,
    /// Every function in the group, the device itself included, in address order.
    pub members: Vec<Bdf>,
    /// The group's default domain type (sysfs `type`: `DMA`, `DMA-FQ`, `identity`, ...), when the
    /// kernel reports it.
    pub domain_type: Option<String>,
    /// Whether this is a group VFIO made up in no-IOMMU mode (named `vfio-noiommu`): nothing
    /// translates or isolates DMA for it.
    pub noiommu: bool,
}

impl IommuGroup {
    /// Whether the IOMMU translates the group's DMA by default: false for no-IOMMU groups and
    /// for passthrough (`identity`) domains, where the device sees physical addresses.
    pub fn translates(&self) -> bool {
        !self.noiommu && self.domain_type.as_deref() != Some("identity")
    }

    /// The members other than `bdf`.
    pub fn others(&self, bdf: Bdf) -> impl Iterator<Item = Bdf> + '_ {
        self.members.iter().copied().filter(move |&m| m != bdf)
    }
}

/// The system's IOMMU state, from `/sys/class/iommu`, `/sys/kernel/iommu_groups` and VFIO's
/// module parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iommu {
    /// IOMMU units the kernel registered (`/sys/class/iommu`: `dmar0`, `ivhd0`, ...), sorted.
    pub units: Vec<String>,
    /// Number of IOMMU groups, not counting VFIO no-IOMMU groups.
    pub groups: usize,
    /// VFIO's `enable_unsafe_noiommu_mode` parameter; `None` when the `vfio` module is not
    /// loaded (or was built without no-IOMMU support).
    pub noiommu_mode: Option<bool>,
}

impl Iommu {
    /// Whether an IOMMU is active: the kernel registered an IOMMU unit or made an IOMMU group.
    pub fn is_active(&self) -> bool {
        !self.units.is_empty() || self.groups > 0
    }
}

/// A way for user space to drive a device and let it DMA.
///
/// What [`DeviceInfo::dma_paths`] offers, and why:
///
/// * No path for bridges: neither `vfio-pci` nor `uio_pci_generic` drives them.
/// * [`Vfio`](Self::Vfio): the device is in a real IOMMU group. The IOMMU isolates it and
///   translates its DMA through the mappings the process makes; the safe default.
/// * [`VfioNoIommu`](Self::VfioNoIommu): the device is in no real group and VFIO's no-IOMMU mode
///   is on (`modprobe vfio enable_unsafe_noiommu_mode=1`). VFIO's interface, with interrupts
///   (MSI/MSI-X), but no isolation: the device sees physical addresses. Needs `CAP_SYS_RAWIO`.
/// * [`Uio`](Self::Uio): nothing translates the device's DMA (no group, a no-IOMMU group, or a
///   passthrough `identity` domain), so the physical addresses of pinned memory are what the
///   device must use; behind a translating IOMMU they would fault. `uio_pci_generic` binds a
///   device without an interrupt pin too (BAR access and DMA work, interrupts do not), so the
///   pin does not decide the path; [`DeviceInfo::has_intx`] tells whether interrupts will.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum DmaPath {
    /// `vfio-pci` with IOMMU translation.
    #[cfg_attr(feature = "serde", serde(rename = "vfio"))]
    Vfio,
    /// `vfio-pci` in no-IOMMU mode.
    #[cfg_attr(feature = "serde", serde(rename = "vfio-noiommu"))]
    VfioNoIommu,
    /// `uio_pci_generic` with physical addresses.
    #[cfg_attr(feature = "serde", serde(rename = "uio"))]
    Uio,
}

impl DmaPath {
    /// The short name: `vfio`, `vfio-noiommu` or `uio`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Vfio => "vfio",
            Self::VfioNoIommu => "vfio-noiommu",
            Self::Uio => "uio",
        }
    }

    /// The paths `dev` supports on a system with `iommu` (the rules are on [`DmaPath`]).
    pub fn available(dev: &DeviceInfo, iommu: &Iommu) -> Vec<DmaPath> {
        if dev.is_bridge() {
            return Vec::new();
        }
        let group = dev.iommu_group.as_ref();
        let isolated = group.is_some_and(|g| !g.noiommu);
        let mut paths = Vec::new();
        if isolated {
            paths.push(Self::Vfio);
        } else if iommu.noiommu_mode == Some(true) {
            paths.push(Self::VfioNoIommu);
        }
        if group.is_none_or(|g| !g.translates()) {
            paths.push(Self::Uio);
        }
        paths
    }
}

impl fmt::Display for DmaPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Sysfs {
    fn groups_dir(&self) -> PathBuf {
        self.root().join("kernel/iommu_groups")
    }

    /// Reads IOMMU group `number`: its members, domain type, and whether it is a no-IOMMU group.
    ///
    /// # Errors
    /// [`Error::Read`] if the group's `devices` directory cannot be listed, [`Error::BadEntry`]
    /// if an entry there is not a PCI address, [`Error::Parse`] for a non-UTF-8 `type`/`name`.
    pub fn iommu_group(&self, number: u32) -> Result<IommuGroup, Error> {
        let dir = self.groups_dir().join(number.to_string());
        let members = self.list_addresses(&dir.join("devices"))?;
        let domain_type = read_optional(&dir.join("type"))?.map(|t| t.trim().to_owned());
        let name = read_optional(&dir.join("name"))?;
        let noiommu = name.as_deref().map(str::trim) == Some(NOIOMMU_GROUP_NAME);
        Ok(IommuGroup {
            number,
            members,
            domain_type,
            noiommu,
        })
    }

    /// Reads the system's IOMMU state. Missing directories mean "none", not an error (a kernel
    /// without IOMMU support has no `/sys/class/iommu`).
    ///
    /// # Errors
    /// [`Error::Read`] if a directory exists but cannot be listed, [`Error::Parse`] if VFIO's
    /// `enable_unsafe_noiommu_mode` is neither `Y` nor `N`.
    pub fn iommu(&self) -> Result<Iommu, Error> {
        let mut units = self.entry_names(&self.root().join("class/iommu"))?;
        units.sort();
        let mut groups = 0;
        for name in self.entry_names(&self.groups_dir())? {
            let group_name = read_optional(&self.groups_dir().join(&name).join("name"))?;
            if group_name.as_deref().map(str::trim) != Some(NOIOMMU_GROUP_NAME) {
                groups += 1;
            }
        }
        let param = self
            .root()
            .join("module/vfio/parameters/enable_unsafe_noiommu_mode");
        let noiommu_mode = match read_optional(&param)? {
            None => None,
            Some(v) => match v.trim() {
                "Y" | "1" => Some(true),
                "N" | "0" => Some(false),
                _ => return Err(Error::parse(&param, &v, "Y or N")),
            },
        };
        Ok(Iommu {
            units,
            groups,
            noiommu_mode,
        })
    }

    /// Names in a directory; an absent directory has none.
    fn entry_names(&self, dir: &std::path::Path) -> Result<Vec<String>, Error> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if is_not_found(&e) => return Ok(Vec::new()),
            Err(source) => {
                return Err(Error::Read {
                    path: dir.to_owned(),
                    source,
                })
            }
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| Error::Read {
                path: dir.to_owned(),
                source,
            })?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::Capabilities;

    fn dev(group: Option<IommuGroup>, header_type: Option<u8>, class: u32) -> DeviceInfo {
        DeviceInfo {
            bdf: "0000:01:00.0".parse().unwrap(),
            vendor: 0x1234,
            device: 0x5678,
            subsystem_vendor: None,
            subsystem_device: None,
            class,
            revision: None,
            driver: None,
            driver_override: None,
            iommu_group: group,
            numa_node: None,
            resources: Vec::new(),
            header_type,
            interrupt_pin: Some(1),
            capabilities: Capabilities::unreadable(std::io::ErrorKind::NotFound),
        }
    }

    fn group(domain_type: Option<&str>, noiommu: bool) -> Option<IommuGroup> {
        Some(IommuGroup {
            number: 3,
            members: vec!["0000:01:00.0".parse().unwrap()],
            domain_type: domain_type.map(str::to_owned),
            noiommu,
        })
    }

    const NO_IOMMU: Iommu = Iommu {
        units: Vec::new(),
        groups: 0,
        noiommu_mode: None,
    };
    const NOIOMMU_ON: Iommu = Iommu {
        units: Vec::new(),
        groups: 0,
        noiommu_mode: Some(true),
    };

    #[test]
    fn paths_follow_the_documented_rules() {
        use DmaPath::*;
        let on = Iommu {
            units: vec!["dmar0".into()],
            groups: 1,
            noiommu_mode: Some(false),
        };
        let cases = [
            (dev(None, Some(0), 0x120000), &NO_IOMMU, vec![Uio]),
            (
                dev(None, Some(0), 0x120000),
                &NOIOMMU_ON,
                vec![VfioNoIommu, Uio],
            ),
            (
                dev(group(Some("DMA-FQ"), false), Some(0), 0x120000),
                &on,
                vec![Vfio],
            ),
            (dev(group(None, false), Some(0), 0x120000), &on, vec![Vfio]),
            (
                dev(group(Some("identity"), false), Some(0), 0x120000),
                &on,
                vec![Vfio, Uio],
            ),
            (
                dev(group(None, true), Some(0), 0x120000),
                &NOIOMMU_ON,
                vec![VfioNoIommu, Uio],
            ),
            (dev(None, Some(1), 0x060400), &NOIOMMU_ON, vec![]),
            (dev(None, None, 0x060400), &NO_IOMMU, vec![]),
            (dev(None, None, 0x060000), &NO_IOMMU, vec![Uio]),
        ];
        for (i, (d, iommu, want)) in cases.into_iter().enumerate() {
            assert_eq!(d.dma_paths(iommu), want, "case {i}");
        }
    }

    #[test]
    fn names_and_activity() {
        assert_eq!(DmaPath::VfioNoIommu.to_string(), "vfio-noiommu");
        #[cfg(feature = "serde")]
        assert_eq!(serde_json::to_string(&DmaPath::Uio).unwrap(), "\"uio\"");
        assert!(!NO_IOMMU.is_active());
        assert!(Iommu {
            units: vec!["dmar0".into()],
            groups: 0,
            noiommu_mode: None
        }
        .is_active());
        assert!(Iommu {
            units: vec![],
            groups: 2,
            noiommu_mode: None
        }
        .is_active());
        let g = group(None, false).unwrap();
        assert_eq!(g.others(g.members[0]).count(), 0);
        assert!(g.translates());
    }
}
