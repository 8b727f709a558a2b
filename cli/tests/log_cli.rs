//! `--log FILTER`: the libraries' spans and events on stderr (docs/tracing-events.md), nothing
//! without it, and none per frame (the pipeline still allocates nothing per frame with a
//! subscriber printing at debug level).

use std::process::{Command, Output};

fn pipeline(log: Option<&str>) -> Output {
    pipeline_frames(log, 20)
}

fn pipeline_frames(log: Option<&str>, frames: u32) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_userdma"));
    if let Some(filter) = log {
        command.args(["--log", filter]);
    }
    command
        .args(["pipeline", "--frames", &frames.to_string()])
        .args(["--depth", "2", "--size", "1024", "--cost", "zero", "--json"])
        .output()
        .unwrap()
}

#[cfg(feature = "tracing")]
#[test]
fn cli_log_prints_the_spans_and_events_and_none_per_frame() {
    let out = pipeline(Some("debug"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for line in [
        "device started",
        "runtime ready",
        "pipeline ready",
        "ring created",
    ] {
        assert!(stderr.contains(line), "no {line:?} in:\n{stderr}");
    }
    assert!(stderr.contains("loopback.new{device=loopback0"), "{stderr}");
    assert!(stderr.contains("accel.open_queue{"), "{stderr}");
    // The report on stdout is unchanged, and the frames allocated nothing.
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let path = &doc["paths"][0];
    assert_eq!(path["path"], "pipeline");
    assert_eq!(path["wrong"], 0);
    assert_eq!(path["allocations_per_frame"], 0.0);
    // Nothing per frame: ten times the frames, the same lines (building the pipeline).
    let more = pipeline_frames(Some("debug"), 200);
    assert!(more.status.success());
    let more = String::from_utf8_lossy(&more.stderr);
    assert_eq!(
        stderr.lines().count(),
        more.lines().count(),
        "{stderr}\n{more}"
    );

    // A level for one target only.
    let out = pipeline(Some("warn,userdma_infer=info"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("pipeline ready"), "{stderr}");
    assert!(!stderr.contains("runtime ready"), "{stderr}");
}

#[test]
fn cli_without_log_prints_nothing_and_a_bad_filter_is_a_usage_error() {
    let out = pipeline(None);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("pipeline ready"), "{stderr}");
    let bad = Command::new(env!("CARGO_BIN_EXE_userdma"))
        .args(["--log", "userdma=loud", "list"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("--log"), "{stderr}");
}

/// Without the feature the option is refused, saying why.
#[cfg(not(feature = "tracing"))]
#[test]
fn cli_log_without_the_feature_says_so() {
    let out = pipeline(Some("info"));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("without the `tracing` feature"), "{stderr}");
}
