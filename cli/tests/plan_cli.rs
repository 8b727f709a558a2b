//! The `userdma plan` command: its JSON output's keys, its summary of every strategy, bad
//! input exiting 2 with the record named, and input past the read limit refused.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A file of the library's test data (plan/tests/data/).
fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plan/tests/data")
        .join(name)
}

mod tool;

use tool::userdma;

#[test]
fn cli_plan_json_output_has_exactly_the_documented_keys() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.json");
    std::fs::write(
        &file,
        r#"{"model": "m", "tensors": [
            {"id": 0, "bytes": 1000, "first": 0, "last": 1, "op": "Conv", "inputs": [], "kind": "input"},
            {"id": 1, "bytes": 1000, "first": 1, "last": 2, "op": "Conv", "inputs": [0], "kind": "intermediate"},
            {"id": 2, "bytes": 1000, "first": 2, "last": 3, "op": "Relu", "inputs": [1], "kind": "output"}
        ]}"#,
    )
    .unwrap();
    let svg = dir.path().join("arena.svg");
    let out = userdma(&[
        "plan",
        file.to_str().unwrap(),
        "--inplace",
        "--budget",
        "1000n",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut keys: Vec<&str> = doc
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "arena_bytes",
            "lower_bound_bytes",
            "naive_bytes",
            "optimal",
            "seconds",
            "strategy",
            "tensors"
        ]
    );
    assert_eq!(doc["arena_bytes"], 2048);
    assert_eq!(doc["naive_bytes"], 3072);
    let t = doc["tensors"].as_array().unwrap();
    assert_eq!(t.len(), 3);
    assert_eq!(t[2]["inplace_of"], 1);
    assert!(t[0]["inplace_of"].is_null());
    let mut tkeys: Vec<&str> = t[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    tkeys.sort_unstable();
    assert_eq!(tkeys, ["bytes", "id", "inplace_of", "offset"]);
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.matches("<rect").count() >= 3 + 2);
    assert!(picture.contains("peak: step"));
}

