//! `userdma info BDF`: everything about one device.

use std::fmt::Write as _;

use serde::Serialize;
use userdma::pci::{
    Bdf, Capabilities, Capability, CapabilityKind, DeviceInfo, Express, Malformed, Msi, MsiX,
    Resource, ResourceKind, Walk,
};

use userdma::device::vfio::{Mode, Options};
use userdma::device::Vfio;

use crate::exit::Failure;
use crate::list::{dma_paths, paths_text, system_line, DeviceJson};
use crate::names::{self, or_dash, Names};
use crate::Context;

/// Arguments of `userdma info`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The device, `DDDD:BB:DD.F` or `BB:DD.F` (hex).
    #[arg(value_name = "BDF")]
    bdf: String,

    /// For the VFIO view of a device in a no-IOMMU group: open it anyway (no isolation; the
    /// device is only looked at).
    #[arg(long)]
    allow_noiommu: bool,
}

#[derive(Debug, Serialize)]
struct InfoJson<'a> {
    #[serde(flatten)]
    summary: DeviceJson<'a, Option<GroupJson<'a>>>,
    subsystem_vendor: Option<String>,
    subsystem_device: Option<String>,
    subsystem_name: Option<&'a str>,
    revision: Option<String>,
    interrupt_pin: Option<u8>,
    bars: Vec<BarJson>,
    capabilities: CapsJson,
    /// The VFIO view, for a device bound to vfio-pci.
    #[serde(skip_serializing_if = "Option::is_none")]
    vfio: Option<VfioJson>,
}

/// What VFIO says about a device bound to vfio-pci, or why it could not be asked.
#[derive(Debug, Serialize)]
struct VfioJson {
    /// `type1`, `iommufd` or `noiommu`.
    mode: Option<Mode>,
    /// Why the device could not be opened.
    error: Option<String>,
    regions: Vec<RegionJson>,
    irqs: Vec<IrqJson>,
}

#[derive(Debug, Serialize)]
struct RegionJson {
    index: u32,
    name: String,
    size: u64,
    offset: String,
    flags: String,
    sparse: Option<Vec<SparseJson>>,
}

#[derive(Debug, Serialize)]
struct SparseJson {
    offset: String,
    size: u64,
}

#[derive(Debug, Serialize)]
struct IrqJson {
    index: u32,
    name: String,
    count: u32,
    flags: String,
}

/// The name of VFIO region `index` of a PCI device.
fn region_name(index: u32) -> String {
    match index {
        0..=5 => format!("BAR{index}"),
        6 => "ROM".to_owned(),
        7 => "config".to_owned(),
        8 => "VGA".to_owned(),
        n => format!("region {n}"),
    }
}

/// The name of VFIO irq index `index` of a PCI device.
fn irq_name(index: u32) -> String {
    match index {
        0 => "INTx".to_owned(),
        1 => "MSI".to_owned(),
        2 => "MSI-X".to_owned(),
        3 => "error".to_owned(),
        4 => "request".to_owned(),
        n => format!("irq {n}"),
    }
}

impl VfioJson {
    /// Opens `bdf` through VFIO (bus mastering left as it is) and reads its regions and irqs.
    fn read(ctx: &Context, bdf: Bdf, allow_noiommu: bool) -> VfioJson {
        let options = Options::new()
            .bus_master(false)
            .allow_noiommu(allow_noiommu)
            .sysfs(ctx.sysfs.clone());
        match Vfio::open_with(bdf, &options) {
            Err(err) => VfioJson {
                mode: None,
                error: Some(error_chain(&err)),
                regions: Vec::new(),
                irqs: Vec::new(),
            },
            Ok(vfio) => VfioJson {
                mode: Some(vfio.mode()),
                error: None,
                regions: vfio
                    .regions()
                    .iter()
                    .filter(|r| r.size > 0)
                    .map(|r| RegionJson {
                        index: r.index,
                        name: region_name(r.index),
                        size: r.size,
                        offset: format!("0x{:x}", r.offset),
                        flags: r.flag_names(),
                        sparse: r.sparse.as_ref().map(|areas| {
                            areas
                                .iter()
                                .map(|a| SparseJson {
                                    offset: format!("0x{:x}", a.offset),
                                    size: a.size,
                                })
                                .collect()
                        }),
                    })
                    .collect(),
                irqs: vfio
                    .irqs()
                    .iter()
                    .map(|i| IrqJson {
                        index: i.index,
                        name: irq_name(i.index),
                        count: i.count,
                        flags: i.flag_names(),
                    })
                    .collect(),
            },
        }
    }

