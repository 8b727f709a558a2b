//! The NVMe controller through `vfio-pci`, driven by the `nvme` example (`examples/nvme/`): a
//! user-space NVMe driver on the crate's VFIO device, ring and pool. The case runs it as a
//! separate program, as a user would:
//!
//! 1. write blocks with a seeded pattern, flush, read them back into other buffers and compare;
//! 2. a second process, `--verify-only`: the blocks are on the disk, not only in memory;
//! 3. `--verify-only` with another seed must fail with exit status 3 (the check can fail).
//!
//! The seed, LBA and block count come from the kernel command line
//! (`userdma.nvme=SEED,LBA,BLOCKS`), chosen by `tests/guest/run.sh`, which checks the disk image
//! on the host after the guest powered off: the last line of this case
//! (`INFO nvme-image seed=S lba=L blocks=N lba-size=B`) tells it the LBA size the namespace has.

use std::path::Path;
use std::time::Duration;

use userdma::pci::Driver;

use crate::env::Env;
use crate::failure::{ensure, Context, Failure};
use crate::program::{self, Run};

/// Where `tests/guest/run.sh` puts the statically linked `nvme` example in the initramfs.
pub(crate) const DRIVER: &str = "/nvme";

/// The longest one run of the driver may take (software emulation is slow).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The kernel command line parameter with the run's data.
const PARAM: &str = "userdma.nvme=";

/// What to write: the pattern's seed and the block range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The pattern's seed.
    pub(crate) seed: u64,
    /// The first block.
    pub(crate) lba: u64,
    /// Blocks.
    pub(crate) blocks: u64,
}

impl Plan {
    /// The plan in a kernel command line: `userdma.nvme=SEED,LBA,BLOCKS` (decimal).
    pub(crate) fn from_cmdline(cmdline: &str) -> Result<Plan, Failure> {
        let value = cmdline
            .split_whitespace()
            .find_map(|word| word.strip_prefix(PARAM))
            .ok_or_else(|| {
                Failure::Check(format!(
                    "the kernel command line has no {PARAM}SEED,LBA,BLOCKS (tests/guest/run.sh sets it): {cmdline:?}"
                ))
            })?;
        let fields: Vec<Option<u64>> = value.split(',').map(|f| f.parse().ok()).collect();
        match fields.as_slice() {
            [Some(seed), Some(lba), Some(blocks)] if *blocks > 0 => Ok(Plan {
                seed: *seed,
                lba: *lba,
                blocks: *blocks,
            }),
            _ => Err(Failure::Check(format!(
                "{PARAM}{value} is not SEED,LBA,BLOCKS (three decimal numbers, BLOCKS > 0)"
            ))),
        }
    }
}

/// Runs the program with `args`, waiting up to [`RUN_TIMEOUT`]; its output goes to the log as
/// INFO lines.
fn run_driver(label: &str, args: &[String]) -> Result<Run, Failure> {
    program::run(DRIVER, "nvme", label, args, RUN_TIMEOUT)
}

/// The LBA size the driver reported (`namespace N: X blocks of B bytes`).
fn lba_size(stdout: &str) -> Option<u64> {
    let line = stdout.lines().find(|l| l.starts_with("namespace "))?;
    let (_, after) = line.split_once(" blocks of ")?;
    after.split_whitespace().next()?.parse().ok()
}

/// The driver's arguments for `plan`, reading only when `verify_only`.
fn arguments(bdf: &str, plan: Plan, seed: u64, verify_only: bool) -> Vec<String> {
    let mut args = vec![
        bdf.to_owned(),
        "--seed".to_owned(),
        seed.to_string(),
        "--lba".to_owned(),
        plan.lba.to_string(),
        "--blocks".to_owned(),
        plan.blocks.to_string(),
    ];
    if verify_only {
        args.push("--verify-only".to_owned());
    }
    args
}

/// Fails unless the run exited 0 and said it verified every block.
fn check_success(what: &str, run: &Run, plan: Plan) -> Result<(), Failure> {
    ensure!(
        run.status.success(),
        "{what}: {DRIVER} exited with {}: {}",
        run.status,
        run.stderr.trim()
    );
    let verified = format!(
        "verified {} blocks at LBA {}..{} against seed",
        plan.blocks,
        plan.lba,
        plan.lba + plan.blocks
    );
    ensure!(
        run.stdout.contains(&verified),
        "{what}: {DRIVER} exited 0 but did not report {verified:?}"
    );
    Ok(())
}

/// Write, read back and compare; verify again from a new process; a wrong seed must fail.
pub(crate) fn nvme_vfio(env: &Env) -> Result<(), Failure> {
    ensure!(
        Path::new(DRIVER).is_file(),
        "{DRIVER} (the nvme example) is not in the initramfs: tests/guest/run.sh puts it there"
    );
    let cmdline =
        std::fs::read_to_string("/proc/cmdline").context(|| "read /proc/cmdline".to_owned())?;
    let plan = Plan::from_cmdline(&cmdline)?;
    let bound = env.bind(env.nvme, Driver::VfioPci)?;
    let bdf = env.nvme.to_string();

    let first = run_driver("write", &arguments(&bdf, plan, plan.seed, false))?;
    check_success("write and read back", &first, plan)?;
    let lba_size = lba_size(&first.stdout).ok_or_else(|| {
        Failure::Check(format!("{DRIVER} did not report the namespace's LBA size"))
    })?;
    ensure!(
        first.stdout.contains("with a PRP list") && first.stdout.contains("shutdown: complete"),
        "{DRIVER} did not report its transfers and shutdown"
    );

    let again = run_driver("verify", &arguments(&bdf, plan, plan.seed, true))?;
    check_success("verify from a new process", &again, plan)?;
    ensure!(
        !again.stdout.contains("write:"),
        "--verify-only wrote blocks"
    );

    let wrong = plan.seed.wrapping_add(1);
    let negative = run_driver("wrong-seed", &arguments(&bdf, plan, wrong, true))?;
    ensure!(
        negative.status.code() == Some(3) && negative.stderr.contains("read back wrong data"),
        "verifying with seed {wrong} instead of {} should fail with exit status 3 and a mismatch, got {}: {}",
        plan.seed,
        negative.status,
        negative.stderr.trim()
    );

    bound.release()?;
    println!(
        "INFO nvme-image seed={} lba={} blocks={} lba-size={lba_size}",
        plan.seed, plan.lba, plan.blocks
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_comes_from_the_command_line() {
        let plan =
            Plan::from_cmdline("console=ttyS0 userdma.nvme=12345,16,200 quiet\n").expect("valid");
        assert_eq!(
            plan,
            Plan {
                seed: 12345,
                lba: 16,
                blocks: 200
            }
        );
        for bad in [
            "console=ttyS0",
            "userdma.nvme=1,2",
            "userdma.nvme=1,2,0",
            "userdma.nvme=1,x,3",
            "userdma.nvme=1,2,3,4",
        ] {
            assert!(Plan::from_cmdline(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn lba_size_is_read_from_the_namespace_line() {
        let out = "controller: model \"QEMU\"\nnamespace 1: 2048 blocks of 512 bytes (1024 KiB), LBA format 0\n";
        assert_eq!(lba_size(out), Some(512));
        assert_eq!(lba_size("nothing"), None);
    }

    #[test]
    fn arguments_name_the_range() {
        let plan = Plan {
            seed: 9,
            lba: 4,
            blocks: 8,
        };
        assert_eq!(
            arguments("0000:00:04.0", plan, 10, true).join(" "),
            "0000:00:04.0 --seed 10 --lba 4 --blocks 8 --verify-only"
        );
    }
}
