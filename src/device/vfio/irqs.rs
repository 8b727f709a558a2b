//! Interrupts of a [`Vfio`] device: the kinds ([`IrqKind`]), enabling vectors as eventfds
//! (`VFIO_DEVICE_SET_IRQS` with `VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER`),
//! disabling them (`DATA_NONE`, count 0), and the `vfio_irq_set` byte layout.

use std::fmt;
use std::os::fd::AsFd;

use userdma_sys::vfio::{
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
    VFIO_PCI_INTX_IRQ_INDEX, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_PCI_MSI_IRQ_INDEX,
};

use super::info::put;
use super::{IrqInfo, Vfio};
use crate::device::vfio::Error as VfioError;
use crate::device::Error;
use crate::irq;

/// The kinds of interrupt a PCI function can signal through VFIO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum IrqKind {
    /// Legacy INTx (one vector; the kernel masks it when it fires: unmask after each).
    Intx,
    /// MSI (up to 32 vectors).
    Msi,
    /// MSI-X (up to 2048 vectors).
    MsiX,
}

impl IrqKind {
    /// The VFIO irq index.
    pub fn index(self) -> u32 {
        match self {
            IrqKind::Intx => VFIO_PCI_INTX_IRQ_INDEX,
            IrqKind::Msi => VFIO_PCI_MSI_IRQ_INDEX,
            IrqKind::MsiX => VFIO_PCI_MSIX_IRQ_INDEX,
        }
    }
}

impl fmt::Display for IrqKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IrqKind::Intx => "INTx",
            IrqKind::Msi => "MSI",
            IrqKind::MsiX => "MSI-X",
        })
    }
}

/// The enabled interrupt vectors.
#[derive(Debug, Default)]
pub(super) struct Interrupts {
    pub(super) kind: Option<IrqKind>,
    pub(super) vectors: Vec<irq::EventFd>,
}

impl Vfio {
    /// The interrupt kind enabled now, if any.
    pub fn interrupt_kind(&self) -> Option<IrqKind> {
        self.lock_interrupts().kind
    }

    pub(super) fn lock_interrupts(&self) -> std::sync::MutexGuard<'_, Interrupts> {
        // The state is replaced whole under the lock, so a poisoned one is still consistent.
        self.interrupts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Enables `count` vectors of `kind`, each with a new eventfd, replacing what was enabled
    /// (`count` 0 just disables).
    pub fn enable_interrupts(&self, kind: IrqKind, count: u32) -> Result<(), Error> {
        self.check_present()?;
        let info = self.irqs.iter().find(|i| i.index == kind.index()).copied();
        let available = info.filter(IrqInfo::eventfd).map_or(0, |i| i.count);
        if count > available {
            return Err(VfioError::NoSuchIrq {
                bdf: self.bdf,
                kind,
                requested: count,
                available,
            }
            .into());
        }
        let mut state = self.lock_interrupts();
        if let Some(current) = state.kind {
            self.set_irqs(
                VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
                current.index(),
                0,
                0,
                &[],
            )?;
            state.kind = None;
            state.vectors.clear();
            self.events.forget_vectors();
        }
        if count == 0 {
            return Ok(());
        }
        let mut vectors = Vec::new();
        let mut data = Vec::new();
        for vector in 0..count {
            let fd = irq::EventFd::new().map_err(|source| Error::Interrupt { vector, source })?;
            data.extend_from_slice(&std::os::fd::AsRawFd::as_raw_fd(&fd).to_ne_bytes());
            vectors.push(fd);
        }
        self.set_irqs(
            VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
            kind.index(),
            0,
            count,
            &data,
        )?;
        for (vector, fd) in (0..).zip(&vectors) {
            self.events
                .watch_vector(fd)
                .map_err(|source| Error::Interrupt { vector, source })?;
        }
        state.kind = Some(kind);
        state.vectors = vectors;
        Ok(())
    }

    /// Disables every interrupt vector.
    pub fn disable_interrupts(&self) -> Result<(), Error> {
        let kind = self.lock_interrupts().kind;
        match kind {
            Some(kind) => self.enable_interrupts(kind, 0),
            None => Ok(()),
        }
    }

    /// `VFIO_DEVICE_SET_IRQS`.
    pub(super) fn set_irqs(
        &self,
        flags: u32,
        index: u32,
        start: u32,
        count: u32,
        data: &[u8],
    ) -> Result<(), Error> {
        let buf = irq_set(flags, index, start, count, data);
        self.kernel
            .set_irqs(self.device.as_fd(), &buf)
            .map_err(|source| VfioError::Ioctl {
                bdf: self.bdf,
                ioctl: "VFIO_DEVICE_SET_IRQS",
                source,
            })
            .map_err(Into::into)
    }
}

/// A `vfio_irq_set` followed by `data`, as bytes (`argsz` = the total length).
pub(crate) fn irq_set(flags: u32, index: u32, start: u32, count: u32, data: &[u8]) -> Vec<u8> {
    let header = std::mem::size_of::<userdma_sys::vfio::vfio_irq_set>();
    let mut buf = vec![0u8; header + data.len()];
    let argsz = u32::try_from(buf.len()).unwrap_or(u32::MAX);
    put(&mut buf, 0, &argsz.to_ne_bytes());
    put(&mut buf, 4, &flags.to_ne_bytes());
    put(&mut buf, 8, &index.to_ne_bytes());
    put(&mut buf, 12, &start.to_ne_bytes());
    put(&mut buf, 16, &count.to_ne_bytes());
    put(&mut buf, header, data);
    buf
}
