//! `userdma demo transfers`: every transfer comes back verified with any number of batches in
//! flight, and the report sets measured busy time beside modelled, with their ratio and what
//! bound the run, consistently with the counters it reports.

use std::process::Command;

mod tool;

fn demo(args: &[&str]) -> serde_json::Value {
    tool::run_json(&[&["demo", "transfers", "--json"], args].concat())
}

#[test]
fn the_transfer_demo_verifies_every_transfer_and_reports_busy_against_modelled() {
    for depth in ["1", "2", "4"] {
        let r = demo(&[
            "--size", "16K", "--count", "96", "--batch", "4", "--depth", depth,
        ]);
        assert_eq!(r["transfers"], 96, "--depth {depth}: {r}");
        assert_eq!(r["device"]["errors"], 0);
        let (t, d) = (&r["timing"], &r["device"]);
        assert_eq!(t["busy_ns"], d["busy_ns"]);
        assert_eq!(t["modelled_ns"], d["modelled_ns"]);
        let (busy, modelled) = (
            t["busy_ns"].as_f64().unwrap(),
            t["modelled_ns"].as_f64().unwrap(),
        );
        assert!(modelled > 0.0, "{t}");
        let ratio = t["ratio"].as_f64().unwrap();
        assert!((ratio - busy / modelled).abs() < 1e-9, "{t}");
        let within = (ratio - 1.0).abs() <= 0.05;
        assert_eq!(t["within_5_percent"], within, "{t}");
        let bound = t["bound"].as_str().unwrap();
        if within {
            assert_eq!(bound, "model", "{t}");
        } else {
            let host = t["engine_work_ns_per_transfer"].as_u64().unwrap()
                > t["modelled_ns_per_transfer"].as_u64().unwrap();
            assert_eq!(bound, if host { "host" } else { "late" }, "{t}");
        }
        // The copy unit ran every descriptor.
        assert_eq!(t["units"][0]["unit"], "copy", "{t}");
        assert_eq!(t["units"][0]["modelled_ns"], d["modelled_ns"]);
    }
}

#[test]
fn under_the_zero_cost_model_nothing_is_modelled_and_pinning_can_be_left_off() {
    let r = demo(&[
        "--size", "4K", "--count", "64", "--cost", "zero", "--no-pin",
    ]);
    assert_eq!(r["transfers"], 64);
    let t = &r["timing"];
    assert_eq!(t["bound"], "unmodelled", "{t}");
    assert!(t["ratio"].is_null(), "{t}");
    assert_eq!(t["within_5_percent"], false, "{t}");
    assert!(t["placement"]["engine_cpu"].is_null(), "{t}");
    assert_eq!(t["placement"]["host_cpus"], serde_json::json!([]), "{t}");
}

#[test]
fn bad_transfer_settings_are_usage_errors() {
    for args in [
        &["--depth", "0"][..],
        &["--depth", "5"],
        &["--no-pin", "--engine-cpu", "0"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_userdma"))
            .args(["demo", "transfers"])
            .args(args)
            .output()
            .expect("userdma runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}
