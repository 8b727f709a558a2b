//! A model as the pipeline runs it: where its input and its result live in one planned arena,
//! and the device work between them, step by step at the planner's offsets.
//!
//! | module | owns |
//! |---|---|
//! | this one | [`Model`]: its parts, its limits, what a frame of it costs the device |
//! | `step` | [`Span`], [`Step`]: ranges of the arena and the device work over them |
//! | `build` | a model from its parts, from a plan, a synthetic chain, with a [`Filter`] |
//! | `host` | the model run on the host: the results the device must produce |
//! | `error` | [`ModelError`] |

mod build;
mod error;
mod host;
mod step;

use std::fmt;

use userdma_loopback::{Cost, Work};

pub use self::build::Filter;
pub use self::error::ModelError;
pub use self::step::{Span, Step};

/// A model the pipeline can run: an arena size, the input tensor (written by H2D), the result
/// tensor (read back by D2H) and the device steps between.
#[derive(Clone, PartialEq, Eq)]
pub struct Model {
    arena_bytes: u64,
    input: Span,
    result: Span,
    steps: Vec<Step>,
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("arena_bytes", &self.arena_bytes)
            .field("input", &self.input)
            .field("result", &self.result)
            .field("steps", &self.steps.len())
            .finish()
    }
}

impl Model {
    /// The most steps (layers) a model has: a frame's descriptors (its steps, the two copies
    /// and the waits between queues, for every slot of a pipeline) must fit one ring of at
    /// most [`ring::MAX_DEPTH`](userdma::ring::MAX_DEPTH) entries, so no pipeline could run more.
    pub const MAX_STEPS: usize = 4096;
    /// The largest tensor a model has, in bytes (1 TiB): tensors live in device memory.
    pub const MAX_TENSOR_BYTES: u64 = 1 << 40;

    /// The arena's size in bytes.
    pub fn arena_bytes(&self) -> u64 {
        self.arena_bytes
    }

    /// Where the input goes.
    pub fn input(&self) -> Span {
        self.input
    }

    /// Where the result is read from.
    pub fn result(&self) -> Span {
        self.result
    }

    /// The device steps, in order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Bytes the device computes over per frame (as its cost model charges them).
    pub fn compute_bytes(&self) -> u64 {
        self.steps.iter().map(Step::compute_bytes).sum()
    }

    /// The most one frame of this model can keep a loopback device with cost model `cost`
    /// busy, in ns: its H2D copy, each step with none of its working set resident in SRAM
    /// (every compute byte at the DRAM rate), its D2H copy, two cross-queue `Wait`s (a split
    /// pipeline's) and a context switch on each of the two units, all one after the other.
    /// What a scheduler's stated wait bounds take as a frame's service time
    /// ([`Scheduler::wait_bound`](crate::sched::Scheduler::wait_bound), with the switch cost
    /// already in it), so a bound computed from it holds whatever the SRAM held.
    pub fn worst_frame_ns(&self, cost: &Cost) -> u64 {
        let copy = |bytes| Work {
            dma_bytes: bytes,
            ..Work::default()
        };
        let step = |bytes| Work {
            compute_bytes: bytes,
            missed_bytes: bytes,
            ..Work::default()
        };
        let wait = Work {
            fence: true,
            ..Work::default()
        };
        let works = [copy(self.input.bytes), copy(self.result.bytes), wait, wait]
            .into_iter()
            .chain(self.steps.iter().map(|s| step(s.compute_bytes())));
        let ns = |w: Work| u64::try_from(cost.charge_work(w).as_nanos()).unwrap_or(u64::MAX);
        works.map(ns).fold(
            cost.context_switch_ns.saturating_mul(2),
            u64::saturating_add,
        )
    }
}
