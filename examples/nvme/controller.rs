//! The controller: reset, admin queue setup, enable, admin commands (Identify, Set Features,
//! I/O queue creation and deletion) and shutdown, over BAR0 and an admin queue pair opened
//! through the runtime in the driver's queue format (`queue`).

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use userdma::device::Wait;
use userdma::memory::PageSize;
use userdma::mmio::{self, DynBlock};
use userdma::pool::{self, Pool};
use userdma::{ring, Runtime};

use crate::command::{self, cns, ControllerId, Cqe, NamespaceId, Sqe, Status, IDENTIFY_LEN};
use crate::io::{NvmeQueue, Payload, MAX_CHUNK};
use crate::queue::{self, Live};
use crate::regs::{self, Cap, Cc, Csts, Shutdown, ShutdownStatus, PAGE};

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
    /// The buffer pool could not be made (its memory, its mapping, the pool itself).
    #[error("making the buffer pool of {len} bytes failed")]
    Pool {
        /// Bytes.
        len: usize,
        /// The cause (boxed: it is large).
        #[source]
        source: Box<userdma::Error>,
    },
    /// A queue pair could not be opened (its ring memory, doorbells, interrupt vector, or the
    /// format's checks and admin queue registers: `queue::Format`).
    #[error("queue {qid}: opening it failed")]
    Open {
        /// The queue id.
        qid: u16,
        /// The cause (boxed: it is large).
        #[source]
        source: Box<userdma::Error>,
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
    /// The queues the controller serves now (`queue::Live`).
    live: Arc<Live>,
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
        Ok(Controller {
            bar,
            cap,
            live: Arc::default(),
        })
    }

    /// CAP.
    pub(crate) fn cap(&self) -> Cap {
        self.cap
    }

    /// BAR0.
    pub(crate) fn bar(&self) -> &DynBlock {
        &self.bar
    }

    /// The queues the controller serves now.
    pub(crate) fn live(&self) -> &Live {
        &self.live
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
        })?;
        // The reset deleted every queue.
        self.live.clear();
        Ok(())
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
        })?;
        // A controller that has shut down processes no more commands.
        self.live.clear();
        Ok(())
    }

    /// Opens queue pair `qid` of `depth` entries on `runtime`'s device in this controller's
    /// format (`queue::Format`), woken by MSI-X vector `qid`. For the admin queue (0) this
    /// programs AQA/ASQ/ACQ; an I/O queue still has to be created on the controller
    /// ([`Admin::create_io_queues`]). A queue dropped while the controller serves it disables
    /// the controller before it frees anything.
    pub(crate) fn open_queue(
        &self,
        runtime: &Runtime,
        qid: u16,
        depth: u32,
    ) -> Result<NvmeQueue, Error> {
        let config = ring::Config::new(depth).with_id(qid);
        runtime
            .open_queue(queue::Format::new(self), config, Wait::Interrupt)
            .map_err(|source| Error::Open {
                qid,
                source: Box::new(source),
            })
    }
}

/// A buffer pool over `len` bytes of `page` pages mapped into `runtime`'s DMA space: size
/// classes up to the largest command's buffer ([`MAX_CHUNK`]), carved from 256 KiB slabs so
/// that the few classes the driver uses share a small pool.
pub(crate) fn pool(runtime: &Runtime, len: usize, page: PageSize) -> Result<Arc<Pool>, Error> {
    let config = pool::Config::default()
        .chunk_size(256 << 10)
        .max_class(MAX_CHUNK);
    runtime
        .pool_with(len, page, config)
        .map_err(|source| Error::Pool {
            len,
            source: Box::new(source),
        })
}

/// The admin queue pair and the commands this driver sends on it, one at a time.
#[derive(Debug)]
pub(crate) struct Admin {
    /// The queue pair (id 0, MSI-X vector 0).
    pub(crate) queue: NvmeQueue,
    /// The controller (which queues it serves).
    pub(crate) controller: Controller,
    /// How long a command may take.
    pub(crate) timeout: Duration,
}

impl Admin {
    /// Submits `sqe` with `payload` and waits for its completion; a failed status is an error.
    /// Returns the completion and the payload.
    pub(crate) fn run(
        &mut self,
        what: &'static str,
        sqe: Sqe,
        payload: Payload,
    ) -> Result<(Cqe, Payload), Error> {
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
        pool: &Arc<Pool>,
        what: &'static str,
        cns: u32,
        nsid: u32,
    ) -> Result<Box<[u8; IDENTIFY_LEN]>, Error> {
        let buffer = pool
            .alloc_owned(IDENTIFY_LEN)
            .map_err(|source| Error::Buffer {
                what,
                len: IDENTIFY_LEN,
                source: Box::new(source),
            })?;
        // A 4 KiB pool block is 4 KiB aligned in IOVA space: PRP1 alone describes it.
        if buffer.iova().raw() % PAGE as u64 != 0 {
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
    pub(crate) fn identify_controller(&mut self, pool: &Arc<Pool>) -> Result<ControllerId, Error> {
        let data = self.identify(pool, "Identify Controller", cns::CONTROLLER, 0)?;
        Ok(ControllerId::parse(&data))
    }

    /// Identify Namespace `nsid`.
    pub(crate) fn identify_namespace(
        &mut self,
        pool: &Arc<Pool>,
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
    pub(crate) fn create_io_queues(&mut self, queue: &NvmeQueue, vector: u16) -> Result<(), Error> {
        let qid = queue.id();
        let depth = queue.depth();
        let (sq, cq) = queue::bases(queue.layout(), queue.memory());
        self.run(
            "Create I/O Completion Queue",
            Sqe::create_io_cq(qid, depth, cq, vector),
            Payload::default(),
        )?;
        // The controller may write the CQ from now on: stopping the queue disables it.
        self.controller.live().insert(qid);
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
        // The controller has forgotten the rings: dropping the queue needs no reset.
        self.controller.live().remove(qid);
        Ok(())
    }
}
