//! Device removal on the real kernel: edu taken away (unbound) while the library has it open.
//!
//! - `vfio-unbind-while-open`: the kernel's unbind of a VFIO device waits until every open file
//!   of the device is closed, and asks the owner for it through the VFIO request interrupt. The
//!   library must answer: report the removal (an event, and a signal on every interrupt vector so
//!   that waits wake), turn bus mastering off, cut its BAR mappings off (they then read
//!   all-ones) and release the device fd, so that the unbind completes while the program is
//!   still running and holds its handles.
//! - `uio-unbind-while-open`: the uio core unregisters the device at once and fails the node;
//!   the library's interrupt relay sees it and reports the removal the same way.

use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::vfio::{IrqKind, Vfio};
use userdma::device::{self, Device, Event, Uio};
use userdma::memory::PageSize;
use userdma::pci::Driver;

use super::{compare, pattern, vfio, Buffer, CANARY, GUARD, TRANSFER};
use crate::edu::{self, Direction, Edu};
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};

/// How long the removal may take to reach the program, and the unbind to complete.
const REMOVAL_TIMEOUT: Duration = Duration::from_secs(20);

/// Unbinds edu from `vfio-pci` while it is open and streaming: the program learns of it, its
/// handles stop reaching the device, and the unbind completes without the program closing
/// anything.
pub(crate) fn vfio_unbind_while_open(env: &Env) -> Result<(), Failure> {
    let options = vfio::options(env).interrupts(IrqKind::Msi, 1);
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let vfio = Arc::new(
        Vfio::open_with(env.edu, &options).context(|| format!("open {} through VFIO", env.edu))?,
    );
    ensure!(
        vfio.watches_removal(),
        "the device does not watch the kernel's request interrupt (VFIO_PCI_REQ_IRQ_INDEX)"
    );
    let bar = vfio.bar(0).context(|| "BAR0 of edu".to_owned())?;
    let device = Edu::new(bar.clone())?;
    let vector = vfio
        .interrupt(0)
        .context(|| "the MSI vector's eventfd".to_owned())?;
    let mut events = vfio
        .events()
        .context(|| "subscribe to edu's events".to_owned())?;
    let runtime = vfio::runtime(&vfio);
    let mapping = runtime
        .map_memory(2 << 20, PageSize::Huge2M)
        .context(|| "map 2 MiB of hugepages".to_owned())?;
    // A good round trip first: the device works.
    let src = Buffer::at(&mapping, 0, TRANSFER)?;
    let dst = Buffer::at(&mapping, 1 << 20, TRANSFER + GUARD)?;
    let data = pattern(77, TRANSFER);
    src.host
        .write_from(0, &data)
        .context(|| "fill the source".to_owned())?;
    dst.host.fill(CANARY);
    device.dma(Direction::ToDevice, src.addr, TRANSFER)?;
    device.dma(Direction::FromDevice, dst.addr, TRANSFER)?;
    let mut back = vec![0u8; TRANSFER];
    dst.host
        .read_into(0, &mut back)
        .context(|| "read the destination".to_owned())?;
    compare(&data, &back).map_err(|why| Failure::Check(format!("before the unbind: {why}")))?;
    ensure!(events.try_next().is_none(), "an event before the unbind");
    let _ = vector.try_read();

    // The unbind blocks in the kernel until the device is released: run it beside the program.
    let start = Instant::now();
    let unbound = std::thread::scope(|scope| {
        let unbind = scope.spawn(|| {
            let result = env.binder.unbind(env.edu);
            (result, start.elapsed())
        });
        let event = events
            .wait(Some(REMOVAL_TIMEOUT))
            .context(|| "wait for edu's events".to_owned());
        let seen = start.elapsed();
        let (result, took) = unbind.join().expect("the unbind thread");
        (event, seen, result, took)
    });
    let (event, seen, result, took) = unbound;
    let event = event?;
    ensure!(
        event == Some(Event::Removal),
        "after the unbind began the device reported {event:?} within {REMOVAL_TIMEOUT:?}, want the removal"
    );
    let report = result.context(|| format!("unbind {} while it is open", env.edu))?;
    ensure!(
        report.to.is_none(),
        "after the unbind edu is bound to {:?}",
        report.to
    );
    ensure!(
        took < REMOVAL_TIMEOUT,
        "the unbind took {took:?}: the device was not released"
    );
    println!(
        "INFO vfio-unbind-while-open: removal seen after {} ms, unbind done after {} ms",
        seen.as_millis(),
        took.as_millis()
    );
    // The unbind finished while every handle is still held: the program let the device go.
    ensure!(vfio.is_removed(), "the device does not say it was removed");
    ensure!(
        vector
            .try_read()
            .context(|| "read the MSI eventfd".to_owned())?
            .is_some(),
        "the removal did not signal the interrupt vector (a wait on it would not wake)"
    );
    let id = bar
        .read::<u32>(0)
        .context(|| "read BAR0 after the removal".to_owned())?;
    ensure!(
        id == u32::MAX,
        "BAR0's ID register reads {id:#010x} after the removal, want all-ones"
    );
    // The factorial register: a write now reaches no device.
    bar.write::<u32>(0x08, 5)
        .context(|| "a write to BAR0 after the removal".to_owned())?;
    match vfio.reset() {
        Err(device::Error::Removed { .. }) => {}
        other => {
            return Err(Failure::Check(format!(
                "reset after the removal: {other:?}"
            )))
        }
    }
    match vfio.bar(0) {
        Err(device::Error::Removed { .. }) => {}
        other => {
            return Err(Failure::Check(format!(
                "a new BAR block after the removal: {other:?}"
            )))
        }
    }
    // Host memory is untouched by the cut-off, and dropping everything is clean.
    dst.host
        .read_into(0, &mut back)
        .context(|| "read the destination".to_owned())?;
    compare(&data, &back).map_err(|why| Failure::Check(format!("after the unbind: {why}")))?;
    drop(device);
    drop(bar);
    drop(mapping);
    drop(runtime);
    drop(vfio);
    let driver = env
        .sysfs
        .driver(env.edu)
        .context(|| format!("read the driver of {}", env.edu))?;
    ensure!(
        driver.is_none(),
        "edu is bound to {driver:?} after the case"
    );
    bound.unbound_by_case();
    Ok(())
}

