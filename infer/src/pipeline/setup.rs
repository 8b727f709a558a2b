//! Building a pipeline ([`Pipeline::new`]): its queues opened once, its slots (host buffers
//! from one pool mapped once, a device arena each), and, with [`Results::Auto`], the two
//! result paths measured to choose the faster.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::descriptor::{command_of, push, Payload};
use super::{
    Config, Error, Model, Pipeline, Progress, QueueSpec, ResultPath, Results, Slot, Summary, Times,
    COMPUTE, MAX_DEPTH,
};
use userdma::memory::PageSize;
use userdma::ring::{self, Command};
use userdma::Runtime;
use userdma_loopback::{self as loopback, Loopback, LoopbackRuntime, LoopbackStatus, StatusCode};

impl Pipeline {
    /// Builds a pipeline on `runtime`'s device for `model`: `config.depth` slots (host buffers
    /// from one pool mapped once, one device arena each) and its queue(s) deep enough for
    /// every slot's descriptors: queue `config.queue`, and with `config.split` also the next
    /// two.
    ///
    /// # Errors
    /// [`userdma::Error::Unsupported`] for a device without the loopback descriptor format or
    /// device memory; [`userdma::Error::Device`] if device memory cannot hold `depth` arenas
    /// (lower the depth) or the queues do not exist; [`userdma::Error::Pool`] /
    /// [`userdma::Error::Memory`] for the host buffers; [`crate::Error::Pipeline`] for a depth
    /// or batch out of range ([`Error::Depth`]), queues past the last id ([`Error::Queues`])
    /// or host buffers too large for the address space ([`Error::HostBuffers`]).
    pub fn new(runtime: &Runtime, model: Model, config: Config) -> Result<Pipeline, crate::Error> {
        if config.depth == 0 || config.batch == 0 || config.depth > MAX_DEPTH {
            return Err(Error::Depth {
                depth: config.depth,
                batch: config.batch,
            }
            .into());
        }
        let per_frame = model.steps().len() + 4;
        // Twice what the slots need: the SQ head the device writes back lags its completions
        // by up to a burst.
        let descriptors = (2 * config.depth * per_frame).next_power_of_two().max(2);
        let ring_depth = u32::try_from(descriptors).unwrap_or(u32::MAX);
        let units: &[loopback::Unit] = if config.split {
            &[
                loopback::Unit::Copy,
                loopback::Unit::Compute,
                loopback::Unit::Copy,
            ]
        } else {
            &[loopback::Unit::Copy]
        };
        let device = runtime
            .loopback_device()
            .ok_or_else(|| userdma::Error::Unsupported {
                device: runtime.device().identity().to_string(),
                what: "loopback descriptor format",
                hint: "the pipeline runs the loopback device's layer ops; use Runtime::loopback",
            })?;
        let counters = device.counters()?;
        let mut queues = Vec::with_capacity(units.len());
        let mut specs = Vec::with_capacity(units.len());
        let mut base = Vec::with_capacity(units.len());
        for (k, &unit) in units.iter().enumerate() {
            let id = config.queue.checked_add(k as u16).ok_or(Error::Queues {
                queue: config.queue,
                after: units.len() - 1,
            })?;
            let steps_here = if config.split { k == COMPUTE } else { k == 0 };
            if let (true, Some(ws)) = (steps_here, config.working_set) {
                device.set_working_set(id, ws.private, ws.shared, ws.key)?;
            }
            let ring_config = ring::Config::new(ring_depth)
                .with_id(id)
                .with_context(config.context);
            queues.push(runtime.queue_on::<Payload>(ring_config, config.wait, unit)?);
            specs.push(QueueSpec {
                config: ring_config,
                unit,
                steps_here,
            });
            base.push(
                counters
                    .queues
                    .get(usize::from(id))
                    .map_or(0, |q| q.completed),
            );
        }
        let (input_bytes, result_bytes) = (model.input().bytes, model.result().bytes);
        let per_slot = input_bytes.div_ceil(4096) * 4096 + result_bytes.div_ceil(4096) * 4096;
        // Room for the pool's alignment of its first chunk and for blocks rounded up to
        // powers of two: twice the buffers, plus 4 MiB.
        let pool_bytes = per_slot
            .checked_mul(2 * config.depth as u64)
            .and_then(|b| b.checked_add(4 << 20))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or(Error::HostBuffers {
                depth: config.depth,
                slot_bytes: per_slot,
            })?;
        let pool = runtime.pool(pool_bytes, PageSize::Base)?;
        let memory = runtime.device_memory()?;
        let mut free = VecDeque::with_capacity(config.depth);
        let mut arenas = Vec::with_capacity(config.depth);
        for index in 0..config.depth {
            let arena = memory.alloc(model.arena_bytes(), 256)?;
            let slot = Slot {
                index,
                input: pool.alloc_owned(input_bytes as usize)?,
                result: pool.alloc_owned(result_bytes as usize)?,
                arena: arena.offset(),
            };
            arenas.push(arena);
            free.push_back(slot);
        }
        let device = Arc::clone(device);
        let mut pushed = vec![0; queues.len()];
        let path = match config.results {
            Results::Copy => ResultPath {
                in_place: false,
                copy_ns: None,
                in_place_ns: None,
            },
            Results::InPlace => ResultPath {
                in_place: true,
                copy_ns: None,
                in_place_ns: None,
            },
            Results::Auto => {
                let slot = free.front().expect("depth >= 1");
                let d2h = queues.len() - 1;
                measure_result_paths(
                    &model,
                    slot,
                    &device,
                    &mut queues[d2h],
                    &mut pushed[d2h],
                    &config,
                )?
            }
        };
        if path.in_place && config.split {
            // The D2H queue is not used: results are read where the compute unit wrote them.
            queues.truncate(2);
            specs.truncate(2);
            base.truncate(2);
            pushed.truncate(2);
        }
        let now = Instant::now();
        let times = Times {
            preprocess: now,
            submitted: now,
            to_device: now,
            computed: now,
            to_host: now,
        };
        Ok(Pipeline {
            progress: vec![
                Progress {
                    frame: 0,
                    error: None,
                    times,
                    outstanding: 0,
                };
                config.depth
            ],
            held: (0..config.depth).map(|_| None).collect(),
            pending: Vec::with_capacity(config.depth),
            model,
            config,
            queues,
            specs,
            base,
            pushed,
            free,
            next_frame: 0,
            next_out: 0,
            unannounced: 0,
            summary: Summary::default(),
            in_flight: 0,
            path,
            device,
            pool,
            _arenas: arenas,
        })
    }
}

