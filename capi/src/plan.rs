//! Planning: a tensor list in, every tensor's offset in one arena out, with the figures to
//! judge the plan by (`udma_plan_get_report`). Pure: no device involved.

use std::collections::HashMap;
use std::sync::Arc;

use userdma_infer::plan::{self, Budget, Kind as TensorKind, Options, Strategy, Tensor};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi;
use crate::error::{call, lib, udma_status, Fail};
use crate::handle::{Kind, Registry};

/// A plan, made by `udma_plan_create`, destroyed by `udma_plan_destroy`.
#[derive(Debug)]
pub struct udma_plan {
    _opaque: [u8; 0],
}

struct PlanEntry {
    plan: plan::Plan,
    by_id: HashMap<u64, usize>,
}

static PLANS: Registry<Arc<PlanEntry>> = Registry::new(Kind::Plan);

/// `udma_tensor.kind`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_tensor_kind {
    /// Produced and consumed inside the model (the default).
    UDMA_TENSOR_INTERMEDIATE = 0,
    /// A graph input, written by the application.
    UDMA_TENSOR_INPUT = 1,
    /// A graph output, read by the application after the run.
    UDMA_TENSOR_OUTPUT = 2,
}

/// `udma_tensor.flags`: the tensor is pinned at `offset`.
pub const UDMA_TENSOR_FIXED: u32 = 1;

/// `udma_tensor.inplace`: whether the tensor may be written over a dying input of its op.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_tensor_inplace {
    /// The op table decides (element-wise ops such as `Relu`, `Add` may; the default).
    UDMA_INPLACE_TABLE = 0,
    /// Never over an input.
    UDMA_INPLACE_FORBID = 1,
    /// Over an input of at least its size, whatever its op.
    UDMA_INPLACE_ALLOW = 2,
}

/// The most input ids one tensor's op may name.
pub const UDMA_TENSOR_MAX_INPUTS: u32 = 4096;

/// One tensor of the list to plan. Zero (NULL) is the default for every field but `bytes` and
/// the interval. The fields from `op` on are for in-place reuse and aliasing
/// (`UDMA_PLAN_INPLACE`); a program built against an older header, whose `udma_tensor` ends
/// at `flags`, plans as before.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_tensor {
    /// `sizeof(udma_tensor)`: also the stride of the array (every element's `size` must be
    /// the first's).
    pub size: usize,
    /// Unique id within the list.
    pub id: u64,
    /// Size in bytes (more than zero).
    pub bytes: u64,
    /// With `UDMA_TENSOR_FIXED`: its offset in the arena (a multiple of the alignment).
    pub offset: u64,
    /// The step that produces it.
    pub first: u32,
    /// The last step that reads it (`first <= last`).
    pub last: u32,
    /// A `udma_tensor_kind`.
    pub kind: u32,
    /// `UDMA_TENSOR_FIXED` or 0.
    pub flags: u32,
    /// The producing op's type (`"Relu"`, `"Add"`, `"Reshape"`, ...), a NUL-terminated
    /// UTF-8 string read during `udma_plan_create` only; NULL: no op.
    pub op: *const std::ffi::c_char,
    /// The ids of the producing op's inputs, `input_count` of them (NULL when 0), read
    /// during `udma_plan_create` only.
    pub inputs: *const u64,
    /// How many ids `inputs` holds (at most `UDMA_TENSOR_MAX_INPUTS`).
    pub input_count: u32,
    /// A `udma_tensor_inplace`.
    pub inplace: u32,
}

impl Default for udma_tensor {
    fn default() -> udma_tensor {
        udma_tensor {
            size: 0,
            id: 0,
            bytes: 0,
            offset: 0,
            first: 0,
            last: 0,
            kind: 0,
            flags: 0,
            op: std::ptr::null(),
            inputs: std::ptr::null(),
            input_count: 0,
            inplace: 0,
        }
    }
}

// SAFETY: `repr(C)`, integers and two pointers (plain values, any bit pattern is a valid
// pointer value; they are only dereferenced after the checks in `tensor`),
// 8 * 4 + 4 * 4 + 8 * 2 + 4 * 2 = 72 bytes with no padding.
unsafe impl abi::Bytes for udma_tensor {}
abi::sized!(udma_tensor);

