//! Hot-unplug of a VFIO device while it streams DMA: the second edu (on a hot-pluggable root
//! port, QEMU id `hotedu`) is removed through QEMU's QMP `device_del`, which the harness sends
//! when the guest prints `USERDMA-DEVICE-DEL hotedu`. The guest kernel's PCIe hotplug driver
//! then removes the function, vfio-pci asks the process for the device back (its request
//! interrupt), and the library lets go of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::vfio::Options;
use userdma::device::{self, Device, Vfio};
use userdma::memory::PageSize;
use userdma::pci::Driver;
use userdma::pool::Config;

use super::vfio::runtime;
use super::{round_trip, Buffer, GUARD, TRANSFER};
use crate::edu::{self, Edu};
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};

/// The QEMU id of the hot-pluggable edu (`tests/guest/run.sh`).
const QEMU_ID: &str = "hotedu";
/// Round trips before the removal is asked for.
const BEFORE: u32 = 3;
/// How long the removal may take to reach the process after it was asked for (under a second
/// measured, QEMU's `device_del` to the report); the rest is margin for software emulation.
const REMOVAL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the removal's report may come after the device stops answering (the library cuts
/// the BARs off first).
const REPORT_GRACE: Duration = Duration::from_secs(5);
/// How long the kernel may take to finish the removal once the process let go.
const GONE_TIMEOUT: Duration = Duration::from_secs(30);

