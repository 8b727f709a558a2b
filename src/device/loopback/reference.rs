//! What the computing opcodes compute, on host memory: [`compute`] for
//! [`Opcode::Compute`](super::Opcode::Compute), [`layer`] for
//! [`Opcode::Layer`](super::Opcode::Layer) and [`compact`] for
//! [`Opcode::Compact`](super::Opcode::Compact), byte for byte what the device writes, so an
//! application or a test can check a model's device output on the host.
//!
//! The device runs the same functions' cores ([`transform`], [`mix`], [`Compact::survives`],
//! [`Compact::output_len`]) over device memory through raw pointers; these run them over
//! slices. The `Compute` and `Layer` kernels are compiled twice, for any x86-64 and for AVX2,
//! and the CPU picks one at run time.

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
    /// A compute's input and output differ in length, or are empty or not a whole number of
    /// 32-bit words.
    #[error(
        "compute: an input of {input} bytes into an output of {out}: \
         give both the same length, a positive multiple of 4"
    )]
    ComputeLength {
        /// The input's length.
        input: usize,
        /// The output's length.
        out: usize,
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

/// The compute transform of one word: `(word ^ xor).wrapping_add(add)`.
#[inline]
pub fn transform(word: u32, xor: u32, add: u32) -> u32 {
    (word ^ xor).wrapping_add(add)
}

/// What [`Opcode::Compute`](super::Opcode::Compute) writes: each little-endian word `w` of
/// `input` becomes [`transform(w, xor, add)`](transform) in the same word of `out` (both the
/// same length, a positive multiple of 4). Returns the completion's result, the wrapping sum
/// of the words written.
pub fn compute(xor: u32, add: u32, input: &[u8], out: &mut [u8]) -> Result<u64, Error> {
    if input.is_empty() || input.len() % 4 != 0 || input.len() != out.len() {
        return Err(Error::ComputeLength {
            input: input.len(),
            out: out.len(),
        });
    }
    // SAFETY: `input` is valid for reads and `out` for writes of `out.len()` bytes, a multiple
    // of 4; `out`, being a `&mut`, overlaps nothing else; nothing else touches them while the
    // borrows last.
    Ok(unsafe { compute_raw(xor, add, input.as_ptr(), out.as_mut_ptr(), out.len()) })
}

/// Words the compute kernel reads, transforms and writes at a time (two AVX2 registers).
const BLOCK: usize = 16;

/// The compute transform over raw memory, shared by [`compute`] (host slices) and the device
/// (device memory, which it never makes references to): `len` bytes at `src` into `len` bytes
/// at `dst`, word by word in ascending order, which defines overlapping ranges. Returns the
/// wrapping sum of the words written.
///
/// Ascending order lets the kernel read a block of words before writing it wherever no word
/// depends on one written in the same block: always, unless `dst` starts inside the source
/// past its start (`src < dst < src + len`). Then word `i` reads what word `i - gap / 4`
/// wrote (`gap = dst - src`), so the kernel goes in runs of `gap` bytes, each reading only
/// what earlier runs wrote, and blocks within a run.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes, a multiple of 4, and no one
/// else writes either range during the call.
pub(crate) unsafe fn compute_raw(
    xor: u32,
    add: u32,
    src: *const u8,
    dst: *mut u8,
    len: usize,
) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (detected); the caller's promises are passed on.
        return unsafe { compute_raw_avx2(xor, add, src, dst, len) };
    }
    // SAFETY: the caller's promises are passed on.
    unsafe { compute_raw_any(xor, add, src, dst, len) }
}

/// [`compute_raw`] compiled for AVX2: eight words per instruction instead of four.
///
/// # Safety
/// As [`compute_raw`], and the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn compute_raw_avx2(xor: u32, add: u32, src: *const u8, dst: *mut u8, len: usize) -> u64 {
    // SAFETY: the caller's promises are passed on.
    unsafe { compute_raw_any(xor, add, src, dst, len) }
}

