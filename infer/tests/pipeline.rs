//! The pipeline on the loopback device and on the host-memory engine (no compute: its steps run
//! on the host): every frame's result checked against the model run on the host, at several
//! depths and batches, results in frame order, back-pressure, shutdown, bad settings, and the
//! naive path giving the same results.

use std::sync::Arc;
use std::time::Duration;

use userdma::device::Wait;
use userdma::Runtime;
use userdma_infer::accel::{Accelerator, LoopbackEngine, MemoryEngine};
use userdma_infer::pipeline::{self, naive, Config, Model, Pipeline, Results};
use userdma_infer::Error;
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};

fn runtime(cost: Cost) -> Runtime {
    Runtime::loopback(loopback::Config::default().cost(cost)).expect("loopback device")
}

/// The devices the layer's tests run on: the loopback NPU, and the host-memory engine.
fn devices(cost: Cost) -> [Arc<dyn Accelerator>; 2] {
    [
        Arc::new(LoopbackEngine::new(&runtime(cost)).expect("loopback engine")),
        Arc::new(MemoryEngine::new(4).expect("memory engine")),
    ]
}

/// A pipeline on `device` with `config` as far as the device carries it out (the memory
/// engine has one unit: never split).
fn pipeline_on(device: &Arc<dyn Accelerator>, model: &Model, config: Config) -> Pipeline {
    let fits = Config::for_device(device.as_ref(), model);
    let config = Config {
        split: config.split && fits.split,
        ..config
    };
    Pipeline::on(Arc::clone(device), model.clone(), config).expect("pipeline")
}

