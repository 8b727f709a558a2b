//! What the model opcodes compute, on host memory: [`layer`] for
//! [`Opcode::Layer`](super::Opcode::Layer) and [`compact`] for
//! [`Opcode::Compact`](super::Opcode::Compact), byte for byte what the device writes, so an
//! application or a test can check a model's device output on the host.
//!
//! The device runs the same functions' cores ([`mix`], [`Compact::survives`],
//! [`Compact::output_len`]) over device memory through raw pointers; these run them over
//! slices.

/// Why a reference computation was refused (the device refuses the same fields with an error
/// completion).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A layer has 1 to 3 inputs.
    #[error("a layer has 1 to 3 inputs, not {count}")]
    Inputs {
        /// The inputs given.
        count: usize,
    },
    /// An input is empty or not a whole number of 32-bit words.
    #[error("layer input {index} is {len} bytes: not a positive multiple of 4")]
    InputLength {
        /// Which input.
        index: usize,
        /// Its length.
        len: usize,
    },
    /// The output is empty or not a whole number of 32-bit words.
    #[error("the output is {len} bytes: not a positive multiple of 4")]
    OutputLength {
        /// Its length.
        len: usize,
    },
    /// A compact's record size or score offset is out of range.
    #[error(
        "compact: a record of {record} bytes with its score at byte {score_at} \
         (expected a multiple of 4 in 4..=4096, the score a multiple of 4 inside it)"
    )]
    Record {
        /// The record size.
        record: u32,
        /// The score's offset in the record.
        score_at: u32,
    },
    /// A compact's input is empty or not a whole number of records.
    #[error(
        "compact: {len} bytes of input is not a positive multiple of the {record}-byte record"
    )]
    Records {
        /// The input length.
        len: usize,
        /// The record size.
        record: u32,
    },
    /// A compact's output is not [`Compact::output_len`] bytes.
    #[error("compact: the output is {len} bytes, expected {expected}")]
    CompactOutput {
        /// Its length.
        len: usize,
        /// What the parameters need.
        expected: u64,
    },
}

/// The layer's mixing function: output word `index` of a layer seeded `seed` whose present
/// inputs contribute `words` (input `k`'s word at `index mod words_k`, in input order):
///
/// ```text
/// h = seed ^ (index as u32).wrapping_mul(0x9e37_79b9)      // the low 32 bits of index
/// for w in words { h = (h ^ w).wrapping_mul(0x85eb_ca6b).rotate_left(13) }
/// ```
///
/// Cheap (a multiply and a rotate per input word), and every output bit depends on every
/// input word, so a wrong input shows in the output.
#[inline]
pub fn mix(seed: u32, index: u64, words: &[u32]) -> u32 {
    // The low 32 bits of the index, by definition (a tensor of more than 16 GiB wraps).
    let low = index as u32;
    let mut h = seed ^ low.wrapping_mul(0x9e37_79b9);
    for &w in words {
        h = (h ^ w).wrapping_mul(0x85eb_ca6b).rotate_left(13);
    }
    h
}

/// The little-endian word at word index `index` of `bytes` (`4 * index + 4 <= bytes.len()`).
fn word(bytes: &[u8], index: usize) -> u32 {
    let at = 4 * index;
    let mut le = [0u8; 4];
    le.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(le)
}

/// What [`Opcode::Layer`](super::Opcode::Layer) writes: fills `out` from the present `inputs`
/// (1 to 3, each a positive multiple of 4 bytes; `out` too) with layer seed `seed`. Returns
/// the completion's result, the wrapping sum of the output words.
pub fn layer(seed: u32, inputs: &[&[u8]], out: &mut [u8]) -> Result<u64, Error> {
    if inputs.is_empty() || inputs.len() > 3 {
        return Err(Error::Inputs {
            count: inputs.len(),
        });
    }
    for (index, input) in inputs.iter().enumerate() {
        if input.is_empty() || input.len() % 4 != 0 {
            return Err(Error::InputLength {
                index,
                len: input.len(),
            });
        }
    }
    if out.is_empty() || out.len() % 4 != 0 {
        return Err(Error::OutputLength { len: out.len() });
    }
    let mut words = [0u32; 3];
    let mut sum = 0u64;
    for (j, chunk) in out.chunks_exact_mut(4).enumerate() {
        for (w, input) in words.iter_mut().zip(inputs) {
            *w = word(input, j % (input.len() / 4));
        }
        let h = mix(seed, crate::memory::u64_of(j), &words[..inputs.len()]);
        chunk.copy_from_slice(&h.to_le_bytes());
        sum = sum.wrapping_add(u64::from(h));
    }
    Ok(sum)
}

