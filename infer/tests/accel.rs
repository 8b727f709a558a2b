//! The pipeline and the streams over an engine that is not the loopback NPU: the plain
//! host-memory engine (one copy engine, no compute, so every model step runs on the host),
//! every frame's result checked against the model run on the host; what it cannot do refused
//! with errors that name the capability; a failed op, a reset and a removal survived; and
//! streams over it and the loopback NPU in one run.

use std::sync::Arc;
use std::time::Duration;

use userdma::device::{self, Device};
use userdma::{Code, Runtime};
use userdma_infer::accel::{self, Accelerator, ComputeAt, LoopbackEngine, MemoryEngine};
use userdma_infer::pipeline::{self, zoo, Config, Filter, Model, Pipeline, Results};
use userdma_infer::sched::streams::{Arrivals, Stream, Streams};
use userdma_infer::sched::{Policy, StreamId, StreamSpec};
use userdma_infer::Error;
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};

mod frames;

use frames::{expected, fill};

fn engine() -> Arc<MemoryEngine> {
    Arc::new(MemoryEngine::new(8).expect("memory engine"))
}

/// The default settings as far as the memory engine carries them out (one queue, polled).
fn config(model: &Model) -> Config {
    Config::for_device(engine().as_ref(), model)
}

/// Runs `frames` frames of `model` on `p`, checking each; returns the summary.
fn run_checked(p: &mut Pipeline, model: &Model, frames: u64) -> pipeline::Summary {
    let mut scratch = vec![0u8; model.input().bytes as usize];
    let mut got = vec![0u8; model.result().bytes as usize];
    let mut seen = Vec::new();
    let summary = p
        .run(
            frames,
            |n, input| {
                fill(0, n, &mut scratch);
                input.write(0, &scratch)
            },
            |done| {
                let out = done.result.expect("no device error");
                out.read(0, &mut got).unwrap();
                assert_eq!(got, expected(model, 0, done.frame), "frame {}", done.frame);
                seen.push(done.frame);
            },
        )
        .expect("run");
    let start = seen.first().copied().unwrap_or(0);
    assert_eq!(
        seen,
        (start..start + frames).collect::<Vec<_>>(),
        "frame order"
    );
    summary
}

#[test]
fn every_frame_is_right_with_every_step_on_the_host() {
    let models = [
        Model::chain(4, 1000).unwrap(),
        Model::chain(2, 4096)
            .unwrap()
            .with_filter(Filter {
                record: 16,
                score_at: 4,
                threshold: 1 << 31,
                capacity: 64,
            })
            .unwrap(),
    ];
    let mut cases = Vec::new();
    for depth in [1, 2, 4] {
        for results in [Results::Copy, Results::InPlace, Results::Auto] {
            cases.push((&models[0], depth, results));
        }
    }
    cases.push((&models[1], 2, Results::Copy));
    cases.push((&models[1], 3, Results::InPlace));
    {
        for (model, depth, results) in cases {
            {
                let device: Arc<dyn Accelerator> = engine();
                assert!(!config(model).split);
                let config = Config {
                    depth,
                    batch: 2,
                    results,
                    ..config(model)
                };
                let mut p = Pipeline::on(device, model.clone(), config).expect("pipeline");
                assert_eq!(p.compute(), ComputeAt::Host);
                let frames = 6;
                let summary = run_checked(&mut p, model, frames);
                assert_eq!(summary.frames, frames);
                assert_eq!(summary.failed, 0);
                assert_eq!(
                    summary.host_steps,
                    frames * model.steps().len() as u64,
                    "every step ran on the host"
                );
                p.shutdown(|_| panic!("nothing left")).unwrap();
            }
        }
    }
}

