//! Why a pipeline refused its settings or a request: [`Error`].

use super::MAX_DEPTH;

/// Why a [`Pipeline`](super::Pipeline) (or the [`naive`](super::naive) path) refused its
/// settings or a request (converts into [`crate::Error`]). A model that cannot be built is a
/// [`ModelError`](super::ModelError); what the device, the pool or the rings refuse keeps
/// their own errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A depth or batch out of range ([`Config::depth`](super::Config::depth),
    /// [`Config::batch`](super::Config::batch)).
    #[error(
        "pipeline depth {depth} and batch {batch}: use a depth of 1 to {MAX_DEPTH} slots and a \
         batch of at least 1 frame"
    )]
    Depth {
        /// The depth asked for.
        depth: usize,
        /// The batch asked for.
        batch: usize,
    },
    /// A first queue whose following queues (a split pipeline uses it and the next two) pass
    /// the last queue id.
    #[error(
        "queue {queue} and the {after} after it: queue ids end at {}, use a lower first queue",
        u16::MAX
    )]
    Queues {
        /// [`Config::queue`](super::Config::queue).
        queue: u16,
        /// How many queues the pipeline uses after it.
        after: usize,
    },
    /// The slots' host buffers together do not fit the address space.
    #[error(
        "the pipeline's host buffers ({depth} slots of {slot_bytes} bytes): they do not fit the \
         address space: lower the depth or the tensor sizes"
    )]
    HostBuffers {
        /// The depth asked for.
        depth: usize,
        /// One slot's input and result buffers, in bytes, each rounded up to whole pages.
        slot_bytes: u64,
    },
    /// The device refused the D2H copy of the model's result that [`Results::Auto`]
    /// measures (when the pipeline is built).
    ///
    /// [`Results::Auto`]: super::Results::Auto
    #[error(
        "the D2H copy of the {bytes}-byte result, measured for Results::Auto (device code \
         {code}, {status}): the device refused a copy of the model's result: check the model's \
         result range"
    )]
    ResultCopy {
        /// The result's size.
        bytes: u64,
        /// The device's completion code.
        code: u32,
        /// The engine's name for it.
        status: &'static str,
    },
    /// A read of a result that went to the caller's own memory
    /// ([`Pipeline::try_submit_spans`](super::Pipeline::try_submit_spans)): the caller reads it
    /// there.
    #[error(
        "frame {frame}'s result went to the caller's buffer (Pipeline::try_submit_spans): read \
         it there, not through Output::read"
    )]
    CallerResult {
        /// The frame.
        frame: u64,
    },
    /// An accelerator's [`Accelerator::alloc_arena`](crate::accel::Accelerator::alloc_arena)
    /// answered with an arena that is not what was asked for ([`Arena::fault`]).
    ///
    /// [`Arena::fault`]: crate::accel::Arena::fault
    #[error(
        "{device}: its alloc_arena({bytes}, {align}) returned an arena at {at:#x} that {why}: \
         fix the accelerator's allocator"
    )]
    Arena {
        /// The accelerator's identity.
        device: String,
        /// The bytes asked for.
        bytes: u64,
        /// The alignment asked for.
        align: u64,
        /// The arena's address.
        at: u64,
        /// What is wrong with it.
        why: String,
    },
    /// A caller's span shorter than the model's input or result.
    #[error(
        "the caller's {what} span holds {len} bytes, the model's {what} needs {needed}: give a \
         buffer at least that long"
    )]
    ShortSpan {
        /// "input" or "result".
        what: &'static str,
        /// The span's length.
        len: u64,
        /// The model's bytes.
        needed: u64,
    },
    /// A read of an in-place result ([`Output::read`](super::Output::read)) that leaves it.
    #[error(
        "a read of {len} bytes at {offset} of a {size}-byte result: read inside the result \
         (Output::len)"
    )]
    OutsideResult {
        /// Where the read starts.
        offset: usize,
        /// Bytes to read.
        len: usize,
        /// The result's length.
        size: usize,
    },
    /// The naive path mapped an empty buffer for a frame's input or result.
    #[error(
        "an empty DMA mapping for the frame's {what}: the model's input and result must be at \
         least one word"
    )]
    EmptyMapping {
        /// `input` or `result`.
        what: &'static str,
    },
    /// A pipeline setting the device cannot carry out: it lacks a capability the setting
    /// needs ([`Capabilities`](crate::accel::Capabilities)).
    #[error("{device} ({kind}) has no {lacks}, which {setting} needs: {hint}")]
    Lacks {
        /// The device.
        device: String,
        /// Its engine's kind.
        kind: &'static str,
        /// The capability it lacks.
        lacks: &'static str,
        /// The setting that needs it.
        setting: &'static str,
        /// What to do.
        hint: &'static str,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](userdma::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> userdma::Code {
        match self {
            // Settings or a request out of range, and a model whose result range the device
            // will not copy: the caller's to change.
            Error::Depth { .. }
            | Error::Queues { .. }
            | Error::HostBuffers { .. }
            | Error::ResultCopy { .. }
            | Error::OutsideResult { .. }
            | Error::CallerResult { .. }
            | Error::ShortSpan { .. }
            | Error::EmptyMapping { .. }
            | Error::Lacks { .. } => userdma::Code::InvalidArgument,
            // The accelerator's implementation is at fault, not the caller's request.
            Error::Arena { .. } => userdma::Code::Device,
        }
    }
}
