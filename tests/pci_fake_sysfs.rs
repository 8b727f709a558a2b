//! PCI discovery and binding against fake sysfs trees: every attribute, every error path, and
//! binding with a fake kernel including each rollback.

mod common;

use std::io;

use common::{config_space, resource_line, Dev, FakeKernel, Tree};
use userdma::pci::{
    Bdf, BindError, BindOptions, Binder, DmaPath, Driver, Error, ResourceKind, ResourceReason,
    StepError, Walk,
};

fn bdf(s: &str) -> Bdf {
    s.parse().unwrap()
}

const DEV: &str = "0000:01:00.0";

/// A tree with one fully described device bound to `nvme`, in IOMMU group 7 alone.
fn one_device() -> Tree {
    let t = Tree::new();
    t.add(&Dev::new(DEV))
        .driver("nvme")
        .bind(DEV, "nvme")
        .group(7, &[DEV]);
    t
}

// ---- discovery ----------------------------------------------------------------------------

#[test]
fn reads_every_attribute() {
    let t = one_device();
    t.write("kernel/iommu_groups/7/type", "DMA-FQ\n");
    let d = t.sysfs().device(bdf(DEV)).unwrap();
    assert_eq!(d.bdf, bdf(DEV));
    assert_eq!((d.vendor, d.device, d.class), (0x1af4, 0x1041, 0x020000));
    assert_eq!(
        (d.subsystem_vendor, d.subsystem_device),
        (Some(0x1af4), Some(0x1100))
    );
    assert_eq!(d.revision, Some(1));
    assert_eq!(d.numa_node, Some(0));
    assert_eq!(d.driver.as_deref(), Some("nvme"));
    assert_eq!(d.driver_override, None);
    let g = d.iommu_group.as_ref().unwrap();
    assert_eq!((g.number, g.members.as_slice()), (7, [bdf(DEV)].as_slice()));
    assert_eq!(g.domain_type.as_deref(), Some("DMA-FQ"));
    assert!(!g.noiommu && g.translates());
    // Unused resource lines are dropped; BAR0 and BAR2 stay.
    let kinds: Vec<_> = d.resources.iter().map(|r| r.kind()).collect();
    assert_eq!(kinds, [ResourceKind::Bar(0), ResourceKind::Bar(2)]);
    assert_eq!(d.resources[0].size(), 0x4000);
    assert!(d.resources[0].is_64bit() && d.resources[1].is_io());
    assert_eq!(d.bars().count(), 2);
    assert_eq!(
        (d.header_type, d.interrupt_pin, d.has_intx()),
        (Some(0), Some(1), Some(true))
    );
    assert!(d.capabilities.is_known());
    assert_eq!(d.capabilities.msi().unwrap().vectors, 8);
    assert_eq!(d.capabilities.msix().unwrap().table_size, 16);
    let e = d.capabilities.express().unwrap();
    assert_eq!(
        (e.version, e.link.unwrap().speed, e.link.unwrap().width),
        (2, 3, 4)
    );
    assert!(!d.is_bridge());
}

#[test]
fn enumerates_in_address_order() {
    let t = Tree::new();
    for b in [
        "0000:02:00.0",
        "0000:00:1f.3",
        "0001:00:00.0",
        "0000:00:02.0",
    ] {
        t.add(&Dev::new(b));
    }
    let s = t.sysfs();
    let got: Vec<String> = s.addresses().unwrap().iter().map(Bdf::to_string).collect();
    assert_eq!(
        got,
        [
            "0000:00:02.0",
            "0000:00:1f.3",
            "0000:02:00.0",
            "0001:00:00.0"
        ]
    );
    assert_eq!(s.devices().unwrap().len(), 4);
    assert!(s.exists(bdf("00:02.0")) && !s.exists(bdf("00:03.0")));
    assert!(Tree::new().sysfs().devices().unwrap().is_empty());
}

#[test]
fn absent_device_is_not_found() {
    let t = one_device();
    let e = t.sysfs().device(bdf("0000:09:00.0")).unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("0000:09:00.0") && e.to_string().contains("userdma list"));
}

