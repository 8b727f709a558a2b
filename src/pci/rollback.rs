//! Undoing a failed bind or unbind: every function touched goes back to its original
//! `driver_override` and driver, and the result is reported, never assumed.

use std::fmt;
use std::path::PathBuf;

use super::{Bdf, Binder, Error, Kernel, StepError};

/// The result of undoing a failed bind or unbind: one entry per function that had been touched.
#[derive(Debug, Default)]
pub struct Rollback {
    /// The functions put back, in the order they were.
    pub entries: Vec<RollbackEntry>,
    /// Path to write a BDF to for a manual re-probe (`bus/pci/drivers_probe`).
    probe_path: PathBuf,
}

/// Undoing the changes to one function.
#[derive(Debug)]
pub struct RollbackEntry {
    /// The function.
    pub bdf: Bdf,
    /// The driver it had before (what the rollback restores).
    pub wanted: Option<String>,
    /// Its driver after the rollback, when that could be read.
    pub now: Option<String>,
    /// What went wrong undoing it, if anything.
    pub error: Option<StepError>,
}

impl Rollback {
    /// Whether every touched function is back on its original driver.
    pub fn is_complete(&self) -> bool {
        self.entries
            .iter()
            .all(|e| e.error.is_none() && e.now == e.wanted)
    }
}

/// A driver name for messages, `no driver` for none.
pub(super) fn driver_text(d: Option<&str>) -> &str {
    d.unwrap_or("no driver")
}

impl fmt::Display for Rollback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.entries.is_empty() {
            return f.write_str("nothing was changed");
        }
        if self.is_complete() {
            f.write_str("rolled back: ")?;
            for (i, e) in self.entries.iter().enumerate() {
                let sep = if i == 0 { "" } else { ", " };
                write!(
                    f,
                    "{sep}{} is on {} again",
                    e.bdf,
                    driver_text(e.wanted.as_deref())
                )?;
            }
            return Ok(());
        }
        f.write_str("ROLLBACK FAILED: ")?;
        let mut first = true;
        for e in self
            .entries
            .iter()
            .filter(|e| e.error.is_some() || e.now != e.wanted)
        {
            let sep = if first { "" } else { "; " };
            first = false;
            write!(
                f,
                "{sep}{} is left on {} instead of {}",
                e.bdf,
                driver_text(e.now.as_deref()),
                driver_text(e.wanted.as_deref())
            )?;
            if let Some(err) = &e.error {
                write!(f, " ({err}")?;
                let mut source = std::error::Error::source(err);
                while let Some(s) = source {
                    write!(f, ": {s}")?;
                    source = s.source();
                }
                f.write_str(")")?;
            }
            write!(
                f,
                "; repair: `echo {} > {}`",
                e.bdf,
                self.probe_path.display()
            )?;
        }
        Ok(())
    }
}

/// Whether a switch wrote anything yet, so that a rollback leaves untouched functions alone.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Progress {
    pub(super) override_written: bool,
}

/// The state of one function before it was touched.
#[derive(Debug, Clone)]
pub(super) struct Original {
    pub(super) bdf: Bdf,
    pub(super) driver: Option<String>,
    pub(super) driver_override: Option<String>,
}

impl<K: Kernel> Binder<K> {
    pub(super) fn original(&self, bdf: Bdf) -> Result<Original, Error> {
        Ok(Original {
            bdf,
            driver: self.sysfs.driver(bdf)?,
            driver_override: self.sysfs.driver_override(bdf)?,
        })
    }

    /// Puts back `current` (the function being switched when the failure came, with what had
    /// been written for it) and then every fully switched function in `done`, newest first.
    pub(super) fn roll_back(
        &self,
        current: Vec<(Original, Progress)>,
        done: &[Original],
    ) -> Box<Rollback> {
        let full = Progress {
            override_written: true,
        };
        let all = current
            .into_iter()
            .chain(done.iter().rev().map(|o| (o.clone(), full)));
        let mut entries = Vec::new();
        for (original, progress) in all {
            if !progress.override_written {
                continue;
            }
            let error = self.restore(&original).err();
            let now = self.sysfs.driver(original.bdf).ok().flatten();
            entries.push(RollbackEntry {
                bdf: original.bdf,
                wanted: original.driver,
                now,
                error,
            });
        }
        Box::new(Rollback {
            entries,
            probe_path: self.probe_path(),
        })
    }

    /// Writes back the original `driver_override` and, if the driver differs from the original,
    /// unbinds it and re-probes.
    fn restore(&self, original: &Original) -> Result<(), StepError> {
        let dir = self.sysfs.device_dir(original.bdf);
        let value = original.driver_override.as_deref().unwrap_or("\n");
        self.write(dir.join("driver_override"), value)?;
        let current = self.sysfs.driver(original.bdf)?;
        if current == original.driver {
            return Ok(());
        }
        if let Some(current) = current {
            let unbind = self.sysfs.driver_dir(&current).join("unbind");
            self.write(unbind, &original.bdf.to_string())?;
        }
        self.write(self.probe_path(), &original.bdf.to_string())?;
        let now = self.sysfs.driver(original.bdf)?;
        if now != original.driver {
            return Err(StepError::NotRestored {
                bdf: original.bdf,
                got: now,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_rollback_says_nothing_changed() {
        let r = Rollback::default();
        assert!(r.is_complete());
        assert_eq!(r.to_string(), "nothing was changed");
    }
}
