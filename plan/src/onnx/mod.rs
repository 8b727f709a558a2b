//! The ONNX reader: a `.onnx` model to the planner's [`Tensor`] records.
//!
//! ```no_run
//! let tensors = userdma_plan::onnx::read("resnet50.onnx".as_ref())?;
//! // A model with a symbolic batch dimension `N`: pin it.
//! let options = userdma_plan::onnx::Options::default().dim("N", 1);
//! let tensors = userdma_plan::onnx::read_with("bert.onnx".as_ref(), &options)?;
//! # Ok::<(), userdma_plan::onnx::Error>(())
//! ```
//!
//! # What becomes a tensor
//! Every activation: each graph input that is not a weight, and each value a node computes from
//! at least one activation. Weights (initializers) and constant-only subgraphs (nodes whose inputs
//! are all constants, transitively: `Constant`, `ConstantOfShape` of a weight's shape, `Unsqueeze`
//! of a weight, ...) are dropped: a runtime folds them, and they are not activations. `Shape` and
//! `Size` count as constants too, since every shape here is static; so do the computations on
//! their results.
//!
//! Steps come from node order: the nodes that compute activations are numbered 0, 1, ... in the
//! order the file lists them (which ONNX requires to be topological). A tensor lives from its
//! producer's step to its last reader's step, inclusive (a value nobody reads lives one step);
//! graph inputs live from step 0 and graph outputs to the last step. Ids are dense, in order of
//! first appearance: graph inputs first, then node outputs in node order. Sizes are the element
//! count times the element size (4-bit types round up to whole bytes).
//!
//! # Shapes
//! Shapes come from the file where it has them (`value_info`, the graph outputs; written by
//! `onnx.shape_inference.infer_shapes`) and otherwise from the reader's own inference
//! ([`ShapeError`] lists how that fails). It covers the operators of the ONNX model zoo's vision
//! models and their common neighbours: `Conv`, `ConvTranspose` and pooling (pads, `auto_pad`,
//! strides, dilations, groups, `ceil_mode`), normalisation, element-wise operators with numpy
//! broadcasting, `Gemm`, `MatMul`, reductions, `ArgMax`, `TopK`, `Concat`, `Split`, `Slice`,
//! `Pad`, `Expand`, `Tile`, `Resize`/`Upsample` with constant sizes or scales, `Reshape`,
//! `Flatten`, `Transpose`, `Squeeze`, `Unsqueeze`, and shape arithmetic (`Shape`, `Gather`,
//! `Concat`, `Slice`, integer `Add`/`Sub`/`Mul`/`Div`, `Range`). Symbolic dimensions
//! (`dim_param`) must be pinned with [`Options::dim`].
//!
//! Not read: control flow (`If`, `Loop`, `Scan`: an error even with declared shapes, since their
//! bodies read outer values that are not node inputs), data-dependent shapes (`NonZero`,
//! `NonMaxSuppression`, ...: an error unless `value_info` gives them), operators outside the
//! default domain (the same), and constant values stored as external data.

//! # Why `prost` and not `tract-onnx`
//! `tract-onnx` infers shapes for far more operators, but it is an inference engine: a clean debug
//! build of `tract-onnx` 0.23 alone took 3 min 26 s on this project's 2-core machines (about 100
//! crates), and CI would pay that in each of its debug, release and fuzz builds. The planner needs
//! sizes and lifetimes, not execution, so this module decodes the subset of `onnx.proto` it needs
//! with `prost`'s derive macros (`proto`, written by hand: no `protoc`, no build script; `prost`
//! 0.14 builds clean in 8 s, and adds four crates to the lock file: `prost`, `prost-derive`,
//! `bytes`, `anyhow`) and infers shapes itself. An operator it does not know is an error that says
//! how to get the shapes written into the file.

mod proto;
mod shapes;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use prost::Message as _;

