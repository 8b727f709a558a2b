//! The driver's [`Device`] trait for the loopback device: its BARs, DMA space, interrupt
//! vectors and their masks, reset, queue stop, NUMA node and event source.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error as LoopbackError;
use crate::regs::{self, QueueControl, QueueStatus};
use crate::Loopback;
use userdma::device::{Device, Error as DeviceError, Identity, Source};
use userdma::dma;
use userdma::irq::EventFd;
use userdma::mmio::DynBlock;

impl Device for Loopback {
    /// BAR 2, all of it ([`Config::memory_size`](crate::Config::memory_size)).
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

    /// 256 bytes: the engine copies and computes on any byte range, and 256 is the pool's
    /// smallest alignment, so [`Runtime::pool`](userdma::Runtime::pool) gives this device
    /// cache-coloured classes (the fast layout).
    fn dma_alignment(&self) -> usize {
        userdma::pool::MIN_ALIGN
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
        })?;
        #[cfg(feature = "tracing")]
        tracing::info!(device = %self.identity, reset = "register", "device reset");
        Ok(())
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
