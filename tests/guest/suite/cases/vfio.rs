//! edu through `vfio-pci`, all through `device::Vfio`: region and IRQ info, BAR0 registers,
//! DMA through the device's DMA space (type1, or physical in no-IOMMU mode) with pool buffers,
//! MSI and INTx completions through eventfds, reset, a container shared by two devices, the
//! IOMMU refusing what is not mapped, and `device::open` picking the backend.
//!
//! Memory and pools come from a `userdma::Runtime` that owns the opened device; the cases whose
//! point is the layer below (the type1 mapping itself, the IOMMU refusing an unmapped IOVA) map
//! regions into the device's `dma::Space` by hand.

use std::sync::Arc;
use std::time::Duration;

use userdma::device::vfio::{IrqKind, Mode, Options};
use userdma::device::{self, Device, Kind, Vfio};
use userdma::dma::{self, IovaRange, Slice};
use userdma::memory::PageSize;
use userdma::pci::Driver;
use userdma::pool::Config;
use userdma::sys::pci::{PCI_COMMAND, PCI_COMMAND_MASTER, PCI_DEVICE_ID, PCI_VENDOR_ID};
use userdma::sys::vfio::{
    VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_MSI_IRQ_INDEX,
};
use userdma::Runtime;

use super::{check_canary, compare, pattern, region, round_trip, Buffer, CANARY, GUARD, TRANSFER};
use crate::edu::{self, Direction, Edu};
use crate::env::{Bound, Env};
use crate::failure::{ensure, Context, Failure};

const HUGE: usize = 2 << 20;
const HALF: usize = HUGE / 2;
/// The pool's region: four 2 MiB chunks, enough for a slab of each of two small classes (a
/// class keeps whole chunks for its slabs) and a whole-chunk buffer.
const POOL_LEN: usize = 4 * HUGE;
/// How long an interrupt may take.
const IRQ_TIMEOUT: Duration = Duration::from_secs(5);

/// The options every case opens edu with: its 28-bit mask, and no-IOMMU allowed in the boot
/// that has no IOMMU.
pub(super) fn options(env: &Env) -> Options {
    Options::new()
        .dma_mask_bits(edu::DMA_MASK_BITS)
        .allow_noiommu(!env.boot.has_iommu())
}

/// edu bound to `vfio-pci` and opened with `options`, and its BAR0.
pub(super) fn open<'e>(
    env: &'e Env,
    options: &Options,
) -> Result<(Bound<'e>, Arc<Vfio>, Edu), Failure> {
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let vfio =
        Vfio::open_with(env.edu, options).context(|| format!("open {} through VFIO", env.edu))?;
    let bar = vfio.bar(0).context(|| "BAR0 of edu".to_owned())?;
    let edu = Edu::new(bar)?;
    Ok((bound, Arc::new(vfio), edu))
}

/// A runtime that owns `vfio` (the case keeps its own handle for what only VFIO has).
pub(super) fn runtime(vfio: &Arc<Vfio>) -> Runtime {
    Runtime::from_device(Arc::clone(vfio) as Arc<dyn Device>)
}

