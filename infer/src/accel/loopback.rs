//! The loopback NPU as an [`Accelerator`]: all of it — two units (a copy engine and a compute
//! unit that run at once), device memory for the arenas, every step kind on the device
//! (filtering included), `Wait` descriptors ordering queues, contexts whose switches the cost
//! model charges with the SRAM refill, interrupts, and activity records (the device's trace
//! unit: [`userdma_loopback::activity`], a buffer of host memory the engine maps and keeps).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::{
    Accelerator, Activity, ActivityDrained, ActivityKind, Arena, Capabilities, Completion, Op,
    Queue, QueueSpec, Stopped, Unit,
};
use crate::pipeline::{Step, WorkingSet};
use userdma::device::Device;
use userdma::dma::{DeviceOffset, Mapping};
use userdma::memory::{PageSize, Region};
use userdma::pool::Pool;
use userdma::ring::{self, Command};
use userdma::Runtime;
use userdma_loopback::activity::{Log, Record};
use userdma_loopback::{self as lb, Descriptor, Loopback, LoopbackRuntime, Opcode, StatusCode};

/// The loopback NPU of a runtime, as an accelerator.
#[derive(Debug)]
pub struct LoopbackEngine {
    runtime: Runtime,
    device: Arc<Loopback>,
    /// Per queue id: its completed counter when it was last opened, the base of
    /// [`Op::After`]'s count (a `Wait` descriptor waits for the device's absolute count).
    bases: Arc<[AtomicU64]>,
    /// The activity records, while on ([`Accelerator::record_activity`]): the buffer the
    /// device writes them to, kept until they are stopped or the engine dropped.
    activity: Mutex<Option<Log>>,
}

impl LoopbackEngine {
    /// The loopback device of `runtime`.
    ///
    /// # Errors
    /// [`userdma::Error::Unsupported`] for a runtime whose device is not the loopback NPU
    /// (give the pipeline that device's own engine).
    pub fn new(runtime: &Runtime) -> Result<LoopbackEngine, crate::Error> {
        let device = runtime
            .loopback_device()
            .ok_or_else(|| userdma::Error::Unsupported {
                device: runtime.device().identity().to_string(),
                what: "loopback NPU",
                hint: "give the pipeline the engine of this device (Pipeline::on), or use Runtime::loopback",
            })?;
        let queues = device.config().queue_count();
        Ok(LoopbackEngine {
            runtime: runtime.clone(),
            device: Arc::clone(device),
            bases: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            activity: Mutex::new(None),
        })
    }

    /// The device.
    pub fn device(&self) -> &Arc<Loopback> {
        &self.device
    }

