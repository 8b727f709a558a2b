//! `userdma demo`, the two-stream case study: both runs check every frame, "after" maps
//! nothing per frame where "before" maps two buffers per frame, and each run's switch count
//! from the scheduler equals the device's.

use std::process::Command;

#[test]
fn the_case_study_runs_both_ways_and_reports_what_it_measured() {
    let out = Command::new(env!("CARGO_BIN_EXE_userdma"))
        .args(["demo", "--seconds", "1", "--json"])
        .output()
        .expect("userdma runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for run in ["before", "after"] {
        let r = &report[run];
        assert_eq!(r["wrong"], 0, "{run}: {r}");
        let frames: u64 = r["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["frames"].as_u64().unwrap())
            .sum();
        assert!(frames >= 1, "{run}: {r}");
        assert_eq!(
            r["scheduler_switches"], r["device_switches"],
            "{run}: the scheduler's switches against the device's"
        );
    }
    assert!(report["before"]["dma_maps_per_sec"].as_f64().unwrap() > 0.0);
    assert_eq!(report["after"]["dma_maps_per_sec"].as_f64().unwrap(), 0.0);
    assert_eq!(report["published"]["fps_after"].as_f64().unwrap(), 27.0);
}

#[test]
fn bad_case_settings_are_usage_errors() {
    for args in [["--k", "0"], ["--live-fps", "0"], ["--playback", "10"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_userdma"))
            .arg("demo")
            .args(args)
            .output()
            .expect("userdma runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}
