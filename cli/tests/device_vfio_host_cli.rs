//! The VFIO view of `userdma info` and `userdma list` not offering DMA paths for host bridges,
//! against fake sysfs trees (the library's side of these devices is tests/device_vfio_host.rs).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::{Dev, Tree};

const DEV: &str = "0000:01:00.0";
const PEER: &str = "0000:01:00.1";

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

/// Runs `userdma --sysfs-root ROOT ARGS`.
fn userdma(root: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_userdma"))
        .arg("--sysfs-root")
        .arg(root)
        .args(args)
        .env("USERDMA_PCI_IDS", "")
        .output()
        .expect("running userdma");
    (
        out.status.code().expect("exit code"),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn info_has_a_vfio_view_for_vfio_pci_devices() {
    let t = tree();
    let (code, out, err) = userdma(t.root(), &["info", DEV]);
    assert_eq!(code, 0, "{err}");
    // The fake device cannot be opened through this machine's /dev/vfio: the view says why.
    assert!(out.contains("VFIO: unavailable: "), "{out}");
    let (code, out, err) = userdma(t.root(), &["--json", "info", DEV]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(doc["vfio"]["error"].is_string(), "{doc}");
    assert!(doc["vfio"]["regions"].as_array().is_some_and(Vec::is_empty));
    // A device on another driver has no VFIO view.
    let (_, out, _) = userdma(t.root(), &["--json", "info", PEER]);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(doc.get("vfio").is_none(), "{doc}");
    let (_, out, _) = userdma(t.root(), &["info", PEER]);
    assert!(!out.contains("VFIO:") && !out.contains("VFIO ("), "{out}");
}

#[test]
fn list_offers_no_dma_path_for_host_bridges() {
    let t = Tree::new();
    t.add(&Dev::new("0000:00:00.0").ids(0x8086, 0x29c0, 0x06_00_00))
        .add(&Dev::new(DEV).ids(0x1234, 0x11e8, 0x00ff00));
    let (code, out, err) = userdma(t.root(), &["--json", "list"]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let devices = doc["devices"].as_array().unwrap();
    let paths = |b: &str| {
        devices
            .iter()
            .find(|d| d["bdf"] == b)
            .map(|d| d["dma_paths"].clone())
            .unwrap()
    };
    assert_eq!(paths("0000:00:00.0"), serde_json::json!([]));
    assert_eq!(paths(DEV), serde_json::json!(["uio"]));
    let (_, text, _) = userdma(t.root(), &["list"]);
    let bridge = text
        .lines()
        .find(|l| l.starts_with("0000:00:00.0"))
        .unwrap();
    assert!(!bridge.contains("uio"), "{bridge}");
    let (_, info, _) = userdma(t.root(), &["info", "0000:00:00.0"]);
    assert!(
        info.lines()
            .any(|l| l.contains("DMA paths:") && l.trim_end().ends_with('-')),
        "{info}"
    );
}
