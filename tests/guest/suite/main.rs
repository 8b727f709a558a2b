//! The guest side of userdma's QEMU test harness: a program (the host's release build, its
//! shared libraries in the initramfs) that runs as part of a small Linux guest's `/init`, drives
//! QEMU's emulated `edu` device (and looks at an emulated NVMe controller) through the crate's
//! public API, and prints one line per case on the serial console:
//!
//! ```text
//! PASS <case> (<ms> ms)
//! FAIL <case>: <reason, with its chain of causes> (<ms> ms)
//! INFO <what was found: addresses, groups, timings; for the log>
//! ```
//!
//! `tests/guest/run.sh` builds it, boots the guests, and collects the lines. The guests differ in
//! how DMA is translated (see [`Boot`]); each case says which boots it runs in.
//!
//! ```text
//! guest_suite <boot>           run the cases of that boot (inside the guest, as root)
//! guest_suite --list <boot>    print the names of the cases of that boot, one a line
//! guest_suite --boots          print the names of the boots, one a line
//! guest_suite --child ROLE ... a case's child process (a case runs it, never the harness)
//! ```
//!
//! Adding a case: write a `fn(&Env) -> Result<(), Failure>` in a module of `cases`, and add a
//! row to [`cases::ALL`] naming the boots it runs in. Cases run in table order, one after
//! another; each one leaves the devices unbound (no driver) when it ends.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Instant;

mod cases;
mod edu;
mod edu_engine;
mod env;
mod failure;
mod program;
mod v4l2;

use crate::env::Env;
use crate::failure::Failure;

/// Counts heap allocations, so that a case can show that its steady state makes none.
#[global_allocator]
static ALLOCATOR: userdma_infer::stats::CountingAllocator = userdma_infer::stats::CountingAllocator;

/// The guests the harness boots. They differ in the kernel command line, the QEMU machine and
/// the `vfio` module loaded; `tests/guest/run.sh` holds the matching QEMU arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Boot {
    /// Emulated Intel IOMMU, `intel_iommu=on iommu=pt`: devices on no driver are in a
    /// passthrough (identity) domain, so UIO DMA with physical addresses works; a device given
    /// to `vfio-pci` gets a translated domain of its own. Two NUMA nodes ([`Boot::has_numa`]).
    IommuPt,
    /// Emulated Intel IOMMU in translated mode (`intel_iommu=on`): every device's DMA is
    /// translated, so physical-address DMA is refused. A second edu on a hot-pluggable root
    /// port ([`Boot::has_hot_edu`]).
    IommuStrict,
    /// No IOMMU; `vfio` rebuilt with `CONFIG_VFIO_NOIOMMU` and loaded with
    /// `enable_unsafe_noiommu_mode=1`.
    NoIommu,
    /// Emulated Intel IOMMU in translated mode on Debian 13's kernel (6.12), with iommufd
    /// (`/dev/iommu`) and the VFIO device cdevs: `device::Vfio` opens through them by default.
    Iommufd,
}

impl Boot {
    /// Every boot, in the order the harness runs them.
    pub(crate) const ALL: [Boot; 4] = [
        Boot::IommuPt,
        Boot::IommuStrict,
        Boot::NoIommu,
        Boot::Iommufd,
    ];

    /// The name used on the kernel command line (`userdma.boot=<name>`) and in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Boot::IommuPt => "iommu-pt",
            Boot::IommuStrict => "iommu-strict",
            Boot::NoIommu => "noiommu",
            Boot::Iommufd => "iommufd",
        }
    }

    /// Whether the guest has an IOMMU.
    pub(crate) fn has_iommu(self) -> bool {
        self != Boot::NoIommu
    }

    /// Whether the guest has two NUMA nodes (128 MiB each, one CPU each) and a second edu
    /// behind a `pxb-pcie` expander bridge on node 1 (`iommu-pt`; the others have one node and
    /// one edu).
    pub(crate) fn has_numa(self) -> bool {
        self == Boot::IommuPt
    }

    /// Whether the guest has a second edu on a hot-pluggable PCIe root port, QEMU id `hotedu`,
    /// which the harness removes (QMP `device_del`) when the guest asks (`iommu-strict`).
    pub(crate) fn has_hot_edu(self) -> bool {
        self == Boot::IommuStrict
    }

    /// The mode `device::Vfio` opens edu in by default: iommufd where the kernel has it,
    /// type1 behind an IOMMU, no-IOMMU without one.
    pub(crate) fn vfio_mode(self) -> userdma::device::vfio::Mode {
        use userdma::device::vfio::Mode;
        match self {
            Boot::IommuPt | Boot::IommuStrict => Mode::Type1,
            Boot::NoIommu => Mode::NoIommu,
            Boot::Iommufd => Mode::Iommufd,
        }
    }

    /// The kind of DMA space `device::Vfio` gives edu by default ([`Boot::vfio_mode`]).
    pub(crate) fn dma_kind(self) -> userdma::dma::Kind {
        use userdma::dma::Kind;
        match self {
            Boot::IommuPt | Boot::IommuStrict => Kind::Type1,
            Boot::NoIommu => Kind::Physical,
            Boot::Iommufd => Kind::Iommufd,
        }
    }
}

