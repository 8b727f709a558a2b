//! The controller: reset, admin queue setup, enable, admin commands (Identify, Set Features,
//! I/O queue creation and deletion) and shutdown, over BAR0 and an admin queue pair built on
//! `userdma::ring`.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use userdma::dma::{self, Mapping, Space};
use userdma::irq::EventFd;
use userdma::memory::{self, PageSize, Region};
use userdma::mmio::{self, DynBlock};
use userdma::pool::{self, Pool};
use userdma::ring::{self, Config, DoorbellValue, Doorbells, Memory, Quiesce};

use crate::command::{self, cns, ControllerId, Cqe, NamespaceId, Sqe, Status, IDENTIFY_LEN};
use crate::io::{NvmeQueue, Payload, MAX_CHUNK};
use crate::regs::{self, Aqa, Cap, Cc, Csts, Shutdown, ShutdownStatus, PAGE};

/// How often register polls look again.
const POLL: Duration = Duration::from_millis(1);

/// What went wrong driving the controller.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// A BAR0 register access failed.
    #[error("{what}: BAR0 register access failed")]
    Register {
        /// The register or step.
        what: &'static str,
        /// The access error.
        #[source]
        source: mmio::Error,
    },
    /// The controller cannot be driven the way this driver drives it.
    #[error("the controller is not usable: {0}")]
    Unsupported(&'static str),
    /// CSTS did not reach the state waited for.
    #[error("the controller did not {what} within {waited:?} (CAP.TO), CSTS = {csts:#x}: reset the function (`echo 1 > /sys/bus/pci/devices/BDF/reset`) and try again")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        waited: Duration,
        /// CSTS at the end.
        csts: u32,
    },
    /// CSTS.CFS: the controller reported a fatal error.
    #[error("the controller reported a fatal error (CSTS.CFS, CSTS = {csts:#x}) while {what}: it needs a reset")]
    Fatal {
        /// What was being done.
        what: &'static str,
        /// CSTS.
        csts: u32,
    },
    /// Ring memory could not be allocated.
    #[error("allocating {len} bytes of queue memory failed")]
    Memory {
        /// Bytes.
        len: usize,
        /// The cause.
        #[source]
        source: memory::Error,
    },
    /// Ring or pool memory could not be mapped for the device.
    #[error("mapping {len} bytes of {what} into the device's DMA space failed")]
    Map {
        /// What it is for.
        what: &'static str,
        /// Bytes.
        len: usize,
        /// The cause.
        #[source]
        source: dma::Error,
    },
    /// The buffer pool could not be made.
    #[error("making the buffer pool failed")]
    Pool {
        /// The cause (boxed: it is large).
        #[source]
        source: Box<pool::Error>,
    },
    /// A buffer for an admin command could not be had.
    #[error("allocating a {len}-byte buffer for {what} failed")]
    Buffer {
        /// The command.
        what: &'static str,
        /// Bytes.
        len: usize,
        /// The cause (boxed: it is large).
        #[source]
        source: Box<pool::Error>,
    },
    /// A queue pair could not be set up.
    #[error("queue {qid}: {what} failed")]
    Queue {
        /// The queue id.
        qid: u16,
        /// What was being done.
        what: &'static str,
        /// The ring's error.
        #[source]
        source: ring::Error,
    },
    /// An admin command failed.
    #[error("admin command {what} failed: {status}")]
    Command {
        /// The command.
        what: &'static str,
        /// The controller's status.
        status: Status,
    },
    /// A completion for another command than the one waited for.
    #[error("admin command {what} (id {id}): the controller completed command id {got} instead")]
    Unexpected {
        /// The command.
        what: &'static str,
        /// Its id.
        id: u16,
        /// The id completed.
        got: u16,
    },
    /// Identify data this driver cannot use.
    #[error("Identify data")]
    Identify {
        /// What is wrong.
        #[source]
        source: command::Error,
    },
    /// A queue's SQ or CQ not page aligned in IOVA space.
    #[error("queue {qid}: SQ at IOVA {sq:#x} and CQ at {cq:#x} must both be 4 KiB aligned: the ring memory was laid out without the controller's alignment")]
    Misplaced {
        /// The queue id.
        qid: u16,
        /// The SQ's IOVA.
        sq: u64,
        /// The CQ's IOVA.
        cq: u64,
    },
    /// Fewer I/O queues than asked for.
    #[error(
        "the controller granted {sqs} I/O submission and {cqs} completion queues, need 1 each"
    )]
    QueueCount {
        /// Submission queues granted.
        sqs: u32,
        /// Completion queues granted.
        cqs: u32,
    },
}

fn reg(what: &'static str) -> impl FnOnce(mmio::Error) -> Error {
    move |source| Error::Register { what, source }
}

