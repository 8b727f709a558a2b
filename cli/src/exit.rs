//! Exit codes and the error type every subcommand returns.

use std::io;

use userdma::pci;

/// Success.
pub(crate) const OK: u8 = 0;
/// The system failed: a sysfs read or write, a kernel refusal, unreadable output.
pub(crate) const FAILURE: u8 = 1;
/// Bad usage or input: unknown option, malformed BDF, unknown driver.
pub(crate) const USAGE: u8 = 2;
/// No such device.
pub(crate) const NOT_FOUND: u8 = 3;
/// Refused, nothing changed: IOMMU group conflict, driver not loaded, no IOMMU group, a bridge,
/// permission denied.
pub(crate) const REFUSED: u8 = 4;
/// The operation failed after changing something, and was rolled back: the system is as before.
pub(crate) const ROLLED_BACK: u8 = 5;
/// The operation failed and so did the rollback: a device is left on another driver (or none);
/// the message says which, and how to repair it.
pub(crate) const ROLLBACK_FAILED: u8 = 6;

/// The exit-code table printed at the end of `--help`.
pub(crate) const HELP: &str = "\
Exit codes:
  0  success
  1  the system failed (a sysfs read or write, a kernel refusal)
  2  bad usage or input (unknown option, malformed BDF, unknown driver)
  3  no such device
  4  refused, nothing changed (IOMMU group conflict, driver not loaded, no IOMMU group,
     a bridge, permission denied)
  5  failed after a change, rolled back: the system is as it was
  6  failed, and the rollback failed too: the message names the device left on the wrong
     driver and the command that repairs it";

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// Command-line parsing (clap) failed; the text is clap's message on one line.
    #[error("{0}")]
    Usage(String),
    /// A BDF argument is malformed.
    #[error(transparent)]
    Bdf(#[from] pci::BdfError),
    /// Reading sysfs failed.
    #[error(transparent)]
    Sysfs(#[from] pci::Error),
    /// Binding or unbinding failed.
    #[error(transparent)]
    Bind(#[from] pci::BindError),
    /// The loopback demo (or the loopback device process) failed.
    #[error(transparent)]
    Demo(#[from] crate::demo::DemoError),
    /// Reading or reserving hugepages failed.
    #[error(transparent)]
    Hugepages(#[from] crate::hugepages::Error),
    /// Planning failed (bad input, exit 2).
    #[error(transparent)]
    Plan(#[from] crate::plan::Error),
    /// The pipeline failed, or some frames came back wrong (exit 1).
    #[error(transparent)]
    Pipeline(#[from] crate::pipeline::Error),
    /// Staging a file failed.
    #[error(transparent)]
    Stage(#[from] crate::stage::Error),
    /// The fault soak failed, or was not clean.
    #[error(transparent)]
    Faults(#[from] crate::faults::Error),
    /// The live view failed.
    #[error(transparent)]
    Top(#[from] crate::top::Error),
    /// Writing the output failed.
    #[error("cannot write the output")]
    Output(#[source] io::Error),
    /// Encoding JSON failed.
    #[error("cannot encode the output as JSON")]
    Json(#[source] serde_json::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Self::Output(e)
    }
}

impl Failure {
    /// The documented exit code for this failure.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) | Self::Bdf(_) => USAGE,
            Self::Sysfs(e) => sysfs_code(e),
            Self::Bind(e) => bind_code(e),
            Self::Hugepages(e) => e.exit_code(),
            Self::Demo(e) => e.exit_code(),
            Self::Plan(e) => e.exit_code(),
            Self::Pipeline(e) => e.exit_code(),
            Self::Stage(e) => e.exit_code(),
            Self::Faults(e) => e.exit_code(),
            Self::Top(e) => e.exit_code(),
            Self::Output(_) | Self::Json(_) => FAILURE,
        }
    }

    /// The message and its causes on one line, joined by `: `.
    pub(crate) fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            let s_text = s.to_string();
            // `#[error(transparent)]` repeats the inner message as the source; skip repeats.
            if !text.ends_with(&s_text) {
                text.push_str(": ");
                text.push_str(&s_text);
            }
            source = s.source();
        }
        text.replace('\n', " ")
    }
}

fn sysfs_code(e: &pci::Error) -> u8 {
    match e {
        pci::Error::NotFound { .. } => NOT_FOUND,
        _ => FAILURE,
    }
}

fn bind_code(e: &pci::BindError) -> u8 {
    use pci::BindError as B;
    match e {
        B::Sysfs(e) => sysfs_code(e),
        B::UnknownDriver { .. } => USAGE,
        B::Bridge { .. }
        | B::NotLoaded { .. }
        | B::NoIommuGroup { .. }
        | B::GroupConflict { .. } => REFUSED,
        B::Bind { rollback, .. } | B::Unbind { rollback, .. } => {
            if e.is_permission_denied() {
                REFUSED
            } else if !rollback.is_complete() {
                ROLLBACK_FAILED
            } else if rollback.entries.is_empty() {
                FAILURE
            } else {
                ROLLED_BACK
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use userdma::pci::{BindOptions, Binder, Driver, Kernel, Sysfs};

    use super::*;

    /// A kernel whose every write fails with `kind` — enough to reach each exit code of a
    /// failed bind on a minimal tree.
    struct Refusing(io::ErrorKind);

    impl Kernel for Refusing {
        fn write(&self, _: &Path, _: &str) -> io::Result<()> {
            Err(self.0.into())
        }
    }

    fn tree() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("bus/pci/devices/0000:01:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(dir.path().join("bus/pci/drivers/uio_pci_generic")).unwrap();
        for (name, value) in [
            ("vendor", "0x1234"),
            ("device", "0x5678"),
            ("class", "0x120000"),
        ] {
            std::fs::write(dev.join(name), value).unwrap();
        }
        std::fs::write(dev.join("resource"), "").unwrap();
        let root = dir.path().to_owned();
        (dir, root)
    }

    fn bind_failure(kind: io::ErrorKind) -> Failure {
        let (_dir, root) = tree();
        let binder = Binder::new(Sysfs::new(&root), Refusing(kind));
        let bdf = "0000:01:00.0".parse().unwrap();
        binder
            .bind(bdf, Driver::UioPciGeneric, BindOptions::default())
            .unwrap_err()
            .into()
    }

    #[test]
    fn permission_denied_before_any_change_is_refused() {
        let f = bind_failure(io::ErrorKind::PermissionDenied);
        assert_eq!(f.exit_code(), REFUSED, "{}", f.chain());
        assert!(f.chain().contains("nothing was changed"), "{}", f.chain());
    }

    #[test]
    fn other_write_failures_before_any_change_are_system_failures() {
        let f = bind_failure(io::ErrorKind::InvalidInput);
        assert_eq!(f.exit_code(), FAILURE, "{}", f.chain());
    }

    /// A kernel that unbinds (removes the `driver` link) but whose probes fail with `probe`,
    /// or, with `probe == None`, do nothing.
    struct Unbinding {
        probe: Option<io::ErrorKind>,
    }

    impl Kernel for Unbinding {
        fn write(&self, path: &Path, value: &str) -> io::Result<()> {
            if path.ends_with("unbind") {
                let dev = path
                    .ancestors()
                    .nth(5)
                    .unwrap()
                    .join("bus/pci/devices")
                    .join(value);
                std::fs::remove_file(dev.join("driver"))
            } else if path.ends_with("drivers_probe") {
                self.probe.map_or(Ok(()), |kind| Err(kind.into()))
            } else {
                Ok(())
            }
        }
    }

    fn bound_tree() -> (tempfile::TempDir, PathBuf) {
        let (dir, root) = tree();
        std::fs::create_dir_all(root.join("bus/pci/drivers/nvme")).unwrap();
        let link = root.join("bus/pci/devices/0000:01:00.0/driver");
        std::os::unix::fs::symlink("../../drivers/nvme", link).unwrap();
        (dir, root)
    }

    #[test]
    fn failed_rollback_and_completed_rollback_codes() {
        let bdf = "0000:01:00.0".parse().unwrap();
        let (_dir, root) = bound_tree();
        let binder = Binder::new(
            Sysfs::new(&root),
            Unbinding {
                probe: Some(io::ErrorKind::InvalidInput),
            },
        );
        let f: Failure = binder
            .bind(bdf, Driver::UioPciGeneric, BindOptions::default())
            .unwrap_err()
            .into();
        assert_eq!(f.exit_code(), ROLLBACK_FAILED, "{}", f.chain());
        assert!(f.chain().contains("ROLLBACK FAILED"), "{}", f.chain());

        let (_dir, root) = bound_tree();
        std::fs::remove_file(root.join("bus/pci/devices/0000:01:00.0/driver")).unwrap();
        let binder = Binder::new(Sysfs::new(&root), Unbinding { probe: None });
        let f: Failure = binder
            .bind(bdf, Driver::UioPciGeneric, BindOptions::default())
            .unwrap_err()
            .into();
        assert_eq!(f.exit_code(), ROLLED_BACK, "{}", f.chain());
    }

    #[test]
    fn simple_codes() {
        let bdf: Result<pci::Bdf, _> = "zz".parse();
        assert_eq!(Failure::from(bdf.unwrap_err()).exit_code(), USAGE);
        let nf = pci::Error::NotFound {
            bdf: "00:01.0".parse().unwrap(),
            dir: "/x".into(),
        };
        assert_eq!(Failure::from(nf).exit_code(), NOT_FOUND);
        let unknown = "nvme".parse::<Driver>().unwrap_err();
        assert_eq!(Failure::from(unknown).exit_code(), USAGE);
        let loaded = pci::BindError::NotLoaded {
            driver: Driver::VfioPci,
        };
        assert_eq!(Failure::from(loaded).exit_code(), REFUSED);
        assert_eq!(
            Failure::Output(io::ErrorKind::Other.into()).exit_code(),
            FAILURE
        );
    }

    #[test]
    fn chain_is_one_line_without_repeats() {
        let (_dir, root) = tree();
        std::fs::write(root.join("bus/pci/devices/0000:01:00.0/vendor"), "bad").unwrap();
        let e = Sysfs::new(&root)
            .device("01:00.0".parse().unwrap())
            .unwrap_err();
        let text = Failure::from(e).chain();
        assert_eq!(text.matches("unexpected content").count(), 1, "{text}");
        assert!(!text.contains('\n'));
    }
}