/// Opening by BDF: the mode fits the boot, region info (BAR0 mappable and whole, config space),
/// IRQ info (MSI), configuration space reads and bus mastering, and edu's ID, liveness and
/// factorial registers through the BAR0 block.
pub(crate) fn open_and_info(env: &Env) -> Result<(), Failure> {
    let (bound, vfio, device) = open(env, &options(env))?;
    let want = env.boot.vfio_mode();
    ensure!(vfio.mode() == want, "mode {:?}, want {want:?}", vfio.mode());
    ensure!(vfio.bdf() == env.edu, "bdf {}", vfio.bdf());
    let bar0 = vfio
        .regions()
        .iter()
        .find(|r| r.index == VFIO_PCI_BAR0_REGION_INDEX)
        .ok_or_else(|| Failure::Check("no BAR0 region".to_owned()))?;
    ensure!(
        bar0.size == edu::BAR0_LEN && bar0.mappable() && bar0.readable() && bar0.writable(),
        "BAR0 region {bar0:?}: want {:#x} bytes, read/write/mmap",
        edu::BAR0_LEN
    );
    let mapped = vfio.bar_mapped_len(0).context(|| "map BAR0".to_owned())?;
    ensure!(
        u64::try_from(mapped).ok() == Some(edu::BAR0_LEN),
        "{mapped:#x} bytes of BAR0 mapped, want all of it"
    );
    let config = vfio
        .regions()
        .iter()
        .find(|r| r.index == VFIO_PCI_CONFIG_REGION_INDEX)
        .ok_or_else(|| Failure::Check("no config region".to_owned()))?;
    ensure!(config.size >= 256, "config region {config:?}");
    let msi = vfio
        .irqs()
        .iter()
        .find(|i| i.index == VFIO_PCI_MSI_IRQ_INDEX)
        .ok_or_else(|| Failure::Check("no MSI irq index".to_owned()))?;
    ensure!(
        msi.count >= 1 && msi.eventfd(),
        "MSI info {msi:?}: want at least one vector, eventfd"
    );
    let vendor: u16 = vfio
        .config_read(PCI_VENDOR_ID)
        .context(|| "read the vendor ID".to_owned())?;
    let device_id: u16 = vfio
        .config_read(PCI_DEVICE_ID)
        .context(|| "read the device ID".to_owned())?;
    ensure!(
        (vendor, device_id) == (edu::VENDOR, edu::DEVICE),
        "config space says {vendor:04x}:{device_id:04x}"
    );
    let (on, command) = bus_master(&vfio)?;
    ensure!(
        on,
        "bus mastering is off after open (command {command:#06x})"
    );
    vfio.set_bus_master(false)
        .context(|| "turn bus mastering off".to_owned())?;
    let (on, off) = bus_master(&vfio)?;
    ensure!(!on, "command {off:#06x}");
    vfio.set_bus_master(true)
        .context(|| "turn bus mastering on".to_owned())?;
    let id = device.check_registers()?;
    ensure!(
        id == edu::ID_VALUE,
        "ID register {id:#010x}, want {:#010x}",
        edu::ID_VALUE
    );
    let regions: Vec<String> = vfio
        .regions()
        .iter()
        .filter(|r| r.size > 0)
        .map(|r| format!("{}:{:#x}[{}]", r.index, r.size, r.flag_names()))
        .collect();
    let irqs: Vec<String> = vfio
        .irqs()
        .iter()
        .map(|i| format!("{}:{}[{}]", i.index, i.count, i.flag_names()))
        .collect();
    println!(
        "INFO vfio-open: {:?} group {:?}, ID {id:#010x}, regions {}, irqs {}",
        vfio.mode(),
        vfio.group(),
        regions.join(" "),
        irqs.join(" ")
    );
    drop(device);
    drop(vfio);
    bound.release()
}

/// DMA through the device's translated space (VFIO type1, or the iommufd IOAS in the iommufd
/// boot): hugepage and base-page regions mapped at IOVAs under edu's 28-bit mask; edu copies
/// RAM -> device -> RAM by IOVA; unmapping leaves nothing mapped.
pub(crate) fn type1_dma(env: &Env) -> Result<(), Failure> {
    let (bound, vfio, device) = open(env, &options(env))?;
    let space = vfio.dma_space();
    let want = env.boot.dma_kind();
    ensure!(
        space.kind() == want && space.dma_mask_bits() == edu::DMA_MASK_BITS,
        "DMA space {} with {} bits, want {want} with 28",
        space.kind(),
        space.dma_mask_bits()
    );
    let limit = 1_u64 << edu::DMA_MASK_BITS;
    let huge = space
        .map(region(HUGE, PageSize::Huge2M)?)
        .context(|| "map a 2 MiB hugepage region".to_owned())?;
    let range = huge
        .iova_range()
        .ok_or_else(|| Failure::Check("a type1 mapping should be one IOVA range".to_owned()))?;
    ensure!(
        range.start % (HUGE as u64) == 0 && range.last < limit,
        "hugepage mapping at IOVA {range}: want 2 MiB aligned and under the mask"
    );
    round_trip(
        &device,
        &Buffer::at(&huge, 0, TRANSFER)?,
        &Buffer::at(&huge, HALF, TRANSFER + GUARD)?,
        1,
    )?;
    round_trip(
        &device,
        &Buffer::at(&huge, 0x3001, TRANSFER)?,
        &Buffer::at(&huge, HUGE - TRANSFER - GUARD, TRANSFER + GUARD)?,
        2,
    )?;
    let small = space
        .map(region(64 << 10, PageSize::Base)?)
        .context(|| "map a 64 KiB base-page region".to_owned())?;
    let small_range = small.iova_range().ok_or_else(|| {
        Failure::Check("a type1 mapping of base pages should be one IOVA range".to_owned())
    })?;
    ensure!(
        !overlaps(&small_range, &range) && small_range.last < limit,
        "second mapping at {small_range} overlaps the first at {range} or passes the mask"
    );
    round_trip(
        &device,
        &Buffer::at(&small, 0x1000, TRANSFER)?,
        &Buffer::at(&huge, 0x8000, TRANSFER + GUARD)?,
        3,
    )?;
    round_trip(
        &device,
        &Buffer::at(&huge, 0x10000, TRANSFER)?,
        &Buffer::at(&small, 0x2000, TRANSFER + GUARD)?,
        4,
    )?;
    let stats = space.stats();
    ensure!(
        stats.maps == 2 && stats.live_bytes == (HUGE + (64 << 10)) as u64,
        "after two maps the space reports {stats:?}"
    );
    small.unmap().context(|| format!("unmap {small_range}"))?;
    huge.unmap().context(|| format!("unmap {range}"))?;
    let stats = space.stats();
    ensure!(
        stats.unmaps == 2 && stats.unmap_errors == 0 && stats.live_bytes == 0,
        "after unmapping both the space reports {stats:?}"
    );
    println!("INFO vfio-type1-dma: mappings at {range} and {small_range}");
    drop(device);
    drop(space);
    drop(vfio);
    bound.release()
}