/// Times of each result path [`Results::Auto`] measures: the best of this many.
const MEASURE_ROUNDS: usize = 5;

/// [`Results::Auto`]: measures a D2H round trip of the model's result (from `slot`'s arena
/// into its host result buffer, on `queue`, whose pushed count `pushed` it advances) and an
/// in-place read of the same bytes through the BAR, the best of [`MEASURE_ROUNDS`] each, and
/// picks the faster.
fn measure_result_paths(
    model: &Model,
    slot: &Slot,
    device: &Loopback,
    queue: &mut loopback::Queue<Payload>,
    pushed: &mut u64,
    config: &Config,
) -> Result<ResultPath, crate::Error> {
    let timeout = config.timeout;
    let r = model.result();
    let steps = model.steps().len();
    let copy = Command {
        context: config.context,
        ..command_of(model, slot, steps + 1)
    };
    let offset = (slot.arena + r.offset).raw() as usize;
    let mut bytes = userdma::memory::zeroed(r.bytes, "the result read back")?;
    let (mut copy_ns, mut in_place_ns) = (u64::MAX, u64::MAX);
    for _ in 0..MEASURE_ROUNDS {
        let start = Instant::now();
        push(
            queue,
            copy,
            Payload::Step {
                slot: slot.index,
                step: (steps + 1) as u16,
            },
        )?;
        *pushed += 1;
        queue.flush()?;
        let done = queue.wait(Some(timeout))?;
        if done.entry.loopback_code().ok() != Some(StatusCode::Success) {
            return Err(Error::ResultCopy {
                bytes: r.bytes,
                code: done.entry.code(),
            }
            .into());
        }
        // The host's side of a copied result: reading it out of the result buffer.
        slot.result.read(0, &mut bytes)?;
        copy_ns = copy_ns.min(nanos(start.elapsed()));
        let start = Instant::now();
        device.read_device_memory(offset, &mut bytes)?;
        in_place_ns = in_place_ns.min(nanos(start.elapsed()));
    }
    Ok(ResultPath {
        in_place: in_place_ns < copy_ns,
        copy_ns: Some(copy_ns),
        in_place_ns: Some(in_place_ns),
    })
}

/// A duration in whole nanoseconds (saturating).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
