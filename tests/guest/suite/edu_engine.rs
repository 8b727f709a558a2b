//! edu as an accelerator ([`EduEngine`]): QEMU's edu device, opened through VFIO, behind
//! `userdma_infer::accel::Accelerator`, so that the library's own pipeline and streams run on
//! a real PCI device.
//!
//! What edu has: one register-driven DMA engine that moves bytes between host memory (by IOVA,
//! below its 28-bit mask) and a 4 KiB buffer inside the device, one transfer at a time, each
//! ending about 100 ms after it starts (QEMU's timer) and, when asked, with an MSI. What it has
//! not: compute, and memory the host can reach (its buffer is behind no BAR). So:
//!
//! - **Arenas are host memory**, one mapping each in the runtime's DMA space, addressed by
//!   their IOVA ([`Arena::at`]); the host reads and writes them through volatile slices
//!   ([`Accelerator::read_arena`], [`Accelerator::write_arena`]): the model's steps run on the
//!   host (the pipeline puts `accel::HostSteps` in front of the queue) and results can be read
//!   in place.
//! - **A copy is two hops through edu's buffer**: a `ToDevice` (host buffer → arena) or
//!   `ToHost` (arena → host buffer) moves a chunk of up to [`edu::MAX_TRANSFER`] bytes from
//!   host memory into the buffer, then from the buffer out to host memory, until the op's bytes
//!   are across ([`queue`]).
//! - **One queue** (id 0) by default: one engine and one buffer serve one op at a time, in
//!   order. An engine made with [`EduEngine::with_queues`] offers several (a device owner
//!   gives each stream a queue of its own); they take turns on the one engine: a copy holds
//!   edu's engine and buffer from its first transfer to its last, and another queue's copy
//!   starts once it is across. Model steps and waits on other queues complete with
//!   [`UNSUPPORTED`] (a pipeline never gives them: the capabilities say no compute and no
//!   ordering across queues).
//! - Every address an op names is checked against what the engine handed out before edu is
//!   told about it: an arena address must lie inside one live arena, a host buffer inside one
//!   of the host pools ([`Accelerator::host_pool`]) or of the caller's regions mapped for the
//!   device ([`Accelerator::map_host`]), its IOVA the one that mapping has for its host
//!   address and contiguous for the device; otherwise the op fails with a status
//!   ([`OUTSIDE_ARENA`], [`UNKNOWN_HOST_BUFFER`], [`BEYOND_MASK`]) and edu never sees it.
//!
//! | module | owns |
//! |---|---|
//! | this one | [`EduEngine`]: its capabilities, the arenas, host pools and mapped regions it knows, reset, status names |
//! | [`queue`] | the queue: ops in order through the DMA engine, completions, waiting, shutdown |

pub(crate) mod queue;

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use userdma::device::{self, Wait};
use userdma::dma::{self, Mapping};
use userdma::irq::EventFd;
use userdma::memory::{PageSize, Region};
use userdma::pool::Pool;
use userdma::{ring, Runtime};
use userdma_infer::accel::{
    self, Accelerator, Arena, Capabilities, HostSpan, Queue, QueueSpec, Unit,
};

use crate::edu::{self, Edu, Engine};
use crate::failure::{ensure, Context, Failure};

/// Status of a model step or a wait on another queue: edu only copies, on one queue.
pub(crate) const UNSUPPORTED: u32 = 1;
/// Status of a copy whose arena range is not inside one live arena of this engine; the
/// completion's result is the arena address.
pub(crate) const OUTSIDE_ARENA: u32 = 2;
/// Status of a copy whose host buffer is not inside a host pool or mapped region of this
/// engine (or not contiguous for the device there); the completion's result is the buffer's
/// IOVA.
pub(crate) const UNKNOWN_HOST_BUFFER: u32 = 3;
/// Status of a copy that would reach past edu's 28-bit DMA mask; the result is the address.
pub(crate) const BEYOND_MASK: u32 = 4;