impl fmt::Display for Boot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A boot name that is not one of [`Boot::ALL`].
#[derive(Debug)]
pub(crate) struct UnknownBoot;

impl FromStr for Boot {
    type Err = UnknownBoot;

    fn from_str(s: &str) -> Result<Boot, UnknownBoot> {
        Boot::ALL
            .into_iter()
            .find(|boot| boot.name() == s)
            .ok_or(UnknownBoot)
    }
}

/// Runs every case of `boot` against `env` (or reports each as failed when the environment
/// could not be read), printing one result line per case. Returns the number of failures.
fn run(boot: Boot, env: Result<Env, Failure>) -> usize {
    let planned: Vec<_> = cases::for_boot(boot).collect();
    println!("PLAN {boot} {}", planned.len());
    let env = match env {
        Ok(env) => env,
        Err(failure) => {
            let reason = failure.chain();
            for case in &planned {
                println!(
                    "FAIL {}: the guest environment is not as expected: {reason}",
                    case.name
                );
            }
            return planned.len();
        }
    };
    let mut failed = 0;
    for case in planned {
        let start = Instant::now();
        // A panic in a case is a bug in the case (or in the library): report it as that case's
        // failure and go on with the others. The env is only read by cases.
        let result = panic::catch_unwind(AssertUnwindSafe(|| (case.run)(&env)));
        let ms = start.elapsed().as_millis();
        match result {
            Ok(Ok(())) => println!("PASS {} ({ms} ms)", case.name),
            Ok(Err(failure)) => {
                failed += 1;
                println!("FAIL {}: {} ({ms} ms)", case.name, failure.chain());
            }
            Err(payload) => {
                failed += 1;
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic with a non-text payload".to_owned());
                println!("FAIL {}: panicked: {message} ({ms} ms)", case.name);
            }
        }
    }
    failed
}

fn usage() -> ExitCode {
    eprintln!("usage: guest_suite <boot> | --list <boot> | --boots");
    eprintln!("boots: {}", Boot::ALL.map(Boot::name).join(", "));
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["--boots"] => {
            for boot in Boot::ALL {
                println!("{boot}");
            }
            ExitCode::SUCCESS
        }
        ["--child", role, args @ ..] => cases::child(role, args),
        ["--list", boot] => match boot.parse::<Boot>() {
            Ok(boot) => {
                for case in cases::for_boot(boot) {
                    println!("{}", case.name);
                }
                ExitCode::SUCCESS
            }
            Err(UnknownBoot) => usage(),
        },
        [boot] => match boot.parse::<Boot>() {
            Ok(boot) => {
                // One line, where the harness expects lines (the FAIL line that follows has
                // the message; this one adds where it was raised).
                panic::set_hook(Box::new(|info| {
                    println!("INFO {}", info.to_string().replace('\n', " "));
                }));
                let failed = run(boot, Env::discover(boot));
                if failed == 0 {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(UnknownBoot) => usage(),
        },
        _ => usage(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_names_round_trip() {
        for boot in Boot::ALL {
            assert_eq!(boot.name().parse::<Boot>().ok(), Some(boot));
        }
        assert!("iommu".parse::<Boot>().is_err());
        assert!("".parse::<Boot>().is_err());
    }

    #[test]
    fn every_boot_has_cases_and_names_are_unique_per_boot() {
        for boot in Boot::ALL {
            let names: Vec<_> = cases::for_boot(boot).map(|case| case.name).collect();
            assert!(!names.is_empty(), "boot {boot} has no case");
            let mut sorted = names.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), names.len(), "duplicate case in boot {boot}");
        }
    }

    #[test]
    fn the_numa_case_runs_in_the_boots_with_two_nodes() {
        for boot in Boot::ALL {
            let planned = cases::for_boot(boot).any(|case| case.name == "numa-placement");
            assert_eq!(planned, boot.has_numa(), "boot {boot}");
        }
    }

    #[test]
    fn the_hot_unplug_case_runs_in_the_boot_with_the_hot_edu() {
        for boot in Boot::ALL {
            let planned = cases::for_boot(boot).any(|case| case.name == "vfio-hot-unplug");
            assert_eq!(planned, boot.has_hot_edu(), "boot {boot}");
        }
    }

    #[test]
    fn case_names_are_single_lowercase_words() {
        for case in cases::ALL {
            assert!(
                !case.name.is_empty()
                    && case
                        .name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "case name {:?} must be [a-z0-9-]+ (the harness parses it)",
                case.name
            );
            assert!(!case.boots.is_empty(), "case {} runs in no boot", case.name);
        }
    }
}
