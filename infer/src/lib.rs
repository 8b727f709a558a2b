//! userdma-infer: the inference layer over the userdma driver.
//!
//! N-deep pipelines that make every buffer, arena and queue once and then run frames with no
//! allocation ([`pipeline`]); several streams on devices, scheduled so context switches drop
//! without starving anyone, with a stated bound on every frame's wait ([`sched`]); files and
//! sockets as frame sources and sinks, read into and written from pool buffers through io_uring
//! ([`stage`]); and the statistics a run reports: latency histograms, the time split,
//! DMA/compute overlap, JSON, Prometheus text and SVG plots (the `svg` feature) ([`stats`]).
//!
//! | module | owns |
//! |---|---|
//! | [`arena`] | a planned model bound to memory: every tensor at its address in one arena of device memory, or of host memory mapped once for DMA |
//! | [`pipeline`] | the N-deep inference pipeline: slots of host buffers and device arenas made once, frames through H2D, a planned model's layers, on-device filtering and D2H across the loopback device's copy engine and compute unit; the naive per-frame path to compare |
//! | [`sched`] | several streams on one device: round-robin, strict priority, priority with batch switching (K), a maximum wait (W), context affinity, the stated bound on a frame's wait, switch counting; a simulator that checks the bounds |
//! | [`stats`] | counters, latency histograms per stage, the time split, DMA/compute overlap, slot occupancy; JSON, Prometheus text and SVG plots |
//! | [`trace`] | traces of a run for Perfetto: every op on the device's units and queues, scheduler decisions, switches with their SRAM refill, counters; bounded and allocation-free while recording |
//! | [`stage`] | zero-copy staging: files read into and written from pool buffers with io_uring fixed buffers, O_DIRECT where the file system supports it, many requests in flight |
//!
//! **Layering**: the driver (`userdma`: devices, DMA spaces, pools, rings, the runtime) and the
//! planner (`userdma-plan`) below; `stage` on the driver's pools; `pipeline` on the runtime and
//! the planner; `sched` on `pipeline`; `stats` stands alone. [`Error`] wraps the driver's
//! error beside this layer's own, with the same [`Code`](userdma::Code) numbers.

/// Static buffer planning: the [`userdma-plan`](userdma_plan) package, re-exported.
pub use userdma_plan as plan;

pub mod accel;
pub mod arena;
pub mod pipeline;
pub mod sched;
pub mod stage;
pub mod stats;
pub mod trace;

mod error;

pub use self::error::{plan_code, Error};