/// `udma_plan_options.strategy` (and `udma_plan_report.strategy`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_plan_strategy {
    /// Every heuristic, then the exact search; the report names the winner (the default).
    UDMA_PLAN_AUTO = 0,
    /// Conflict graph and greedy colouring.
    UDMA_PLAN_COLOUR = 1,
    /// Non-increasing size, smallest fitting gap (TFLite's arena planner).
    UDMA_PLAN_GREEDY_SIZE = 2,
    /// In production order, the lowest fitting offset.
    UDMA_PLAN_FIRST_FIT = 3,
    /// Online best fit.
    UDMA_PLAN_BEST_FIT = 4,
    /// Branch and bound from the best heuristic, to the lower bound or the budget.
    UDMA_PLAN_EXACT = 5,
}

const STRATEGIES: [Strategy; 6] = [
    Strategy::Auto,
    Strategy::Colour,
    Strategy::GreedySize,
    Strategy::FirstFit,
    Strategy::BestFit,
    Strategy::Exact,
];

/// How to plan. Zero is the default for every field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_plan_options {
    /// `sizeof(udma_plan_options)`.
    pub size: usize,
    /// Every offset and size is rounded to this (a power of two); 0: 256.
    pub align: u64,
    /// Search nodes the exact search may visit (reproducible on any machine); 0: 100000.
    pub search_nodes: u64,
    /// A `udma_plan_strategy`; 0: `UDMA_PLAN_AUTO`.
    pub strategy: u32,
    /// `UDMA_PLAN_*` flags; 0: no in-place reuse, aliasing on.
    pub flags: u32,
}

/// `udma_plan_options.flags`: let a tensor take over a dying input of its op
/// (`udma_tensor.op`, `.inputs`, `.inplace`).
pub const UDMA_PLAN_INPLACE: u32 = 1;
/// `udma_plan_options.flags`: do not let aliasing ops (`Reshape`, ...) share their input's
/// memory.
pub const UDMA_PLAN_NO_ALIAS: u32 = 2;

abi::sized!(udma_plan_options);

/// What a plan achieved (`udma_plan_get_report`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable)]
pub struct udma_plan_report {
    /// `sizeof(udma_plan_report)`.
    pub size: usize,
    /// The arena size: the end of the highest tensor.
    pub arena_bytes: u64,
    /// No arena can be smaller than this (the peak of live bytes).
    pub lower_bound_bytes: u64,
    /// Every tensor in its own range.
    pub naive_bytes: u64,
    /// The alignment of every offset.
    pub align: u64,
    /// How long planning took, in nanoseconds.
    pub elapsed_ns: u64,
    /// The step at which the lower bound's bytes are live.
    pub lower_bound_step: u32,
    /// The `udma_plan_strategy` that produced the offsets.
    pub strategy: u32,
    /// 1: proven that no smaller arena exists; 0: not proven.
    pub optimal: u32,
    /// Tensors planned.
    pub tensors: u32,
}

abi::sized!(udma_plan_report);