/// [`compute_raw`] for any CPU; inlined into each compiled variant.
///
/// # Safety
/// As [`compute_raw`].
#[inline(always)]
unsafe fn compute_raw_any(xor: u32, add: u32, src: *const u8, dst: *mut u8, len: usize) -> u64 {
    // Addresses compared, never dereferenced as such.
    let (from, to) = (src as usize, dst as usize);
    let run = if from < to && to - from < len {
        to - from
    } else {
        len
    };
    let mut sum = 0u64;
    let mut at = 0usize;
    while at < len {
        let bytes = run.min(len - at);
        // SAFETY: `at + bytes <= len`: inside both ranges. Either the ranges of this run do not
        // overlap (a run of `gap` bytes), or `dst <= src`, where each word a block writes lies
        // at or below the words it has read, so a block never overwrites a word not yet read.
        let part = unsafe { compute_run(xor, add, src.add(at), dst.add(at), bytes) };
        sum = sum.wrapping_add(part);
        at += bytes;
    }
    sum
}

/// One run of [`compute_raw`]: blocks of [`BLOCK`] words, each read whole, transformed and
/// written whole, then the last words one at a time. Returns the wrapping sum of the words
/// written.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes, a multiple of 4; no one else
/// writes them during the call; and reading a block before writing it gives what word by word
/// would (the ranges do not overlap, or `dst <= src`).
#[inline(always)]
unsafe fn compute_run(xor: u32, add: u32, src: *const u8, dst: *mut u8, len: usize) -> u64 {
    let words = len / 4;
    // One sum per word of a block, added up at the end (a wrapping sum in any order is the
    // same), so the blocks need no horizontal add.
    let mut lanes = [0u64; BLOCK];
    let mut t = 0usize;
    while t + BLOCK <= words {
        let mut block = [0u32; BLOCK];
        for (k, w) in block.iter_mut().enumerate() {
            // SAFETY: `t + k < words`: inside the source; unaligned reads, so any base will do.
            *w = u32::from_le(unsafe { src.add(4 * (t + k)).cast::<u32>().read_unaligned() });
        }
        for (w, lane) in block.iter_mut().zip(&mut lanes) {
            *w = transform(*w, xor, add);
            *lane = lane.wrapping_add(u64::from(*w));
        }
        for (k, &w) in block.iter().enumerate() {
            // SAFETY: `t + k < words`: inside the destination (the caller's promise covers
            // any overlap with the source).
            unsafe {
                dst.add(4 * (t + k))
                    .cast::<u32>()
                    .write_unaligned(w.to_le())
            };
        }
        t += BLOCK;
    }
    let mut sum = lanes.iter().fold(0u64, |a, &b| a.wrapping_add(b));
    for t in t..words {
        // SAFETY: `t < words`: inside both ranges; one word read, then written.
        let w = u32::from_le(unsafe { src.add(4 * t).cast::<u32>().read_unaligned() });
        let h = transform(w, xor, add);
        // SAFETY: as above.
        unsafe { dst.add(4 * t).cast::<u32>().write_unaligned(h.to_le()) };
        sum = sum.wrapping_add(u64::from(h));
    }
    sum
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
    let mut raw = [(std::ptr::null::<u8>(), 0usize); 3];
    for (r, input) in raw.iter_mut().zip(inputs) {
        *r = (input.as_ptr(), input.len());
    }
    // SAFETY: every input pointer is its slice's start, valid for reads of its length (a
    // positive multiple of 4); `out` is valid for writes of `out.len()` bytes and, being a
    // `&mut`, overlaps no input; nothing else touches them while the borrows last.
    Ok(unsafe { layer_raw(seed, &raw[..inputs.len()], out.as_mut_ptr(), out.len()) })
}

/// The layer computation over raw memory, shared by [`layer`] (host slices) and the device
/// (device memory, which it never makes references to): `out_len` bytes at `out` from the
/// `(pointer, length)` inputs (1 to 3), input `k`'s word at `index mod words_k`. Returns the
/// wrapping sum of the output words.
///
/// The output is cut into runs over which no input wraps, and each run is one loop over words
/// with a fixed number of inputs and no division, which the compiler vectorises.
///
/// # Safety
/// Each input pointer is valid for reads of its length, a positive multiple of 4; `out` is
/// valid for writes of `out_len` bytes, a multiple of 4; the output overlaps no input; and no
/// one else writes any of them during the call.
pub(crate) unsafe fn layer_raw(
    seed: u32,
    inputs: &[(*const u8, usize)],
    out: *mut u8,
    out_len: usize,
) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (detected); the caller's promises are passed on.
        return unsafe { layer_raw_avx2(seed, inputs, out, out_len) };
    }
    // SAFETY: the caller's promises are passed on.
    unsafe { layer_raw_any(seed, inputs, out, out_len) }
}

