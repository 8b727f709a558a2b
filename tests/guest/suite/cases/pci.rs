//! `pci::Sysfs` and `pci::Binder` against the guest's real kernel.

use std::path::Path;

use userdma::pci::{DeviceInfo, DmaPath, Driver, Iommu, ResourceKind};
use userdma::sys::vfio::{VFIO_GROUP_DIR, VFIO_NOIOMMU_GROUP_PREFIX};

use crate::edu;
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};
use crate::Boot;

/// Both devices are found with the identity, BARs, capabilities, IOMMU groups and DMA paths
/// QEMU and the boot's IOMMU setup give them.
pub(crate) fn discovery(env: &Env) -> Result<(), Failure> {
    let sysfs = &env.sysfs;
    let iommu = sysfs
        .iommu()
        .context(|| "read the IOMMU state".to_owned())?;
    let edu = sysfs
        .device(env.edu)
        .context(|| format!("read {}", env.edu))?;
    let nvme = sysfs
        .device(env.nvme)
        .context(|| format!("read {}", env.nvme))?;

    // edu: identity, one 1 MiB memory BAR, MSI (one vector) and an INTx pin, no MSI-X.
    ensure!(
        edu.class == edu::CLASS,
        "edu class {:#08x}, want {:#08x}",
        edu.class,
        edu::CLASS
    );
    ensure!(
        edu.header_type == Some(0),
        "edu header type {:?}, want Some(0)",
        edu.header_type
    );
    let bar0 = bar(&edu, 0)?;
    ensure!(
        bar0.is_mem() && !bar0.is_io() && !bar0.is_unassigned() && bar0.size() == edu::BAR0_LEN,
        "edu BAR0 is {bar0:?} (size {:#x}), want an assigned 1 MiB memory BAR",
        bar0.size()
    );
    ensure!(
        edu.capabilities.is_known(),
        "edu's capability list could not be read to its end: {:?}",
        edu.capabilities.walk
    );
    let msi = edu.capabilities.msi();
    ensure!(
        msi.is_some_and(|m| m.vectors >= 1 && !m.enabled),
        "edu MSI capability {msi:?}, want one present and not enabled"
    );
    ensure!(
        edu.capabilities.msix().is_none(),
        "edu has an MSI-X capability, it should have none"
    );
    ensure!(
        edu.has_intx() == Some(true),
        "edu interrupt pin: {:?}",
        edu.interrupt_pin
    );

    // NVMe: a 64-bit memory BAR0 holding the MSI-X table, PCI Express.
    let nbar0 = bar(&nvme, 0)?;
    ensure!(
        nbar0.is_mem() && nbar0.is_64bit() && nbar0.size() >= 0x1000,
        "NVMe BAR0 is {nbar0:?} (size {:#x}), want a 64-bit memory BAR of at least 4 KiB",
        nbar0.size()
    );
    ensure!(
        nvme.capabilities.is_known(),
        "the NVMe capability list could not be read to its end: {:?}",
        nvme.capabilities.walk
    );
    let msix = nvme.capabilities.msix();
    ensure!(
        msix.is_some_and(|m| m.table_size >= 2 && !m.enabled && u64::from(m.table_offset) < nbar0.size()),
        "NVMe MSI-X capability {msix:?}, want one with an admin and an I/O vector, not enabled, its table inside BAR{}",
        msix.map_or(0, |m| m.table_bar)
    );
    ensure!(
        nvme.capabilities.express().is_some(),
        "the NVMe controller has no PCI Express capability"
    );

    check_iommu(env.boot, &iommu, &edu, &nvme)?;
    println!(
        "INFO pci-discovery: edu {} BAR0 {:#x}+{:#x} group {:?}; NVMe {} BAR0 {:#x}+{:#x}, {} MSI-X vectors, group {:?}; IOMMU units {:?}",
        edu.bdf,
        bar0.start(),
        bar0.size(),
        edu.iommu_group.as_ref().map(|g| (g.number, g.domain_type.clone())),
        nvme.bdf,
        nbar0.start(),
        nbar0.size(),
        msix.map_or(0, |m| m.table_size),
        nvme.iommu_group.as_ref().map(|g| g.number),
        iommu.units
    );
    Ok(())
}

