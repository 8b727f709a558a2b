//! edu through `uio_pci_generic`, all through `device::Uio`: BAR0 through sysfs `resource0`,
//! DMA by physical address where nothing translates it (memory from a `userdma::Runtime` that
//! owns the device), refused (with the reason) where the IOMMU does, and INTx through
//! `/dev/uioN` as an eventfd.

use std::sync::Arc;
use std::time::Duration;

use userdma::device::{self, Device, Uio};
use userdma::dma::{self, Physical, Space};
use userdma::memory::PageSize;
use userdma::pci::Driver;
use userdma::Runtime;

use super::{check_canary, compare, pattern, region, round_trip, Buffer, CANARY, GUARD, TRANSFER};
use crate::edu::{self, Direction, Edu};
use crate::env::{Bound, Env};
use crate::failure::{ensure, Context, Failure};

const HUGE: usize = 2 << 20;
const HALF: usize = HUGE / 2;
/// How long an interrupt may take to arrive.
const IRQ_TIMEOUT: Duration = Duration::from_secs(5);

/// edu bound to `uio_pci_generic` and opened with its 28-bit mask, and its BAR0.
fn open(env: &Env) -> Result<(Bound<'_>, Uio, Edu), Failure> {
    let bound = env.bind(env.edu, Driver::UioPciGeneric)?;
    let uio = Uio::open_with(env.edu, edu::DMA_MASK_BITS)
        .context(|| format!("open {} through UIO", env.edu))?;
    let edu = Edu::new(uio.bar(0).context(|| "BAR0 of edu".to_owned())?)?;
    Ok((bound, uio, edu))
}

/// BAR0 mapped from sysfs `resource0` answers as edu's registers do; the node is `/dev/uioN`.
pub(crate) fn bar0_map(env: &Env) -> Result<(), Failure> {
    let (bound, uio, device) = open(env)?;
    ensure!(
        uio.node().exists() && uio.node().ends_with(format!("uio{}", uio.number())),
        "node {} (number {})",
        uio.node().display(),
        uio.number()
    );
    let id = device.check_registers()?;
    ensure!(
        id == edu::ID_VALUE,
        "ID register {id:#010x}, want {:#010x}",
        edu::ID_VALUE
    );
    ensure!(uio.bar(1).is_err(), "edu has only BAR0, but BAR1 opened");
    println!(
        "INFO uio-bar0-map: {}, ID register {id:#010x}",
        uio.node().display()
    );
    drop(device);
    drop(uio);
    bound.release()
}

/// With nothing translating edu's DMA, the device's DMA space (physical) gives addresses edu
/// reaches: a hugepage region, and base pages (one translation per page).
pub(crate) fn physical_dma(env: &Env) -> Result<(), Failure> {
    let (bound, uio, device) = open(env)?;
    uio.check_dma()
        .context(|| "physical DMA should be allowed here".to_owned())?;
    let uio = Arc::new(uio);
    let runtime = Runtime::from_device(Arc::clone(&uio) as Arc<dyn Device>);
    let kind = runtime.dma_space().kind();
    ensure!(
        kind == dma::Kind::Physical,
        "a UIO device's space is {kind}"
    );
    // Locked by the runtime: nothing else pins memory a physical-address space hands out.
    let huge = runtime
        .map_memory(HUGE, PageSize::Huge2M)
        .context(|| "map 2 MiB of hugepages (their physical address)".to_owned())?;
    let range = huge
        .iova_range()
        .ok_or_else(|| Failure::Check("a hugepage should be physically contiguous".to_owned()))?;
    round_trip(
        &device,
        &Buffer::at(&huge, 0, TRANSFER)?,
        &Buffer::at(&huge, HALF, TRANSFER + GUARD)?,
        11,
    )?;
    let pages = runtime
        .map_memory(2 << 12, PageSize::Base)
        .context(|| "map two base pages (their physical addresses)".to_owned())?;
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
    drop(runtime);
    drop(uio);
    bound.release()
}

