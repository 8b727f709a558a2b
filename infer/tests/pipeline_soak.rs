//! A release soak of the pipeline: 10^5 frames over pipelines of random depth, batch, queue
//! layout, result path (copied, in place, measured), tensor size and layer count (a fixed
//! seed, so the same run everywhere); every frame's result checked against the model run on the host, and afterwards no buffer leaked
//! (the ring layer's leak counters at zero, all device memory free again) and the device's
//! counters consistent, with no error completion.

use userdma::{ring, Runtime};
use userdma_infer::pipeline::{Config, Model, Pipeline, Results};
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "10^5 frames: scripts/test.sh runs it with --release"
)]
fn a_hundred_thousand_frames_all_right_nothing_leaked() {
    let rt = Runtime::loopback(loopback::Config::default().cost(Cost::zero())).unwrap();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let (mut frames, mut wrong, mut runs) = (0u64, 0u64, 0u64);
    while frames < 100_000 {
        let layers = 1 + next(4) as u32;
        let bytes = 4 * (1 + next(512));
        let model = Model::chain(layers, bytes).unwrap();
        let config = Config {
            depth: 1 + next(4) as usize,
            batch: 1 + next(3) as usize,
            split: next(4) != 0,
            results: [Results::Copy, Results::InPlace, Results::Auto][next(3) as usize],
            ..Config::default()
        };
        let count = 500 + next(3000);
        let mut p = Pipeline::new(&rt, model.clone(), config).unwrap();
        let mut input = vec![0u8; model.input().bytes as usize];
        let mut arena = vec![0u8; model.arena_bytes() as usize];
        let mut expected = vec![0u8; model.result().bytes as usize];
        let mut got = vec![0u8; model.result().bytes as usize];
        let fill = |n: u64, buf: &mut [u8]| {
            for (j, w) in buf.chunks_exact_mut(4).enumerate() {
                w.copy_from_slice(
                    &((n as u32) ^ (j as u32).wrapping_mul(0x9e37_79b9)).to_le_bytes(),
                );
            }
        };
        let mut scratch = vec![0u8; model.input().bytes as usize];
        p.run(
            count,
            |n, i| {
                fill(n, &mut scratch);
                i.write(0, &scratch)
            },
            |done| {
                fill(done.frame, &mut input);
                model.reference(&input, &mut arena, &mut expected);
                let right = done
                    .result
                    .is_ok_and(|out| out.read(0, &mut got).is_ok() && got == expected);
                wrong += u64::from(!right);
            },
        )
        .unwrap();
        let summary = p.shutdown(|_| panic!("drained by run")).unwrap();
        assert_eq!(summary.frames, count);
        frames += count;
        runs += 1;
    }
    let leaks = ring::leaks();
    eprintln!("{frames} frames over {runs} pipelines, {wrong} wrong, leaks {leaks:?}");
    assert_eq!(wrong, 0);
    assert_eq!(leaks, ring::Leaks::default());
    // Every slot's device arena went back.
    let memory = rt.device_memory().unwrap();
    assert_eq!(memory.free_bytes(), memory.size());
    let counters = rt.loopback_device().unwrap().counters().unwrap();
    assert_eq!(counters.errors, 0);
    assert_eq!(
        counters.descriptors,
        counters.queues.iter().map(|q| q.completed).sum::<u64>()
    );
}
