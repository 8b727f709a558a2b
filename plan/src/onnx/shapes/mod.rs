//! Static shape inference for the ONNX operators of common vision models.
//!
//! [`infer`] takes one node and the known types of its inputs and returns the types of its
//! outputs. Shapes are fully static here (the reader pins or rejects symbolic dimensions first).
//! Small integer tensors also carry their values ([`Info::value`]), so that shape computations
//! (`Shape` → `Gather` → `Concat` → `Reshape`, `ConstantOfShape`, opset-13 axes inputs) fold.
//!
//! Every rule follows the operator's definition in ONNX's `Operators.md`; arithmetic on
//! dimensions is checked, so a hostile file gets an error, never an overflow. This module holds
//! the types, the element-wise and broadcasting rules and the dispatch; `window` has convolution
//! and pooling, `math` linear algebra and reductions, `layout` the operators that reshape, split,
//! join, slice, pad or resize, and `values` the shape computations that fold to constants.

use super::proto::{Node, TensorProto};

mod layout;
mod math;
mod values;
mod window;

/// `TensorProto.DataType` codes used by the rules below.
pub(crate) mod dtype {
    /// FLOAT (f32).
    pub(crate) const FLOAT: i32 = 1;
    /// INT32.
    pub(crate) const INT32: i32 = 6;
    /// INT64.
    pub(crate) const INT64: i32 = 7;
    /// BOOL.
    pub(crate) const BOOL: i32 = 9;
    /// DOUBLE (f64).
    pub(crate) const DOUBLE: i32 = 11;
}

/// The number of bits one element of `data_type` takes, or `None` for STRING, UNDEFINED and
/// codes this reader does not know.
pub(crate) fn dtype_bits(data_type: i32) -> Option<u64> {
    Some(match data_type {
        // UINT8, INT8, BOOL, FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ, FLOAT8E8M0
        2 | 3 | 9 | 17..=20 | 24 => 8,
        // UINT16, INT16, FLOAT16, BFLOAT16
        4 | 5 | 10 | 16 => 16,
        // FLOAT, INT32, UINT32
        1 | 6 | 12 => 32,
        // INT64, DOUBLE, UINT64, COMPLEX64
        7 | 11 | 13 | 14 => 64,
        // COMPLEX128
        15 => 128,
        // UINT4, INT4, FLOAT4E2M1
        21..=23 => 4,
        _ => return None,
    })
}

/// A value's type: element type, static shape and, for small integer tensors, the values.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Info {
    /// The element type (`TensorProto.DataType`).
    pub(crate) dtype: i32,
    /// The shape, outermost dimension first; empty for a scalar.
    pub(crate) shape: Vec<u64>,
    /// The values, row-major, when known (integer constants and shape computations).
    pub(crate) value: Option<Vec<i64>>,
    /// The values of a small floating-point constant (`Resize`'s and `Upsample`'s scales).
    pub(crate) floats: Option<Vec<f64>>,
}

impl Info {
    fn new(dtype: i32, shape: Vec<u64>) -> Self {
        Info {
            dtype,
            shape,
            value: None,
            floats: None,
        }
    }

    /// The number of elements, or `None` on overflow.
    pub(crate) fn elements(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
    }

    /// The type and (for integer tensors of up to [`MAX_VALUES`] elements) values of a
    /// constant tensor; `None` if a dimension is negative.
    pub(crate) fn of_tensor(t: &TensorProto) -> Option<Self> {
        let shape = t
            .dims
            .iter()
            .map(|&d| u64::try_from(d).ok())
            .collect::<Option<Vec<u64>>>()?;
        let mut info = Info::new(t.data_type, shape);
        let n = info.elements()?;
        info.value = tensor_values(t, n);
        info.floats = tensor_floats(t, n);
        Some(info)
    }
}

/// Integer constants with more elements than this are not kept as values (shape computations are
/// small; weights are not needed).
pub(crate) const MAX_VALUES: usize = 4096;

