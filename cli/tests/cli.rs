//! The `userdma` binary against fake sysfs trees and this machine's `/sys`: text and JSON output,
//! error lines, and exit codes.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::{config_space, Dev, Tree};
use serde_json::Value;

const DEV: &str = "0000:01:00.0";

/// A small PCI ID database, so names do not depend on the machine's.
const IDS: &str = "\
1af4  Red Hat, Inc.
\t1041  Virtio 1.0 network device
\t\t1af4 1100  QEMU Virtual Machine
8086  Intel Corporation
C 02  Network controller
\t00  Ethernet controller
";

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }

    /// The single stderr line, checked to have the documented form.
    fn error_line(&self) -> &str {
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one error line: {:?}", self.stderr);
        assert!(lines[0].starts_with("userdma: error: "), "{}", lines[0]);
        lines[0]
    }
}

/// Runs the binary with `args`, the fake PCI ID database in `dir` (or none), and `root` as
/// `--sysfs-root` when given.
fn run_with(root: Option<&Path>, ids: Option<&str>, args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_userdma"));
    if let Some(root) = root {
        cmd.arg("--sysfs-root").arg(root);
    }
    cmd.args(args);
    match ids {
        Some(path) => cmd.env("USERDMA_PCI_IDS", path),
        None => cmd.env("USERDMA_PCI_IDS", ""),
    };
    let out = cmd.output().expect("running userdma");
    Run {
        code: out.status.code().expect("exit code"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// A tree with the IDs file, one device on nvme in group 7 with 00:1f.3 on i801_smbus, and
/// vfio-pci loaded.
fn tree() -> (Tree, String) {
    let t = Tree::new();
    t.add(&Dev::new(DEV))
        .add(&Dev::new("0000:00:1f.3").ids(0x8086, 0x2930, 0x0c0500));
    t.driver("nvme").driver("i801_smbus").driver("vfio-pci");
    t.bind(DEV, "nvme")
        .bind("0000:00:1f.3", "i801_smbus")
        .group(7, &[DEV, "0000:00:1f.3"]);
    t.write("class/iommu/dmar0/x", "");
    t.write("ids/pci.ids", IDS);
    let ids = t.root().join("ids/pci.ids").to_str().unwrap().to_owned();
    (t, ids)
}

fn run(t: &Tree, ids: &str, args: &[&str]) -> Run {
    run_with(Some(t.root()), Some(ids), args)
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

// ---- list ---------------------------------------------------------------------------------

#[test]
fn list_on_this_machine_succeeds() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_userdma"));
    let out = cmd
        .arg("list")
        .env_remove("USERDMA_PCI_IDS")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("BDF "));
    for e in std::fs::read_dir("/sys/bus/pci/devices").unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(
            stdout.lines().any(|l| l.starts_with(&name)),
            "{name} listed:\n{stdout}"
        );
    }
    assert!(stdout.lines().last().unwrap().starts_with("IOMMU: "));
}

#[test]
fn list_and_info_json_on_this_machine() {
    let r = run_with(None, None, &["list", "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc = r.json();
    let devices = doc["devices"].as_array().unwrap();
    let count = std::fs::read_dir("/sys/bus/pci/devices").unwrap().count();
    assert_eq!(devices.len(), count);
    assert!(doc["iommu"]["active"].is_boolean());
    for d in devices {
        let bdf = d["bdf"].as_str().unwrap();
        assert_eq!(d["vendor"].as_str().unwrap().len(), 4);
        let info = run_with(None, None, &["--json", "info", bdf]);
        assert_eq!(info.code, 0, "{bdf}: {}", info.stderr);
        let info = info.json();
        assert_eq!(info["bdf"], d["bdf"]);
        assert_eq!(info["class"], d["class"]);
        assert!(info["capabilities"]["list"].is_array());
    }
}

#[test]
fn list_text_on_a_fake_tree() {
    let (t, ids) = tree();
    let r = run(&t, &ids, &["list"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.is_empty(), "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        words(lines[0]),
        [
            "BDF",
            "VENDOR:DEVICE",
            "CLASS",
            "DRIVER",
            "IOMMU",
            "NUMA",
            "DMA",
            "DESCRIPTION"
        ]
    );
    assert_eq!(
        words(lines[1]),
        [
            "0000:00:1f.3",
            "8086:2930",
            "0c0500",
            "i801_smbus",
            "7",
            "0",
            "vfio",
            "Intel",
            "Corporation",
            "Device",
            "2930"
        ]
    );
    assert_eq!(
        words(lines[2]),
        [
            DEV,
            "1af4:1041",
            "020000",
            "nvme",
            "7",
            "0",
            "vfio",
            "Red",
            "Hat,",
            "Inc.",
            "Virtio",
            "1.0",
            "network",
            "device",
            "[Ethernet",
            "controller]"
        ]
    );
    // Columns line up.
    assert_eq!(lines[1].find("8086"), lines[2].find("1af4"));
    assert_eq!(lines[3], "");
    assert_eq!(
        lines[4],
        "IOMMU: on (dmar0), 1 IOMMU group; VFIO no-IOMMU mode: off (vfio not loaded, or built without CONFIG_VFIO_NOIOMMU); drivers: vfio-pci loaded, uio_pci_generic not loaded"
    );
}

#[test]
fn list_json_on_a_fake_tree() {
    let (t, ids) = tree();
    let doc = run(&t, &ids, &["list", "--json"]).json();
    assert_eq!(
        doc["iommu"],
        serde_json::json!({"active": true, "units": ["dmar0"], "groups": 1, "noiommu_mode": null})
    );
    assert_eq!(
        doc["drivers_loaded"],
        serde_json::json!({"vfio-pci": true, "uio_pci_generic": false})
    );
    assert_eq!(
        doc["devices"][1],
        serde_json::json!({
            "bdf": DEV, "vendor": "1af4", "device": "1041",
            "vendor_name": "Red Hat, Inc.", "device_name": "Virtio 1.0 network device",
            "class": "020000", "class_name": "Ethernet controller",
            "driver": "nvme", "driver_override": null, "iommu_group": 7, "numa_node": 0,
            "dma_paths": ["vfio"]
        })
    );
}

#[test]
fn names_are_optional() {
    let (t, _) = tree();
    let r = run_with(Some(t.root()), None, &["list", "--json"]);
    assert_eq!(r.code, 0);
    assert!(r.stderr.is_empty());
    assert_eq!(r.json()["devices"][1]["vendor_name"], Value::Null);
    let r = run_with(Some(t.root()), None, &["list"]);
    assert!(
        r.stdout.lines().nth(2).unwrap().ends_with(" vfio  -"),
        "{}",
        r.stdout
    );
    // A database that cannot be read costs the names, with a warning, not the command.
    let r = run_with(Some(t.root()), Some("/nonexistent/pci.ids"), &["list"]);
    assert_eq!(r.code, 0);
    assert!(
        r.stderr
            .starts_with("userdma: warning: cannot read the PCI ID database /nonexistent/pci.ids"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("names are left out"));
    t.write("ids/bad.ids", "this is not pci.ids\n");
    let bad = t.root().join("ids/bad.ids");
    let r = run_with(Some(t.root()), Some(bad.to_str().unwrap()), &["list"]);
    assert_eq!(r.code, 0);
    assert!(r.stderr.contains("line 1"), "{}", r.stderr);
}

#[test]
fn missing_sysfs_is_a_system_failure() {
    let r = run_with(Some(Path::new("/nonexistent-sysfs")), None, &["list"]);
    assert_eq!(r.code, 1);
    let line = r.error_line();
    assert!(
        line.contains("cannot list PCI devices in /nonexistent-sysfs/bus/pci/devices"),
        "{line}"
    );
    assert!(
        line.ends_with("No such file or directory (os error 2)"),
        "{line}"
    );
}

// ---- info ---------------------------------------------------------------------------------

#[test]
fn info_text_on_a_fake_tree() {
    let (t, ids) = tree();
    let r = run(&t, &ids, &["info", "01:00.0"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let out = &r.stdout;
    assert!(
        out.starts_with("0000:01:00.0  1af4:1041  Red Hat, Inc. Virtio 1.0 network device\n"),
        "{out}"
    );
    for expected in [
        "  class:           020000 (Ethernet controller)",
        "  subsystem:       1af4:1100 (QEMU Virtual Machine)",
        "  driver:          nvme",
        "  driver_override: -",
        "  NUMA node:       0",
        "  interrupt pin:   INTA",
        "  IOMMU group:     7 (domain DMA)",
        "    member:        0000:00:1f.3 (i801_smbus)",
        "    member:        0000:01:00.0 (nvme)",
        "  DMA paths:       vfio",
        "  BAR0  0x00000000fe000000  16 KiB     mem 64-bit",
        "  BAR2  0x000000000000c000  256 bytes  io",
        "  0x40  MSI (id 0x05): 8 vectors, 64-bit",
        "  0x50  MSI-X (id 0x11)",
        "  0x60  PCI Express (id 0x10)",
        "  MSI-X: table size 16, table in BAR0 at 0x2000, PBA in BAR0 at 0x3000",
        "  PCIe: v2, Endpoint, link 8 GT/s x4",
    ] {
        assert!(
            out.lines().any(|l| l == expected),
            "missing {expected:?} in\n{out}"
        );
    }
}

#[test]
fn info_json_on_a_fake_tree() {
    let (t, ids) = tree();
    let doc = run(&t, &ids, &["info", DEV, "--json"]).json();
    assert_eq!(doc["bdf"], DEV);
    assert_eq!(doc["subsystem_name"], "QEMU Virtual Machine");
    assert_eq!(doc["revision"], "01");
    assert_eq!(doc["interrupt_pin"], 1);
    assert_eq!(
        doc["iommu_group"],
        serde_json::json!({"number": 7, "domain_type": "DMA", "noiommu": false, "members": [
            {"bdf": "0000:00:1f.3", "driver": "i801_smbus"}, {"bdf": DEV, "driver": "nvme"}]})
    );
    assert_eq!(
        doc["bars"][0],
        serde_json::json!({"index": 0, "kind": "bar", "start": "0x00000000fe000000",
            "end": "0x00000000fe003fff", "size": 16384, "type": "mem", "prefetchable": false,
            "is_64bit": true})
    );
    assert_eq!(doc["bars"][1]["type"], "io");
    let caps = &doc["capabilities"];
    assert_eq!(
        (caps["known"].as_bool(), caps["status"].as_str()),
        (Some(true), Some("complete"))
    );
    assert_eq!(caps["msix"]["table_size"], 16);
    assert_eq!(caps["msi"]["vectors"], 8);
    assert_eq!(caps["pcie"]["link_speed"], "8 GT/s");
    assert_eq!(
        caps["list"][1],
        serde_json::json!({"offset": "0x50", "id": "0x11", "name": "MSI-X"})
    );
}

#[test]
fn info_with_a_truncated_config_says_capabilities_are_unknown() {
    let (t, ids) = tree();
    t.write(
        &Tree::attr(DEV, "config"),
        &config_space(0x1af4, 0x1041, 0x020000)[..64],
    );
    let r = run(&t, &ids, &["info", DEV]);
    assert_eq!(r.code, 0);
    assert!(
        r.stdout.contains(
            "(capabilities beyond this are unknown: configuration space read stopped at 64 bytes"
        ),
        "{}",
        r.stdout
    );
    let doc = run(&t, &ids, &["--json", "info", DEV]).json();
    assert_eq!(doc["capabilities"]["known"], false);
    assert_eq!(doc["capabilities"]["status"], "truncated");
    assert_eq!(doc["capabilities"]["msix"], Value::Null);
}

#[test]
fn bad_bdf_is_a_usage_error() {
    let (t, ids) = tree();
    for bad in ["zz", "0000:01:00.8", "0000:01:20.0", "1:00.0"] {
        let r = run(&t, &ids, &["info", bad]);
        assert_eq!(r.code, 2, "{bad}");
        let line = r.error_line();
        assert!(
            line.starts_with(&format!("userdma: error: invalid PCI address {bad:?}")),
            "{line}"
        );
        assert!(line.contains("expected DDDD:BB:DD.F"), "{line}");
    }
}

#[test]
fn absent_device_is_not_found_in_text_and_json() {
    let (t, ids) = tree();
    let r = run(&t, &ids, &["info", "0000:02:00.0"]);
    assert_eq!(r.code, 3);
    assert!(r.error_line().contains("no PCI device 0000:02:00.0"));
    let r = run(&t, &ids, &["--json", "unbind", "0000:02:00.0"]);
    assert_eq!(r.code, 3);
    assert_eq!(r.json()["error"]["exit_code"], 3);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no PCI device"));
}

// ---- bind / unbind ------------------------------------------------------------------------

#[test]
fn bind_group_conflict_is_refused() {
    let (t, ids) = tree();
    let r = run(&t, &ids, &["bind", DEV, "--driver", "vfio-pci"]);
    assert_eq!(r.code, 4);
    assert_eq!(
        r.error_line(),
        "userdma: error: IOMMU group 7 also holds 0000:00:1f.3 bound to i801_smbus: bind it too or use --force-group"
    );
    assert_eq!(
        t.read(&Tree::attr(DEV, "driver_override")),
        "(null)\n",
        "nothing written"
    );
    let r = run(&t, &ids, &["--json", "bind", DEV, "--driver", "vfio-pci"]);
    assert_eq!(r.code, 4);
    assert_eq!(r.json()["error"]["exit_code"], 4);
}

#[test]
fn bind_of_an_unloaded_driver_is_refused() {
    let (t, ids) = tree();
    let r = run(&t, &ids, &["bind", DEV, "--driver", "uio_pci_generic"]);
    assert_eq!(r.code, 4);
    assert!(r.error_line().contains("run `modprobe uio_pci_generic`"));
}

#[test]
fn bind_with_an_unknown_driver_is_a_usage_error() {
    let (t, ids) = tree();
    let r = run(&t, &ids, &["bind", DEV, "--driver", "nvme"]);
    assert_eq!(r.code, 2);
    let line = r.error_line();
    assert!(
        line.contains("'nvme'") && line.contains("vfio-pci") && line.contains("uio_pci_generic"),
        "{line}"
    );
}

#[test]
fn bind_that_the_kernel_ignores_is_rolled_back() {
    // Plain files do not react to writes: the probe leaves nvme bound, the bind fails, and the
    // rollback restores driver_override.
    let (t, ids) = tree();
    t.write("module/vfio/parameters/enable_unsafe_noiommu_mode", "N\n");
    let r = run(
        &t,
        &ids,
        &[
            "bind",
            "0000:00:1f.3",
            "--driver",
            "vfio-pci",
            "--force-group",
        ],
    );
    assert_eq!(r.code, 5, "{}", r.stderr);
    let line = r.error_line();
    assert!(line.contains("binding 0000:00:1f.3 to vfio-pci failed; rolled back: 0000:00:1f.3 is on i801_smbus again"), "{line}");
    assert!(
        line.contains("after the probe 0000:00:1f.3 is on i801_smbus, not vfio-pci"),
        "{line}"
    );
    let o = run(&t, &ids, &["--json", "info", "0000:00:1f.3"]).json();
    assert_eq!(o["driver_override"], Value::Null);
}

#[test]
fn bind_of_an_already_bound_device_succeeds() {
    let (t, ids) = tree();
    t.remove(&Tree::attr(DEV, "driver"))
        .remove(&format!("bus/pci/drivers/nvme/{DEV}"));
    t.bind(DEV, "vfio-pci");
    t.remove(&Tree::attr("0000:00:1f.3", "driver"));
    let r = run(&t, &ids, &["bind", DEV, "--driver", "vfio_pci"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, "0000:01:00.0 is already bound to vfio-pci\n");
    let r = run(&t, &ids, &["bind", "--json", DEV, "--driver", "vfio-pci"]);
    assert_eq!(
        r.json(),
        serde_json::json!({"bdf": DEV, "driver": "vfio-pci", "changes": []})
    );
}

#[test]
fn unbind_from_a_host_driver_is_a_no_op() {
    let (t, ids) = tree();
    let r = run(&t, &ids, &["unbind", DEV]);
    assert_eq!(r.code, 0);
    assert_eq!(
        r.stdout,
        "0000:01:00.0 is on nvme, not on a user-space driver: nothing to do\n"
    );
    let r = run(&t, &ids, &["unbind", DEV, "--json"]);
    assert_eq!(
        r.json(),
        serde_json::json!({"bdf": DEV, "from": "nvme", "to": "nvme", "changed": false})
    );
}

#[test]
fn unbind_that_the_kernel_ignores_is_rolled_back() {
    let (t, ids) = tree();
    t.remove(&Tree::attr(DEV, "driver"))
        .remove(&format!("bus/pci/drivers/nvme/{DEV}"));
    t.bind(DEV, "vfio-pci")
        .write(&Tree::attr(DEV, "driver_override"), "vfio-pci\n");
    let r = run(&t, &ids, &["unbind", DEV]);
    assert_eq!(r.code, 5, "{}", r.stderr);
    let line = r.error_line();
    assert!(line.contains("returning 0000:01:00.0 to its default driver failed; rolled back: 0000:01:00.0 is on vfio-pci again"), "{line}");
    assert!(
        line.contains("vfio-pci claimed 0000:01:00.0 again"),
        "{line}"
    );
    assert_eq!(t.read(&Tree::attr(DEV, "driver_override")), "vfio-pci");
}

// ---- usage ---------------------------------------------------------------------------------

#[test]
fn help_documents_the_exit_codes() {
    let r = run_with(None, None, &["--help"]);
    assert_eq!(r.code, 0);
    for code in [
        "0  success",
        "2  bad usage",
        "3  no such device",
        "4  refused",
        "5  failed after a change, rolled back",
        "6  failed, and the rollback failed",
    ] {
        assert!(r.stdout.contains(code), "{code:?} in\n{}", r.stdout);
    }
    for cmd in ["list", "info", "bind", "unbind"] {
        assert!(r.stdout.contains(&format!("  {cmd} ")), "{cmd}");
    }
    assert!(r.stdout.contains("--sysfs-root") && r.stdout.contains("--json"));
}

#[test]
fn unknown_subcommand_and_missing_arguments_are_usage_errors() {
    for args in [&["frobnicate"][..], &["info"], &["bind", DEV], &[]] {
        let r = run_with(None, None, args);
        assert_eq!(r.code, 2, "{args:?}");
        assert!(r.error_line().ends_with("(see --help)"), "{}", r.stderr);
        assert!(r.stdout.is_empty());
    }
}

/// A fake sysfs tree with 2M and 1G pools, system-wide and on node 0.
fn hugepage_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let pools = [
        ("kernel/mm/hugepages/hugepages-2048kB", Some(3)),
        ("kernel/mm/hugepages/hugepages-1048576kB", Some(0)),
        ("devices/system/node/node0/hugepages/hugepages-2048kB", None),
        (
            "devices/system/node/node0/hugepages/hugepages-1048576kB",
            None,
        ),
    ];
    for (path, resv) in pools {
        let p = dir.path().join(path);
        std::fs::create_dir_all(&p).expect("mkdir");
        std::fs::write(p.join("nr_hugepages"), "8\n").expect("write");
        std::fs::write(p.join("free_hugepages"), "5\n").expect("write");
        std::fs::write(p.join("surplus_hugepages"), "0\n").expect("write");
        if let Some(r) = resv {
            std::fs::write(p.join("resv_hugepages"), format!("{r}\n")).expect("write");
        }
    }
    dir
}

#[test]
fn hugepages_status_text_and_json_on_a_fake_tree() {
    let t = hugepage_tree();
    let r = run_with(Some(t.path()), None, &["hugepages"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("2M"))
        .expect("2M row");
    assert_eq!(words(line), ["2M", "all", "8", "5", "3", "0"]);

    let r = run_with(Some(t.path()), None, &["--json", "hugepages"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v = r.json();
    let pools = v["pools"].as_array().expect("pools");
    assert_eq!(pools.len(), 4);
    let node0_1g = pools
        .iter()
        .find(|p| p["page_size"] == "1G" && p["node"] == 0)
        .expect("1G pool of node 0");
    assert_eq!(node0_1g["total"], 8);
    assert_eq!(node0_1g["reserved"], Value::Null);
    assert_eq!(v["reservation"], Value::Null);
}

#[test]
fn hugepages_reserve_writes_the_pool_and_reports_the_grant() {
    let t = hugepage_tree();
    let r = run_with(
        Some(t.path()),
        None,
        &[
            "--json",
            "hugepages",
            "--reserve",
            "16",
            "--size",
            "1G",
            "--node",
            "0",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let file = t
        .path()
        .join("devices/system/node/node0/hugepages/hugepages-1048576kB/nr_hugepages");
    assert_eq!(std::fs::read_to_string(file).expect("read").trim(), "16");
    let v = r.json();
    assert_eq!(v["reservation"]["previous"], 8);
    assert_eq!(v["reservation"]["requested"], 16);
    assert_eq!(v["reservation"]["granted"], 16);
}

#[test]
fn hugepages_bad_size_and_missing_node_are_usage_errors() {
    let t = hugepage_tree();
    let r = run_with(
        Some(t.path()),
        None,
        &["hugepages", "--reserve", "1", "--size", "3M"],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    r.error_line();
    let r = run_with(
        Some(t.path()),
        None,
        &["hugepages", "--reserve", "1", "--size", "4K"],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.error_line().contains("2M or 1G"), "{}", r.stderr);
    let r = run_with(
        Some(t.path()),
        None,
        &["hugepages", "--reserve", "1", "--node", "7"],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.error_line().contains("node7") || r.stderr.contains("node 7"),
        "{}",
        r.stderr
    );
}