/// Unbinds edu from `uio_pci_generic` while it is open: the relay sees the node fail and the
/// removal is reported; BAR0 then reads all-ones.
pub(crate) fn uio_unbind_while_open(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::UioPciGeneric)?;
    let uio = Uio::open_with(env.edu, edu::DMA_MASK_BITS)
        .context(|| format!("open {} through UIO", env.edu))?;
    let bar = uio.bar(0).context(|| "BAR0 of edu".to_owned())?;
    let device = Edu::new(bar.clone())?;
    let id = device.check_registers()?;
    let vector = uio.interrupt(0).context(|| "the INTx eventfd".to_owned())?;
    let mut events = uio
        .events()
        .context(|| "subscribe to edu's events".to_owned())?;
    ensure!(events.try_next().is_none(), "an event before the unbind");
    let _ = vector.try_read();
    let start = Instant::now();
    let report = env
        .binder
        .unbind(env.edu)
        .context(|| format!("unbind {} while it is open", env.edu))?;
    ensure!(
        report.to.is_none(),
        "after the unbind edu is bound to {:?}",
        report.to
    );
    let event = events
        .wait(Some(REMOVAL_TIMEOUT))
        .context(|| "wait for edu's events".to_owned())?;
    ensure!(
        event == Some(Event::Removal),
        "after the unbind the device reported {event:?} within {REMOVAL_TIMEOUT:?}, want the removal"
    );
    println!(
        "INFO uio-unbind-while-open: ID {id:#010x} before; removal seen after {} ms",
        start.elapsed().as_millis()
    );
    ensure!(
        vector
            .try_read()
            .context(|| "read the INTx eventfd".to_owned())?
            .is_some(),
        "the removal did not signal the interrupt vector"
    );
    let after = bar
        .read::<u32>(0)
        .context(|| "read BAR0 after the removal".to_owned())?;
    ensure!(
        after == u32::MAX,
        "BAR0's ID register reads {after:#010x} after the removal, want all-ones"
    );
    match uio.reset() {
        Err(device::Error::Removed { .. }) => {}
        other => {
            return Err(Failure::Check(format!(
                "reset after the removal: {other:?}"
            )))
        }
    }
    drop(device);
    drop(bar);
    drop(uio);
    bound.unbound_by_case();
    Ok(())
}

/// A bus (hot) reset of a device alone behind a root port (`Vfio::hot_reset`,
/// `VFIO_DEVICE_PCI_HOT_RESET`, proving ownership with the group fd or the iommufd): what
/// `reset` falls back to for a device without a function reset. The kernel offers it here (the
/// second edu, behind the expander bridge's root port, is alone on its bus; vfio-pci then also
/// counts the bus reset as the function's reset, so `reset` works too). The device answers
/// afterwards with bus mastering back on.
pub(crate) fn vfio_bus_reset(env: &Env) -> Result<(), Failure> {
    let bdf = env
        .numa_edu
        .ok_or_else(|| Failure::Check("this boot has no edu behind a root port".to_owned()))?;
    let bound = env.bind(bdf, Driver::VfioPci)?;
    let vfio =
        Vfio::open_with(bdf, &vfio::options(env)).context(|| format!("open {bdf} through VFIO"))?;
    let affected = vfio
        .hot_reset_devices()
        .context(|| "ask which devices a bus reset touches".to_owned())?;
    ensure!(
        affected.len() == 1 && affected[0].starts_with(&bdf.to_string()),
        "a bus reset of {bdf} would touch {affected:?}, want only edu"
    );
    let device = Edu::new(vfio.bar(0).context(|| "BAR0 of edu".to_owned())?)?;
    device.check_registers()?;
    let start = Instant::now();
    let done = vfio.hot_reset().context(|| format!("bus reset of {bdf}"))?;
    let took = start.elapsed();
    ensure!(done, "the bus reset of {bdf} was not possible");
    vfio.set_bus_master(true)
        .context(|| "turn bus mastering back on".to_owned())?;
    let id = device.check_registers()?;
    vfio.reset().context(|| format!("reset {bdf}"))?;
    device.check_registers()?;
    let command: u16 = vfio
        .config_read(userdma::sys::pci::PCI_COMMAND)
        .context(|| "read the command register".to_owned())?;
    ensure!(
        command & userdma::sys::pci::PCI_COMMAND_MASTER != 0,
        "bus mastering is off after the reset (command {command:#06x})"
    );
    println!(
        "INFO vfio-bus-reset: {bdf} reset through its root port in {} ms, ID {id:#010x} after",
        took.as_millis()
    );
    drop(device);
    drop(vfio);
    bound.release()
}