/// A model with real layer shapes (the case study's): layers with one to three inputs and the
/// filter, all on the host. Its layers are large for unoptimised code: two frames.
#[test]
fn a_planned_model_with_layers_and_a_filter_is_right_on_the_host() {
    let model = zoo::yolov5s_like(64).unwrap();
    let device: Arc<dyn Accelerator> = engine();
    let mut p = Pipeline::on(device, model.clone(), config(&model)).unwrap();
    assert_eq!(p.compute(), ComputeAt::Host);
    let summary = run_checked(&mut p, &model, 2);
    assert_eq!(summary.host_steps, 2 * model.steps().len() as u64);
}

#[test]
fn the_loopback_engine_runs_every_step_on_the_device() {
    let rt = Runtime::loopback(loopback::Config::default()).unwrap();
    let model = Model::chain(2, 4096)
        .unwrap()
        .with_filter(Filter {
            record: 16,
            score_at: 4,
            threshold: 1 << 31,
            capacity: 64,
        })
        .unwrap();
    let device: Arc<dyn Accelerator> = Arc::new(LoopbackEngine::new(&rt).unwrap());
    assert!(device.capabilities().compute && device.capabilities().filter);
    for split in [false, true] {
        let config = Config {
            depth: 2,
            split,
            ..Config::default()
        };
        let mut p = Pipeline::on(Arc::clone(&device), model.clone(), config).unwrap();
        assert_eq!(p.compute(), ComputeAt::Device);
        let summary = run_checked(&mut p, &model, 8);
        assert_eq!(summary.host_steps, 0);
    }
}

#[test]
fn what_the_engine_lacks_is_refused_with_the_capability_named() {
    let model = Model::chain(2, 1024).unwrap();
    let split = Config {
        split: true,
        ..config(&model)
    };
    let err = Pipeline::on(engine(), model.clone(), split).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let text = err.to_string();
    assert!(
        text.contains("separate copy and compute units") && text.contains("Config::split"),
        "{text}"
    );
    // Queues the engine does not have.
    let in_queue_8 = Config {
        queue: 8,
        ..config(&model)
    };
    let err = Pipeline::on(engine(), model.clone(), in_queue_8).unwrap_err();
    assert!(err.to_string().contains("queue"), "{err}");
    // A runtime whose device is not the loopback NPU (here one wrapping it, as a vendor's
    // backend would be its own type) has no loopback engine: refused, pointing at Pipeline::on.
    let wrapped = Wrapped(loopback::Loopback::new(loopback::Config::default()).unwrap());
    let rt = Runtime::from_device(Arc::new(wrapped));
    let err = LoopbackEngine::new(&rt).unwrap_err();
    assert_eq!(err.code(), Code::Unsupported);
    assert!(err.to_string().contains("Pipeline::on"), "{err}");
    let err = Pipeline::new(&rt, model, Config::default()).unwrap_err();
    assert_eq!(err.code(), Code::Unsupported);
}

/// A device of another type than the loopback NPU: the NPU behind a wrapper.
#[derive(Debug)]
struct Wrapped(loopback::Loopback);

impl Device for Wrapped {
    fn identity(&self) -> &device::Identity {
        self.0.identity()
    }
    fn bar(&self, index: usize) -> Result<userdma::mmio::DynBlock, device::Error> {
        self.0.bar(index)
    }
    fn dma_space(&self) -> Arc<dyn userdma::dma::Space> {
        self.0.dma_space()
    }
    fn vectors(&self) -> u32 {
        self.0.vectors()
    }
    fn interrupt(&self, vector: u32) -> Result<userdma::irq::EventFd, device::Error> {
        self.0.interrupt(vector)
    }
    fn set_masked(&self, vector: u32, masked: bool) -> Result<(), device::Error> {
        self.0.set_masked(vector, masked)
    }
    fn reset(&self) -> Result<(), device::Error> {
        self.0.reset()
    }
}

