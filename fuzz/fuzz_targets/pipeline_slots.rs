//! The pipeline's slot state machine under random operation sequences, against a model: a
//! pipeline of random depth, batch and queue layout on one loopback device takes `submit`
//! (with a preprocess that succeeds or fails), `poll`, `wait` and `flush` in any order, then
//! `shutdown`, on the loopback NPU or on the host-memory engine (no compute: every step runs
//! on the host between its copies, `accel::HostSteps`). The model tracks the frames in flight: `try_submit` refuses exactly when every
//! slot is in flight, numbers frames in order, and a failed preprocess takes no frame; every
//! result comes out once, in frame order, and equals the host's run of the model.
#![no_main]

use std::sync::{Mutex, OnceLock};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use userdma::Runtime;

use userdma_infer::accel::{Accelerator, MemoryEngine};
use userdma_infer::pipeline::{Config, Model, Pipeline, Results};
use userdma_loopback::LoopbackRuntime as _;
use userdma_loopback::{self as loopback, Cost};

#[derive(Debug, Arbitrary)]
enum Op {
    Submit { fail: bool },
    Poll,
    Wait,
    Flush,
}

#[derive(Debug, Arbitrary)]
struct Input {
    /// The host-memory engine instead of the loopback NPU.
    memory_engine: bool,
    depth: u8,
    batch: u8,
    split: bool,
    in_place: bool,
    layers: u8,
    words: u8,
    ops: Vec<Op>,
}

fn runtime() -> &'static Mutex<Runtime> {
    static RT: OnceLock<Mutex<Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        Mutex::new(Runtime::loopback(loopback::Config::default().cost(Cost::zero())).unwrap())
    })
}

/// Frame `n`'s input.
fn fill(n: u64, buf: &mut [u8]) {
    for (j, w) in buf.chunks_exact_mut(4).enumerate() {
        w.copy_from_slice(&((n as u32).wrapping_mul(31) ^ j as u32).to_le_bytes());
    }
}

struct Checker {
    model: Model,
    input: Vec<u8>,
    arena: Vec<u8>,
    expected: Vec<u8>,
    got: Vec<u8>,
    next_out: u64,
}

impl Checker {
    fn check(&mut self, done: userdma_infer::pipeline::Finished<'_>) {
        assert_eq!(done.frame, self.next_out, "results out of order");
        self.next_out += 1;
        let out = done.result.expect("no device error in a valid model");
        out.read(0, &mut self.got).unwrap();
        fill(done.frame, &mut self.input);
        self.model
            .reference(&self.input, &mut self.arena, &mut self.expected);
        assert_eq!(self.got, self.expected, "frame {}", done.frame);
    }
}

fuzz_target!(|input: Input| {
    let rt = runtime().lock().unwrap();
    let depth = 1 + usize::from(input.depth % 4);
    let model = Model::chain(
        1 + u32::from(input.layers % 3),
        4 * (1 + u64::from(input.words)),
    )
    .unwrap();
    let config = Config {
        depth,
        batch: 1 + usize::from(input.batch % 3),
        split: input.split,
        results: if input.in_place {
            Results::InPlace
        } else {
            Results::Copy
        },
        ..Config::default()
    };
    let mut p = if input.memory_engine {
        let engine: Arc<dyn Accelerator> = Arc::new(MemoryEngine::new(4).unwrap());
        let config = Config {
            split: false,
            ..config
        };
        Pipeline::on(engine, model.clone(), config).unwrap()
    } else {
        Pipeline::new(&rt, model.clone(), config).unwrap()
    };
    let mut c = Checker {
        input: vec![0; model.input().bytes as usize],
        arena: vec![0; model.arena_bytes() as usize],
        expected: vec![0; model.result().bytes as usize],
        got: vec![0; model.result().bytes as usize],
        model,
        next_out: 0,
    };
    let mut scratch = vec![0u8; c.input.len()];
    let mut submitted = 0u64;
    for op in input.ops.iter().take(64) {
        match op {
            Op::Submit { fail } => {
                let full = p.in_flight() == depth;
                let r = p.try_submit(|n, i| {
                    if *fail {
                        // A preprocess that fails: its write leaves the input.
                        return i.write(i.len(), &[0]);
                    }
                    fill(n, &mut scratch);
                    i.write(0, &scratch)
                });
                match r {
                    Ok(Some(n)) => {
                        assert!(!full && !fail);
                        assert_eq!(n, submitted, "frames numbered in order");
                        submitted += 1;
                    }
                    Ok(None) => assert!(full, "refused with a free slot"),
                    Err(_) => assert!(*fail && !full),
                }
            }
            Op::Poll => {
                p.poll(|d| c.check(d)).unwrap();
            }
            Op::Wait => {
                let before = c.next_out;
                let n = p.wait(|d| c.check(d)).unwrap();
                assert!(n > 0 || before == submitted, "wait returned with nothing");
            }
            Op::Flush => p.flush().unwrap(),
        }
        assert_eq!(p.in_flight() as u64, submitted - c.next_out);
        assert!(p.in_flight() <= depth);
    }
    let summary = p.shutdown(|d| c.check(d)).unwrap();
    assert_eq!(summary.frames, submitted);
    assert_eq!(c.next_out, submitted);
});
