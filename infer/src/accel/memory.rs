//! A plain host-memory engine ([`MemoryEngine`]): one copy engine over a software IOMMU, no
//! compute unit. Every address it is given is an IOVA it translates through its DMA space (a
//! range not mapped there fails the op, never a stray access); the arenas are host memory
//! mapped into the same space. It runs a queue's ops, in order, when the queue is flushed.
//!
//! It is the second engine the pipeline and stream tests run over, so no test of those layers
//! depends on the loopback NPU, and the shape of a device with one DMA engine and no compute
//! (the model's steps run on the host: [`HostSteps`](super::HostSteps)). It can fail ops on
//! purpose ([`MemoryEngine::fail_op`]) and be removed ([`MemoryEngine::remove`]), for the
//! fault tests.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{Accelerator, Arena, Capabilities, Completion, Op, Queue, QueueSpec, Stopped, Unit};
use userdma::dma::{self, Iova, Mapping, SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::Pool;

/// Status of an op that named memory not mapped in the engine's DMA space.
pub const UNMAPPED: u32 = 1;
/// Status of an op failed on purpose ([`MemoryEngine::fail_op`]).
pub const INJECTED: u32 = 2;
/// Status of an op this engine does not run (a step, a wait on another queue).
pub const UNSUPPORTED: u32 = 3;

/// The bytes a queue copies at a time, through its own buffer.
const CHUNK: usize = 64 << 10;

/// State the engine and its queues share.
#[derive(Debug)]
struct Shared {
    space: Arc<SoftIommu>,
    removed: AtomicBool,
    /// Ops run so far (every queue), and the one to fail on purpose (`u64::MAX`: none).
    ops: AtomicU64,
    fail_at: AtomicU64,
    /// Resets so far: a queue opened before the latest reset is stopped.
    resets: AtomicU64,
}

/// A host-memory engine: see the module docs.
#[derive(Debug)]
pub struct MemoryEngine {
    shared: Arc<Shared>,
    queues: u16,
    name: String,
}

impl MemoryEngine {
    /// An engine with `queues` queues.
    ///
    /// # Errors
    /// No IOVA space.
    pub fn new(queues: u16) -> Result<MemoryEngine, crate::Error> {
        let space = Arc::new(SoftIommu::new(48)?);
        Ok(MemoryEngine {
            shared: Arc::new(Shared {
                space,
                removed: AtomicBool::new(false),
                ops: AtomicU64::new(0),
                fail_at: AtomicU64::new(u64::MAX),
                resets: AtomicU64::new(0),
            }),
            queues,
            name: "memory-engine".to_owned(),
        })
    }

    /// Fails the `n`-th op from now (0: the next), of any queue, with [`INJECTED`]; nothing is
    /// read or written for it.
    pub fn fail_op(&self, n: u64) {
        // Relaxed: the counter and the mark are only compared with each other; the queue that
        // runs the op reads both on its own thread after this call returned.
        let at = self.shared.ops.load(Ordering::Relaxed) + n;
        self.shared.fail_at.store(at, Ordering::Relaxed);
    }

    /// Takes the engine away: every queue's next call fails with [`userdma::ring::Error::Removed`].
    pub fn remove(&self) {
        // Relaxed: a flag on its own; the queues read it before each call.
        self.shared.removed.store(true, Ordering::Relaxed);
    }

    /// Ops run so far.
    pub fn ops(&self) -> u64 {
        self.shared.ops.load(Ordering::Relaxed)
    }

    fn window(&self, at: u64, len: usize) -> Result<dma::Window, crate::Error> {
        self.shared
            .space
            .translate(Iova(at), len)
            .ok_or_else(|| outside(at, len))
    }
}

fn outside(at: u64, len: usize) -> crate::Error {
    userdma::device::Error::DeviceMemoryRange {
        offset: at,
        len: len as u64,
        align: 1,
        why: "not inside one arena of the memory engine",
    }
    .into()
}

impl Accelerator for MemoryEngine {
    fn identity(&self) -> String {
        self.name.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: "host memory",
            compute: false,
            filter: false,
            separate_units: false,
            cross_queue_order: false,
            device_memory: false,
            read_in_place: true,
            contexts: false,
            interrupts: false,
            queues: self.queues,
        }
    }

    fn map_host(&self, region: Arc<Region>) -> Result<Mapping, crate::Error> {
        Ok(self.shared.space.map(region)?)
    }

    fn host_pool(&self, bytes: usize) -> Result<Arc<Pool>, crate::Error> {
        Ok(userdma::runtime::pool(
            self.shared.space.as_ref(),
            bytes,
            PageSize::Base,
        )?)
    }

    fn alloc_arena(&self, bytes: u64, align: u64) -> Result<Arena, crate::Error> {
        let refuse = |why| userdma::device::Error::DeviceMemoryRange {
            offset: 0,
            len: bytes,
            align,
            why,
        };
        if !align.is_power_of_two() || align > 4096 {
            return Err(refuse("give a power of two up to 4096 (arenas are page-aligned)").into());
        }
        let len = usize::try_from(bytes).map_err(|_| refuse("larger than the address space"))?;
        // One mapping per arena: page-aligned, as large as asked, unmapped when dropped.
        let mapping =
            userdma::runtime::map_memory(self.shared.space.as_ref(), len, PageSize::Base)?;
        let range = mapping
            .iova_range()
            .ok_or_else(|| refuse("the mapping is not one IOVA range"))?;
        Ok(Arena {
            at: range.start,
            bytes,
            keep: Box::new(mapping),
        })
    }

    fn read_arena(&self, at: u64, dst: &mut [u8]) -> Result<(), crate::Error> {
        Ok(self.window(at, dst.len())?.slice().read_into(0, dst)?)
    }

    fn write_arena(&self, at: u64, src: &[u8]) -> Result<(), crate::Error> {
        Ok(self.window(at, src.len())?.slice().write_from(0, src)?)
    }

    fn open_queue(&self, spec: QueueSpec) -> Result<Box<dyn Queue>, crate::Error> {
        if spec.id >= self.queues {
            return Err(userdma::device::Error::NoSuchQueue {
                index: u32::from(spec.id),
                count: u32::from(self.queues),
            }
            .into());
        }
        if spec.unit != Unit::Copy {
            return Err(crate::pipeline::Error::Lacks {
                device: self.identity(),
                kind: "host memory",
                lacks: "compute unit",
                setting: "a compute queue",
                hint: "open copy queues only; the model's steps run on the host",
            }
            .into());
        }
        if spec.depth < 2 || !spec.depth.is_power_of_two() || spec.depth > userdma::ring::MAX_DEPTH
        {
            return Err(userdma::ring::Error::InvalidDepth {
                depth: spec.depth,
                max: userdma::ring::MAX_DEPTH,
            }
            .into());
        }
        let depth = spec.depth as usize;
        Ok(Box::new(MemoryQueue {
            id: spec.id,
            depth,
            shared: Arc::clone(&self.shared),
            resets: self.shared.resets.load(Ordering::Acquire),
            queued: VecDeque::with_capacity(depth),
            announced: VecDeque::with_capacity(depth),
            done: VecDeque::with_capacity(depth),
            chunk: vec![0; CHUNK],
            command: 0,
        }))
    }

    fn reset(&self) -> Result<(), crate::Error> {
        // Release: a queue that sees the new count (Acquire) sees that it was stopped.
        self.shared.resets.fetch_add(1, Ordering::Release);
        Ok(())
    }

    fn is_removed(&self) -> bool {
        self.shared.removed.load(Ordering::Relaxed)
    }

    fn status_name(&self, status: u32) -> &'static str {
        match status {
            UNMAPPED => "unmapped (an address outside the engine's DMA space)",
            INJECTED => "injected (failed on purpose)",
            UNSUPPORTED => "unsupported (the memory engine only copies)",
            other => super::default_status_name(other),
        }
    }
}

