//! Binding a device to a user-space driver (`vfio-pci`, `uio_pci_generic`) and back, with
//! rollback on failure.
//!
//! The kernel interface is three sysfs writes: `driver_override` (which driver the next probe
//! must use), `bus/pci/drivers/<old>/unbind`, and `bus/pci/drivers_probe`; then the device's
//! `driver` symlink says what happened. The writes go through the [`Kernel`] trait so tests can
//! plug in a fake sysfs that plays the kernel's part; reads go through [`Sysfs`].

use std::io;
use std::path::PathBuf;

use super::rollback::{driver_text, Original, Progress};
use super::{
    user_space_driver, vfio_compatible, Bdf, Driver, Error, Kernel, LiveKernel, Rollback, Sysfs,
};

/// Choices for [`Binder::bind`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BindOptions {
    /// For `vfio-pci`: when other members of the device's IOMMU group are bound to host drivers,
    /// bind them to `vfio-pci` too (without it, binding is refused, since VFIO cannot use a group
    /// until every member is on a VFIO-compatible driver or none).
    pub force_group: bool,
}

/// One function whose driver changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Change {
    /// The function.
    pub bdf: Bdf,
    /// Its driver before.
    pub from: Option<String>,
    /// Its driver after.
    pub to: Option<String>,
}

/// What [`Binder::bind`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindReport {
    /// The device asked for.
    pub bdf: Bdf,
    /// The driver it is bound to now.
    pub driver: Driver,
    /// Every function whose driver changed: the device first (absent if it already was on
    /// `driver`), then group members bound with [`BindOptions::force_group`].
    pub changes: Vec<Change>,
}

/// What [`Binder::unbind`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnbindReport {
    /// The device.
    pub bdf: Bdf,
    /// Its driver before.
    pub from: Option<String>,
    /// Its driver now: the kernel's default for it, or `None` if no driver claimed it.
    pub to: Option<String>,
    /// Whether anything was written (false when the device was on a host driver already).
    pub changed: bool,
}

/// Binds devices to user-space drivers and back, over a [`Sysfs`] (reads) and a [`Kernel`]
/// (writes).
#[derive(Debug)]
pub struct Binder<K> {
    pub(super) sysfs: Sysfs,
    kernel: K,
}

impl Binder<LiveKernel> {
    /// The live system: `/sys` and real writes.
    pub fn system() -> Self {
        Self::new(Sysfs::system(), LiveKernel)
    }
}

impl<K: Kernel> Binder<K> {
    /// A binder reading `sysfs` and writing through `kernel`.
    pub fn new(sysfs: Sysfs, kernel: K) -> Self {
        Self { sysfs, kernel }
    }

    /// The tree read.
    pub fn sysfs(&self) -> &Sysfs {
        &self.sysfs
    }

