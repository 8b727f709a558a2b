//! Why a model cannot be built: [`ModelError`].

use crate::plan;

/// Why a model cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A range leaves the arena.
    #[error("{what} [{offset}, {offset}+{bytes}) leaves the {arena}-byte arena: plan the model again or fix the step")]
    OutOfArena {
        /// Which range.
        what: String,
        /// Its offset.
        offset: u64,
        /// Its length.
        bytes: u64,
        /// The arena's size.
        arena: u64,
    },
    /// An offset or length is not a multiple of 4 (the device computes in 32-bit words).
    #[error("{what}: offset {offset} or length {bytes} is not a multiple of 4; plan with an alignment of at least 4 and give tensors whole words")]
    Misaligned {
        /// Which range.
        what: String,
        /// Its offset.
        offset: u64,
        /// Its length.
        bytes: u64,
    },
    /// A range is empty.
    #[error("{what} is empty: the input, the result and every step need at least one word")]
    Empty {
        /// Which range.
        what: String,
    },
    /// The graph has no tensor of a kind the pipeline needs.
    #[error(
        "the graph has no {0} tensor: mark one tensor as kind \"input\" and one as \"output\""
    )]
    Missing(&'static str),
    /// A tensor of the graph is not in the plan.
    #[error("tensor {0} is not in the plan: plan the same tensors the model is built from")]
    Unplanned(u64),
    /// A step's output overlaps one of its inputs (only an element-wise compute step may work
    /// in place).
    #[error("step {step} writes [{offset}, {offset}+{bytes}) over one of its inputs: plan the model again (the planner reuses an input's memory only for element-wise ops)")]
    Overlap {
        /// The step.
        step: usize,
        /// Its output's offset.
        offset: u64,
        /// Its output's length.
        bytes: u64,
    },
    /// A size past what a model may have (checked before anything is allocated for it).
    #[error("{what} of {value} is more than a model may have ({max}): {hint}")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The largest allowed.
        max: u64,
        /// What to do.
        hint: &'static str,
    },
    /// The host has no room for a buffer the model needs (its arena's host copy).
    #[error("no host memory for {what} of {bytes} bytes: the model is too large for this host")]
    NoHostMemory {
        /// What it was for.
        what: &'static str,
        /// Its size.
        bytes: u64,
    },
    /// A buffer given is shorter than the model's tensor it stands for.
    #[error("{what} is {len} bytes, shorter than the model's {need}-byte tensor")]
    Short {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The tensor's length.
        need: u64,
    },
    /// The planner refused the model's tensors.
    #[error("the model's tensors cannot be planned: {0}")]
    Plan(plan::Error),
    /// A step given to [`Step::apply`](super::Step::apply) that no model has (built by hand,
    /// not by [`Model::new`](super::Model::new), which checks every step).
    #[error(
        "a step that cannot run: {why}; build the model with Model::new, which checks its steps"
    )]
    Unrunnable {
        /// What is wrong with it.
        why: String,
    },
    /// A filter's parameters do not fit the result tensor.
    #[error("the filter's records ({record} B, score at byte {score_at}) do not fit the {bytes}-byte result: use a record size of 4 to 4096 B, a multiple of 4 dividing the result, with the score inside it")]
    Filter {
        /// Record size.
        record: u32,
        /// Score offset.
        score_at: u32,
        /// The result's size.
        bytes: u64,
    },
}

impl ModelError {
    /// The kind of failure, as a stable [`Code`](userdma::Code); the planner's refusal gives its
    /// own. Exhaustive: a new variant must be given its code here.
    pub fn code(&self) -> userdma::Code {
        use userdma::Code;
        match self {
            ModelError::OutOfArena { .. }
            | ModelError::Misaligned { .. }
            | ModelError::Empty { .. }
            | ModelError::Missing(_)
            | ModelError::Unplanned(_)
            | ModelError::Overlap { .. }
            | ModelError::TooLarge { .. }
            | ModelError::Short { .. }
            | ModelError::Filter { .. }
            | ModelError::Unrunnable { .. } => Code::InvalidArgument,
            ModelError::NoHostMemory { .. } => Code::Exhausted,
            ModelError::Plan(e) => crate::error::plan_code(e),
        }
    }
}