/// Buffers from a `pool::Pool` over a mapping in the device's DMA space: small, mid and large
/// buffers carry IOVAs edu can use; dropping the pool unmaps its region.
pub(crate) fn pool_dma(env: &Env) -> Result<(), Failure> {
    let (bound, vfio, device) = open(env, &options(env))?;
    let runtime = runtime(&vfio);
    let space = Arc::clone(runtime.dma_space());
    let pool = runtime
        .pool_with(POOL_LEN, PageSize::Huge2M, Config::default())
        .context(|| format!("make a pool over {POOL_LEN:#x} bytes of hugepages"))?;
    let limit = 1_u64 << edu::DMA_MASK_BITS;
    let small = pool
        .alloc_owned(TRANSFER)
        .context(|| format!("allocate {TRANSFER} bytes"))?;
    let mid = pool
        .alloc_owned(64 << 10)
        .context(|| "allocate 64 KiB".to_owned())?;
    let large = pool
        .alloc_owned(HUGE)
        .context(|| "allocate 2 MiB (a whole chunk)".to_owned())?;
    let mut seen: Vec<IovaRange> = Vec::new();
    for (name, owned) in [("small", &small), ("64 KiB", &mid), ("2 MiB", &large)] {
        let buffer = owned.as_buffer();
        let len = buffer.capacity() as u64;
        let range = IovaRange::from_len(buffer.iova().raw(), len).ok_or_else(|| {
            Failure::Check(format!(
                "{name} buffer: IOVA {:#x} + {len:#x} wraps",
                buffer.iova()
            ))
        })?;
        ensure!(
            range.last < limit && buffer.contiguous_len() >= buffer.len(),
            "{name} buffer at IOVA {range}: past the mask or not contiguous"
        );
        ensure!(
            seen.iter().all(|other| !overlaps(other, &range)),
            "{name} buffer at IOVA {range} overlaps another buffer"
        );
        seen.push(range);
    }
    round_trip(
        &device,
        &Buffer::in_pool(small.as_buffer(), 0, TRANSFER)?,
        &Buffer::in_pool(mid.as_buffer(), 0, TRANSFER + GUARD)?,
        31,
    )?;
    round_trip(
        &device,
        &Buffer::in_pool(mid.as_buffer(), 0x8000, TRANSFER)?,
        &Buffer::in_pool(large.as_buffer(), HUGE - TRANSFER - GUARD, TRANSFER + GUARD)?,
        32,
    )?;
    let seen: Vec<String> = seen.iter().map(ToString::to_string).collect();
    println!(
        "INFO vfio-pool-dma: {} space, buffers at {}",
        space.kind(),
        seen.join(", ")
    );
    // The owned buffers hold the pool: the last one dropped drops it.
    drop(pool);
    drop(small);
    drop(mid);
    drop(large);
    let stats = space.stats();
    ensure!(
        stats.maps == 1 && stats.unmaps == 1 && stats.unmap_errors == 0 && stats.live_bytes == 0,
        "dropping the pool should unmap its region: the space reports {stats:?}"
    );
    drop(device);
    drop(space);
    drop(runtime);
    drop(vfio);
    bound.release()
}

