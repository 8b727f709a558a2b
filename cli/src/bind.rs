//! `userdma bind BDF --driver vfio-pci|uio_pci_generic [--force-group]`.

use serde::Serialize;
use userdma::pci::{BindOptions, Binder, Change, DmaPath, Driver, LiveKernel};

use crate::exit::Failure;
use crate::Context;

/// The drivers `bind` accepts.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum DriverArg {
    /// VFIO, with IOMMU isolation (or no-IOMMU mode).
    #[value(name = "vfio-pci", alias = "vfio_pci")]
    VfioPci,
    /// UIO: BAR access and INTx; DMA by physical address.
    #[value(name = "uio_pci_generic", alias = "uio-pci-generic")]
    UioPciGeneric,
}

impl From<DriverArg> for Driver {
    fn from(d: DriverArg) -> Self {
        match d {
            DriverArg::VfioPci => Driver::VfioPci,
            DriverArg::UioPciGeneric => Driver::UioPciGeneric,
        }
    }
}

/// Arguments of `userdma bind`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The device, `DDDD:BB:DD.F` or `BB:DD.F` (hex).
    #[arg(value_name = "BDF")]
    bdf: String,

    /// The driver to bind.
    #[arg(long, value_enum)]
    driver: DriverArg,

    /// For vfio-pci: also bind the other members of the device's IOMMU group that are on host
    /// drivers (VFIO can only use a group when all its members are on vfio-pci or no driver).
    #[arg(long)]
    force_group: bool,
}

#[derive(Debug, Serialize)]
struct BindJson<'a> {
    bdf: userdma::pci::Bdf,
    driver: Driver,
    changes: &'a [Change],
}

/// Runs `userdma bind`.
pub(crate) fn run(ctx: &Context, args: &Args) -> Result<(), Failure> {
    let bdf = crate::parse_bdf(&args.bdf)?;
    let driver = Driver::from(args.driver);
    let binder = Binder::new(ctx.sysfs.clone(), LiveKernel);
    let options = BindOptions {
        force_group: args.force_group,
    };
    let report = binder.bind(bdf, driver, options)?;
    if driver == Driver::UioPciGeneric {
        warn_uio(ctx, bdf);
    }
    if ctx.json {
        return ctx.print_json(&BindJson {
            bdf,
            driver,
            changes: &report.changes,
        });
    }
    let mut text = String::new();
    if report.changes.first().is_none_or(|c| c.bdf != bdf) {
        text.push_str(&format!("{bdf} is already bound to {driver}\n"));
    }
    for c in &report.changes {
        let from = c.from.as_deref().unwrap_or("no driver");
        let to = c.to.as_deref().unwrap_or("no driver");
        text.push_str(&format!("{}: {from} -> {to}\n", c.bdf));
    }
    crate::print(&text)
}

/// Tells on stderr what a `uio_pci_generic` binding will not do for this device.
fn warn_uio(ctx: &Context, bdf: userdma::pci::Bdf) {
    let (Ok(dev), Ok(iommu)) = (ctx.sysfs.device(bdf), ctx.sysfs.iommu()) else {
        return;
    };
    if !dev.dma_paths(&iommu).contains(&DmaPath::Uio) {
        eprintln!(
            "userdma: warning: the IOMMU translates {bdf}'s DMA: through uio_pci_generic it will \
             fault on physical addresses; use vfio-pci (or boot with iommu=pt)"
        );
    }
    if dev.has_intx() == Some(false) {
        eprintln!("userdma: warning: {bdf} has no INTx pin: uio_pci_generic delivers no interrupts for it");
    }
}