/// How long a stop (a reset, a queue's shutdown) waits for the transfer under way to end. edu
/// cannot abort one: it ends on QEMU's timer about 100 ms after it started; the margin covers
/// a loaded machine under software emulation.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a stop looks at the engine while a transfer runs.
const STOP_POLL: Duration = Duration::from_millis(1);
/// The page size an arena's memory is made of (see [`EduEngine::alloc_arena`]).
const PAGE: u64 = 4096;
/// The most queues an engine offers ([`EduEngine::with_queues`]; one bit each in
/// [`Shared::open`]).
pub(crate) const MAX_QUEUES: u16 = 32;

/// The arenas and host pools the engine handed out: what an op's addresses are checked against.
#[derive(Debug, Default)]
struct Known {
    /// Live arenas (one mapping each), removed when their [`Arena`] is dropped.
    arenas: Mutex<Vec<ArenaMemory>>,
    /// The memory of the host pools made by [`EduEngine::host_pool`] and the regions mapped by
    /// [`EduEngine::map_host`] (the ones still alive are checked). A pool's entry follows its
    /// memory, not its handle: an owned buffer keeps the memory after the handle is gone.
    hosts: Mutex<Vec<HostMapping>>,
    /// The id the next arena gets.
    next: AtomicU64,
}

/// One arena's memory.
#[derive(Debug)]
struct ArenaMemory {
    id: u64,
    /// Its first IOVA (the arena's address) and its length.
    at: u64,
    len: u64,
    mapping: Mapping,
}

/// A caller's region the engine mapped for edu ([`Accelerator::map_host`]): what its mapping
/// translates, kept to check the host buffers ops name in it. The mapping itself went to the
/// caller; it holds the region, so the region being alive is the mapping being alive as long
/// as the mapping is the region's last holder (a device owner keeps a client's region in its
/// pool's mapping alone).
#[derive(Debug)]
struct HostMapping {
    region: Weak<Region>,
    /// The host address of its first byte, and its length.
    base: usize,
    len: usize,
    /// Its pieces as the space mapped them, in region order: region offset, first IOVA, bytes.
    segments: Box<[(usize, u64, u64)]>,
}

/// What an [`Arena`] keeps: its entry in [`Known::arenas`], removed (and the mapping unmapped)
/// when the arena is dropped.
#[derive(Debug)]
struct ArenaKeep {
    id: u64,
    known: Arc<Known>,
}

impl Drop for ArenaKeep {
    fn drop(&mut self) {
        let mut arenas = lock(&self.known.arenas);
        if let Some(k) = arenas.iter().position(|a| a.id == self.id) {
            // The mapping is unmapped here: the pipeline drops an arena only once no op on it
            // is out (the ownership rule of `accel`).
            arenas.swap_remove(k);
        }
    }
}

/// A lock whose holder cannot leave its data half-changed (every change is one push or
/// remove), so a poisoned one is still consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Known {
    /// Runs `f` over the `len` bytes at arena address `at` if they lie inside one live arena.
    fn with_arena<R>(&self, at: u64, len: u64, f: impl FnOnce(dma::Slice<'_>) -> R) -> Option<R> {
        let arenas = lock(&self.arenas);
        let arena = arenas.iter().find(|a| inside(at, len, a.at, a.len))?;
        let offset = usize::try_from(at - arena.at).ok()?;
        let len = usize::try_from(len).ok()?;
        let slice = arena.mapping.slice_at(offset, len).ok()?;
        Some(f(slice))
    }

    /// Whether `at..at + len` lies inside one live arena.
    fn holds_arena(&self, at: u64, len: u64) -> bool {
        lock(&self.arenas)
            .iter()
            .any(|a| inside(at, len, a.at, a.len))
    }

    /// Whether `span` lies inside a live host pool or mapped region of the engine, with the
    /// IOVA that mapping has for its host address, and contiguous for the device.
    fn holds_host(&self, span: &HostSpan) -> bool {
        let Ok(len) = usize::try_from(span.len) else {
            return false;
        };
        // Host addresses compared as numbers, never dereferenced.
        let ptr = span.ptr.as_ptr() as usize;
        lock(&self.hosts).iter().any(|h| {
            h.region.strong_count() > 0
                && ptr.checked_sub(h.base).is_some_and(|offset| {
                    offset.checked_add(len).is_some_and(|end| end <= h.len)
                        && in_segments(&h.segments, offset, span.len, span.iova.raw())
                })
        })
    }

    /// Remembers `mapping` (of `region`) for the address checks while the region lives: a
    /// host buffer in it passes when its IOVA is the one this mapping gives its host address.
    fn remember(&self, region: &Arc<Region>, mapping: &Mapping) {
        let segments = mapping
            .segments()
            .map(|(offset, range)| (offset, range.start, range.last - range.start + 1))
            .collect();
        let mut hosts = lock(&self.hosts);
        hosts.retain(|h| h.region.strong_count() > 0);
        hosts.push(HostMapping {
            region: Arc::downgrade(region),
            base: mapping.as_ptr().as_ptr() as usize,
            len: mapping.len(),
            segments,
        });
    }
}