    /// The text lines of the view.
    fn text(&self, t: &mut String) {
        match (&self.mode, &self.error) {
            (_, Some(error)) => {
                let _ = writeln!(t, "VFIO: unavailable: {error}");
            }
            (mode, None) => {
                let mode = mode.map_or("-".to_owned(), |m| {
                    serde_json::to_value(m)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                });
                let _ = writeln!(t, "VFIO ({mode}):");
                let mut rows = Vec::new();
                for r in &self.regions {
                    rows.push(vec![
                        format!("  {}", r.name),
                        names::size(r.size),
                        format!("at {}", r.offset),
                        r.flags.clone(),
                    ]);
                    for a in r.sparse.iter().flatten() {
                        rows.push(vec![
                            "    sparse".to_owned(),
                            names::size(a.size),
                            format!("at +{}", a.offset),
                            "mmap".to_owned(),
                        ]);
                    }
                }
                t.push_str(&names::table(&rows));
                for i in &self.irqs {
                    let _ = writeln!(t, "  {:<8} {} vectors  {}", i.name, i.count, i.flags);
                }
            }
        }
    }
}

/// An error and its causes on one line.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}

#[derive(Debug, Serialize)]
struct GroupJson<'a> {
    number: u32,
    domain_type: Option<&'a str>,
    noiommu: bool,
    members: Vec<MemberJson>,
}

#[derive(Debug, Serialize)]
struct MemberJson {
    bdf: Bdf,
    driver: Option<String>,
}

#[derive(Debug, Serialize)]
struct BarJson {
    index: usize,
    kind: &'static str,
    start: String,
    end: String,
    size: u64,
    #[serde(rename = "type")]
    space: &'static str,
    prefetchable: bool,
    is_64bit: bool,
}

#[derive(Debug, Serialize)]
struct CapsJson {
    known: bool,
    status: &'static str,
    detail: Option<String>,
    list: Vec<CapJson>,
    msi: Option<MsiJson>,
    msix: Option<MsiXJson>,
    pcie: Option<PcieJson>,
}

#[derive(Debug, Serialize)]
struct MsiJson {
    vectors: u8,
    is_64bit: bool,
    per_vector_masking: bool,
    enabled: bool,
}

impl MsiJson {
    fn new(m: &Msi) -> Self {
        Self {
            vectors: m.vectors,
            is_64bit: m.is_64bit,
            per_vector_masking: m.per_vector_masking,
            enabled: m.enabled,
        }
    }
}

#[derive(Debug, Serialize)]
struct MsiXJson {
    table_size: u16,
    enabled: bool,
    masked: bool,
    table_bar: u8,
    table_offset: String,
    pba_bar: u8,
    pba_offset: String,
}

impl MsiXJson {
    fn new(x: &MsiX) -> Self {
        Self {
            table_size: x.table_size,
            enabled: x.enabled,
            masked: x.masked,
            table_bar: x.table_bar,
            table_offset: format!("0x{:x}", x.table_offset),
            pba_bar: x.pba_bar,
            pba_offset: format!("0x{:x}", x.pba_offset),
        }
    }
}

#[derive(Debug, Serialize)]
struct CapJson {
    offset: String,
    id: String,
    name: Option<&'static str>,
}

#[derive(Debug, Serialize)]
struct PcieJson {
    version: u8,
    port_type: &'static str,
    link_speed: Option<&'static str>,
    link_width: Option<u8>,
    max_link_speed: Option<&'static str>,
    max_link_width: Option<u8>,
}

impl PcieJson {
    fn new(e: &Express) -> Self {
        Self {
            version: e.version,
            port_type: e.port_type_name(),
            link_speed: e.link.and_then(|l| l.speed_text()),
            link_width: e.link.map(|l| l.width),
            max_link_speed: e.max_link.and_then(|l| l.speed_text()),
            max_link_width: e.max_link.map(|l| l.width),
        }
    }
}

