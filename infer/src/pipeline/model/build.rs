//! Building a model: from its parts, every range checked against the arena
//! ([`Model::new`]); from a planned graph ([`Model::from_plan`], [`Model::planned`]); the
//! synthetic chain of `userdma pipeline` ([`Model::chain`]); with on-device result filtering
//! ([`Model::with_filter`], [`Filter`]).

use super::{Model, ModelError, Span, Step};
use crate::plan::{self, Kind, Plan, Tensor};
use userdma_loopback::reference::Compact;

/// On-device result filtering for [`Model::with_filter`]: the result tensor read as records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter {
    /// Bytes per record (a multiple of 4, 4 to 4096, dividing the result's size).
    pub record: u32,
    /// Byte offset of the `u32` score in a record.
    pub score_at: u32,
    /// A record survives if its score is at least this.
    pub threshold: u32,
    /// Records copied back at most.
    pub capacity: u32,
}

fn check(what: impl Fn() -> String, span: Span, arena: u64) -> Result<(), ModelError> {
    if span.bytes == 0 {
        return Err(ModelError::Empty { what: what() });
    }
    if span.offset % 4 != 0 || span.bytes % 4 != 0 {
        return Err(ModelError::Misaligned {
            what: what(),
            offset: span.offset,
            bytes: span.bytes,
        });
    }
    if span
        .offset
        .checked_add(span.bytes)
        .is_none_or(|end| end > arena)
    {
        return Err(ModelError::OutOfArena {
            what: what(),
            offset: span.offset,
            bytes: span.bytes,
            arena,
        });
    }
    Ok(())
}

/// Refuses a model of more than [`Model::MAX_STEPS`] tensors or steps.
fn check_steps(n: u64) -> Result<(), ModelError> {
    if n > Model::MAX_STEPS as u64 + 1 {
        return Err(ModelError::TooLarge {
            what: "steps",
            value: n,
            max: Model::MAX_STEPS as u64,
            hint: "a pipeline runs a frame's steps from one ring; split the model",
        });
    }
    Ok(())
}

/// Refuses a tensor of more than [`Model::MAX_TENSOR_BYTES`].
fn check_tensor_bytes(what: &'static str, bytes: u64) -> Result<(), ModelError> {
    if bytes > Model::MAX_TENSOR_BYTES {
        return Err(ModelError::TooLarge {
            what,
            value: bytes,
            max: Model::MAX_TENSOR_BYTES,
            hint: "a tensor lives in device memory; give it at most 1 TiB",
        });
    }
    Ok(())
}

impl Model {
    /// A model from its parts, every range checked against the arena.
    ///
    /// # Errors
    /// [`ModelError`] naming the range that is empty, misaligned or outside the arena.
    pub fn new(
        arena_bytes: u64,
        input: Span,
        result: Span,
        steps: Vec<Step>,
    ) -> Result<Model, ModelError> {
        check(|| "the input".into(), input, arena_bytes)?;
        check(|| "the result".into(), result, arena_bytes)?;
        for (k, step) in steps.iter().enumerate() {
            let (reads, write) = step.ranges();
            for (i, r) in reads.iter().flatten().enumerate() {
                check(|| format!("step {k}'s input {i}"), *r, arena_bytes)?;
            }
            check(|| format!("step {k}'s output"), write, arena_bytes)?;
            if let Step::Compact { len, params, .. } = *step {
                let record = u64::from(params.record);
                let fits = (4..=u64::from(Compact::MAX_RECORD)).contains(&record)
                    && record % 4 == 0
                    && len % record == 0
                    && params.score_at % 4 == 0
                    && params
                        .score_at
                        .checked_add(4)
                        .is_some_and(|end| end <= params.record);
                if !fits {
                    return Err(ModelError::Filter {
                        record: params.record,
                        score_at: params.score_at,
                        bytes: len,
                    });
                }
            }
            let in_place = matches!(step, Step::Compute { .. });
            if !in_place
                && reads.iter().flatten().any(|r| {
                    r.offset < write.offset + write.bytes && write.offset < r.offset + r.bytes
                })
            {
                return Err(ModelError::Overlap {
                    step: k,
                    offset: write.offset,
                    bytes: write.bytes,
                });
            }
        }
        Ok(Model {
            arena_bytes,
            input,
            result,
            steps,
        })
    }

