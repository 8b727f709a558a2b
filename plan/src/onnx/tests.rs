//! Unit tests of the ONNX reader, on small models built here with `prost`'s encoder.

use prost::Message as _;

use super::proto::{
    Attribute, DimValue, Dimension, Graph, Model, Node, OperatorSetId, Shape, TensorProto,
    TensorType, TypeProto, ValueInfo,
};
use super::shapes::{self, dtype, Info, ShapeError};
use super::{parse, parse_with, Error, Options};
use crate::{Kind, Tensor};

/// A dimension of a graph input or declared value.
enum D {
    V(i64),
    P(&'static str),
    Unknown,
}

fn value(name: &str, elem_type: i32, dims: &[D]) -> ValueInfo {
    ValueInfo {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorType {
                elem_type,
                shape: Some(Shape {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            value: match d {
                                D::V(v) => Some(DimValue::Value(*v)),
                                D::P(p) => Some(DimValue::Param((*p).into())),
                                D::Unknown => None,
                            },
                        })
                        .collect(),
                }),
            }),
        }),
    }
}

fn f32_input(name: &str, dims: &[i64]) -> ValueInfo {
    value(
        name,
        dtype::FLOAT,
        &dims.iter().map(|&d| D::V(d)).collect::<Vec<_>>(),
    )
}

fn node(op: &str, inputs: &[&str], outputs: &[&str], attribute: Vec<Attribute>) -> Node {
    Node {
        input: inputs.iter().map(|&s| s.into()).collect(),
        output: outputs.iter().map(|&s| s.into()).collect(),
        name: format!("{op}_{}", outputs.first().copied().unwrap_or("")),
        op_type: op.into(),
        attribute,
        domain: String::new(),
    }
}

fn ints(name: &str, v: &[i64]) -> Attribute {
    Attribute {
        name: name.into(),
        ints: v.to_vec(),
        r#type: 7,
        ..Default::default()
    }
}

fn int(name: &str, i: i64) -> Attribute {
    Attribute {
        name: name.into(),
        i,
        r#type: 2,
        ..Default::default()
    }
}

fn string(name: &str, s: &str) -> Attribute {
    Attribute {
        name: name.into(),
        s: s.as_bytes().to_vec(),
        r#type: 3,
        ..Default::default()
    }
}

/// An initializer: INT64 with values, or FLOAT with only a shape.
fn init(name: &str, data_type: i32, dims: &[i64], int64_data: &[i64]) -> TensorProto {
    TensorProto {
        dims: dims.to_vec(),
        data_type,
        int64_data: int64_data.to_vec(),
        name: name.into(),
        ..Default::default()
    }
}