/// The IOMMU groups and DMA paths each boot should give.
fn check_iommu(
    boot: Boot,
    iommu: &Iommu,
    edu: &DeviceInfo,
    nvme: &DeviceInfo,
) -> Result<(), Failure> {
    let edu_paths = edu.dma_paths(iommu);
    if !boot.has_iommu() {
        ensure!(
            !iommu.is_active(),
            "without a vIOMMU the kernel reports IOMMU units {:?} and {} groups",
            iommu.units,
            iommu.groups
        );
        ensure!(
            edu.iommu_group.is_none() && nvme.iommu_group.is_none(),
            "without a vIOMMU the devices are in groups {:?} / {:?}",
            edu.iommu_group,
            nvme.iommu_group
        );
        ensure!(
            iommu.noiommu_mode == Some(true),
            "VFIO's no-IOMMU mode reads {:?}, want Some(true) (vfio.ko with CONFIG_VFIO_NOIOMMU, enable_unsafe_noiommu_mode=1)",
            iommu.noiommu_mode
        );
        ensure!(
            edu_paths == [DmaPath::VfioNoIommu, DmaPath::Uio],
            "edu DMA paths {edu_paths:?}, want [VfioNoIommu, Uio]"
        );
        return Ok(());
    }
    ensure!(
        iommu.is_active() && !iommu.units.is_empty(),
        "the vIOMMU is not active: units {:?}, {} groups",
        iommu.units,
        iommu.groups
    );
    let (Some(edu_group), Some(nvme_group)) = (&edu.iommu_group, &nvme.iommu_group) else {
        return Err(Failure::Check(format!(
            "with a vIOMMU both devices need a group: edu {:?}, NVMe {:?}",
            edu.iommu_group, nvme.iommu_group
        )));
    };
    ensure!(
        edu_group.number != nvme_group.number,
        "edu and NVMe share group {}",
        edu_group.number
    );
    for (dev, group) in [(edu, edu_group), (nvme, nvme_group)] {
        ensure!(
            group.members.contains(&dev.bdf) && !group.noiommu,
            "group {} of {}: members {:?}, noiommu {}",
            group.number,
            dev.bdf,
            group.members,
            group.noiommu
        );
    }
    let domain = edu_group.domain_type.as_deref();
    if boot == Boot::IommuPt {
        ensure!(
            domain == Some("identity") && !edu_group.translates(),
            "with iommu=pt edu's group domain is {domain:?}, want identity"
        );
        ensure!(
            edu_paths == [DmaPath::Vfio, DmaPath::Uio],
            "edu DMA paths {edu_paths:?}, want [Vfio, Uio]"
        );
    } else {
        ensure!(
            domain.is_some_and(|d| d.starts_with("DMA")) && edu_group.translates(),
            "in translated mode edu's group domain is {domain:?}, want DMA or DMA-FQ"
        );
        ensure!(
            edu_paths == [DmaPath::Vfio],
            "edu DMA paths {edu_paths:?}, want [Vfio] (physical addresses would fault)"
        );
    }
    Ok(())
}

fn bar(dev: &DeviceInfo, index: u8) -> Result<userdma::pci::Resource, Failure> {
    dev.bars()
        .find(|r| r.kind() == ResourceKind::Bar(index))
        .copied()
        .ok_or_else(|| {
            Failure::Check(format!(
                "{} has no BAR{index}: resources {:?}",
                dev.bdf, dev.resources
            ))
        })
}