use super::{Kind, Tensor};
use proto::{DimValue, Graph, Model, Node, ValueInfo};
use shapes::Info;
pub use shapes::ShapeError;

/// How to read a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Values for symbolic dimensions (`dim_param`), by name: `("N", 1)` makes every `N` 1.
    pub dims: BTreeMap<String, u64>,
}

impl Options {
    /// Pins the symbolic dimension `name` to `value` (the CLI's `--dim NAME=VALUE`).
    pub fn dim(mut self, name: impl Into<String>, value: u64) -> Self {
        self.dims.insert(name.into(), value);
        self
    }
}

/// Why a model could not be read. Each variant names the tensor or node involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than a model can be ([`MAX_MODEL_BYTES`]): refused before it is
    /// read, or once that much was read (a device or a pipe that never ends).
    #[error(
        "{} is larger than {limit} bytes, protobuf's limit for a model: save it with its \
         weights as external data (onnx.save_model(model, PATH, save_as_external_data=True)); \
         the planner reads only the graph",
        path.display()
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit, in bytes.
        limit: u64,
    },
    /// The file's first byte starts no protobuf field ([`starts_a_field`]): `/dev/zero`, a
    /// text file. Refused after that byte.
    #[error(
        "{} is not an ONNX model: its first byte, {byte:#04x}, starts no protobuf field",
        path.display()
    )]
    NotAModel {
        /// The file.
        path: PathBuf,
        /// Its first byte.
        byte: u8,
    },
    /// The bytes are not a valid protobuf `ModelProto` (truncated, or not an ONNX file).
    #[error("not an ONNX model, or a truncated one: {0}")]
    Decode(#[source] prost::DecodeError),
    /// The model has no graph.
    #[error("the model has no graph (truncated file?)")]
    NoGraph,
    /// The model imports no version of the default ONNX operator set.
    #[error("the model imports no version of the default ONNX operator set (truncated file?)")]
    NoOpset,
    /// A graph input is not a dense tensor, or its type or rank is not given.
    #[error("graph input `{tensor}` has no tensor type with a known rank")]
    Untyped {
        /// The input.
        tensor: String,
    },
    /// A graph input has a symbolic or unknown dimension that no option pins.
    #[error(
        "graph input `{tensor}` has a dynamic dimension {dim}{}: {}",
        param.as_ref().map(|p| format!(" (`{p}`)")).unwrap_or_default(),
        match param {
            Some(p) => format!(
                "pin it with Options::dim(\"{p}\", VALUE) (`--dim {p}=VALUE`), or fix it in the \
                 file with `python -m onnxruntime.tools.make_dynamic_shape_fixed --dim_param {p} \
                 --dim_value VALUE in.onnx out.onnx`"
            ),
            None => format!(
                "it has no name to pin; fix the input's shape in the file with `python -m \
                 onnxruntime.tools.make_dynamic_shape_fixed --input_name {tensor} --input_shape \
                 D0,D1,... in.onnx out.onnx`"
            ),
        }
    )]
    DynamicDim {
        /// The input.
        tensor: String,
        /// The dimension's position (0 is outermost).
        dim: usize,
        /// The symbolic name, if it has one.
        param: Option<String>,
    },
    /// A node reads a value that no graph input, initializer or earlier node provides.
    #[error("node `{node}` ({op}) reads `{input}`, which no graph input, initializer or earlier node provides")]
    UnknownInput {
        /// The node (its name, or `#index` when it has none).
        node: String,
        /// Its operator.
        op: String,
        /// The missing value.
        input: String,
    },
    /// A graph output names a value that nothing provides.
    #[error("graph output `{tensor}` is not produced by any node, input or initializer")]
    UnknownOutput {
        /// The output.
        tensor: String,
    },
    /// Two producers write the same value name.
    #[error("value `{tensor}` is produced twice (node `{node}` writes it again)")]
    Duplicate {
        /// The value.
        tensor: String,
        /// The second producer.
        node: String,
    },
    /// The reader cannot infer an output's shape, and the file does not give it.
    #[error(
        "cannot infer the shape of `{output}`, output of node `{node}` ({op}): {source}; \
         {}",
        if matches!(**source, ShapeError::Unsupported) {
            "write the shapes into the file with ONNX's shape inference (`python -c \"import onnx; \
             onnx.save(onnx.shape_inference.infer_shapes(onnx.load('in.onnx')), 'out.onnx')\"`, \
             which fills value_info) and read that file"
        } else {
            "the node is inconsistent with its inputs"
        }
    )]
    Shape {
        /// The node (its name, or `#index` when it has none).
        node: String,
        /// Its operator, prefixed by its domain and `.` outside the default domain.
        op: String,
        /// The first output whose shape is unknown.
        output: String,
        /// Why.
        #[source]
        source: Box<ShapeError>,
    },
    /// A tensor's element type has no fixed size (STRING, UNDEFINED or an unknown code).
    #[error("tensor `{tensor}` has element type {dtype}, which has no fixed size")]
    Dtype {
        /// The tensor.
        tensor: String,
        /// Its `TensorProto.DataType` code.
        dtype: i32,
    },
    /// A tensor has no elements (a zero dimension); the planner needs sizes above zero.
    #[error("tensor `{tensor}` has shape {shape:?}, with no elements")]
    Empty {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// A tensor's size in bytes does not fit in 64 bits.
    #[error("tensor `{tensor}` with shape {shape:?} is larger than 2^64 bytes")]
    Overflow {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// An initializer has a negative dimension, or more than 2^64 elements.
    #[error("initializer `{tensor}` has a negative dimension, or more than 2^64 elements")]
    Initializer {
        /// The initializer.
        tensor: String,
    },
    /// The graph has more nodes than steps fit in 32 bits.
    #[error("the graph has more than 2^32 nodes")]
    TooManyNodes,
    /// A node has a subgraph (`If`, `Loop`, `Scan`): the values its body reads from the outer
    /// graph are not among the node's inputs, so their lifetimes cannot be read off node order.
    #[error(
        "node `{node}` ({op}) has a subgraph; control flow is not supported (unroll or fold it, \
         e.g. with onnxsim, and read that model)"
    )]
    ControlFlow {
        /// The node (its name, or `#index` when it has none).
        node: String,
        /// Its operator.
        op: String,
    },
}