/// MSI completion: edu is opened with one MSI vector; a DMA started with edu's interrupt bit
/// ends with an interrupt on the vector's eventfd (status bit 0x100, acknowledged at 0x64), and
/// the data arrived; a raised interrupt (0x60) arrives too; nothing arrives unasked.
pub(crate) fn msi(env: &Env) -> Result<(), Failure> {
    let options = options(env).interrupts(IrqKind::Msi, 1);
    let (bound, vfio, device) = open(env, &options)?;
    ensure!(
        vfio.vectors() == 1 && vfio.interrupt_kind() == Some(IrqKind::Msi),
        "{} vectors of {:?} enabled, want 1 MSI",
        vfio.vectors(),
        vfio.interrupt_kind()
    );
    let vector = vfio
        .interrupt(0)
        .context(|| "the MSI vector's eventfd".to_owned())?;
    let runtime = runtime(&vfio);
    let mapping = runtime
        .map_memory(HUGE, PageSize::Huge2M)
        .context(|| "map 2 MiB of hugepages".to_owned())?;
    let src = Buffer::at(&mapping, 0, TRANSFER)?;
    let dst = Buffer::at(&mapping, HALF, TRANSFER + GUARD)?;
    let data = pattern(41, TRANSFER);
    src.host
        .write_from(0, &data)
        .context(|| "fill the source buffer".to_owned())?;
    dst.host.fill(CANARY);
    let quiet = vector
        .wait(Some(Duration::from_millis(100)))
        .context(|| "wait on the MSI eventfd".to_owned())?;
    ensure!(
        quiet.is_none(),
        "an interrupt ({quiet:?}) before any was asked for"
    );
    let mut fired = Vec::new();
    for (direction, addr) in [
        (Direction::ToDevice, src.addr),
        (Direction::FromDevice, dst.addr),
    ] {
        let (took, count) = device.dma_irq(direction, addr, TRANSFER, &vector)?;
        let status = device.irq_status()?;
        ensure!(
            status & edu::IRQ_DMA != 0,
            "edu interrupt status {status:#x} after a DMA with the interrupt bit"
        );
        device.ack_irq(status)?;
        fired.push(format!("{direction:?} {count} in {} ms", took.as_millis()));
    }
    let mut back = vec![0_u8; TRANSFER];
    dst.host
        .read_into(0, &mut back)
        .context(|| "read the destination".to_owned())?;
    compare(&data, &back).map_err(|why| Failure::Check(format!("MSI round trip: {why}")))?;
    device.raise_irq(0x1)?;
    let raised = vector
        .wait(Some(IRQ_TIMEOUT))
        .context(|| "wait on the MSI eventfd".to_owned())?;
    ensure!(
        raised.is_some(),
        "no MSI within {IRQ_TIMEOUT:?} after raising interrupt 0x1"
    );
    device.ack_irq(0x1)?;
    match vfio.set_masked(0, true) {
        Err(device::Error::Vfio(device::vfio::Error::NotMaskable { .. })) | Ok(()) => {}
        Err(other) => {
            return Err(Failure::Device {
                op: "mask the MSI vector".to_owned(),
                source: Box::new(other),
            })
        }
    }
    vfio.disable_interrupts()
        .context(|| "disable interrupts".to_owned())?;
    ensure!(
        vfio.vectors() == 0,
        "{} vectors after disabling",
        vfio.vectors()
    );
    println!("INFO vfio-msi: {}", fired.join(", "));
    drop(mapping);
    drop(device);
    drop(runtime);
    drop(vfio);
    bound.release()
}

