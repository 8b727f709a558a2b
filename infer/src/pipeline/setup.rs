//! Building a pipeline ([`Pipeline::new`]): its queues opened once, its slots (host buffers
//! from one pool mapped once, a device arena each), and, with [`Results::Auto`], the two
//! result paths measured to choose the faster.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::descriptor::{op_of, tag};
use super::{
    Config, Error, Model, Opened, Pipeline, Progress, ResultPath, Results, Slot, Summary, Times,
    COMPUTE, MAX_DEPTH,
};
use crate::accel::{
    self, Accelerator, Capabilities, ComputeAt, HostSteps, LoopbackEngine, QueueSpec, Unit,
};
use userdma::Runtime;

impl Pipeline {
    /// Builds a pipeline on `runtime`'s loopback NPU ([`LoopbackEngine`]); for any other
    /// device, [`Pipeline::on`] with its engine.
    ///
    /// # Errors
    /// [`userdma::Error::Unsupported`] for a runtime whose device is not the loopback NPU; as
    /// [`Pipeline::on`].
    pub fn new(runtime: &Runtime, model: Model, config: Config) -> Result<Pipeline, crate::Error> {
        let engine: Arc<dyn Accelerator> = Arc::new(LoopbackEngine::new(runtime)?);
        Pipeline::on(engine, model, config)
    }

    /// Builds a pipeline on `device` for `model`: `config.depth` slots (host buffers from one
    /// pool mapped once, one arena each) and its queue(s) deep enough for every slot's ops:
    /// queue `config.queue`, and with `config.split` also the next two. Steps the device
    /// cannot run run on the host ([`Pipeline::compute`]).
    ///
    /// # Errors
    /// [`Error::Lacks`] for a setting the device cannot carry out (a split pipeline on a
    /// device without separate units, cross-queue ordering or compute; results in place from
    /// an arena the host cannot read); the device's errors if its memory cannot hold `depth`
    /// arenas (lower the depth) or the queues do not exist; [`userdma::Error::Pool`] /
    /// [`userdma::Error::Memory`] for the host buffers; [`crate::Error::Pipeline`] for a depth
    /// or batch out of range ([`Error::Depth`]), queues past the last id ([`Error::Queues`])
    /// or host buffers too large for the address space ([`Error::HostBuffers`]).
    pub fn on(
        device: Arc<dyn Accelerator>,
        model: Model,
        config: Config,
    ) -> Result<Pipeline, crate::Error> {
        #[cfg(feature = "tracing")]
        let _span = tracing::info_span!(
            "pipeline.new",
            device = %device.identity(),
            depth = config.depth,
            batch = config.batch,
            queue = config.queue,
            split = config.split,
            results = ?config.results,
            steps = model.steps().len()
        )
        .entered();
        if config.depth == 0 || config.batch == 0 || config.depth > MAX_DEPTH {
            return Err(Error::Depth {
                depth: config.depth,
                batch: config.batch,
            }
            .into());
        }
        let caps = device.capabilities();
        let compute = caps.compute_at(model.steps());
        let host_steps = model.steps().iter().filter(|s| !caps.runs(s)).count() as u64;
        check(device.as_ref(), &caps, compute, &config)?;
        let per_frame = model.steps().len() + 4;
        // Twice what the slots need: the SQ head the device writes back lags its completions
        // by up to a burst.
        let descriptors = (2 * config.depth * per_frame).next_power_of_two().max(2);
        let ring_depth = u32::try_from(descriptors).unwrap_or(u32::MAX);
        let units: &[Unit] = if config.split {
            &[Unit::Copy, Unit::Compute, Unit::Copy]
        } else {
            &[Unit::Copy]
        };
        let mut queues = Vec::with_capacity(units.len());
        let mut specs = Vec::with_capacity(units.len());
        for (k, &unit) in units.iter().enumerate() {
            let id = config.queue.checked_add(k as u16).ok_or(Error::Queues {
                queue: config.queue,
                after: units.len() - 1,
            })?;
            let opened = Opened {
                spec: QueueSpec {
                    id,
                    depth: ring_depth,
                    context: config.context,
                    unit,
                    wait: config.wait,
                    arena_bytes: model.arena_bytes(),
                },
                steps_here: if config.split { k == COMPUTE } else { k == 0 },
            };
            queues.push(open(&device, opened, compute, &config)?);
            specs.push(opened);
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
        let pool = device.host_pool(pool_bytes)?;
        let mut slots = Vec::with_capacity(config.depth);
        let mut arenas = Vec::with_capacity(config.depth);
        for _ in 0..config.depth {
            let (bytes, align) = (model.arena_bytes(), 256);
            let arena = device.alloc_arena(bytes, align)?;
            if let Some(why) = arena.fault(bytes, align) {
                // The arena is given back as it drops.
                return Err(Error::Arena {
                    device: device.identity(),
                    bytes,
                    align,
                    at: arena.at,
                    why,
                }
                .into());
            }
            slots.push(Slot {
                input: pool.alloc_owned(input_bytes as usize)?,
                result: pool.alloc_owned(result_bytes as usize)?,
                arena: arena.at,
            });
            arenas.push(arena);
        }
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
            Results::Auto if !caps.read_in_place => ResultPath {
                in_place: false,
                copy_ns: None,
                in_place_ns: None,
            },
            // Arenas in host memory: reading a result where it is costs a memory read, never
            // more than a device copy of it and the same read after; nothing to measure.
            Results::Auto if !caps.device_memory => ResultPath {
                in_place: true,
                copy_ns: None,
                in_place_ns: None,
            },
            Results::Auto => {
                let d2h = queues.len() - 1;
                measure_result_paths(
                    &model,
                    &slots[0],
                    device.as_ref(),
                    queues[d2h].as_mut(),
                    &mut pushed[d2h],
                    &config,
                )?
            }
        };
        if path.in_place && config.split {
            // The D2H queue is not used: results are read where the compute unit wrote them.
            queues.truncate(2);
            specs.truncate(2);
            pushed.truncate(2);
        }
        #[cfg(feature = "tracing")]
        tracing::info!(
            queues = queues.len(),
            ring_depth,
            pool_bytes,
            compute = ?compute,
            host_steps,
            results_in_place = path.in_place,
            "pipeline ready"
        );
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
                    spans: None,
                };
                config.depth
            ],
            held: vec![false; config.depth],
            busy: vec![false; config.depth],
            free: (0..config.depth).collect::<VecDeque<_>>(),
            slots,
            pending: Vec::with_capacity(config.depth),
            model,
            config,
            queues,
            specs,
            pushed,
            next_frame: 0,
            next_out: 0,
            fences: None,
            trace: None,
            unannounced: 0,
            summary: Summary::default(),
            in_flight: 0,
            path,
            compute,
            host_steps,
            device,
            leaked: false,
            pool,
            arenas,
        })
    }
}

