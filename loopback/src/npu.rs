//! The device itself ([`Loopback`]): starting its engine in a thread or a device process, its
//! BARs, queues and interrupts as the driver's [`Device`](userdma::device::Device) trait asks
//! (`npu/device.rs`), its own queue format ([`NpuFormat`], `npu/format.rs`), reset, removal and
//! recovery.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::bar::{self, HostBar, MemoryBar, RegisterFile};
use crate::config::{self, Config, Counters, Mode, QueueCounters, UnitCounters};
use crate::engine::Engine;
use crate::error::Error as LoopbackError;
use crate::ops::{Dram, Translate};
use crate::process::{self, Remote, RemoteSpace};
use crate::regs::{self, queue_field, unit_field, Unit};
use crate::shim;
use crate::sync::Mutex;
use userdma::device::{Error as DeviceError, Identity, Kind, Source};
use userdma::dma::{self, Slice};
use userdma::irq::EventFd;
use userdma::memory::Region;
use userdma::mmio::{Block, DynBlock, Field, Readable, Value, Writable};

mod activity;
mod device;
mod format;

pub use self::format::{NpuFormat, Queue};

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
    /// The number in its name while it lives, if the name was not given.
    _number: Option<Number>,
}

/// The `N` of a device named `loopback<N>` by default, held while the device lives: the next
/// device without a name of its own takes the lowest number no live one holds, so one device
/// at a time is always `loopback0` and two at once are told apart in messages and traces.
#[derive(Debug)]
pub(crate) struct Number(u32);

/// The numbers live devices hold.
static NUMBERS: std::sync::Mutex<std::collections::BTreeSet<u32>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

impl Number {
    fn take() -> Number {
        // A panic elsewhere while the set was held leaves it consistent (one insert or remove).
        let mut taken = NUMBERS.lock().unwrap_or_else(|e| e.into_inner());
        let n = (0..).find(|n| !taken.contains(n)).unwrap_or(u32::MAX);
        taken.insert(n);
        Number(n)
    }
}

impl Drop for Number {
    fn drop(&mut self) {
        NUMBERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

impl Loopback {
    /// Starts a loopback device.
    pub fn new(mut config: Config) -> Result<Loopback, DeviceError> {
        let number = (!config.named).then(Number::take);
        if let Some(Number(n)) = &number {
            config.name = format!("loopback{n}");
        }
        #[cfg(feature = "tracing")]
        let _span = tracing::info_span!(
            "loopback.new",
            device = %config.name,
            queues = config.queues,
            memory_bytes = config.memory_size,
            dma_mask_bits = config.dma_mask_bits,
            process = matches!(config.mode, Mode::Process(_))
        )
        .entered();
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
                #[cfg(feature = "tracing")]
                let traced = crate::traced::Carried::new(tracing::info_span!(
                    parent: None,
                    "loopback.engine",
                    device = %config.name
                ));
                let handle = std::thread::Builder::new()
                    .name(config.name.clone())
                    .spawn(move || {
                        #[cfg(feature = "tracing")]
                        let _traced = traced.enter();
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
            _number: number,
        };
        device.wait_for("start", device.config.ack_timeout, |d| {
            Ok(d.get(regs::STATUS)?.contains(regs::DeviceStatus::READY))
        })?;
        #[cfg(feature = "tracing")]
        tracing::info!(device = %device.identity, pid = device.process_id(), "device started");
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
    /// (see [`Cost::sram_bytes`](crate::Cost::sram_bytes)): `private` bytes its own (hot activations), `shared` bytes
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
    /// the call takes at least [`Cost::mmio_read`](crate::Cost::mmio_read) of the length (one PCIe round trip per
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
    /// ([`Device::events`](userdma::device::Device::events),
    /// [`Event::Removal`](userdma::device::Event::Removal)), which wakes every queue's waits
    /// with [`ring::Error::Removed`](userdma::ring::Error::Removed). Queues shut down after it
    /// hand every in-flight buffer back as aborted; opening a queue or resetting fails with
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
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.stop_engine();
    }
}
