//! `--trace FILE`: the traces the demo, `pipeline`, `stage` and `faults` write, read back as
//! Perfetto would: every frame's steps in order on the device's units and inside the frame's
//! time, no two slices overlapping on one unit's track, the switches in the trace equal to
//! the device's own count in the run's report, nothing dropped.

use std::collections::HashMap;

use serde_json::Value;

mod tool;

/// A slice on a track: where, when (µs), what.
#[derive(Debug, Clone)]
struct Slice {
    pid: u64,
    tid: u64,
    ts: f64,
    dur: f64,
    name: String,
    args: Value,
}

fn read(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).expect("the trace is JSON")
}

fn events(trace: &Value) -> &Vec<Value> {
    trace["traceEvents"].as_array().expect("traceEvents")
}

fn slices(trace: &Value) -> Vec<Slice> {
    events(trace)
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| Slice {
            pid: e["pid"].as_u64().unwrap(),
            tid: e["tid"].as_u64().unwrap(),
            ts: e["ts"].as_f64().unwrap(),
            dur: e["dur"].as_f64().unwrap(),
            name: e["name"].as_str().unwrap().to_owned(),
            args: e["args"].clone(),
        })
        .collect()
}

/// The names of threads, by (pid, tid).
fn thread_names(trace: &Value) -> HashMap<(u64, u64), String> {
    events(trace)
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            (
                (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()),
                e["args"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Slices on the tracks named `unit` ("copy unit", "compute unit"), per track, by time.
fn unit_tracks(trace: &Value, unit: &str) -> Vec<Vec<Slice>> {
    let names = thread_names(trace);
    let mut tracks: HashMap<(u64, u64), Vec<Slice>> = HashMap::new();
    for s in slices(trace) {
        if names.get(&(s.pid, s.tid)).is_some_and(|n| n == unit) {
            tracks.entry((s.pid, s.tid)).or_default().push(s);
        }
    }
    let mut tracks: Vec<Vec<Slice>> = tracks.into_values().collect();
    for t in &mut tracks {
        t.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    }
    tracks
}

/// Float microseconds from nanoseconds keep 1 ns; allow for the printing's rounding.
const EPS_US: f64 = 0.002;

fn no_overlap(track: &[Slice]) {
    for pair in track.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            a.ts + a.dur <= b.ts + EPS_US,
            "{} [{}, {}] overlaps {} from {}",
            a.name,
            a.ts,
            a.ts + a.dur,
            b.name,
            b.ts
        );
    }
}

/// The order of a frame's op from its step name.
fn step_rank(step: &str) -> u64 {
    match step {
        "to_device" => 0,
        "to_host" => u64::MAX,
        s => s
            .strip_prefix("step ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a step named {s:?}")),
    }
}

/// Checks each frame of the trace: its ops on the units run in the model's order, each
/// inside the frame's time (submitted to result), and returns the frames seen.
fn frames_in_order(trace: &Value) -> u64 {
    // The frames, from their async slices on the streams' tracks.
    let mut frames: HashMap<(String, u64), (f64, f64)> = HashMap::new();
    for e in events(trace) {
        if e["ph"] == "b" && e["cat"] == "frame" && e["args"].is_object() {
            let a = &e["args"];
            frames.insert(
                (
                    a["stream"].as_str().unwrap().to_owned(),
                    a["frame"].as_u64().unwrap(),
                ),
                (
                    a["submitted_us"].as_f64().unwrap(),
                    a["done_us"].as_f64().unwrap(),
                ),
            );
        }
    }
    // Their ops, as the device timed them.
    let mut ops: HashMap<(String, u64), Vec<Slice>> = HashMap::new();
    for unit in ["copy unit", "compute unit"] {
        for track in unit_tracks(trace, unit) {
            for s in track {
                if let Some(stream) = s.args["stream"].as_str() {
                    let frame = s.args["frame"].as_u64().unwrap();
                    ops.entry((stream.to_owned(), frame)).or_default().push(s);
                }
            }
        }
    }
    assert!(!frames.is_empty(), "no frames in the trace");
    // The device's clock is put on the host's by anchors read a moment apart.
    let slack = 50.0;
    let mut checked = 0;
    for (key, (submitted, done)) in &frames {
        let Some(mut steps) = ops.remove(key) else {
            panic!("frame {key:?} has no op on a unit");
        };
        // Waits order the units; they are not steps of the model.
        steps.retain(|s| s.args["step"] != "wait");
        steps.sort_by_key(|s| step_rank(s.args["step"].as_str().unwrap()));
        assert_eq!(steps[0].args["step"], "to_device", "{key:?}: {steps:?}");
        for pair in steps.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            assert!(
                a.ts + a.dur <= b.ts + EPS_US,
                "{key:?}: {} ends at {} after {} starts at {}",
                a.name,
                a.ts + a.dur,
                b.name,
                b.ts
            );
        }
        for s in &steps {
            assert!(
                s.ts + slack >= *submitted && s.ts + s.dur <= done + slack,
                "{key:?}: {} [{}, {}] outside the frame's [{submitted}, {done}]; {}; {steps:?}",
                s.name,
                s.ts,
                s.ts + s.dur,
                trace["otherData"]
            );
        }
        checked += 1;
    }
    checked
}

