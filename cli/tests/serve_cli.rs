//! `userdma serve`: the device owner as a process. A client connects, runs frames (every
//! result checked) and reads its stats; SIGTERM stops the owner, which prints what it did
//! (`--json`); a PCI device and malformed models are refused with what to do.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use userdma_infer::pipeline::Model;
use userdma_owner::{chan, Client, Options, StreamDecl};

#[test]
fn a_client_runs_frames_through_serve_and_sigterm_stops_it_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("owner.sock");
    let mut owner = Command::new(env!("CARGO_BIN_EXE_userdma"))
        .args(["serve", "--cost", "zero", "--seconds", "120", "--json"])
        .args(["--model", "small=chain:2:16384", "--socket"])
        .arg(&socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(owner.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("listening on"), "{line}");
    let mut client = Client::connect(&socket, &Options::default()).unwrap();
    let stream = client.declare(&StreamDecl::new("s", "small")).unwrap();
    let err = client
        .declare(&StreamDecl::new("t", "yolov5s"))
        .unwrap_err();
    assert!(
        err.to_string().contains("small"),
        "names what it has: {err}"
    );
    let model = Model::chain(2, 16384).unwrap();
    let pool = Arc::clone(client.pool());
    let input = pool.alloc(stream.input_bytes as usize).unwrap();
    let result = pool.alloc(stream.result_bytes as usize).unwrap();
    for n in 0..20u8 {
        let frame = vec![n.wrapping_mul(37); stream.input_bytes as usize];
        input.write(0, &frame).unwrap();
        client
            .submit(&stream, &input, &result, u64::from(n))
            .unwrap();
        let done = client.wait(Some(Duration::from_secs(20))).unwrap();
        assert_eq!((done.status, done.tag), (chan::STATUS_OK, u64::from(n)));
        let mut got = vec![0u8; stream.result_bytes as usize];
        result.read(0, &mut got).unwrap();
        assert_eq!(got, model.expected(&frame), "frame {n}");
    }
    let stats = client.stats().unwrap();
    assert_eq!(stats.streams[0].frames, 20);
    assert_eq!(stats.owner.clients, 1);
    drop((input, result));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(owner.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(owner.wait().unwrap().success());
    let report: serde_json::Value = serde_json::from_str(&rest).unwrap();
    assert_eq!(report["frames"], 20, "{report}");
    // The client heard the owner go.
    let events = client.events().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == userdma_owner::EventKind::Shutdown),
        "{events:?}"
    );
}

#[test]
fn a_pci_device_and_malformed_models_are_refused_with_what_to_do() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_userdma"))
            .arg("serve")
            .args(args)
            .args(["--socket", "/nonexistent/owner.sock"])
            .output()
            .unwrap()
    };
    let out = run(&["--bdf", "0000:00:03.0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Owner::bind"), "{err}");
    for bad in [
        &["--model", "x"][..],
        &["--model", "x=chain:2"],
        &["--model", "x=resnet"],
        &["--mode", "999"],
        &["--model", "x=chain:2:16384", "--model", "x=chain:3:16384"],
        &["--bdf", "zz"],
        &["--bdf", "0000:00:03.0"],
    ] {
        let out = run(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
    // A run length no clock can add, or none at all: refused before anything starts.
    for bad in ["1e300", "inf", "nan", "-1", "0", "ten"] {
        let out = run(&[&format!("--seconds={bad}")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--seconds {bad}: {err}");
        assert!(
            err.contains("from 0.1 to 31536000"),
            "--seconds {bad}: {err}"
        );
    }
}

#[test]
fn the_kernels_no_id_and_modes_the_owner_cannot_use_are_refused() {
    // A socket of its own and a short run: an argument let through serves 0.1 s and succeeds,
    // which fails the test, instead of serving until SIGTERM.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("owner.sock");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_userdma"))
            .args(["serve", "--cost", "zero", "--seconds", "0.1"])
            .args(["--model", "small=chain:2:16384"])
            .args(args)
            .arg("--socket")
            .arg(&socket)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // (uid_t)-1 and (gid_t)-1 mean "no id": no peer has them.
    for flag in ["--allow-uid", "--allow-gid"] {
        let (code, err) = run(&[flag, "4294967295"]);
        assert_eq!(code, Some(2), "{flag}: {err}");
        assert!(err.contains("no peer ever has it"), "{flag}: {err}");
        assert!(err.contains("give the numeric id"), "{flag}: {err}");
    }
    // No read and write for the socket's owner: only root could connect.
    for mode in ["0", "0o077", "077", "444"] {
        let (code, err) = run(&["--mode", mode]);
        assert_eq!(code, Some(2), "--mode {mode}: {err}");
        assert!(err.contains("only root"), "--mode {mode}: {err}");
        assert!(err.contains("600"), "--mode {mode}: {err}");
    }
    for mode in ["1777", "4660", "0o1000"] {
        let (code, err) = run(&["--mode", mode]);
        assert_eq!(code, Some(2), "--mode {mode}: {err}");
        assert!(err.contains("000 to 777"), "--mode {mode}: {err}");
    }
    // A mode with read and write for the owner, in either spelling, serves.
    for mode in ["0o600", "660"] {
        let (code, err) = run(&["--mode", mode, "--allow-uid", "0"]);
        assert_eq!(code, Some(0), "--mode {mode}: {err}");
    }
}