#[test]
fn missing_sysfs_is_reported_as_such() {
    let s = userdma::pci::Sysfs::new("/nonexistent-sysfs-root");
    let e = s.devices().unwrap_err();
    assert!(matches!(e, Error::NoPciBus { .. }), "{e:?}");
    assert!(e.to_string().contains("is sysfs mounted there?"));
}

#[test]
fn missing_required_attributes_are_errors_naming_the_file() {
    for name in ["vendor", "device", "class", "resource"] {
        let t = one_device();
        t.remove(&Tree::attr(DEV, name));
        let e = t.sysfs().device(bdf(DEV)).unwrap_err();
        let Error::Read { path, source } = &e else {
            panic!("{name}: {e:?}")
        };
        assert!(path.ends_with(name), "{path:?}");
        assert_eq!(source.kind(), io::ErrorKind::NotFound);
    }
}

#[test]
fn missing_optional_attributes_are_none() {
    let t = Tree::new();
    let mut dev = Dev::new(DEV);
    dev.subsystem = None;
    dev.revision = None;
    dev.numa_node = None;
    dev.driver_override = None;
    dev.config = None;
    t.add(&dev);
    let d = t.sysfs().device(bdf(DEV)).unwrap();
    assert_eq!(
        (d.subsystem_vendor, d.subsystem_device, d.revision),
        (None, None, None)
    );
    assert_eq!(
        (
            d.numa_node,
            d.driver_override.as_deref(),
            d.driver.as_deref()
        ),
        (None, None, None)
    );
    assert!(d.iommu_group.is_none());
    assert_eq!(
        d.capabilities.walk,
        Walk::Unreadable(io::ErrorKind::NotFound)
    );
    assert_eq!(d.capabilities.contains(0x11), None);
    assert_eq!(
        (d.header_type, d.interrupt_pin, d.has_intx()),
        (None, None, None)
    );
}

#[test]
fn numa_and_override_forms() {
    let t = one_device();
    t.write(&Tree::attr(DEV, "numa_node"), "-1\n");
    t.write(&Tree::attr(DEV, "driver_override"), "vfio-pci\n");
    let d = t.sysfs().device(bdf(DEV)).unwrap();
    assert_eq!(d.numa_node, None);
    assert_eq!(d.driver_override.as_deref(), Some("vfio-pci"));
    t.write(&Tree::attr(DEV, "numa_node"), "3");
    assert_eq!(t.sysfs().device(bdf(DEV)).unwrap().numa_node, Some(3));
}

#[test]
fn garbage_values_are_parse_errors_quoting_the_content() {
    let cases: [(&str, &[u8]); 12] = [
        ("vendor", b"hello\n"),
        ("vendor", b"0x12345\n"),
        ("vendor", b"8086\n"),
        ("device", b"\n"),
        ("class", b"0x1000000\n"),
        ("subsystem_vendor", b"0xzz\n"),
        ("subsystem_device", b"0x\n"),
        ("revision", b"0x100\n"),
        ("numa_node", b"abc\n"),
        ("numa_node", b"-2\n"),
        ("numa_node", b"+1\n"),
        ("vendor", b"0x80\xff\n"),
    ];
    for (name, content) in cases {
        let t = one_device();
        t.write(&Tree::attr(DEV, name), content);
        let e = t.sysfs().device(bdf(DEV)).unwrap_err();
        let Error::Parse { path, .. } = &e else {
            panic!("{name} {content:?}: {e:?}")
        };
        assert!(path.ends_with(name), "{path:?}");
        assert!(e.to_string().contains("unexpected content"), "{e}");
    }
}

