//! The device itself ([`Loopback`]): starting its engine in a thread or a device process, its
//! BARs, queues and interrupts as the driver's [`Device`] trait asks, its own queue format
//! ([`NpuFormat`]), reset, removal and recovery.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[allow(clippy::wildcard_imports)] // the crate root's modules and the device's public types
use crate::*;

use crate::bar::{HostBar, MemoryBar, RegisterFile};
use crate::engine::Engine;
use crate::error::Error as LoopbackError;
use crate::ops::{Dram, Translate};
use crate::process::{Remote, RemoteSpace};
use crate::regs::{queue_field, unit_field, QueueControl, QueueStatus};
use crate::sync::Mutex;
use userdma::device::{Device, DoorbellRegs, Error as DeviceError, Identity, Kind, Source};
use userdma::dma::{self, Slice};
use userdma::irq::EventFd;
use userdma::memory::Region;
use userdma::mmio::{Block, DynBlock, Field, Readable, Value, Writable};
use userdma::ring::{self, Command, Layout, Memory, Status};

/// Where the engine runs, as the host tracks it.
#[derive(Debug)]
pub(crate) enum Runner {
    Thread(Mutex<Option<JoinHandle<()>>>),
    Process(Remote),
}

/// The software loopback device (see the module docs). Dropping it stops the engine.
#[derive(Debug)]
pub struct Loopback {
    pub(crate) identity: Identity,
    pub(crate) config: Config,
    pub(crate) file: Arc<RegisterFile>,
    pub(crate) registers: DynBlock,
    pub(crate) memory_bar: DynBlock,
    pub(crate) dram: Arc<Region>,
    pub(crate) space: Arc<dyn dma::Space>,
    pub(crate) irqs: Vec<EventFd>,
    pub(crate) runner: Runner,
    /// Removals ([`Loopback::remove`]) are reported through it.
    pub(crate) events: Source,
}