/// Whether the `len` bytes at region offset `offset` of a mapping of `segments` (region
/// offset, first IOVA, bytes; in region order) start at IOVA `iova` and are contiguous for the
/// device (across pieces that follow each other in both the region and the IOVA space).
fn in_segments(segments: &[(usize, u64, u64)], offset: usize, len: u64, iova: u64) -> bool {
    let Some(k) = segments
        .iter()
        .position(|&(at, _, bytes)| offset >= at && ((offset - at) as u64) < bytes)
    else {
        return false;
    };
    let (at, start, bytes) = segments[k];
    let into = (offset - at) as u64;
    if start.checked_add(into) != Some(iova) {
        return false;
    }
    // The contiguous run from `offset` on: this piece's rest, then every piece that follows
    // it in the region and in IOVAs.
    let mut run = bytes - into;
    let (mut next_at, mut next_iova) = (at as u64 + bytes, start.saturating_add(bytes));
    for &(at, start, bytes) in &segments[k + 1..] {
        if run >= len || at as u64 != next_at || start != next_iova {
            break;
        }
        run += bytes;
        next_at += bytes;
        next_iova = next_iova.saturating_add(bytes);
    }
    run >= len
}

/// Whether `at..at + len` lies inside `start..start + size`.
fn inside(at: u64, len: u64, start: u64, size: u64) -> bool {
    at >= start
        && at
            .checked_add(len)
            .is_some_and(|end| end <= start.saturating_add(size))
}

/// Counts of what the engine did, over its life.
#[derive(Debug, Default)]
struct Counters {
    transfers: AtomicU64,
    interrupts: AtomicU64,
    bytes: AtomicU64,
    seen_ns: AtomicU64,
}

/// What the engine did so far ([`EduEngine::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Stats {
    /// Transfers edu ran (each hop of each chunk).
    pub(crate) transfers: u64,
    /// Interrupts (MSIs) counted on the vector's eventfd.
    pub(crate) interrupts: u64,
    /// Bytes copied from host memory to host memory through edu's buffer.
    pub(crate) bytes: u64,
    /// Per transfer, from its start to the host seeing it ended, summed (ns).
    pub(crate) seen_ns: u64,
}

/// State the engine and its queue share.
#[derive(Debug)]
struct Shared {
    edu: Edu,
    /// The MSI edu raises at the end of a transfer, when the engine was given one.
    vector: Option<EventFd>,
    runtime: Runtime,
    identity: String,
    known: Arc<Known>,
    /// Resets so far: a queue opened before the latest one is stopped.
    resets: AtomicU64,
    /// Queues offered (ids `0..queues`).
    queues: u16,
    /// The queues open, a bit each (a queue id is open once).
    open: AtomicU32,
    /// Which queue's copy holds edu's engine and buffer: its id + 1; 0 when none does.
    holder: AtomicU32,
    counters: Counters,
}

impl Shared {
    /// Whether the device is gone.
    fn removed(&self) -> bool {
        self.runtime.device().is_removed()
    }