/// The values of an integer constant tensor with `n` elements, if stored consistently.
fn tensor_values(t: &TensorProto, n: u64) -> Option<Vec<i64>> {
    let n = usize::try_from(n).ok().filter(|&n| n <= MAX_VALUES)?;
    let width = match t.data_type {
        dtype::INT64 => 8,
        dtype::INT32 => 4,
        _ => return None,
    };
    let values: Vec<i64> = if !t.raw_data.is_empty() {
        if t.raw_data.len() != n.checked_mul(width)? {
            return None;
        }
        t.raw_data
            .chunks_exact(width)
            .map(|c| match *c {
                [a, b, c, d, e, f, g, h] => i64::from_le_bytes([a, b, c, d, e, f, g, h]),
                [a, b, c, d] => i64::from(i32::from_le_bytes([a, b, c, d])),
                _ => 0,
            })
            .collect()
    } else if t.data_type == dtype::INT64 {
        t.int64_data.clone()
    } else {
        t.int32_data.iter().map(|&v| i64::from(v)).collect()
    };
    (values.len() == n).then_some(values)
}

/// The values of a FLOAT or DOUBLE constant tensor with `n` elements, if stored consistently.
fn tensor_floats(t: &TensorProto, n: u64) -> Option<Vec<f64>> {
    let n = usize::try_from(n).ok().filter(|&n| n <= MAX_VALUES)?;
    let values: Vec<f64> = match (t.data_type, t.raw_data.is_empty()) {
        (dtype::FLOAT, true) => t.float_data.iter().map(|&v| f64::from(v)).collect(),
        (dtype::DOUBLE, true) => t.double_data.clone(),
        (dtype::FLOAT, false) if t.raw_data.len() == n.checked_mul(4)? => t
            .raw_data
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        (dtype::DOUBLE, false) if t.raw_data.len() == n.checked_mul(8)? => t
            .raw_data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        _ => return None,
    };
    (values.len() == n).then_some(values)
}

/// Why a node's output types could not be inferred.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShapeError {
    /// The reader has no shape rule for this operator.
    #[error("no shape rule for this operator")]
    Unsupported,
    /// A required input is missing (absent or an empty name).
    #[error("input {index} is required but missing")]
    MissingInput {
        /// The input's position.
        index: usize,
    },
    /// An input has a rank the operator does not accept.
    #[error("input {index} has rank {rank}, expected {expected}")]
    Rank {
        /// The input's position.
        index: usize,
        /// Its rank.
        rank: usize,
        /// What the operator accepts.
        expected: &'static str,
    },
    /// Two shapes do not broadcast (numpy rules).
    #[error("shapes {a:?} and {b:?} do not broadcast")]
    Broadcast {
        /// One shape.
        a: Vec<u64>,
        /// The other shape.
        b: Vec<u64>,
    },
    /// Dimensions that must agree do not.
    #[error("{what}: {left} != {right}")]
    Mismatch {
        /// Which dimensions.
        what: &'static str,
        /// One side.
        left: u64,
        /// The other side.
        right: u64,
    },
    /// An axis is outside the tensor's rank.
    #[error("axis {axis} is out of range for rank {rank}")]
    Axis {
        /// The axis as given.
        axis: i64,
        /// The rank it applies to.
        rank: usize,
    },
    /// An attribute is missing or has an invalid value.
    #[error("attribute `{name}` {problem}")]
    Attribute {
        /// The attribute.
        name: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// An input whose values the shape depends on is not a constant.
    #[error("input {index} must be a constant (an initializer or a Constant) to infer the shape")]
    NotConstant {
        /// The input's position.
        index: usize,
    },
    /// `Reshape`'s target does not fit the input.
    #[error("cannot reshape {from:?} to {to:?}")]
    Reshape {
        /// The input shape.
        from: Vec<u64>,
        /// The requested shape.
        to: Vec<i64>,
    },
    /// A window (kernel) is larger than its padded input, or a stride is zero.
    #[error(
        "window of {window} (dilated) does not fit the padded input of {input}, or a stride is 0"
    )]
    Window {
        /// The dilated kernel extent.
        window: u64,
        /// The padded input extent.
        input: u64,
    },
    /// The node lists more outputs than the operator makes.
    #[error("the node has {listed} outputs, the operator makes {made}")]
    Outputs {
        /// Outputs the node lists.
        listed: usize,
        /// Outputs the operator makes for these inputs and attributes.
        made: usize,
    },
    /// A dimension computation overflows 64 bits.
    #[error("a dimension overflows 64 bits")]
    Overflow,
}

