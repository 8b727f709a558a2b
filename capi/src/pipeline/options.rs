//! How to make a pipeline (`udma_pipeline_options`, its flags, `udma_results`), checked into
//! the pipeline's configuration.

use std::time::Duration;

use udma::device::Wait;
use userdma_infer::pipeline::{self, Results, WorkingSet};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi;
use crate::error::Fail;

/// `udma_pipeline_options.flags`: every descriptor on one queue, in order (by default three
/// queues on the device's two units, so copying and computing overlap).
pub const UDMA_PIPELINE_ONE_QUEUE: u32 = 1;
/// `udma_pipeline_options.flags`: poll for completions instead of sleeping on interrupts.
pub const UDMA_PIPELINE_POLL: u32 = 2;

/// `udma_pipeline_options.results`: how results reach the host.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_results {
    /// Measure both ways for the model's result size when the pipeline is made, use the
    /// faster (the default).
    UDMA_RESULTS_AUTO = 0,
    /// A D2H copy into a host buffer.
    UDMA_RESULTS_COPY = 1,
    /// Read in place from device memory through the BAR (no D2H descriptor).
    UDMA_RESULTS_IN_PLACE = 2,
}

/// How to make a pipeline. Zero is the default for every field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_pipeline_options {
    /// `sizeof(udma_pipeline_options)`.
    pub size: usize,
    /// Slots (frames in flight at most), 1 to 1024; 0: 2 (double buffering).
    pub depth: u32,
    /// Frames per doorbell; 0: 1.
    pub batch: u32,
    /// The first of its queues (it takes three, or one with `UDMA_PIPELINE_ONE_QUEUE`).
    pub queue: u32,
    /// The device context its queues run in (streams on different contexts make the device
    /// switch between them).
    pub context: u32,
    /// `UDMA_PIPELINE_ONE_QUEUE`, `UDMA_PIPELINE_POLL`, or 0.
    pub flags: u32,
    /// A `udma_results`; 0: `UDMA_RESULTS_AUTO`.
    pub results: u32,
    /// How long a wait for a frame may take before it fails; 0: 10 s.
    pub timeout_ns: u64,
    /// The context's working set in device SRAM: bytes of its own (0 with `shared` 0:
    /// nothing declared).
    pub working_set_private: u64,
    /// Bytes shared with contexts of the same `working_set_key` (one model's weights).
    pub working_set_shared: u64,
    /// The share key (0: nothing shared).
    pub working_set_key: u32,
    /// Zero.
    pub reserved: u32,
}

abi::sized!(udma_pipeline_options);

pub(super) fn config(o: &udma_pipeline_options) -> Result<pipeline::Config, Fail> {
    if o.flags & !(UDMA_PIPELINE_ONE_QUEUE | UDMA_PIPELINE_POLL) != 0 {
        return Err(Fail::invalid(format!(
            "flags {:#x} has bits that are not UDMA_PIPELINE_* flags",
            o.flags
        )));
    }
    let results = match o.results {
        0 => Results::Auto,
        1 => Results::Copy,
        2 => Results::InPlace,
        other => {
            return Err(Fail::invalid(format!(
                "results {other} is not a udma_results (UDMA_RESULTS_AUTO 0, \
                 UDMA_RESULTS_COPY 1, UDMA_RESULTS_IN_PLACE 2)"
            )))
        }
    };
    let queue = u16::try_from(o.queue)
        .map_err(|_| Fail::invalid(format!("queue {} is out of range", o.queue)))?;
    let working_set =
        (o.working_set_private != 0 || o.working_set_shared != 0).then_some(WorkingSet {
            private: o.working_set_private,
            shared: o.working_set_shared,
            key: o.working_set_key,
        });
    Ok(pipeline::Config {
        depth: if o.depth == 0 { 2 } else { o.depth as usize },
        batch: if o.batch == 0 { 1 } else { o.batch as usize },
        queue,
        wait: if o.flags & UDMA_PIPELINE_POLL != 0 {
            Wait::Poll
        } else {
            Wait::Interrupt
        },
        timeout: if o.timeout_ns == 0 {
            Duration::from_secs(10)
        } else {
            Duration::from_nanos(o.timeout_ns)
        },
        split: o.flags & UDMA_PIPELINE_ONE_QUEUE == 0,
        results,
        context: o.context,
        working_set,
    })
}
