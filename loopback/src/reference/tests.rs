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
    // Under Miri (scripts/miri.sh), the short lengths and outputs only: every kind of wrap
    // still occurs (shorter, equal, longer, co-prime and not), at a hundredth of the work.
    let (lens, outs): (&[usize], &[usize]) = if cfg!(miri) {
        (&[1, 3, 7, 16], &[1, 5, 16])
    } else {
        (&[1, 3, 7, 16, 64, 100, 255, 1024], &[1, 5, 64, 333, 1000])
    };
    for (case, &out_words) in outs.iter().enumerate() {
        for &a in lens {
            for &b in lens {
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
    // (Under Miri, scripts/miri.sh, the lengths up to 33 words: every gap still occurs.)
    let lengths: &[usize] = if cfg!(miri) {
        &[1, 15, 16, 17, 33]
    } else {
        &[1, 15, 16, 17, 33, 100, 256]
    };
    for &words in lengths {
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
