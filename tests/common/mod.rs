//! Fake sysfs trees and a fake kernel for the PCI and command-line tests.
//!
//! [`Tree`] lays out the parts of sysfs that discovery and binding read, in a temporary
//! directory, the way the kernel does: device directories under `devices/pci0000:00/` with
//! `bus/pci/devices/<bdf>` symlinks to them, `driver` and `iommu_group` symlinks, driver
//! directories with `unbind` files, `bus/pci/drivers_probe`, `kernel/iommu_groups/<n>/devices/`.
//! [`FakeKernel`] plays the kernel's part when binding writes to those files.

#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use userdma::pci::{Kernel, Sysfs};

/// One fake PCI function's attributes.
#[derive(Debug, Clone)]
pub(crate) struct Dev {
    pub(crate) bdf: String,
    pub(crate) vendor: u16,
    pub(crate) device: u16,
    pub(crate) class: u32,
    pub(crate) subsystem: Option<(u16, u16)>,
    pub(crate) revision: Option<u8>,
    pub(crate) numa_node: Option<String>,
    pub(crate) driver_override: Option<String>,
    pub(crate) resource: String,
    pub(crate) config: Option<Vec<u8>>,
}

/// A `resource` file line.
pub(crate) fn resource_line(start: u64, end: u64, flags: u64) -> String {
    format!("0x{start:016x} 0x{end:016x} 0x{flags:016x}\n")
}

/// A `resource` file with BAR0 = 16 KiB of 64-bit memory at `0xfe000000`, BAR2 = 256 I/O ports,
/// and the other lines (up to the ROM) unused.
pub(crate) fn default_resource() -> String {
    let mut text = resource_line(0xfe00_0000, 0xfe00_3fff, 0x0014_0204);
    text.push_str(&resource_line(0, 0, 0));
    text.push_str(&resource_line(0xc000, 0xc0ff, 0x0004_0101));
    for _ in 3..7 {
        text.push_str(&resource_line(0, 0, 0));
    }
    text
}

/// 256 bytes of configuration space: the IDs, class, header type 0, INTA#, and a capability
/// list MSI (0x40, 8 vectors, 64-bit) -> MSI-X (0x50, 16 entries, table in BAR0 at 0x2000,
/// PBA in BAR0 at 0x3000) -> PCI Express (0x60, v2 endpoint, 8 GT/s x4).
pub(crate) fn config_space(vendor: u16, device: u16, class: u32) -> Vec<u8> {
    let mut b = vec![0u8; 256];
    b[0..2].copy_from_slice(&vendor.to_le_bytes());
    b[2..4].copy_from_slice(&device.to_le_bytes());
    b[6] = 0x10; // status: capability list
    b[8] = 0x01; // revision
    b[9..12].copy_from_slice(&class.to_le_bytes()[..3]);
    b[0x34] = 0x40;
    b[0x3d] = 1;
    b[0x40] = 0x05;
    b[0x41] = 0x50;
    b[0x42] = 0x86; // 8 vectors (log2 3 << 1), 64-bit
    b[0x50] = 0x11;
    b[0x51] = 0x60;
    b[0x52..0x54].copy_from_slice(&15u16.to_le_bytes());
    b[0x54..0x58].copy_from_slice(&0x2000u32.to_le_bytes());
    b[0x58..0x5c].copy_from_slice(&0x3000u32.to_le_bytes());
    b[0x60] = 0x10;
    b[0x61] = 0x00;
    b[0x62] = 0x02;
    b[0x6c] = 0x43; // link capabilities: 8 GT/s x4
    b[0x72..0x74].copy_from_slice(&0x0043u16.to_le_bytes());
    b
}

impl Dev {
    /// A virtio-net-like function at `bdf` with every attribute present.
    pub(crate) fn new(bdf: &str) -> Self {
        Self {
            bdf: bdf.to_owned(),
            vendor: 0x1af4,
            device: 0x1041,
            class: 0x02_00_00,
            subsystem: Some((0x1af4, 0x1100)),
            revision: Some(1),
            numa_node: Some("0".to_owned()),
            driver_override: Some("(null)".to_owned()),
            resource: default_resource(),
            config: Some(config_space(0x1af4, 0x1041, 0x02_00_00)),
        }
    }

    /// The same with other IDs (config space follows).
    pub(crate) fn ids(mut self, vendor: u16, device: u16, class: u32) -> Self {
        self.vendor = vendor;
        self.device = device;
        self.class = class;
        self.config = Some(config_space(vendor, device, class));
        self
    }
}