/// INTx through VFIO: the kernel masks the line when it fires, `set_masked(0, false)` unmasks
/// it, and a second interrupt arrives only after that.
pub(crate) fn intx(env: &Env) -> Result<(), Failure> {
    let options = options(env).interrupts(IrqKind::Intx, 1);
    let (bound, vfio, device) = open(env, &options)?;
    let vector = vfio
        .interrupt(0)
        .context(|| "the INTx eventfd".to_owned())?;
    let pending = device.irq_status()?;
    if pending != 0 {
        device.ack_irq(pending)?;
    }
    for bits in [0x1_u32, 0x80] {
        device.raise_irq(bits)?;
        let fired = vector
            .wait(Some(IRQ_TIMEOUT))
            .context(|| "wait on the INTx eventfd".to_owned())?;
        ensure!(
            fired.is_some(),
            "no INTx within {IRQ_TIMEOUT:?} after raising {bits:#x}"
        );
        device.ack_irq(bits)?;
        vfio.set_masked(0, false)
            .context(|| "unmask INTx".to_owned())?;
    }
    vfio.set_masked(0, true)
        .context(|| "mask INTx".to_owned())?;
    device.raise_irq(0x2)?;
    let masked = vector
        .wait(Some(Duration::from_millis(300)))
        .context(|| "wait on the INTx eventfd".to_owned())?;
    ensure!(
        masked.is_none(),
        "an INTx arrived while masked ({masked:?})"
    );
    vfio.set_masked(0, false)
        .context(|| "unmask INTx".to_owned())?;
    let late = vector
        .wait(Some(IRQ_TIMEOUT))
        .context(|| "wait on the INTx eventfd".to_owned())?;
    ensure!(
        late.is_some(),
        "the INTx raised while masked did not arrive after unmasking"
    );
    device.ack_irq(0x2)?;
    println!("INFO vfio-intx: two interrupts, one held while masked and delivered on unmask");
    drop(device);
    drop(vfio);
    bound.release()
}

/// Reset: with a function reset (`VFIO_DEVICE_FLAGS_RESET`), `reset` succeeds and the device
/// still answers, bus mastering back on; without one, `reset` fails with `NoReset`, which names
/// what a bus reset would touch.
pub(crate) fn reset(env: &Env) -> Result<(), Failure> {
    let (bound, vfio, device) = open(env, &options(env))?;
    let has_reset = vfio.device_flags() & userdma::sys::vfio::VFIO_DEVICE_FLAGS_RESET != 0;
    match vfio.reset() {
        Ok(()) => {
            ensure!(
                has_reset,
                "reset succeeded though the device has no reset flag"
            );
            device.check_registers()?;
            let (on, command) = bus_master(&vfio)?;
            ensure!(on, "bus mastering off after reset ({command:#06x})");
            println!("INFO vfio-reset: function reset done, registers answer");
        }
        Err(device::Error::NoReset { affected, .. }) => {
            ensure!(
                !has_reset,
                "reset failed with NoReset though the flag is set"
            );
            let text = device::Error::NoReset {
                bdf: env.edu,
                affected: affected.clone(),
            }
            .to_string();
            ensure!(text.contains(&env.edu.to_string()), "message {text:?}");
            device.check_registers()?;
            println!("INFO vfio-reset: no function reset; the error says: {text}");
        }
        Err(other) => {
            return Err(Failure::Device {
                op: "reset edu".to_owned(),
                source: Box::new(other),
            })
        }
    }
    drop(device);
    drop(vfio);
    bound.release()
}

/// One container shared by edu and the NVMe controller: both groups attached to it, one DMA
/// space (mapped once, reachable by edu), each group attached once.
pub(crate) fn shared_container(env: &Env) -> Result<(), Failure> {
    let container =
        device::vfio::Container::new().context(|| "open a VFIO container".to_owned())?;
    let options = options(env).container(Arc::clone(&container));
    let (bound, vfio, device) = open(env, &options)?;
    let nvme_bound = env.bind(env.nvme, Driver::VfioPci)?;
    let nvme = Vfio::open_with(env.nvme, &Options::new().container(Arc::clone(&container)))
        .context(|| format!("open {} in the same container", env.nvme))?;
    let groups = container.groups();
    ensure!(
        groups.len() == 2,
        "the container has groups {groups:?}, want edu's and the NVMe controller's"
    );
    ensure!(
        vfio.container()
            .is_some_and(|c| Arc::ptr_eq(&c, &container))
            && nvme
                .container()
                .is_some_and(|c| Arc::ptr_eq(&c, &container)),
        "a device reports another container"
    );
    // The NVMe controller's handle to the space, through a runtime that owns the device.
    let nvme = Runtime::from_device(Arc::new(nvme));
    let mapping = nvme
        .map_memory(HUGE, PageSize::Huge2M)
        .context(|| "map 2 MiB of hugepages through the NVMe controller's space".to_owned())?;
    // Mapped through the other device's handle to the space: edu reaches it.
    round_trip(
        &device,
        &Buffer::at(&mapping, 0, TRANSFER)?,
        &Buffer::at(&mapping, HALF, TRANSFER + GUARD)?,
        51,
    )?;
    let stats = vfio.dma_space().stats();
    ensure!(
        stats.maps == 1,
        "edu's space saw {stats:?}: not the same space"
    );
    println!("INFO vfio-shared-container: groups {groups:?} in one container, one space");
    drop(mapping);
    drop(nvme);
    nvme_bound.release()?;
    drop(device);
    drop(vfio);
    bound.release()?;
    ensure!(
        container.groups().is_empty(),
        "groups {:?} still attached after both devices closed",
        container.groups()
    );
    Ok(())
}