fn tensor(t: &udma_tensor, i: usize) -> Result<Tensor, Fail> {
    let at = |f: Fail| f.context(format!("tensors[{i}]"));
    let kind = match t.kind {
        0 => TensorKind::Intermediate,
        1 => TensorKind::Input,
        2 => TensorKind::Output,
        other => {
            return Err(at(Fail::invalid(format!(
                "kind {other} is not a udma_tensor_kind (0 to 2)"
            ))))
        }
    };
    if t.flags & !UDMA_TENSOR_FIXED != 0 {
        return Err(at(Fail::invalid(format!(
            "flags {:#x} has bits that are not UDMA_TENSOR_* flags",
            t.flags
        ))));
    }
    let mut tensor = Tensor::new(t.id, t.bytes, t.first, t.last).kind(kind);
    if t.flags & UDMA_TENSOR_FIXED != 0 {
        tensor = tensor.fixed(t.offset);
    }
    if t.input_count > UDMA_TENSOR_MAX_INPUTS {
        return Err(at(Fail::invalid(format!(
            "input_count {} is above UDMA_TENSOR_MAX_INPUTS ({UDMA_TENSOR_MAX_INPUTS})",
            t.input_count
        ))));
    }
    if t.input_count > 0 && t.inputs.is_null() {
        return Err(at(Fail::invalid(format!(
            "inputs is NULL with input_count {}: pass the op's input ids, or 0",
            t.input_count
        ))));
    }
    let inputs: &[u64] = if t.input_count == 0 {
        &[]
    } else {
        // SAFETY: non-null, `input_count` readable ids per `udma_plan_create`'s contract.
        unsafe { std::slice::from_raw_parts(t.inputs, t.input_count as usize) }
    };
    if !t.op.is_null() {
        // SAFETY: non-null, a NUL-terminated string per `udma_plan_create`'s contract.
        let op = unsafe { std::ffi::CStr::from_ptr(t.op) };
        let op = op.to_str().map_err(|_| {
            at(Fail::invalid(
                "op is not UTF-8: pass the op type as ONNX names it (\"Relu\", \"Add\")",
            ))
        })?;
        tensor = tensor.op(op, inputs.iter().copied());
    } else if !inputs.is_empty() {
        return Err(at(Fail::invalid(
            "inputs are given but op is NULL: name the op that reads them",
        )));
    }
    match t.inplace {
        0 => {}
        1 => tensor = tensor.inplace(false),
        2 => tensor = tensor.inplace(true),
        other => {
            return Err(at(Fail::invalid(format!(
                "inplace {other} is not a udma_tensor_inplace (0 to 2)"
            ))))
        }
    }
    Ok(tensor)
}

/// Plans `tensors[0..count]` (each element `tensors[0].size` bytes apart) into one arena.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a malformed list (the message names the tensor: a
/// zero size, an interval backwards, an id used twice, a fixed offset misaligned or
/// colliding), more than 1,048,576 tensors (checked before anything is allocated), or
/// options.
///
/// # Safety
/// `tensors` points to `count` elements of `tensors[0].size` readable bytes each, and each
/// element's `op` is NULL or a NUL-terminated string and its `inputs` NULL or `input_count`
/// readable ids; `options` is NULL or points to `options->size` readable bytes; `plan` to a
/// writable `udma_plan *`.
#[no_mangle]
pub unsafe extern "C" fn udma_plan_create(
    tensors: *const udma_tensor,
    count: usize,
    options: *const udma_plan_options,
    plan: *mut *mut udma_plan,
) -> udma_status {
    call("udma_plan_create", || {
        let out = abi::out(plan, "plan")?;
        if count == 0 {
            return Err(Fail::invalid("count is 0: pass at least one tensor"));
        }
        if count > userdma_infer::plan::MAX_TENSORS {
            return Err(Fail::invalid(format!(
                "count is {count}, more than a plan takes ({}): split the graph",
                userdma_infer::plan::MAX_TENSORS
            )));
        }
        // SAFETY: per this function's contract (checks NULL).
        let first = unsafe { abi::read(tensors, "tensors[0]", udma_tensor::default())? };
        let stride = first.size;
        if count
            .checked_mul(stride)
            .is_none_or(|end| end > isize::MAX as usize)
        {
            return Err(Fail::invalid(format!(
                "{count} tensors of {stride} bytes do not fit in memory: set tensors[0].size to \
                 sizeof(udma_tensor)"
            )));
        }
        let mut list = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: element `i` lies `i * stride` bytes in, readable per this function's
            // contract.
            let ptr = unsafe { tensors.cast::<u8>().add(i * stride) }.cast::<udma_tensor>();
            // SAFETY: as above; `read` reads the element's own `size` bytes at most.
            let size = unsafe { ptr.cast::<usize>().read_unaligned() };
            if size != stride {
                return Err(Fail::invalid(format!(
                    "tensors[{i}].size is {size}, tensors[0].size {stride}: set every size \
                     to sizeof(udma_tensor)"
                )));
            }
            // SAFETY: as above.
            let t = unsafe { abi::read(ptr, "tensor", udma_tensor::default())? };
            list.push(tensor(&t, i)?);
        }
        let o = if options.is_null() {
            udma_plan_options::default()
        } else {
            // SAFETY: non-null; readable per this function's contract.
            unsafe { abi::read(options, "options", udma_plan_options::default())? }
        };
        let strategy = *STRATEGIES.get(o.strategy as usize).ok_or_else(|| {
            Fail::invalid(format!(
                "strategy {} is not a udma_plan_strategy (0 to 5)",
                o.strategy
            ))
        })?;
        if o.flags & !(UDMA_PLAN_INPLACE | UDMA_PLAN_NO_ALIAS) != 0 {
            return Err(Fail::invalid(format!(
                "options flags {:#x} has bits that are not UDMA_PLAN_* flags",
                o.flags
            )));
        }
        let opts = Options {
            align: if o.align == 0 {
                plan::DEFAULT_ALIGN
            } else {
                o.align
            },
            inplace: o.flags & UDMA_PLAN_INPLACE != 0,
            alias: o.flags & UDMA_PLAN_NO_ALIAS == 0,
        };
        let budget = Budget::Nodes(if o.search_nodes == 0 {
            100_000
        } else {
            o.search_nodes
        });
        let made = plan::plan(&list, &opts, strategy, budget).map_err(lib)?;
        made.validate(&list).map_err(|e| {
            Fail::new(
                udma_status::UDMA_ERR_INTERNAL,
                format!("the planner's result failed its own check: {e}"),
            )
        })?;
        let by_id = made
            .placements
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id, i))
            .collect();
        let key = PLANS.insert(Arc::new(PlanEntry { plan: made, by_id }))?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(key.to_ptr(Kind::Plan)) };
        Ok(())
    })
}

