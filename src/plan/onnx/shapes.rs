//! Static shape inference for the ONNX operators of common vision models.
//!
//! [`infer`] takes one node and the known types of its inputs and returns the types of its
//! outputs. Shapes are fully static here (the reader pins or rejects symbolic dimensions first).
//! Small integer tensors also carry their values ([`Info::value`]), so that shape computations
//! (`Shape` → `Gather` → `Concat` → `Reshape`, `ConstantOfShape`, opset-13 axes inputs) fold.
//!
//! Every rule follows the operator's definition in ONNX's `Operators.md`; arithmetic on
//! dimensions is checked, so a hostile file gets an error, never an overflow.

use super::proto::{Node, TensorProto};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Info {
    /// The element type (`TensorProto.DataType`).
    pub(crate) dtype: i32,
    /// The shape, outermost dimension first; empty for a scalar.
    pub(crate) shape: Vec<u64>,
    /// The values, row-major, when known (integer constants and shape computations).
    pub(crate) value: Option<Vec<i64>>,
}

impl Info {
    fn new(dtype: i32, shape: Vec<u64>) -> Self {
        Info {
            dtype,
            shape,
            value: None,
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
        info.value = tensor_values(t, info.elements()?);
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

/// Why a node's output types could not be inferred.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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

/// Attribute access on a node.
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

/// Output extent of a sliding window (convolution or pooling) along one axis.
fn window(
    input: u64,
    kernel: u64,
    stride: u64,
    dilation: u64,
    pad_begin: u64,
    pad_end: u64,
    ceil: bool,
) -> Result<u64> {
    let extent = ck(dilation.checked_mul(kernel.saturating_sub(1)))?.saturating_add(1);
    let padded = ck(input
        .checked_add(pad_begin)
        .and_then(|v| v.checked_add(pad_end)))?;
    if stride == 0 || kernel == 0 || padded < extent {
        return Err(ShapeError::Window {
            window: extent,
            input: padded,
        });
    }
    let span = padded - extent;
    let mut out = if ceil {
        span.div_ceil(stride) + 1
    } else {
        span / stride + 1
    };
    // The last window must start inside the input or its begin padding (ONNX and PyTorch).
    if ceil && (out - 1).saturating_mul(stride) >= input.saturating_add(pad_begin) {
        out -= 1;
    }
    Ok(out)
}

/// Spatial output shape of `Conv` and the pooling operators; `x` is `[N, C, spatial...]`.
fn windowed(node: &Node, x: &[u64], kernel: &[u64], channels: u64, pool: bool) -> Result<Vec<u64>> {
    let at = Attrs(node);
    let n = x.len() - 2;
    if kernel.len() != n {
        return Err(ShapeError::Attribute {
            name: "kernel_shape",
            problem: "does not match the input's spatial rank",
        });
    }
    let list = |name: &'static str, len: usize, default: u64| -> Result<Vec<u64>> {
        match at.ints(name) {
            None => Ok(vec![default; len]),
            Some(v) if v.len() == len => v
                .iter()
                .map(|&d| {
                    u64::try_from(d).map_err(|_| ShapeError::Attribute {
                        name,
                        problem: "has a negative value",
                    })
                })
                .collect(),
            Some(_) => Err(ShapeError::Attribute {
                name,
                problem: "has the wrong number of values",
            }),
        }
    };
    let strides = list("strides", n, 1)?;
    let dilations = list("dilations", n, 1)?;
    let pads = list("pads", 2 * n, 0)?;
    let ceil = pool && at.int_or("ceil_mode", 0) != 0;
    let auto_pad = at.string("auto_pad").unwrap_or(b"NOTSET");
    let mut out = vec![x[0], channels];
    for i in 0..n {
        let o = match auto_pad {
            b"SAME_UPPER" | b"SAME_LOWER" => {
                if strides[i] == 0 {
                    return Err(ShapeError::Window {
                        window: kernel[i],
                        input: x[i + 2],
                    });
                }
                x[i + 2].div_ceil(strides[i])
            }
            b"VALID" => window(x[i + 2], kernel[i], strides[i], dilations[i], 0, 0, ceil)?,
            b"NOTSET" | b"" => window(
                x[i + 2],
                kernel[i],
                strides[i],
                dilations[i],
                pads[i],
                pads[i + n],
                ceil,
            )?,
            _ => {
                return Err(ShapeError::Attribute {
                    name: "auto_pad",
                    problem: "is not NOTSET, VALID, SAME_UPPER or SAME_LOWER",
                })
            }
        };
        out.push(o);
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
    let at = Attrs(node);
    let ins = Inputs(inputs);
    let outputs = node.output.len();
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
            let to =
                at.int("to")
                    .and_then(|t| i32::try_from(t).ok())
                    .ok_or(ShapeError::Attribute {
                        name: "to",
                        problem: "is missing",
                    })?;
            let mut o = Info::new(to, x.shape.clone());
            if matches!(to, dtype::INT64 | dtype::INT32) {
                o.value.clone_from(&x.value);
            }
            vec![o]
        }

        // ---- element-wise with numpy broadcasting ----
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Max" | "Min" | "Sum" | "Mean" | "Mod"
        | "PRelu" | "BitShift" => vec![broadcast_all(&ins, inputs.len(), None)?],
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" => {
            vec![broadcast_all(&ins, inputs.len(), Some(dtype::BOOL))?]
        }
        "Where" => {
            let s = broadcast(&ins.get(0)?.shape, &ins.get(1)?.shape)?;
            let s = broadcast(&s, &ins.get(2)?.shape)?;
            vec![Info::new(ins.get(1)?.dtype, s)]
        }

        // ---- convolution and pooling ----
        "Conv" => {
            let x = ins.get(0)?;
            let w = ins.get(1)?;
            rank_at_least(x, 0, 3, "at least 3 ([N, C, spatial...])")?;
            if w.shape.len() != x.shape.len() {
                return Err(ShapeError::Rank {
                    index: 1,
                    rank: w.shape.len(),
                    expected: "the input's rank ([M, C/group, kernel...])",
                });
            }
            let group = u64::try_from(at.int_or("group", 1)).unwrap_or(0);
            let channels = ck(w.shape[1].checked_mul(group))?;
            if group == 0 || channels != x.shape[1] {
                return Err(ShapeError::Mismatch {
                    what: "input channels vs weight channels × group",
                    left: x.shape[1],
                    right: channels,
                });
            }
            let kernel = match at.ints("kernel_shape") {
                Some(k) => k.iter().map(|&d| dim(d)).collect::<Result<Vec<_>>>()?,
                None => w.shape[2..].to_vec(),
            };
            vec![Info::new(
                x.dtype,
                windowed(node, &x.shape, &kernel, w.shape[0], false)?,
            )]
        }
        "MaxPool" | "AveragePool" | "LpPool" => {
            let x = ins.get(0)?;
            rank_at_least(x, 0, 3, "at least 3 ([N, C, spatial...])")?;
            let kernel = at
                .ints("kernel_shape")
                .ok_or(ShapeError::Attribute {
                    name: "kernel_shape",
                    problem: "is missing",
                })?
                .iter()
                .map(|&d| dim(d))
                .collect::<Result<Vec<_>>>()?;
            let shape = windowed(node, &x.shape, &kernel, x.shape[1], true)?;
            vec![
                Info::new(x.dtype, shape.clone()),
                Info::new(dtype::INT64, shape),
            ]
        }
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => {
            let x = ins.get(0)?;
            rank_at_least(x, 0, 2, "at least 2 ([N, C, ...])")?;
            let mut s = x.shape.clone();
            s[2..].iter_mut().for_each(|d| *d = 1);
            vec![Info::new(x.dtype, s)]
        }

        // ---- linear algebra ----
        "Gemm" => {
            let (a, b) = (ins.get(0)?, ins.get(1)?);
            for (i, t) in [(0, a), (1, b)] {
                if t.shape.len() != 2 {
                    return Err(ShapeError::Rank {
                        index: i,
                        rank: t.shape.len(),
                        expected: "2",
                    });
                }
            }
            let (m, k) = if at.int_or("transA", 0) != 0 {
                (a.shape[1], a.shape[0])
            } else {
                (a.shape[0], a.shape[1])
            };
            let (k2, n) = if at.int_or("transB", 0) != 0 {
                (b.shape[1], b.shape[0])
            } else {
                (b.shape[0], b.shape[1])
            };
            if k != k2 {
                return Err(ShapeError::Mismatch {
                    what: "Gemm inner dimensions",
                    left: k,
                    right: k2,
                });
            }
            vec![Info::new(a.dtype, vec![m, n])]
        }
        "MatMul" => {
            let (a, b) = (ins.get(0)?, ins.get(1)?);
            vec![Info::new(a.dtype, matmul(&a.shape, &b.shape)?)]
        }

        // ---- shape manipulation ----
        "Flatten" => {
            let x = ins.get(0)?;
            let r = x.shape.len();
            let a = at.int_or("axis", 1);
            let a = if a == i64::try_from(r).unwrap_or(i64::MAX) {
                r
            } else {
                axis(a, r)?
            };
            let outer = x.shape[..a].iter().try_fold(1u64, |n, &d| n.checked_mul(d));
            let inner = x.shape[a..].iter().try_fold(1u64, |n, &d| n.checked_mul(d));
            vec![Info::new(x.dtype, vec![ck(outer)?, ck(inner)?])]
        }
        "Reshape" => {
            let x = ins.get(0)?;
            let target: Vec<i64> = if opset < 5 {
                at.ints("shape")
                    .ok_or(ShapeError::Attribute {
                        name: "shape",
                        problem: "is missing",
                    })?
                    .to_vec()
            } else {
                ins.value(1)?.to_vec()
            };
            let mut o = Info::new(
                x.dtype,
                reshape(&x.shape, &target, at.int_or("allowzero", 0) != 0)?,
            );
            o.value.clone_from(&x.value);
            vec![o]
        }
        "Transpose" => {
            let x = ins.get(0)?;
            let r = x.shape.len();
            let perm: Vec<usize> = match at.ints("perm") {
                None => (0..r).rev().collect(),
                Some(p) => p.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?,
            };
            let mut seen = vec![false; r];
            if perm.len() != r || perm.iter().any(|&a| std::mem::replace(&mut seen[a], true)) {
                return Err(ShapeError::Attribute {
                    name: "perm",
                    problem: "is not a permutation of the input's axes",
                });
            }
            vec![Info::new(
                x.dtype,
                perm.iter().map(|&a| x.shape[a]).collect(),
            )]
        }
        "Concat" => {
            let first = ins.get(0)?;
            let a = axis(
                at.int("axis").ok_or(ShapeError::Attribute {
                    name: "axis",
                    problem: "is missing",
                })?,
                first.shape.len(),
            )?;
            let mut shape = first.shape.clone();
            let mut value = Some(Vec::new());
            for index in 0..inputs.len() {
                let t = ins.get(index)?;
                if t.shape.len() != shape.len() {
                    return Err(ShapeError::Rank {
                        index,
                        rank: t.shape.len(),
                        expected: "that of input 0",
                    });
                }
                for (i, (&d, &e)) in t.shape.iter().zip(&first.shape).enumerate() {
                    if i != a && d != e {
                        return Err(ShapeError::Mismatch {
                            what: "Concat dimensions off the axis",
                            left: e,
                            right: d,
                        });
                    }
                }
                if index > 0 {
                    shape[a] = ck(shape[a].checked_add(t.shape[a]))?;
                }
                value = match (value, &t.value) {
                    // Bounded, so that a chain of Concats cannot grow a value exponentially.
                    (Some(mut v), Some(tv))
                        if shape.len() == 1 && v.len() + tv.len() <= MAX_VALUES =>
                    {
                        v.extend_from_slice(tv);
                        Some(v)
                    }
                    _ => None,
                };
            }
            vec![Info {
                dtype: first.dtype,
                shape,
                value,
            }]
        }
        "Split" => {
            let x = ins.get(0)?;
            let a = axis(at.int_or("axis", 0), x.shape.len())?;
            let total = x.shape[a];
            let sizes: Vec<u64> = match (opset < 13, at.ints("split"), ins.opt_value(1)?) {
                (true, Some(s), _) | (false, _, Some(s)) if !s.is_empty() => {
                    s.iter().map(|&d| dim(d)).collect::<Result<_>>()?
                }
                _ => {
                    let n = u64::try_from(
                        at.int_or("num_outputs", i64::try_from(outputs).unwrap_or(i64::MAX)),
                    )
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(ShapeError::Attribute {
                        name: "num_outputs",
                        problem: "must be positive",
                    })?;
                    if n > u64::try_from(outputs).unwrap_or(u64::MAX) {
                        return Err(ShapeError::Attribute {
                            name: "num_outputs",
                            problem: "is more than the node's outputs",
                        });
                    }
                    let chunk = total.div_ceil(n);
                    if !at.has("num_outputs") && chunk.checked_mul(n) != Some(total) {
                        return Err(ShapeError::Mismatch {
                            what: "Split into equal parts: dimension vs parts",
                            left: total,
                            right: n,
                        });
                    }
                    (0..n)
                        .map(|i| chunk.min(total.saturating_sub(i.saturating_mul(chunk))))
                        .collect()
                }
            };
            let sum = sizes.iter().try_fold(0u64, |s, &d| s.checked_add(d));
            if sum != Some(total) {
                return Err(ShapeError::Mismatch {
                    what: "Split sizes' sum vs dimension",
                    left: sum.unwrap_or(u64::MAX),
                    right: total,
                });
            }
            sizes
                .iter()
                .map(|&d| {
                    let mut s = x.shape.clone();
                    s[a] = d;
                    Info::new(x.dtype, s)
                })
                .collect()
        }
        "Squeeze" => {
            let x = ins.get(0)?;
            let axes: Option<Vec<i64>> = if opset < 13 {
                at.ints("axes").map(<[i64]>::to_vec)
            } else {
                ins.opt_value(1)?.map(<[i64]>::to_vec)
            };
            let r = x.shape.len();
            let drop: Vec<usize> = match axes {
                Some(a) if !a.is_empty() => a.iter().map(|&a| axis(a, r)).collect::<Result<_>>()?,
                _ => (0..r).filter(|&i| x.shape[i] == 1).collect(),
            };
            if let Some(&i) = drop.iter().find(|&&i| x.shape[i] != 1) {
                return Err(ShapeError::Mismatch {
                    what: "Squeeze of a dimension that is not 1",
                    left: x.shape[i],
                    right: 1,
                });
            }
            let shape = (0..r)
                .filter(|i| !drop.contains(i))
                .map(|i| x.shape[i])
                .collect();
            vec![Info {
                dtype: x.dtype,
                shape,
                value: x.value.clone(),
            }]
        }
        "Unsqueeze" => {
            let x = ins.get(0)?;
            let axes: Vec<i64> = if opset < 13 {
                at.ints("axes")
                    .ok_or(ShapeError::Attribute {
                        name: "axes",
                        problem: "is missing",
                    })?
                    .to_vec()
            } else {
                ins.value(1)?.to_vec()
            };
            let r = x.shape.len() + axes.len();
            let mut ones = vec![false; r];
            for &a in &axes {
                let a = axis(a, r)?;
                if std::mem::replace(&mut ones[a], true) {
                    return Err(ShapeError::Attribute {
                        name: "axes",
                        problem: "repeats an axis",
                    });
                }
            }
            let mut rest = x.shape.iter();
            let shape = ones
                .iter()
                .map(|&one| if one { 1 } else { *rest.next().unwrap_or(&1) })
                .collect();
            vec![Info {
                dtype: x.dtype,
                shape,
                value: x.value.clone(),
            }]
        }

        // ---- shape computations (values known statically) ----
        "Shape" => {
            let x = ins.get(0)?;
            let r = i64::try_from(x.shape.len()).map_err(|_| ShapeError::Overflow)?;
            let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r);
            let start = usize::try_from(clamp(at.int_or("start", 0))).unwrap_or(0);
            let end = usize::try_from(clamp(at.int_or("end", r))).unwrap_or(0);
            let dims = x.shape.get(start..end.max(start)).unwrap_or(&[]);
            let value = dims
                .iter()
                .map(|&d| i64::try_from(d).map_err(|_| ShapeError::Overflow))
                .collect::<Result<Vec<_>>>()?;
            let len = u64::try_from(value.len()).map_err(|_| ShapeError::Overflow)?;
            vec![Info {
                dtype: dtype::INT64,
                shape: vec![len],
                value: Some(value),
            }]
        }
        "Size" => {
            let x = ins.get(0)?;
            let n = i64::try_from(ck(x.elements())?).map_err(|_| ShapeError::Overflow)?;
            vec![Info {
                dtype: dtype::INT64,
                shape: vec![],
                value: Some(vec![n]),
            }]
        }
        "Gather" => {
            let (x, idx) = (ins.get(0)?, ins.get(1)?);
            let r = x.shape.len();
            if r == 0 {
                return Err(ShapeError::Rank {
                    index: 0,
                    rank: 0,
                    expected: "at least 1",
                });
            }
            let a = axis(at.int_or("axis", 0), r)?;
            let mut shape = x.shape[..a].to_vec();
            shape.extend_from_slice(&idx.shape);
            shape.extend_from_slice(&x.shape[a + 1..]);
            let value = match (&x.value, &idx.value) {
                (Some(v), Some(i)) if r == 1 => i
                    .iter()
                    .map(|&i| {
                        let n = i64::try_from(v.len()).ok()?;
                        let j = usize::try_from(if i < 0 { i + n } else { i }).ok()?;
                        v.get(j).copied()
                    })
                    .collect::<Option<Vec<_>>>(),
                _ => None,
            };
            vec![Info {
                dtype: x.dtype,
                shape,
                value,
            }]
        }
        "ConstantOfShape" => {
            let shape = ins
                .value(0)?
                .iter()
                .map(|&d| dim(d))
                .collect::<Result<Vec<_>>>()?;
            let dt = at.tensor("value").map_or(dtype::FLOAT, |t| t.data_type);
            vec![Info::new(dt, shape)]
        }
        "Constant" => vec![constant(node)?],
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

/// Numpy `matmul` shapes (1-D operands promoted and the added axis removed again).
fn matmul(a: &[u64], b: &[u64]) -> Result<Vec<u64>> {
    for (index, s) in [(0, a), (1, b)] {
        if s.is_empty() {
            return Err(ShapeError::Rank {
                index,
                rank: 0,
                expected: "at least 1",
            });
        }
    }
    let a2: Vec<u64> = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let b2: Vec<u64> = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    let (ra, rb) = (a2.len(), b2.len());
    if a2[ra - 1] != b2[rb - 2] {
        return Err(ShapeError::Mismatch {
            what: "MatMul inner dimensions",
            left: a2[ra - 1],
            right: b2[rb - 2],
        });
    }
    let mut out = broadcast(&a2[..ra - 2], &b2[..rb - 2])?;
    if a.len() > 1 {
        out.push(a2[ra - 2]);
    }
    if b.len() > 1 {
        out.push(b2[rb - 1]);
    }
    Ok(out)
}

/// `Reshape`'s output: `0` copies the input's dimension (unless `allowzero`), `-1` is inferred.
fn reshape(from: &[u64], to: &[i64], allowzero: bool) -> Result<Vec<u64>> {
    let bad = || ShapeError::Reshape {
        from: from.to_vec(),
        to: to.to_vec(),
    };
    let total = ck(from.iter().try_fold(1u64, |n, &d| n.checked_mul(d)))?;
    let mut out = Vec::with_capacity(to.len());
    let mut infer = None;
    for (i, &d) in to.iter().enumerate() {
        out.push(match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                1
            }
            0 if !allowzero => *from.get(i).ok_or_else(bad)?,
            d => u64::try_from(d).map_err(|_| bad())?,
        });
    }
    let known = ck(out.iter().try_fold(1u64, |n, &d| n.checked_mul(d)))?;
    match infer {
        Some(i) => {
            if known == 0 || total % known != 0 {
                return Err(bad());
            }
            out[i] = total / known;
        }
        None if known != total => return Err(bad()),
        None => {}
    }
    Ok(out)
}