#[test]
fn garbage_resource_file_names_the_line() {
    let t = one_device();
    let text = format!("{}0x1 0x2\n", resource_line(0, 0, 0));
    t.write(&Tree::attr(DEV, "resource"), text);
    let e = t.sysfs().device(bdf(DEV)).unwrap_err();
    let Error::Resource { source, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(
        (source.index, source.reason),
        (1, ResourceReason::FieldCount)
    );
    let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(chain.contains("line 2"), "{chain}");
}

#[test]
fn driver_link_that_is_not_a_symlink_is_an_error() {
    let t = one_device();
    t.remove(&Tree::attr(DEV, "driver"));
    t.write(&Tree::attr(DEV, "driver"), "nvme");
    let e = t.sysfs().device(bdf(DEV)).unwrap_err();
    assert!(
        matches!(&e, Error::Link { path, .. } if path.ends_with("driver")),
        "{e:?}"
    );
    assert!(t.sysfs().driver(bdf(DEV)).is_err());
}

#[test]
fn iommu_group_link_errors() {
    // Not a number.
    let t = Tree::new();
    t.add(&Dev::new(DEV));
    std::os::unix::fs::symlink(
        "../../../kernel/iommu_groups/abc",
        t.dev_dir(DEV).join("iommu_group"),
    )
    .unwrap();
    let e = t.sysfs().device(bdf(DEV)).unwrap_err();
    assert!(
        matches!(&e, Error::LinkTarget { target, .. } if target == "abc"),
        "{e:?}"
    );
    // A link to a root with no name.
    let t = Tree::new();
    t.add(&Dev::new(DEV));
    std::os::unix::fs::symlink("/", t.dev_dir(DEV).join("iommu_group")).unwrap();
    assert!(matches!(
        t.sysfs().device(bdf(DEV)).unwrap_err(),
        Error::LinkTarget { .. }
    ));
    // A number whose group directory is missing.
    let t = Tree::new();
    t.add(&Dev::new(DEV));
    std::os::unix::fs::symlink(
        "../../../kernel/iommu_groups/9",
        t.dev_dir(DEV).join("iommu_group"),
    )
    .unwrap();
    let e = t.sysfs().device(bdf(DEV)).unwrap_err();
    assert!(
        matches!(&e, Error::Read { path, .. } if path.ends_with("9/devices")),
        "{e:?}"
    );
    // A group with an entry that is not an address.
    let t = one_device();
    t.write("kernel/iommu_groups/7/devices/garbage", "");
    let e = t.sysfs().device(bdf(DEV)).unwrap_err();
    assert!(
        matches!(&e, Error::BadEntry { path, .. } if path.ends_with("garbage")),
        "{e:?}"
    );
}

#[test]
fn non_address_entry_in_the_device_list_is_an_error() {
    let t = one_device();
    t.write("bus/pci/devices/not-a-bdf", "");
    let e = t.sysfs().addresses().unwrap_err();
    assert!(matches!(&e, Error::BadEntry { .. }), "{e:?}");
    let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(
        chain.contains("not-a-bdf") && chain.contains("DDDD:BB:DD.F"),
        "{chain}"
    );
}

#[test]
fn truncated_config_leaves_capabilities_unknown() {
    let t = one_device();
    let full = config_space(0x1af4, 0x1041, 0x020000);
    t.write(&Tree::attr(DEV, "config"), &full[..64]);
    let d = t.sysfs().device(bdf(DEV)).unwrap();
    assert_eq!(
        d.capabilities.walk,
        Walk::Truncated {
            needed: 0x42,
            available: 64
        }
    );
    assert_eq!(d.capabilities.contains(0x05), None);
    assert_eq!((d.header_type, d.interrupt_pin), (Some(0), Some(1)));
    // Empty config file: nothing known, still no error.
    t.write(&Tree::attr(DEV, "config"), b"");
    let d = t.sysfs().device(bdf(DEV)).unwrap();
    assert!(matches!(
        d.capabilities.walk,
        Walk::Truncated { available: 0, .. }
    ));
    assert_eq!(d.header_type, None);
}

#[test]
fn capability_loop_is_malformed_not_an_error() {
    let t = one_device();
    let mut c = config_space(0x1af4, 0x1041, 0x020000);
    c[0x61] = 0x40; // PCIe capability points back to MSI
    t.write(&Tree::attr(DEV, "config"), &c);
    let d = t.sysfs().device(bdf(DEV)).unwrap();
    assert!(
        matches!(d.capabilities.walk, Walk::Malformed(_)),
        "{:?}",
        d.capabilities.walk
    );
    assert_eq!(d.capabilities.entries.len(), 3);
}

#[test]
fn bridges_and_paths() {
    let t = Tree::new();
    let mut bridge = Dev::new("0000:00:01.0").ids(0x8086, 0x1234, 0x060400);
    bridge.config.as_mut().unwrap()[0x0e] = 0x81; // multi-function PCI bridge
    t.add(&bridge).add(&Dev::new(DEV));
    let s = t.sysfs();
    let iommu = s.iommu().unwrap();
    assert!(!iommu.is_active());
    let b = s.device(bdf("00:01.0")).unwrap();
    assert!(b.is_bridge());
    assert!(b.dma_paths(&iommu).is_empty());
    assert_eq!(
        s.device(bdf(DEV)).unwrap().dma_paths(&iommu),
        [DmaPath::Uio]
    );
}

#[test]
fn iommu_state_and_paths() {
    let t = one_device();
    t.write("class/iommu/dmar0/x", "");
    let s = t.sysfs();
    let iommu = s.iommu().unwrap();
    assert!(iommu.is_active());
    assert_eq!(
        (iommu.units.as_slice(), iommu.groups, iommu.noiommu_mode),
        (["dmar0".to_owned()].as_slice(), 1, None)
    );
    assert_eq!(
        s.device(bdf(DEV)).unwrap().dma_paths(&iommu),
        [DmaPath::Vfio]
    );
    // Passthrough domain: uio works too.
    t.write("kernel/iommu_groups/7/type", "identity\n");
    assert_eq!(
        s.device(bdf(DEV)).unwrap().dma_paths(&iommu),
        [DmaPath::Vfio, DmaPath::Uio]
    );
}

#[test]
fn noiommu_groups_and_mode() {
    let t = one_device();
    t.write("kernel/iommu_groups/7/name", "vfio-noiommu\n");
    t.write("module/vfio/parameters/enable_unsafe_noiommu_mode", "Y\n");
    let s = t.sysfs();
    let iommu = s.iommu().unwrap();
    assert!(!iommu.is_active(), "a no-IOMMU group is no IOMMU");
    assert_eq!(iommu.noiommu_mode, Some(true));
    let d = s.device(bdf(DEV)).unwrap();
    assert!(d.iommu_group.as_ref().unwrap().noiommu);
    assert_eq!(d.dma_paths(&iommu), [DmaPath::VfioNoIommu, DmaPath::Uio]);
    t.write("module/vfio/parameters/enable_unsafe_noiommu_mode", "N\n");
    assert_eq!(s.iommu().unwrap().noiommu_mode, Some(false));
    t.write(
        "module/vfio/parameters/enable_unsafe_noiommu_mode",
        "maybe\n",
    );
    assert!(matches!(s.iommu().unwrap_err(), Error::Parse { .. }));
}

// ---- binding ------------------------------------------------------------------------------

/// `one_device` plus the vfio-pci and uio_pci_generic drivers, and a kernel whose default
/// driver for the device is nvme.
fn bindable() -> (Tree, FakeKernel) {
    let t = one_device();
    t.driver("vfio-pci").driver("uio_pci_generic");
    let k = FakeKernel::new(&t).default_driver(DEV, "nvme");
    (t, k)
}

fn vfio(
    t: &Tree,
    k: &FakeKernel,
    force_group: bool,
) -> Result<userdma::pci::BindReport, BindError> {
    Binder::new(t.sysfs(), k).bind(bdf(DEV), Driver::VfioPci, BindOptions { force_group })
}

fn writes(k: &FakeKernel) -> Vec<String> {
    k.log()
        .into_iter()
        .map(|(p, v)| format!("{p}={}", v.trim()))
        .collect()
}

#[test]
fn binds_vfio_with_the_three_writes() {
    let (t, k) = bindable();
    let r = vfio(&t, &k, false).unwrap();
    assert_eq!(r.changes.len(), 1);
    assert_eq!(
        (r.changes[0].from.as_deref(), r.changes[0].to.as_deref()),
        (Some("nvme"), Some("vfio-pci"))
    );
    assert_eq!(t.driver_of(DEV).as_deref(), Some("vfio-pci"));
    assert_eq!(t.read(&Tree::attr(DEV, "driver_override")), "vfio-pci\n");
    assert_eq!(
        writes(&k),
        [
            format!("bus/pci/devices/{DEV}/driver_override=vfio-pci"),
            format!("bus/pci/drivers/nvme/unbind={DEV}"),
            format!("bus/pci/drivers_probe={DEV}"),
        ]
    );
}

#[test]
fn binding_an_unbound_device_skips_the_unbind() {
    let (t, k) = bindable();
    t.remove(&Tree::attr(DEV, "driver"))
        .remove(&format!("bus/pci/drivers/nvme/{DEV}"));
    let r = Binder::new(t.sysfs(), &k)
        .bind(bdf(DEV), Driver::UioPciGeneric, BindOptions::default())
        .unwrap();
    assert_eq!(r.changes[0].from, None);
    assert_eq!(writes(&k).len(), 2);
    assert_eq!(t.driver_of(DEV).as_deref(), Some("uio_pci_generic"));
}

#[test]
fn already_bound_changes_nothing() {
    let (t, k) = bindable();
    vfio(&t, &k, false).unwrap();
    let before = k.log().len();
    let r = vfio(&t, &k, false).unwrap();
    assert!(r.changes.is_empty());
    assert_eq!(k.log().len(), before);
}

#[test]
fn refuses_when_the_driver_is_not_loaded() {
    let t = one_device();
    let k = FakeKernel::new(&t);
    let e = vfio(&t, &k, false).unwrap_err();
    assert!(matches!(
        e,
        BindError::NotLoaded {
            driver: Driver::VfioPci
        }
    ));
    assert!(e.to_string().contains("modprobe vfio-pci"), "{e}");
    assert!(k.log().is_empty());
}

#[test]
fn refuses_missing_devices_and_bridges() {
    let (t, k) = bindable();
    let e = Binder::new(t.sysfs(), &k).bind(
        bdf("0000:05:00.0"),
        Driver::VfioPci,
        BindOptions::default(),
    );
    assert!(matches!(
        e.unwrap_err(),
        BindError::Sysfs(Error::NotFound { .. })
    ));
    let mut bridge = Dev::new("0000:00:01.0").ids(0x8086, 0x1234, 0x060400);
    bridge.config.as_mut().unwrap()[0x0e] = 1;
    t.add(&bridge);
    let e = Binder::new(t.sysfs(), &k).bind(
        bdf("00:01.0"),
        Driver::UioPciGeneric,
        BindOptions::default(),
    );
    assert!(matches!(e.unwrap_err(), BindError::Bridge { .. }));
    assert!(k.log().is_empty());
}

#[test]
fn vfio_needs_a_group_or_noiommu_mode() {
    let t = Tree::new();
    t.add(&Dev::new(DEV))
        .driver("nvme")
        .bind(DEV, "nvme")
        .driver("vfio-pci");
    let k = FakeKernel::new(&t);
    let e = vfio(&t, &k, false).unwrap_err();
    assert!(matches!(e, BindError::NoIommuGroup { .. }));
    assert!(
        e.to_string().contains("enable_unsafe_noiommu_mode=1"),
        "{e}"
    );
    assert!(k.log().is_empty());
    t.write("module/vfio/parameters/enable_unsafe_noiommu_mode", "Y\n");
    vfio(&t, &k, false).unwrap();
    assert_eq!(t.driver_of(DEV).as_deref(), Some("vfio-pci"));
}

/// `bindable` with two more group members: 00:1f.3 on i801_smbus, 00:1f.4 on nothing, and a
/// bridge 00:1c.0 on pcieport.
fn crowded_group() -> (Tree, FakeKernel) {
    let t = Tree::new();
    for b in [DEV, "0000:00:1f.3", "0000:00:1f.4", "0000:00:1c.0"] {
        t.add(&Dev::new(b));
    }
    for d in ["nvme", "i801_smbus", "pcieport", "vfio-pci"] {
        t.driver(d);
    }
    t.bind(DEV, "nvme")
        .bind("0000:00:1f.3", "i801_smbus")
        .bind("0000:00:1c.0", "pcieport");
    t.group(7, &[DEV, "0000:00:1f.3", "0000:00:1f.4", "0000:00:1c.0"]);
    let k = FakeKernel::new(&t)
        .default_driver(DEV, "nvme")
        .default_driver("0000:00:1f.3", "i801_smbus");
    (t, k)
}

#[test]
fn group_conflict_names_each_host_driver() {
    let (t, k) = crowded_group();
    let e = vfio(&t, &k, false).unwrap_err();
    assert_eq!(
        e.to_string(),
        "IOMMU group 7 also holds 0000:00:1f.3 bound to i801_smbus: bind it too or use --force-group"
    );
    assert!(k.log().is_empty(), "nothing is written when refusing");
    // The same for a second host-bound member.
    t.driver("snd_hda_intel")
        .bind("0000:00:1f.4", "snd_hda_intel");
    let e = vfio(&t, &k, false).unwrap_err();
    assert!(e.to_string().contains("0000:00:1f.3 bound to i801_smbus and 0000:00:1f.4 bound to snd_hda_intel: bind them too"), "{e}");
    // uio_pci_generic does not care about groups.
    t.driver("uio_pci_generic");
    Binder::new(t.sysfs(), &k)
        .bind(bdf(DEV), Driver::UioPciGeneric, BindOptions::default())
        .unwrap();
}

#[test]
fn force_group_binds_the_host_bound_members_too() {
    let (t, k) = crowded_group();
    let r = vfio(&t, &k, true).unwrap();
    let changed: Vec<String> = r.changes.iter().map(|c| c.bdf.to_string()).collect();
    assert_eq!(changed, [DEV, "0000:00:1f.3"]);
    assert_eq!(t.driver_of("0000:00:1f.3").as_deref(), Some("vfio-pci"));
    assert_eq!(
        t.driver_of("0000:00:1c.0").as_deref(),
        Some("pcieport"),
        "bridges stay"
    );
    assert_eq!(t.driver_of("0000:00:1f.4"), None);
}

#[test]
fn force_group_failure_rolls_back_every_member() {
    let (t, k) = crowded_group();
    k.fail("drivers_probe", 1, 1, io::ErrorKind::InvalidInput); // the second member's probe
    let e = vfio(&t, &k, true).unwrap_err();
    let BindError::Bind {
        failed, rollback, ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(failed.to_string(), "0000:00:1f.3");
    assert!(rollback.is_complete(), "{rollback}");
    assert_eq!(rollback.entries.len(), 2);
    assert!(
        e.to_string().contains("at IOMMU group member 0000:00:1f.3"),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("0000:00:1f.3 is on i801_smbus again, 0000:01:00.0 is on nvme again"),
        "{e}"
    );
    assert_eq!(t.driver_of(DEV).as_deref(), Some("nvme"));
    assert_eq!(t.driver_of("0000:00:1f.3").as_deref(), Some("i801_smbus"));
    assert_eq!(t.read(&Tree::attr(DEV, "driver_override")), "(null)\n");
}

/// Binding fails at the `n`-th write of `suffix`; the rollback must restore nvme.
fn fails_and_rolls_back(suffix: &str, kind: io::ErrorKind) -> BindError {
    let (t, k) = bindable();
    k.fail(suffix, 0, 1, kind);
    let e = vfio(&t, &k, false).unwrap_err();
    assert_eq!(t.driver_of(DEV).as_deref(), Some("nvme"), "{e}");
    assert_eq!(t.read(&Tree::attr(DEV, "driver_override")), "(null)\n");
    let rollback = e.rollback().unwrap();
    assert!(rollback.is_complete(), "{e}");
    e
}

#[test]
fn failure_writing_the_override_changes_nothing() {
    let e = fails_and_rolls_back("driver_override", io::ErrorKind::PermissionDenied);
    assert!(e.is_permission_denied());
    assert!(e.rollback().unwrap().entries.is_empty());
    assert!(e.to_string().ends_with("nothing was changed"), "{e}");
    let BindError::Bind {
        cause: StepError::Write { path, .. },
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert!(path.ends_with("driver_override"));
}

#[test]
fn failure_unbinding_is_rolled_back() {
    let e = fails_and_rolls_back("nvme/unbind", io::ErrorKind::ResourceBusy);
    assert!(!e.is_permission_denied());
    assert!(
        e.to_string()
            .contains("rolled back: 0000:01:00.0 is on nvme again"),
        "{e}"
    );
}

#[test]
fn failure_probing_is_rolled_back() {
    let e = fails_and_rolls_back("drivers_probe", io::ErrorKind::InvalidInput);
    let BindError::Bind {
        cause: StepError::Write { path, source, .. },
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert!(path.ends_with("drivers_probe"));
    assert_eq!(source.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn driver_refusing_the_device_is_rolled_back() {
    let (t, k) = bindable();
    let k = k.refuse("vfio-pci");
    let e = vfio(&t, &k, false).unwrap_err();
    let BindError::Bind {
        cause: StepError::NotBound { got: None, .. },
        rollback,
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert!(rollback.is_complete());
    assert!(e.to_string().contains("rolled back"), "{e}");
    assert_eq!(t.driver_of(DEV).as_deref(), Some("nvme"));
}

#[test]
fn failed_rollback_is_loud_and_says_how_to_repair() {
    let (t, k) = bindable();
    k.fail("drivers_probe", 0, 2, io::ErrorKind::InvalidInput); // the bind's and the rollback's
    let e = vfio(&t, &k, false).unwrap_err();
    let rollback = e.rollback().unwrap();
    assert!(!rollback.is_complete());
    let text = e.to_string();
    assert!(
        text.contains("ROLLBACK FAILED: 0000:01:00.0 is left on no driver instead of nvme"),
        "{text}"
    );
    assert!(
        text.contains(&format!("echo {DEV} > ")) && text.contains("drivers_probe"),
        "{text}"
    );
    assert_eq!(t.driver_of(DEV), None);
    // The state the message describes is the real one.
    assert_eq!(rollback.entries[0].now, None);
    assert_eq!(rollback.entries[0].wanted.as_deref(), Some("nvme"));
}

#[test]
fn rollback_of_an_unbound_device_leaves_it_unbound() {
    let (t, k) = bindable();
    t.remove(&Tree::attr(DEV, "driver"))
        .remove(&format!("bus/pci/drivers/nvme/{DEV}"));
    let k = k.refuse("uio_pci_generic");
    let e = Binder::new(t.sysfs(), &k)
        .bind(bdf(DEV), Driver::UioPciGeneric, BindOptions::default())
        .unwrap_err();
    assert!(e.rollback().unwrap().is_complete());
    assert!(
        e.to_string().contains("0000:01:00.0 is on no driver again"),
        "{e}"
    );
}

// ---- unbinding ----------------------------------------------------------------------------

#[test]
fn unbind_returns_to_the_default_driver() {
    let (t, k) = bindable();
    vfio(&t, &k, false).unwrap();
    let r = Binder::new(t.sysfs(), &k).unbind(bdf(DEV)).unwrap();
    assert_eq!(
        (r.from.as_deref(), r.to.as_deref(), r.changed),
        (Some("vfio-pci"), Some("nvme"), true)
    );
    assert_eq!(t.read(&Tree::attr(DEV, "driver_override")), "(null)\n");
    assert_eq!(t.driver_of(DEV).as_deref(), Some("nvme"));
}

#[test]
fn unbind_with_no_default_driver_ends_unbound() {
    let (t, _) = bindable();
    let k = FakeKernel::new(&t);
    t.remove(&Tree::attr(DEV, "driver"))
        .remove(&format!("bus/pci/drivers/nvme/{DEV}"));
    t.bind(DEV, "uio_pci_generic");
    let r = Binder::new(t.sysfs(), &k).unbind(bdf(DEV)).unwrap();
    assert_eq!(
        (r.from.as_deref(), r.to, r.changed),
        (Some("uio_pci_generic"), None, true)
    );
}

#[test]
fn unbind_leaves_host_drivers_alone() {
    let (t, k) = bindable();
    let r = Binder::new(t.sysfs(), &k).unbind(bdf(DEV)).unwrap();
    assert_eq!(
        (r.from.as_deref(), r.to.as_deref(), r.changed),
        (Some("nvme"), Some("nvme"), false)
    );
    assert!(k.log().is_empty());
}

#[test]
fn unbind_of_an_unbound_device_probes_it() {
    let (t, k) = bindable();
    t.remove(&Tree::attr(DEV, "driver"))
        .remove(&format!("bus/pci/drivers/nvme/{DEV}"));
    let r = Binder::new(t.sysfs(), &k).unbind(bdf(DEV)).unwrap();
    assert_eq!(
        (r.from, r.to.as_deref(), r.changed),
        (None, Some("nvme"), true)
    );
}

#[test]
fn unbind_failure_is_rolled_back_to_the_user_space_driver() {
    let (t, k) = bindable();
    vfio(&t, &k, false).unwrap();
    k.fail("drivers_probe", 0, 1, io::ErrorKind::InvalidInput);
    let e = Binder::new(t.sysfs(), &k).unbind(bdf(DEV)).unwrap_err();
    assert!(matches!(e, BindError::Unbind { .. }));
    assert!(e.rollback().unwrap().is_complete(), "{e}");
    assert!(
        e.to_string().contains("0000:01:00.0 is on vfio-pci again"),
        "{e}"
    );
    assert_eq!(t.driver_of(DEV).as_deref(), Some("vfio-pci"));
    assert_eq!(t.read(&Tree::attr(DEV, "driver_override")), "vfio-pci\n");
}

#[test]
fn unbind_fails_when_the_same_driver_claims_the_device_again() {
    let (t, _) = bindable();
    let k = FakeKernel::new(&t).default_driver(DEV, "vfio-pci");
    Binder::new(t.sysfs(), &k)
        .bind(bdf(DEV), Driver::VfioPci, BindOptions::default())
        .unwrap();
    let e = Binder::new(t.sysfs(), &k).unbind(bdf(DEV)).unwrap_err();
    let BindError::Unbind {
        cause: StepError::StillBound { driver, .. },
        rollback,
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(driver, "vfio-pci");
    assert!(rollback.is_complete());
    assert_eq!(t.read(&Tree::attr(DEV, "driver_override")), "vfio-pci\n");
}

#[test]
fn unbind_of_a_missing_device_is_not_found() {
    let (t, k) = bindable();
    let e = Binder::new(t.sysfs(), &k)
        .unbind(bdf("0000:07:00.0"))
        .unwrap_err();
    assert!(
        matches!(e, BindError::Sysfs(Error::NotFound { .. })),
        "{e:?}"
    );
}

#[test]
fn missing_driver_override_attribute_fails_cleanly() {
    // Kernels before 3.16 have no driver_override: the first write fails, nothing changes.
    let (t, k) = bindable();
    t.remove(&Tree::attr(DEV, "driver_override"));
    let e = vfio(&t, &k, false).unwrap_err();
    assert!(e.rollback().unwrap().entries.is_empty(), "{e}");
    assert_eq!(t.driver_of(DEV).as_deref(), Some("nvme"));
}