/// Frame `n`'s input: words that differ per frame and per position.
fn fill(n: u64, input: &mut [u8]) {
    for (j, w) in input.chunks_exact_mut(4).enumerate() {
        let v = (n as u32).wrapping_mul(0x0100_0193) ^ (j as u32).wrapping_mul(0x9e37_79b9);
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// The result the device must produce for frame `n`.
fn expected(model: &Model, n: u64) -> Vec<u8> {
    let mut input = vec![0u8; model.input().bytes as usize];
    fill(n, &mut input);
    let mut arena = vec![0u8; model.arena_bytes() as usize];
    let mut result = vec![0u8; model.result().bytes as usize];
    model.reference(&input, &mut arena, &mut result);
    result
}

fn run_checked(device: &Arc<dyn Accelerator>, model: &Model, config: Config, frames: u64) {
    let mut p = pipeline_on(device, model, config);
    let path = p.result_path();
    match config.results {
        Results::Copy => assert!(!path.in_place),
        Results::InPlace => assert!(path.in_place),
        // Arenas in host memory: read in place, nothing measured.
        Results::Auto if !device.capabilities().device_memory => {
            assert!(path.in_place && path.copy_ns.is_none(), "{path:?}")
        }
        Results::Auto => {
            let (copy, read) = (path.copy_ns.unwrap(), path.in_place_ns.unwrap());
            assert_eq!(path.in_place, read < copy, "{path:?}");
        }
    }
    let mut scratch = vec![0u8; model.input().bytes as usize];
    let mut seen = Vec::new();
    let summary = p
        .run(
            frames,
            |n, input| {
                fill(n, &mut scratch);
                input.write(0, &scratch)
            },
            |done| {
                let out = done.result.expect("no device error");
                assert_eq!(out.in_place(), path.in_place);
                let mut got = vec![0u8; out.len()];
                out.read(0, &mut got).unwrap();
                assert_eq!(got, expected(model, done.frame), "frame {}", done.frame);
                seen.push(done.frame);
            },
        )
        .expect("run");
    assert_eq!(summary.frames, frames);
    assert_eq!(summary.failed, 0);
    assert_eq!(seen, (0..frames).collect::<Vec<_>>(), "frame order");
    let drained = p.shutdown(|_| panic!("nothing left in flight")).unwrap();
    assert_eq!(drained.frames, frames);
}

#[test]
fn every_frame_is_right_at_every_depth_and_batch() {
    let model = Model::chain(4, 1000).unwrap();
    assert_eq!(model.steps().len(), 4);
    for device in devices(Cost::zero()) {
        for split in [true, false] {
            for depth in 1..=4 {
                for batch in [1, 2] {
                    let config = Config {
                        depth,
                        batch,
                        split,
                        ..Config::default()
                    };
                    run_checked(&device, &model, config, 30);
                }
            }
        }
    }
}

#[test]
fn results_read_in_place_and_copied_back_are_the_same() {
    let filtered = Model::chain(3, 4096)
        .unwrap()
        .with_filter(pipeline::Filter {
            record: 32,
            score_at: 0,
            threshold: u32::MAX / 2,
            capacity: 16,
        })
        .unwrap();
    for model in [
        Model::chain(4, 1000).unwrap(),
        filtered,
        Model::chain(1, 4).unwrap(),
    ] {
        for device in devices(Cost::zero()) {
            for results in [Results::Copy, Results::InPlace, Results::Auto] {
                for split in [true, false] {
                    for depth in [1, 2, 3] {
                        let config = Config {
                            depth,
                            split,
                            results,
                            ..Config::default()
                        };
                        run_checked(&device, &model, config, 12);
                    }
                }
            }
        }
    }
}

#[test]
fn auto_measures_and_picks_copies_for_big_results_and_in_place_for_tiny_ones() {
    let rt = runtime(Cost::npu());
    let pick = |bytes| {
        let model = Model::chain(1, bytes).unwrap();
        Pipeline::new(&rt, model, Config::default())
            .unwrap()
            .result_path()
    };
    // 1 MiB in place is 131,072 BAR round trips of 1 µs: the copy wins by orders of magnitude.
    let big = pick(1 << 20);
    assert!(!big.in_place, "{big:?}");
    assert!(big.in_place_ns.unwrap() >= 131_072_000, "{big:?}");
    // One word: one round trip, against a descriptor, a wait and a completion.
    let tiny = pick(4);
    assert!(tiny.in_place, "{tiny:?}");
    assert!(tiny.in_place_ns.unwrap() >= 1_000, "{tiny:?}");
}

#[test]
fn an_in_place_result_refuses_reads_outside_it() {
    let rt = runtime(Cost::zero());
    let model = Model::chain(2, 64).unwrap();
    let config = Config {
        results: Results::InPlace,
        ..Config::default()
    };
    let mut p = Pipeline::new(&rt, model, config).unwrap();
    p.run(
        1,
        |_, _| Ok(()),
        |done| {
            let out = done.result.unwrap();
            assert_eq!(out.len(), 64);
            let mut word = [0u8; 4];
            out.read(60, &mut word).unwrap();
            let err = out.read(61, &mut word).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Pipeline(pipeline::Error::OutsideResult {
                        offset: 61,
                        len: 4,
                        size: 64
                    })
                ),
                "{err:?}"
            );
            assert!(err.to_string().contains("of a 64-byte result"), "{err}");
            assert!(out.read(usize::MAX, &mut word).is_err());
        },
    )
    .unwrap();
}

#[test]
fn polling_and_a_cost_model_give_the_same_results() {
    let rt = runtime(Cost::npu());
    let model = Model::chain(3, 16 << 10).unwrap();
    let config = Config {
        depth: 3,
        wait: Wait::Poll,
        ..Config::default()
    };
    let device: Arc<dyn Accelerator> = Arc::new(LoopbackEngine::new(&rt).unwrap());
    run_checked(&device, &model, config, 40);
}

#[test]
fn a_full_ring_refuses_and_frees_up_in_order() {
    for device in devices(Cost::zero()) {
        a_full_ring_refuses_and_frees_up_in_order_on(&device);
    }
}

