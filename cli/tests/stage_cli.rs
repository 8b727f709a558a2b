//! `userdma stage`: a file read into pool buffers through io_uring, with the path used, the
//! bytes and the figures in its JSON; O_DIRECT where the file system has it (the build
//! directory's disk), the buffered fallback said on tmpfs; bad arguments are usage errors.

use std::path::Path;

mod tool;

use tool::json;

fn stage(args: &[&str]) -> std::process::Output {
    tool::userdma(&[&["stage"], args].concat())
}

/// A file of `len` bytes (not a multiple of any block size) in `dir`.
fn file(dir: &Path, len: usize) -> String {
    let path = dir.join("frames.bin");
    let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn a_file_on_the_build_disk_is_read_direct_and_counted_whole() {
    // The build directory is on a real disk (tmpfs falls back, tested below).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = file(dir.path(), 3_000_000);
    let r = json(&stage(&[&path, "--direct", "--size", "1048576", "--json"]));
    assert_eq!(r["bytes"], 3_000_000, "{r}");
    assert_eq!(r["requests"], 3, "{r}");
    // As tests/stage.rs requires too: the build directory's disk takes O_DIRECT.
    assert_eq!(r["path"], "direct", "{r}");
    assert!(r["fallback"].is_null(), "{r}");
    assert!(r["gb_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["cpu_seconds_per_gb"].as_f64().unwrap() >= 0.0);
}

#[test]
fn tmpfs_falls_back_to_buffered_reads_and_says_why() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = file(dir.path(), 100_000);
    let r = json(&stage(&[&path, "--direct", "--depth", "4", "--json"]));
    assert_eq!(r["path"], "buffered", "{r}");
    assert!(r["fallback"].as_str().unwrap().contains("tmpfs"), "{r}");
    assert_eq!(r["bytes"], 100_000);
}

#[test]
fn bad_arguments_are_usage_errors_and_a_missing_file_names_itself() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = file(dir.path(), 4096);
    for args in [
        vec![path.as_str(), "--depth", "0"],
        vec![path.as_str(), "--size", "0"],
    ] {
        let out = stage(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("userdma: error:"));
    }
    let missing = dir.path().join("no-such-file");
    let out = stage(&[missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
