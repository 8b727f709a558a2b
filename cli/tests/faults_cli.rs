//! `userdma faults`: a small fault soak on the loopback device, its JSON accounting (every
//! injected fault detected, nothing corrupted or leaked), the same run for the same seed, and
//! bad arguments as usage errors.

mod tool;

use tool::json;

fn faults(args: &[&str]) -> std::process::Output {
    tool::userdma(&[&["faults"], args].concat())
}

#[test]
fn a_small_soak_accounts_for_every_fault() {
    let r = json(&faults(&[
        "--transfers",
        "20000",
        "--rate",
        "2e-3",
        "--seed",
        "7",
        "--json",
    ]));
    assert_eq!(r["clean"], true, "{r}");
    assert_eq!(r["transfers"], 20000, "{r}");
    assert_eq!(r["corrupted_bytes"], 0, "{r}");
    assert_eq!(r["leaked_buffers"], 0, "{r}");
    assert_eq!(r["unreconciled"].as_array().map(Vec::len), Some(0), "{r}");
    let kinds = r["kinds"].as_array().expect("kinds");
    assert_eq!(kinds.len(), 7, "{r}");
    let mut injected = 0;
    for row in kinds {
        let n = |f: &str| row[f].as_u64().expect(f);
        assert_eq!(n("injected"), n("detected") + n("masked"), "{row}");
        injected += n("injected");
    }
    // 40000 descriptors at 2e-3: about 80 faults.
    assert!(injected > 20, "{r}");
    assert!(r["recoveries"].as_u64().unwrap() > 0, "{r}");
    assert!(
        r["verified"].as_u64().unwrap() + r["failed"].as_u64().unwrap() == 20000,
        "{r}"
    );
    assert_eq!(r["plan"]["seed"], 7);
}

#[test]
fn a_fault_on_almost_every_descriptor_is_accounted_for() {
    // Runs of dropped completions, which the host sees as a completion naming a later command
    // in flight, were once counted as wrong ids no device had injected.
    for (rate, seed) in [
        ("1", "1"),
        ("1", "2"),
        ("1", "3"),
        ("0.9", "1"),
        ("0.9", "4"),
    ] {
        // A run that was not clean exits 1: `run_json` names the arguments and prints why.
        let r = tool::run_json(&[
            "faults",
            "--transfers",
            "1000",
            "--rate",
            rate,
            "--seed",
            seed,
            "--json",
        ]);
        assert_eq!(r["clean"], true, "rate {rate}, seed {seed}: {r}");
        assert_eq!(
            r["unreconciled"].as_array().map(Vec::len),
            Some(0),
            "rate {rate}, seed {seed}: {r}"
        );
    }
}

#[test]
fn the_kinds_asked_for_are_the_only_ones_injected() {
    let r = json(&faults(&[
        "--transfers",
        "10000",
        "--rate",
        "5e-3",
        "--kinds",
        "error,corrupt",
        "--json",
    ]));
    assert_eq!(r["clean"], true, "{r}");
    for row in r["kinds"].as_array().unwrap() {
        let kind = row["kind"].as_str().unwrap();
        let injected = row["injected"].as_u64().unwrap();
        match kind {
            "error" | "corrupt" => assert!(injected > 0, "{row}"),
            _ => assert_eq!(injected, 0, "{row}"),
        }
    }
    // Neither needs a recovery: the queue goes on (a timeout on a loaded machine aside).
    assert_eq!(r["recoveries"], r["timeouts_without_injection"], "{r}");
}

#[test]
fn the_text_output_is_a_table() {
    let out = faults(&["--transfers", "2000", "--rate", "1e-2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for word in [
        "kind",
        "injected",
        "detected",
        "recovered",
        "wrong-id",
        "corrupted bytes: 0",
        "leaked buffers: 0",
        "clean",
    ] {
        assert!(text.contains(word), "{word} missing from:\n{text}");
    }
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        &["--kinds", "stall,nope"][..],
        &["--rate", "1.5"],
        &["--rate", "x"],
        &["--transfers", "0"],
        &["--transfers", "-3"],
    ] {
        let out = faults(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("userdma: error: "), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