fn a_full_ring_refuses_and_frees_up_in_order_on(device: &Arc<dyn Accelerator>) {
    let model = Model::chain(2, 256).unwrap();
    let mut p = pipeline_on(
        device,
        &model,
        Config {
            depth: 3,
            ..Config::default()
        },
    );
    for n in 0..3 {
        assert_eq!(p.try_submit(|_, _| Ok(())).unwrap(), Some(n));
    }
    // Every slot is in flight until its result is taken.
    assert_eq!(p.try_submit(|_, _| Ok(())).unwrap(), None);
    assert_eq!(p.in_flight(), 3);
    let mut order = Vec::new();
    while order.is_empty() {
        p.wait(|d| order.push(d.frame)).unwrap();
    }
    assert_eq!(order[0], 0);
    assert_eq!(p.try_submit(|_, _| Ok(())).unwrap(), Some(3));
    let summary = p.shutdown(|d| order.push(d.frame)).unwrap();
    assert_eq!(order, vec![0, 1, 2, 3]);
    assert_eq!(summary.frames, 4);
}

#[test]
fn a_failing_preprocess_keeps_its_slot() {
    let model = Model::chain(1, 64).unwrap();
    for device in devices(Cost::zero()) {
        let mut p = pipeline_on(
            &device,
            &model,
            Config {
                depth: 1,
                ..Config::default()
            },
        );
        let err = p
            .try_submit(|_, input| input.write(1 << 20, &[0u8; 4]))
            .unwrap_err();
        assert!(err.to_string().contains("out of"), "{err}");
        assert_eq!(p.in_flight(), 0);
        assert_eq!(p.try_submit(|_, _| Ok(())).unwrap(), Some(0));
        p.shutdown(|d| assert!(d.result.is_ok())).unwrap();
    }
}