/// [`layer_raw`] compiled for AVX2, whose 32-bit multiply lets the runs vectorise eight words
/// at a time (baseline x86-64 has none, and the compiler keeps them scalar).
///
/// # Safety
/// As [`layer_raw`], and the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn layer_raw_avx2(
    seed: u32,
    inputs: &[(*const u8, usize)],
    out: *mut u8,
    out_len: usize,
) -> u64 {
    // SAFETY: the caller's promises are passed on.
    unsafe { layer_raw_any(seed, inputs, out, out_len) }
}

/// [`layer_raw`] for any CPU; inlined into each compiled variant.
///
/// # Safety
/// As [`layer_raw`].
#[inline(always)]
unsafe fn layer_raw_any(
    seed: u32,
    inputs: &[(*const u8, usize)],
    out: *mut u8,
    out_len: usize,
) -> u64 {
    let words = out_len / 4;
    let mut pos = [0usize; 3];
    let mut j = 0usize;
    let mut sum = 0u64;
    while j < words {
        // The longest run from output word `j` over which no input reaches its end.
        let mut run = words - j;
        for (&(_, len), &p) in inputs.iter().zip(&pos) {
            run = run.min(len / 4 - p);
        }
        let mut from = [std::ptr::null::<u8>(); 3];
        for ((f, &(ptr, _)), &p) in from.iter_mut().zip(inputs).zip(&pos) {
            // SAFETY: `p` words lie inside the input (`p < len / 4`).
            *f = unsafe { ptr.add(4 * p) };
        }
        // SAFETY: `run` words from each input's position stay inside it (the minimum above)
        // and `run` words from output word `j` inside the output; the caller's promises cover
        // the rest.
        let to = unsafe { out.add(4 * j) };
        let part = match inputs.len() {
            // SAFETY: as above (one input).
            1 => unsafe { mix_run::<1>(seed, j, [from[0]], to, run) },
            // SAFETY: as above (two inputs).
            2 => unsafe { mix_run::<2>(seed, j, [from[0], from[1]], to, run) },
            // SAFETY: as above (three inputs).
            _ => unsafe { mix_run::<3>(seed, j, from, to, run) },
        };
        sum = sum.wrapping_add(part);
        for (p, &(_, len)) in pos.iter_mut().zip(inputs) {
            *p += run;
            if *p == len / 4 {
                *p = 0;
            }
        }
        j += run;
    }
    sum
}