/// Refuses a setting the device cannot carry out.
fn check(
    device: &dyn Accelerator,
    caps: &Capabilities,
    compute: ComputeAt,
    config: &Config,
) -> Result<(), crate::Error> {
    let lacks = |lacks, setting, hint| Error::Lacks {
        device: device.identity(),
        kind: caps.kind,
        lacks,
        setting,
        hint,
    };
    if config.split {
        let hint = "build the pipeline without Config::split (one in-order queue)";
        if !caps.separate_units {
            return Err(lacks("separate copy and compute units", "a split pipeline", hint).into());
        }
        if !caps.cross_queue_order {
            return Err(lacks("ordering across queues", "a split pipeline", hint).into());
        }
        if compute != ComputeAt::Device {
            return Err(lacks(
                "compute unit for every step of the model",
                "a split pipeline",
                hint,
            )
            .into());
        }
    }
    if config.results == Results::InPlace && !caps.read_in_place {
        return Err(lacks(
            "arena the host can read in place",
            "Results::InPlace",
            "use Results::Copy or Results::Auto",
        )
        .into());
    }
    Ok(())
}

/// Opens queue `opened` of `device`: with the steps it cannot run run on the host when it is
/// the queue the steps go to.
pub(super) fn open(
    device: &Arc<dyn Accelerator>,
    opened: Opened,
    compute: ComputeAt,
    config: &Config,
) -> Result<Box<dyn accel::Queue>, crate::Error> {
    let spec = opened.spec;
    #[cfg(feature = "tracing")]
    let _span = tracing::info_span!(
        "accel.open_queue",
        device = %device.identity(),
        queue = spec.id,
        depth = spec.depth,
        unit = ?spec.unit,
        context = spec.context,
        host_steps = opened.steps_here && compute != ComputeAt::Device
    )
    .entered();
    if let (true, Some(ws)) = (opened.steps_here, config.working_set) {
        device.set_working_set(spec.id, ws)?;
    }
    if opened.steps_here && compute != ComputeAt::Device {
        Ok(Box::new(HostSteps::open(Arc::clone(device), spec)?))
    } else {
        device.open_queue(spec)
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
    device: &dyn Accelerator,
    queue: &mut dyn accel::Queue,
    pushed: &mut u64,
    config: &Config,
) -> Result<ResultPath, crate::Error> {
    let timeout = config.timeout;
    let r = model.result();
    let steps = model.steps().len();
    let copy = op_of(model, slot, steps + 1);
    let at = slot.arena + r.offset;
    let mut bytes = userdma::memory::zeroed(r.bytes, "the result read back")?;
    let (mut copy_ns, mut in_place_ns) = (u64::MAX, u64::MAX);
    for _ in 0..MEASURE_ROUNDS {
        let start = Instant::now();
        queue.push(copy, tag(0, (steps + 1) as u16, false))?;
        *pushed += 1;
        queue.flush()?;
        let done = queue.wait(timeout)?;
        if done.status != 0 {
            return Err(Error::ResultCopy {
                bytes: r.bytes,
                code: done.status,
                status: device.status_name(done.status),
            }
            .into());
        }
        // The host's side of a copied result: reading it out of the result buffer.
        slot.result.read(0, &mut bytes)?;
        copy_ns = copy_ns.min(nanos(start.elapsed()));
        let start = Instant::now();
        device.read_arena(at, &mut bytes)?;
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
