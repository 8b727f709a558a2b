//! Static buffer planning: tensor lifetimes to offsets in one DMA arena.
//!
//! Input records ([`Tensor`]: size, live interval `[first, last]` in steps, producing op,
//! kind, optional fixed offset) go in; a [`Plan`] comes out: every tensor's offset in one
//! arena that is allocated and mapped once, the arena size, the [lower bound](LowerBound)
//! (the peak of live bytes), the naive size, the strategy that won and whether it is proven
//! optimal. [`Plan::validate`] checks a plan without trusting the planner. Pure logic: no
//! unsafe, no I/O.
//!
//! ```
//! use userdma_plan::{self as plan, Budget, Options, Strategy, Tensor};
//!
//! let tensors = [Tensor::new(0, 1000, 0, 1), Tensor::new(1, 500, 1, 2), Tensor::new(2, 1000, 2, 3)];
//! let plan = plan::plan(&tensors, &Options::default(), Strategy::Auto, Budget::Nodes(10_000))?;
//! plan.validate(&tensors)?;
//! assert_eq!(plan.arena_bytes, plan.lower_bound.bytes); // 1024 + 512, with 256-byte alignment
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! | module | owns |
//! |---|---|
//! | [`tensor`] | the input record ([`Tensor`], [`Kind`]) |
//! | `error` | [`Error`]: why an input was refused, naming the record |
//! | [`problem`] | validation, alignment, in-place and alias groups, [`LowerBound`], naive size |
//! | [`inplace`] | the built-in op tables for in-place reuse and aliasing |
//! | `heuristics` | colour, greedy by size, first fit, best fit |
//! | `timeline` | which blocks are live during a span of steps, for the heuristics |
//! | [`exact`] | the branch and bound ([`Budget`]) |
//! | [`strategy`] | [`Strategy`], [`plan()`], [`compare`], [`compare_within`] |
//! | [`arena`] | [`Plan`], [`Placement`], the independent checker ([`Invalid`]) |
//! | [`multi`] | several models in one arena (sequential, concurrent) and per-shape-bucket plans |
//! | [`levels`] | two memory levels: which tensors live in SRAM, and the share of touched bytes there |
//! | `onnx` | the ONNX reader (feature `onnx`): tensors, sizes and lifetimes of a model graph |
//!
//! A package of its own, below the driver and the inference layer: it depends on nothing of
//! theirs (`thiserror`, `serde` for the JSON reader and the reports; `prost` only with the
//! `onnx` feature), so a tool that only plans links only this.

pub mod arena;
mod error;
pub mod exact;
pub mod format;
mod heuristics;
pub mod inplace;
pub mod levels;
pub mod multi;
#[cfg(feature = "onnx")]
pub mod onnx;
pub mod problem;
pub mod strategy;
pub mod tensor;
mod timeline;

pub use arena::{Invalid, Placement, Plan};
pub use error::Error;
pub use exact::Budget;
pub use problem::{LowerBound, Options, Problem, DEFAULT_ALIGN};
pub use strategy::{compare, compare_within, plan, plan_problem, Strategy, UnknownStrategy};
pub use tensor::{Kind, Tensor};

/// The most tensors one plan takes (a million: model graphs have thousands); more is
/// [`Error::TooManyTensors`], refused before anything is sized by the count. The exact search
/// also stands down, keeping the best heuristic's plan unproven, when more than
/// `exact::MAX_PAIRS` pairs of tensors are live together.
pub const MAX_TENSORS: usize = 1 << 20;
