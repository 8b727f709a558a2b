//! Frames for the pipeline and stream tests: an input that differs per stream, frame and
//! position, and the result the device must produce for it (the model run on the host).

#![allow(dead_code)]

use userdma_infer::pipeline::Model;

/// Stream `s`'s frame `n`: words that differ per stream, frame and position.
pub(crate) fn fill(s: usize, n: u64, input: &mut [u8]) {
    for (j, w) in input.chunks_exact_mut(4).enumerate() {
        let v = ((n as u32) ^ ((s as u32) << 24)).wrapping_mul(0x0100_0193)
            ^ (j as u32).wrapping_mul(0x9e37_79b9);
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// The result the device must produce for stream `s`'s frame `n`.
pub(crate) fn expected(model: &Model, s: usize, n: u64) -> Vec<u8> {
    let mut input = vec![0u8; model.input().bytes as usize];
    fill(s, n, &mut input);
    let mut arena = vec![0u8; model.arena_bytes() as usize];
    let mut result = vec![0u8; model.result().bytes as usize];
    model.reference(&input, &mut arena, &mut result);
    result
}