#[test]
fn a_failed_op_fails_its_frame_only() {
    let memory = engine();
    let model = Model::chain(1, 4096).unwrap();
    let device: Arc<dyn Accelerator> = memory.clone();
    let depth_1 = Config {
        depth: 1,
        ..config(&model)
    };
    let mut p = Pipeline::on(device, model.clone(), depth_1).unwrap();
    run_checked(&mut p, &model, 3);
    // The next op is frame 3's H2D copy (depth 1: one frame at a time).
    memory.fail_op(0);
    let mut scratch = vec![0u8; model.input().bytes as usize];
    let mut failed = Vec::new();
    p.run(
        3,
        |n, input| {
            fill(0, n, &mut scratch);
            input.write(0, &scratch)
        },
        |done| match done.result {
            Ok(out) => {
                let mut got = vec![0u8; out.len()];
                out.read(0, &mut got).unwrap();
                assert_eq!(got, expected(&model, 0, done.frame));
            }
            Err(e) => failed.push(e),
        },
    )
    .unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let e = failed[0];
    assert_eq!((e.frame, e.step, e.code), (3, 0, accel::memory::INJECTED));
    assert!(e.status.contains("injected"), "{e}");
    assert_eq!(p.summary().failed, 1);
}

#[test]
fn a_reset_and_a_removal_are_recovered_from() {
    let memory = engine();
    let model = Model::chain(2, 2048).unwrap();
    let device: Arc<dyn Accelerator> = memory.clone();
    let depth_3 = Config {
        depth: 3,
        batch: 3,
        ..config(&model)
    };
    let mut p = Pipeline::on(device, model.clone(), depth_3).unwrap();
    run_checked(&mut p, &model, 5);
    // Three frames queued and announced, none run yet: a reset loses all three.
    let mut scratch = vec![0u8; model.input().bytes as usize];
    for _ in 0..3 {
        p.try_submit(|n, input| {
            fill(0, n, &mut scratch);
            input.write(0, &scratch)
        })
        .unwrap()
        .expect("a free slot");
    }
    let recovery = p.recover(|_| panic!("nothing finished")).unwrap();
    assert_eq!(recovery.lost, vec![5, 6, 7]);
    assert!(!recovery.removed);
    assert_eq!(p.in_flight(), 0);
    // The next frames go through as the first did.
    run_checked(&mut p, &model, 4);

    // A frame in flight when the engine goes away.
    p.try_submit(|n, input| {
        fill(0, n, &mut scratch);
        input.write(0, &scratch)
    })
    .unwrap();
    memory.remove();
    let err = p.wait(|_| {}).unwrap_err();
    assert_eq!(err.code(), Code::Removed, "{err}");
    // A frame submitted after it may be queued behind the host steps of the first (the
    // removal shows at the next doorbell) or refused at once; either way it is lost, never
    // run, and its slot comes back.
    let mut lost = vec![12];
    match p.try_submit(|_, _| Ok(())) {
        Ok(frame) => lost.extend(frame),
        Err(err) => assert_eq!(err.code(), Code::Removed, "{err}"),
    }
    let recovery = p.recover(|_| {}).unwrap();
    assert!(recovery.removed);
    assert_eq!(recovery.lost, lost);
    let err = p.try_submit(|_, _| Ok(())).unwrap_err();
    assert_eq!(err.code(), Code::Removed);
}

