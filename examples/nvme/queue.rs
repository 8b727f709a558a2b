//! The driver's queue format: what `userdma::device::open_queue` (through
//! `Runtime::open_queue`) needs to know about NVMe queues, and which queues the controller
//! serves.
//!
//! The runtime does the steps every queue takes (ring memory in the device's DMA space, the
//! doorbells, the MSI-X vector of the queue's id, the ring); [`Format`] says the NVMe part:
//! 64-byte SQ entries and 16-byte CQ entries, slot doorbells at CAP.DSTRD's stride, SQ and CQ
//! page aligned; enabling the admin queue programs AQA/ASQ/ACQ (the controller is enabled later,
//! by the bring-up sequence); an I/O queue is made on the controller with the Create I/O CQ/SQ
//! admin commands (`controller::Admin::create_io_queues`), which need the admin queue, so its
//! enable only checks the bases. Stopping a queue the controller still serves disables the
//! controller (CC.EN = 0 stops every queue and all DMA).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use userdma::device::{self, Device, DoorbellRegs};
use userdma::ring::{self, DoorbellValue, Layout, Memory};

use crate::command::{Cqe, Sqe};
use crate::controller::Controller;
use crate::regs::{self, Aqa, PAGE};

/// The BAR that holds the registers and doorbells.
const BAR: usize = 0;

/// The queues the controller serves now: those whose rings it may read or write. A queue is
/// live from the moment the controller knows its ring (ASQ/ACQ programmed, Create I/O CQ
/// completed) until it forgets it (Delete I/O CQ completed, a controller reset, a completed
/// shutdown). Shared by the controller's handles and the queues' formats.
#[derive(Debug, Default)]
pub(crate) struct Live {
    queues: Mutex<Vec<u16>>,
}

impl Live {
    fn with<R>(&self, f: impl FnOnce(&mut Vec<u16>) -> R) -> R {
        // The list stays consistent whatever panicked while holding it: every change is one
        // push, retain or clear.
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut queues)
    }

    /// Queue `qid`'s ring is known to the controller.
    pub(crate) fn insert(&self, qid: u16) {
        self.with(|queues| {
            if !queues.contains(&qid) {
                queues.push(qid);
            }
        });
    }

    /// Queue `qid` is gone from the controller.
    pub(crate) fn remove(&self, qid: u16) {
        self.with(|queues| queues.retain(|&q| q != qid));
    }

    /// No queue is left on the controller.
    pub(crate) fn clear(&self) {
        self.with(Vec::clear);
    }

    /// Whether the controller may touch queue `qid`'s ring.
    pub(crate) fn contains(&self, qid: u16) -> bool {
        self.with(|queues| queues.contains(&qid))
    }
}

/// The IOVAs of a queue pair's SQ and CQ in ring memory `memory` laid out as `layout`: what
/// ASQ/ACQ and the Create I/O SQ/CQ commands are given.
pub(crate) fn bases(layout: &Layout, memory: &Memory) -> (u64, u64) {
    let base = memory.iova();
    (
        (base + layout.sq_offset() as u64).raw(),
        (base + layout.cq_offset() as u64).raw(),
    )
}

/// The NVMe queue format of one controller (see the [module docs](self)).
#[derive(Debug, Clone)]
pub(crate) struct Format {
    controller: Controller,
}

impl Format {
    /// The format of `controller`'s queues.
    pub(crate) fn new(controller: &Controller) -> Format {
        Format {
            controller: controller.clone(),
        }
    }

    /// AQA, ASQ and ACQ for an admin queue pair of `depth` entries at `asq` / `acq`. The
    /// controller must be disabled.
    fn program_admin(&self, depth: u32, asq: u64, acq: u64) -> Result<(), device::Error> {
        let bar = self.controller.bar();
        let aqa = Aqa::new(depth).ok_or(device::Error::Ring {
            queue: 0,
            source: ring::Error::InvalidDepth { depth, max: 4096 },
        })?;
        let register = |offset| move |source| device::Error::Register { offset, source };
        bar.set(regs::AQA, aqa)
            .map_err(register(regs::AQA.offset()))?;
        regs::write_u64(bar, regs::ASQ, asq).map_err(register(regs::ASQ.offset()))?;
        regs::write_u64(bar, regs::ACQ, acq).map_err(register(regs::ACQ.offset()))?;
        // The controller reads them when it is enabled: from now on it may use the rings.
        self.controller.live().insert(0);
        Ok(())
    }
}