/// A queue of the memory engine: ops run, in order, when it is polled after a flush.
struct MemoryQueue {
    id: u16,
    depth: usize,
    shared: Arc<Shared>,
    /// The engine's reset count when the queue was opened.
    resets: u64,
    /// Pushed, not yet announced.
    queued: VecDeque<(Op, u64, u16)>,
    /// Announced, not yet run.
    announced: VecDeque<(Op, u64, u16)>,
    /// Run, not yet handed back.
    done: VecDeque<Completion>,
    chunk: Vec<u8>,
    command: u16,
}

impl MemoryQueue {
    fn check(&self) -> Result<(), crate::Error> {
        if self.shared.removed.load(Ordering::Relaxed) {
            return Err(userdma::ring::Error::Removed {
                queue: self.id,
                in_flight: self.in_flight(),
            }
            .into());
        }
        if self.shared.resets.load(Ordering::Acquire) != self.resets {
            // The engine was reset after this queue was opened: it stopped.
            return Err(userdma::ring::Error::Faulted { queue: self.id }.into());
        }
        Ok(())
    }

    /// Copies `len` bytes at IOVA `from` to IOVA `to`, a chunk at a time.
    fn copy(&mut self, from: u64, to: u64, len: u64) -> u32 {
        let space = &self.shared.space;
        let (Some(src), Some(dst)) = (
            usize::try_from(len)
                .ok()
                .and_then(|n| space.translate(Iova(from), n)),
            usize::try_from(len)
                .ok()
                .and_then(|n| space.translate(Iova(to), n)),
        ) else {
            return UNMAPPED;
        };
        let (src, dst) = (src.slice(), dst.slice());
        let mut at = 0;
        while at < src.len() {
            let n = (src.len() - at).min(CHUNK);
            let chunk = &mut self.chunk[..n];
            if src.read_into(at, chunk).is_err() || dst.write_from(at, chunk).is_err() {
                return UNMAPPED;
            }
            at += n;
        }
        0
    }