/// The parameters of a [`Opcode::Compact`](super::Opcode::Compact) (its `args` words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Compact {
    /// Bytes per record (a multiple of 4, 4 to 4096).
    pub record: u32,
    /// Byte offset of the little-endian `u32` score in a record (a multiple of 4, inside it).
    pub score_at: u32,
    /// A record survives if its score is at least this.
    pub threshold: u32,
    /// Records the output has room for.
    pub capacity: u32,
}

/// Bytes of a compact output's header: the count written and the count found, two `u32`s.
pub const COMPACT_HEADER: u64 = 8;

impl Compact {
    /// The largest record size.
    pub const MAX_RECORD: u32 = 4096;

    /// Whether a record of score `score` survives.
    #[inline]
    pub fn survives(&self, score: u32) -> bool {
        score >= self.threshold
    }

    /// Bytes of the output: [`COMPACT_HEADER`] plus `capacity` records.
    pub fn output_len(&self) -> u64 {
        COMPACT_HEADER + u64::from(self.capacity) * u64::from(self.record)
    }

    /// Whether the record size and score offset are in range (sizes and alignment both).
    fn check(&self) -> Result<(), Error> {
        let ok = (4..=Compact::MAX_RECORD).contains(&self.record)
            && self.record % 4 == 0
            && self.score_at % 4 == 0
            && self.score_at < self.record;
        if ok {
            Ok(())
        } else {
            Err(Error::Record {
                record: self.record,
                score_at: self.score_at,
            })
        }
    }
}