/// A fake sysfs tree in a temporary directory (removed on drop).
#[derive(Debug)]
pub(crate) struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    /// An empty tree: no devices, no drivers, no IOMMU.
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("creating a temporary directory");
        let t = Self { dir };
        for d in [
            "bus/pci/devices",
            "bus/pci/drivers",
            "devices/pci0000:00",
            "kernel/iommu_groups",
            "class/iommu",
        ] {
            fs::create_dir_all(t.root().join(d)).unwrap();
        }
        t.write("bus/pci/drivers_probe", "");
        t
    }

    /// The tree's root (what `--sysfs-root` takes).
    pub(crate) fn root(&self) -> &Path {
        self.dir.path()
    }

    /// A [`Sysfs`] reading this tree.
    pub(crate) fn sysfs(&self) -> Sysfs {
        Sysfs::new(self.root())
    }

    /// The real directory of device `bdf`.
    pub(crate) fn dev_dir(&self, bdf: &str) -> PathBuf {
        self.root().join("devices/pci0000:00").join(bdf)
    }

    /// Relative path of attribute `name` of `bdf` through `bus/pci/devices`.
    pub(crate) fn attr(bdf: &str, name: &str) -> String {
        format!("bus/pci/devices/{bdf}/{name}")
    }

    /// Adds a device.
    pub(crate) fn add(&self, dev: &Dev) -> &Self {
        let dir = self.dev_dir(&dev.bdf);
        fs::create_dir_all(&dir).unwrap();
        symlink(
            format!("../../../devices/pci0000:00/{}", dev.bdf),
            self.root().join("bus/pci/devices").join(&dev.bdf),
        )
        .unwrap();
        let w = |name: &str, value: String| fs::write(dir.join(name), value).unwrap();
        w("vendor", format!("0x{:04x}\n", dev.vendor));
        w("device", format!("0x{:04x}\n", dev.device));
        w("class", format!("0x{:06x}\n", dev.class));
        if let Some((sv, sd)) = dev.subsystem {
            w("subsystem_vendor", format!("0x{sv:04x}\n"));
            w("subsystem_device", format!("0x{sd:04x}\n"));
        }
        if let Some(r) = dev.revision {
            w("revision", format!("0x{r:02x}\n"));
        }
        if let Some(n) = &dev.numa_node {
            w("numa_node", format!("{n}\n"));
        }
        if let Some(o) = &dev.driver_override {
            w("driver_override", format!("{o}\n"));
        }
        w("resource", dev.resource.clone());
        if let Some(c) = &dev.config {
            fs::write(dir.join("config"), c).unwrap();
        }
        self
    }

    /// Registers driver `name` (as loading its module would).
    pub(crate) fn driver(&self, name: &str) -> &Self {
        let dir = self.root().join("bus/pci/drivers").join(name);
        fs::create_dir_all(&dir).unwrap();
        for f in ["bind", "unbind", "new_id", "remove_id"] {
            fs::write(dir.join(f), "").unwrap();
        }
        self
    }

    /// Binds `bdf` to `driver` (which must be registered): both symlinks the kernel makes.
    pub(crate) fn bind(&self, bdf: &str, driver: &str) -> &Self {
        link_driver(self.root(), bdf, driver);
        self
    }

    /// Creates IOMMU group `n` holding `members` (which must exist), with domain type `DMA`.
    pub(crate) fn group(&self, n: u32, members: &[&str]) -> &Self {
        let dir = self.root().join(format!("kernel/iommu_groups/{n}"));
        fs::create_dir_all(dir.join("devices")).unwrap();
        fs::write(dir.join("type"), "DMA\n").unwrap();
        for m in members {
            symlink(
                format!("../../../../devices/pci0000:00/{m}"),
                dir.join("devices").join(m),
            )
            .unwrap();
            symlink(
                format!("../../../kernel/iommu_groups/{n}"),
                self.dev_dir(m).join("iommu_group"),
            )
            .unwrap();
        }
        self
    }

    /// Writes `content` to `rel` (creating parent directories).
    pub(crate) fn write(&self, rel: &str, content: impl AsRef<[u8]>) -> &Self {
        let path = self.root().join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
        self
    }

    /// Removes file or symlink `rel`.
    pub(crate) fn remove(&self, rel: &str) -> &Self {
        fs::remove_file(self.root().join(rel)).unwrap();
        self
    }

    /// Reads `rel` as text.
    pub(crate) fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.root().join(rel)).unwrap()
    }

    /// The driver `bdf` is bound to, from its symlink.
    pub(crate) fn driver_of(&self, bdf: &str) -> Option<String> {
        link_target_name(&self.dev_dir(bdf).join("driver"))
    }
}

impl Default for Tree {
    fn default() -> Self {
        Self::new()
    }
}

fn link_target_name(link: &Path) -> Option<String> {
    let target = fs::read_link(link).ok()?;
    Some(target.file_name()?.to_str()?.to_owned())
}

fn link_driver(root: &Path, bdf: &str, driver: &str) {
    let dev = root.join("devices/pci0000:00").join(bdf);
    symlink(
        format!("../../../bus/pci/drivers/{driver}"),
        dev.join("driver"),
    )
    .unwrap();
    let back = root.join("bus/pci/drivers").join(driver).join(bdf);
    symlink(format!("../../../../devices/pci0000:00/{bdf}"), back).unwrap();
}