type Result<T> = std::result::Result<T, ShapeError>;

fn ck(v: Option<u64>) -> Result<u64> {
    v.ok_or(ShapeError::Overflow)
}

/// One node being inferred: what every rule reads.
struct Ctx<'a, 'b> {
    node: &'a Node,
    opset: i64,
    at: Attrs<'a>,
    ins: Inputs<'a, 'b>,
    /// The number of input positions (omitted optional inputs included).
    n_inputs: usize,
    /// The number of output positions (omitted optional outputs included).
    outputs: usize,
}

/// Attribute access on a node.
/// The error for a required attribute `name` the node does not have.
fn missing(name: &'static str) -> ShapeError {
    ShapeError::Attribute {
        name,
        problem: "is missing",
    }
}

struct Attrs<'a>(&'a Node);

impl Attrs<'_> {
    fn int(&self, name: &str) -> Option<i64> {
        self.0
            .attribute
            .iter()
            .find(|a| a.name == name)
            .map(|a| a.i)
    }
    fn int_or(&self, name: &str, default: i64) -> i64 {
        self.int(name).unwrap_or(default)
    }
    fn ints(&self, name: &str) -> Option<&[i64]> {
        self.0
            .attribute
            .iter()
            .find(|a| a.name == name)
            .map(|a| a.ints.as_slice())
    }
    fn string(&self, name: &str) -> Option<&[u8]> {
        self.0
            .attribute
            .iter()
            .find(|a| a.name == name)
            .map(|a| a.s.as_slice())
    }
    fn tensor(&self, name: &str) -> Option<&TensorProto> {
        self.0
            .attribute
            .iter()
            .find(|a| a.name == name)
            .and_then(|a| a.t.as_ref())
    }
    fn floats(&self, name: &str) -> Option<&[f32]> {
        self.0
            .attribute
            .iter()
            .find(|a| a.name == name)
            .map(|a| a.floats.as_slice())
    }
    fn has(&self, name: &str) -> bool {
        self.0.attribute.iter().any(|a| a.name == name)
    }
}

/// The node's inputs by position, `None` where absent.
struct Inputs<'a, 'b>(&'b [Option<&'a Info>]);

impl<'a> Inputs<'a, '_> {
    fn get(&self, index: usize) -> Result<&'a Info> {
        self.opt(index).ok_or(ShapeError::MissingInput { index })
    }
    fn opt(&self, index: usize) -> Option<&'a Info> {
        self.0.get(index).copied().flatten()
    }
    fn value(&self, index: usize) -> Result<&'a [i64]> {
        self.get(index)?
            .value
            .as_deref()
            .ok_or(ShapeError::NotConstant { index })
    }
    /// Values of an optional constant input; `Ok(None)` when absent.
    fn opt_value(&self, index: usize) -> Result<Option<&'a [i64]>> {
        match self.opt(index) {
            None => Ok(None),
            Some(_) => self.value(index).map(Some),
        }
    }
    /// Values of an optional floating-point constant input; `Ok(None)` when absent or empty.
    fn opt_floats(&self, index: usize) -> Result<Option<&'a [f64]>> {
        match self.opt(index) {
            None => Ok(None),
            Some(i) if i.elements() == Some(0) => Ok(None),
            Some(i) => i
                .floats
                .as_deref()
                .map(Some)
                .ok_or(ShapeError::NotConstant { index }),
        }
    }
}

/// Normalises `axis` (negative counts from the end) against `rank`.
fn axis(axis: i64, rank: usize) -> Result<usize> {
    let r = i64::try_from(rank).map_err(|_| ShapeError::Overflow)?;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        usize::try_from(a).map_err(|_| ShapeError::Overflow)
    } else {
        Err(ShapeError::Axis { axis, rank })
    }
}

fn dim(v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| ShapeError::Attribute {
        name: "shape",
        problem: "has a negative dimension",
    })
}