/// The controller's registers and what was read from CAP.
#[derive(Debug, Clone)]
pub(crate) struct Controller {
    bar: DynBlock,
    cap: Cap,
}

impl Controller {
    /// The controller behind `bar` (its BAR0). Reads CAP and checks that the controller
    /// supports the NVM command set with 4 KiB pages.
    pub(crate) fn new(bar: DynBlock) -> Result<Controller, Error> {
        let cap = Cap::read(&bar).map_err(reg("reading CAP"))?;
        if cap.0 == u64::MAX {
            return Err(Error::Unsupported(
                "CAP reads all ones: the function is not responding (is BAR0 enabled, is it an NVMe controller?)",
            ));
        }
        if !cap.supports_nvm() {
            return Err(Error::Unsupported(
                "CAP.CSS says the NVM command set is not supported",
            ));
        }
        if cap.min_page() > PAGE as u64 || cap.max_page() < PAGE as u64 {
            return Err(Error::Unsupported(
                "CAP.MPSMIN..MPSMAX does not include 4 KiB pages",
            ));
        }
        Ok(Controller { bar, cap })
    }

    /// CAP.
    pub(crate) fn cap(&self) -> Cap {
        self.cap
    }

    /// VS.
    pub(crate) fn version(&self) -> Result<(u32, u32, u32), Error> {
        let vs = self.bar.get(regs::VS).map_err(reg("reading VS"))?;
        Ok(regs::version(vs))
    }

    fn csts(&self) -> Result<Csts, Error> {
        self.bar.get(regs::CSTS).map_err(reg("reading CSTS"))
    }

    /// Polls CSTS until `done` says so, for up to CAP.TO (at least one second); `fatal` makes
    /// CSTS.CFS an error.
    fn wait_csts(
        &self,
        what: &'static str,
        fatal: bool,
        done: impl Fn(Csts) -> bool,
    ) -> Result<(), Error> {
        let limit = self.cap.ready_timeout().max(Duration::from_secs(1));
        let start = Instant::now();
        loop {
            let csts = self.csts()?;
            if fatal && csts.contains(Csts::CFS) {
                return Err(Error::Fatal {
                    what,
                    csts: csts.bits(),
                });
            }
            if done(csts) {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(Error::Timeout {
                    what,
                    waited: start.elapsed(),
                    csts: csts.bits(),
                });
            }
            thread::sleep(POLL);
        }
    }

    /// Disables the controller (CC.EN = 0: a controller reset, every queue deleted, all DMA
    /// stopped) and waits for CSTS.RDY = 0.
    pub(crate) fn disable(&self) -> Result<(), Error> {
        let cc = self.bar.get(regs::CC).map_err(reg("reading CC"))?;
        if cc.enabled() {
            self.bar
                .set(regs::CC, cc.with_enable(false))
                .map_err(reg("clearing CC.EN"))?;
        }
        // CFS may be set by whatever happened before the reset: it does not stop a disable.
        self.wait_csts("become not ready after CC.EN = 0", false, |csts| {
            !csts.contains(Csts::RDY)
        })
    }

    /// Programs the admin queues: `entries` each, SQ at `asq`, CQ at `acq`.
    pub(crate) fn set_admin_queues(&self, entries: u32, asq: u64, acq: u64) -> Result<(), Error> {
        let aqa = Aqa::new(entries).ok_or(Error::Unsupported(
            "the admin queue depth must be 2 to 4096",
        ))?;
        self.bar.set(regs::AQA, aqa).map_err(reg("writing AQA"))?;
        regs::write_u64(&self.bar, regs::ASQ, asq).map_err(reg("writing ASQ"))?;
        regs::write_u64(&self.bar, regs::ACQ, acq).map_err(reg("writing ACQ"))
    }

    /// Enables the controller with the driver's configuration ([`Cc::nvm`]) and waits for
    /// CSTS.RDY = 1 (CSTS.CFS is an error).
    pub(crate) fn enable(&self) -> Result<(), Error> {
        let cc = Cc::nvm();
        self.bar.set(regs::CC, cc).map_err(reg("writing CC"))?;
        self.bar
            .set(regs::CC, cc.with_enable(true))
            .map_err(reg("setting CC.EN"))?;
        self.wait_csts("become ready after CC.EN = 1", true, |csts| {
            csts.contains(Csts::RDY)
        })
    }

    /// Normal shutdown: CC.SHN = 01, then waits for CSTS.SHST = complete.
    pub(crate) fn shutdown(&self) -> Result<(), Error> {
        let cc = self.bar.get(regs::CC).map_err(reg("reading CC"))?;
        self.bar
            .set(regs::CC, cc.with_shutdown(Shutdown::Normal))
            .map_err(reg("setting CC.SHN"))?;
        self.wait_csts("complete its shutdown (CSTS.SHST)", true, |csts| {
            csts.shutdown_status() == ShutdownStatus::Complete
        })
    }