    /// Binds `bdf` to `driver`.
    ///
    /// Checks first, changing nothing when a check fails: the device exists and is not a bridge;
    /// the driver is loaded; for `vfio-pci`, the device is in an IOMMU group (or VFIO's no-IOMMU
    /// mode is on) and no other member of the group is bound to a host driver (see
    /// [`vfio_compatible`]) unless [`BindOptions::force_group`] asks to bind those too. Then, per
    /// function: write `driver_override`, unbind the current driver, write `drivers_probe`, and
    /// check that the `driver` link names the new driver. On any failure every function touched
    /// is put back (original `driver_override`, original driver re-probed) and the error carries
    /// both the failure and the [`Rollback`] result. Binding a device already on `driver`
    /// changes nothing.
    ///
    /// # Errors
    /// [`BindError::Sysfs`] (e.g. [`Error::NotFound`]), [`BindError::Bridge`],
    /// [`BindError::NotLoaded`], [`BindError::NoIommuGroup`], [`BindError::GroupConflict`] before
    /// any change; [`BindError::Bind`] after a change was rolled back (or failed to be).
    pub fn bind(
        &self,
        bdf: Bdf,
        driver: Driver,
        options: BindOptions,
    ) -> Result<BindReport, BindError> {
        let info = self.sysfs.device(bdf)?;
        if info.is_bridge() {
            return Err(BindError::Bridge { bdf, driver });
        }
        if !self.sysfs.driver_loaded(driver.name()) {
            return Err(BindError::NotLoaded { driver });
        }
        let mut targets = Vec::new();
        if info.driver.as_deref() != Some(driver.name()) {
            targets.push(bdf);
        }
        if driver == Driver::VfioPci {
            match &info.iommu_group {
                None => {
                    if self.sysfs.iommu()?.noiommu_mode != Some(true) {
                        return Err(BindError::NoIommuGroup { bdf });
                    }
                }
                Some(group) => {
                    let mut conflicts = Vec::new();
                    for member in group.others(bdf) {
                        if let Some(d) = self.sysfs.driver(member)? {
                            if !vfio_compatible(&d) {
                                conflicts.push(GroupMember {
                                    bdf: member,
                                    driver: d,
                                });
                            }
                        }
                    }
                    if !conflicts.is_empty() && !options.force_group {
                        return Err(BindError::GroupConflict {
                            bdf,
                            group: group.number,
                            members: conflicts,
                        });
                    }
                    targets.extend(conflicts.into_iter().map(|m| m.bdf));
                }
            }
        }
        let mut done: Vec<Original> = Vec::new();
        let mut changes = Vec::new();
        for target in targets {
            let original = self.original(target).map_err(|e| BindError::Bind {
                bdf,
                failed: target,
                driver,
                cause: e.into(),
                rollback: self.roll_back(Vec::new(), &done),
            })?;
            let mut progress = Progress::default();
            let result = self
                .switch(target, Some(driver.name()), &mut progress)
                .and_then(|now| {
                    if now.as_deref() == Some(driver.name()) {
                        Ok(now)
                    } else {
                        Err(StepError::NotBound {
                            bdf: target,
                            wanted: driver,
                            got: now,
                        })
                    }
                });
            match result {
                Ok(now) => {
                    changes.push(Change {
                        bdf: target,
                        from: original.driver.clone(),
                        to: now,
                    });
                    done.push(original);
                }
                Err(cause) => {
                    let current = vec![(original, progress)];
                    return Err(BindError::Bind {
                        bdf,
                        failed: target,
                        driver,
                        cause,
                        rollback: self.roll_back(current, &done),
                    });
                }
            }
        }
        Ok(BindReport {
            bdf,
            driver,
            changes,
        })
    }

    /// Returns `bdf` from a user-space driver (see [`user_space_driver`]) to the kernel's
    /// default driver: clear `driver_override`, unbind, probe, and report the driver the kernel
    /// chose (`None` if none claimed it). A device on a host driver with no override is left
    /// alone (`changed: false`); an unbound device is probed. If the same user-space driver
    /// claims the device again (it matches by ID), that is a failure and the change is rolled
    /// back.
    ///
    /// # Errors
    /// [`BindError::Sysfs`] before any change; [`BindError::Unbind`] after a change was rolled
    /// back (or failed to be).
    pub fn unbind(&self, bdf: Bdf) -> Result<UnbindReport, BindError> {
        if !self.sysfs.exists(bdf) {
            return Err(Error::NotFound {
                bdf,
                dir: self.sysfs.devices_dir(),
            }
            .into());
        }
        let original = self.original(bdf)?;
        let from = original.driver.clone();
        if original.driver_override.is_none()
            && from.as_deref().is_some_and(|d| !user_space_driver(d))
        {
            return Ok(UnbindReport {
                bdf,
                to: from.clone(),
                from,
                changed: false,
            });
        }
        let mut progress = Progress::default();
        let result = self
            .switch(bdf, None, &mut progress)
            .and_then(|now| match (&from, &now) {
                (Some(f), Some(n)) if f == n && user_space_driver(n) => {
                    Err(StepError::StillBound {
                        bdf,
                        driver: n.clone(),
                    })
                }
                _ => Ok(now),
            });
        match result {
            Ok(to) => Ok(UnbindReport {
                bdf,
                from,
                to,
                changed: true,
            }),
            Err(cause) => Err(BindError::Unbind {
                bdf,
                cause,
                rollback: self.roll_back(vec![(original, progress)], &[]),
            }),
        }
    }

