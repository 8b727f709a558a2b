//! Discovery against this machine's real `/sys/bus/pci`, read-only: every device must parse and
//! agree with its own configuration space.

use std::fs;
use std::path::Path;

use userdma::pci::{Bdf, ConfigSpace, DmaPath, ResourceKind, Sysfs, Walk};

fn system_devices() -> Vec<userdma::pci::DeviceInfo> {
    let devices = Sysfs::system()
        .devices()
        .expect("reading /sys/bus/pci/devices");
    assert!(
        !devices.is_empty(),
        "no PCI devices in /sys/bus/pci/devices: these tests need a machine or VM with a PCI bus"
    );
    devices
}

#[test]
fn every_device_parses_and_its_address_round_trips() {
    let devices = system_devices();
    let mut names: Vec<String> = fs::read_dir("/sys/bus/pci/devices")
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let listed: Vec<String> = devices.iter().map(|d| d.bdf.to_string()).collect();
    assert_eq!(
        listed, names,
        "canonical BDFs are exactly the kernel's names"
    );
    for d in &devices {
        assert_eq!(d.bdf.to_string().parse::<Bdf>().unwrap(), d.bdf);
    }
}

#[test]
fn ids_are_plausible_and_match_configuration_space() {
    for d in system_devices() {
        assert!(
            d.vendor != 0 && d.vendor != 0xffff,
            "{}: vendor {:04x}",
            d.bdf,
            d.vendor
        );
        let path = Path::new("/sys/bus/pci/devices")
            .join(d.bdf.to_string())
            .join("config");
        let bytes =
            fs::read(&path).unwrap_or_else(|e| panic!("{} is world-readable: {e}", path.display()));
        assert!(
            bytes.len() >= 64,
            "{}: config is {} bytes",
            d.bdf,
            bytes.len()
        );
        let c = ConfigSpace::new(&bytes);
        assert_eq!(c.vendor_id(), Some(d.vendor), "{}", d.bdf);
        assert_eq!(c.device_id(), Some(d.device), "{}", d.bdf);
        assert_eq!(c.class(), Some(d.class), "{}: class", d.bdf);
        if let Some(rev) = d.revision {
            assert_eq!(c.revision(), Some(rev), "{}", d.bdf);
        }
        assert_eq!(d.header_type, c.header_type());
        // Root reads the whole space, so the walk must finish; others get the 64-byte header.
        if bytes.len() >= 256 {
            assert_eq!(d.capabilities.walk, Walk::Complete, "{}", d.bdf);
        } else {
            assert!(matches!(
                d.capabilities.walk,
                Walk::Complete | Walk::Truncated { .. }
            ));
        }
    }
}

#[test]
fn links_groups_and_bars_are_consistent() {
    let sysfs = Sysfs::system();
    let iommu = sysfs.iommu().expect("reading the IOMMU state");
    for d in system_devices() {
        let dir = sysfs.device_dir(d.bdf);
        let link = fs::read_link(dir.join("driver")).ok();
        let name = link
            .as_ref()
            .and_then(|l| l.file_name())
            .and_then(|n| n.to_str());
        assert_eq!(d.driver.as_deref(), name, "{}", d.bdf);
        if let Some(g) = &d.iommu_group {
            assert!(
                g.members.contains(&d.bdf),
                "{} in its own group {}",
                d.bdf,
                g.number
            );
        } else {
            assert!(!dir.join("iommu_group").exists(), "{}", d.bdf);
        }
        for r in &d.resources {
            if let ResourceKind::Bar(_) | ResourceKind::Rom = r.kind() {
                assert!(
                    r.size().is_power_of_two(),
                    "{} BAR {} size {:#x}",
                    d.bdf,
                    r.index(),
                    r.size()
                );
                assert_eq!(
                    r.start() % r.size(),
                    0,
                    "{} BAR {} alignment",
                    d.bdf,
                    r.index()
                );
            }
        }
        // A bridge gets no path; a device whose DMA nothing translates can use uio.
        let paths = d.dma_paths(&iommu);
        if d.is_bridge() {
            assert!(paths.is_empty(), "{}", d.bdf);
        } else if d.iommu_group.as_ref().is_none_or(|g| !g.translates()) {
            assert!(paths.contains(&DmaPath::Uio), "{}: {paths:?}", d.bdf);
        }
    }
}
