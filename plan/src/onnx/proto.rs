//! The subset of `onnx.proto` the reader decodes, written out by hand as `prost` messages.
//!
//! Field numbers and types are those of `onnx/onnx.proto` (IR version 10); fields the reader does
//! not need are left out, and `prost` skips them on decoding. `onnx.proto` is proto2: repeated
//! scalars may arrive packed or unpacked, and `prost` accepts both. Nothing here needs `protoc`.
//!
//! `TensorProto` keeps the value fields (`int64_data`, `int32_data`, `float_data`, `double_data`,
//! `raw_data`) besides `dims` and `data_type`: `Reshape`'s target shape, `ConstantOfShape`'s
//! shape, opset-13 `Squeeze`/`Unsqueeze`/`Split` axes and `Resize`'s scales are values, not
//! shapes (only constants of up to 4096 elements are decoded). `AttributeProto.g` (subgraphs of `If`/`Loop`/`Scan`) is not
//! decoded: those ops are reported as not inferable.

/// `ModelProto`: the file's top-level message.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Model {
    /// The IR version the file was written with.
    #[prost(int64, tag = "1")]
    pub(crate) ir_version: i64,
    /// The operator sets the graph uses, one per domain.
    #[prost(message, repeated, tag = "8")]
    pub(crate) opset_import: Vec<OperatorSetId>,
    /// The model's graph.
    #[prost(message, optional, tag = "7")]
    pub(crate) graph: Option<Graph>,
}

/// `OperatorSetIdProto`: a domain and its operator-set version.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct OperatorSetId {
    /// The domain; empty (or `ai.onnx`) for the default ONNX operators.
    #[prost(string, tag = "1")]
    pub(crate) domain: String,
    /// The operator-set version.
    #[prost(int64, tag = "2")]
    pub(crate) version: i64,
}

/// `GraphProto`: nodes in execution order, weights, inputs, outputs and known value types.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Graph {
    /// Nodes, topologically sorted.
    #[prost(message, repeated, tag = "1")]
    pub(crate) node: Vec<Node>,
    /// The graph's name.
    #[prost(string, tag = "2")]
    pub(crate) name: String,
    /// Weights (constant tensors).
    #[prost(message, repeated, tag = "5")]
    pub(crate) initializer: Vec<TensorProto>,
    /// Graph inputs; before IR 4 they also list every initializer.
    #[prost(message, repeated, tag = "11")]
    pub(crate) input: Vec<ValueInfo>,
    /// Graph outputs.
    #[prost(message, repeated, tag = "12")]
    pub(crate) output: Vec<ValueInfo>,
    /// Types and shapes of intermediate values, as written by ONNX's shape inference.
    #[prost(message, repeated, tag = "13")]
    pub(crate) value_info: Vec<ValueInfo>,
}

/// `NodeProto`: one operator application.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Node {
    /// Input value names; an empty name is an omitted optional input.
    #[prost(string, repeated, tag = "1")]
    pub(crate) input: Vec<String>,
    /// Output value names; an empty name is an omitted optional output.
    #[prost(string, repeated, tag = "2")]
    pub(crate) output: Vec<String>,
    /// The node's name (may be empty).
    #[prost(string, tag = "3")]
    pub(crate) name: String,
    /// The operator ("Conv", "Relu", ...).
    #[prost(string, tag = "4")]
    pub(crate) op_type: String,
    /// The operator's attributes.
    #[prost(message, repeated, tag = "5")]
    pub(crate) attribute: Vec<Attribute>,
    /// The operator's domain; empty for the default ONNX operators.
    #[prost(string, tag = "7")]
    pub(crate) domain: String,
}

/// `AttributeProto`: a named attribute value (the field that is set depends on its type).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Attribute {
    /// The attribute's name.
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    /// A float value.
    #[prost(float, tag = "2")]
    pub(crate) f: f32,
    /// An integer value.
    #[prost(int64, tag = "3")]
    pub(crate) i: i64,
    /// A string value.
    #[prost(bytes = "vec", tag = "4")]
    pub(crate) s: Vec<u8>,
    /// A tensor value (`Constant`'s `value`, `ConstantOfShape`'s `value`).
    #[prost(message, optional, tag = "5")]
    pub(crate) t: Option<TensorProto>,
    /// Float values.
    #[prost(float, repeated, tag = "7")]
    pub(crate) floats: Vec<f32>,
    /// Integer values.
    #[prost(int64, repeated, tag = "8")]
    pub(crate) ints: Vec<i64>,
    /// The attribute's type (`AttributeProto.AttributeType`).
    #[prost(int32, tag = "20")]
    pub(crate) r#type: i32,
}

/// `ValueInfoProto`: a value's name and type.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ValueInfo {
    /// The value's name.
    #[prost(string, tag = "1")]
    pub(crate) name: String,
    /// The value's type.
    #[prost(message, optional, tag = "2")]
    pub(crate) r#type: Option<TypeProto>,
}

/// `TypeProto`: only the tensor case is decoded; sequences, maps and optionals are not tensors.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TypeProto {
    /// Set when the value is a dense tensor.
    #[prost(message, optional, tag = "1")]
    pub(crate) tensor_type: Option<TensorType>,
}

/// `TypeProto.Tensor`: element type and shape.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TensorType {
    /// The element type (`TensorProto.DataType`).
    #[prost(int32, tag = "1")]
    pub(crate) elem_type: i32,
    /// The shape; absent when even the rank is unknown.
    #[prost(message, optional, tag = "2")]
    pub(crate) shape: Option<Shape>,
}

/// `TensorShapeProto`: one entry per dimension.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Shape {
    /// The dimensions, outermost first.
    #[prost(message, repeated, tag = "1")]
    pub(crate) dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension`: a fixed size, a symbolic name, or nothing (unknown).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Dimension {
    /// The dimension's value.
    #[prost(oneof = "DimValue", tags = "1, 2")]
    pub(crate) value: Option<DimValue>,
}

/// The `value` oneof of `TensorShapeProto.Dimension`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum DimValue {
    /// A fixed size.
    #[prost(int64, tag = "1")]
    Value(i64),
    /// A symbolic size, such as `"N"` or `"batch"`.
    #[prost(string, tag = "2")]
    Param(String),
}

/// `TensorProto`: a constant tensor's type, shape and (for small integer tensors) values.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TensorProto {
    /// The shape.
    #[prost(int64, repeated, tag = "1")]
    pub(crate) dims: Vec<i64>,
    /// The element type (`TensorProto.DataType`).
    #[prost(int32, tag = "2")]
    pub(crate) data_type: i32,
    /// Values of FLOAT tensors.
    #[prost(float, repeated, tag = "4")]
    pub(crate) float_data: Vec<f32>,
    /// Values of INT32, INT16, INT8, UINT16, UINT8 and BOOL tensors.
    #[prost(int32, repeated, tag = "5")]
    pub(crate) int32_data: Vec<i32>,
    /// Values of INT64 tensors.
    #[prost(int64, repeated, tag = "7")]
    pub(crate) int64_data: Vec<i64>,
    /// The initializer's name.
    #[prost(string, tag = "8")]
    pub(crate) name: String,
    /// Values of DOUBLE tensors.
    #[prost(double, repeated, tag = "10")]
    pub(crate) double_data: Vec<f64>,
    /// Values as little-endian bytes (any type).
    #[prost(bytes = "vec", tag = "9")]
    pub(crate) raw_data: Vec<u8>,
}
