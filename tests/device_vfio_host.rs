//! `device::Vfio`, `device::Uio` and `device::open` through the public API on this machine,
//! against fake sysfs trees: every refusal that happens before the kernel is asked (unbound,
//! wrong driver, a group member on a host driver, no-IOMMU without the opt-in, no group) and
//! what happens when the kernel's VFIO nodes are not there. The open sequence against the kernel
//! itself is unit-tested with a double (src/device/vfio/tests.rs) and run for real in the QEMU
//! guest (tests/guest). The VFIO view of `userdma info` and `userdma list` not offering DMA
//! paths for host bridges are the tool's tests (cli/tests/device_vfio_host_cli.rs).

mod common;

use std::path::Path;

use common::{Dev, Tree};
use userdma::device::vfio::{Error as VfioError, IrqKind, Options, RegionInfo};
use userdma::device::{self, Error, Uio, Vfio};

const DEV: &str = "0000:01:00.0";
const PEER: &str = "0000:01:00.1";

fn bdf(s: &str) -> userdma::pci::Bdf {
    s.parse().unwrap()
}

/// DEV (edu's IDs) and PEER in IOMMU group 3; DEV on vfio-pci, PEER unbound.
fn tree() -> Tree {
    let t = Tree::new();
    t.add(&Dev::new(DEV).ids(0x1234, 0x11e8, 0x00ff00))
        .add(&Dev::new(PEER));
    t.driver("vfio-pci")
        .driver("e1000e")
        .driver("uio_pci_generic");
    t.bind(DEV, "vfio-pci").group(3, &[DEV, PEER]);
    t
}

fn open(t: &Tree, options: Options) -> Result<Vfio, Error> {
    Vfio::open_with(bdf(DEV), &options.sysfs(t.sysfs()))
}

#[test]
fn unbound_and_wrongly_bound_devices_name_the_bind_command() {
    let t = Tree::new();
    t.add(&Dev::new(DEV)).driver("nvme");
    let err = Vfio::open_with(bdf(DEV), &Options::new().sysfs(t.sysfs())).unwrap_err();
    assert!(matches!(err, Error::NotBound { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("userdma bind {DEV} --driver vfio-pci")),
        "{text}"
    );
    t.bind(DEV, "nvme");
    let err = Vfio::open_with(bdf(DEV), &Options::new().sysfs(t.sysfs())).unwrap_err();
    assert!(
        matches!(err, Error::WrongDriver { ref driver, .. } if driver == "nvme"),
        "{err:?}"
    );
    assert!(err.to_string().contains("userdma bind"), "{err}");
}

#[test]
fn a_group_member_on_a_host_driver_is_named() {
    let t = tree();
    t.bind(PEER, "e1000e");
    let err = open(&t, Options::new()).unwrap_err();
    match &err {
        Error::Vfio(VfioError::GroupNotViable {
            group, culprits, ..
        }) => {
            assert_eq!(*group, 3);
            assert_eq!(culprits.len(), 1);
            assert_eq!(culprits[0].0, bdf(PEER));
            assert_eq!(culprits[0].1, "e1000e");
        }
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains(&format!("{PEER} (e1000e)")), "{text}");
    assert!(text.contains(&format!("userdma bind {PEER}")), "{text}");
}

#[test]
fn no_iommu_group_needs_the_opt_in() {
    let t = tree();
    t.write("kernel/iommu_groups/3/name", "vfio-noiommu\n");
    let err = open(&t, Options::new()).unwrap_err();
    assert!(
        matches!(err, Error::Vfio(VfioError::NoIommuRefused { group: 3, .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("allow_noiommu"), "{err}");
}

#[test]
fn no_group_at_all() {
    let t = Tree::new();
    t.add(&Dev::new(DEV)).driver("vfio-pci");
    t.bind(DEV, "vfio-pci");
    let err = Vfio::open_with(bdf(DEV), &Options::new().sysfs(t.sysfs())).unwrap_err();
    assert!(
        matches!(err, Error::Vfio(VfioError::NoGroup { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("intel_iommu=on"), "{err}");
}

#[test]
fn past_the_sysfs_checks_the_kernel_nodes_are_asked_for() {
    // The fake tree says "bound and viable"; what comes next is /dev/vfio on this machine.
    // Without VFIO (or without group 3 there) that is an error naming the node; the device
    // node of a fake group cannot open.
    let t = tree();
    let err = open(
        &t,
        Options::new().iommufd(false).interrupts(IrqKind::Msi, 1),
    )
    .unwrap_err();
    match &err {
        Error::Vfio(VfioError::Container { path, .. }) => {
            assert_eq!(path, Path::new("/dev/vfio/vfio"))
        }
        Error::Open { path, .. } => assert_eq!(path, Path::new("/dev/vfio/3")),
        other => panic!("unexpected {other:?}"),
    }
    assert!(!err.to_string().is_empty());
}

#[test]
fn uio_of_a_missing_device_says_so() {
    let err = Uio::open(bdf("ffff:ff:1f.7")).unwrap_err();
    assert!(matches!(err, Error::Sysfs { .. }), "{err:?}");
    assert!(err.to_string().contains("ffff:ff:1f.7"), "{err}");
}

#[test]
fn device_open_of_a_missing_device_says_so() {
    let err = device::open(bdf("ffff:ff:1f.7")).unwrap_err();
    assert!(matches!(err, Error::Sysfs { .. }), "{err:?}");
    assert!(err.to_string().contains("ffff:ff:1f.7"), "{err}");
}

#[test]
fn region_info_parses_through_the_public_api() {
    let mut reply = vec![0u8; 32];
    reply[0..4].copy_from_slice(&32u32.to_ne_bytes());
    reply[4..8].copy_from_slice(&7u32.to_ne_bytes()); // read | write | mmap
    reply[16..24].copy_from_slice(&0x1000u64.to_ne_bytes());
    let info = RegionInfo::parse(&reply).unwrap();
    assert!(info.readable() && info.writable() && info.mappable());
    assert_eq!(info.mmap_areas().len(), 1);
    assert!(RegionInfo::parse(&reply[..31]).is_err());
}