    /// The activity log, locked (a poisoned lock is still consistent: every change under it
    /// is a whole replacement or a drain, whose counts are kept in the log).
    fn activity(&self) -> MutexGuard<'_, Option<Log>> {
        self.activity
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The engine's unit of the loopback device's unit (the one [`LoopbackEngine::open_queue`]
/// serves a queue of that unit with).
fn unit_of(unit: Option<lb::Unit>) -> Unit {
    match unit {
        Some(lb::Unit::Compute) => Unit::Compute,
        // A record that passed its check names a unit: the copy engine here.
        Some(lb::Unit::Copy) | None => Unit::Copy,
    }
}

/// What a descriptor of `opcode` was, as an op.
fn kind_of(opcode: Option<Opcode>) -> ActivityKind {
    match opcode {
        Some(Opcode::ToDevice) => ActivityKind::ToDevice,
        Some(Opcode::ToHost) => ActivityKind::ToHost,
        Some(Opcode::Compute | Opcode::Layer | Opcode::Compact) => ActivityKind::Compute,
        Some(Opcode::Wait) => ActivityKind::Wait,
        Some(Opcode::Nop | Opcode::DeviceCopy | Opcode::Fill) | None => ActivityKind::Other,
    }
}

/// A device record as an [`Activity`].
fn activity_of(record: &Record) -> Activity {
    Activity {
        unit: unit_of(record.unit()),
        queue: record.queue,
        command: record.command,
        context: record.context,
        kind: kind_of(record.opcode()),
        status: u32::from(record.status),
        start_ns: record.start_ns,
        end_ns: record.end_ns,
        bytes: record.bytes,
        switched: record.switched(),
        sram_touched: record.sram_touched,
        sram_missed: record.sram_missed,
    }
}

impl Accelerator for LoopbackEngine {
    fn identity(&self) -> String {
        self.device.identity().to_string()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: "loopback NPU",
            compute: true,
            filter: true,
            separate_units: true,
            cross_queue_order: true,
            device_memory: true,
            read_in_place: true,
            contexts: true,
            interrupts: true,
            queues: u16::try_from(self.bases.len()).unwrap_or(u16::MAX),
        }
    }

    fn host_pool(&self, bytes: usize) -> Result<Arc<Pool>, crate::Error> {
        // Page aligned (see the trait): the device would take the coloured layout.
        let config = Runtime::pool_config(PageSize::Base).colouring(false);
        Ok(self.runtime.pool_with(bytes, PageSize::Base, config)?)
    }

    fn map_host(&self, region: Arc<Region>) -> Result<Mapping, crate::Error> {
        Ok(self.runtime.dma_space().map(region)?)
    }

    fn alloc_arena(&self, bytes: u64, align: u64) -> Result<Arena, crate::Error> {
        let range = self.runtime.device_memory()?.alloc(bytes, align)?;
        Ok(Arena {
            at: range.offset().raw(),
            bytes,
            keep: Box::new(range),
        })
    }

    fn read_arena(&self, at: u64, dst: &mut [u8]) -> Result<(), crate::Error> {
        let at = usize::try_from(at).map_err(|_| beyond(at, dst.len()))?;
        Ok(self.device.read_device_memory(at, dst)?)
    }

    fn write_arena(&self, at: u64, src: &[u8]) -> Result<(), crate::Error> {
        let at = usize::try_from(at).map_err(|_| beyond(at, src.len()))?;
        Ok(self.device.device_memory().write_from(at, src)?)
    }

    fn open_queue(&self, spec: QueueSpec) -> Result<Box<dyn Queue>, crate::Error> {
        let base =
            self.bases
                .get(usize::from(spec.id))
                .ok_or(userdma::device::Error::NoSuchQueue {
                    index: u32::from(spec.id),
                    count: self.bases.len() as u32,
                })?;
        let completed = self
            .device
            .counters()?
            .queues
            .get(usize::from(spec.id))
            .map_or(0, |q| q.completed);
        // Relaxed: the count is read by this engine's queues on the thread that drives them,
        // after this call returned (the pipeline opens and pushes from one thread); no other
        // memory is published through it.
        base.store(completed, Ordering::Relaxed);
        let config = ring::Config::new(spec.depth)
            .with_id(spec.id)
            .with_context(spec.context);
        let unit = match spec.unit {
            Unit::Copy => lb::Unit::Copy,
            Unit::Compute => lb::Unit::Compute,
        };
        let queue = self.device.open_queue_on::<u64>(config, spec.wait, unit)?;
        Ok(Box::new(LoopbackQueue {
            queue,
            context: spec.context,
            bases: Arc::clone(&self.bases),
        }))
    }

    fn set_working_set(&self, queue: u16, set: WorkingSet) -> Result<(), crate::Error> {
        Ok(self
            .device
            .set_working_set(queue, set.private, set.shared, set.key)?)
    }

    /// Resets the device; activity records that were on are started again (the reset turned
    /// them off), those not drained before it counted lost by the next drain.
    fn reset(&self) -> Result<(), crate::Error> {
        let mut activity = self.activity();
        if let Some(log) = activity.as_mut() {
            log.note_reset();
        }
        Device::reset(self.device.as_ref())?;
        if let Some(log) = activity.as_mut() {
            log.restart()?;
        }
        Ok(())
    }

    /// Maps a buffer of `records_per_unit` records per unit (both units) into the device's
    /// DMA space and starts the device's records into it (replacing records that were on).
    fn record_activity(&self, records_per_unit: u32) -> Result<(), crate::Error> {
        let mut activity = self.activity();
        if let Some(old) = activity.take() {
            // Stopped before the new one programs the same registers.
            old.stop()?;
        }
        *activity = Some(Log::start(Arc::clone(&self.device), records_per_unit)?);
        Ok(())
    }

    fn drain_activity(
        &self,
        out: &mut dyn FnMut(&Activity),
    ) -> Result<ActivityDrained, crate::Error> {
        let mut activity = self.activity();
        let Some(log) = activity.as_mut() else {
            return Ok(ActivityDrained::default());
        };
        let drained = log.drain(&mut |record| out(&activity_of(record)));
        Ok(ActivityDrained {
            records: drained.records,
            lost: drained.lost,
            // A count that went backwards is a device fault too.
            bad: drained.bad.saturating_add(drained.rewound),
        })
    }

    fn stop_activity(&self) {
        if let Some(log) = self.activity().take() {
            // A device that did not stop keeps the buffer (leaked, never reused): nothing
            // more to do here.
            let _ = log.stop();
        }
    }

    fn is_removed(&self) -> bool {
        Device::is_removed(self.device.as_ref())
    }

    fn status_name(&self, status: u32) -> &'static str {
        u16::try_from(status)
            .ok()
            .and_then(StatusCode::from_raw)
            .map_or_else(|| super::default_status_name(status), StatusCode::name)
    }