    pub(super) fn write(&self, path: PathBuf, value: &str) -> Result<(), StepError> {
        self.kernel
            .write(&path, value)
            .map_err(|source| StepError::Write {
                path,
                value: value.trim().to_owned(),
                source,
            })
    }

    pub(super) fn probe_path(&self) -> PathBuf {
        self.sysfs.root().join("bus/pci/drivers_probe")
    }

    /// Sets `driver_override` (`None` clears it), unbinds the current driver and probes;
    /// returns the driver bound afterwards. Records in `progress` what it changed.
    fn switch(
        &self,
        bdf: Bdf,
        driver_override: Option<&str>,
        progress: &mut Progress,
    ) -> Result<Option<String>, StepError> {
        let dir = self.sysfs.device_dir(bdf);
        // An empty write never reaches the kernel; a lone newline clears the override.
        self.write(dir.join("driver_override"), driver_override.unwrap_or("\n"))?;
        progress.override_written = true;
        if let Some(current) = self.sysfs.driver(bdf)? {
            self.write(
                self.sysfs.driver_dir(&current).join("unbind"),
                &bdf.to_string(),
            )?;
        }
        self.write(self.probe_path(), &bdf.to_string())?;
        Ok(self.sysfs.driver(bdf)?)
    }
}

/// A member of an IOMMU group bound to a host driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct GroupMember {
    /// The member.
    pub bdf: Bdf,
    /// Its driver.
    pub driver: String,
}

fn member_list(members: &[GroupMember]) -> String {
    let items: Vec<String> = members
        .iter()
        .map(|m| format!("{} bound to {}", m.bdf, m.driver))
        .collect();
    match items.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// One step of switching a driver failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// A sysfs write failed.
    #[error("writing {value:?} to {path}")]
    Write {
        /// The attribute.
        path: PathBuf,
        /// The value.
        value: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// Reading the device's state failed.
    #[error(transparent)]
    Read(#[from] Error),
    /// After the probe the device is not on the wanted driver.
    #[error(
        "after the probe {bdf} is on {}, not {wanted} (the kernel log, `dmesg`, says why)",
        driver_text(got.as_deref())
    )]
    NotBound {
        /// The function.
        bdf: Bdf,
        /// The driver wanted.
        wanted: Driver,
        /// The driver it ended on.
        got: Option<String>,
    },
    /// After clearing the override and probing, the same user-space driver claimed it again.
    #[error(
        "{driver} claimed {bdf} again after the probe: it matches the device by ID (a `new_id` \
         or udev rule adds it); remove that first"
    )]
    StillBound {
        /// The function.
        bdf: Bdf,
        /// The driver.
        driver: String,
    },
    /// A rollback's probe did not bring the original driver back.
    #[error("after the re-probe {bdf} is on {}", driver_text(got.as_deref()))]
    NotRestored {
        /// The function.
        bdf: Bdf,
        /// The driver it is on.
        got: Option<String>,
    },
}