    /// The doorbells of queue pair `qid`.
    pub(crate) fn doorbells(&self, qid: u16) -> Result<Doorbells, Error> {
        let (sq, cq) = self
            .cap
            .sq_tail_doorbell(qid)
            .zip(self.cap.cq_head_doorbell(qid))
            .ok_or(Error::Unsupported("doorbell offsets overflow"))?;
        Doorbells::new(self.bar.clone(), sq, cq).map_err(|source| Error::Queue {
            qid,
            what: "locating the doorbells",
            source,
        })
    }

    /// A queue pair `qid` of `depth` entries in fresh memory mapped into `space`, ringing its
    /// doorbells, woken by `interrupt`. Its SQ and CQ are page-aligned; a queue dropped with
    /// commands in flight disables the controller before it frees anything.
    pub(crate) fn queue<'p>(
        &self,
        space: &dyn Space,
        qid: u16,
        depth: u32,
        interrupt: EventFd,
    ) -> Result<NvmeQueue<'p>, Error> {
        let ring_error = |what| move |source| Error::Queue { qid, what, source };
        let config = Config::new(depth)
            .with_id(qid)
            .with_doorbell(DoorbellValue::Slot)
            .with_part_align(PAGE);
        let layout = config
            .layout::<Sqe, Cqe>()
            .map_err(ring_error("laying out the rings"))?;
        let mapping = map(space, "queue memory", layout.size(), PageSize::Base)?;
        let memory = Memory::from_mapping(Arc::new(mapping), 0, layout.size())
            .map_err(ring_error("placing the rings"))?;
        let mut queue = NvmeQueue::new(config, memory, self.doorbells(qid)?, Some(interrupt))
            .map_err(ring_error("making the queue"))?;
        // The controller takes the two bases separately and needs them page aligned.
        let (sq, cq) = queue_bases(&queue);
        if sq % PAGE as u64 != 0 || cq % PAGE as u64 != 0 {
            return Err(Error::Misplaced { qid, sq, cq });
        }
        queue.set_quiesce(Disable(self.clone()));
        Ok(queue)
    }
}

/// The IOVAs of a queue pair's SQ and CQ: what ASQ/ACQ and the Create I/O SQ/CQ commands are
/// given.
pub(crate) fn queue_bases(queue: &NvmeQueue<'_>) -> (u64, u64) {
    let base = queue.memory().iova();
    let layout = queue.layout();
    (
        (base + layout.sq_offset() as u64).raw(),
        (base + layout.cq_offset() as u64).raw(),
    )
}

/// Maps `len` bytes (rounded up to whole pages) of fresh, locked `page_size` memory into
/// `space`.
pub(crate) fn map(
    space: &dyn Space,
    what: &'static str,
    len: usize,
    page_size: PageSize,
) -> Result<Mapping, Error> {
    let page = page_size.bytes();
    let len = len
        .checked_next_multiple_of(page)
        .ok_or(Error::Unsupported("a queue or pool size overflows"))?;
    let region = Region::builder(len)
        .page_size(page_size)
        .build()
        .map_err(|source| Error::Memory { len, source })?;
    space
        .map(Arc::new(region))
        .map_err(|source| Error::Map { what, len, source })
}

/// A buffer pool over `len` bytes of `page` pages mapped into `space`: size classes up to the
/// largest command's buffer ([`MAX_CHUNK`]), carved from 256 KiB slabs so that the few classes
/// the driver uses share a small pool.
pub(crate) fn pool(space: &dyn Space, len: usize, page: PageSize) -> Result<Pool, Error> {
    let mapping = map(space, "the buffer pool", len, page)?;
    let config = pool::Config::default()
        .chunk_size(256 << 10)
        .max_class(MAX_CHUNK);
    Pool::new(mapping, config).map_err(|source| Error::Pool {
        source: Box::new(source),
    })
}

/// A [`Quiesce`] that stops a queue by disabling the whole controller (CC.EN = 0 stops every
/// queue and all DMA): what a queue dropped with commands in flight asks for before it frees
/// their buffers.
#[derive(Debug)]
struct Disable(Controller);

impl Quiesce for Disable {
    fn quiesce(&mut self, _queue: u16, _timeout: Duration) -> std::io::Result<()> {
        self.0.disable().map_err(std::io::Error::other)
    }
}

/// The admin queue pair and the commands this driver sends on it, one at a time.
#[derive(Debug)]
pub(crate) struct Admin<'p> {
    /// The queue pair (id 0, MSI-X vector 0).
    pub(crate) queue: NvmeQueue<'p>,
    /// How long a command may take.
    pub(crate) timeout: Duration,
}