    fn key(&self) -> usize {
        Arc::as_ptr(&self.device) as usize
    }
}

fn beyond(at: u64, len: usize) -> crate::Error {
    userdma::device::Error::DeviceMemoryRange {
        offset: at,
        len: len as u64,
        align: 1,
        why: "beyond the address space",
    }
    .into()
}

/// A queue of the loopback NPU: ops become its descriptors.
struct LoopbackQueue {
    queue: lb::Queue<u64>,
    context: u32,
    bases: Arc<[AtomicU64]>,
}

/// The loopback descriptor of `op`.
#[inline]
pub(crate) fn descriptor(op: &Op, bases: &[AtomicU64]) -> Descriptor {
    match *op {
        Op::ToDevice { from, to } => Descriptor::to_device(from.iova, DeviceOffset(to), from.len),
        Op::ToHost { from, to } => Descriptor::to_host(DeviceOffset(from), to.iova, to.len),
        Op::After { queue, count } => {
            // Relaxed: see `LoopbackEngine::open_queue`.
            let base = bases
                .get(usize::from(queue))
                .map_or(0, |b| b.load(Ordering::Relaxed));
            Descriptor::wait(queue, base + count)
        }
        Op::Step { arena, step } => {
            let base = DeviceOffset(arena);
            match step {
                Step::Compute {
                    src,
                    dst,
                    len,
                    xor,
                    add,
                } => Descriptor::compute(base + src, base + dst, len, xor, add),
                Step::Layer {
                    inputs,
                    count,
                    dst,
                    len,
                    seed,
                } => {
                    let mut at = [(base, 0); 3];
                    for (a, &(offset, bytes)) in at.iter_mut().zip(&inputs) {
                        *a = (base + offset, bytes);
                    }
                    // One to three inputs of at most 4 GiB each: checked when the model was
                    // built; a count out of range reaches the device as a Nop of length 0,
                    // which it fails with BadLength.
                    Descriptor::layer(&at[..usize::from(count.min(3))], base + dst, len, seed)
                        .unwrap_or_else(|_| Descriptor::nop())
                }
                Step::Compact {
                    src,
                    len,
                    dst,
                    params,
                } => Descriptor::compact(
                    base + src,
                    len,
                    params.record,
                    params.score_at,
                    params.threshold,
                    base + dst,
                    params.capacity,
                ),
            }
        }
    }
}

fn completion(done: ring::Done<ring::Status, u64>) -> Completion {
    Completion {
        tag: done.payload,
        status: u32::from(done.entry.code()),
        result: done.entry.result,
        queue: done.entry.queue_id,
        command: done.id,
    }
}

impl Queue for LoopbackQueue {
    fn id(&self) -> u16 {
        self.queue.id()
    }

    #[inline]
    fn push(&mut self, op: Op, tag: u64) -> Result<(), crate::Error> {
        let command = Command {
            context: self.context,
            ..descriptor(&op, &self.bases).build()
        };
        self.queue.push(command, tag)?;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), crate::Error> {
        Ok(self.queue.flush()?)
    }

    #[inline]
    fn poll(&mut self) -> Result<Option<Completion>, crate::Error> {
        Ok(self.queue.poll_one()?.map(completion))
    }

    fn wait(&mut self, timeout: Duration) -> Result<Completion, crate::Error> {
        Ok(completion(self.queue.wait(Some(timeout))?))
    }

    fn waitable(&mut self) -> Option<&mut dyn ring::Waitable> {
        Some(&mut self.queue)
    }

    fn interrupt(&self) -> Option<&userdma::irq::EventFd> {
        self.queue.interrupt()
    }

    fn overdue(&self, waited: Duration) -> crate::Error {
        self.queue.overdue(waited).into()
    }

    fn shutdown(self: Box<Self>) -> Result<Stopped, crate::Error> {
        let stopped = self.queue.shutdown(Duration::ZERO)?;
        Ok(Stopped {
            completed: stopped.completed.into_iter().map(completion).collect(),
            aborted: stopped.aborted.into_iter().map(|(_, tag)| tag).collect(),
        })
    }
}

#[cfg(test)]
mod tests;