/// Numpy broadcasting of two shapes.
pub(crate) fn broadcast(a: &[u64], b: &[u64]) -> Result<Vec<u64>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let x = (i + a.len()).checked_sub(n).map_or(1, |j| a[j]);
        let y = (i + b.len()).checked_sub(n).map_or(1, |j| b[j]);
        *o = match (x, y) {
            _ if x == y => x,
            (1, _) => y,
            (_, 1) => x,
            _ => {
                return Err(ShapeError::Broadcast {
                    a: a.to_vec(),
                    b: b.to_vec(),
                })
            }
        };
    }
    Ok(out)
}

fn rank_at_least(info: &Info, index: usize, min: usize, expected: &'static str) -> Result<()> {
    if info.shape.len() < min {
        return Err(ShapeError::Rank {
            index,
            rank: info.shape.len(),
            expected,
        });
    }
    Ok(())
}

/// Infers the output types of `node` (default domain, operator-set version `opset`) from its
/// inputs' types, one entry per output position (omitted optional outputs included).
pub(crate) fn infer(node: &Node, opset: i64, inputs: &[Option<&Info>]) -> Result<Vec<Info>> {
    let c = Ctx {
        node,
        opset,
        at: Attrs(node),
        ins: Inputs(inputs),
        n_inputs: inputs.len(),
        outputs: node.output.len(),
    };
    let (at, ins, outputs) = (&c.at, &c.ins, c.outputs);
    let same = |x: &Info| Info::new(x.dtype, x.shape.clone());
    let out = match node.op_type.as_str() {
        // ---- element-wise, one input ----
        "Relu"
        | "LeakyRelu"
        | "Sigmoid"
        | "Tanh"
        | "Clip"
        | "Elu"
        | "Selu"
        | "Celu"
        | "HardSigmoid"
        | "HardSwish"
        | "Softplus"
        | "Softsign"
        | "Abs"
        | "Neg"
        | "Exp"
        | "Log"
        | "Sqrt"
        | "Reciprocal"
        | "Erf"
        | "Floor"
        | "Ceil"
        | "Round"
        | "Sign"
        | "Sin"
        | "Cos"
        | "Not"
        | "Softmax"
        | "LogSoftmax"
        | "Hardmax"
        | "LRN"
        | "InstanceNormalization"
        | "MeanVarianceNormalization"
        | "Gelu"
        | "Mish"
        | "ThresholdedRelu"
        | "Shrink" => {
            vec![same(ins.get(0)?)]
        }
        "Identity" => vec![ins.get(0)?.clone()],
        "Dropout" => {
            let x = ins.get(0)?;
            // The mask is BOOL from opset 10 on, the input's type before.
            let mask = if opset < 10 { x.dtype } else { dtype::BOOL };
            vec![same(x), Info::new(mask, x.shape.clone())]
        }
        "BatchNormalization" => {
            let x = ins.get(0)?;
            rank_at_least(x, 0, 2, "at least 2 ([N, C, ...])")?;
            let mut v = vec![same(x)];
            // Training-mode outputs (running and saved mean and variance): one value per channel.
            let stats = Info::new(ins.opt(1).map_or(x.dtype, |s| s.dtype), vec![x.shape[1]]);
            v.resize(outputs.max(1), stats);
            v
        }
        "LayerNormalization" => {
            let x = ins.get(0)?;
            let a = axis(at.int_or("axis", -1), x.shape.len())?;
            let mut reduced = x.shape.clone();
            reduced[a..].iter_mut().for_each(|d| *d = 1);
            let stash = i32::try_from(at.int_or("stash_type", 1)).unwrap_or(dtype::FLOAT);
            vec![
                same(x),
                Info::new(stash, reduced.clone()),
                Info::new(stash, reduced),
            ]
        }
        "Cast" => {
            let x = ins.get(0)?;
            let to = at
                .int("to")
                .and_then(|t| i32::try_from(t).ok())
                .ok_or_else(|| missing("to"))?;
            let mut o = Info::new(to, x.shape.clone());
            if matches!(to, dtype::INT64 | dtype::INT32) {
                o.value.clone_from(&x.value);
            }
            vec![o]
        }

        // ---- element-wise with numpy broadcasting ----
        "Add" | "Sub" | "Mul" | "Div" => {
            let mut o = broadcast_all(ins, c.n_inputs, None)?;
            o.value = fold_arithmetic(&node.op_type, ins, &o);
            vec![o]
        }
        "Pow" | "Max" | "Min" | "Sum" | "Mean" | "Mod" | "PRelu" | "BitShift" => {
            vec![broadcast_all(ins, c.n_inputs, None)?]
        }
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" => {
            vec![broadcast_all(ins, c.n_inputs, Some(dtype::BOOL))?]
        }
        "Where" => {
            let s = broadcast(&ins.get(0)?.shape, &ins.get(1)?.shape)?;
            let s = broadcast(&s, &ins.get(2)?.shape)?;
            vec![Info::new(ins.get(1)?.dtype, s)]
        }

        // ---- convolution and pooling ----
        "Conv" => window::conv(&c)?,
        "ConvTranspose" => window::conv_transpose(&c)?,
        "MaxPool" | "AveragePool" | "LpPool" => window::pool(&c)?,
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => window::global_pool(&c)?,
        // ---- linear algebra ----
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1"
        | "ReduceL2" | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare" => math::reduce(&c)?,
        "ArgMax" | "ArgMin" => math::arg(&c)?,
        "TopK" => math::top_k(&c)?,
        "Gemm" => math::gemm(&c)?,
        "MatMul" => math::mat_mul(&c)?,
        // ---- shape manipulation ----
        "Flatten" => layout::flatten(&c)?,
        "Reshape" => layout::reshape_op(&c)?,
        "Transpose" => layout::transpose(&c)?,
        "Concat" => layout::concat(&c)?,
        "Split" => layout::split(&c)?,
        "Squeeze" => layout::squeeze(&c)?,
        "Unsqueeze" => layout::unsqueeze(&c)?,
        // ---- shape computations (values known statically) ----
        "Shape" => values::shape(&c)?,
        "Size" => values::size(&c)?,
        "Gather" => values::gather(&c)?,
        "ConstantOfShape" => values::constant_of_shape(&c)?,
        "Slice" => layout::slice(&c)?,
        "Pad" => layout::pad(&c)?,
        "Expand" => layout::expand(&c)?,
        "Tile" => layout::tile(&c)?,
        "Resize" | "Upsample" => layout::resize(&c)?,
        "Range" => values::range(&c)?,
        "Constant" => vec![values::constant(node)?],
        _ => return Err(ShapeError::Unsupported),
    };
    Ok(out)
}

