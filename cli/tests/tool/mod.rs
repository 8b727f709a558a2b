//! Running the `userdma` binary the tests are built with, and reading its JSON.

#![allow(dead_code)]

use std::process::{Command, Output};

/// `userdma ARGS...`: its exit status, stdout and stderr.
pub(crate) fn userdma(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_userdma"))
        .args(args)
        .output()
        .expect("userdma runs")
}

/// The JSON on a successful run's stdout; fails the test with the run's stderr otherwise.
pub(crate) fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// `userdma ARGS...` run to success, its stdout read as JSON; a failure names the arguments.
pub(crate) fn run_json(args: &[&str]) -> serde_json::Value {
    let out = userdma(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}
