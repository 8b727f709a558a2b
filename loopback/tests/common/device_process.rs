//! The loopback device's process for tests that run it out of process: the test binary itself.
//!
//! [`program`] re-executes the running test binary with libtest arguments that run exactly one
//! test, [`loopback_device_process`]; in that child the control socket's number is in
//! [`SOCKET_ENV`], and the test serves the device
//! ([`serve_process`](userdma_loopback::serve_process)) until the host closes the
//! socket. In an ordinary test run the variable is not set and the test returns at once.
//!
//! Include it at the crate root of a test as `device_process`:
//!
//! ```text
//! #[path = "common/device_process.rs"]
//! mod device_process;
//! ```

use userdma_loopback::{serve_process, Program, SOCKET_ENV};

/// Where this module is, without the crate's name: the test's name is this, then
/// `::loopback_device_process`.
fn test_name() -> String {
    let path = module_path!();
    let module = path.split_once("::").map_or(path, |(_, rest)| rest);
    format!("{module}::loopback_device_process")
}

/// The device process's program: this test binary running only [`loopback_device_process`].
pub(crate) fn program() -> Program {
    let exe = std::env::current_exe().expect("the test binary's path");
    Program::new(exe).args([
        test_name().as_str(),
        "--exact",
        "--nocapture",
        "--test-threads=1",
        "-q",
    ])
}

/// The device process: serves the device when this process was started as one (see
/// [`program`]); otherwise there is nothing to do.
#[test]
fn loopback_device_process() {
    if std::env::var_os(SOCKET_ENV).is_none() {
        return;
    }
    // An error (the host gone mid-request, a malformed message) ends the process with a
    // failure the host sees as the device process's exit status.
    if let Err(err) = serve_process() {
        eprintln!("loopback device process: {err}");
        std::process::exit(1);
    }
}
