//! edu through `uio_pci_generic`: DMA by physical address (`dma::Physical`) where nothing
//! translates it, refused where the IOMMU does, and INTx through `/dev/uioN`.

use std::os::fd::AsFd;
use std::time::Duration;

use userdma::dma::{Physical, Space};
use userdma::memory::PageSize;
use userdma::pci::{Driver, ResourceKind};

use super::{check_canary, compare, pattern, region, round_trip, Buffer, CANARY, GUARD, TRANSFER};
use crate::edu::{self, Direction, Edu};
use crate::env::{Bound, Env};
use crate::failure::{ensure, Context, Failure};
use crate::mmap::Mmap;
use crate::uio::{self, Uio};

const HUGE: usize = 2 << 20;
const HALF: usize = HUGE / 2;
/// How long an interrupt may take to arrive.
const IRQ_TIMEOUT: Duration = Duration::from_secs(5);

/// edu bound to `uio_pci_generic`, BAR0 mapped, bus mastering on.
fn open(env: &Env) -> Result<(Bound<'_>, Edu), Failure> {
    let bound = env.bind(env.edu, Driver::UioPciGeneric)?;
    let device = uio::map_edu(env, env.edu)?;
    uio::enable_bus_master(env, env.edu)?;
    Ok((bound, device))
}

/// `uio_pci_generic` exports edu's BAR0 as map 0 of `/dev/uioN` (it exports 32-bit
/// non-prefetchable memory BARs): sysfs describes it at BAR0's address, and mapping it from the
/// node reaches edu's registers.
pub(crate) fn bar0_map(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::UioPciGeneric)?;
    let node = Uio::open(env, env.edu)?;
    let info = env
        .sysfs
        .device(env.edu)
        .context(|| format!("read {}", env.edu))?;
    let bar0 = info
        .bars()
        .find(|r| r.kind() == ResourceKind::Bar(0))
        .copied()
        .ok_or_else(|| Failure::Check(format!("{} has no BAR0", env.edu)))?;
    let map = uio::map_info(&node, 0)?;
    ensure!(
        map.addr + map.offset == bar0.start() && map.size >= bar0.size(),
        "map 0 of {} is {map:?}, BAR0 is {:#x}+{:#x}",
        node.path().display(),
        bar0.start(),
        bar0.size()
    );
    let len = usize::try_from(map.size)
        .map_err(|_| Failure::Check(format!("map size {:#x}", map.size)))?;
    // Map M of a UIO node is at offset M pages: map 0 at offset 0.
    let bar = Mmap::shared(node.node().as_fd(), 0, len)
        .context(|| format!("mmap map 0 of {}", node.path().display()))?;
    let device = Edu::new(bar)?;
    let id = device.check_registers()?;
    println!(
        "INFO uio-bar0-map: {} map 0 at {:#x}+{:#x}, ID register {id:#010x}",
        node.path().display(),
        map.addr,
        map.size
    );
    drop(device);
    drop(node);
    bound.release()
}

/// With nothing translating edu's DMA, it reaches pinned memory at the physical addresses
/// `dma::Physical` gives: a hugepage region, and base pages (one translation per page).
pub(crate) fn physical_dma(env: &Env) -> Result<(), Failure> {
    let (bound, device) = open(env)?;
    let space =
        Physical::new(edu::DMA_MASK_BITS).context(|| "make a physical DMA space".to_owned())?;
    let huge = space
        .map(region(HUGE, PageSize::Huge2M)?)
        .context(|| "look up the physical address of a hugepage region".to_owned())?;
    let range = huge
        .iova_range()
        .ok_or_else(|| Failure::Check("a hugepage should be physically contiguous".to_owned()))?;
    round_trip(
        &device,
        &Buffer::at(&huge, 0, TRANSFER)?,
        &Buffer::at(&huge, HALF, TRANSFER + GUARD)?,
        11,
    )?;
    // Two base pages: each has its own physical address, translated page by page.
    let pages = space
        .map(region(2 << 12, PageSize::Base)?)
        .context(|| "look up the physical addresses of two base pages".to_owned())?;
    round_trip(
        &device,
        &Buffer::at(&pages, 0x100, TRANSFER)?,
        &Buffer::at(&pages, 0x1000 + 0x200, TRANSFER + GUARD)?,
        12,
    )?;
    round_trip(
        &device,
        &Buffer::at(&pages, 0x1000, TRANSFER)?,
        &Buffer::at(&huge, 0x4000, TRANSFER + GUARD)?,
        13,
    )?;
    let pieces: Vec<String> = pages.segments().map(|(_, r)| r.to_string()).collect();
    println!("INFO uio-physical-dma: hugepage at physical {range}, base pages at {pieces:?}");
    drop(pages);
    drop(huge);
    drop(device);
    bound.release()
}