/// What [`Opcode::Compact`](super::Opcode::Compact) writes: filters `records` (a positive
/// multiple of `params.record` bytes) into `out` (exactly [`Compact::output_len`] bytes).
/// Returns the completion's result, the survivors found.
pub fn compact(records: &[u8], params: Compact, out: &mut [u8]) -> Result<u64, Error> {
    params.check()?;
    let record = params.record as usize;
    if records.is_empty() || records.len() % record != 0 {
        return Err(Error::Records {
            len: records.len(),
            record: params.record,
        });
    }
    let expected = params.output_len();
    if crate::memory::u64_of(out.len()) != expected {
        return Err(Error::CompactOutput {
            len: out.len(),
            expected,
        });
    }
    let (header, slots) = out.split_at_mut(COMPACT_HEADER as usize);
    let mut slots = slots.chunks_exact_mut(record);
    let (mut written, mut found) = (0u32, 0u64);
    for r in records.chunks_exact(record) {
        if !params.survives(word(r, params.score_at as usize / 4)) {
            continue;
        }
        found += 1;
        if let Some(slot) = slots.next() {
            slot.copy_from_slice(r);
            written += 1;
        }
    }
    for slot in slots {
        slot.fill(0);
    }
    header[..4].copy_from_slice(&written.to_le_bytes());
    let total = u32::try_from(found).unwrap_or(u32::MAX);
    header[4..].copy_from_slice(&total.to_le_bytes());
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_known_answers() {
        // By hand: no input is the seeded index; one input of 0 multiplies and rotates once.
        assert_eq!(mix(0, 0, &[]), 0);
        assert_eq!(mix(7, 1, &[]), 7 ^ 0x9e37_79b9);
        assert_eq!(mix(1, 0, &[0]), 0x85eb_ca6b_u32.rotate_left(13));
        assert_eq!(mix(1, 0, &[0]), 0x794d_70bd);
        // The low 32 bits of the index count.
        assert_eq!(mix(3, 5, &[9, 10]), mix(3, 5 + (1 << 32), &[9, 10]));
        assert_ne!(mix(3, 5, &[9, 10]), mix(3, 5, &[10, 9]));
    }

    #[test]
    fn layer_known_answer_and_repeating_inputs() {
        let a: Vec<u8> = [1u32, 2, 3, 4]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let b: Vec<u8> = 0xdead_beef_u32.to_le_bytes().to_vec();
        let mut out = [0u8; 16];
        let sum = layer(0x1234, &[&a, &b], &mut out).unwrap();
        let mut expect = 0u64;
        for j in 0..4u32 {
            let h = (0x1234 ^ j.wrapping_mul(0x9e37_79b9) ^ (j + 1))
                .wrapping_mul(0x85eb_ca6b)
                .rotate_left(13);
            let h = (h ^ 0xdead_beef).wrapping_mul(0x85eb_ca6b).rotate_left(13);
            assert_eq!(&out[4 * j as usize..][..4], &h.to_le_bytes(), "word {j}");
            expect += u64::from(h);
        }
        assert_eq!(sum, expect);
        // A 2-word output of a 4-word input reads its first two words only.
        let mut short = [0u8; 8];
        layer(0x1234, &[&a, &b], &mut short).unwrap();
        assert_eq!(short, out[..8]);
    }

    #[test]
    fn layer_refuses_what_the_device_refuses() {
        let four = [0u8; 4];
        let mut out = [0u8; 4];
        assert_eq!(layer(0, &[], &mut out), Err(Error::Inputs { count: 0 }));
        assert_eq!(
            layer(0, &[&four[..]; 4], &mut out),
            Err(Error::Inputs { count: 4 })
        );
        assert_eq!(
            layer(0, &[&four, &[0u8; 6]], &mut out),
            Err(Error::InputLength { index: 1, len: 6 })
        );
        assert_eq!(
            layer(0, &[&four, &[]], &mut out),
            Err(Error::InputLength { index: 1, len: 0 })
        );
        assert_eq!(
            layer(0, &[&four], &mut [0u8; 5]),
            Err(Error::OutputLength { len: 5 })
        );
    }

    fn records(scores: &[u32]) -> Vec<u8> {
        // 8-byte records: an id, then the score.
        (0u32..)
            .zip(scores)
            .flat_map(|(id, s)| [id.to_le_bytes(), s.to_le_bytes()])
            .flatten()
            .collect()
    }

    #[test]
    fn compact_known_answers() {
        let input = records(&[5, 50, 9, 10, 100]);
        let params = Compact {
            record: 8,
            score_at: 4,
            threshold: 10,
            capacity: 4,
        };
        let mut out = vec![0xffu8; 40];
        assert_eq!(compact(&input, params, &mut out), Ok(3));
        // Header (3 written, 3 found), ids 1, 3, 4 with their scores, an empty slot zeroed.
        let expect: Vec<u8> = [3u32, 3, 1, 50, 3, 10, 4, 100, 0, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(out, expect);
        // Past the capacity: the first ones in input order, the total still counted.
        let params = Compact {
            capacity: 1,
            ..params
        };
        let mut out = vec![0u8; 16];
        assert_eq!(compact(&input, params, &mut out), Ok(3));
        assert_eq!(out, [1, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 50, 0, 0, 0]);
        // Capacity 0 only counts.
        let params = Compact {
            capacity: 0,
            ..params
        };
        let mut out = vec![0u8; 8];
        assert_eq!(compact(&input, params, &mut out), Ok(3));
        assert_eq!(out, [0, 0, 0, 0, 3, 0, 0, 0]);
    }

    #[test]
    fn compact_refuses_what_the_device_refuses() {
        let input = records(&[1, 2]);
        let ok = Compact {
            record: 8,
            score_at: 4,
            threshold: 0,
            capacity: 1,
        };
        let mut out = vec![0u8; 16];
        for (record, score_at) in [(0, 0), (6, 0), (8, 8), (8, 2), (4100, 0)] {
            let params = Compact {
                record,
                score_at,
                ..ok
            };
            assert_eq!(
                compact(&input, params, &mut out),
                Err(Error::Record { record, score_at })
            );
        }
        assert_eq!(
            compact(&input[..12], ok, &mut out),
            Err(Error::Records { len: 12, record: 8 })
        );
        assert_eq!(
            compact(&[], ok, &mut out),
            Err(Error::Records { len: 0, record: 8 })
        );
        assert_eq!(
            compact(&input, ok, &mut [0u8; 24]),
            Err(Error::CompactOutput {
                len: 24,
                expected: 16
            })
        );
        assert_eq!(compact(&input, ok, &mut out), Ok(2));
    }
}