fn entry(ptr: *const udma_plan) -> Result<Arc<PlanEntry>, Fail> {
    PLANS.with(ptr, |_, p| Ok(Arc::clone(p)))
}

/// The arena offset of tensor `id`.
///
/// Errors: `UDMA_ERR_NOT_FOUND` for an id the plan does not have.
///
/// # Safety
/// `offset` points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_plan_offset(
    plan: *const udma_plan,
    id: u64,
    offset: *mut u64,
) -> udma_status {
    call("udma_plan_offset", || {
        let out = abi::out(offset, "offset")?;
        let p = entry(plan)?;
        let &i = p.by_id.get(&id).ok_or_else(|| {
            Fail::new(
                udma_status::UDMA_ERR_NOT_FOUND,
                format!("the plan has no tensor {id}"),
            )
        })?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(p.plan.placements[i].offset) };
        Ok(())
    })
}

/// Every tensor's offset, in the order given to `udma_plan_create`, into
/// `offsets[0..count]`; `count` must be the number of tensors.
///
/// # Safety
/// `offsets` points to `count` writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_plan_offsets(
    plan: *const udma_plan,
    offsets: *mut u64,
    count: usize,
) -> udma_status {
    call("udma_plan_offsets", || {
        let out = abi::out(offsets, "offsets")?;
        let p = entry(plan)?;
        let n = p.plan.placements.len();
        if count != n {
            return Err(Fail::invalid(format!(
                "count is {count}, but the plan has {n} tensors"
            )));
        }
        for (i, placement) in p.plan.placements.iter().enumerate() {
            // SAFETY: `i < count` writable entries per this function's contract.
            unsafe { out.add(i).write(placement.offset) };
        }
        Ok(())
    })
}

/// The plan's figures: arena size, lower bound, naive size, strategy, optimality.
///
/// # Safety
/// `report` points to `report->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_plan_get_report(
    plan: *const udma_plan,
    report: *mut udma_plan_report,
) -> udma_status {
    call("udma_plan_get_report", || {
        let p = entry(plan)?;
        let r = &p.plan;
        let strategy = STRATEGIES
            .iter()
            .position(|s| *s == r.strategy)
            .unwrap_or(0) as u32;
        let value = udma_plan_report {
            size: 0,
            arena_bytes: r.arena_bytes,
            lower_bound_bytes: r.lower_bound.bytes,
            naive_bytes: r.naive_bytes,
            align: r.align,
            elapsed_ns: u64::try_from(r.elapsed.as_nanos()).unwrap_or(u64::MAX),
            lower_bound_step: r.lower_bound.step,
            strategy,
            optimal: u32::from(r.optimal),
            tensors: r.placements.len() as u32,
        };
        // SAFETY: per this function's contract.
        unsafe { abi::write(report, "report", value) }
    })
}

/// Destroys a plan.
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_plan_destroy(plan: *mut udma_plan) -> udma_status {
    call("udma_plan_destroy", || {
        drop(PLANS.remove_if(plan, |_| Ok(()))?);
        Ok(())
    })
}
