//! The `userdma pipeline` command: every frame checked on both paths (the pipeline and the
//! naive one) in its JSON report, and bad settings exiting 2.

#[test]
fn cli_pipeline_checks_every_frame_and_reports_both_paths() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_userdma"))
        .args([
            "pipeline", "--frames", "10", "--depth", "3", "--size", "1024", "--cost", "zero",
            "--naive", "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let paths = doc["paths"].as_array().unwrap();
    assert_eq!(paths.len(), 2);
    assert_eq!(paths[0]["path"], "pipeline");
    assert_eq!(paths[0]["wrong"], 0);
    assert_eq!(paths[0]["frames"], 10);
    assert_eq!(paths[0]["allocations_per_frame"], 0.0);
    assert_eq!(paths[0]["dma_maps_per_frame"], 0.0);
    assert_eq!(paths[1]["path"], "naive");
    // Two per frame, and the naive run's own queue rings once.
    let maps = paths[1]["dma_maps_per_frame"].as_f64().unwrap();
    assert!((2.0..=2.1).contains(&maps), "{maps}");
    assert!(paths[1]["allocations_per_frame"].as_f64().unwrap() >= 2.0);
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_userdma"))
        .args(["pipeline", "--depth", "0"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
