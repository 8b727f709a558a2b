//! The C API on a real device: `examples/c/edu_dma.c`, linked statically against
//! `libuserdma.a` and put in the initramfs as `/edu_dma` by `tests/guest/run.sh`, drives edu
//! through VFIO from C (its registers through the BAR calls, its DMA engine with pool buffers
//! and a mapping, each transfer ended by the MSI or by polling) and checks every byte itself.
//! The case runs it as a user would, as a separate program, and checks its exit status and
//! its result line; then runs it on a function that does not exist, which must fail with
//! exit status 1 and the library's message.

use std::path::Path;
use std::time::Duration;

use userdma::pci::Driver;

use crate::edu;
use crate::env::Env;
use crate::failure::{ensure, Failure};
use crate::program::{self, Run};

/// Where `tests/guest/run.sh` puts the statically linked C example in the initramfs.
pub(crate) const PROGRAM: &str = "/edu_dma";

/// The longest one run may take (three transfers of about 100 ms each, software emulation).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Bytes the example moves each way (`LEN` in `edu_dma.c`).
const LEN: usize = 4000;

/// Runs the program with `args`, waiting up to [`RUN_TIMEOUT`]; its output goes to the log as
/// INFO lines.
fn run(label: &str, args: &[String]) -> Result<Run, Failure> {
    program::run(PROGRAM, "c-edu-vfio", label, args, RUN_TIMEOUT)
}

/// The C example through VFIO: a round trip with interrupts and a polled transfer, every
/// byte checked by the program; then a failure it must report.
pub(crate) fn edu_vfio(env: &Env) -> Result<(), Failure> {
    ensure!(
        Path::new(PROGRAM).is_file(),
        "{PROGRAM} (examples/c/edu_dma.c) is not in the initramfs: tests/guest/run.sh puts it there"
    );
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let bdf = env.edu.to_string();
    let mut args = vec![bdf.clone()];
    if !env.boot.has_iommu() {
        args.push("--allow-noiommu".to_owned());
    }
    let good = run("run", &args)?;
    ensure!(
        good.status.success(),
        "{PROGRAM} {} exited with {}: {}",
        args.join(" "),
        good.status,
        good.stderr.trim()
    );
    let lines: Vec<&str> = good.stdout.lines().collect();
    let want = format!("edu-dma: {bdf} ok: {LEN} bytes host ");
    ensure!(
        lines.len() == 1
            && lines[0].starts_with(&want)
            && lines[0].contains("(2 interrupts), edu -> mapping")
            && lines[0].contains("(polled)")
            && lines[0].ends_with(&format!("ID {:#010x}", edu::ID_VALUE)),
        "{PROGRAM} exited 0 but printed {:?}, not one line \"{want}... (2 interrupts), edu -> mapping ... (polled); ID {:#010x}\"",
        good.stdout,
        edu::ID_VALUE
    );

    // The error path: no such function. Exit status 1, the call and the library's message.
    let missing = "fffe:ff:1f.7".to_owned();
    let bad = run("missing", std::slice::from_ref(&missing))?;
    ensure!(
        bad.status.code() == Some(1)
            && bad.stderr.contains("UDMA_ERR_NOT_FOUND: udma_device_open_pci: fffe:ff:1f.7"),
        "{PROGRAM} {missing} should fail with exit status 1 and udma_last_error()'s message naming the function, got {}: {}",
        bad.status,
        bad.stderr.trim()
    );
    bound.release()
}