/// edu on the hot-pluggable port, bound to vfio-pci and opened through `device::Vfio`, streams
/// round trips through pool buffers; the guest asks the host to unplug it and streams on. The
/// device's `Events` report the removal within [`REMOVAL_TIMEOUT`] (the round trips up to then
/// check byte for byte; the one the removal interrupts may fail, and only if the removal is
/// reported within [`REPORT_GRACE`] of it); the first event is the removal; afterwards BAR0
/// reads all-ones and the device's calls fail with `Removed`; every buffer and mapping is
/// dropped, each mapping unmapped (or its unmap refused because the kernel already dropped it),
/// and no page is left pinned; and the function disappears from `/sys/bus/pci/devices` within
/// [`GONE_TIMEOUT`].
pub(crate) fn hot_unplug(env: &Env) -> Result<(), Failure> {
    let bdf = env
        .hot_edu
        .ok_or_else(|| Failure::Check(format!("boot {} has no hot-pluggable edu", env.boot)))?;
    let bound = env.bind(bdf, Driver::VfioPci)?;
    let options = Options::new().dma_mask_bits(edu::DMA_MASK_BITS);
    let vfio =
        Arc::new(Vfio::open_with(bdf, &options).context(|| format!("open {bdf} through VFIO"))?);
    let device = Edu::new(vfio.bar(0).context(|| format!("BAR0 of {bdf}"))?)?;
    let mut events = vfio
        .events()
        .context(|| format!("subscribe to {bdf}'s events"))?;
    let locked_before = locked_kib()?;
    let rt = runtime(&vfio);
    let space = Arc::clone(rt.dma_space());
    let pool = rt
        .pool_with(4 << 20, PageSize::Huge2M, Config::default())
        .context(|| "make a pool over 4 MiB of hugepages".to_owned())?;
    let src = pool
        .alloc_owned(TRANSFER)
        .context(|| format!("allocate {TRANSFER} bytes"))?;
    let dst = pool
        .alloc_owned(TRANSFER + GUARD)
        .context(|| format!("allocate {} bytes", TRANSFER + GUARD))?;
    let trip = |seed: u32| {
        round_trip(
            &device,
            &Buffer::in_pool(src.as_buffer(), 0, TRANSFER)?,
            &Buffer::in_pool(dst.as_buffer(), 0, TRANSFER + GUARD)?,
            seed,
        )
    };
    for i in 0..BEFORE {
        trip(900 + i)?;
    }
    ensure!(
        !events.removed(),
        "{bdf} reported removed before it was asked for"
    );
    // The harness answers this line with QMP device_del.
    println!("USERDMA-DEVICE-DEL {QEMU_ID}");
    let asked = Instant::now();
    let mut after = 0_u32;
    let mut interrupted = None;
    while !events.removed() {
        ensure!(
            asked.elapsed() < REMOVAL_TIMEOUT,
            "{bdf} not reported removed {REMOVAL_TIMEOUT:?} after device_del was asked for ({after} round trips since)"
        );
        match trip(1000 + after) {
            Ok(()) => after += 1,
            // The round trip the removal cut short: fine once the removal is reported, which
            // comes just after the BARs are cut off (read all-ones).
            Err(failure) => {
                let event = events
                    .wait(Some(REPORT_GRACE))
                    .context(|| "wait for the removal event".to_owned())?;
                ensure!(
                    event == Some(device::Event::Removal),
                    "round trip {after} after device_del was asked for failed ({}), and no removal was reported within {REPORT_GRACE:?} (event {event:?})",
                    failure.chain()
                );
                interrupted = Some(failure.chain());
            }
        }
    }
    let seen = asked.elapsed();
    if interrupted.is_none() {
        let event = events
            .wait(Some(Duration::ZERO))
            .context(|| "read the removal event".to_owned())?;
        ensure!(
            event == Some(device::Event::Removal),
            "the first event after the removal is {event:?}"
        );
    }

    // Cut off: BAR0 reads all-ones, the device's calls fail with Removed.
    let id = device.id()?;
    ensure!(
        id == u32::MAX,
        "edu's ID register reads {id:#010x} after the removal, want all-ones"
    );
    match vfio.reset() {
        Err(device::Error::Removed { .. }) => {}
        other => {
            return Err(Failure::Check(format!(
                "reset of a removed device gave {other:?}, want Removed"
            )))
        }
    }
    match vfio.bar(0) {
        Err(device::Error::Removed { .. }) => {}
        other => {
            return Err(Failure::Check(format!(
                "BAR0 of a removed device gave {other:?}, want Removed"
            )))
        }
    }

    // Stop cleanly: every buffer, the pool, the mappings, the device.
    drop((src, dst));
    drop(pool);
    drop(device);
    drop(rt);
    drop(events);
    drop(vfio);
    // Each mapping was unmapped: by the library, or by the kernel first (with the device gone its
    // group left the type1 container, whose IOMMU the kernel released with every mapping; the
    // library's VFIO_IOMMU_UNMAP_DMA then fails with EINVAL, and the space, finding the
    // container without its IOMMU, counts it done and in `unmaps_after_removal`; or, caught
    // between the kernel dropping the mappings and releasing the IOMMU, it unmaps nothing and
    // counts the same way). No unmap is an
    // error, and the pages are unpinned, which the process's locked memory shows (type1 counts
    // pinned pages there; hugepages are not counted by mlock).
    let stats = space.stats();
    ensure!(
        stats.maps == stats.unmaps && stats.unmap_errors == 0 && stats.live_bytes == 0,
        "after dropping everything the DMA space reports {stats:?}: a mapping was not unmapped, or \
         an unmap the kernel had done already was counted as an error"
    );
    drop(space);
    let locked_after = locked_kib()?;
    ensure!(
        locked_after <= locked_before,
        "{} KiB still pinned after the device and its mappings were dropped (VmLck {locked_before} KiB before, {locked_after} KiB after)",
        locked_after - locked_before
    );

    // The kernel finishes the removal.
    let dir = env.sysfs.device_dir(bdf);
    let start = Instant::now();
    while dir.exists() {
        ensure!(
            start.elapsed() < GONE_TIMEOUT,
            "{} still exists {GONE_TIMEOUT:?} after the device was released",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let gone = start.elapsed();
    // Nothing is left to unbind.
    bound.unbound_by_case();
    println!(
        "INFO vfio-hot-unplug: {BEFORE} round trips, device_del asked, {after} more round trips; removal reported after {} ms{}; of {} mappings {} unmapped by the library{}; {bdf} gone from sysfs {} ms after the release",
        seen.as_millis(),
        interrupted.map_or_else(String::new, |why| format!(" (the round trip in flight failed: {why})")),
        stats.maps,
        stats.unmaps.saturating_sub(stats.unmaps_after_removal),
        if stats.unmaps_after_removal == 0 {
            String::new()
        } else {
            format!(
                ", {} by the kernel first (it dropped them with the container's IOMMU)",
                stats.unmaps_after_removal
            )
        },
        gone.as_millis()
    );
    Ok(())
}

/// The process's locked memory (`VmLck` in `/proc/self/status`), in KiB.
fn locked_kib() -> Result<u64, Failure> {
    let status = std::fs::read_to_string("/proc/self/status")
        .context(|| "read /proc/self/status".to_owned())?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| Failure::Check("no VmLck line in /proc/self/status".to_owned()))
}
