//! The C API on a real device: `examples/c/edu_dma.c`, linked statically against
//! `libuserdma.a` and put in the initramfs as `/edu_dma` by `tests/guest/run.sh`, drives edu
//! through VFIO from C (its registers through the BAR calls, its DMA engine with pool buffers
//! and a mapping, each transfer ended by the MSI or by polling) and checks every byte itself.
//! `examples/c/edu_engine.c` (`/edu_engine`) is an engine written in C over edu
//! (`udma_engine_ops`: arenas in host memory named by their IOVAs, each copy two transfers
//! through edu's buffer, completions by polling its command register) with the library's
//! pipeline on it, every result checked against the model run on the host. Each case runs its
//! program as a user would, as a separate process, and checks its exit status and its result
//! line; then runs it on a function that does not exist, which must fail with exit status 1
//! and the library's message.

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

/// Where `tests/guest/run.sh` puts the statically linked C engine over edu.
pub(crate) const ENGINE_PROGRAM: &str = "/edu_engine";

/// The longest the engine's run may take: `FRAMES` (16) frames of four transfers of about
/// 100 ms each in `edu_engine.c`, about 7 s, with a wide margin for software emulation.
const ENGINE_RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the program with `args`, waiting up to [`RUN_TIMEOUT`]; its output goes to the log as
/// INFO lines.
fn run(label: &str, args: &[String]) -> Result<Run, Failure> {
    program::run(PROGRAM, "c-edu-vfio", label, args, RUN_TIMEOUT)
}

/// The arguments that open edu at `bdf` in this boot (`--allow-noiommu` where it has no IOMMU).
fn edu_args(env: &Env, bdf: &str) -> Vec<String> {
    let mut args = vec![bdf.to_owned()];
    if !env.boot.has_iommu() {
        args.push("--allow-noiommu".to_owned());
    }
    args
}

/// Runs `program` (of case `case`) on a function that does not exist: it must exit with status
/// 1 and `udma_last_error()`'s message naming the function.
fn fails_on_a_missing_function(
    program: &str,
    case: &str,
    timeout: Duration,
) -> Result<(), Failure> {
    let missing = "fffe:ff:1f.7".to_owned();
    let bad = program::run(
        program,
        case,
        "missing",
        std::slice::from_ref(&missing),
        timeout,
    )?;
    ensure!(
        bad.status.code() == Some(1)
            && bad.stderr.contains("UDMA_ERR_NOT_FOUND: udma_device_open_pci: fffe:ff:1f.7"),
        "{program} {missing} should fail with exit status 1 and udma_last_error()'s message naming the function, got {}: {}",
        bad.status,
        bad.stderr.trim()
    );
    Ok(())
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
    let args = edu_args(env, &bdf);
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
    fails_on_a_missing_function(PROGRAM, "c-edu-vfio", RUN_TIMEOUT)?;
    bound.release()
}

/// The C engine over edu through VFIO, with the library's pipeline on it: a two-layer chain of
/// 2 KiB tensors, depth 2, 16 frames, results copied back through edu, every result checked
/// by the program against the model run on the host, the model's steps on the host; then a
/// failure it must report.
pub(crate) fn engine_edu_vfio(env: &Env) -> Result<(), Failure> {
    ensure!(
        Path::new(ENGINE_PROGRAM).is_file(),
        "{ENGINE_PROGRAM} (examples/c/edu_engine.c) is not in the initramfs: tests/guest/run.sh puts it there"
    );
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let bdf = env.edu.to_string();
    let args = edu_args(env, &bdf);
    let good = program::run(
        ENGINE_PROGRAM,
        "c-engine-edu-vfio",
        "run",
        &args,
        ENGINE_RUN_TIMEOUT,
    )?;
    ensure!(
        good.status.success(),
        "{ENGINE_PROGRAM} {} exited with {}: {}",
        args.join(" "),
        good.status,
        good.stderr.trim()
    );
    // 16 frames: each its input in and its result out, 2048 bytes each, one chunk of two
    // transfers through edu's buffer each way; two model steps each on the host.
    let lines: Vec<&str> = good.stdout.lines().collect();
    let want = format!(
        "edu-engine: {bdf} ok: 16 frames of a 2-layer chain of 2048 bytes through the library's \
         pipeline, every result right; 32 steps on the host; 64 edu transfers, 65536 bytes \
         through its buffer, "
    );
    let id = format!("; ID {:#010x}", edu::ID_VALUE);
    ensure!(
        lines.len() == 1 && lines[0].starts_with(&want) && lines[0].ends_with(&id),
        "{ENGINE_PROGRAM} exited 0 but printed {:?}, not one line \"{want}... ms{id}\"",
        good.stdout
    );

    fails_on_a_missing_function(ENGINE_PROGRAM, "c-engine-edu-vfio", ENGINE_RUN_TIMEOUT)?;
    bound.release()
}