/// Binding or unbinding failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Reading the device failed before anything was changed (e.g. [`Error::NotFound`]).
    #[error(transparent)]
    Sysfs(#[from] Error),
    /// The driver name is not one userdma binds to.
    #[error("unknown driver {name:?}: use vfio-pci or uio_pci_generic")]
    UnknownDriver {
        /// The name given.
        name: String,
    },
    /// The device is a bridge; user-space drivers do not take bridges.
    #[error("{bdf} is a PCI bridge: {driver} does not drive bridges; bind the device behind it")]
    Bridge {
        /// The device.
        bdf: Bdf,
        /// The driver asked for.
        driver: Driver,
    },
    /// The driver's module is not loaded.
    #[error("driver {driver} is not loaded: run `modprobe {driver}` and try again")]
    NotLoaded {
        /// The driver.
        driver: Driver,
    },
    /// VFIO cannot take a device outside any IOMMU group unless no-IOMMU mode is on.
    #[error(
        "{bdf} is in no IOMMU group and VFIO no-IOMMU mode is off: turn the IOMMU on \
         (intel_iommu=on or amd_iommu=on on the kernel command line), or allow unisolated DMA \
         with `modprobe vfio enable_unsafe_noiommu_mode=1`, or bind uio_pci_generic instead"
    )]
    NoIommuGroup {
        /// The device.
        bdf: Bdf,
    },
    /// Other members of the IOMMU group are on host drivers.
    #[error(
        "IOMMU group {group} also holds {}: bind {} too or use --force-group",
        member_list(members),
        if members.len() == 1 { "it" } else { "them" }
    )]
    GroupConflict {
        /// The device asked for.
        bdf: Bdf,
        /// The group number.
        group: u32,
        /// The members on host drivers.
        members: Vec<GroupMember>,
    },
    /// Binding failed after a change; the change was rolled back (see `rollback`).
    #[error(
        "binding {bdf} to {driver} failed{}; {rollback}",
        if failed == bdf { String::new() } else { format!(" at IOMMU group member {failed}") }
    )]
    Bind {
        /// The device asked for.
        bdf: Bdf,
        /// The function whose switch failed.
        failed: Bdf,
        /// The driver.
        driver: Driver,
        /// What failed.
        #[source]
        cause: StepError,
        /// Undoing it.
        rollback: Box<Rollback>,
    },
    /// Returning a device to its default driver failed; the change was rolled back.
    #[error("returning {bdf} to its default driver failed; {rollback}")]
    Unbind {
        /// The device.
        bdf: Bdf,
        /// What failed.
        #[source]
        cause: StepError,
        /// Undoing it.
        rollback: Box<Rollback>,
    },
}

impl BindError {
    /// The rollback, for errors that come after a change.
    pub fn rollback(&self) -> Option<&Rollback> {
        match self {
            Self::Bind { rollback, .. } | Self::Unbind { rollback, .. } => Some(rollback),
            _ => None,
        }
    }

    /// Whether the failure was the kernel refusing a write for lack of privilege (and nothing
    /// was left changed).
    pub fn is_permission_denied(&self) -> bool {
        match self {
            Self::Bind {
                cause, rollback, ..
            }
            | Self::Unbind {
                cause, rollback, ..
            } => {
                matches!(cause, StepError::Write { source, .. }
                    if source.kind() == io::ErrorKind::PermissionDenied)
                    && rollback.is_complete()
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_message_names_each_member() {
        let m = |s: &str, d: &str| GroupMember {
            bdf: s.parse().unwrap(),
            driver: d.into(),
        };
        let one = BindError::GroupConflict {
            bdf: "0000:00:1f.0".parse().unwrap(),
            group: 7,
            members: vec![m("0000:00:1f.3", "i801_smbus")],
        };
        assert_eq!(
            one.to_string(),
            "IOMMU group 7 also holds 0000:00:1f.3 bound to i801_smbus: bind it too or use --force-group"
        );
        let three = BindError::GroupConflict {
            bdf: "0000:00:1f.0".parse().unwrap(),
            group: 7,
            members: vec![
                m("0000:00:1f.3", "a"),
                m("0000:00:1f.4", "b"),
                m("0000:00:1f.5", "c"),
            ],
        };
        assert!(three.to_string().contains(
            "0000:00:1f.3 bound to a, 0000:00:1f.4 bound to b and 0000:00:1f.5 bound to c: bind them too"
        ));
    }
}
