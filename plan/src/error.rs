//! Why a planning input was refused: one variant per failure, each naming the record.

/// Why [`plan`](super::plan()) (or [`Problem::new`](super::Problem::new)) refused its input.
///
/// Tensors are named as `tensor ID` or `tensor ID ("name")`.
///
/// Not `#[non_exhaustive]` on purpose: userdma gives each variant its error code in an
/// exhaustive match (its `plan_code`), so a new variant must be given a code there too.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// More tensors than a plan takes.
    #[error("{count} tensors are more than a plan takes ({max}): split the graph")]
    TooManyTensors {
        /// The tensors given.
        count: usize,
        /// The most a plan takes ([`MAX_TENSORS`](super::MAX_TENSORS)).
        max: usize,
    },
    /// The arena alignment is zero or not a power of two.
    #[error("alignment {align} is not a power of two")]
    Alignment {
        /// The alignment asked for.
        align: u64,
    },
    /// A tensor has no bytes.
    #[error("{tensor}: size is zero")]
    ZeroSize {
        /// The tensor.
        tensor: String,
    },
    /// A tensor is last read before it is produced.
    #[error("{tensor}: first step {first} is after last step {last}")]
    Interval {
        /// The tensor.
        tensor: String,
        /// Its first step.
        first: u32,
        /// Its last step.
        last: u32,
    },
    /// Two tensors have the same id.
    #[error("{tensor}: id {id} is used twice")]
    DuplicateId {
        /// The second tensor with the id.
        tensor: String,
        /// The id.
        id: u64,
    },
    /// A tensor's producing op reads an id that no tensor has.
    #[error("{tensor}: input {input} is not a tensor")]
    UnknownInput {
        /// The tensor.
        tensor: String,
        /// The id that does not exist.
        input: u64,
    },
    /// A fixed offset is not a multiple of the alignment.
    #[error("{tensor}: fixed offset {offset} is not a multiple of the alignment {align}")]
    Misaligned {
        /// The tensor.
        tensor: String,
        /// Its fixed offset.
        offset: u64,
        /// The arena alignment.
        align: u64,
    },
    /// Two pre-placed tensors are live at the same step and overlap in memory.
    #[error(
        "{tensor}: fixed range [{offset}, {end}) collides with {other}, live at the same step"
    )]
    FixedCollision {
        /// The second tensor.
        tensor: String,
        /// Its fixed offset.
        offset: u64,
        /// The end of its (aligned) range.
        end: u64,
        /// The tensor it collides with.
        other: String,
    },
    /// A size rounded up to the alignment, an offset plus its size, the sum of all sizes, or the
    /// highest fixed end plus the sizes of the tensors without a fixed offset does not fit in
    /// 64 bits: an arena that large cannot be addressed.
    #[error("{tensor}: sizes overflow 64 bits ({what}): use smaller sizes or lower fixed offsets")]
    Overflow {
        /// The tensor at which the sum overflowed.
        tensor: String,
        /// Which sum.
        what: &'static str,
    },
}
