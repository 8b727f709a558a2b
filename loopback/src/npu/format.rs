//! The loopback device's queues: its queue format ([`NpuFormat`]: [`Command`] descriptors,
//! [`Status`] completions, the doorbells in its queue register blocks, and the enable
//! handshake of the register map), [`Loopback::open_queue`] over it, and its [`Queue`] type.

use std::sync::Arc;

use crate::error::Error as LoopbackError;
use crate::regs::{self, Fault, QueueControl, QueueStatus, Unit};
use crate::{Loopback, Wait};
use userdma::device::{Device, DoorbellRegs, Error as DeviceError};
use userdma::ring::{self, Command, Layout, Memory, Status};

impl Loopback {
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
