//! Ranges of a model's arena ([`Span`]) and the device work over them, step by step at the
//! planner's offsets ([`Step`]): what each step reads and writes, and what it costs.

use userdma_loopback::reference::Compact;

/// A range of the model's arena: an offset and a length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Its first byte, from the start of the arena.
    pub offset: u64,
    /// Its length.
    pub bytes: u64,
}

impl Span {
    #[inline]
    pub(crate) fn end(&self) -> u64 {
        self.offset + self.bytes
    }
}

/// One step of device work, at offsets within the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The loopback device's compute pass: each little-endian `u32` word `w` of `len` bytes
    /// at `src` becomes `(w ^ xor).wrapping_add(add)` at `dst` (`src == dst` computes in
    /// place). All multiples of 4.
    Compute {
        /// Where it reads.
        src: u64,
        /// Where it writes.
        dst: u64,
        /// Bytes.
        len: u64,
        /// The word mask.
        xor: u32,
        /// The word addend.
        add: u32,
    },
    /// A model layer (the loopback device's `Layer`): `len` bytes at `dst`, each word mixed
    /// from the layer's seed, its index and one word of each of `inputs[..count]`
    /// (`(offset, length)`; a shorter input repeats). The output overlaps no input.
    Layer {
        /// The inputs, `(offset, length)`; the first `count` are present.
        inputs: [(u64, u64); 3],
        /// How many inputs (1 to 3).
        count: u8,
        /// Where it writes.
        dst: u64,
        /// Bytes written.
        len: u64,
        /// The layer's seed.
        seed: u32,
    },
    /// On-device result filtering (the loopback device's `Compact`): the `params.record`-byte
    /// records of the `len` bytes at `src` whose score passes the threshold, packed after a
    /// count header at `dst` (`params.output_len()` bytes).
    Compact {
        /// The records.
        src: u64,
        /// Their bytes.
        len: u64,
        /// Where the filtered output goes.
        dst: u64,
        /// Record size, score offset, threshold, capacity.
        params: Compact,
    },
}

impl Step {
    /// The ranges it reads and the one it writes, as `(what, span)`.
    pub(crate) fn ranges(&self) -> ([Option<Span>; 3], Span) {
        let span = |offset, bytes| Span { offset, bytes };
        match *self {
            Step::Compute { src, dst, len, .. } => {
                ([Some(span(src, len)), None, None], span(dst, len))
            }
            Step::Layer {
                inputs,
                count,
                dst,
                len,
                ..
            } => {
                let mut r = [None; 3];
                for (k, &(o, l)) in inputs.iter().enumerate().take(usize::from(count)) {
                    r[k] = Some(span(o, l));
                }
                (r, span(dst, len))
            }
            Step::Compact {
                src,
                len,
                dst,
                params,
            } => (
                [Some(span(src, len)), None, None],
                span(dst, params.output_len()),
            ),
        }
    }

    /// Bytes the device computes over (read plus written, as the cost model charges).
    pub(super) fn compute_bytes(&self) -> u64 {
        let (reads, write) = self.ranges();
        match self {
            Step::Compute { len, .. } => *len,
            _ => {
                reads
                    .iter()
                    .flatten()
                    .map(|r| r.bytes.min(write.bytes))
                    .sum::<u64>()
                    + write.bytes
            }
        }
    }
}