#[test]
fn streams_run_over_the_loopback_npu_and_the_memory_engine_in_one_run() {
    let rt = Runtime::loopback(loopback::Config::default().cost(Cost::zero()).queues(8)).unwrap();
    let memory = engine();
    let model = Model::chain(2, 4096).unwrap();
    let loopback: Arc<dyn Accelerator> = Arc::new(LoopbackEngine::new(&rt).unwrap());
    let host: Arc<dyn Accelerator> = memory.clone();
    let stream = |device: &Arc<dyn Accelerator>, s: usize, queue: u16| {
        let context = s as u32 + 1;
        let config = Config {
            queue,
            context,
            timeout: Duration::from_secs(10),
            ..Config::for_device(device.as_ref(), &model)
        };
        Stream {
            spec: StreamSpec::new(format!("s{s}"), 0, context),
            arrivals: Arrivals::Asap,
            pipeline: Pipeline::on(Arc::clone(device), model.clone(), config).unwrap(),
        }
    };
    let streams = vec![
        stream(&loopback, 0, 0),
        stream(&host, 1, 0),
        stream(&loopback, 2, 4),
        stream(&host, 3, 1),
    ];
    let mut s = Streams::new(Policy::RoundRobin, streams, 1).expect("streams");
    assert_eq!(s.schedulers().count(), 2, "one scheduler per device");
    let mut scratch = vec![0u8; model.input().bytes as usize];
    let mut got = vec![0u8; model.result().bytes as usize];
    let mut wrong = 0u64;
    let report = s
        .run(
            Duration::from_millis(300),
            |id: StreamId, n, input| {
                fill(id.0, n, &mut scratch);
                input.write(0, &scratch)
            },
            |id, done| {
                let out = done.result.expect("no device error");
                out.read(0, &mut got).unwrap();
                wrong += u64::from(got != expected(&model, id.0, done.frame));
            },
        )
        .expect("run");
    assert_eq!(wrong, 0);
    for st in &report.streams {
        assert!(st.frames > 5, "{st:?}");
        assert_eq!((st.failed, st.lost), (0, 0), "{st:?}");
    }
    let devices: Vec<usize> = report.streams.iter().map(|s| s.device).collect();
    assert_eq!(devices, vec![0, 1, 0, 1]);
    assert!(memory.ops() > 0);
    for st in s.into_streams() {
        let compute = st.pipeline.compute();
        assert_eq!(
            compute,
            if st.spec.name == "s1" || st.spec.name == "s3" {
                ComputeAt::Host
            } else {
                ComputeAt::Device
            }
        );
        st.pipeline.shutdown(|_| {}).unwrap();
    }
}

#[test]
fn bad_settings_on_the_memory_engine_are_errors() {
    let model = Model::chain(1, 1024).unwrap();
    let err = Pipeline::on(
        engine(),
        model,
        Config {
            depth: 0,
            ..config(&Model::chain(1, 1024).unwrap())
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::Pipeline(_)), "{err}");
}

/// The memory engine taken away in the middle of a run of streams over it and the loopback
/// NPU: its stream is retired with its frames accounted for, the NPU's stream goes on.
#[test]
fn a_removed_engine_retires_its_stream_and_the_other_device_goes_on() {
    let rt = Runtime::loopback(loopback::Config::default().cost(Cost::zero()).queues(8)).unwrap();
    let memory = engine();
    let model = Model::chain(2, 4096).unwrap();
    let npu: Arc<dyn Accelerator> = Arc::new(LoopbackEngine::new(&rt).unwrap());
    let host: Arc<dyn Accelerator> = memory.clone();
    let stream = |device: &Arc<dyn Accelerator>, s: usize| Stream {
        spec: StreamSpec::new(format!("s{s}"), 0, s as u32 + 1),
        arrivals: Arrivals::Asap,
        pipeline: Pipeline::on(
            Arc::clone(device),
            model.clone(),
            Config {
                context: s as u32 + 1,
                ..Config::for_device(device.as_ref(), &model)
            },
        )
        .unwrap(),
    };
    let mut s = Streams::new(
        Policy::RoundRobin,
        vec![stream(&npu, 0), stream(&host, 1)],
        1,
    )
    .unwrap();
    let mut scratch = vec![0u8; model.input().bytes as usize];
    let mut got = vec![0u8; model.result().bytes as usize];
    let (mut wrong, mut dispatched) = (0u64, 0u64);
    let report = s
        .run(
            Duration::from_millis(300),
            |id: StreamId, n, input| {
                dispatched += 1;
                if dispatched == 20 {
                    memory.remove();
                }
                fill(id.0, n, &mut scratch);
                input.write(0, &scratch)
            },
            |id, done| match done.result {
                Ok(out) => {
                    out.read(0, &mut got).unwrap();
                    wrong += u64::from(got != expected(&model, id.0, done.frame));
                }
                Err(_) => wrong += 1,
            },
        )
        .expect("run");
    assert_eq!(wrong, 0);
    let removal = report
        .faults
        .iter()
        .find(|f| f.removed)
        .unwrap_or_else(|| panic!("the removal is reported: {:#?}", report.faults));
    assert_eq!(removal.device, 1);
    assert_eq!(removal.code, Code::Removed);
    let (npu_stream, host_stream) = (&report.streams[0], &report.streams[1]);
    assert!(host_stream.frames > 0, "{host_stream:?}");
    assert!(
        npu_stream.frames > host_stream.frames,
        "the NPU's stream went on after the removal: {npu_stream:?} {host_stream:?}"
    );
    assert_eq!(npu_stream.lost, 0);
    for st in s.into_streams() {
        st.pipeline.shutdown(|_| {}).unwrap();
    }
}