#[test]
fn cli_plan_summary_shows_every_strategy() {
    let file = data("minimalloc/K.csv");
    let out = userdma(&["plan", file.to_str().unwrap(), "--budget", "20000n"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for word in [
        "naive",
        "lower bound",
        "arena",
        "x lower bound",
        "saved against naive",
        "colour",
        "greedy-size",
        "first-fit",
        "best-fit",
        "exact",
        "auto:",
        "total time",
    ] {
        assert!(text.contains(word), "{word}: {text}");
    }
}

#[test]
fn cli_plan_bad_input_exits_2_naming_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "zero.csv",
            "id,lower,upper,size\n0,0,2,100\n7,1,3,0\n",
            "tensor 7",
        ),
        (
            "short.csv",
            "id,lower,upper,size\n0,0,2,100\n1,1,3\n",
            "line 3",
        ),
        (
            "dup.json",
            r#"{"tensors": [{"id": 1, "bytes": 1, "first": 0, "last": 0}, {"id": 1, "bytes": 1, "first": 0, "last": 0}]}"#,
            "tensor 1",
        ),
        ("cut.json", "{\"tensors\": [{\"id\": 1, \"bytes\"", "line 1"),
        (
            "input.json",
            r#"{"tensors": [{"id": 2, "bytes": 1, "first": 0, "last": 0, "inputs": [5]}]}"#,
            "input 5",
        ),
        (
            "order.json",
            r#"{"tensors": [{"id": 3, "bytes": 1, "first": 2, "last": 1}]}"#,
            "tensor 3",
        ),
        ("model.txt", "", "--format"),
    ];
    for (name, text, needle) in cases {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let out = userdma(&["plan", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let out = userdma(&["plan", "/nonexistent/x.csv"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn cli_plan_refuses_sizes_that_overflow_and_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("offbig.json");
    std::fs::write(
        &file,
        r#"{"tensors":[{"id":0,"bytes":100,"first":0,"last":1,"offset":9223372036854775808},{"id":1,"bytes":9223372036854775807,"first":0,"last":1}]}"#,
    )
    .unwrap();
    for strategy in ["auto", "greedy-size"] {
        let out = userdma(&["plan", file.to_str().unwrap(), "--strategy", strategy]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{strategy}: {err}");
        assert!(
            err.contains("tensor 0") && err.contains("overflow"),
            "{err}"
        );
        assert!(!err.contains("planner bug"), "{err}");
    }
}

#[test]
fn cli_plan_prints_no_meaningless_saving() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("empty.csv", "", "no tensors to place"),
        ("header.csv", "id,lower,upper,size\n", "no tensors to place"),
        ("empty.json", r#"{"tensors":[]}"#, "no tensors to place"),
        (
            "near.json",
            r#"{"tensors":[{"id":0,"bytes":100,"first":0,"last":1,"offset":18446744073709551104}]}"#,
            "larger than naive",
        ),
    ];
    for (name, text, needle) in cases {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let out = userdma(&["plan", file.to_str().unwrap()]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {stdout}");
        assert!(stdout.contains(needle), "{name}: {stdout}");
        assert!(!stdout.contains("% saved"), "{name}: {stdout}");
    }
}

#[test]
fn cli_plan_keeps_other_strategies_to_the_budget() {
    // 3,000 tensors all live together: the heuristics but best fit cost n² / 2 steps each.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("same.csv");
    let text: String = (0..3_000)
        .map(|i| format!("{i},0,1,{}\n", 1_000 + i * 7))
        .collect();
    std::fs::write(&file, text).unwrap();
    let path = file.to_str().unwrap();
    let out = userdma(&["plan", path, "--strategy", "greedy-size", "--budget", "0ms"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(!row("greedy-size").contains("skipped"), "{stdout}");
    for name in ["colour", "first-fit", "best-fit", "exact", "auto"] {
        assert!(row(name).contains("skipped"), "{name}: {stdout}");
    }
    // A node budget has no clock: every strategy runs.
    let out = userdma(&["plan", path, "--strategy", "greedy-size", "--budget", "1n"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !stdout.contains("skipped"),
        "{stdout}"
    );
}

/// `userdma ARGS...` with its address space capped at 3 GiB (`ulimit -v`; not under a
/// sanitizer), so a read without a bound fails the test (an allocation failure) instead of
/// taking the machine's memory; with `feed`, stdin is a pipe that `feed` keeps writing until
/// the tool closes it.
fn userdma_capped(args: &[&str], feed: Option<&'static [u8]>) -> (Output, Duration) {
    // A sanitizer's runtime reserves terabytes of address space for its shadow memory at
    // start, which any cap on it refuses: under one (scripts/sanitize.sh) the tool runs
    // uncapped, and a tool that read without limit would fail the run by time or memory.
    let cap = if cfg!(any(
        userdma_sanitize = "address",
        userdma_sanitize = "thread"
    )) {
        "exec \"$0\" \"$@\""
    } else {
        "ulimit -v 3145728 && exec \"$0\" \"$@\""
    };
    let start = Instant::now();
    let mut child = Command::new("sh")
        .args(["-c", cap])
        .arg(env!("CARGO_BIN_EXE_userdma"))
        .args(args)
        .stdin(if feed.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let writer = feed.map(|chunk| {
        let mut stdin = child.stdin.take().unwrap();
        // Until the tool stops reading: the write fails (EPIPE) when it exits.
        std::thread::spawn(move || while stdin.write_all(chunk).is_ok() {})
    });
    let out = child.wait_with_output().unwrap();
    if let Some(w) = writer {
        w.join().unwrap();
    }
    (out, start.elapsed())
}

/// `/dev/zero`, a pipe that never ends or a file past the limit: refused with exit 2, naming
/// the file, the limit and what to give instead, without reading it all.
#[test]
fn cli_plan_refuses_input_past_the_read_limit() {
    let check = |what: &str, (out, took): (Output, Duration), needles: &[&str]| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        for needle in needles {
            assert!(err.contains(needle), "{what}: no {needle:?} in {err}");
        }
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert!(took < Duration::from_secs(60), "{what}: {took:?}");
    };
    let records = [
        "268435456 bytes (256 MiB)",
        "tensor records",
        "not a device",
    ];
    for format in ["json", "csv"] {
        check(
            &format!("/dev/zero as {format}"),
            userdma_capped(&["plan", "/dev/zero", "--format", format], None),
            &[&["/dev/zero"][..], &records].concat(),
        );
    }
    // Through stdin: a pipe that never ends.
    check(
        "an endless pipe",
        userdma_capped(
            &["plan", "/dev/stdin", "--format", "csv"],
            Some(&[b'0'; 1 << 16]),
        ),
        &[&["/dev/stdin"][..], &records].concat(),
    );
    // /dev/zero as a model: no protobuf message starts with a zero byte, so it is refused
    // after one byte (not read to the 2 GiB limit), as is an endless pipe of zeros.
    let (out, took) = userdma_capped(&["plan", "/dev/zero", "--format", "onnx"], None);
    check(
        "/dev/zero as onnx",
        (out, took),
        &[
            "/dev/zero is not an ONNX model",
            "0x00",
            "--format json|csv",
        ],
    );
    check(
        "a pipe of zeros as onnx",
        userdma_capped(
            &["plan", "/dev/stdin", "--format", "onnx"],
            Some(&[0u8; 1 << 16]),
        ),
        &["/dev/stdin is not an ONNX model"],
    );
    // A (sparse) file past the ONNX limit: refused from its size, before any of it is read.
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.onnx");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((2 << 30) + 1)
        .unwrap();
    check(
        "a model past 2 GiB",
        userdma_capped(&["plan", big.to_str().unwrap()], None),
        &["big.onnx", "2147483648 bytes", "external data"],
    );
    // A record file under the limit still plans.
    let small = dir.path().join("small.csv");
    std::fs::write(&small, "0,0,1,100\n1,1,2,100\n").unwrap();
    let (out, _) = userdma_capped(&["plan", small.to_str().unwrap(), "--json"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