/// Reads the model at `path`; see [`parse_with`].
pub fn read(path: &Path) -> Result<Vec<Tensor>, Error> {
    read_with(path, &Options::default())
}

/// The most bytes a serialized model can have: protobuf's 2 GiB limit on a message (a larger
/// model keeps its weights as external data, which the planner does not read).
pub const MAX_MODEL_BYTES: u64 = 2 << 30;

/// Whether `byte` can be the first byte of a serialized protobuf message: a field's tag, whose
/// field number is not 0 (a first byte below 8) and whose wire type is not 6 or 7.
pub fn starts_a_field(byte: u8) -> bool {
    byte >= 8 && byte & 7 < 6
}

/// Reads the model at `path` with `options`; see [`parse_with`]. At most [`MAX_MODEL_BYTES`]
/// are read ([`Error::TooLarge`]: a larger regular file before any of it), and a file whose
/// first byte starts no protobuf field is refused after it ([`Error::NotAModel`]), so a
/// device or an endless pipe named by mistake ends the read.
pub fn read_with(path: &Path, options: &Options) -> Result<Vec<Tensor>, Error> {
    use std::io::Read;
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let too_large = || Error::TooLarge {
        path: path.to_path_buf(),
        limit: MAX_MODEL_BYTES,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    if let Ok(meta) = file.metadata() {
        if meta.is_file() {
            if meta.len() > MAX_MODEL_BYTES {
                return Err(too_large());
            }
            bytes.reserve(usize::try_from(meta.len()).unwrap_or(0));
        }
    }
    let mut first = [0u8; 1];
    let n = loop {
        match file.read(&mut first) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            other => break other.map_err(io)?,
        }
    };
    if n == 1 {
        if !starts_a_field(first[0]) {
            return Err(Error::NotAModel {
                path: path.to_path_buf(),
                byte: first[0],
            });
        }
        bytes.push(first[0]);
        file.take(MAX_MODEL_BYTES)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if u64::try_from(bytes.len()).map_or(true, |n| n > MAX_MODEL_BYTES) {
            return Err(too_large());
        }
    }
    parse_with(&bytes, options)
}

