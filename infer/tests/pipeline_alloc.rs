//! Zero allocations in steady state: after warm-up, a pipeline frame makes no heap allocation
//! and no DMA map or unmap (a counting global allocator and the DMA space's own counters), at
//! depths 1 to 3, by interrupt and by polling, results copied back and read in place, traced
//! (every op and frame recorded, the device's activity records drained), with every result
//! still checked.

use userdma::device::Wait;
use userdma::Runtime;
use userdma_infer::pipeline::{Config, Model, Pipeline, Results};
use userdma_infer::trace::Trace;
use userdma_loopback::{self as loopback, LoopbackRuntime};

#[global_allocator]
static GLOBAL: userdma_infer::stats::CountingAllocator = userdma_infer::stats::CountingAllocator;

#[test]
fn steady_state_frames_allocate_and_map_nothing() {
    let rt = Runtime::loopback(loopback::Config::default()).unwrap();
    let model = Model::chain(3, 8192).unwrap();
    // Expected results computed up front for a few input patterns (the check allocates
    // nothing either).
    let patterns = 4u64;
    let inputs: Vec<Vec<u8>> = (0..patterns)
        .map(|p| (0..8192u32).map(|j| (j as u8) ^ (p as u8 * 37)).collect())
        .collect();
    let expected: Vec<Vec<u8>> = inputs.iter().map(|input| model.expected(input)).collect();
    for (depth, wait, results, traced) in [
        (1, Wait::Interrupt, Results::Copy, false),
        (2, Wait::Interrupt, Results::Auto, false),
        (2, Wait::Interrupt, Results::InPlace, false),
        (3, Wait::Poll, Results::Copy, false),
        // Traced: every op and frame recorded, the device's activity records drained.
        (2, Wait::Interrupt, Results::Copy, true),
    ] {
        let config = Config {
            depth,
            wait,
            results,
            ..Config::default()
        };
        let mut p = Pipeline::new(&rt, model.clone(), config).unwrap();
        let trace = traced.then(|| Trace::new(1 << 16));
        if let Some(trace) = &trace {
            let stream = trace.stream("frames");
            p.set_trace(trace.clone(), stream);
        }
        let mut got = vec![0u8; model.result().bytes as usize];
        let mut wrong = 0u64;
        let mut run = |p: &mut Pipeline, frames: u64| {
            p.run(
                frames,
                |n, input| input.write(0, &inputs[(n % patterns) as usize]),
                |done| match done.result {
                    Ok(out) => {
                        out.read(0, &mut got).unwrap();
                        wrong += u64::from(got != expected[(done.frame % patterns) as usize]);
                    }
                    Err(_) => wrong += 1,
                },
            )
            .unwrap();
        };
        run(&mut p, 100);
        let (allocs, maps) = (
            userdma_infer::stats::allocations(),
            rt.dma_space().stats().maps + rt.dma_space().stats().unmaps,
        );
        run(&mut p, 2000);
        let allocs = userdma_infer::stats::allocations() - allocs;
        let stats = rt.dma_space().stats();
        let maps = stats.maps + stats.unmaps - maps;
        assert_eq!(wrong, 0, "depth {depth}");
        if let Some(trace) = &trace {
            let dir = tempfile::tempdir().unwrap();
            let summary = trace.save(dir.path().join("trace.json")).unwrap();
            assert_eq!(summary.dropped, 0);
            assert_eq!(summary.frames, 2100, "every frame traced");
            assert_eq!(
                summary.ops_matched, summary.ops,
                "every op timed by the device"
            );
        }
        assert_eq!(
            allocs, 0,
            "heap allocations in 2000 frames at depth {depth}"
        );
        assert_eq!(
            maps, 0,
            "DMA maps and unmaps in 2000 frames at depth {depth}"
        );
        p.shutdown(|_| {}).unwrap();
    }
}