    /// The model of a planned graph: the first `input` tensor is the input, the last `output`
    /// tensor the result, and every other tensor produced from an input is one compute step
    /// from its first input at the plan's offsets (aliasing ops that share their input's
    /// memory need none). Each step's mask and addend come from the tensor's id, so a wrong
    /// placement (two live tensors sharing bytes) changes the result.
    ///
    /// # Errors
    /// [`ModelError`] if the graph has no input or output tensor, a tensor is not in the plan,
    /// or a range is misaligned (plan with an alignment of at least 4).
    pub fn from_plan(tensors: &[Tensor], plan: &Plan) -> Result<Model, ModelError> {
        check_steps(tensors.len() as u64)?;
        let at = |id: u64| {
            plan.placements
                .iter()
                .find(|p| p.id == id)
                .map(|p| Span {
                    offset: p.offset,
                    bytes: p.bytes.div_ceil(4) * 4,
                })
                .ok_or(ModelError::Unplanned(id))
        };
        let input = tensors
            .iter()
            .find(|t| t.kind == Kind::Input)
            .ok_or(ModelError::Missing("input"))?;
        let output = tensors
            .iter()
            .rev()
            .find(|t| t.kind == Kind::Output)
            .ok_or(ModelError::Missing("output"))?;
        let mut order: Vec<&Tensor> = tensors.iter().collect();
        order.sort_by_key(|t| (t.first, t.id));
        let mut steps = Vec::new();
        for t in order {
            let Some(&from) = t.inputs.first() else {
                continue;
            };
            let (src, dst) = (at(from)?, at(t.id)?);
            let alias = t.op.as_deref().is_some_and(plan::inplace::is_alias);
            if alias && src.offset == dst.offset {
                continue;
            }
            // A fixed per-tensor mix, so each step's output differs from its inputs.
            let id = t.id as u32;
            let taken = plan
                .placements
                .iter()
                .find(|p| p.id == t.id)
                .and_then(|p| p.inplace_of);
            if taken.is_some() && src.offset == dst.offset {
                // In place over its dying input: an element-wise compute step.
                steps.push(Step::Compute {
                    src: src.offset,
                    dst: dst.offset,
                    len: src.bytes.min(dst.bytes),
                    xor: id.wrapping_mul(0x9e37_79b9) | 1,
                    add: id.wrapping_add(0x6d2b_79f5),
                });
                continue;
            }
            // A layer over its first three inputs.
            let mut inputs = [(0, 0); 3];
            let mut count = 0;
            for &i in t.inputs.iter().take(3) {
                let span = at(i)?;
                inputs[count] = (span.offset, span.bytes);
                count += 1;
            }
            steps.push(Step::Layer {
                inputs,
                count: count as u8,
                dst: dst.offset,
                len: dst.bytes,
                seed: id.wrapping_mul(0x85eb_ca6b) ^ 0x2545_f491,
            });
        }
        Model::new(
            plan.arena_bytes.max(4),
            at(input.id)?,
            at(output.id)?,
            steps,
        )
    }

    /// A chain of `layers` compute steps over tensors of `bytes` each (rounded up to words),
    /// planned into one arena: the input, `layers` activations, the result the last of them.
    /// The synthetic model of `userdma pipeline`.
    ///
    /// # Errors
    /// [`ModelError::TooLarge`] for more than [`Model::MAX_STEPS`] layers or tensors of more
    /// than [`Model::MAX_TENSOR_BYTES`] (checked before anything is allocated); otherwise
    /// [`ModelError`] as [`Model::from_plan`] (not for `layers >= 1`, `bytes >= 1`).
    pub fn chain(layers: u32, bytes: u64) -> Result<Model, ModelError> {
        let layers = layers.max(1);
        check_steps(u64::from(layers))?;
        check_tensor_bytes("a tensor", bytes)?;
        let bytes = bytes.div_ceil(4).max(1) * 4;
        let tensors: Vec<Tensor> = (0..=layers)
            .map(|k| {
                let mut t = Tensor::new(u64::from(k), bytes, k, k + 1);
                t.kind = if k == 0 {
                    Kind::Input
                } else if k == layers {
                    Kind::Output
                } else {
                    Kind::Intermediate
                };
                if k > 0 {
                    t.inputs = vec![u64::from(k - 1)];
                    t.op = Some("Conv".into());
                }
                t
            })
            .collect();
        Model::planned(&tensors)
    }

    /// The model of `tensors` planned into one arena by the planner's greedy-by-size
    /// strategy with the default options (256-byte alignment): [`Model::from_plan`] of that
    /// plan.
    ///
    /// # Errors
    /// [`ModelError`] as [`Model::from_plan`], and if the planner refuses the graph.
    pub fn planned(tensors: &[Tensor]) -> Result<Model, ModelError> {
        check_steps(tensors.len() as u64)?;
        let plan = plan::plan(
            tensors,
            &plan::Options::default(),
            plan::Strategy::GreedySize,
            plan::Budget::Nodes(0),
        )
        .map_err(ModelError::Plan)?;
        Model::from_plan(tensors, &plan)
    }

    /// The model with on-device result filtering: a compact step over the result tensor
    /// into a new range after the arena, which becomes the result (only the count header and
    /// at most `filter.capacity` records come back).
    ///
    /// # Errors
    /// [`ModelError::Filter`] if the records do not fit the result tensor.
    pub fn with_filter(mut self, filter: Filter) -> Result<Model, ModelError> {
        let bytes = self.result.bytes;
        let record = u64::from(filter.record);
        let fits = (4..=u64::from(Compact::MAX_RECORD)).contains(&record)
            && record % 4 == 0
            && bytes % record == 0
            && filter.score_at % 4 == 0
            && filter
                .score_at
                .checked_add(4)
                .is_some_and(|end| end <= filter.record);
        if !fits {
            return Err(ModelError::Filter {
                record: filter.record,
                score_at: filter.score_at,
                bytes,
            });
        }
        // More records than the result holds can never pass: refused, before the output
        // (and everything sized by it) is made that large.
        let records = bytes / record;
        if u64::from(filter.capacity) > records {
            return Err(ModelError::TooLarge {
                what: "the filter's capacity (records kept)",
                value: u64::from(filter.capacity),
                max: records,
                hint: "keep at most as many records as the result tensor holds",
            });
        }
        let params = Compact {
            record: filter.record,
            score_at: filter.score_at,
            threshold: filter.threshold,
            capacity: filter.capacity,
        };
        let dst = self.arena_bytes.div_ceil(256) * 256;
        self.steps.push(Step::Compact {
            src: self.result.offset,
            len: bytes,
            dst,
            params,
        });
        let result = Span {
            offset: dst,
            bytes: params.output_len(),
        };
        Model::new(dst + result.bytes, self.input, result, self.steps)
    }
}