/// An injected failure: writes to a path ending in `suffix` fail with `kind`, `times` times,
/// after `skip` matching writes went through.
#[derive(Debug)]
struct Fail {
    suffix: String,
    skip: usize,
    times: usize,
    kind: io::ErrorKind,
}

/// Plays the kernel's reactions to the writes binding makes to a [`Tree`]:
///
/// * `driver_override`: stores the value (a lone newline stores `(null)`);
/// * `drivers/<d>/unbind`: removes the device's `driver` link if it names `d`, else `ENODEV`;
/// * `drivers_probe`: if the device is unbound, binds the driver its `driver_override` names,
///   else its default driver (set with [`default_driver`](Self::default_driver)), if that driver
///   is registered and does not [`refuse`](Self::refuse) devices.
///
/// Every write is logged; [`fail`](Self::fail) injects errors.
#[derive(Debug)]
pub(crate) struct FakeKernel {
    root: PathBuf,
    defaults: HashMap<String, String>,
    refusing: HashSet<String>,
    failures: RefCell<Vec<Fail>>,
    log: RefCell<Vec<(String, String)>>,
}

impl FakeKernel {
    /// A kernel for `tree`.
    pub(crate) fn new(tree: &Tree) -> Self {
        Self {
            root: tree.root().to_owned(),
            defaults: HashMap::new(),
            refusing: HashSet::new(),
            failures: RefCell::new(Vec::new()),
            log: RefCell::new(Vec::new()),
        }
    }

    /// The driver a probe binds `bdf` to when no override is set.
    pub(crate) fn default_driver(mut self, bdf: &str, driver: &str) -> Self {
        self.defaults.insert(bdf.to_owned(), driver.to_owned());
        self
    }

    /// Makes `driver`'s probe fail (the device stays unbound, the write succeeds).
    pub(crate) fn refuse(mut self, driver: &str) -> Self {
        self.refusing.insert(driver.to_owned());
        self
    }

    /// Makes writes to paths ending in `suffix` fail with `kind`, `times` times, after `skip`
    /// matching writes.
    pub(crate) fn fail(&self, suffix: &str, skip: usize, times: usize, kind: io::ErrorKind) {
        let f = Fail {
            suffix: suffix.to_owned(),
            skip,
            times,
            kind,
        };
        self.failures.borrow_mut().push(f);
    }

    /// The writes made: (path relative to the root, value).
    pub(crate) fn log(&self) -> Vec<(String, String)> {
        self.log.borrow().clone()
    }

    fn injected(&self, rel: &str) -> Option<io::Error> {
        for f in self.failures.borrow_mut().iter_mut() {
            if rel.ends_with(&f.suffix) {
                if f.skip > 0 {
                    f.skip -= 1;
                } else if f.times > 0 {
                    f.times -= 1;
                    return Some(f.kind.into());
                }
            }
        }
        None
    }

    fn enodev() -> io::Error {
        io::Error::from_raw_os_error(libc::ENODEV)
    }
}

impl Kernel for FakeKernel {
    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        let rel = path
            .strip_prefix(&self.root)
            .map_err(|_| io::Error::other("write outside the fake tree"))?
            .to_str()
            .expect("UTF-8 path")
            .to_owned();
        self.log.borrow_mut().push((rel.clone(), value.to_owned()));
        if let Some(e) = self.injected(&rel) {
            return Err(e);
        }
        if !path.exists() {
            return Err(io::ErrorKind::NotFound.into());
        }
        let parts: Vec<&str> = rel.split('/').collect();
        let value = value.trim();
        match parts.as_slice() {
            ["bus", "pci", "devices", _, "driver_override"] => {
                let stored = if value.is_empty() {
                    "(null)".to_owned()
                } else {
                    value.to_owned()
                };
                fs::write(path, format!("{stored}\n"))
            }
            ["bus", "pci", "drivers", driver, "unbind"] => {
                let dev = self.root.join("devices/pci0000:00").join(value);
                if link_target_name(&dev.join("driver")).as_deref() != Some(*driver) {
                    return Err(Self::enodev());
                }
                fs::remove_file(dev.join("driver"))?;
                fs::remove_file(self.root.join("bus/pci/drivers").join(driver).join(value))
            }
            ["bus", "pci", "drivers_probe"] => {
                let dev = self.root.join("devices/pci0000:00").join(value);
                if !dev.is_dir() {
                    return Err(Self::enodev());
                }
                if link_target_name(&dev.join("driver")).is_some() {
                    return Ok(());
                }
                let wanted = fs::read_to_string(dev.join("driver_override"))
                    .ok()
                    .map(|s| s.trim().to_owned())
                    .filter(|s| s != "(null)" && !s.is_empty())
                    .or_else(|| self.defaults.get(value).cloned());
                if let Some(driver) = wanted {
                    let registered = self.root.join("bus/pci/drivers").join(&driver).is_dir();
                    if registered && !self.refusing.contains(&driver) {
                        link_driver(&self.root, value, &driver);
                    }
                }
                Ok(())
            }
            _ => Err(io::ErrorKind::PermissionDenied.into()),
        }
    }
}