/// Broadcasts every present input; the element type is `dtype` or input 0's.
fn broadcast_all(ins: &Inputs<'_, '_>, n: usize, dtype: Option<i32>) -> Result<Info> {
    let first = ins.get(0)?;
    let mut shape = first.shape.clone();
    for i in 1..n {
        shape = broadcast(&shape, &ins.get(i)?.shape)?;
    }
    Ok(Info::new(dtype.unwrap_or(first.dtype), shape))
}

/// Integer `Add`/`Sub`/`Mul`/`Div` of known values of rank 0 or 1 (shape arithmetic), broadcast;
/// `None` when a value is unknown, on overflow or on division by zero.
fn fold_arithmetic(op: &str, ins: &Inputs<'_, '_>, out: &Info) -> Option<Vec<i64>> {
    let (a, b) = (ins.opt(0)?, ins.opt(1)?);
    let (va, vb) = (a.value.as_deref()?, b.value.as_deref()?);
    if out.shape.len() > 1 {
        return None;
    }
    let n = usize::try_from(out.elements()?).ok()?;
    let at = |v: &[i64], i: usize| {
        if v.len() == 1 {
            v.first().copied()
        } else {
            v.get(i).copied()
        }
    };
    (0..n)
        .map(|i| {
            let (x, y) = (at(va, i)?, at(vb, i)?);
            match op {
                "Add" => x.checked_add(y),
                "Sub" => x.checked_sub(y),
                "Mul" => x.checked_mul(y),
                _ => x.checked_div(y),
            }
        })
        .collect()
}