    /// Adds the interrupts waiting on the vector's eventfd to the count (it resets to zero).
    fn drain_interrupts(&self) -> Result<(), userdma::irq::Error> {
        if let Some(vector) = &self.vector {
            if let Some(count) = vector.try_read()? {
                // Relaxed: a statistic; nothing is published through it.
                self.counters.interrupts.fetch_add(count, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Waits until no transfer runs (edu cannot abort one), or the device is gone. Returns
    /// whether it is gone.
    fn wait_idle(&self, queue: u16, what: &'static str) -> Result<bool, userdma_infer::Error> {
        let start = Instant::now();
        loop {
            if self.removed() {
                return Ok(true);
            }
            match self
                .edu
                .engine()
                .map_err(|f| driver(queue, "read edu's DMA command register", f))?
            {
                Engine::Idle => {
                    // Acquire: what the ended transfer wrote is seen after this (pairs with
                    // the device's writes before it cleared the start bit).
                    fence(Ordering::Acquire);
                    return Ok(false);
                }
                Engine::Gone => return Ok(true),
                Engine::Running => {}
            }
            let waited = start.elapsed();
            if waited >= STOP_TIMEOUT {
                return Err(userdma::Error::from(device::Error::Timeout {
                    operation: what,
                    waited,
                })
                .into());
            }
            thread::sleep(STOP_POLL);
        }
    }
}

/// A failure of edu's register interface (a `Failure` of `crate::edu`) as the inference
/// layer's error: a driver failure of the queue, `Code::Device` (a device fault the pipeline
/// and the streams recover from).
fn driver(queue: u16, operation: &'static str, failure: Failure) -> userdma_infer::Error {
    userdma::Error::from(device::Error::Driver {
        queue,
        operation,
        source: Box::new(failure),
    })
    .into()
}

/// QEMU's edu through VFIO as an accelerator: see the module docs.
#[derive(Debug)]
pub(crate) struct EduEngine {
    shared: Arc<Shared>,
}

impl EduEngine {
    /// The engine over edu's registers `edu`, DMA through `runtime` (which owns the VFIO
    /// device, opened with edu's 28-bit mask), and, when given, MSI vector `vector` (edu's
    /// transfers then end with an interrupt, and queues opened with `Wait::Interrupt` sleep on
    /// it). Acknowledges what edu has pending and drains the vector, so that every interrupt
    /// counted from here on is one of the engine's transfers.
    pub(crate) fn new(
        runtime: Runtime,
        edu: Edu,
        vector: Option<EventFd>,
    ) -> Result<EduEngine, Failure> {
        EduEngine::with_queues(runtime, edu, vector, 1)
    }

    /// [`EduEngine::new`] offering `queues` queues (1 to [`MAX_QUEUES`]), which take turns on
    /// edu's one engine (see the module docs): for a device owner, which gives each stream a
    /// queue of its own.
    pub(crate) fn with_queues(
        runtime: Runtime,
        edu: Edu,
        vector: Option<EventFd>,
        queues: u16,
    ) -> Result<EduEngine, Failure> {
        ensure!(
            (1..=MAX_QUEUES).contains(&queues),
            "{queues} queues: an edu engine offers 1 to {MAX_QUEUES}"
        );
        let bits = runtime.dma_space().dma_mask_bits();
        ensure!(
            bits <= edu::DMA_MASK_BITS,
            "the DMA space gives addresses of {bits} bits; edu reaches {} (open it with Options::dma_mask_bits)",
            edu::DMA_MASK_BITS
        );
        // A transfer an earlier user of the device left running ends on its own.
        edu.wait_idle("before the engine takes the device")?;
        let pending = edu.irq_status()?;
        if pending != 0 {
            edu.ack_irq(pending)?;
        }
        if let Some(vector) = &vector {
            vector
                .try_read()
                .context(|| "drain the MSI vector's eventfd".to_owned())?;
        }
        let identity = format!("edu {}", runtime.device().identity());
        Ok(EduEngine {
            shared: Arc::new(Shared {
                edu,
                vector,
                runtime,
                identity,
                known: Arc::new(Known::default()),
                resets: AtomicU64::new(0),
                queues,
                open: AtomicU32::new(0),
                holder: AtomicU32::new(0),
                counters: Counters::default(),
            }),
        })
    }

    /// What the engine did so far.
    pub(crate) fn stats(&self) -> Stats {
        // Relaxed: statistics, read after the queue that counted them went quiet.
        let c = &self.shared.counters;
        Stats {
            transfers: c.transfers.load(Ordering::Relaxed),
            interrupts: c.interrupts.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            seen_ns: c.seen_ns.load(Ordering::Relaxed),
        }
    }

    /// The caller's regions mapped for edu ([`Accelerator::map_host`]) that are still alive.
    pub(crate) fn mapped_regions(&self) -> usize {
        lock(&self.shared.known.hosts)
            .iter()
            .filter(|h| h.region.strong_count() > 0)
            .count()
    }

    /// The addresses of the live arenas, lowest first.
    pub(crate) fn arenas(&self) -> Vec<u64> {
        let mut at: Vec<u64> = lock(&self.shared.known.arenas)
            .iter()
            .map(|a| a.at)
            .collect();
        at.sort_unstable();
        at
    }

    /// Counts the interrupts still on their way (an MSI can reach its eventfd after the host
    /// saw the transfer end), waiting up to `timeout` until there are as many as transfers;
    /// returns the stats then. For a check that every transfer raised exactly one.
    pub(crate) fn settle_interrupts(&self, timeout: Duration) -> Result<Stats, Failure> {
        let start = Instant::now();
        loop {
            self.shared
                .drain_interrupts()
                .context(|| "read the MSI vector's eventfd".to_owned())?;
            let stats = self.stats();
            let left = timeout.saturating_sub(start.elapsed());
            let (Some(vector), true) = (&self.shared.vector, stats.interrupts < stats.transfers)
            else {
                return Ok(stats);
            };
            if left.is_zero() {
                return Ok(stats);
            }
            if let Some(count) = vector
                .wait(Some(left))
                .context(|| "wait on the MSI vector's eventfd".to_owned())?
            {
                // Relaxed: a statistic.
                self.shared
                    .counters
                    .interrupts
                    .fetch_add(count, Ordering::Relaxed);
            }
        }
    }
}

impl Accelerator for EduEngine {
    fn identity(&self) -> String {
        self.shared.identity.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: "edu DMA",
            compute: false,
            filter: false,
            separate_units: false,
            cross_queue_order: false,
            device_memory: false,
            read_in_place: true,
            contexts: false,
            interrupts: self.shared.vector.is_some(),
            queues: self.shared.queues,
        }
    }

    /// A pool over 2 MiB hugepages: in a physical-address space (no-IOMMU VFIO) a buffer is
    /// contiguous for the device only inside one hugepage.
    fn host_pool(&self, bytes: usize) -> Result<Arc<Pool>, userdma_infer::Error> {
        let pool = self.shared.runtime.pool(bytes, PageSize::Huge2M)?;
        // The pool's mapping is its region's only holder: the region lives as long as the
        // pool's memory (its handle, then its last owned buffer).
        let mapping = pool.mapping();
        self.shared.known.remember(mapping.region(), mapping);
        Ok(pool)
    }

    /// The region mapped into the runtime's DMA space (as the pools are), and remembered for
    /// the address checks while it lives: a host buffer in it passes when its IOVA is the one
    /// this mapping gives its host address.
    fn map_host(&self, region: Arc<Region>) -> Result<Mapping, userdma_infer::Error> {
        let mapping = self
            .shared
            .runtime
            .dma_space()
            .map(Arc::clone(&region))
            .map_err(userdma::Error::from)?;
        self.shared.known.remember(&region, &mapping);
        Ok(mapping)
    }

    /// One mapping per arena: base pages where the space translates (IOVA-contiguous whatever
    /// the pages), 2 MiB hugepages in a physical-address space for an arena of more than a
    /// page (contiguous up to 2 MiB).
    fn alloc_arena(&self, bytes: u64, align: u64) -> Result<Arena, userdma_infer::Error> {
        let refuse = |why| {
            userdma_infer::Error::from(userdma::Error::from(device::Error::DeviceMemoryRange {
                offset: 0,
                len: bytes,
                align,
                why,
            }))
        };
        if !align.is_power_of_two() || align > PAGE {
            return Err(refuse(
                "give a power of two up to 4096 (arenas are page-aligned)",
            ));
        }
        let len = usize::try_from(bytes).map_err(|_| refuse("larger than the address space"))?;
        let runtime = &self.shared.runtime;
        let page = if runtime.dma_space().kind() == dma::Kind::Physical && bytes > PAGE {
            PageSize::Huge2M
        } else {
            PageSize::Base
        };
        let mapping = runtime.map_memory(len, page)?;
        let range = mapping.iova_range().ok_or_else(|| {
            refuse("its memory is not one contiguous range for the device (at most 2 MiB without an IOMMU)")
        })?;
        if range.last >> edu::DMA_MASK_BITS != 0 {
            return Err(refuse("its memory lies past edu's 28-bit DMA mask"));
        }
        let known = &self.shared.known;
        // Relaxed: ids only need to differ.
        let id = known.next.fetch_add(1, Ordering::Relaxed);
        lock(&known.arenas).push(ArenaMemory {
            id,
            at: range.start,
            len: bytes,
            mapping,
        });
        Ok(Arena {
            at: range.start,
            bytes,
            keep: Box::new(ArenaKeep {
                id,
                known: Arc::clone(known),
            }),
        })
    }

    fn read_arena(&self, at: u64, dst: &mut [u8]) -> Result<(), userdma_infer::Error> {
        let len = dst.len() as u64;
        self.shared
            .known
            .with_arena(at, len, |slice| slice.read_into(0, dst))
            .ok_or_else(|| outside(at, len))??;
        Ok(())
    }

    fn write_arena(&self, at: u64, src: &[u8]) -> Result<(), userdma_infer::Error> {
        let len = src.len() as u64;
        self.shared
            .known
            .with_arena(at, len, |slice| slice.write_from(0, src))
            .ok_or_else(|| outside(at, len))??;
        Ok(())
    }

    fn open_queue(&self, spec: QueueSpec) -> Result<Box<dyn Queue>, userdma_infer::Error> {
        let count = u32::from(self.shared.queues);
        let no_such = |index| {
            userdma_infer::Error::from(userdma::Error::from(device::Error::NoSuchQueue {
                index,
                count,
            }))
        };
        if spec.id >= self.shared.queues {
            return Err(no_such(u32::from(spec.id)));
        }
        if spec.unit != Unit::Copy {
            return Err(userdma_infer::pipeline::Error::Lacks {
                device: self.identity(),
                kind: "edu DMA",
                lacks: "compute unit",
                setting: "a compute queue",
                hint: "open copy queues only; the model's steps run on the host",
            }
            .into());
        }
        if spec.depth < 2 || !spec.depth.is_power_of_two() || spec.depth > ring::MAX_DEPTH {
            return Err(userdma::Error::from(ring::Error::InvalidDepth {
                depth: spec.depth,
                max: ring::MAX_DEPTH,
            })
            .into());
        }
        let interrupt = match spec.wait {
            Wait::Poll => false,
            Wait::Interrupt | Wait::Vector(0) => self.shared.vector.is_some(),
            Wait::Vector(other) => return Err(no_such(other)),
        };
        // Acquire: a queue dropped just before (Release in its drop) has stopped using edu.
        let bit = 1_u32 << spec.id;
        if self.shared.open.fetch_or(bit, Ordering::Acquire) & bit != 0 {
            return Err(userdma::Error::from(device::Error::QueueBusy { queue: spec.id }).into());
        }
        Ok(Box::new(queue::EduQueue::open(
            Arc::clone(&self.shared),
            spec,
            interrupt,
        )))
    }

    /// edu has no function reset (VFIO offers none for it): this stops every queue (each one
    /// opened before fails its next call and is shut down by its owner), waits for the transfer
    /// under way to end (edu cannot abort one), frees the engine for the queues opened after,
    /// acknowledges every interrupt edu has pending and checks that its ID register answers.
    fn reset(&self) -> Result<(), userdma_infer::Error> {
        let shared = &self.shared;
        // Release: a queue that sees the new count (Acquire) sees that it was stopped.
        shared.resets.fetch_add(1, Ordering::Release);
        let removed = || {
            userdma_infer::Error::from(userdma::Error::from(device::Error::Removed {
                device: shared.identity.clone(),
            }))
        };
        if shared.wait_idle(0, "finish its DMA transfer for a reset")? {
            return Err(removed());
        }
        // The stopped queues start no transfer any more (their every call fails first).
        // Release: pairs with the Acquire of the next queue that takes the engine.
        shared.holder.store(0, Ordering::Release);
        let pending = shared
            .edu
            .irq_status()
            .map_err(|f| driver(0, "read edu's interrupt status", f))?;
        if pending != 0 {
            shared
                .edu
                .ack_irq(pending)
                .map_err(|f| driver(0, "acknowledge edu's interrupts", f))?;
        }
        let id = shared
            .edu
            .id()
            .map_err(|f| driver(0, "read edu's ID register", f))?;
        if id == u32::MAX {
            return Err(removed());
        }
        Ok(())
    }

    fn is_removed(&self) -> bool {
        self.shared.removed()
    }

    fn status_name(&self, status: u32) -> &'static str {
        status_name(status)
    }
}

/// The name of status code `status` of an edu engine's completion.
fn status_name(status: u32) -> &'static str {
    match status {
        UNSUPPORTED => "unsupported (edu only copies, on one queue: no model steps, no waits on other queues)",
        OUTSIDE_ARENA => "outside every arena (an arena address range no live arena of this engine holds)",
        UNKNOWN_HOST_BUFFER => "unknown host buffer (not inside a host pool of this engine, or not contiguous for the device)",
        BEYOND_MASK => "beyond edu's 28-bit DMA mask",
        other => accel::default_status_name(other),
    }
}

/// The error for arena bytes no live arena holds.
fn outside(at: u64, len: u64) -> userdma_infer::Error {
    userdma::Error::from(device::Error::DeviceMemoryRange {
        offset: at,
        len,
        align: 1,
        why: "not inside one arena of the edu engine",
    })
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_is_inclusive_of_the_ends_and_never_overflows() {
        assert!(inside(0x1000, 0x1000, 0x1000, 0x1000));
        assert!(inside(0x1800, 0x800, 0x1000, 0x1000));
        assert!(!inside(0x1801, 0x800, 0x1000, 0x1000));
        assert!(!inside(0xfff, 1, 0x1000, 0x1000));
        assert!(inside(0x1fff, 1, 0x1000, 0x1000));
        assert!(!inside(u64::MAX, 2, 0x1000, u64::MAX));
        assert!(inside(0x1000, 0, 0x1000, 0x1000));
    }

    #[test]
    fn a_span_in_a_mapped_region_must_have_its_iova_and_be_contiguous() {
        // Three pieces: two that follow each other in IOVAs, then one elsewhere.
        let segments = [
            (0, 0x10_0000, 0x1000),
            (0x1000, 0x10_1000, 0x1000),
            (0x2000, 0x50_0000, 0x2000),
        ];
        assert!(in_segments(&segments, 0, 0x1000, 0x10_0000));
        assert!(in_segments(&segments, 0x800, 0x1000, 0x10_0800));
        assert!(in_segments(&segments, 0x2800, 0x800, 0x50_0800));
        assert!(in_segments(&segments, 0x3fff, 1, 0x50_1fff));
        // Another IOVA than the mapping's for that offset.
        assert!(!in_segments(&segments, 0x800, 0x100, 0x10_0000));
        assert!(!in_segments(&segments, 0x2000, 0x100, 0x10_2000));
        // Across pieces that do not follow each other in IOVAs, or past the end.
        assert!(!in_segments(&segments, 0x1800, 0x1000, 0x10_1800));
        assert!(!in_segments(&segments, 0x3000, 0x2000, 0x50_1000));
        assert!(!in_segments(&segments, 0x4000, 1, 0x50_2000));
        assert!(!in_segments(&[], 0, 1, 0));
    }

    #[test]
    fn every_status_has_its_own_name() {
        let codes = [UNSUPPORTED, OUTSIDE_ARENA, UNKNOWN_HOST_BUFFER, BEYOND_MASK];
        let mut names: Vec<&str> = codes.iter().map(|&c| status_name(c)).collect();
        names.push(status_name(0));
        names.push(status_name(accel::HOST_STEP_FAILED));
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "two codes share a name");
        assert_eq!(status_name(0), "success");
        assert!(status_name(BEYOND_MASK).contains("28-bit"));
    }
}