fn model(graph: Graph, opset: i64) -> Vec<u8> {
    Model {
        ir_version: 8,
        opset_import: vec![OperatorSetId {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(graph),
    }
    .encode_to_vec()
}

fn outputs(names: &[&str]) -> Vec<ValueInfo> {
    names
        .iter()
        .map(|&n| ValueInfo {
            name: n.into(),
            r#type: None,
        })
        .collect()
}

/// Input [1, 3, 8, 8] → Conv(4, 3×3, pad 1) → Relu → MaxPool(2, 2) → Flatten → Gemm(10).
fn small_cnn() -> Graph {
    Graph {
        node: vec![
            node(
                "Conv",
                &["x", "w", "b"],
                &["c"],
                vec![ints("pads", &[1, 1, 1, 1]), ints("kernel_shape", &[3, 3])],
            ),
            node("Relu", &["c"], &["r"], vec![]),
            node(
                "MaxPool",
                &["r"],
                &["p"],
                vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
            ),
            node("Flatten", &["p"], &["f"], vec![]),
            node("Gemm", &["f", "fw", "fb"], &["y"], vec![int("transB", 1)]),
        ],
        initializer: vec![
            init("w", dtype::FLOAT, &[4, 3, 3, 3], &[]),
            init("b", dtype::FLOAT, &[4], &[]),
            init("fw", dtype::FLOAT, &[10, 64], &[]),
            init("fb", dtype::FLOAT, &[10], &[]),
        ],
        input: vec![f32_input("x", &[1, 3, 8, 8])],
        output: outputs(&["y"]),
        ..Default::default()
    }
}

fn by_name<'a>(tensors: &'a [Tensor], name: &str) -> &'a Tensor {
    tensors
        .iter()
        .find(|t| t.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no tensor {name}"))
}

#[test]
fn small_cnn_sizes_steps_ids() {
    let t = parse(&model(small_cnn(), 13)).unwrap();
    let names: Vec<_> = t.iter().map(|t| t.name.as_deref().unwrap()).collect();
    assert_eq!(names, ["x", "c", "r", "p", "f", "y"]);
    assert!(t.iter().zip(0..).all(|(t, i)| t.id == i));
    let want = [
        // (bytes, first, last, kind)
        (3 * 64 * 4, 0, 0, Kind::Input),
        (4 * 64 * 4, 0, 1, Kind::Intermediate),
        (4 * 64 * 4, 1, 2, Kind::Intermediate),
        (4 * 16 * 4, 2, 3, Kind::Intermediate),
        (64 * 4, 3, 4, Kind::Intermediate),
        (10 * 4, 4, 4, Kind::Output),
    ];
    for (t, &(bytes, first, last, kind)) in t.iter().zip(&want) {
        assert_eq!(
            (t.bytes, t.first, t.last, t.kind),
            (bytes, first, last, kind),
            "{t:?}"
        );
        assert_eq!((t.offset, t.inplace), (None, None));
    }
    assert_eq!(t[1].op.as_deref(), Some("Conv"));
    assert_eq!(t[1].inputs, [0]);
    assert_eq!(t[5].inputs, [4]);
    assert_eq!(t[0].op, None);
}

#[test]
fn constant_subgraphs_are_dropped_and_steps_stay_dense() {
    // Weights made at run time from their shapes, as in the zoo's "light" models; a per-channel
    // scale unsqueezed and multiplied in; a Reshape to a Constant shape; a Shape → Gather →
    // Concat shape computation.
    let g = Graph {
        node: vec![
            node("ConstantOfShape", &["s_shape"], &["s"], vec![]),
            node("Unsqueeze", &["s"], &["s3"], vec![ints("axes", &[1, 2])]),
            node("Mul", &["x", "s3"], &["m"], vec![]),
            node(
                "Constant",
                &[],
                &["target"],
                vec![Attribute {
                    name: "value".into(),
                    t: Some(init("", dtype::INT64, &[2], &[0, -1])),
                    r#type: 4,
                    ..Default::default()
                }],
            ),
            node("Reshape", &["m", "target"], &["flat"], vec![]),
            node("Shape", &["m"], &["shape"], vec![]),
            node("Gather", &["shape", "zero"], &["n"], vec![]),
            node("Unsqueeze", &["n"], &["n1"], vec![ints("axes", &[0])]),
            node("Concat", &["n1", "minus1"], &["t2"], vec![int("axis", 0)]),
            node("Reshape", &["flat", "t2"], &["flat2"], vec![]),
            node("Relu", &["flat2"], &["y"], vec![]),
        ],
        initializer: vec![
            init("s_shape", dtype::INT64, &[1], &[3]),
            init("zero", dtype::INT64, &[], &[0]),
            init("minus1", dtype::INT64, &[1], &[-1]),
        ],
        input: vec![f32_input("x", &[2, 3, 4, 4])],
        output: outputs(&["y"]),
        ..Default::default()
    };
    let t = parse(&model(g, 9)).unwrap();
    let names: Vec<_> = t.iter().map(|t| t.name.as_deref().unwrap()).collect();
    assert_eq!(names, ["x", "m", "flat", "flat2", "y"]);
    let steps: Vec<_> = t.iter().map(|t| (t.first, t.last)).collect();
    assert_eq!(steps, [(0, 0), (0, 1), (1, 2), (2, 3), (3, 3)]);
    assert!(t.iter().all(|t| t.bytes == 2 * 48 * 4));
    // The Mul's inputs: the activation only, not the folded scale.
    assert_eq!(t[1].inputs, [0]);
}

#[test]
fn ir3_weights_listed_as_inputs_are_not_inputs() {
    let mut g = small_cnn();
    g.input.push(f32_input("w", &[4, 3, 3, 3]));
    let t = parse(&model(g, 9)).unwrap();
    assert_eq!(t.len(), 6);
    assert_eq!(t.iter().filter(|t| t.kind == Kind::Input).count(), 1);
}

#[test]
fn dynamic_dimension_names_tensor_and_dimension_and_can_be_pinned() {
    let mut g = small_cnn();
    g.input = vec![value(
        "x",
        dtype::FLOAT,
        &[D::P("N"), D::V(3), D::V(8), D::V(8)],
    )];
    let bytes = model(g, 13);
    let e = parse(&bytes).unwrap_err();
    assert!(
        matches!(&e, Error::DynamicDim { tensor, dim: 0, param: Some(p) } if tensor == "x" && p == "N")
    );
    let msg = e.to_string();
    assert!(msg.contains("`x`") && msg.contains("`N`"), "{msg}");
    assert!(
        msg.contains("--dim N=VALUE") && msg.contains("make_dynamic_shape_fixed"),
        "{msg}"
    );

    let t = parse_with(&bytes, &Options::default().dim("N", 2)).unwrap();
    assert_eq!(t[0].bytes, 2 * 3 * 64 * 4);
    assert_eq!(by_name(&t, "y").bytes, 2 * 10 * 4);
}

#[test]
fn unknown_dimension_is_an_error() {
    let mut g = small_cnn();
    g.input = vec![value(
        "x",
        dtype::FLOAT,
        &[D::V(1), D::V(3), D::Unknown, D::V(8)],
    )];
    let e = parse(&model(g, 13)).unwrap_err();
    assert!(matches!(&e, Error::DynamicDim { tensor, dim: 2, param: None } if tensor == "x"));
    assert!(e.to_string().contains("--input_name x"), "{e}");
}

#[test]
fn unknown_op_names_node_op_and_output_unless_the_file_gives_the_shape() {
    let mut g = small_cnn();
    g.node[1] = node("FancyRelu", &["c"], &["r"], vec![]);
    let e = parse(&model(g.clone(), 13)).unwrap_err();
    assert!(
        matches!(&e, Error::Shape { node, op, output, source }
            if node == "FancyRelu_r" && op == "FancyRelu" && output == "r"
            && **source == ShapeError::Unsupported),
        "{e:?}"
    );
    assert!(e.to_string().contains("infer_shapes"), "{e}");

    // With value_info (what onnx.shape_inference writes), the file's shape is used.
    g.value_info = vec![f32_input("r", &[1, 4, 8, 8])];
    let t = parse(&model(g, 13)).unwrap();
    assert_eq!(by_name(&t, "r").bytes, 4 * 64 * 4);
    assert_eq!(by_name(&t, "r").op.as_deref(), Some("FancyRelu"));
}

#[test]
fn custom_domain_op_says_its_domain() {
    let mut g = small_cnn();
    g.node[1].domain = "com.example".into();
    let e = parse(&model(g, 13)).unwrap_err();
    assert!(e.to_string().contains("com.example.Relu"), "{e}");
}

#[test]
fn control_flow_is_an_error_even_with_declared_shapes() {
    let mut g = small_cnn();
    g.node[1] = node(
        "If",
        &["c"],
        &["r"],
        vec![Attribute {
            name: "then_branch".into(),
            r#type: 5,
            ..Default::default()
        }],
    );
    g.value_info = vec![f32_input("r", &[1, 4, 8, 8])];
    let e = parse(&model(g, 13)).unwrap_err();
    assert!(
        matches!(&e, Error::ControlFlow { node, op } if node == "If_r" && op == "If"),
        "{e:?}"
    );
}

#[test]
fn unknown_input_name_is_an_error() {
    let mut g = small_cnn();
    g.node[2].input[0] = "nope".into();
    let e = parse(&model(g, 13)).unwrap_err();
    assert!(
        matches!(&e, Error::UnknownInput { node, op, input } if node == "MaxPool_p" && op == "MaxPool" && input == "nope"),
        "{e:?}"
    );
}

#[test]
fn unknown_output_and_duplicate_value_are_errors() {
    let mut g = small_cnn();
    g.output = outputs(&["nope"]);
    assert!(
        matches!(parse(&model(g, 13)), Err(Error::UnknownOutput { tensor }) if tensor == "nope")
    );
    let mut g = small_cnn();
    g.node[2].output[0] = "c".into();
    assert!(matches!(parse(&model(g, 13)), Err(Error::Duplicate { tensor, .. }) if tensor == "c"));
}

#[test]
fn truncated_and_garbage_files_are_errors_not_panics() {
    let bytes = model(small_cnn(), 13);
    assert!(matches!(
        parse(&bytes[..bytes.len() / 2]),
        Err(Error::Decode(_))
    ));
    // Every proper prefix is an error: a cut inside the graph fails to decode, and a cut between
    // top-level fields loses the opset (written after the graph, field 8 after 7) or the graph.
    for n in 0..bytes.len() {
        assert!(parse(&bytes[..n]).is_err(), "prefix of {n} bytes");
    }
    assert!(matches!(parse(&[]), Err(Error::NoOpset)));
    assert!(matches!(
        parse(b"\xff\xff\xff\xff\xff\xff"),
        Err(Error::Decode(_))
    ));
    let no_graph = Model {
        ir_version: 8,
        opset_import: vec![OperatorSetId {
            domain: String::new(),
            version: 13,
        }],
        graph: None,
    };
    assert!(matches!(
        parse(&no_graph.encode_to_vec()),
        Err(Error::NoGraph)
    ));
    let path = std::path::Path::new("/nonexistent/model.onnx");
    assert!(matches!(super::read(path), Err(Error::Io { .. })));
}

#[test]
fn empty_and_string_tensors_are_errors() {
    let mut g = small_cnn();
    g.input = vec![f32_input("x", &[0, 3, 8, 8])];
    assert!(matches!(parse(&model(g, 13)), Err(Error::Empty { tensor, .. }) if tensor == "x"));
    let mut g = small_cnn();
    g.input = vec![value("x", 8, &[D::V(1)])];
    g.node = vec![node("Identity", &["x"], &["y"], vec![])];
    assert!(
        matches!(parse(&model(g, 13)), Err(Error::Dtype { tensor, dtype: 8 }) if tensor == "x")
    );
}

#[test]
fn inconsistent_node_is_a_shape_error() {
    let mut g = small_cnn();
    g.initializer[0].dims = vec![4, 2, 3, 3]; // 2 channels, the input has 3
    let e = parse(&model(g, 13)).unwrap_err();
    assert!(
        matches!(&e, Error::Shape { op, source, .. } if op == "Conv" && matches!(**source, ShapeError::Mismatch { .. })),
        "{e:?}"
    );
}

fn info(shape: &[u64]) -> Info {
    Info {
        dtype: dtype::FLOAT,
        shape: shape.to_vec(),
        value: None,
        floats: None,
    }
}

fn consts(v: &[i64]) -> Info {
    Info {
        dtype: dtype::INT64,
        shape: vec![v.len() as u64],
        value: Some(v.to_vec()),
        floats: None,
    }
}

fn infer(n: &Node, opset: i64, inputs: &[Info]) -> Result<Vec<Vec<u64>>, ShapeError> {
    let refs: Vec<_> = inputs.iter().map(Some).collect();
    shapes::infer(n, opset, &refs).map(|v| v.into_iter().map(|i| i.shape).collect())
}

#[test]
fn conv_pads_strides_dilations_groups_auto_pad() {
    let x = info(&[1, 8, 224, 224]);
    let w = info(&[16, 4, 7, 7]);
    let conv = |attrs| node("Conv", &["x", "w"], &["y"], attrs);
    let attrs = vec![
        ints("pads", &[3, 3, 3, 3]),
        ints("strides", &[2, 2]),
        int("group", 2),
    ];
    assert_eq!(
        infer(&conv(attrs), 13, &[x.clone(), w.clone()]).unwrap(),
        [[1, 16, 112, 112]]
    );
    let attrs = vec![ints("dilations", &[2, 2]), int("group", 2)];
    assert_eq!(
        infer(&conv(attrs), 13, &[x.clone(), w.clone()]).unwrap()[0],
        [1, 16, 212, 212]
    );
    let attrs = vec![
        string("auto_pad", "SAME_UPPER"),
        ints("strides", &[3, 3]),
        int("group", 2),
    ];
    assert_eq!(
        infer(&conv(attrs), 13, &[x.clone(), w.clone()]).unwrap()[0],
        [1, 16, 75, 75]
    );
    let attrs = vec![
        string("auto_pad", "VALID"),
        ints("strides", &[2, 2]),
        int("group", 2),
    ];
    assert_eq!(
        infer(&conv(attrs), 13, &[x.clone(), w.clone()]).unwrap()[0],
        [1, 16, 109, 109]
    );
    // group 1: 8 input channels against 4 per group
    assert!(matches!(
        infer(&conv(vec![]), 13, &[x, w]),
        Err(ShapeError::Mismatch { .. })
    ));
    // A kernel larger than the input.
    assert!(matches!(
        infer(
            &conv(vec![]),
            13,
            &[info(&[1, 4, 3, 3]), info(&[1, 4, 5, 5])]
        ),
        Err(ShapeError::Window { .. })
    ));
}

#[test]
fn pooling_ceil_mode_and_global() {
    let x = info(&[1, 64, 112, 112]);
    let pool = |ceil| {
        node(
            "MaxPool",
            &["x"],
            &["y"],
            vec![
                ints("kernel_shape", &[3, 3]),
                ints("strides", &[2, 2]),
                int("ceil_mode", ceil),
            ],
        )
    };
    assert_eq!(
        infer(&pool(0), 13, std::slice::from_ref(&x)).unwrap()[0],
        [1, 64, 55, 55]
    );
    assert_eq!(
        infer(&pool(1), 13, std::slice::from_ref(&x)).unwrap()[0],
        [1, 64, 56, 56]
    );
    // ceil_mode's last window must start inside the input: 5, k2, s2, pad 1 → 3 (not 4).
    let n = node(
        "AveragePool",
        &["x"],
        &["y"],
        vec![
            ints("kernel_shape", &[2]),
            ints("strides", &[2]),
            ints("pads", &[1, 1]),
            int("ceil_mode", 1),
        ],
    );
    assert_eq!(infer(&n, 13, &[info(&[1, 1, 5])]).unwrap()[0], [1, 1, 3]);
    let g = node("GlobalAveragePool", &["x"], &["y"], vec![]);
    assert_eq!(infer(&g, 13, &[x]).unwrap()[0], [1, 64, 1, 1]);
}

#[test]
fn broadcasting_matmul_gemm() {
    assert_eq!(shapes::broadcast(&[2, 1, 4], &[3, 1]).unwrap(), [2, 3, 4]);
    assert_eq!(shapes::broadcast(&[], &[5]).unwrap(), [5]);
    assert!(shapes::broadcast(&[2, 3], &[4, 3]).is_err());
    let add = node("Sum", &["a", "b", "c"], &["y"], vec![]);
    assert_eq!(
        infer(
            &add,
            13,
            &[info(&[1, 64, 1, 1]), info(&[1, 64, 7, 7]), info(&[7])]
        )
        .unwrap()[0],
        [1, 64, 7, 7]
    );
    let mm = node("MatMul", &["a", "b"], &["y"], vec![]);
    assert_eq!(
        infer(&mm, 13, &[info(&[2, 1, 3, 4]), info(&[5, 4, 6])]).unwrap()[0],
        [2, 5, 3, 6]
    );
    assert_eq!(
        infer(&mm, 13, &[info(&[4]), info(&[4, 6])]).unwrap()[0],
        [6]
    );
    assert!(infer(&mm, 13, &[info(&[3, 4]), info(&[5, 6])]).is_err());
    let gemm = node("Gemm", &["a", "b"], &["y"], vec![int("transA", 1)]);
    assert_eq!(
        infer(&gemm, 13, &[info(&[4, 3]), info(&[4, 6])]).unwrap()[0],
        [3, 6]
    );
}

#[test]
fn reshape_transpose_concat_split_squeeze() {
    let r = node("Reshape", &["x", "s"], &["y"], vec![]);
    let x = info(&[2, 3, 4]);
    assert_eq!(
        infer(&r, 13, &[x.clone(), consts(&[0, -1])]).unwrap()[0],
        [2, 12]
    );
    assert!(matches!(
        infer(&r, 13, &[x.clone(), consts(&[5, -1])]),
        Err(ShapeError::Reshape { .. })
    ));
    assert!(matches!(
        infer(&r, 13, &[x.clone(), info(&[2])]),
        Err(ShapeError::NotConstant { index: 1 })
    ));
    let t = node("Transpose", &["x"], &["y"], vec![ints("perm", &[2, 0, 1])]);
    assert_eq!(
        infer(&t, 13, std::slice::from_ref(&x)).unwrap()[0],
        [4, 2, 3]
    );
    let t = node("Transpose", &["x"], &["y"], vec![ints("perm", &[0, 0, 1])]);
    assert!(infer(&t, 13, std::slice::from_ref(&x)).is_err());
    let c = node("Concat", &["a", "b"], &["y"], vec![int("axis", -1)]);
    assert_eq!(
        infer(&c, 13, &[x.clone(), info(&[2, 3, 5])]).unwrap()[0],
        [2, 3, 9]
    );
    assert!(infer(&c, 13, &[x.clone(), info(&[2, 4, 5])]).is_err());
    let s = node("Split", &["x"], &["a", "b"], vec![int("axis", 2)]);
    assert_eq!(
        infer(&s, 11, std::slice::from_ref(&x)).unwrap(),
        [[2, 3, 2], [2, 3, 2]]
    );
    let s = node("Split", &["x", "split"], &["a", "b"], vec![int("axis", 2)]);
    assert_eq!(
        infer(&s, 13, &[x.clone(), consts(&[1, 3])]).unwrap(),
        [[2, 3, 1], [2, 3, 3]]
    );
    let sq = node("Squeeze", &["x", "axes"], &["y"], vec![]);
    assert_eq!(
        infer(&sq, 13, &[info(&[1, 3, 1]), consts(&[-1])]).unwrap()[0],
        [1, 3]
    );
    assert!(infer(&sq, 13, &[x.clone(), consts(&[0])]).is_err());
    let un = node("Unsqueeze", &["x", "axes"], &["y"], vec![]);
    assert_eq!(
        infer(&un, 13, &[x.clone(), consts(&[0, -1])]).unwrap()[0],
        [1, 2, 3, 4, 1]
    );
    let f = node("Flatten", &["x"], &["y"], vec![int("axis", 0)]);
    assert_eq!(infer(&f, 13, &[x]).unwrap()[0], [1, 24]);
}

#[test]
fn dropout_mask_type_depends_on_opset() {
    let n = node("Dropout", &["x"], &["y", "mask"], vec![]);
    let x = info(&[1, 10]);
    let refs = [Some(&x)];
    assert_eq!(shapes::infer(&n, 9, &refs).unwrap()[1].dtype, dtype::FLOAT);
    assert_eq!(shapes::infer(&n, 12, &refs).unwrap()[1].dtype, dtype::BOOL);
}

fn floats(v: &[f64]) -> Info {
    Info {
        dtype: dtype::FLOAT,
        shape: vec![v.len() as u64],
        value: None,
        floats: Some(v.to_vec()),
    }
}

/// Each case agrees with `onnx.shape_inference.infer_shapes` (onnx 1.23) on the same node.
#[test]
fn conv_transpose_slice_pad_expand_tile_resize() {
    let x = info(&[1, 4, 5, 6]);
    let ct = node(
        "ConvTranspose",
        &["x", "w"],
        &["y"],
        vec![
            ints("strides", &[2, 2]),
            ints("pads", &[1, 1, 1, 1]),
            ints("output_padding", &[1, 1]),
            int("group", 2),
        ],
    );
    // 2 × (5 - 1) + 1 + 3 - 2 = 10; 2 × (6 - 1) + 1 + 3 - 2 = 12; 2 × 2 groups of outputs
    assert_eq!(
        infer(&ct, 13, &[x.clone(), info(&[4, 2, 3, 3])]).unwrap()[0],
        [1, 4, 10, 12]
    );
    let sl = node("Slice", &["x", "s", "e", "a", "p"], &["y"], vec![]);
    let ct_out = info(&[1, 4, 10, 12]);
    // axis 2: 1..7 step 2 → 3; axis 3: from -1 (11) down to the start, step -2 → 6
    let args = [
        ct_out,
        consts(&[1, -1]),
        consts(&[7, -100]),
        consts(&[2, 3]),
        consts(&[2, -2]),
    ];
    assert_eq!(infer(&sl, 13, &args).unwrap()[0], [1, 4, 3, 6]);
    // A sliced 1-D constant keeps its values (Shape → Slice → Concat in PyTorch exports).
    let (v, s, e) = (consts(&[1, 3, 224, 224]), consts(&[2]), consts(&[4]));
    let sl = node("Slice", &["x", "s", "e"], &["y"], vec![]);
    let out = shapes::infer(&sl, 13, &[Some(&v), Some(&s), Some(&e)]).unwrap();
    assert_eq!(out[0].value.as_deref(), Some(&[224, 224][..]));

    let pad = node("Pad", &["x", "p"], &["y"], vec![]);
    let args = [info(&[1, 4, 3, 6]), consts(&[0, 0, 1, 2, 0, 0, 3, -1])];
    assert_eq!(infer(&pad, 13, &args).unwrap()[0], [1, 4, 7, 7]);
    let args = [info(&[1, 4, 3, 6]), consts(&[0, 0, 0, -7, 0, 0, 0, 0])];
    assert!(infer(&pad, 13, &args).is_err());
    let ex = node("Expand", &["x", "s"], &["y"], vec![]);
    assert_eq!(
        infer(&ex, 13, &[info(&[1, 4, 7, 7]), consts(&[2, 1, 1, 1])]).unwrap()[0],
        [2, 4, 7, 7]
    );
    let tile = node("Tile", &["x", "r"], &["y"], vec![]);
    assert_eq!(
        infer(&tile, 13, &[info(&[2, 4, 7, 7]), consts(&[1, 2, 1, 1])]).unwrap()[0],
        [2, 8, 7, 7]
    );
    let rs = node("Resize", &["x", "", "scales"], &["y"], vec![]);
    let refs = [Some(&x), None, Some(&floats(&[1.0, 1.0, 2.0, 1.5]))];
    assert_eq!(
        shapes::infer(&rs, 13, &refs).unwrap()[0].shape,
        [1, 4, 10, 9]
    );
    let rs = node("Resize", &["x", "", "", "sizes"], &["y"], vec![]);
    let sizes = consts(&[1, 4, 5, 7]);
    let refs = [Some(&x), None, None, Some(&sizes)];
    assert_eq!(
        shapes::infer(&rs, 13, &refs).unwrap()[0].shape,
        [1, 4, 5, 7]
    );
    let up = node("Upsample", &["x", "scales"], &["y"], vec![]);
    let up_in = [x.clone(), floats(&[1.0, 1.0, 2.0, 2.0])];
    assert_eq!(infer(&up, 9, &up_in).unwrap()[0], [1, 4, 10, 12]);
    assert!(matches!(
        infer(&up, 9, &[x.clone(), info(&[4])]),
        Err(ShapeError::NotConstant { index: 1 })
    ));
}

#[test]
fn reductions_argmax_topk_and_folded_arithmetic() {
    let x = info(&[2, 8, 7, 7]);
    let rm = node(
        "ReduceMean",
        &["x"],
        &["y"],
        vec![ints("axes", &[1]), int("keepdims", 0)],
    );
    assert_eq!(
        infer(&rm, 13, std::slice::from_ref(&x)).unwrap()[0],
        [2, 7, 7]
    );
    let rs = node("ReduceSum", &["x", "a"], &["y"], vec![]);
    assert_eq!(
        infer(&rs, 13, &[x.clone(), consts(&[1])]).unwrap()[0],
        [2, 1, 7, 7]
    );
    let all = node("ReduceMax", &["x"], &["y"], vec![]);
    assert_eq!(
        infer(&all, 13, std::slice::from_ref(&x)).unwrap()[0],
        [1, 1, 1, 1]
    );
    let am = node(
        "ArgMax",
        &["x"],
        &["y"],
        vec![int("axis", -1), int("keepdims", 0)],
    );
    let refs = [Some(&x)];
    let out = shapes::infer(&am, 13, &refs).unwrap();
    assert_eq!(
        (out[0].dtype, out[0].shape.as_slice()),
        (dtype::INT64, &[2, 8, 7][..])
    );
    let topk = node("TopK", &["x", "k"], &["v", "i"], vec![int("axis", 2)]);
    assert_eq!(
        infer(&topk, 13, &[x.clone(), consts(&[3])]).unwrap(),
        [[2, 8, 3, 7], [2, 8, 3, 7]]
    );
    // Shape arithmetic folds: [1, 3, 224, 224] / 2 = [0, 1, 112, 112]; division by 0 does not.
    let div = node("Div", &["a", "b"], &["y"], vec![]);
    let (a, two, zero) = (consts(&[1, 3, 224, 224]), consts(&[2]), consts(&[0]));
    let out = shapes::infer(&div, 13, &[Some(&a), Some(&two)]).unwrap();
    assert_eq!(out[0].value.as_deref(), Some(&[0, 1, 112, 112][..]));
    let out = shapes::infer(&div, 13, &[Some(&a), Some(&zero)]).unwrap();
    assert_eq!(out[0].value, None);
}

#[test]
fn errors_can_cross_threads() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<Error>();
    send_sync::<ShapeError>();
}
