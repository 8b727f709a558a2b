//! What every case works with: the boot, the live sysfs, and the two devices QEMU was given.

use std::path::PathBuf;

use userdma::pci::{Bdf, BindOptions, Binder, DeviceInfo, Driver, LiveKernel, Sysfs};

use crate::edu;
use crate::failure::{ensure, Context, Failure};
use crate::Boot;

/// The class code of an NVM Express controller (mass storage, non-volatile memory, NVMe).
pub(crate) const NVME_CLASS: u32 = 0x010802;

/// The guest as the cases find it.
#[derive(Debug)]
pub(crate) struct Env {
    /// Which guest this is.
    pub(crate) boot: Boot,
    /// `/sys`.
    pub(crate) sysfs: Sysfs,
    /// Binding through `/sys`.
    pub(crate) binder: Binder<LiveKernel>,
    /// The `edu` function (on bus 0, on no NUMA node).
    pub(crate) edu: Bdf,
    /// The second `edu`, behind a `pxb-pcie` expander bridge on NUMA node 1, in the boots
    /// that have two nodes ([`Boot::has_numa`]); `None` elsewhere.
    pub(crate) numa_edu: Option<Bdf>,
    /// The edu on the hot-pluggable root port, in the boots that have one
    /// ([`Boot::has_hot_edu`]); `None` elsewhere.
    pub(crate) hot_edu: Option<Bdf>,
    /// The NVMe controller.
    pub(crate) nvme: Bdf,
}

impl Env {
    /// Finds the devices: exactly one `edu` on bus 0 and one NVMe controller, and in the boots
    /// with two NUMA nodes exactly one more `edu` behind the expander bridge (on a bus of its
    /// own), none of them bound to a driver (the guest loads no driver for them).
    pub(crate) fn discover(boot: Boot) -> Result<Env, Failure> {
        let sysfs = Sysfs::system();
        let devices = sysfs
            .devices()
            .context(|| "list PCI devices in /sys".to_owned())?;
        let is_edu = |d: &DeviceInfo| d.vendor == edu::VENDOR && d.device == edu::DEVICE;
        let edu = only(&devices, "edu (1234:11e8) on bus 0", |d| {
            is_edu(d) && d.bdf.bus() == 0
        })?;
        // The expander bridge's bus numbers start at 128 (bus_nr=128); the hot-pluggable root
        // port's bus is numbered from 1.
        let behind = |d: &DeviceInfo| is_edu(d) && d.bdf.bus() >= 128;
        let hot = |d: &DeviceInfo| is_edu(d) && d.bdf.bus() != 0 && d.bdf.bus() < 128;
        let hot_edu = if boot.has_hot_edu() {
            Some(only(
                &devices,
                "edu (1234:11e8) on the hot-pluggable root port (a bus under 128, not 0)",
                hot,
            )?)
        } else {
            let extra = devices.iter().filter(|d| hot(d)).count();
            ensure!(
                extra == 0,
                "found {extra} edu functions on a root port; boot {boot} should have none there"
            );
            None
        };
        let numa_edu = if boot.has_numa() {
            Some(only(
                &devices,
                "edu (1234:11e8) behind the pxb-pcie expander bridge (a bus other than 0)",
                behind,
            )?)
        } else {
            let extra = devices.iter().filter(|d| behind(d)).count();
            ensure!(
                extra == 0,
                "found {extra} edu functions off bus 0; boot {boot} should have one edu only"
            );
            None
        };
        let nvme = only(&devices, "an NVMe controller (class 010802)", |d| {
            d.class == NVME_CLASS
        })?;
        for dev in [Some(edu), Some(nvme), numa_edu, hot_edu]
            .into_iter()
            .flatten()
        {
            ensure!(
                dev.driver.is_none(),
                "{} starts bound to {:?}; the guest should load no driver for it",
                dev.bdf,
                dev.driver
            );
        }
        Ok(Env {
            boot,
            binder: Binder::system(),
            edu: edu.bdf,
            numa_edu: numa_edu.map(|d| d.bdf),
            hot_edu: hot_edu.map(|d| d.bdf),
            nvme: nvme.bdf,
            sysfs,
        })
    }

    /// Binds `bdf` to `driver`; the returned guard returns it to no driver.
    pub(crate) fn bind(&self, bdf: Bdf, driver: Driver) -> Result<Bound<'_>, Failure> {
        let report = self
            .binder
            .bind(bdf, driver, BindOptions::default())
            .context(|| format!("bind {bdf} to {driver}"))?;
        ensure!(
            report.driver == driver,
            "bind {bdf} to {driver} reported {}",
            report.driver
        );
        let now = self
            .sysfs
            .driver(bdf)
            .context(|| format!("read the driver of {bdf}"))?;
        ensure!(
            now.as_deref() == Some(driver.name()),
            "after binding {bdf} to {driver}, sysfs says its driver is {now:?}"
        );
        Ok(Bound {
            env: self,
            bdf,
            released: false,
        })
    }

    /// `/sys/bus/pci/devices/<bdf>/<name>`.
    pub(crate) fn device_file(&self, bdf: Bdf, name: &str) -> PathBuf {
        self.sysfs.device_dir(bdf).join(name)
    }
}

/// The one device `matches` selects.
fn only<'a>(
    devices: &'a [DeviceInfo],
    what: &str,
    matches: impl Fn(&DeviceInfo) -> bool,
) -> Result<&'a DeviceInfo, Failure> {
    let found: Vec<&DeviceInfo> = devices.iter().filter(|d| matches(d)).collect();
    match found.as_slice() {
        [one] => Ok(one),
        [] => Err(Failure::Check(format!(
            "found no {what} among {} PCI functions ({}): is QEMU started with it?",
            devices.len(),
            devices
                .iter()
                .map(|d| format!("{} {:04x}:{:04x}", d.bdf, d.vendor, d.device))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        many => Err(Failure::Check(format!(
            "found {} of {what}, want exactly one",
            many.len()
        ))),
    }
}

/// A device bound to a user-space driver by a case; unbound (back to no driver) by
/// [`Bound::release`], or on drop when the case ended early.
#[derive(Debug)]
pub(crate) struct Bound<'env> {
    env: &'env Env,
    bdf: Bdf,
    released: bool,
}

impl Bound<'_> {
    /// The case unbound the device itself (through `env.binder`): nothing is left to undo.
    pub(crate) fn unbound_by_case(mut self) {
        self.released = true;
    }

    /// Unbinds the device and checks that no driver claimed it.
    pub(crate) fn release(mut self) -> Result<(), Failure> {
        self.released = true;
        let bdf = self.bdf;
        let report = self
            .env
            .binder
            .unbind(bdf)
            .context(|| format!("unbind {bdf}"))?;
        ensure!(
            report.to.is_none(),
            "after unbinding {bdf} from {:?} it is bound to {:?}, want no driver",
            report.from,
            report.to
        );
        Ok(())
    }
}

impl Drop for Bound<'_> {
    fn drop(&mut self) {
        if !self.released {
            // The case failed before releasing the device: put it back so the next case starts
            // from the same state, and say so if that fails too (the next case will then fail
            // with its own reason).
            if let Err(err) = self.env.binder.unbind(self.bdf) {
                println!(
                    "INFO could not unbind {} after a failed case: {err}",
                    self.bdf
                );
            }
        }
    }
}