/// A `Constant` node's value.
fn constant(node: &Node) -> Result<Info> {
    let at = Attrs(node);
    let attr = node.attribute.first().ok_or(ShapeError::Attribute {
        name: "value",
        problem: "is missing (a Constant needs exactly one value attribute)",
    })?;
    let n = |len: usize| u64::try_from(len).map_err(|_| ShapeError::Overflow);
    Ok(match attr.name.as_str() {
        "value" => {
            let t = at.tensor("value").ok_or(ShapeError::Attribute {
                name: "value",
                problem: "is not a tensor",
            })?;
            Info::of_tensor(t).ok_or(ShapeError::Attribute {
                name: "value",
                problem: "has a negative dimension",
            })?
        }
        "value_float" => Info::new(dtype::FLOAT, vec![]),
        "value_floats" => Info::new(dtype::FLOAT, vec![n(attr.floats.len())?]),
        "value_int" => Info {
            dtype: dtype::INT64,
            shape: vec![],
            value: Some(vec![attr.i]),
        },
        "value_ints" => Info {
            dtype: dtype::INT64,
            shape: vec![n(attr.ints.len())?],
            value: Some(attr.ints.clone()),
        },
        // value_string(s), sparse_value: not numeric tensors.
        _ => return Err(ShapeError::Unsupported),
    })
}