/// Whether the device's bus mastering is on, and its command register, from config space.
fn bus_master(vfio: &Vfio) -> Result<(bool, u16), Failure> {
    let command: u16 = vfio
        .config_read(PCI_COMMAND)
        .context(|| "read the command register".to_owned())?;
    Ok((command & PCI_COMMAND_MASTER != 0, command))
}

fn overlaps(a: &IovaRange, b: &IovaRange) -> bool {
    a.start <= b.last && b.start <= a.last
}

/// The IOMMU refuses a transfer to an IOVA that is not mapped: edu is told to write its buffer
/// to the physical address of a canary hugepage that is not mapped in the device's space (where
/// the bytes would land without translation), and no byte of the canary changes; a read from
/// there does not fetch the canary. The device still works afterwards.
pub(crate) fn isolation(env: &Env) -> Result<(), Failure> {
    let (bound, vfio, device) = open(env, &options(env))?;
    let space = vfio.dma_space();
    let mapped = space
        .map(region(HUGE, PageSize::Huge2M)?)
        .context(|| "map a 2 MiB hugepage region".to_owned())?;
    let range = mapped
        .iova_range()
        .ok_or_else(|| Failure::Check("a type1 mapping should be one IOVA range".to_owned()))?;
    let canary = region(HUGE, PageSize::Huge2M)?;
    let canary_view = Slice::from_region(&canary);
    canary_view.fill(CANARY);
    let phys = canary
        .physical_pages()
        .context(|| "read the canary's physical address".to_owned())?;
    let canary_phys = phys
        .addr_of(0)
        .ok_or_else(|| Failure::Check("the canary region has no physical page".to_owned()))?;
    let limit = 1_u64 << edu::DMA_MASK_BITS;
    let fits = |iova: u64| {
        IovaRange::from_len(iova, HUGE as u64)
            .is_some_and(|r| r.last < limit && !overlaps(&r, &range))
    };
    let (target, at_canary) = if fits(canary_phys) {
        (canary_phys, true)
    } else {
        let next = range.last.saturating_add(1);
        ensure!(
            fits(next),
            "no unmapped 2 MiB under the mask next to the mapping {range} (canary at {canary_phys:#x})"
        );
        (next, false)
    };
    let data = pattern(7, TRANSFER);
    let src = Buffer::at(&mapped, 0, TRANSFER)?;
    src.host
        .write_from(0, &data)
        .context(|| "fill the source buffer".to_owned())?;
    let dst = Buffer::at(&mapped, HALF, HALF)?;
    dst.host.fill(CANARY);
    device.dma(Direction::ToDevice, src.addr, TRANSFER)?;
    device.dma(Direction::FromDevice, target, TRANSFER)?;
    check_canary(&canary_view, "the unmapped canary hugepage")?;
    check_canary(&dst.host, "the mapped region's second half")?;
    device.dma(Direction::FromDevice, dst.addr, TRANSFER)?;
    let mut back = vec![0_u8; TRANSFER];
    dst.host
        .read_into(0, &mut back)
        .context(|| "read the destination buffer".to_owned())?;
    compare(&data, &back).map_err(|why| {
        Failure::Check(format!(
            "after the refused write, device -> mapped IOVA {:#x}: {why}",
            dst.addr
        ))
    })?;
    if at_canary {
        device.dma(Direction::ToDevice, target, TRANSFER)?;
        let probe = Buffer::at(&mapped, HALF + 0x10000, TRANSFER)?;
        probe.host.fill(0);
        device.dma(Direction::FromDevice, probe.addr, TRANSFER)?;
        let mut fetched = vec![0_u8; TRANSFER];
        probe
            .host
            .read_into(0, &mut fetched)
            .context(|| "read what the device fetched".to_owned())?;
        ensure!(
            fetched.iter().any(|&b| b != CANARY),
            "a DMA read from unmapped IOVA {target:#x} fetched the canary at that physical address"
        );
    }
    println!(
        "INFO vfio-isolation: write to unmapped IOVA {target:#x} ({}) refused, canary intact; mapping at {range}",
        if at_canary {
            "the canary's physical address"
        } else {
            "next to the mapping"
        }
    );
    drop(mapped);
    drop(device);
    drop(space);
    drop(vfio);
    bound.release()
}