#[test]
fn bad_settings_are_errors_that_say_what_to_do() {
    let rt = runtime(Cost::zero());
    let model = Model::chain(1, 64).unwrap();
    for (depth, batch) in [(0, 1), (2, 0), (5000, 1)] {
        let err = Pipeline::new(
            &rt,
            model.clone(),
            Config {
                depth,
                batch,
                ..Config::default()
            },
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("use a depth of 1 to 1024"),
            "{err}"
        );
        assert!(
            matches!(err, Error::Pipeline(pipeline::Error::Depth { depth: d, batch: b }) if d == depth && b == batch),
            "{err:?}"
        );
    }
    // More arenas than device memory holds.
    let huge = Model::chain(1, 8 << 20).unwrap();
    let err = Pipeline::new(
        &rt,
        huge,
        Config {
            depth: 64,
            ..Config::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.code(), userdma::Code::Exhausted, "{err}");
}

#[test]
fn models_with_bad_ranges_are_refused() {
    use pipeline::{ModelError, Span, Step};
    let span = |offset, bytes| Span { offset, bytes };
    let step = |src, dst, len| Step::Compute {
        src,
        dst,
        len,
        xor: 0,
        add: 0,
    };
    assert!(matches!(
        Model::new(64, span(0, 64), span(0, 128), vec![]),
        Err(ModelError::OutOfArena { .. })
    ));
    assert!(matches!(
        Model::new(64, span(2, 8), span(0, 8), vec![]),
        Err(ModelError::Misaligned { .. })
    ));
    assert!(matches!(
        Model::new(64, span(0, 0), span(0, 8), vec![]),
        Err(ModelError::Empty { .. })
    ));
    assert!(matches!(
        Model::new(64, span(0, 8), span(0, 8), vec![step(0, 60, 8)]),
        Err(ModelError::OutOfArena { .. })
    ));
    assert!(matches!(
        Model::new(64, span(0, 8), span(0, 8), vec![step(u64::MAX - 3, 0, 8)]),
        Err(ModelError::OutOfArena { .. })
    ));
}

/// A wrong placement shows up as a wrong result: the reference of a model whose step writes
/// over a tensor a later step still reads differs from the planned one.
#[test]
fn a_wrong_placement_changes_the_result() {
    use pipeline::{Span, Step};
    let span = |offset, bytes| Span { offset, bytes };
    let mix = |src, dst| Step::Compute {
        src,
        dst,
        len: 16,
        xor: 0x55,
        add: 7,
    };
    // Planned: a at 0, b at 16, c at 32; c = f(b) + the result reads c... a chain a->b->c.
    let good = Model::new(48, span(0, 16), span(32, 16), vec![mix(0, 16), mix(16, 32)]).unwrap();
    // Wrong: b placed over a's bytes shifted by one word, overlapping the input while read.
    let bad = Model::new(48, span(0, 16), span(32, 16), vec![mix(0, 4), mix(4, 32)]).unwrap();
    let input: Vec<u8> = (0..16).collect();
    let (mut a1, mut a2) = (vec![0u8; 48], vec![0u8; 48]);
    let (mut r1, mut r2) = (vec![0u8; 16], vec![0u8; 16]);
    good.reference(&input, &mut a1, &mut r1);
    bad.reference(&input, &mut a2, &mut r2);
    assert_ne!(r1, r2);
}

#[test]
fn the_naive_path_gives_the_same_results() {
    let rt = runtime(Cost::zero());
    let model = Model::chain(3, 4096).unwrap();
    let maps_before = rt.dma_space().stats().maps;
    let mut seen = 0;
    let summary = naive::run(
        &rt,
        &model,
        0,
        20,
        Duration::from_secs(10),
        fill,
        |n, result, _| {
            assert_eq!(result.unwrap(), &expected(&model, n)[..], "frame {n}");
            seen += 1;
        },
    )
    .unwrap();
    assert_eq!((summary.frames, seen), (20, 20));
    // Two fresh mappings per frame, and one for the queue's rings.
    assert_eq!(rt.dma_space().stats().maps - maps_before, 2 * 20 + 1);
}

/// On-device filtering: only the records whose score passes come back, and they are the ones
/// the host model keeps; a model planned from a graph with a three-input op runs as layers.
#[test]
fn filtered_results_and_multi_input_layers_are_right() {
    use userdma_infer::pipeline::Filter;
    use userdma_infer::plan::{self, Kind, Tensor};
    // in -> a, in -> b, (a, b, in) -> c (three inputs), c -> out.
    let mut t: Vec<Tensor> = vec![
        Tensor::new(0, 4096, 0, 2),
        Tensor::new(1, 4096, 1, 2),
        Tensor::new(2, 2048, 1, 2),
        Tensor::new(3, 8192, 2, 3),
        Tensor::new(4, 8192, 3, 4),
    ];
    t[0].kind = Kind::Input;
    t[4].kind = Kind::Output;
    for (i, inputs) in [(1, vec![0]), (2, vec![0]), (3, vec![1, 2, 0]), (4, vec![3])] {
        t[i].inputs = inputs;
        t[i].op = Some("Conv".into());
    }
    let planned = plan::plan(
        &t,
        &plan::Options::default(),
        plan::Strategy::Auto,
        plan::Budget::Nodes(10_000),
    )
    .unwrap();
    let model = Model::from_plan(&t, &planned).unwrap();
    assert_eq!(model.steps().len(), 4);
    let filter = Filter {
        record: 32,
        score_at: 4,
        threshold: u32::MAX - u32::MAX / 8,
        capacity: 64,
    };
    let model = model.with_filter(filter).unwrap();
    assert_eq!(model.result().bytes, 8 + 64 * 32);
    for device in devices(Cost::zero()) {
        run_checked(
            &device,
            &model,
            Config {
                depth: 3,
                ..Config::default()
            },
            40,
        );
    }
    // Some records survive and none beyond the capacity are written.
    let r = expected(&model, 7);
    let written = u32::from_le_bytes(r[0..4].try_into().unwrap());
    let found = u32::from_le_bytes(r[4..8].try_into().unwrap());
    assert!(
        written > 0 && written <= 64 && written == found.min(64),
        "{written} {found}"
    );
    // Bad filters are refused with what to do.
    let bad = Filter {
        record: 24,
        ..filter
    };
    let err = Model::chain(1, 1000).unwrap().with_filter(bad).unwrap_err();
    assert!(err.to_string().contains("dividing the result"), "{err}");
}

#[test]
fn the_yolov5s_like_model_runs_right_with_its_working_set_in_sram() {
    let rt = runtime(Cost::npu());
    let model = pipeline::zoo::yolov5s_like(300).unwrap();
    let config = Config {
        context: 5,
        working_set: Some(pipeline::WorkingSet {
            private: 2_400_000,
            shared: pipeline::zoo::YOLOV5S_WEIGHTS,
            key: 1,
        }),
        ..Config::default()
    };
    let device: Arc<dyn Accelerator> = Arc::new(LoopbackEngine::new(&rt).unwrap());
    run_checked(&device, &model, config, 3);
    let counters = rt.loopback_device().unwrap().counters().unwrap();
    // The compute queue (1) declared the working set: it counts its SRAM traffic, and after
    // the first frame's refill most of it hits.
    let compute = &counters.queues[1];
    assert!(
        compute.sram_touched >= 3 * model.compute_bytes() / 2,
        "{compute:?}"
    );
    let rate = compute.sram_hit_rate().unwrap();
    assert!((0.5..0.9).contains(&rate), "{rate}");
    assert_eq!(counters.queues[0].sram_hit_rate(), None);
    let unit = counters.units[loopback::Unit::Compute as usize];
    assert!(
        unit.modelled_ns > 0 && unit.busy_ns >= unit.modelled_ns,
        "{unit:?}"
    );
}

/// A frame's fence signals when the frame reaches postprocessing, in every process that holds
/// its descriptor; a fence for a frame already done comes signalled.
#[test]
fn frame_fences_signal_as_frames_finish_and_cross_a_socket() {
    use std::os::fd::AsFd;
    use userdma::share::{self, Item, Received};

    let rt = runtime(Cost::zero());
    let model = Model::chain(2, 4096).unwrap();
    let mut p = Pipeline::new(&rt, model, Config::default()).unwrap();
    let f1 = p.fence(1).unwrap();
    let f3 = p.fence(3).unwrap();
    let (a, b) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    share::send(a.as_fd(), &[Item::Fence(&f3)]).unwrap();
    let Some(Received::Fence(remote)) = share::recv(b.as_fd()).unwrap().pop() else {
        panic!("a fence")
    };
    assert!(!f1.is_signalled().unwrap() && !remote.is_signalled().unwrap());
    let mut seen = Vec::new();
    p.run(
        2,
        |_, _| Ok(()),
        |done| seen.push((done.frame, f1.is_signalled().unwrap())),
    )
    .unwrap();
    // Frame 1's fence is signalled after frame 1 is handed over, not before.
    assert_eq!(seen, vec![(0, false), (1, false)]);
    assert!(f1.is_signalled().unwrap());
    assert!(!remote.is_signalled().unwrap(), "frame 3 has not run");
    p.run(2, |_, _| Ok(()), |_| {}).unwrap();
    remote.wait(Some(Duration::from_secs(5))).unwrap();
    assert!(p.fence(0).unwrap().is_signalled().unwrap());
    assert!(!p.fence(4).unwrap().is_signalled().unwrap());
}

/// A submission after a dependency waits for it, and submits nothing when it does not signal.
#[test]
fn a_submission_waits_for_its_dependency() {
    let rt = runtime(Cost::zero());
    let model = Model::chain(2, 4096).unwrap();
    let mut p = Pipeline::new(&rt, model, Config::default()).unwrap();
    let decoded = userdma::fence::Fence::new().unwrap();
    let err = p
        .try_submit_after(&decoded, Some(Duration::from_millis(10)), |_, _| Ok(()))
        .unwrap_err();
    assert_eq!(err.code(), userdma::Code::Timeout, "{err}");
    assert_eq!(p.in_flight(), 0, "nothing submitted");
    let signaller = decoded.try_clone().unwrap();
    let thread = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        signaller.signal().unwrap();
    });
    let frame = p
        .try_submit_after(&decoded, Some(Duration::from_secs(10)), |_, _| Ok(()))
        .unwrap();
    assert_eq!(frame, Some(0));
    thread.join().unwrap();
    p.shutdown(|done| assert!(done.result.is_ok())).unwrap();
}
