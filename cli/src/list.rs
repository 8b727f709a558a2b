//! `userdma list`: every PCI device on one line, like `dpdk-devbind --status`.

use serde::Serialize;
use userdma::pci::{Bdf, DeviceInfo, DmaPath, Iommu, Sysfs};

use crate::ids::Ids;

use crate::exit::Failure;
use crate::names::{self, or_dash, Names};
use crate::Context;

/// Arguments of `userdma list`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

/// The JSON document of `list`.
#[derive(Debug, Serialize)]
struct ListJson<'a> {
    iommu: IommuJson<'a>,
    drivers_loaded: DriversJson,
    devices: Vec<DeviceJson<'a, Option<u32>>>,
}

/// The system's IOMMU state.
#[derive(Debug, Serialize)]
pub(crate) struct IommuJson<'a> {
    active: bool,
    units: &'a [String],
    groups: usize,
    noiommu_mode: Option<bool>,
}

impl<'a> IommuJson<'a> {
    pub(crate) fn new(iommu: &'a Iommu) -> Self {
        Self {
            active: iommu.is_active(),
            units: &iommu.units,
            groups: iommu.groups,
            noiommu_mode: iommu.noiommu_mode,
        }
    }
}

/// Whether the user-space drivers are loaded.
#[derive(Debug, Serialize)]
struct DriversJson {
    #[serde(rename = "vfio-pci")]
    vfio_pci: bool,
    uio_pci_generic: bool,
}

/// One device in `list`; `info` flattens it into its own document with a group object `G`
/// where `list` has the group number.
#[derive(Debug, Serialize)]
pub(crate) struct DeviceJson<'a, G> {
    bdf: Bdf,
    vendor: String,
    device: String,
    vendor_name: Option<&'a str>,
    device_name: Option<&'a str>,
    class: String,
    class_name: Option<&'a str>,
    driver: Option<&'a str>,
    driver_override: Option<&'a str>,
    iommu_group: G,
    numa_node: Option<u32>,
    dma_paths: Vec<DmaPath>,
}

impl<'a, G> DeviceJson<'a, G> {
    pub(crate) fn new(
        dev: &'a DeviceInfo,
        names: &Names<'a>,
        iommu: &Iommu,
        iommu_group: G,
    ) -> Self {
        Self {
            bdf: dev.bdf,
            vendor: format!("{:04x}", dev.vendor),
            device: format!("{:04x}", dev.device),
            vendor_name: names.vendor,
            device_name: names.device,
            class: format!("{:06x}", dev.class),
            class_name: names.class,
            driver: dev.driver.as_deref(),
            driver_override: dev.driver_override.as_deref(),
            iommu_group,
            numa_node: dev.numa_node,
            dma_paths: dma_paths(dev, iommu),
        }
    }
}

/// The DMA paths `dev` offers in `list` and `info`: none for any bridge class (base class
/// 0x06: host, ISA, PCI-to-PCI, ... bridges; a host bridge has a type 0 header, so the header
/// type alone does not tell), else what [`DeviceInfo::dma_paths`] says.
pub(crate) fn dma_paths(dev: &DeviceInfo, iommu: &Iommu) -> Vec<DmaPath> {
    if dev.base_class() == BRIDGE_CLASS {
        return Vec::new();
    }
    dev.dma_paths(iommu)
}

/// PCI base class "bridge device".
const BRIDGE_CLASS: u8 = 0x06;

/// `vfio,uio`, or `-` for none.
pub(crate) fn paths_text(paths: &[DmaPath]) -> String {
    if paths.is_empty() {
        return "-".to_owned();
    }
    paths.iter().map(|p| p.name()).collect::<Vec<_>>().join(",")
}

/// One line about the IOMMU and the user-space drivers.
pub(crate) fn system_line(sysfs: &Sysfs, iommu: &Iommu) -> String {
    let state = if iommu.is_active() {
        let units = if iommu.units.is_empty() {
            String::new()
        } else {
            format!(" ({})", iommu.units.join(", "))
        };
        let plural = if iommu.groups == 1 { "" } else { "s" };
        format!("on{units}, {} IOMMU group{plural}", iommu.groups)
    } else {
        "off (no IOMMU groups)".to_owned()
    };
    let noiommu = match iommu.noiommu_mode {
        Some(true) => "on",
        Some(false) => "off",
        None => "off (vfio not loaded, or built without CONFIG_VFIO_NOIOMMU)",
    };
    let loaded = |name: &str| {
        if sysfs.driver_loaded(name) {
            format!("{name} loaded")
        } else {
            format!("{name} not loaded")
        }
    };
    format!(
        "IOMMU: {state}; VFIO no-IOMMU mode: {noiommu}; drivers: {}, {}",
        loaded("vfio-pci"),
        loaded("uio_pci_generic")
    )
}

/// Runs `userdma list`.
pub(crate) fn run(ctx: &Context, _args: &Args) -> Result<(), Failure> {
    let devices = ctx.sysfs.devices()?;
    let iommu = ctx.sysfs.iommu()?;
    let ids: Option<Ids> = names::load();
    if ctx.json {
        let doc = ListJson {
            iommu: IommuJson::new(&iommu),
            drivers_loaded: DriversJson {
                vfio_pci: ctx.sysfs.driver_loaded("vfio-pci"),
                uio_pci_generic: ctx.sysfs.driver_loaded("uio_pci_generic"),
            },
            devices: devices
                .iter()
                .map(|d| {
                    let group = d.iommu_group.as_ref().map(|g| g.number);
                    DeviceJson::new(d, &Names::of(ids.as_ref(), d), &iommu, group)
                })
                .collect(),
        };
        return ctx.print_json(&doc);
    }
    let header = [
        "BDF",
        "VENDOR:DEVICE",
        "CLASS",
        "DRIVER",
        "IOMMU",
        "NUMA",
        "DMA",
        "DESCRIPTION",
    ];
    let mut rows = vec![header.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()];
    for dev in &devices {
        let names = Names::of(ids.as_ref(), dev);
        let mut description = names.description(dev).unwrap_or_default();
        if let Some(class) = names.class {
            if !description.is_empty() {
                description.push(' ');
            }
            description.push_str(&format!("[{class}]"));
        }
        rows.push(vec![
            dev.bdf.to_string(),
            format!("{:04x}:{:04x}", dev.vendor, dev.device),
            format!("{:06x}", dev.class),
            or_dash(dev.driver.as_deref()).to_owned(),
            dev.iommu_group
                .as_ref()
                .map_or("-".to_owned(), |g| g.number.to_string()),
            dev.numa_node.map_or("-".to_owned(), |n| n.to_string()),
            paths_text(&dma_paths(dev, &iommu)),
            if description.is_empty() {
                "-".to_owned()
            } else {
                description
            },
        ]);
    }
    let mut text = names::table(&rows);
    text.push('\n');
    text.push_str(&system_line(&ctx.sysfs, &iommu));
    text.push('\n');
    crate::print(&text)
}