/// No-IOMMU VFIO: refused without the opt-in; with it, the mode is no-IOMMU, the space is
/// physical, and DMA uses the physical addresses it gives.
pub(crate) fn noiommu_dma(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    match Vfio::open_with(env.edu, &Options::new().dma_mask_bits(edu::DMA_MASK_BITS)) {
        Err(device::Error::Vfio(device::vfio::Error::NoIommuRefused { .. })) => {}
        Err(other) => {
            return Err(Failure::Device {
                op: "open without the no-IOMMU opt-in".to_owned(),
                source: Box::new(other),
            })
        }
        Ok(_) => {
            return Err(Failure::Check(
                "a no-IOMMU group opened without Options::allow_noiommu".to_owned(),
            ))
        }
    }
    drop(bound);
    let (bound, vfio, device) = open(env, &options(env))?;
    ensure!(vfio.mode() == Mode::NoIommu, "mode {:?}", vfio.mode());
    let runtime = runtime(&vfio);
    let kind = runtime.dma_space().kind();
    ensure!(
        kind == dma::Kind::Physical,
        "a no-IOMMU device's space is {kind}"
    );
    // Locked by the runtime: nothing else pins memory a physical-address space hands out.
    let mapped = runtime
        .map_memory(HUGE, PageSize::Huge2M)
        .context(|| "map 2 MiB of hugepages (their physical address)".to_owned())?;
    let range = mapped
        .iova_range()
        .ok_or_else(|| Failure::Check("a hugepage should be physically contiguous".to_owned()))?;
    round_trip(
        &device,
        &Buffer::at(&mapped, 0, TRANSFER)?,
        &Buffer::at(&mapped, HALF, TRANSFER + GUARD)?,
        5,
    )?;
    println!("INFO vfio-noiommu-dma: hugepage at physical {range}");
    drop(mapped);
    drop(device);
    drop(runtime);
    drop(vfio);
    bound.release()
}

/// `device::open` picks the backend from the driver: an unbound device is an error naming
/// `userdma bind`; vfio-pci gives a VFIO device (refused in no-IOMMU mode, which needs the
/// explicit opt-in); uio_pci_generic a UIO device.
pub(crate) fn device_open(env: &Env) -> Result<(), Failure> {
    match device::open(env.edu) {
        Err(err @ device::Error::NotBound { .. }) => {
            let text = err.to_string();
            ensure!(
                text.contains("userdma bind") && text.contains(&env.edu.to_string()),
                "the unbound error should name the bind command: {text:?}"
            );
        }
        Err(other) => {
            return Err(Failure::Device {
                op: "open an unbound device".to_owned(),
                source: Box::new(other),
            })
        }
        Ok(dev) => {
            return Err(Failure::Check(format!(
                "an unbound device opened as {}",
                dev.identity()
            )))
        }
    }
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    match (device::open(env.edu), env.boot.has_iommu()) {
        (Ok(dev), true) => ensure!(
            dev.identity().kind == Kind::Vfio,
            "vfio-pci opened as {}",
            dev.identity()
        ),
        (Err(device::Error::Vfio(device::vfio::Error::NoIommuRefused { .. })), false) => {}
        (Err(other), _) => {
            return Err(Failure::Device {
                op: "device::open of a vfio-pci device".to_owned(),
                source: Box::new(other),
            })
        }
        (Ok(dev), false) => {
            return Err(Failure::Check(format!(
                "no-IOMMU device opened without the opt-in as {}",
                dev.identity()
            )))
        }
    }
    bound.release()?;
    let bound = env.bind(env.edu, Driver::UioPciGeneric)?;
    let dev = device::open(env.edu).context(|| "device::open of a UIO device".to_owned())?;
    ensure!(
        dev.identity().kind == Kind::Uio,
        "uio_pci_generic opened as {}",
        dev.identity()
    );
    drop(dev);
    bound.release()
}