/// Behind a translating IOMMU the device's DMA space refuses to map, saying why, and indeed
/// physical addresses (from a `dma::Physical` made by hand) reach nothing.
pub(crate) fn dma_blocked(env: &Env) -> Result<(), Failure> {
    let (bound, uio, device) = open(env)?;
    match uio.check_dma() {
        Err(device::Error::Uio(device::uio::Error::IommuTranslates { .. })) => {}
        Err(other) => {
            return Err(Failure::Device {
                op: "check_dma".to_owned(),
                source: Box::new(other),
            })
        }
        Ok(()) => {
            return Err(Failure::Check(
                "check_dma allows physical DMA behind a translating IOMMU".to_owned(),
            ))
        }
    }
    match uio.dma_space().map(region(HUGE, PageSize::Huge2M)?) {
        Err(err) => {
            let text = failure_text(&err);
            ensure!(
                text.contains("iommu=pt"),
                "the refusal should say what to do: {text:?}"
            );
        }
        Ok(mapping) => {
            return Err(Failure::Check(format!(
                "the UIO space mapped {:?} behind a translating IOMMU",
                mapping.iova_range()
            )))
        }
    }
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
        "INFO uio-dma-blocked: refused by the device's space; physical {:#x} -> device -> physical {:#x} reached nothing",
        src.addr, dst.addr
    );
    drop(source);
    drop(target);
    drop(device);
    drop(uio);
    bound.release()
}

/// An error and its causes, on one line.
fn failure_text(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}

/// An interrupt edu raises (register 0x60) arrives as INTx on the device's vector eventfd: none
/// before it is raised, one after (with INTx masked by the kernel's handler), and again after
/// unmasking (`set_masked(0, false)` clears `INTX_DISABLE`) and raising again; the node's count
/// grows.
pub(crate) fn intx(env: &Env) -> Result<(), Failure> {
    let (bound, uio, device) = open(env)?;
    let vector = uio.interrupt(0).context(|| "the INTx eventfd".to_owned())?;
    let pending = device.irq_status()?;
    if pending != 0 {
        device.ack_irq(pending)?;
    }
    uio.set_masked(0, false)
        .context(|| "unmask INTx".to_owned())?;
    let spurious = vector
        .wait(Some(Duration::from_millis(200)))
        .context(|| "wait on the INTx eventfd".to_owned())?;
    ensure!(
        spurious.is_none(),
        "an interrupt ({spurious:?}) before any was raised"
    );
    let mut last = None;
    for bits in [0x1_u32, 0x80] {
        device.raise_irq(bits)?;
        let fired = vector
            .wait(Some(IRQ_TIMEOUT))
            .context(|| "wait on the INTx eventfd".to_owned())?;
        let status = device.irq_status()?;
        ensure!(
            fired.is_some(),
            "no interrupt within {IRQ_TIMEOUT:?} after raising {bits:#x} (edu interrupt status {status:#x})"
        );
        ensure!(
            status & bits == bits,
            "edu interrupt status {status:#x} after raising {bits:#x}"
        );
        ensure!(
            uio.intx_masked()
                .context(|| "read INTX_DISABLE".to_owned())?,
            "after an interrupt INTX_DISABLE is clear: uio_pci_generic's handler should have masked INTx"
        );
        let count = uio.irq_count();
        ensure!(
            last.is_none_or(|previous| count > previous),
            "interrupt count {count} did not grow from {last:?}"
        );
        last = Some(count);
        device.ack_irq(status)?;
        uio.set_masked(0, false)
            .context(|| "unmask INTx".to_owned())?;
    }
    println!(
        "INFO uio-intx: {} counted {} interrupts",
        uio.node().display(),
        last.unwrap_or(0)
    );
    drop(device);
    drop(uio);
    bound.release()
}