fn switch_instants(trace: &Value, unit: &str) -> u64 {
    let names = thread_names(trace);
    events(trace)
        .iter()
        .filter(|e| {
            e["ph"] == "i"
                && e["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("switch to context"))
                && names
                    .get(&(e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
                    .is_some_and(|n| n == unit)
        })
        .count() as u64
}

#[test]
fn the_demo_trace_reads_back_frame_by_frame() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.json");
    let report = tool::run_json(&[
        "demo",
        "--seconds",
        "1",
        "--no-owner",
        "--json",
        "--trace",
        path.to_str().unwrap(),
    ]);
    let after = &report["after"];
    let summary = &after["trace"];
    let trace = read(&path);
    assert_eq!(
        trace["otherData"], *summary,
        "the file's summary is the report's"
    );
    assert_eq!(summary["dropped"], 0, "{summary}");
    assert_eq!(summary["activity_lost"], 0, "{summary}");
    assert_eq!(summary["activity_bad"], 0, "{summary}");
    // Every op the host saw was timed by the device.
    assert!(summary["ops"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(summary["ops_matched"], summary["ops"], "{summary}");
    for unit in ["copy unit", "compute unit"] {
        let tracks = unit_tracks(&trace, unit);
        assert_eq!(tracks.len(), 1, "{unit}: one device");
        no_overlap(&tracks[0]);
    }
    // Every frame the run reports is in the trace, its steps in order.
    let frames: u64 = after["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["frames"].as_u64().unwrap())
        .sum();
    assert_eq!(frames_in_order(&trace), frames);
    assert_eq!(summary["frames"], frames);
    // The switches in the trace are the device's own count.
    assert_eq!(
        switch_instants(&trace, "compute unit"),
        after["device_switches"].as_u64().unwrap(),
        "compute unit switches"
    );
    // The scheduler's decisions, one per frame dispatched; its switches as the report says.
    let decisions: Vec<&Value> = events(&trace)
        .iter()
        .filter(|e| e["ph"] == "i" && e["name"].as_str().unwrap().starts_with("decide "))
        .collect();
    assert!(decisions.len() as u64 >= frames);
    let switching = decisions
        .iter()
        .filter(|e| e["args"]["switch"] == true)
        .count() as u64;
    assert_eq!(switching, after["scheduler_switches"].as_u64().unwrap());
    // Counters: frames in flight, queue depths, the SRAM hit rate, the pool.
    let counters: Vec<&str> = events(&trace)
        .iter()
        .filter(|e| e["ph"] == "C")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for name in ["frames in flight", "queue 0 depth", "pool 0 buffers out"] {
        assert!(counters.contains(&name), "no counter {name:?}");
    }
    assert!(
        counters
            .iter()
            .any(|n| n.starts_with("SRAM hit % (context ")),
        "no SRAM hit rate: {counters:?}"
    );
}

#[test]
fn the_pipeline_trace_has_every_frame_on_both_units() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pipeline.json");
    let report = tool::run_json(&[
        "pipeline",
        "--frames",
        "200",
        "--layers",
        "3",
        "--size",
        "65536",
        "--json",
        "--trace",
        path.to_str().unwrap(),
    ]);
    let trace = read(&path);
    assert_eq!(report["trace"]["dropped"], 0);
    assert_eq!(frames_in_order(&trace), 200);
    for unit in ["copy unit", "compute unit"] {
        let tracks = unit_tracks(&trace, unit);
        assert_eq!(tracks.len(), 1, "{unit}");
        // 200 frames: an input and a result on the copy unit, three layers on the other.
        let per_frame = if unit == "copy unit" { 2 } else { 3 };
        let ops = tracks[0]
            .iter()
            .filter(|s| s.args["step"].is_string() && s.args["step"] != "wait")
            .count();
        assert_eq!(ops, 200 * per_frame, "{unit}");
        no_overlap(&tracks[0]);
    }
}

#[test]
fn a_trace_that_cannot_be_written_is_an_error_naming_the_file() {
    let out = tool::userdma(&[
        "pipeline",
        "--frames",
        "4",
        "--trace",
        "/nonexistent-directory/t.json",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent-directory/t.json"), "{err}");
    assert!(err.contains("writable"), "{err}");
}

#[test]
fn the_fault_soak_trace_has_every_burst_recovery_and_detection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("faults.json");
    let report = tool::run_json(&[
        "faults",
        "--transfers",
        "3000",
        "--rate",
        "0.01",
        "--seed",
        "5",
        "--json",
        "--trace",
        path.to_str().unwrap(),
    ]);
    let trace = read(&path);
    let names = thread_names(&trace);
    let on = |track: &str| -> Vec<Slice> {
        slices(&trace)
            .into_iter()
            .filter(|s| names.get(&(s.pid, s.tid)).is_some_and(|n| n == track))
            .collect()
    };
    let bursts = on("bursts");
    let burst_size = report["plan"]["burst"].as_u64().unwrap();
    assert_eq!(bursts.len() as u64, 3000u64.div_ceil(burst_size));
    let mut sorted = bursts.clone();
    sorted.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    no_overlap(&sorted);
    assert_eq!(
        on("recoveries").len() as u64,
        report["recoveries"].as_u64().unwrap()
    );
    assert!(report["recoveries"].as_u64().unwrap() > 0, "{report}");
    for row in report["kinds"].as_array().unwrap() {
        let kind = row["kind"].as_str().unwrap();
        let name = userdma_loopback::fault::Kind::ALL
            .iter()
            .find(|k| format!("{k:?}") == kind || k.name() == kind)
            .map_or(kind.to_owned(), |k| k.name().to_owned());
        assert_eq!(
            on(&format!("detected: {name}")).len() as u64,
            row["detected"].as_u64().unwrap(),
            "{row}"
        );
    }
}

#[test]
fn the_stage_trace_has_every_read_on_a_slot_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    std::fs::write(&file, vec![7u8; 4 << 20]).unwrap();
    let path = dir.path().join("stage.json");
    let report = tool::run_json(&[
        "stage",
        file.to_str().unwrap(),
        "--size",
        "65536",
        "--depth",
        "4",
        "--json",
        "--trace",
        path.to_str().unwrap(),
    ]);
    let trace = read(&path);
    let names = thread_names(&trace);
    let mut tracks: HashMap<String, Vec<Slice>> = HashMap::new();
    for s in slices(&trace) {
        if let Some(n) = names.get(&(s.pid, s.tid)) {
            tracks.entry(n.clone()).or_default().push(s);
        }
    }
    let reads: usize = tracks
        .iter()
        .filter(|(n, _)| n.starts_with("read slot "))
        .map(|(_, t)| t.len())
        .sum();
    assert_eq!(reads as u64, report["requests"].as_u64().unwrap());
    assert!(
        tracks
            .keys()
            .filter(|n| n.starts_with("read slot "))
            .count()
            <= 4
    );
    for (name, track) in &mut tracks {
        track.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        if name.starts_with("read slot ") {
            no_overlap(track);
        }
    }
}
