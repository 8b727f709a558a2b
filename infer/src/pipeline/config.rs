//! How a pipeline is built ([`Config`]): its depth and batch, its queues and context, how
//! completions are waited for, the working set it declares ([`WorkingSet`]) and how results
//! come back ([`Results`], and what a built pipeline chose: [`ResultPath`]).

use std::time::Duration;

use userdma::device::Wait;

/// How a pipeline is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Slots in the ring: frames in flight at most (1 = synchronous, 2 = double buffering;
    /// at most 1024).
    pub depth: usize,
    /// Frames per doorbell: the descriptors of this many frames are announced together.
    pub batch: usize,
    /// The hardware queue to use.
    pub queue: u16,
    /// Completions by interrupt or by polling.
    pub wait: Wait,
    /// How long a frame may take before [`Pipeline::run`] gives up with an error.
    ///
    /// [`Pipeline::run`]: super::Pipeline::run
    pub timeout: Duration,
    /// Three queues on the loopback device's two units (H2D and D2H on the copy engine, the
    /// model's steps on the compute unit, ordered by `Wait` descriptors), so copying and
    /// computing overlap on the device; `false`: every descriptor on one queue, in order.
    pub split: bool,
    /// How results come back: a D2H copy, read in place through the device-memory BAR, or
    /// whichever measured faster for the model's result size when the pipeline was built.
    pub results: Results,
    /// The device context of its queues (two pipelines in different contexts make the
    /// device switch between them; the cost model charges it).
    pub context: u32,
    /// The working set its context keeps in device SRAM (see
    /// [`Loopback::set_working_set`]), declared on the queue that runs the model's steps;
    /// `None` declares nothing.
    ///
    /// [`Loopback::set_working_set`]: userdma_loopback::Loopback::set_working_set
    pub working_set: Option<WorkingSet>,
}

/// A context's working set in device SRAM: see [`Loopback::set_working_set`].
///
/// [`Loopback::set_working_set`]: userdma_loopback::Loopback::set_working_set
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct WorkingSet {
    /// Bytes of its own (hot activations).
    pub private: u64,
    /// Bytes shared with the contexts of the same `key` (the weights of one model).
    pub shared: u64,
    /// The share key (0: nothing shared).
    pub key: u32,
}

/// How a frame's result reaches the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum Results {
    /// A D2H copy into the slot's host result buffer, read there.
    Copy,
    /// Read in place from device memory through the mapped BAR: no D2H descriptor, but every
    /// 8 bytes is a PCIe round trip for the reading CPU. Pays for small results (a class, a
    /// score, a count).
    InPlace,
    /// Measure both for the model's result size when the pipeline is built (a D2H round trip
    /// and an in-place read, the best of a few of each) and use the faster.
    #[default]
    Auto,
}

/// How results come back in a built pipeline, and what was measured to choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ResultPath {
    /// Read in place through the BAR (`false`: D2H copies).
    pub in_place: bool,
    /// With [`Results::Auto`]: the best measured D2H round trip of the result, in ns.
    pub copy_ns: Option<u64>,
    /// With [`Results::Auto`]: the best measured in-place read of the result, in ns.
    pub in_place_ns: Option<u64>,
}

impl Config {
    /// [`Config::default`] as far as `device` can carry it out: split across its units only
    /// where it has separate copy and compute units that run every step of `model` and order
    /// one queue after another; waiting on interrupts only where its queues raise them.
    pub fn for_device(device: &dyn crate::accel::Accelerator, model: &super::Model) -> Config {
        let caps = device.capabilities();
        Config {
            split: caps.splits(model.steps()),
            wait: if caps.interrupts {
                Wait::Interrupt
            } else {
                Wait::Poll
            },
            ..Config::default()
        }
    }
}

impl Default for Config {
    /// Depth 2, one doorbell per queue per frame, queues 0 to 2 split across the units,
    /// interrupts, 10 s, results by measurement (what the loopback NPU carries out; for any
    /// device, [`Config::for_device`]).
    fn default() -> Self {
        Config {
            depth: 2,
            batch: 1,
            queue: 0,
            wait: Wait::Interrupt,
            timeout: Duration::from_secs(10),
            split: true,
            results: Results::Auto,
            context: 0,
            working_set: None,
        }
    }
}