/// Binding edu to `vfio-pci` makes its group node; binding again changes nothing.
pub(crate) fn bind_vfio(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let info = env
        .sysfs
        .device(env.edu)
        .context(|| format!("read {}", env.edu))?;
    let group = info.iommu_group.as_ref().ok_or_else(|| {
        Failure::Check(format!(
            "{} is bound to vfio-pci but in no IOMMU group",
            env.edu
        ))
    })?;
    ensure!(
        group.noiommu != env.boot.has_iommu(),
        "group {} is {}a no-IOMMU group",
        group.number,
        if group.noiommu { "" } else { "not " }
    );
    let node = group_node(env, group.number);
    ensure!(
        node.exists(),
        "{} does not exist after binding",
        node.display()
    );
    if !env.boot.has_iommu() {
        let iommu = env
            .sysfs
            .iommu()
            .context(|| "read the IOMMU state".to_owned())?;
        let paths = info.dma_paths(&iommu);
        ensure!(
            paths == [DmaPath::VfioNoIommu, DmaPath::Uio] && !group.translates(),
            "edu in no-IOMMU group {}: DMA paths {paths:?}, translates {}",
            group.number,
            group.translates()
        );
    }
    let again = env
        .binder
        .bind(env.edu, Driver::VfioPci, Default::default())
        .context(|| format!("bind {} to vfio-pci again", env.edu))?;
    ensure!(
        again.changes.is_empty(),
        "binding an already bound device changed {:?}",
        again.changes
    );
    println!(
        "INFO pci-bind-vfio: {} -> vfio-pci, {}",
        env.edu,
        node.display()
    );
    bound.release()
}

/// Unbinding edu from `vfio-pci` returns it to no driver, clears the override, and removes the
/// group node.
pub(crate) fn unbind(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let info = env
        .sysfs
        .device(env.edu)
        .context(|| format!("read {}", env.edu))?;
    let group = info.iommu_group.map(|g| g.number);
    let report = env
        .binder
        .unbind(env.edu)
        .context(|| format!("unbind {}", env.edu))?;
    bound.unbound_by_case();
    ensure!(
        report.from.as_deref() == Some("vfio-pci") && report.to.is_none() && report.changed,
        "unbind report {report:?}, want from vfio-pci to no driver"
    );
    let driver = env
        .sysfs
        .driver(env.edu)
        .context(|| format!("read the driver of {}", env.edu))?;
    let over = env
        .sysfs
        .driver_override(env.edu)
        .context(|| format!("read driver_override of {}", env.edu))?;
    ensure!(
        driver.is_none() && over.is_none(),
        "after unbinding: driver {driver:?}, driver_override {over:?}, want neither"
    );
    if let Some(number) = group {
        let node = group_node(env, number);
        ensure!(
            !node.exists(),
            "{} still exists with no device bound to vfio-pci",
            node.display()
        );
    }
    Ok(())
}

/// Binding edu to `uio_pci_generic` gives it a `/dev/uioN` node, which unbinding removes.
pub(crate) fn bind_uio(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::UioPciGeneric)?;
    ensure!(
        has_uio_node(env),
        "{} has no uio directory after binding to uio_pci_generic",
        env.edu
    );
    let node =
        userdma::device::Uio::open(env.edu).context(|| format!("open {} through UIO", env.edu))?;
    ensure!(node.node().exists(), "{} vanished", node.node().display());
    println!(
        "INFO pci-bind-uio: {} -> uio_pci_generic, {}",
        env.edu,
        node.node().display()
    );
    drop(node);
    bound.release()?;
    ensure!(
        !has_uio_node(env),
        "{} still has a uio directory after unbinding",
        env.edu
    );
    Ok(())
}

/// The group node of group `number`: `/dev/vfio/N`, or `/dev/vfio/noiommu-N` in the boot
/// without an IOMMU.
fn group_node(env: &Env, number: u32) -> std::path::PathBuf {
    let name = if env.boot.has_iommu() {
        number.to_string()
    } else {
        format!("{VFIO_NOIOMMU_GROUP_PREFIX}{number}")
    };
    Path::new(VFIO_GROUP_DIR).join(name)
}

/// Whether edu has a `uio` directory (a `/dev/uioN` node) in sysfs now.
fn has_uio_node(env: &Env) -> bool {
    env.device_file(env.edu, "uio").is_dir()
}