impl Loopback {
    /// Starts a loopback device.
    pub fn new(config: Config) -> Result<Loopback, DeviceError> {
        config.check()?;
        let file = Arc::new(RegisterFile::new()?);
        let dram = Arc::new(bar::shared_region(
            "device memory",
            config.memory_size,
            config.numa_node,
        )?);
        let cost = config.cost_model();
        let table = dma::SoftIommu::new(config.dma_mask_bits)
            .map_err(|source| DeviceError::Map {
                what: "translation table",
                source,
            })?
            .with_mapping_cost(cost.map_page_ns, cost.unmap_page_ns);
        let irqs = (0..u32::from(config.queues))
            .map(|vector| {
                EventFd::new().map_err(|source| DeviceError::Interrupt { vector, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let memory_bar = Block::new(MemoryBar::new(Arc::clone(&dram), Arc::clone(&file))?).erase();
        let events = Source::new(config.name.clone());
        for (vector, irq) in irqs.iter().enumerate() {
            events
                .watch_vector(irq)
                .map_err(|source| DeviceError::Interrupt {
                    vector: vector as u32,
                    source,
                })?;
        }
        let settings = config.settings();
        let (runner, space): (Runner, Arc<dyn dma::Space>) = match &config.mode {
            Mode::Thread => {
                let engine_irqs = irqs
                    .iter()
                    .enumerate()
                    .map(|(vector, irq)| {
                        irq.try_clone().map(OwnedFd::from).map_err(|source| {
                            DeviceError::Interrupt {
                                vector: vector as u32,
                                source,
                            }
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let engine = Engine::new(
                    settings,
                    Arc::clone(&file),
                    Dram {
                        ptr: dram.as_ptr(),
                        len: dram.len(),
                    },
                    Arc::new(table.clone()) as Arc<dyn Translate>,
                    engine_irqs,
                );
                let keep = Arc::clone(&dram);
                let cpu = config.engine_cpu;
                let (pinned_tx, pinned_rx) = std::sync::mpsc::sync_channel(1);
                let handle = std::thread::Builder::new()
                    .name(config.name.clone())
                    .spawn(move || {
                        let pinned = cpu.map_or(Ok(()), shim::pin_to_cpu).is_ok();
                        // The receiver waits for this one message below.
                        let _ = pinned_tx.send(pinned);
                        if pinned {
                            engine.run();
                        }
                        drop(keep);
                    })
                    .map_err(|source| LoopbackError::Thread { source })?;
                if pinned_rx.recv() != Ok(true) {
                    // The thread ends without running the engine (or died before telling).
                    let _ = handle.join();
                    return Err(config::bad_engine_cpu(cpu));
                }
                let space: Arc<dyn dma::Space> = Arc::new(table);
                (Runner::Thread(Mutex::new(Some(handle))), space)
            }
            Mode::Process(program) => {
                let hello = process::Hello {
                    settings: &settings,
                    file: &file,
                    dram: &dram,
                    irqs: irqs
                        .iter()
                        .map(AsFd::as_fd)
                        .collect::<Vec<BorrowedFd<'_>>>(),
                };
                let remote = process::spawn(program, hello)?;
                let space = match RemoteSpace::new(table, &remote) {
                    Ok(space) => space,
                    Err(err) => {
                        remote.stop(Duration::from_secs(1));
                        return Err(err);
                    }
                };
                (
                    Runner::Process(remote),
                    Arc::new(space) as Arc<dyn dma::Space>,
                )
            }
        };
        let registers = Block::new(HostBar::new(Arc::clone(&file))).erase();
        let device = Loopback {
            identity: Identity {
                name: config.name.clone(),
                kind: Kind::Simulated,
                bdf: None,
            },
            config,
            file,
            registers,
            memory_bar,
            dram,
            space,
            irqs,
            runner,
            events,
        };
        device.wait_for("start", device.config.ack_timeout, |d| {
            Ok(d.get(regs::STATUS)?.contains(regs::DeviceStatus::READY))
        })?;
        Ok(device)
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// BAR 0 (the registers).
    pub fn registers(&self) -> &DynBlock {
        &self.registers
    }

    /// BAR 2 (device memory) as a register block.
    pub fn memory_bar(&self) -> &DynBlock {
        &self.memory_bar
    }

    /// The device memory, for bulk volatile copies in and out (tests, debugging). The engine
    /// writes it behind the host's back: read it only while no descriptor targets it.
    pub fn device_memory(&self) -> Slice<'_> {
        Slice::from_region(&self.dram)
    }

    /// Declares the working set of queue `queue`'s context for the cost model's device SRAM
    /// (see [`Cost::sram_bytes`]): `private` bytes its own (hot activations), `shared` bytes
    /// shared with every queue given the same nonzero `key` (the weights of one model). The
    /// device reads it when the queue is enabled: declare it before opening the queue.
    ///
    /// # Errors
    /// [`DeviceError::NoSuchQueue`] for a queue the device does not have, and register
    /// access errors.
    pub fn set_working_set(
        &self,
        queue: u16,
        private: u64,
        shared: u64,
        key: u32,
    ) -> Result<(), DeviceError> {
        self.set(self.queue_reg(regs::Q_WS_PRIVATE, queue)?, private)?;
        self.set(self.queue_reg(regs::Q_WS_SHARED, queue)?, shared)?;
        self.set(self.queue_reg(regs::Q_SHARE_KEY, queue)?, key)
    }

    /// Reads `dst.len()` bytes of device memory at `offset` the way a host reads results in
    /// place through the memory BAR, paying what that costs on hardware: under a cost model
    /// the call takes at least [`Cost::mmio_read`] of the length (one PCIe round trip per
    /// 8 bytes, during which a real CPU stalls, so the wait spins). The engine writes device
    /// memory behind the host's back: read only what no descriptor in flight targets.
    ///
    /// # Errors
    /// [`dma::Error`] if the range leaves device memory.
    pub fn read_device_memory(&self, offset: usize, dst: &mut [u8]) -> Result<(), dma::Error> {
        let start = Instant::now();
        self.device_memory().read_into(offset, dst)?;
        let until = start + self.config.cost_model().mmio_read(dst.len() as u64);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// Takes the device away, as a hot-unplug or an administrator's `remove` takes a PCI
    /// device: the engine (thread or process) stops, so the device touches no memory again;
    /// then both BARs read all-ones and drop writes, and the removal is reported
    /// ([`Device::events`], [`Event::Removal`](userdma::device::Event::Removal)), which wakes
    /// every queue's waits with [`ring::Error::Removed`]. Queues shut down after it hand every
    /// in-flight buffer back as aborted; opening a queue or resetting fails with
    /// [`DeviceError::Removed`]. Removing twice does nothing more. For tests of every layer's
    /// removal path on a machine without a device.
    pub fn remove(&self) {
        if self.events.is_removed() {
            return;
        }
        self.stop_engine();
        self.file.set_removed();
        self.events.report_removal();
    }

    /// Stops the engine and waits until it has.
    fn stop_engine(&self) {
        self.file.request_shutdown();
        match &self.runner {
            Runner::Thread(handle) => {
                let handle = handle.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(handle) = handle {
                    // A panic in the engine has been reported on its thread already.
                    let _ = handle.join();
                }
            }
            Runner::Process(remote) => remote.stop(Duration::from_secs(5)),
        }
    }

    /// The error of an operation on a removed device.
    fn check_present(&self) -> Result<(), DeviceError> {
        if self.events.is_removed() {
            return Err(DeviceError::Removed {
                device: self.identity.name.clone(),
            });
        }
        Ok(())
    }

    /// Whether the engine (thread or process) is running.
    pub fn is_running(&self) -> bool {
        match &self.runner {
            Runner::Thread(handle) => handle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(|h| !h.is_finished()),
            Runner::Process(remote) => remote.is_running(),
        }
    }

    /// The device process's id, in [`Mode::Process`].
    pub fn process_id(&self) -> Option<u32> {
        match &self.runner {
            Runner::Thread(_) => None,
            Runner::Process(remote) => Some(remote.id()),
        }
    }

    /// Reads a register of BAR 0.
    pub fn get<V: Value, A: Readable>(&self, field: Field<V, A>) -> Result<V, DeviceError> {
        self.registers
            .get(field)
            .map_err(|source| DeviceError::Register {
                offset: field.offset(),
                source,
            })
    }

    /// Writes a register of BAR 0.
    pub fn set<V: Value, A: Writable>(
        &self,
        field: Field<V, A>,
        value: V,
    ) -> Result<(), DeviceError> {
        self.registers
            .set(field, value)
            .map_err(|source| DeviceError::Register {
                offset: field.offset(),
                source,
            })
    }

    /// Queue `queue`'s copy of a per-queue register (`regs::Q_*`).
    fn queue_reg<V, A>(&self, field: Field<V, A>, queue: u16) -> Result<Field<V, A>, DeviceError> {
        let count = self.config.queues;
        if queue >= count {
            return Err(DeviceError::NoSuchQueue {
                index: queue.into(),
                count: count.into(),
            });
        }
        queue_field(field, queue).ok_or(DeviceError::NoSuchQueue {
            index: queue.into(),
            count: count.into(),
        })
    }

    /// The device's counters.
    pub fn counters(&self) -> Result<Counters, DeviceError> {
        let queues = (0..self.config.queues)
            .map(|q| {
                Ok(QueueCounters {
                    completed: self.get(self.queue_reg(regs::Q_COMPLETED, q)?)?,
                    errors: self.get(self.queue_reg(regs::Q_ERRORS, q)?)?,
                    sram_hits: self.get(self.queue_reg(regs::Q_SRAM_HITS, q)?)?,
                    sram_touched: self.get(self.queue_reg(regs::Q_SRAM_TOUCHED, q)?)?,
                })
            })
            .collect::<Result<Vec<_>, DeviceError>>()?;
        let unit = |u: Unit| -> Result<UnitCounters, DeviceError> {
            Ok(UnitCounters {
                descriptors: self.get(unit_field(regs::DESCRIPTORS, u))?,
                bytes: self.get(unit_field(regs::BYTES, u))?,
                context_switches: self.get(unit_field(regs::CONTEXT_SWITCHES, u))?,
                errors: self.get(unit_field(regs::ERRORS, u))?,
                busy_ns: self.get(unit_field(regs::BUSY_NS, u))?,
                interrupts: self.get(unit_field(regs::INTERRUPTS, u))?,
                modelled_ns: self.get(unit_field(regs::MODELLED_NS, u))?,
            })
        };
        let units = [unit(Unit::Copy)?, unit(Unit::Compute)?];
        let sum = |f: fn(&UnitCounters) -> u64| units.iter().map(f).fold(0u64, u64::wrapping_add);
        Ok(Counters {
            descriptors: sum(|u| u.descriptors),
            bytes: sum(|u| u.bytes),
            context_switches: sum(|u| u.context_switches),
            errors: sum(|u| u.errors),
            busy_ns: sum(|u| u.busy_ns),
            interrupts: sum(|u| u.interrupts),
            modelled_ns: sum(|u| u.modelled_ns),
            queues,
            units,
        })
    }

    /// Polls `done` until it says so, the engine stops, or `timeout` passes.
    fn wait_for(
        &self,
        operation: &'static str,
        timeout: Duration,
        mut done: impl FnMut(&Loopback) -> Result<bool, DeviceError>,
    ) -> Result<(), DeviceError> {
        let start = Instant::now();
        let mut step = Duration::from_micros(1);
        loop {
            if done(self)? {
                return Ok(());
            }
            if !self.is_running() {
                let exit = match &self.runner {
                    Runner::Process(remote) => remote.exit_status(),
                    Runner::Thread(_) => None,
                };
                return Err(LoopbackError::Stopped { exit }.into());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(DeviceError::Timeout { operation, waited });
            }
            if step < Duration::from_micros(20) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(step);
            }
            step = (step * 2).min(Duration::from_millis(1));
        }
    }

    /// Opens queue `config.id()` on a fresh ring of `config.depth()` entries (memfd-backed,
    /// mapped into the device's DMA space), programs it into the device and enables it: the
    /// loopback device's [`NpuFormat`] through [`device::open_queue`](userdma::device::open_queue).
    /// The queue stops its device queue when dropped with work in flight. With [`Wait::Poll`]
    /// the queue has no interrupt vector.
    pub fn open_queue<T: Send>(
        self: &Arc<Self>,
        config: ring::Config,
        wait: Wait,
    ) -> Result<Queue<T>, DeviceError> {
        self.open_queue_on(config, wait, Unit::Copy)
    }

    /// [`Loopback::open_queue`] for a queue served by `unit` (the [`NpuFormat`] with
    /// [`NpuFormat::unit`]).
    pub fn open_queue_on<T: Send>(
        self: &Arc<Self>,
        config: ring::Config,
        wait: Wait,
        unit: Unit,
    ) -> Result<Queue<T>, DeviceError> {
        self.check_present()?;
        let device: Arc<dyn Device> = Arc::clone(self) as Arc<dyn Device>;
        let format = NpuFormat::new(Arc::clone(self)).unit(unit);
        userdma::device::open_queue(&device, format, config, wait)
    }

    /// Enables queue `config.id()` on the ring at `iova`, served by `unit` (the [`NpuFormat`]'s
    /// enable).
    fn enable_queue(
        &self,
        config: &ring::Config,
        iova: u64,
        unit: Unit,
    ) -> Result<(), DeviceError> {
        let q = config.id();
        self.set(self.queue_reg(regs::Q_RING_BASE, q)?, iova)?;
        self.set(self.queue_reg(regs::Q_DEPTH, q)?, config.depth())?;
        self.set(self.queue_reg(regs::Q_CONTEXT, q)?, config.context())?;
        self.set(self.queue_reg(regs::Q_UNIT, q)?, unit as u32)?;
        let control = self.queue_reg(regs::Q_CONTROL, q)?;
        self.set(control, QueueControl::ENABLE)?;
        let status = self.queue_reg(regs::Q_STATUS, q)?;
        let started = self.wait_for("enable the queue", self.config.ack_timeout, |d| {
            Ok(!d.get(status)?.is_empty())
        });
        let enabled = started.and_then(|()| self.get(status));
        match enabled {
            Ok(s) if s.contains(QueueStatus::ENABLED) => Ok(()),
            Ok(_) => {
                let fault = self.get(self.queue_reg(regs::Q_FAULT, q)?)?;
                self.set(control, QueueControl::empty())?;
                Err(LoopbackError::QueueFault {
                    queue: q,
                    fault: Fault::from_raw(fault).unwrap_or(Fault::None),
                }
                .into())
            }
            Err(err) => {
                // Best effort: the device is not answering.
                let _ = self.set(control, QueueControl::empty());
                Err(err)
            }
        }
    }
}

/// The loopback device's queue format: [`Command`] descriptors, [`Status`] completions,
/// doorbells in its queue register blocks (BAR 0), and the enable handshake of the register
/// map (the module docs), on the [`Unit`] chosen with [`NpuFormat::unit`] (the copy engine by
/// default). Give it to [`device::open_queue`](userdma::device::open_queue) or
/// [`Runtime::open_queue`](userdma::Runtime::open_queue), or use [`Loopback::open_queue`].
#[derive(Debug, Clone)]
pub struct NpuFormat {
    device: Arc<Loopback>,
    unit: Unit,
}

impl NpuFormat {
    /// The format of `device`'s queues, served by the copy engine.
    pub fn new(device: Arc<Loopback>) -> NpuFormat {
        NpuFormat {
            device,
            unit: Unit::Copy,
        }
    }

    /// The unit that serves the queues opened with this format (written to the queue's
    /// `unit` register before it is enabled).
    #[must_use]
    pub fn unit(mut self, unit: Unit) -> NpuFormat {
        self.unit = unit;
        self
    }
}

impl userdma::device::QueueFormat for NpuFormat {
    type Submission = Command;
    type Completion = Status;

    /// The engine completes each queue's descriptors in order.
    fn in_order(&self) -> bool {
        true
    }

    fn check(&self, _: &dyn Device, q: u16) -> Result<(), DeviceError> {
        let d = &self.device;
        let status = d.get(d.queue_reg(regs::Q_STATUS, q)?)?;
        let control = d.registers.get(d.queue_reg(regs::Q_CONTROL, q)?);
        if !status.is_empty() || control.is_ok_and(|c| !c.is_empty()) {
            return Err(DeviceError::QueueBusy { queue: q });
        }
        Ok(())
    }

    /// The `max_depth` register.
    fn max_depth(&self, _: &dyn Device, _: u16) -> Result<Option<u32>, DeviceError> {
        Ok(Some(self.device.get(regs::MAX_DEPTH)?))
    }

    fn doorbells(&self, _: &dyn Device, q: u16) -> Result<DoorbellRegs, DeviceError> {
        let d = &self.device;
        Ok(DoorbellRegs {
            bar: regs::REGISTER_BAR,
            sq_tail: d.queue_reg(regs::Q_SQ_TAIL, q)?.offset(),
            cq_head: d.queue_reg(regs::Q_CQ_HEAD, q)?.offset(),
        })
    }

    fn enable(
        &self,
        _: &dyn Device,
        config: &ring::Config,
        _: &Layout,
        memory: &Memory,
    ) -> Result<(), DeviceError> {
        self.device
            .enable_queue(config, memory.iova().raw(), self.unit)
    }
}

/// The common queue type of the loopback device: its descriptor format, payloads of type `T`
/// (by default [`OwnedBuffer`](userdma::pool::OwnedBuffer)s, the buffers the descriptors name).
pub type Queue<T = userdma::pool::OwnedBuffer> = ring::Queue<Command, Status, T>;

impl Device for Loopback {
    /// BAR 2, all of it ([`Config::memory_size`]).
    fn memory_bar(&self) -> Option<userdma::device::MemoryBar> {
        Some(userdma::device::MemoryBar {
            index: regs::MEMORY_BAR,
            bytes: self.config.memory_bytes() as u64,
        })
    }

    fn identity(&self) -> &Identity {
        &self.identity
    }

    fn numa_node(&self) -> Option<u32> {
        self.config.numa_node
    }

    fn event_source(&self) -> Option<&Source> {
        Some(&self.events)
    }

    fn bar(&self, index: usize) -> Result<DynBlock, DeviceError> {
        match index {
            regs::REGISTER_BAR => Ok(self.registers.clone()),
            regs::MEMORY_BAR => Ok(self.memory_bar.clone()),
            _ => Err(DeviceError::NoSuchBar { index }),
        }
    }

    fn dma_space(&self) -> Arc<dyn dma::Space> {
        Arc::clone(&self.space)
    }

    fn vectors(&self) -> u32 {
        u32::from(self.config.queues)
    }

    fn interrupt(&self, vector: u32) -> Result<EventFd, DeviceError> {
        let irq = usize::try_from(vector)
            .ok()
            .and_then(|v| self.irqs.get(v))
            .ok_or(DeviceError::NoSuchQueue {
                index: vector,
                count: self.vectors(),
            })?;
        irq.try_clone()
            .map_err(|source| DeviceError::Interrupt { vector, source })
    }

    fn set_masked(&self, vector: u32, masked: bool) -> Result<(), DeviceError> {
        if vector >= self.vectors() {
            return Err(DeviceError::NoSuchQueue {
                index: vector,
                count: self.vectors(),
            });
        }
        let register = if masked {
            regs::IRQ_MASK_SET
        } else {
            regs::IRQ_MASK_CLEAR
        };
        self.set(register, 1 << vector)
    }

    fn reset(&self) -> Result<(), DeviceError> {
        self.check_present()?;
        let before = self.get(regs::RESET_COUNT)?;
        self.set(regs::CONTROL, regs::Control::RESET)?;
        self.wait_for("reset", self.config.ack_timeout, |d| {
            Ok(d.get(regs::RESET_COUNT)? != before)
        })
    }

    fn stop_queue(&self, queue: u16, timeout: Duration) -> Result<(), DeviceError> {
        if self.events.is_removed() {
            // The engine stopped before the removal was reported.
            return Ok(());
        }
        let control = self.queue_reg(regs::Q_CONTROL, queue)?;
        let status = self.queue_reg(regs::Q_STATUS, queue)?;
        self.set(control, QueueControl::empty())?;
        match self.wait_for("stop the queue", timeout, |d| {
            Ok(!d.get(status)?.contains(QueueStatus::ENABLED))
        }) {
            // A stopped engine touches nothing any more: the queue is stopped too.
            Err(e) if matches!(LoopbackError::of(&e), Some(LoopbackError::Stopped { .. })) => {
                Ok(())
            }
            other => other,
        }
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.stop_engine();
    }
}