/// The memory engine with an allocator that answers wrongly: each arena it hands out is the
/// engine's own, at `at` instead (if given) and `bytes` long.
#[derive(Debug)]
struct BadArenas {
    inner: MemoryEngine,
    /// The address each arena claims; `None`: its own.
    at: Option<u64>,
    /// Bytes the arena claims; `None`: as asked.
    bytes: Option<u64>,
}

impl Accelerator for BadArenas {
    fn identity(&self) -> String {
        "bad-arenas".to_owned()
    }
    fn capabilities(&self) -> accel::Capabilities {
        self.inner.capabilities()
    }
    fn host_pool(&self, bytes: usize) -> Result<Arc<userdma::pool::Pool>, Error> {
        self.inner.host_pool(bytes)
    }
    fn alloc_arena(&self, bytes: u64, align: u64) -> Result<accel::Arena, Error> {
        let mut arena = self.inner.alloc_arena(bytes, align)?;
        arena.at = self.at.unwrap_or(arena.at);
        arena.bytes = self.bytes.unwrap_or(arena.bytes);
        Ok(arena)
    }
    fn read_arena(&self, at: u64, dst: &mut [u8]) -> Result<(), Error> {
        self.inner.read_arena(at, dst)
    }
    fn write_arena(&self, at: u64, src: &[u8]) -> Result<(), Error> {
        self.inner.write_arena(at, src)
    }
    fn open_queue(&self, spec: accel::QueueSpec) -> Result<Box<dyn accel::Queue>, Error> {
        self.inner.open_queue(spec)
    }
    fn reset(&self) -> Result<(), Error> {
        self.inner.reset()
    }
}

#[test]
fn an_arena_not_as_asked_is_refused_when_the_pipeline_is_built() {
    let model = Model::chain(2, 1024).unwrap();
    let cases = [
        // Ends past 2^64.
        (Some(u64::MAX - 255), None, "below 2^64"),
        // Not 256-byte aligned.
        (Some(4096 + 8), None, "not aligned to 256 bytes"),
        // Shorter than asked.
        (None, Some(16), "fewer than the"),
    ];
    for (at, bytes, says) in cases {
        let bad = BadArenas {
            inner: MemoryEngine::new(8).unwrap(),
            at,
            bytes,
        };
        let err = Pipeline::on(Arc::new(bad), model.clone(), config(&model)).unwrap_err();
        assert_eq!(err.code(), Code::Device, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("bad-arenas")
                && text.contains(says)
                && text.contains("fix the accelerator's allocator"),
            "{text}"
        );
    }
    // The same engine answering as asked builds and runs.
    let good = BadArenas {
        inner: MemoryEngine::new(8).unwrap(),
        at: None,
        bytes: None,
    };
    let mut p = Pipeline::on(Arc::new(good), model.clone(), config(&model)).unwrap();
    run_checked(&mut p, &model, 8);
}
