//! `userdma unbind BDF`: back to the kernel's default driver.

use serde::Serialize;
use userdma::pci::{Bdf, Binder, LiveKernel};

use crate::exit::Failure;
use crate::Context;

/// Arguments of `userdma unbind`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The device, `DDDD:BB:DD.F` or `BB:DD.F` (hex).
    #[arg(value_name = "BDF")]
    bdf: String,
}

#[derive(Debug, Serialize)]
struct UnbindJson<'a> {
    bdf: Bdf,
    from: Option<&'a str>,
    to: Option<&'a str>,
    changed: bool,
}

/// Runs `userdma unbind`.
pub(crate) fn run(ctx: &Context, args: &Args) -> Result<(), Failure> {
    let bdf = crate::parse_bdf(&args.bdf)?;
    let binder = Binder::new(ctx.sysfs.clone(), LiveKernel);
    let r = binder.unbind(bdf)?;
    if ctx.json {
        return ctx.print_json(&UnbindJson {
            bdf,
            from: r.from.as_deref(),
            to: r.to.as_deref(),
            changed: r.changed,
        });
    }
    let text = match (&r.from, &r.to, r.changed) {
        (Some(d), _, false) => {
            format!("{bdf} is on {d}, not on a user-space driver: nothing to do\n")
        }
        (from, Some(to), _) => {
            format!(
                "{bdf}: {} -> {to}\n",
                from.as_deref().unwrap_or("no driver")
            )
        }
        (from, None, _) => format!(
            "{bdf}: {} -> no driver (no kernel driver claimed it)\n",
            from.as_deref().unwrap_or("no driver")
        ),
    };
    crate::print(&text)
}
