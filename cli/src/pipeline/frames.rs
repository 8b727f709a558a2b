//! Frames' inputs (word by word, or straight into a slot's DMA buffer a piece at a time) and
//! the host's check of their results: the model run on the host.

use userdma_infer::pipeline::{Input, Model};

/// Frame `n`'s input, word by word.
pub(super) fn fill(n: u64, input: &mut [u8]) {
    fill_from(n, 0, input);
}

/// Words `first..` of frame `n`'s input, into `out`.
fn fill_from(n: u64, first: usize, out: &mut [u8]) {
    for (j, w) in out.chunks_exact_mut(4).enumerate() {
        let v =
            (n as u32).wrapping_mul(0x0100_0193) ^ ((first + j) as u32).wrapping_mul(0x9e37_79b9);
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// Frame `n`'s input written into the slot's DMA buffer a cache-sized piece at a time: no
/// frame-sized host buffer in between.
pub(super) fn write_input(n: u64, input: &Input<'_>) -> Result<(), userdma_infer::Error> {
    let mut piece = [0u8; 4096];
    let mut at = 0;
    while at < input.len() {
        let len = piece.len().min(input.len() - at);
        fill_from(n, at / 4, &mut piece[..len]);
        input.write(at, &piece[..len])?;
        at += len;
    }
    Ok(())
}

/// The host's view of a frame: the model run on the host, in preallocated buffers.
pub(super) struct Checker {
    model: Model,
    input: Vec<u8>,
    arena: Vec<u8>,
    expected: Vec<u8>,
    pub(super) got: Vec<u8>,
}

impl Checker {
    pub(super) fn new(model: &Model) -> Checker {
        Checker {
            model: model.clone(),
            input: vec![0u8; model.input().bytes as usize],
            arena: vec![0u8; model.arena_bytes() as usize],
            expected: vec![0u8; model.result().bytes as usize],
            got: vec![0u8; model.result().bytes as usize],
        }
    }

    /// Frame `n`'s result computed on the host, into `into`.
    pub(super) fn expect(&mut self, n: u64, into: &mut [u8]) {
        fill(n, &mut self.input);
        self.model.reference(&self.input, &mut self.arena, into);
    }

    /// Whether `got` (already in `self.got`) is frame `n`'s result.
    pub(super) fn is_right(&mut self, n: u64) -> bool {
        let mut expected = std::mem::take(&mut self.expected);
        self.expect(n, &mut expected);
        let right = self.got == expected;
        self.expected = expected;
        right
    }
}
