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
            step.apply(arena)
                .expect("the arena given to Model::reference is shorter than the model's");
        }
        result[..r.bytes as usize].copy_from_slice(&arena[r.offset as usize..r.end() as usize]);
    }
}

impl Step {
    /// Runs this step over `arena`, a host copy of the arena (what the device computes for
    /// it): the reference a device's results are checked against, and what the pipeline runs
    /// on the host for a device that cannot run the step
    /// ([`HostSteps`](crate::accel::HostSteps)). Allocates nothing.
    ///
    /// # Errors
    /// [`ModelError`] for a range that leaves `arena`, is empty or misaligned, or a `Layer`
    /// whose output overlaps an input, or 1 to 3 inputs not given: nothing is written then.
    pub fn apply(&self, arena: &mut [u8]) -> Result<(), ModelError> {
        let size = arena.len() as u64;
        let check = |what: &str, offset: u64, bytes: u64| {
            let what = || format!("{what} of a step run on the host");
            if bytes == 0 {
                return Err(ModelError::Empty { what: what() });
            }
            if offset % 4 != 0 || bytes % 4 != 0 {
                return Err(ModelError::Misaligned {
                    what: what(),
                    offset,
                    bytes,
                });
            }
            if offset.checked_add(bytes).is_none_or(|end| end > size) {
                return Err(ModelError::OutOfArena {
                    what: what(),
                    offset,
                    bytes,
                    arena: size,
                });
            }
            Ok(())
        };
        match *self {
            Step::Compute {
                src,
                dst,
                len,
                xor,
                add,
            } => {
                check("the input", src, len)?;
                check("the output", dst, len)?;
                for w in 0..(len / 4) as usize {
                    let s = src as usize + 4 * w;
                    let d = dst as usize + 4 * w;
                    let word = u32::from_le_bytes(arena[s..s + 4].try_into().expect("4 bytes"));
                    arena[d..d + 4].copy_from_slice(&(word ^ xor).wrapping_add(add).to_le_bytes());
                }
            }
            Step::Layer {
                inputs,
                count,
                dst,
                len,
                seed,
            } => {
                if count == 0 || count > 3 {
                    return Err(ModelError::Unrunnable {
                        why: format!("a layer with {count} inputs (give 1 to 3)"),
                    });
                }
                let inputs = &inputs[..usize::from(count)];
                check("the output", dst, len)?;
                for &(offset, bytes) in inputs {
                    check("an input", offset, bytes)?;
                    if offset < dst + len && dst < offset + bytes {
                        return Err(ModelError::Overlap {
                            step: 0,
                            offset: dst,
                            bytes: len,
                        });
                    }
                }
                let base = arena.as_mut_ptr();
                let mut raw = [(std::ptr::null::<u8>(), 0usize); 3];
                for (r, &(offset, bytes)) in raw.iter_mut().zip(inputs) {
                    // SAFETY: inside `arena` (checked above).
                    *r = (
                        unsafe { base.add(offset as usize) }.cast_const(),
                        bytes as usize,
                    );
                }
                // SAFETY: every input and the output are inside `arena`, their lengths
                // positive multiples of 4 and the output disjoint from every input (all
                // checked above); all pointers come from one borrow of `arena`, held for the
                // call, so no one else touches it.
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
                let out_len = params.output_len();
                check("the input", src, len)?;
                check("the output", dst, out_len)?;
                if src < dst + out_len && dst < src + len {
                    return Err(ModelError::Overlap {
                        step: 0,
                        offset: dst,
                        bytes: out_len,
                    });
                }
                let (src, len, dst, out_len) =
                    (src as usize, len as usize, dst as usize, out_len as usize);
                let result = if dst >= src + len {
                    let (low, high) = arena.split_at_mut(dst);
                    reference::compact(&low[src..src + len], params, &mut high[..out_len])
                } else {
                    let (low, high) = arena.split_at_mut(src);
                    reference::compact(&high[..len], params, &mut low[dst..dst + out_len])
                };
                result.map_err(|e| ModelError::Unrunnable {
                    why: format!("a filter the reference refuses ({e})"),
                })?;
            }
        }
        Ok(())
    }
}