/// NVMe controller registers the reset case uses: CAP (64 bits, never all zero), CC
/// (configuration; bit 0 enables), CSTS (status; bit 0 ready), AQA, ASQ, ACQ (admin queues).
const NVME_CAP: usize = 0x0;
const NVME_CC: usize = 0x14;
const NVME_CSTS: usize = 0x1c;
const NVME_AQA: usize = 0x24;
const NVME_ASQ: usize = 0x28;
const NVME_ACQ: usize = 0x30;
/// CC: enable, 64-byte SQ entries (IOSQES = 6), 16-byte CQ entries (IOCQES = 4).
const NVME_CC_ENABLE: u32 = 1 | (6 << 16) | (4 << 20);

/// A successful function reset, on the NVMe controller (which has one, unlike edu): the
/// controller is enabled (CSTS.RDY = 1; it reads no memory until a doorbell rings), `reset`
/// succeeds, and afterwards CC.EN and CSTS.RDY are 0 (only a reset or the host clears them), the
/// controller still answers (CAP), and bus mastering is back on.
pub(crate) fn reset_nvme(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.nvme, Driver::VfioPci)?;
    let options = Options::new().allow_noiommu(!env.boot.has_iommu());
    let vfio = Vfio::open_with(env.nvme, &options)
        .context(|| format!("open {} through VFIO", env.nvme))?;
    ensure!(
        vfio.device_flags() & userdma::sys::vfio::VFIO_DEVICE_FLAGS_RESET != 0,
        "the NVMe controller has no function reset (device flags {:#x})",
        vfio.device_flags()
    );
    let bar = vfio
        .bar(0)
        .context(|| "BAR0 of the NVMe controller".to_owned())?;
    let write32 = |offset: usize, value: u32| {
        bar.write::<u32>(offset, value)
            .context(|| format!("write NVMe register {offset:#x}"))
    };
    let write64 = |offset: usize, value: u64| {
        bar.write::<u64>(offset, value)
            .context(|| format!("write NVMe register {offset:#x}"))
    };
    let read32 = |offset: usize| {
        bar.read::<u32>(offset)
            .context(|| format!("read NVMe register {offset:#x}"))
    };
    let ready = |want: u32| -> Result<(), Failure> {
        let start = std::time::Instant::now();
        loop {
            let csts = read32(NVME_CSTS)?;
            if csts & 1 == want {
                return Ok(());
            }
            ensure!(
                start.elapsed() < Duration::from_secs(5),
                "CSTS {csts:#x}: RDY did not become {want} within 5 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    write32(NVME_CC, 0)?;
    ready(0)?;
    write32(NVME_AQA, 0x001f_001f)?;
    write64(NVME_ASQ, 0x10_0000)?;
    write64(NVME_ACQ, 0x20_0000)?;
    write32(NVME_CC, NVME_CC_ENABLE)?;
    ready(1)?;
    vfio.reset().context(|| format!("reset {}", env.nvme))?;
    let cc = read32(NVME_CC)?;
    let csts = read32(NVME_CSTS)?;
    ensure!(
        cc & 1 == 0 && csts & 1 == 0,
        "after the reset CC is {cc:#x} and CSTS {csts:#x} (want EN and RDY clear)"
    );
    let cap: u64 = bar.read(NVME_CAP).context(|| "read CAP".to_owned())?;
    ensure!(
        cap != 0 && cap != u64::MAX,
        "CAP reads {cap:#x} after the reset"
    );
    let (on, command) = bus_master(&vfio)?;
    ensure!(on, "bus mastering off after reset ({command:#06x})");
    println!("INFO vfio-reset-nvme: enabled, reset: CC {cc:#x}, CSTS {csts:#x}, CAP {cap:#x}");
    drop(bar);
    drop(vfio);
    bound.release()
}