    /// Runs every announced op.
    fn run(&mut self) {
        while let Some((op, tag, command)) = self.announced.pop_front() {
            // Relaxed: see `MemoryEngine::fail_op`.
            let n = self.shared.ops.fetch_add(1, Ordering::Relaxed);
            let status = if n == self.shared.fail_at.load(Ordering::Relaxed) {
                INJECTED
            } else {
                match op {
                    Op::ToDevice { from, to } => self.copy(from.iova.raw(), to, from.len),
                    Op::ToHost { from, to } => self.copy(from, to.iova.raw(), to.len),
                    Op::Step { .. } | Op::After { .. } => UNSUPPORTED,
                }
            };
            self.done.push_back(Completion {
                tag,
                status,
                result: 0,
                queue: self.id,
                command,
            });
        }
    }

    fn in_flight(&self) -> usize {
        self.queued.len() + self.announced.len() + self.done.len()
    }
}

impl Queue for MemoryQueue {
    fn id(&self) -> u16 {
        self.id
    }

    fn push(&mut self, op: Op, tag: u64) -> Result<(), crate::Error> {
        self.check()?;
        if self.in_flight() >= self.depth {
            return Err(userdma::ring::Error::Full {
                queue: self.id,
                depth: self.depth as u32,
            }
            .into());
        }
        self.queued.push_back((op, tag, self.command));
        self.command = self.command.wrapping_add(1);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), crate::Error> {
        self.check()?;
        self.announced.extend(self.queued.drain(..));
        Ok(())
    }

    fn poll(&mut self) -> Result<Option<Completion>, crate::Error> {
        self.check()?;
        if self.done.is_empty() {
            self.run();
        }
        Ok(self.done.pop_front())
    }

    fn overdue(&self, waited: Duration) -> crate::Error {
        userdma::ring::Error::Timeout {
            queue: self.id,
            waited,
            in_flight: self.in_flight(),
            oldest: None,
        }
        .into()
    }

    fn shutdown(self: Box<Self>) -> Result<Stopped, crate::Error> {
        // The engine runs ops only inside `poll`, on the caller's thread: once here, it touches
        // nothing more, so whatever did not run is aborted.
        let MemoryQueue {
            queued,
            announced,
            done,
            ..
        } = *self;
        Ok(Stopped {
            completed: done.into_iter().collect(),
            aborted: announced
                .into_iter()
                .chain(queued)
                .map(|(_, tag, _)| tag)
                .collect(),
        })
    }
}
