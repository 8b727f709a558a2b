//! The `userdma` command-line tool against a device bound to `vfio-pci`: `userdma info` shows
//! the VFIO view (the backend's mode, regions with flags, IRQ counts), in JSON and as text.
//! `tests/guest/run.sh` puts the statically linked tool in the initramfs as `/userdma`.

use std::process::{Command, Output, Stdio};

use serde_json::Value;
use userdma::pci::Driver;

use crate::env::Env;
use crate::failure::{ensure, Context, Failure};
use crate::Boot;

/// Where `tests/guest/run.sh` puts the `userdma` binary in the initramfs.
pub(crate) const TOOL: &str = "/userdma";

/// edu's BAR0 size (QEMU's edu device: 1 MiB of registers).
const EDU_BAR0: u64 = 1 << 20;

/// Runs `userdma args...` to completion.
fn run(args: &[&str]) -> Result<Output, Failure> {
    let output = Command::new(TOOL)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context(|| format!("run {TOOL} {}", args.join(" ")))?;
    for line in String::from_utf8_lossy(&output.stderr).lines() {
        println!("INFO cli stderr: {line}");
    }
    Ok(output)
}

/// The `vfio` object of `userdma info BDF --json [extra]`, after checking the exit status.
fn vfio_json(bdf: &str, extra: &[&str]) -> Result<Value, Failure> {
    let mut args = vec!["info", bdf, "--json"];
    args.extend_from_slice(extra);
    let output = run(&args)?;
    ensure!(
        output.status.success(),
        "userdma {} exited with {}",
        args.join(" "),
        output.status
    );
    let doc: Value = serde_json::from_slice(&output.stdout).map_err(|err| {
        Failure::Check(format!(
            "the output of userdma {} is not JSON ({err}): {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout)
        ))
    })?;
    doc.get("vfio").cloned().ok_or_else(|| {
        Failure::Check(format!(
            "userdma {} printed no \"vfio\" object for a device bound to vfio-pci: {doc}",
            args.join(" ")
        ))
    })
}

/// `userdma info` on edu bound to `vfio-pci`: the VFIO view names the mode the boot gives
/// (`noiommu` needs `--allow-noiommu`, and without it the view says why it is unavailable),
/// BAR0 (1 MiB, readable, writable, mappable) and the config region, and the INTx and MSI
/// interrupt counts; the text form shows the same.
pub(crate) fn info_vfio(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let bdf = env.edu.to_string();
    let (mode, extra): (&str, &[&str]) = match env.boot {
        Boot::NoIommu => ("noiommu", &["--allow-noiommu"]),
        Boot::IommuPt | Boot::IommuStrict => ("type1", &[]),
        Boot::Iommufd => ("iommufd", &[]),
    };

    if env.boot == Boot::NoIommu {
        let refused = vfio_json(&bdf, &[])?;
        ensure!(
            refused["mode"].is_null() && refused["error"].is_string(),
            "without --allow-noiommu the view must be unavailable, with the reason: {refused}"
        );
    }

    let vfio = vfio_json(&bdf, extra)?;
    ensure!(
        vfio["error"].is_null(),
        "VFIO view error: {}",
        vfio["error"]
    );
    ensure!(vfio["mode"] == mode, "mode {} (want {mode})", vfio["mode"]);
    let regions = vfio["regions"]
        .as_array()
        .ok_or_else(|| Failure::Check(format!("no regions array: {vfio}")))?;
    let region = |name: &str| regions.iter().find(|r| r["name"] == name);
    let bar0 = region("BAR0").ok_or_else(|| Failure::Check(format!("no BAR0: {vfio}")))?;
    ensure!(bar0["size"] == EDU_BAR0, "BAR0 size {}", bar0["size"]);
    let flags = bar0["flags"].as_str().unwrap_or_default();
    for flag in ["read", "write", "mmap"] {
        ensure!(
            flags.split(' ').any(|f| f == flag),
            "BAR0 flags {flags:?} lack {flag}"
        );
    }
    let config = region("config").ok_or_else(|| Failure::Check(format!("no config: {vfio}")))?;
    ensure!(
        config["size"].as_u64().is_some_and(|size| size >= 256),
        "config region size {}",
        config["size"]
    );
    let irqs = vfio["irqs"]
        .as_array()
        .ok_or_else(|| Failure::Check(format!("no irqs array: {vfio}")))?;
    let count = |name: &str| {
        irqs.iter()
            .find(|i| i["name"] == name)
            .and_then(|i| i["count"].as_u64())
    };
    ensure!(count("INTx") == Some(1), "INTx count {:?}", count("INTx"));
    ensure!(
        count("MSI").is_some_and(|n| n >= 1),
        "MSI count {:?}",
        count("MSI")
    );

    let mut args = vec!["info", bdf.as_str()];
    args.extend_from_slice(extra);
    let output = run(&args)?;
    ensure!(
        output.status.success(),
        "userdma info exited with {}",
        output.status
    );
    let text = String::from_utf8_lossy(&output.stdout);
    for line in text.lines() {
        println!("INFO cli: {line}");
    }
    ensure!(
        text.contains(&format!("VFIO ({mode}):")) && text.contains("BAR0") && text.contains("MSI"),
        "the text view lacks the VFIO section: {text:?}"
    );
    bound.release()
}
