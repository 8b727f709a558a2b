//! A model as the pipeline runs it: where its input and its result live in one planned arena,
//! and the device work between them, step by step at the planner's offsets.

use std::fmt;

use crate::plan::{self, Kind, Plan, Tensor};
use userdma_loopback::reference::{self, Compact};
use userdma_loopback::{Cost, Work};

/// A range of the model's arena: an offset and a length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Its first byte, from the start of the arena.
    pub offset: u64,
    /// Its length.
    pub bytes: u64,
}

impl Span {
    fn end(&self) -> u64 {
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
    fn ranges(&self) -> ([Option<Span>; 3], Span) {
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
    fn compute_bytes(&self) -> u64 {
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

/// Why a model cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A range leaves the arena.
    #[error("{what} [{offset}, {offset}+{bytes}) leaves the {arena}-byte arena: plan the model again or fix the step")]
    OutOfArena {
        /// Which range.
        what: String,
        /// Its offset.
        offset: u64,
        /// Its length.
        bytes: u64,
        /// The arena's size.
        arena: u64,
    },
    /// An offset or length is not a multiple of 4 (the device computes in 32-bit words).
    #[error("{what}: offset {offset} or length {bytes} is not a multiple of 4; plan with an alignment of at least 4 and give tensors whole words")]
    Misaligned {
        /// Which range.
        what: String,
        /// Its offset.
        offset: u64,
        /// Its length.
        bytes: u64,
    },
    /// A range is empty.
    #[error("{what} is empty: the input, the result and every step need at least one word")]
    Empty {
        /// Which range.
        what: String,
    },
    /// The graph has no tensor of a kind the pipeline needs.
    #[error(
        "the graph has no {0} tensor: mark one tensor as kind \"input\" and one as \"output\""
    )]
    Missing(&'static str),
    /// A tensor of the graph is not in the plan.
    #[error("tensor {0} is not in the plan: plan the same tensors the model is built from")]
    Unplanned(u64),
    /// A step's output overlaps one of its inputs (only an element-wise compute step may work
    /// in place).
    #[error("step {step} writes [{offset}, {offset}+{bytes}) over one of its inputs: plan the model again (the planner reuses an input's memory only for element-wise ops)")]
    Overlap {
        /// The step.
        step: usize,
        /// Its output's offset.
        offset: u64,
        /// Its output's length.
        bytes: u64,
    },
    /// A size past what a model may have (checked before anything is allocated for it).
    #[error("{what} of {value} is more than a model may have ({max}): {hint}")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The largest allowed.
        max: u64,
        /// What to do.
        hint: &'static str,
    },
    /// The host has no room for a buffer the model needs (its arena's host copy).
    #[error("no host memory for {what} of {bytes} bytes: the model is too large for this host")]
    NoHostMemory {
        /// What it was for.
        what: &'static str,
        /// Its size.
        bytes: u64,
    },
    /// A buffer given is shorter than the model's tensor it stands for.
    #[error("{what} is {len} bytes, shorter than the model's {need}-byte tensor")]
    Short {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The tensor's length.
        need: u64,
    },
    /// The planner refused the model's tensors.
    #[error("the model's tensors cannot be planned: {0}")]
    Plan(plan::Error),
    /// A filter's parameters do not fit the result tensor.
    #[error("the filter's records ({record} B, score at byte {score_at}) do not fit the {bytes}-byte result: use a record size of 4 to 4096 B, a multiple of 4 dividing the result, with the score inside it")]
    Filter {
        /// Record size.
        record: u32,
        /// Score offset.
        score_at: u32,
        /// The result's size.
        bytes: u64,
    },
}

impl ModelError {
    /// The kind of failure, as a stable [`Code`](userdma::Code); the planner's refusal gives its
    /// own. Exhaustive: a new variant must be given its code here.
    pub fn code(&self) -> userdma::Code {
        use userdma::Code;
        match self {
            ModelError::OutOfArena { .. }
            | ModelError::Misaligned { .. }
            | ModelError::Empty { .. }
            | ModelError::Missing(_)
            | ModelError::Unplanned(_)
            | ModelError::Overlap { .. }
            | ModelError::TooLarge { .. }
            | ModelError::Short { .. }
            | ModelError::Filter { .. } => Code::InvalidArgument,
            ModelError::NoHostMemory { .. } => Code::Exhausted,
            ModelError::Plan(e) => crate::error::plan_code(e),
        }
    }
}

/// A model the pipeline can run: an arena size, the input tensor (written by H2D), the result
/// tensor (read back by D2H) and the device steps between.
#[derive(Clone, PartialEq, Eq)]
pub struct Model {
    arena_bytes: u64,
    input: Span,
    result: Span,
    steps: Vec<Step>,
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("arena_bytes", &self.arena_bytes)
            .field("input", &self.input)
            .field("result", &self.result)
            .field("steps", &self.steps.len())
            .finish()
    }
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
    /// The most steps (layers) a model has: a frame's descriptors (its steps, the two copies
    /// and the waits between queues, for every slot of a pipeline) must fit one ring of at
    /// most [`ring::MAX_DEPTH`](userdma::ring::MAX_DEPTH) entries, so no pipeline could run more.
    pub const MAX_STEPS: usize = 4096;
    /// The largest tensor a model has, in bytes (1 TiB): tensors live in device memory.
    pub const MAX_TENSOR_BYTES: u64 = 1 << 40;

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

    /// The arena's size in bytes.
    pub fn arena_bytes(&self) -> u64 {
        self.arena_bytes
    }

    /// Where the input goes.
    pub fn input(&self) -> Span {
        self.input
    }

    /// Where the result is read from.
    pub fn result(&self) -> Span {
        self.result
    }

    /// The device steps, in order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Bytes the device computes over per frame (as its cost model charges them).
    pub fn compute_bytes(&self) -> u64 {
        self.steps.iter().map(Step::compute_bytes).sum()
    }

    /// The most one frame of this model can keep a loopback device with cost model `cost`
    /// busy, in ns: its H2D copy, each step with none of its working set resident in SRAM
    /// (every compute byte at the DRAM rate), its D2H copy, two cross-queue `Wait`s (a split
    /// pipeline's) and a context switch on each of the two units, all one after the other.
    /// What a scheduler's stated wait bounds take as a frame's service time
    /// ([`Scheduler::wait_bound`](crate::sched::Scheduler::wait_bound), with the switch cost
    /// already in it), so a bound computed from it holds whatever the SRAM held.
    pub fn worst_frame_ns(&self, cost: &Cost) -> u64 {
        let copy = |bytes| Work {
            dma_bytes: bytes,
            ..Work::default()
        };
        let step = |bytes| Work {
            compute_bytes: bytes,
            missed_bytes: bytes,
            ..Work::default()
        };
        let wait = Work {
            fence: true,
            ..Work::default()
        };
        let works = [copy(self.input.bytes), copy(self.result.bytes), wait, wait]
            .into_iter()
            .chain(self.steps.iter().map(|s| step(s.compute_bytes())));
        let ns = |w: Work| u64::try_from(cost.charge_work(w).as_nanos()).unwrap_or(u64::MAX);
        works.map(ns).fold(
            cost.context_switch_ns.saturating_mul(2),
            u64::saturating_add,
        )
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