impl<'p> Admin<'p> {
    /// Submits `sqe` with `payload` and waits for its completion; a failed status is an error.
    /// Returns the completion and the payload.
    pub(crate) fn run(
        &mut self,
        what: &'static str,
        sqe: Sqe,
        payload: Payload<'p>,
    ) -> Result<(Cqe, Payload<'p>), Error> {
        let queue_error = |what| {
            move |source| Error::Queue {
                qid: 0,
                what,
                source,
            }
        };
        let id = self
            .queue
            .submit(sqe, payload)
            .map_err(queue_error("submitting an admin command"))?;
        let done = self
            .queue
            .wait(Some(self.timeout))
            .map_err(queue_error("waiting for an admin completion"))?;
        // One admin command at a time: the completion must be this one's.
        if done.id != id {
            return Err(Error::Unexpected {
                what,
                id,
                got: done.id,
            });
        }
        let status = done.entry.status();
        if !status.is_success() {
            return Err(Error::Command { what, status });
        }
        Ok((done.entry, done.payload))
    }

    /// Identify `cns` of `nsid` into a page from `pool`; returns the 4096 bytes.
    fn identify(
        &mut self,
        pool: &'p Pool,
        what: &'static str,
        cns: u32,
        nsid: u32,
    ) -> Result<Box<[u8; IDENTIFY_LEN]>, Error> {
        let buffer = pool.alloc(IDENTIFY_LEN).map_err(|source| Error::Buffer {
            what,
            len: IDENTIFY_LEN,
            source: Box::new(source),
        })?;
        // A 4 KiB pool block is 4 KiB aligned in IOVA space: PRP1 alone describes it.
        if buffer.iova() % PAGE as u64 != 0 {
            return Err(Error::Unsupported(
                "the pool gave an Identify buffer that is not page aligned",
            ));
        }
        let sqe = Sqe::identify(cns, nsid, buffer.iova().raw());
        let payload = Payload {
            data: Some(buffer),
            ..Payload::default()
        };
        let (_, payload) = self.run(what, sqe, payload)?;
        let mut data = Box::new([0; IDENTIFY_LEN]);
        if let Some(buffer) = payload.data {
            buffer
                .read(0, &mut data[..])
                .map_err(|source| Error::Buffer {
                    what,
                    len: IDENTIFY_LEN,
                    source: Box::new(source),
                })?;
        }
        Ok(data)
    }

    /// Identify Controller.
    pub(crate) fn identify_controller(&mut self, pool: &'p Pool) -> Result<ControllerId, Error> {
        let data = self.identify(pool, "Identify Controller", cns::CONTROLLER, 0)?;
        Ok(ControllerId::parse(&data))
    }

    /// Identify Namespace `nsid`.
    pub(crate) fn identify_namespace(
        &mut self,
        pool: &'p Pool,
        nsid: u32,
    ) -> Result<NamespaceId, Error> {
        let data = self.identify(pool, "Identify Namespace", cns::NAMESPACE, nsid)?;
        NamespaceId::parse(nsid, &data).map_err(|source| Error::Identify { source })
    }

    /// Set Features, Number of Queues: asks for one I/O queue pair; returns what was granted.
    pub(crate) fn set_queue_count(&mut self) -> Result<(u32, u32), Error> {
        let (cqe, _) = self.run(
            "Set Features (Number of Queues)",
            Sqe::set_queue_count(1, 1),
            Payload::default(),
        )?;
        // DW0: NSQA (15:0) and NCQA (31:16), 0-based.
        let sqs = (cqe.result & 0xffff) + 1;
        let cqs = (cqe.result >> 16) + 1;
        if sqs < 1 || cqs < 1 {
            return Err(Error::QueueCount { sqs, cqs });
        }
        Ok((sqs, cqs))
    }

    /// Creates I/O queue pair `qid` on the controller for `queue` (its CQ interrupting on
    /// MSI-X vector `vector`).
    pub(crate) fn create_io_queues(
        &mut self,
        queue: &NvmeQueue<'_>,
        vector: u16,
    ) -> Result<(), Error> {
        let qid = queue.id();
        let depth = queue.depth();
        let (sq, cq) = queue_bases(queue);
        self.run(
            "Create I/O Completion Queue",
            Sqe::create_io_cq(qid, depth, cq, vector),
            Payload::default(),
        )?;
        self.run(
            "Create I/O Submission Queue",
            Sqe::create_io_sq(qid, depth, sq, qid),
            Payload::default(),
        )?;
        Ok(())
    }

    /// Deletes I/O queue pair `qid` on the controller (SQ first, as the specification asks).
    pub(crate) fn delete_io_queues(&mut self, qid: u16) -> Result<(), Error> {
        self.run(
            "Delete I/O Submission Queue",
            Sqe::delete_io_sq(qid),
            Payload::default(),
        )?;
        self.run(
            "Delete I/O Completion Queue",
            Sqe::delete_io_cq(qid),
            Payload::default(),
        )?;
        Ok(())
    }
}
