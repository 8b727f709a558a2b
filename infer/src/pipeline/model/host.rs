//! The model run on the host ([`Model::reference`], [`Model::expected`],
//! [`Model::expected_into`]): every step over a host copy of the arena, the result the device
//! must produce for the same input.

use super::{Model, ModelError, Step};
use userdma_loopback::reference;

impl Model {
    /// The result the device must produce for `input`: [`Model::reference`] over a fresh,
    /// zeroed arena, into a new buffer (allocates both; for setting up checks).
    ///
    /// # Panics
    /// If `input` is shorter than the model's input.
    pub fn expected(&self, input: &[u8]) -> Vec<u8> {
        let mut arena = vec![0u8; self.arena_bytes() as usize];
        let mut result = vec![0u8; self.result().bytes as usize];
        self.reference(input, &mut arena, &mut result);
        result
    }

    /// [`Model::reference`] into `result` over a fresh, zeroed host arena, with every failure
    /// an error: `input` or `result` shorter than the model's tensors, or no host memory for
    /// the arena (a fallible allocation, never an abort). What the C API's
    /// `udma_model_expected` runs.
    ///
    /// # Errors
    /// [`ModelError::Short`], [`ModelError::NoHostMemory`].
    pub fn expected_into(&self, input: &[u8], result: &mut [u8]) -> Result<(), ModelError> {
        for (what, len, need) in [
            ("the input", input.len(), self.input.bytes),
            ("the result buffer", result.len(), self.result.bytes),
        ] {
            if (len as u64) < need {
                return Err(ModelError::Short { what, len, need });
            }
        }
        let bytes = self.arena_bytes;
        let no_memory = || ModelError::NoHostMemory {
            what: "the host copy of the arena",
            bytes,
        };
        let len = usize::try_from(bytes).map_err(|_| no_memory())?;
        let mut arena = Vec::new();
        arena.try_reserve_exact(len).map_err(|_| no_memory())?;
        arena.resize(len, 0);
        self.reference(input, &mut arena, result);
        Ok(())
    }

    /// Runs the model on the host: `input` into a host copy of the arena (`arena`, at least
    /// [`Model::arena_bytes`] long, its previous contents standing in for whatever the
    /// device arena held), every step, and the result range copied into `result`. What the
    /// device must produce for the same input; allocates nothing.
    ///
    /// # Panics
    /// If `arena` is shorter than the arena or `input`/`result` shorter than their ranges.
    pub fn reference(&self, input: &[u8], arena: &mut [u8], result: &mut [u8]) {
        let (i, r) = (self.input, self.result);
        arena[i.offset as usize..i.end() as usize].copy_from_slice(&input[..i.bytes as usize]);
        for step in &self.steps {
            match *step {
                Step::Compute {
                    src,
                    dst,
                    len,
                    xor,
                    add,
                } => {
                    for w in 0..(len / 4) as usize {
                        let s = src as usize + 4 * w;
                        let d = dst as usize + 4 * w;
                        let word = u32::from_le_bytes(arena[s..s + 4].try_into().expect("4 bytes"));
                        arena[d..d + 4]
                            .copy_from_slice(&(word ^ xor).wrapping_add(add).to_le_bytes());
                    }
                }
                Step::Layer {
                    inputs,
                    count,
                    dst,
                    len,
                    seed,
                } => {
                    let inputs = &inputs[..usize::from(count)];
                    let inside = |offset: u64, bytes: u64| {
                        offset
                            .checked_add(bytes)
                            .is_some_and(|end| end <= arena.len() as u64)
                    };
                    assert!(
                        inside(dst, len) && inputs.iter().all(|&(o, b)| inside(o, b)),
                        "the arena given to Model::reference is shorter than the model's"
                    );
                    let base = arena.as_mut_ptr();
                    let mut raw = [(std::ptr::null::<u8>(), 0usize); 3];
                    for (r, &(offset, bytes)) in raw.iter_mut().zip(inputs) {
                        // SAFETY: inside `arena` (asserted above).
                        *r = (
                            unsafe { base.add(offset as usize) }.cast_const(),
                            bytes as usize,
                        );
                    }
                    // SAFETY: every input and the output are inside `arena` (asserted above),
                    // their lengths positive multiples of 4 and the output disjoint from every
                    // input (`Model::new` checks both); all pointers come from one borrow of
                    // `arena`, held for the call, so no one else touches it.
                    unsafe {
                        reference::layer_raw(
                            seed,
                            &raw[..inputs.len()],
                            base.add(dst as usize),
                            len as usize,
                        )
                    };
                }
                Step::Compact {
                    src,
                    len,
                    dst,
                    params,
                } => {
                    // The two ranges do not overlap (`Model::new` checks it).
                    let out_len = params.output_len() as usize;
                    let (src, len, dst) = (src as usize, len as usize, dst as usize);
                    let result = if dst >= src + len {
                        let (low, high) = arena.split_at_mut(dst);
                        reference::compact(&low[src..src + len], params, &mut high[..out_len])
                    } else {
                        let (low, high) = arena.split_at_mut(src);
                        reference::compact(&high[..len], params, &mut low[dst..dst + out_len])
                    };
                    // The parameters were checked when the model was built.
                    debug_assert!(result.is_ok());
                }
            }
        }
        result[..r.bytes as usize].copy_from_slice(&arena[r.offset as usize..r.end() as usize]);
    }
}