/// `(status, detail)` of a capability walk, in words.
fn walk_text(walk: &Walk) -> (&'static str, Option<String>) {
    match walk {
        Walk::Complete => ("complete", None),
        Walk::Truncated { needed, available } => (
            "truncated",
            Some(format!(
                "configuration space read stopped at {available} bytes, {needed} needed \
                 (only root reads past the 64-byte header)"
            )),
        ),
        Walk::Unreadable(kind) => ("unreadable", Some(format!("config file: {kind}"))),
        Walk::Malformed(m) => (
            "malformed",
            Some(match m {
                Malformed::PointerIntoHeader { from, pointer } => {
                    format!("pointer 0x{pointer:02x} at 0x{from:02x} points into the header")
                }
                Malformed::Loop { offset } => format!("the list loops back to 0x{offset:02x}"),
                Malformed::InvalidId { offset } => {
                    format!("capability ID 0xff at 0x{offset:02x}: the device is not responding")
                }
                Malformed::PastEnd { needed } => {
                    format!("a capability runs past the end ({needed} bytes needed)")
                }
            }),
        ),
    }
}

impl CapsJson {
    fn new(caps: &Capabilities) -> Self {
        let (status, detail) = walk_text(&caps.walk);
        Self {
            known: caps.is_known(),
            status,
            detail,
            list: caps
                .entries
                .iter()
                .map(|c| CapJson {
                    offset: format!("0x{:02x}", c.offset),
                    id: format!("0x{:02x}", c.id),
                    name: Capability::name_of(c.id),
                })
                .collect(),
            msi: caps.msi().map(MsiJson::new),
            msix: caps.msix().map(MsiXJson::new),
            pcie: caps.express().map(PcieJson::new),
        }
    }
}

fn bar_json(r: &Resource) -> BarJson {
    BarJson {
        index: r.index(),
        kind: if r.kind() == ResourceKind::Rom {
            "rom"
        } else {
            "bar"
        },
        start: format!("0x{:016x}", r.start()),
        end: format!("0x{:016x}", r.end()),
        size: r.size(),
        space: if r.is_io() { "io" } else { "mem" },
        prefetchable: r.is_prefetchable(),
        is_64bit: r.is_64bit(),
    }
}

fn bar_line(r: &Resource) -> Vec<String> {
    let name = match r.kind() {
        ResourceKind::Bar(i) => format!("BAR{i}"),
        ResourceKind::Rom => "ROM".to_owned(),
        ResourceKind::Other => format!("#{}", r.index()),
    };
    let mut flags = vec![if r.is_io() { "io" } else { "mem" }];
    if r.is_64bit() {
        flags.push("64-bit");
    }
    if r.is_prefetchable() {
        flags.push("prefetchable");
    }
    if r.is_unassigned() {
        flags.push("unassigned");
    }
    vec![
        format!("  {name}"),
        format!("0x{:016x}", r.start()),
        names::size(r.size()),
        flags.join(" "),
    ]
}

fn capability_line(c: &Capability) -> String {
    let name = Capability::name_of(c.id).unwrap_or("unknown");
    let mut line = format!("  0x{:02x}  {name} (id 0x{:02x})", c.offset, c.id);
    if let CapabilityKind::Msi(msi) = &c.kind {
        let bits = if msi.is_64bit { ", 64-bit" } else { "" };
        let _ = write!(line, ": {} vectors{bits}", msi.vectors);
    }
    line
}

/// Runs `userdma info`.
pub(crate) fn run(ctx: &Context, args: &Args) -> Result<(), Failure> {
    let bdf = crate::parse_bdf(&args.bdf)?;
    let dev = ctx.sysfs.device(bdf)?;
    let iommu = ctx.sysfs.iommu()?;
    let ids = names::load();
    let names = Names::of(ids.as_ref(), &dev);
    let mut members = Vec::new();
    if let Some(group) = &dev.iommu_group {
        for m in &group.members {
            members.push(MemberJson {
                bdf: *m,
                driver: ctx.sysfs.driver(*m)?,
            });
        }
    }
    let vfio = (dev.driver.as_deref() == Some(userdma::pci::Driver::VfioPci.name()))
        .then(|| VfioJson::read(ctx, bdf, args.allow_noiommu));
    if ctx.json {
        let group = dev.iommu_group.as_ref().map(|g| GroupJson {
            number: g.number,
            domain_type: g.domain_type.as_deref(),
            noiommu: g.noiommu,
            members,
        });
        let doc = InfoJson {
            summary: DeviceJson::new(&dev, &names, &iommu, group),
            subsystem_vendor: dev.subsystem_vendor.map(|v| format!("{v:04x}")),
            subsystem_device: dev.subsystem_device.map(|v| format!("{v:04x}")),
            subsystem_name: names.subsystem,
            revision: dev.revision.map(|r| format!("{r:02x}")),
            interrupt_pin: dev.interrupt_pin,
            bars: dev.bars().map(bar_json).collect(),
            capabilities: CapsJson::new(&dev.capabilities),
            vfio,
        };
        return ctx.print_json(&doc);
    }
    let mut t = text(ctx, &dev, &names, &iommu, &members);
    if let Some(vfio) = &vfio {
        vfio.text(&mut t);
    }
    crate::print(&t)
}

