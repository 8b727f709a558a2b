//! Reading PCI devices from sysfs, under a root that tests point at fake trees.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::{parse_resource, Bdf, BdfError, Capabilities, ConfigSpace, DeviceInfo, ResourceError};

/// Most bytes of a `config` file read (PCI Express extended configuration space).
const MAX_CONFIG: u64 = 4096;

/// A sysfs tree: `/sys` on a live system, any directory with the same layout in tests.
///
/// Every path discovery and binding touch is relative to the root: `bus/pci/devices/<bdf>/...`,
/// `bus/pci/drivers/<name>`, `bus/pci/drivers_probe`, `kernel/iommu_groups/<n>/...`,
/// `class/iommu`, `module/vfio/parameters/enable_unsafe_noiommu_mode`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    /// A sysfs tree rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The system's sysfs, `/sys`.
    pub fn system() -> Self {
        Self::new("/sys")
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `bus/pci/devices`.
    pub fn devices_dir(&self) -> PathBuf {
        self.root.join("bus/pci/devices")
    }

    /// `bus/pci/devices/<bdf>`.
    pub fn device_dir(&self, bdf: Bdf) -> PathBuf {
        self.devices_dir().join(bdf.to_string())
    }

    /// `bus/pci/drivers/<name>`.
    pub fn driver_dir(&self, name: &str) -> PathBuf {
        self.root.join("bus/pci/drivers").join(name)
    }

    /// Whether PCI driver `name` is registered (its module is loaded or built in).
    pub fn driver_loaded(&self, name: &str) -> bool {
        self.driver_dir(name).is_dir()
    }

    /// Whether function `bdf` exists.
    pub fn exists(&self, bdf: Bdf) -> bool {
        self.device_dir(bdf).symlink_metadata().is_ok()
    }

    /// The addresses of every PCI function, in order.
    ///
    /// # Errors
    /// [`Error::Read`] if `bus/pci/devices` cannot be listed (the message asks whether sysfs is
    /// mounted there), [`Error::BadEntry`] if an entry is not a PCI address.
    pub fn addresses(&self) -> Result<Vec<Bdf>, Error> {
        self.list_addresses(&self.devices_dir())
    }

    /// Every PCI function's [`DeviceInfo`], in address order.
    ///
    /// # Errors
    /// As [`addresses`](Self::addresses) and [`device`](Self::device).
    pub fn devices(&self) -> Result<Vec<DeviceInfo>, Error> {
        self.addresses()?
            .into_iter()
            .map(|bdf| self.device(bdf))
            .collect()
    }

    /// Reads everything sysfs says about function `bdf`.
    ///
    /// `vendor`, `device`, `class` and `resource` must exist; the other attributes may be absent
    /// (then `None`). A present attribute with content not in the kernel's format is an error. A
    /// missing, unreadable or short `config` file leaves the capabilities unknown (see
    /// [`Capabilities::walk`]) and is not an error.
    ///
    /// # Errors
    /// [`Error::NotFound`] if there is no such function; [`Error::Read`], [`Error::Parse`],
    /// [`Error::Link`], [`Error::LinkTarget`], [`Error::Resource`] naming the attribute that
    /// could not be read or parsed.
    pub fn device(&self, bdf: Bdf) -> Result<DeviceInfo, Error> {
        let dir = self.device_dir(bdf);
        if let Err(e) = dir.symlink_metadata() {
            if is_not_found(&e) {
                return Err(Error::NotFound {
                    bdf,
                    dir: self.devices_dir(),
                });
            }
            return Err(Error::Read {
                path: dir,
                source: e,
            });
        }
        let hex = |name: &str, bits| hex_attr(&dir.join(name), bits);
        let opt_hex = |name: &str, bits| -> Result<Option<u64>, Error> {
            let path = dir.join(name);
            read_optional(&path)?
                .map(|text| parse_hex_attr(&path, &text, bits))
                .transpose()
        };
        let vendor = narrow16(hex("vendor", 16)?);
        let device = narrow16(hex("device", 16)?);
        let class = narrow32(hex("class", 24)?);
        let subsystem_vendor = opt_hex("subsystem_vendor", 16)?.map(narrow16);
        let subsystem_device = opt_hex("subsystem_device", 16)?.map(narrow16);
        let revision = opt_hex("revision", 8)?.map(|v| v.to_le_bytes()[0]);
        let numa_node = self.numa_node(&dir)?;
        let driver_override = self.driver_override(bdf)?;
        let driver = self.driver(bdf)?;
        let iommu_group = match link_name(&dir.join("iommu_group"))? {
            None => None,
            Some((path, name)) => {
                let number = name.parse::<u32>().map_err(|_| Error::LinkTarget {
                    path,
                    target: name,
                    expected: "group number",
                })?;
                Some(self.iommu_group(number)?)
            }
        };
        let resource_path = dir.join("resource");
        let resources = parse_resource(&read_attr(&resource_path)?)
            .map_err(|source| Error::Resource {
                path: resource_path,
                source,
            })?
            .into_iter()
            .filter(|r| !r.is_empty())
            .collect();
        let (header_type, interrupt_pin, capabilities) = match read_config(&dir.join("config")) {
            Ok(bytes) => {
                let config = ConfigSpace::new(&bytes);
                (
                    config.header_type(),
                    config.interrupt_pin(),
                    config.capabilities(),
                )
            }
            Err(e) => (None, None, Capabilities::unreadable(e.kind())),
        };
        Ok(DeviceInfo {
            bdf,
            vendor,
            device,
            subsystem_vendor,
            subsystem_device,
            class,
            revision,
            driver,
            driver_override,
            iommu_group,
            numa_node,
            resources,
            header_type,
            interrupt_pin,
            capabilities,
        })
    }

    /// The name of the driver bound to `bdf` (the `driver` symlink), `None` when unbound.
    ///
    /// # Errors
    /// [`Error::Link`] if `driver` exists but is not a readable symlink, [`Error::LinkTarget`] if
    /// its target has no usable name.
    pub fn driver(&self, bdf: Bdf) -> Result<Option<String>, Error> {
        Ok(link_name(&self.device_dir(bdf).join("driver"))?.map(|(_, name)| name))
    }

    /// The function's `driver_override`, `None` when unset (`(null)`) or unsupported.
    ///
    /// # Errors
    /// [`Error::Read`] / [`Error::Parse`] if the attribute cannot be read.
    pub fn driver_override(&self, bdf: Bdf) -> Result<Option<String>, Error> {
        let text = read_optional(&self.device_dir(bdf).join("driver_override"))?;
        Ok(text.and_then(|t| {
            let t = t.trim();
            (!t.is_empty() && t != "(null)").then(|| t.to_owned())
        }))
    }

    fn numa_node(&self, dir: &Path) -> Result<Option<u32>, Error> {
        let path = dir.join("numa_node");
        let Some(text) = read_optional(&path)? else {
            return Ok(None);
        };
        let value = text.strip_suffix('\n').unwrap_or(&text);
        if value == "-1" {
            return Ok(None);
        }
        match value.parse::<u32>() {
            Ok(n) if value.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(n)),
            _ => Err(Error::parse(&path, &text, "a node number or -1")),
        }
    }

    /// The PCI addresses named by the entries of `dir`, sorted.
    pub(super) fn list_addresses(&self, dir: &Path) -> Result<Vec<Bdf>, Error> {
        let read_err = |source| {
            if dir == self.devices_dir() {
                Error::NoPciBus {
                    dir: dir.to_owned(),
                    source,
                }
            } else {
                Error::Read {
                    path: dir.to_owned(),
                    source,
                }
            }
        };
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).map_err(read_err)? {
            let entry = entry.map_err(read_err)?;
            let name = entry.file_name();
            let path = entry.path();
            let bdf = name
                .to_str()
                .unwrap_or("(not UTF-8)")
                .parse::<Bdf>()
                .map_err(|source| Error::BadEntry { path, source })?;
            out.push(bdf);
        }
        out.sort();
        Ok(out)
    }
}

