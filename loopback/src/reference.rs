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
pub unsafe fn layer_raw(
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
        let h = mix(seed, crate::u64_of(first + t), &w);
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
    if crate::u64_of(out.len()) != expected {
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
mod tests;