/// Parses a serialized `ModelProto`; see [`parse_with`].
pub fn parse(bytes: &[u8]) -> Result<Vec<Tensor>, Error> {
    parse_with(bytes, &Options::default())
}

/// Parses a serialized `ModelProto` into the planner's records, one per activation tensor, in id
/// order (see the module docs for what becomes a tensor and how steps are counted).
pub fn parse_with(bytes: &[u8], options: &Options) -> Result<Vec<Tensor>, Error> {
    let model = Model::decode(bytes).map_err(Error::Decode)?;
    let opset = model
        .opset_import
        .iter()
        .filter(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .max()
        .ok_or(Error::NoOpset)?;
    let graph = model.graph.as_ref().ok_or(Error::NoGraph)?;
    Reader::new(graph, opset, options)?.run()
}

/// A value's place in the schedule while reading.
struct Live {
    info: Info,
    first: u32,
    last: u32,
    op: Option<String>,
    inputs: Vec<u64>,
    kind: Kind,
}

struct Reader<'g> {
    graph: &'g Graph,
    opset: i64,
    options: &'g Options,
    /// Every known value's type: weights, constants and activations.
    types: HashMap<&'g str, Info>,
    /// Values that are constants (weights and constant-only subgraphs).
    constant: HashSet<&'g str>,
    /// Activations, by name, to their id.
    ids: HashMap<&'g str, u64>,
    /// Activations in id order, with their names.
    live: Vec<(&'g str, Live)>,
    /// Static shapes the file declares (`value_info`, graph outputs).
    declared: HashMap<&'g str, Info>,
}

impl<'g> Reader<'g> {
    fn new(graph: &'g Graph, opset: i64, options: &'g Options) -> Result<Self, Error> {
        let mut r = Reader {
            graph,
            opset,
            options,
            types: HashMap::new(),
            constant: HashSet::new(),
            ids: HashMap::new(),
            live: Vec::new(),
            declared: HashMap::new(),
        };
        for t in &graph.initializer {
            let info = Info::of_tensor(t).ok_or_else(|| Error::Initializer {
                tensor: t.name.clone(),
            })?;
            r.types.insert(&t.name, info);
            r.constant.insert(&t.name);
        }
        for v in graph.value_info.iter().chain(&graph.output) {
            if let Some(info) = r.static_type(v) {
                r.declared.insert(&v.name, info);
            }
        }
        Ok(r)
    }

    /// The type `v` declares, if it is a tensor with a fully static shape (after pinning).
    fn static_type(&self, v: &ValueInfo) -> Option<Info> {
        let t = v.r#type.as_ref()?.tensor_type.as_ref()?;
        let shape = t
            .shape
            .as_ref()?
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(DimValue::Value(n)) => u64::try_from(*n).ok(),
                Some(DimValue::Param(p)) => self.options.dims.get(p).copied(),
                None => None,
            })
            .collect::<Option<Vec<u64>>>()?;
        Some(Info {
            dtype: t.elem_type,
            shape,
            value: None,
            floats: None,
        })
    }

    /// A graph input's type; every dimension must be static or pinned.
    fn input_type(&self, v: &ValueInfo) -> Result<Info, Error> {
        let untyped = || Error::Untyped {
            tensor: v.name.clone(),
        };
        let t = v
            .r#type
            .as_ref()
            .and_then(|t| t.tensor_type.as_ref())
            .ok_or_else(untyped)?;
        let dims = &t.shape.as_ref().ok_or_else(untyped)?.dim;
        let mut shape = Vec::with_capacity(dims.len());
        for (i, d) in dims.iter().enumerate() {
            let dynamic = |param: Option<&String>| Error::DynamicDim {
                tensor: v.name.clone(),
                dim: i,
                param: param.cloned(),
            };
            shape.push(match &d.value {
                Some(DimValue::Value(n)) => u64::try_from(*n).map_err(|_| dynamic(None))?,
                Some(DimValue::Param(p)) => {
                    *self.options.dims.get(p).ok_or_else(|| dynamic(Some(p)))?
                }
                None => return Err(dynamic(None)),
            });
        }
        Ok(Info {
            dtype: t.elem_type,
            shape,
            value: None,
            floats: None,
        })
    }

    /// Adds activation `name`, produced at `first`.
    fn add_live(
        &mut self,
        name: &'g str,
        info: Info,
        first: u32,
        op: Option<String>,
        inputs: Vec<u64>,
        kind: Kind,
    ) -> Result<(), Error> {
        let id = u64::try_from(self.live.len()).map_err(|_| Error::TooManyNodes)?;
        self.ids.insert(name, id);
        self.types.insert(name, info.clone());
        self.live.push((
            name,
            Live {
                info,
                first,
                last: first,
                op,
                inputs,
                kind,
            },
        ));
        Ok(())
    }

    fn run(mut self) -> Result<Vec<Tensor>, Error> {
        let graph = self.graph;
        for v in &graph.input {
            if self.constant.contains(v.name.as_str()) {
                continue; // IR < 4 lists weights as inputs too.
            }
            if self.types.contains_key(v.name.as_str()) {
                return Err(Error::Duplicate {
                    tensor: v.name.clone(),
                    node: "(graph input)".into(),
                });
            }
            let info = self.input_type(v)?;
            self.add_live(&v.name, info, 0, None, Vec::new(), Kind::Input)?;
        }

        let mut step: u32 = 0;
        for (index, node) in graph.node.iter().enumerate() {
            self.node(index, node, &mut step)?;
        }
        let last_step = step.saturating_sub(1);

        for v in &graph.output {
            let name = v.name.as_str();
            if let Some(&id) = self.ids.get(name) {
                let (_, l) =
                    &mut self.live[usize::try_from(id).map_err(|_| Error::TooManyNodes)?];
                l.last = last_step;
                if l.kind == Kind::Intermediate {
                    l.kind = Kind::Output;
                }
            } else if !self.types.contains_key(name) {
                return Err(Error::UnknownOutput {
                    tensor: v.name.clone(),
                });
            }
            // A constant graph output is not an activation: dropped like the other constants.
        }

        self.live
            .into_iter()
            .zip(0u64..)
            .map(|((name, l), id)| {
                Ok(Tensor {
                    id,
                    name: Some(name.to_owned()),
                    bytes: bytes(name, &l.info)?,
                    first: l.first,
                    last: l.last,
                    op: l.op,
                    inputs: l.inputs,
                    kind: l.kind,
                    offset: None,
                    inplace: None,
                })
            })
            .collect()
    }

    /// Reads one node: infers its outputs and, if it computes activations, gives it a step.
    fn node(&mut self, index: usize, node: &'g Node, step: &mut u32) -> Result<(), Error> {
        let label = || {
            if node.name.is_empty() {
                format!("#{index}")
            } else {
                node.name.clone()
            }
        };
        let mut infos = Vec::with_capacity(node.input.len());
        let mut activations = Vec::new();
        for input in &node.input {
            if input.is_empty() {
                infos.push(None);
                continue;
            }
            let info = self
                .types
                .get(input.as_str())
                .ok_or_else(|| Error::UnknownInput {
                    node: label(),
                    op: node.op_type.clone(),
                    input: input.clone(),
                })?;
            infos.push(Some(info));
            if let Some(&id) = self.ids.get(input.as_str()) {
                if !activations.contains(&id) {
                    activations.push(id);
                }
            }
        }
        // AttributeProto.AttributeType GRAPH (5) and GRAPHS (10), or the control-flow operators
        // (whose attribute type a writer may have left unset).
        if node.attribute.iter().any(|a| matches!(a.r#type, 5 | 10))
            || matches!(node.op_type.as_str(), "If" | "Loop" | "Scan")
        {
            return Err(Error::ControlFlow {
                node: label(),
                op: node.op_type.clone(),
            });
        }
        let default_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        let inferred = if default_domain {
            shapes::infer(node, self.opset, &infos)
        } else {
            Err(ShapeError::Unsupported)
        };
        // Shape and Size depend only on static shapes: their results are constants.
        let constant = activations.is_empty()
            || (default_domain && matches!(node.op_type.as_str(), "Shape" | "Size"));

        let mut outputs = Vec::with_capacity(node.output.len());
        for (i, output) in node.output.iter().enumerate() {
            if output.is_empty() {
                continue;
            }
            if self.types.contains_key(output.as_str()) {
                return Err(Error::Duplicate {
                    tensor: output.clone(),
                    node: label(),
                });
            }
            let info = match (self.declared.get(output.as_str()), &inferred) {
                (Some(d), Ok(v)) => {
                    // Keep a folded value when the file agrees with the inferred shape.
                    let mut d = d.clone();
                    if let Some(inf) = v.get(i).filter(|inf| inf.shape == d.shape) {
                        d.value.clone_from(&inf.value);
                    }
                    d
                }
                (Some(d), Err(_)) => d.clone(),
                (None, Ok(v)) if i < v.len() => v[i].clone(),
                (None, result) => {
                    return Err(Error::Shape {
                        node: label(),
                        op: if default_domain {
                            node.op_type.clone()
                        } else {
                            format!("{}.{}", node.domain, node.op_type)
                        },
                        output: output.clone(),
                        source: Box::new(match result {
                            Err(e) => e.clone(),
                            Ok(v) => ShapeError::Outputs {
                                listed: node.output.len(),
                                made: v.len(),
                            },
                        }),
                    })
                }
            };
            outputs.push((output.as_str(), info));
        }

        if constant {
            for (name, info) in outputs {
                self.types.insert(name, info);
                self.constant.insert(name);
            }
            return Ok(());
        }
        for &id in &activations {
            if let Some((_, l)) = usize::try_from(id).ok().and_then(|i| self.live.get_mut(i)) {
                l.last = l.last.max(*step);
            }
        }
        for (name, info) in outputs {
            self.add_live(
                name,
                info,
                *step,
                Some(node.op_type.clone()),
                activations.clone(),
                Kind::Intermediate,
            )?;
        }
        *step = step.checked_add(1).ok_or(Error::TooManyNodes)?;
        Ok(())
    }
}

/// A tensor's size in bytes.
fn bytes(name: &str, info: &Info) -> Result<u64, Error> {
    let bits = shapes::dtype_bits(info.dtype).ok_or_else(|| Error::Dtype {
        tensor: name.to_owned(),
        dtype: info.dtype,
    })?;
    let overflow = || Error::Overflow {
        tensor: name.to_owned(),
        shape: info.shape.clone(),
    };
    let n = info.elements().ok_or_else(overflow)?;
    if n == 0 {
        return Err(Error::Empty {
            tensor: name.to_owned(),
            shape: info.shape.clone(),
        });
    }
    Ok(n.checked_mul(bits).ok_or_else(overflow)?.div_ceil(8))
}