/// Whether an I/O error means "absent".
pub(super) fn is_not_found(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

/// Reads a text attribute.
pub(super) fn read_attr(path: &Path) -> Result<String, Error> {
    let bytes = fs::read(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    String::from_utf8(bytes)
        .map_err(|e| Error::parse(path, &String::from_utf8_lossy(e.as_bytes()), "UTF-8 text"))
}

/// Reads a text attribute that may be absent.
pub(super) fn read_optional(path: &Path) -> Result<Option<String>, Error> {
    match read_attr(path) {
        Ok(text) => Ok(Some(text)),
        Err(Error::Read { source, .. }) if is_not_found(&source) => Ok(None),
        Err(e) => Err(e),
    }
}

fn hex_attr(path: &Path, bits: u32) -> Result<u64, Error> {
    parse_hex_attr(path, &read_attr(path)?, bits)
}

fn parse_hex_attr(path: &Path, text: &str, bits: u32) -> Result<u64, Error> {
    parse_hex(text, bits).ok_or_else(|| {
        let expected = match bits {
            8 => "0x and 1 to 2 hex digits",
            16 => "0x and 1 to 4 hex digits",
            _ => "0x and 1 to 6 hex digits",
        };
        Error::parse(path, text, expected)
    })
}

/// Parses a sysfs hex attribute as the kernel writes it (`0x8086`, one optional trailing newline)
/// into a value of at most `bits` bits.
pub(crate) fn parse_hex(text: &str, bits: u32) -> Option<u64> {
    let value = text.strip_suffix('\n').unwrap_or(text);
    let digits = value.strip_prefix("0x")?;
    let max_digits = usize::try_from(bits.div_ceil(4)).ok()?;
    if digits.is_empty()
        || digits.len() > max_digits
        || !digits.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    let v = u64::from_str_radix(digits, 16).ok()?;
    (bits >= 64 || v >> bits == 0).then_some(v)
}

fn narrow16(v: u64) -> u16 {
    let [a, b, ..] = v.to_le_bytes();
    u16::from_le_bytes([a, b])
}

fn narrow32(v: u64) -> u32 {
    let [a, b, c, d, ..] = v.to_le_bytes();
    u32::from_le_bytes([a, b, c, d])
}

/// The file name of the target of symlink `path`, `None` if there is no such link.
fn link_name(path: &Path) -> Result<Option<(PathBuf, String)>, Error> {
    let target = match fs::read_link(path) {
        Ok(t) => t,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(source) => {
            return Err(Error::Link {
                path: path.to_owned(),
                source,
            })
        }
    };
    match target.file_name().and_then(|n| n.to_str()) {
        Some(name) if !name.is_empty() => Ok(Some((path.to_owned(), name.to_owned()))),
        _ => Err(Error::LinkTarget {
            path: path.to_owned(),
            target: target.display().to_string(),
            expected: "name",
        }),
    }
}

fn read_config(path: &Path) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    fs::File::open(path)?
        .take(MAX_CONFIG)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Reading PCI devices from sysfs failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No function with this address.
    #[error("no PCI device {bdf} in {dir}: `userdma list` shows the devices present")]
    NotFound {
        /// The address asked for.
        bdf: Bdf,
        /// The directory searched.
        dir: PathBuf,
    },
    /// The PCI device directory cannot be listed.
    #[error("cannot list PCI devices in {dir} (is sysfs mounted there?)")]
    NoPciBus {
        /// `bus/pci/devices`.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// An attribute or directory cannot be read.
    #[error("cannot read {path}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// An attribute's content is not in the kernel's format.
    #[error("unexpected content {value:?} in {path}: expected {expected}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The content (cut to 80 characters).
        value: String,
        /// What the kernel writes there.
        expected: &'static str,
    },
    /// A directory entry that should be a PCI address is not.
    #[error("unexpected entry {path}")]
    BadEntry {
        /// The entry.
        path: PathBuf,
        /// Why it is not an address.
        #[source]
        source: BdfError,
    },
    /// A symlink (`driver`, `iommu_group`) exists but cannot be read as a link.
    #[error("cannot read symlink {path}")]
    Link {
        /// The link.
        path: PathBuf,
        /// The cause (e.g. it is a regular file).
        #[source]
        source: io::Error,
    },
    /// A symlink's target does not end in what the kernel puts there.
    #[error("symlink {path} points to {target:?}, which does not end in a {expected}")]
    LinkTarget {
        /// The link.
        path: PathBuf,
        /// Its target.
        target: String,
        /// What its last component should be.
        expected: &'static str,
    },
    /// The `resource` file is not in the kernel's format.
    #[error("unexpected content in {path}")]
    Resource {
        /// The file.
        path: PathBuf,
        /// The bad line.
        #[source]
        source: ResourceError,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::NotFound { .. } | Error::NoPciBus { .. } => Code::NotFound,
            // sysfs unreadable, or not in the kernel's format: the system failed.
            Error::Read { .. }
            | Error::Parse { .. }
            | Error::BadEntry { .. }
            | Error::Link { .. }
            | Error::LinkTarget { .. }
            | Error::Resource { .. } => Code::System,
        }
    }

    pub(super) fn parse(path: &Path, value: &str, expected: &'static str) -> Self {
        Self::Parse {
            path: path.to_owned(),
            value: value.chars().take(80).collect(),
            expected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_attributes() {
        assert_eq!(parse_hex("0x8086\n", 16), Some(0x8086));
        assert_eq!(parse_hex("0x8086", 16), Some(0x8086));
        assert_eq!(parse_hex("0x020000\n", 24), Some(0x020000));
        assert_eq!(parse_hex("0x01\n", 8), Some(1));
        assert_eq!(parse_hex("0xffff", 16), Some(0xffff));
        for bad in [
            "",
            "\n",
            "0x",
            "8086",
            "0x8086\n\n",
            " 0x8086",
            "0x1ffff",
            "0x10000",
            "0xg",
            "0X80",
        ] {
            assert_eq!(parse_hex(bad, 16), None, "{bad:?}");
        }
        assert_eq!(parse_hex("0x1000000", 24), None);
        assert_eq!(parse_hex("0x100", 8), None);
        assert_eq!(parse_hex("0xffffffffffffffff", 64), Some(u64::MAX));
    }

    #[test]
    fn narrowing_keeps_low_bits() {
        assert_eq!(narrow16(0x8086), 0x8086);
        assert_eq!(narrow32(0xff_ff00), 0xff_ff00);
    }
}