/// One run of [`layer_raw`]: output words `first..first + words` from `N` inputs read
/// straight through. Returns the wrapping sum of the words written.
///
/// # Safety
/// Each `from[k]` is valid for reads of `4 * words` bytes, `to` for writes of `4 * words`
/// bytes, the output overlaps no input, and no one else writes them during the call.
#[inline(always)]
unsafe fn mix_run<const N: usize>(
    seed: u32,
    first: usize,
    from: [*const u8; N],
    to: *mut u8,
    words: usize,
) -> u64 {
    let mut sum = 0u64;
    for t in 0..words {
        let mut w = [0u32; N];
        for (w, &f) in w.iter_mut().zip(&from) {
            // SAFETY: `t < words`, inside the input (the caller's promise); unaligned reads,
            // so any base will do.
            *w = u32::from_le(unsafe { f.add(4 * t).cast::<u32>().read_unaligned() });
        }
        let h = mix(seed, crate::memory::u64_of(first + t), &w);
        // SAFETY: `t < words`, inside the output, which overlaps no input.
        unsafe { to.add(4 * t).cast::<u32>().write_unaligned(h.to_le()) };
        sum = sum.wrapping_add(u64::from(h));
    }
    sum
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

    /// The layer by its definition: output word `j` mixes input `k`'s word `j mod words_k`.
    fn layer_by_definition(seed: u32, inputs: &[&[u8]], out_words: usize) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let mut sum = 0u64;
        for j in 0..out_words {
            let words: Vec<u32> = inputs.iter().map(|i| word(i, j % (i.len() / 4))).collect();
            let h = mix(seed, j as u64, &words);
            out.extend_from_slice(&h.to_le_bytes());
            sum = sum.wrapping_add(u64::from(h));
        }
        (out, sum)
    }

    #[test]
    fn layer_runs_match_the_definition_for_every_arity_and_wrap() {
        // Input lengths shorter, equal and longer than the output, co-prime and not, so runs
        // end at every kind of wrap; both compiled variants.
        let bytes: Vec<u8> = (0..4096u32)
            .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
            .collect();
        let lens = [1usize, 3, 7, 16, 64, 100, 255, 1024];
        for (case, &out_words) in [1usize, 5, 64, 333, 1000].iter().enumerate() {
            for a in lens {
                for b in lens {
                    let c = lens[(a + b + case) % lens.len()];
                    let all: [&[u8]; 3] = [
                        &bytes[..4 * a],
                        &bytes[40..40 + 4 * b],
                        &bytes[80..80 + 4 * c],
                    ];
                    for count in 1..=3 {
                        let inputs = &all[..count];
                        let seed = (a * 31 + b * 7 + count) as u32;
                        let (want, want_sum) = layer_by_definition(seed, inputs, out_words);
                        let mut got = vec![0u8; 4 * out_words];
                        assert_eq!(layer(seed, inputs, &mut got), Ok(want_sum));
                        assert_eq!(
                            got, want,
                            "{count} inputs of {a}/{b}/{c} words into {out_words}"
                        );
                        let raw: Vec<(*const u8, usize)> =
                            inputs.iter().map(|i| (i.as_ptr(), i.len())).collect();
                        let mut any = vec![0u8; 4 * out_words];
                        // SAFETY: slices' pointers and lengths; the output is a separate Vec.
                        let sum = unsafe { layer_raw_any(seed, &raw, any.as_mut_ptr(), any.len()) };
                        assert_eq!((sum, &any), (want_sum, &want));
                    }
                }
            }
        }
    }

    /// Compute by its definition: word by word in ascending order over one memory, so
    /// overlapping ranges read what earlier words wrote.
    fn compute_by_definition(memory: &mut [u8], src: usize, dst: usize, len: usize) -> u64 {
        let (xor, add) = (0x5a5a_5a5a, 0x0101_0101);
        let mut sum = 0u64;
        for i in (0..len).step_by(4) {
            let h = transform(word(memory, (src + i) / 4), xor, add);
            memory[dst + i..dst + i + 4].copy_from_slice(&h.to_le_bytes());
            sum = sum.wrapping_add(u64::from(h));
        }
        sum
    }

    #[test]
    fn compute_matches_the_definition_for_every_overlap() {
        // Lengths around the block size; the destination below, at, just above and far above
        // the source, so runs of every gap occur; both compiled variants.
        let bytes: Vec<u8> = (0..2048u32)
            .flat_map(|i| i.wrapping_mul(2_654_435_761).to_le_bytes())
            .collect();
        let (xor, add) = (0x5a5a_5a5a, 0x0101_0101);
        for words in [1usize, 15, 16, 17, 33, 100, 256] {
            let len = 4 * words;
            for src in [0usize, 4, 256, 1024] {
                for dst in [0usize, 4, 8, 60, 64, 68, 252, 256, 260, 320, 1028, 2048] {
                    let mut want = bytes.clone();
                    let want_sum = compute_by_definition(&mut want, src, dst, len);
                    for variant in 0..2 {
                        let mut got = bytes.clone();
                        let base = got.as_mut_ptr();
                        // SAFETY: both ranges lie inside `got` (at most 3072 of its 8192
                        // bytes), which nothing else touches meanwhile.
                        let sum = unsafe {
                            let (from, to) = (base.add(src).cast_const(), base.add(dst));
                            if variant == 0 {
                                compute_raw(xor, add, from, to, len)
                            } else {
                                compute_raw_any(xor, add, from, to, len)
                            }
                        };
                        assert_eq!(
                            (sum, &got),
                            (want_sum, &want),
                            "{words} words from {src} to {dst}, variant {variant}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn compute_known_answer_and_refusals() {
        let input: Vec<u8> = [0u32, 0x5a5a_5a5a, 0xffff_ffff]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let mut out = vec![0u8; 12];
        let sum = compute(0x5a5a_5a5a, 0x0101_0101, &input, &mut out).unwrap();
        let expect = [
            0x5b5b_5b5bu32,
            0x0101_0101,
            0xa5a5_a5a5u32.wrapping_add(0x0101_0101),
        ];
        let bytes: Vec<u8> = expect.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(out, bytes);
        assert_eq!(sum, expect.iter().map(|&w| u64::from(w)).sum::<u64>());
        for (input, out) in [(0usize, 0usize), (6, 6), (8, 12), (12, 8)] {
            assert_eq!(
                compute(0, 0, &vec![0u8; input], &mut vec![0u8; out]),
                Err(Error::ComputeLength { input, out })
            );
        }
    }

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