fn text(
    ctx: &Context,
    dev: &DeviceInfo,
    names: &Names<'_>,
    iommu: &userdma::pci::Iommu,
    members: &[MemberJson],
) -> String {
    let mut t = String::new();
    let description = names.description(dev).unwrap_or_default();
    let _ = writeln!(
        t,
        "{}  {:04x}:{:04x}  {description}",
        dev.bdf, dev.vendor, dev.device
    );
    let hex4 = |v: Option<u16>| v.map_or("-".to_owned(), |v| format!("{v:04x}"));
    let class_name = names.class.map(|c| format!(" ({c})")).unwrap_or_default();
    let subsystem_name = names
        .subsystem
        .map(|s| format!(" ({s})"))
        .unwrap_or_default();
    let pin = match dev.interrupt_pin {
        None => "unknown".to_owned(),
        Some(0) => "none (uio_pci_generic gets no interrupts)".to_owned(),
        Some(p @ 1..=4) => format!("INT{}", char::from(b'A' + p - 1)),
        Some(p) => format!("invalid ({p})"),
    };
    let group = match &dev.iommu_group {
        None => "none".to_owned(),
        Some(g) => {
            let mut s = g.number.to_string();
            if g.noiommu {
                s.push_str(" (vfio no-IOMMU)");
            } else if let Some(t) = &g.domain_type {
                let _ = write!(s, " (domain {t})");
            }
            s
        }
    };
    let mut rows = vec![
        ("class", format!("{:06x}{class_name}", dev.class)),
        (
            "subsystem",
            format!(
                "{}:{}{subsystem_name}",
                hex4(dev.subsystem_vendor),
                hex4(dev.subsystem_device)
            ),
        ),
        (
            "revision",
            dev.revision.map_or("-".to_owned(), |r| format!("{r:02x}")),
        ),
        ("driver", or_dash(dev.driver.as_deref()).to_owned()),
        (
            "driver_override",
            or_dash(dev.driver_override.as_deref()).to_owned(),
        ),
        (
            "NUMA node",
            dev.numa_node.map_or("-".to_owned(), |n| n.to_string()),
        ),
        ("interrupt pin", pin),
        ("IOMMU group", group),
    ];
    for m in members {
        rows.push((
            "  member",
            format!("{} ({})", m.bdf, or_dash(m.driver.as_deref())),
        ));
    }
    rows.push(("DMA paths", paths_text(&dma_paths(dev, iommu))));
    for (k, v) in rows {
        let _ = writeln!(t, "  {:<16} {v}", format!("{k}:"));
    }
    let bars: Vec<Vec<String>> = dev.bars().map(bar_line).collect();
    if bars.is_empty() {
        t.push_str("BARs: none\n");
    } else {
        t.push_str("BARs:\n");
        t.push_str(&names::table(&bars));
    }
    t.push_str("capabilities:\n");
    for c in &dev.capabilities.entries {
        t.push_str(&capability_line(c));
        t.push('\n');
    }
    let caps = &dev.capabilities;
    if let Some(x) = caps.msix() {
        let _ = writeln!(
            t,
            "  MSI-X: table size {}, table in BAR{} at 0x{:x}, PBA in BAR{} at 0x{:x}{}",
            x.table_size,
            x.table_bar,
            x.table_offset,
            x.pba_bar,
            x.pba_offset,
            if x.enabled { ", enabled" } else { "" }
        );
    }
    if let Some(e) = caps.express() {
        let link = e.link.map_or("no link".to_owned(), |l| {
            format!("link {} x{}", l.speed_text().unwrap_or("?"), l.width)
        });
        let _ = writeln!(t, "  PCIe: v{}, {}, {link}", e.version, e.port_type_name());
    }
    if let (_, Some(detail)) = walk_text(&caps.walk) {
        let _ = writeln!(t, "  (capabilities beyond this are unknown: {detail})");
    } else if caps.entries.is_empty() {
        t.push_str("  none\n");
    }
    let _ = writeln!(t, "{}", system_line(&ctx.sysfs, iommu));
    t
}