impl device::QueueFormat for Format {
    type Submission = Sqe;
    type Completion = Cqe;

    /// Slot doorbells (the controller takes entry indices), SQ and CQ each at a page boundary
    /// (ASQ/ACQ and PRP1 of Create I/O SQ/CQ are page addresses: CC.MPS = 0).
    fn ring_config(&self, config: ring::Config) -> ring::Config {
        config
            .with_doorbell(DoorbellValue::Slot)
            .with_part_align(PAGE)
    }

    /// A queue the controller still serves cannot be opened again.
    fn check(&self, _device: &dyn Device, queue: u16) -> Result<(), device::Error> {
        if self.controller.live().contains(queue) {
            return Err(device::Error::QueueBusy { queue });
        }
        Ok(())
    }

    /// The admin queue: 4096 (AQA's 12-bit sizes); an I/O queue: CAP.MQES + 1.
    fn max_depth(&self, _device: &dyn Device, queue: u16) -> Result<Option<u32>, device::Error> {
        Ok(Some(match queue {
            0 => 4096,
            _ => self.controller.cap().max_queue_entries(),
        }))
    }

    /// SQ y tail at 0x1000 + (2y * stride), CQ y head at 0x1000 + ((2y + 1) * stride), the
    /// stride from CAP.DSTRD.
    fn doorbells(&self, _device: &dyn Device, queue: u16) -> Result<DoorbellRegs, device::Error> {
        let cap = self.controller.cap();
        let (sq_tail, cq_head) = cap
            .sq_tail_doorbell(queue)
            .zip(cap.cq_head_doorbell(queue))
            .ok_or_else(|| device::Error::Driver {
                queue,
                operation: "locate its doorbells (the offsets overflow)",
                source: "CAP.DSTRD puts the doorbells past 64 bits".into(),
            })?;
        Ok(DoorbellRegs {
            bar: BAR,
            sq_tail,
            cq_head,
        })
    }

    /// Checks that the SQ and CQ are page aligned in IOVA space (the controller takes the two
    /// bases separately); for the admin queue (id 0) programs AQA/ASQ/ACQ. An I/O queue is
    /// created on the controller afterwards, with admin commands.
    fn enable(
        &self,
        _device: &dyn Device,
        config: &ring::Config,
        layout: &Layout,
        memory: &Memory,
    ) -> Result<(), device::Error> {
        let queue = config.id();
        let (sq, cq) = bases(layout, memory);
        for base in [sq, cq] {
            if base % PAGE as u64 != 0 {
                return Err(device::Error::Ring {
                    queue,
                    source: ring::Error::PartAlign {
                        iova: base,
                        align: PAGE,
                    },
                });
            }
        }
        if queue == 0 {
            self.program_admin(config.depth(), sq, cq)?;
        }
        Ok(())
    }

    /// Disables the controller (CC.EN = 0: every queue deleted, all DMA stopped) when it still
    /// serves queue `queue`; a queue it has forgotten (deleted, or after a shutdown) needs
    /// nothing. The wait is the controller's own (CAP.TO), not `timeout`.
    fn disable(
        &self,
        _device: &dyn Device,
        queue: u16,
        _timeout: Duration,
    ) -> Result<(), device::Error> {
        if !self.controller.live().contains(queue) {
            return Ok(());
        }
        self.controller
            .disable()
            .map_err(|err| device::Error::Driver {
                queue,
                operation: "disable the controller (CC.EN = 0)",
                source: Box::new(err),
            })
    }
}