/// Behind a translating IOMMU, physical addresses are not what the device may use: edu's
/// transfers from and to the physical addresses of pinned memory reach neither.
pub(crate) fn dma_blocked(env: &Env) -> Result<(), Failure> {
    let (bound, device) = open(env)?;
    let space =
        Physical::new(edu::DMA_MASK_BITS).context(|| "make a physical DMA space".to_owned())?;
    let source = space
        .map(region(HUGE, PageSize::Huge2M)?)
        .context(|| "look up the physical address of a hugepage region".to_owned())?;
    let target = space
        .map(region(HUGE, PageSize::Huge2M)?)
        .context(|| "look up the physical address of a second hugepage region".to_owned())?;
    let data = pattern(21, TRANSFER);
    let src = Buffer::at(&source, 0, TRANSFER)?;
    src.host
        .write_from(0, &data)
        .context(|| "fill the source buffer".to_owned())?;
    let dst = Buffer::at(&target, 0, HUGE)?;
    dst.host.fill(CANARY);
    device.dma(Direction::ToDevice, src.addr, TRANSFER)?;
    device.dma(Direction::FromDevice, dst.addr, TRANSFER)?;
    check_canary(&dst.host, "the target hugepage (physical address)")?;
    let mut still = vec![0_u8; TRANSFER];
    src.host
        .read_into(0, &mut still)
        .context(|| "read the source buffer".to_owned())?;
    compare(&data, &still)
        .map_err(|why| Failure::Check(format!("the source buffer changed: {why}")))?;
    println!(
        "INFO uio-dma-blocked: physical {:#x} -> device -> physical {:#x} reached nothing",
        src.addr, dst.addr
    );
    drop(source);
    drop(target);
    drop(device);
    bound.release()
}

/// An interrupt edu raises (register 0x60) arrives through `/dev/uioN` as INTx: none before it
/// is raised, one after (with INTx masked by the kernel's handler), and the count goes up again
/// after unmasking (clearing `INTX_DISABLE`) and raising again.
pub(crate) fn intx(env: &Env) -> Result<(), Failure> {
    let (bound, device) = open(env)?;
    let mut node = Uio::open(env, env.edu)?;
    let pending = device.irq_status()?;
    if pending != 0 {
        device.ack_irq(pending)?;
    }
    node.unmask_intx()?;
    let spurious = node.wait_irq(Duration::from_millis(200))?;
    ensure!(
        spurious.is_none(),
        "{} reported an interrupt (count {spurious:?}) before any was raised",
        node.path().display()
    );
    let mut last = None;
    for bits in [0x1_u32, 0x80] {
        device.raise_irq(bits)?;
        let count = node.wait_irq(IRQ_TIMEOUT)?;
        let status = device.irq_status()?;
        let Some(count) = count else {
            return Err(Failure::Check(format!(
                "no interrupt on {} within {IRQ_TIMEOUT:?} after raising {bits:#x} (edu interrupt status {status:#x})",
                node.path().display()
            )));
        };
        ensure!(
            status & bits == bits,
            "edu interrupt status {status:#x} after raising {bits:#x}"
        );
        ensure!(
            node.intx_masked()?,
            "after an interrupt INTX_DISABLE is clear: uio_pci_generic's handler should have masked INTx"
        );
        ensure!(
            last.is_none_or(|previous| count > previous),
            "interrupt count {count} did not grow from {last:?}"
        );
        last = Some(count);
        device.ack_irq(status)?;
        let after = device.irq_status()?;
        ensure!(
            after == 0,
            "edu interrupt status {after:#x} after acknowledging {status:#x}"
        );
        node.unmask_intx()?;
    }
    println!(
        "INFO uio-intx: {} counted {} interrupts",
        node.path().display(),
        last.unwrap_or(0)
    );
    drop(node);
    drop(device);
    bound.release()
}
