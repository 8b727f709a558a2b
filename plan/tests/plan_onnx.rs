//! The ONNX reader on real model graphs: the nine model-zoo CNNs the `onnx` wheel ships
//! (`scripts/onnx-models.sh` fetches them; `USERDMA_ONNX_MODELS` names their directory, and when
//! it is unset this test runs the script itself). Checks every record's invariants and sizes
//! computed by hand, and prints each model's tensor count, naive size and lower bound
//! (`cargo test --test plan_onnx -- --nocapture`).

mod onnx_models;

use onnx_models::models_dir;
use std::path::Path;

use userdma_plan::{onnx, Kind, Tensor};

/// The arena alignment the planner defaults to.
const ALIGN: u64 = 256;

/// The lower bound on the arena: the largest sum of live aligned sizes over all steps, and a step
/// where it occurs (a local helper: the planner is not on this branch).
fn lower_bound(tensors: &[Tensor]) -> (u64, u32) {
    let steps = tensors.iter().map(|t| t.last).max().unwrap_or(0);
    (0..=steps)
        .map(|s| {
            let live: u64 = tensors
                .iter()
                .filter(|t| t.first <= s && s <= t.last)
                .map(|t| t.bytes.div_ceil(ALIGN) * ALIGN)
                .sum();
            (live, s)
        })
        .max_by_key(|&(live, s)| (live, std::cmp::Reverse(s)))
        .unwrap_or((0, 0))
}

/// The first tensor `op` produces.
fn first_of<'a>(tensors: &'a [Tensor], op: &str) -> &'a Tensor {
    tensors
        .iter()
        .find(|t| t.op.as_deref() == Some(op))
        .unwrap_or_else(|| panic!("no {op}"))
}

const F32: u64 = 4;

/// Per model: file stem, tensor count (one graph input plus one per output of each node that
/// computes activations), the first Conv's output bytes and the first MaxPool's, by hand.
const MODELS: [(&str, usize, u64, u64); 9] = [
    // conv1 11×11/4 on 224: (224-11)/4+1 = 54, 96 channels; pool 3×3/2: (54-3)/2+1 = 26
    (
        "light_bvlc_alexnet",
        27,
        96 * 54 * 54 * F32,
        96 * 26 * 26 * F32,
    ),
    // conv1 7×7/2 pad 3: 112, 64 channels; pool 3×3/2 pad 1: 56
    (
        "light_densenet121",
        669,
        64 * 112 * 112 * F32,
        64 * 56 * 56 * F32,
    ),
    // conv1 as DenseNet's; pool 3×3/2 no pad: (112-3)/2+1 = 55
    (
        "light_inception_v1",
        145,
        64 * 112 * 112 * F32,
        64 * 55 * 55 * F32,
    ),
    (
        "light_inception_v2",
        372,
        64 * 112 * 112 * F32,
        64 * 56 * 56 * F32,
    ),
    (
        "light_resnet50",
        177,
        64 * 112 * 112 * F32,
        64 * 56 * 56 * F32,
    ),
    // conv1 3×3/2 pad 1: 112, 24 channels; pool 3×3/2 pad 1: 56
    (
        "light_shufflenet",
        204,
        24 * 112 * 112 * F32,
        24 * 56 * 56 * F32,
    ),
    // SqueezeNet 1.1: conv1 3×3/2: (224-3)/2+1 = 111, 64 channels; pool 3×3/2: 55
    (
        "light_squeezenet",
        68,
        64 * 111 * 111 * F32,
        64 * 55 * 55 * F32,
    ),
    // conv1_1 3×3 pad 1: 224, 64 channels; pool 2×2/2: 112
    (
        "light_vgg19",
        49,
        64 * 224 * 224 * F32,
        64 * 112 * 112 * F32,
    ),
    // conv1 7×7/2: (224-7)/2+1 = 109, 96 channels; pool 3×3/2: (109-3)/2+1 = 54
    (
        "light_zfnet512",
        23,
        96 * 109 * 109 * F32,
        96 * 54 * 54 * F32,
    ),
];

#[test]
fn zoo_models_read_with_known_sizes() {
    let dir = models_dir();
    println!(
        "{:<20} {:>7} {:>13} {:>13} {:>6} {:>8}",
        "model", "tensors", "naive B", "lower bd B", "at", "naive/lb"
    );
    for (stem, count, conv1, pool1) in MODELS {
        let path = dir.join(format!("{stem}.onnx"));
        let t = onnx::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(t.len(), count, "{stem}: tensor count");
        assert_eq!(
            onnx::read(&path).unwrap(),
            t,
            "{stem}: reading is deterministic"
        );

        let steps = t.iter().map(|t| t.last).max().unwrap();
        for (i, x) in t.iter().enumerate() {
            assert_eq!(x.id, i as u64, "{stem}: ids are dense");
            assert!(x.bytes > 0, "{stem}: {x:?}");
            assert!(x.first <= x.last, "{stem}: {x:?}");
            assert!(x.inputs.iter().all(|&j| j < x.id), "{stem}: {x:?}");
            assert!(x.name.is_some() && x.offset.is_none() && x.inplace.is_none());
            match x.kind {
                Kind::Input => assert!(x.first == 0 && x.op.is_none() && x.inputs.is_empty()),
                Kind::Output => assert_eq!(x.last, steps, "{stem}: {x:?}"),
                Kind::Intermediate => assert!(x.op.is_some() && !x.inputs.is_empty()),
            }
        }
        let inputs: Vec<_> = t.iter().filter(|x| x.kind == Kind::Input).collect();
        assert_eq!(inputs.len(), 1, "{stem}: one graph input");
        assert_eq!(
            inputs[0].bytes,
            3 * 224 * 224 * F32,
            "{stem}: 1×3×224×224 f32"
        );
        let outputs: Vec<_> = t.iter().filter(|x| x.kind == Kind::Output).collect();
        assert_eq!(outputs.len(), 1, "{stem}: one graph output");
        assert_eq!(outputs[0].bytes, 1000 * F32, "{stem}: 1000 classes, f32");
        assert_eq!(first_of(&t, "Conv").bytes, conv1, "{stem}: first Conv");
        assert_eq!(
            first_of(&t, "MaxPool").bytes,
            pool1,
            "{stem}: first MaxPool"
        );
        // Every step but the input's has exactly one producing node; steps are dense.
        let mut produced = vec![false; steps as usize + 1];
        t.iter()
            .filter(|x| x.kind != Kind::Input)
            .for_each(|x| produced[x.first as usize] = true);
        assert!(produced.iter().all(|&p| p), "{stem}: dense steps");

        let naive: u64 = t.iter().map(|x| x.bytes).sum();
        let (lb, at) = lower_bound(&t);
        assert!(lb <= naive.next_multiple_of(ALIGN) * 2 && lb >= outputs[0].bytes);
        println!(
            "{stem:<20} {:>7} {naive:>13} {lb:>13} {at:>6} {:>8.2}",
            t.len(),
            naive as f64 / lb as f64
        );
    }
}

#[test]
fn resnet50_stages() {
    let t = onnx::read(&models_dir().join("light_resnet50.onnx")).unwrap();
    let input = &t[0];
    assert_eq!(input.name.as_deref(), Some("gpu_0/data_0"));
    assert_eq!(input.bytes, 602_112);
    let out = t.iter().find(|x| x.kind == Kind::Output).unwrap();
    assert_eq!(
        (out.name.as_deref(), out.op.as_deref(), out.bytes),
        (Some("gpu_0/softmax_1"), Some("Softmax"), 4000)
    );
    // 53 convolutions, 53 batch norms, 49 ReLUs, 16 residual Sums, pool, avgpool, reshape, FC,
    // softmax: 176 nodes after the 239 ConstantOfShape weight nodes are dropped.
    assert_eq!(
        t.iter().filter(|x| x.op.as_deref() == Some("Conv")).count(),
        53
    );
    assert_eq!(t.iter().map(|x| x.last).max(), Some(175));
    // Stage outputs (residual sums): 256×56×56, 512×28×28, 1024×14×14, 2048×7×7.
    let sums: Vec<u64> = t
        .iter()
        .filter(|x| x.op.as_deref() == Some("Sum"))
        .map(|x| x.bytes / F32)
        .collect();
    assert_eq!(sums.len(), 16);
    assert_eq!(sums[0], 256 * 56 * 56);
    assert_eq!(sums[3], 512 * 28 * 28);
    assert_eq!(sums[7], 1024 * 14 * 14);
    assert_eq!(sums[15], 2048 * 7 * 7);
    assert_eq!(first_of(&t, "AveragePool").bytes, 2048 * F32);
    assert_eq!(first_of(&t, "Gemm").bytes, 1000 * F32);
    // An identity block's Sum reads the block's input (the skip connection: the ReLU after the
    // previous block's Sum), which so lives across the block's 8 nodes (3 × Conv + BN, 2 ReLUs).
    let s = t
        .iter()
        .filter(|x| x.op.as_deref() == Some("Sum"))
        .nth(1)
        .unwrap();
    assert_eq!(s.inputs.len(), 2);
    let skip = s
        .inputs
        .iter()
        .map(|&i| &t[i as usize])
        .min_by_key(|x| x.first)
        .unwrap();
    assert_eq!(skip.op.as_deref(), Some("Relu"));
    assert_eq!(
        (skip.last, s.first - skip.first),
        (s.first, 9),
        "{skip:?} {s:?}"
    );
}

/// The fuzz seed, an opset-13 model made with `onnx.helper` (axes and split sizes as inputs,
/// `SAME_UPPER`, groups, `ceil_mode`, a Shape → Gather → Concat → Reshape computation): sizes
/// agree with `onnx.shape_inference.infer_shapes` and, for the Reshape it cannot fold, by hand.
#[test]
fn opset13_seed_model() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/seeds/plan_onnx/small-cnn-opset13.onnx"
    );
    let t = onnx::read(path.as_ref()).unwrap();
    let got: Vec<(&str, u64, u32, u32)> = t
        .iter()
        .map(|x| (x.name.as_deref().unwrap(), x.bytes / F32, x.first, x.last))
        .collect();
    #[rustfmt::skip]
    let want = [
        ("x", 3 * 16 * 16, 0, 0),
        ("c1", 8 * 8 * 8, 0, 1),  // 3×3/2 pad 1: 8×8
        ("b1", 8 * 8 * 8, 1, 2),
        ("r1", 8 * 8 * 8, 2, 3),
        ("c2", 8 * 8 * 8, 3, 4),  // SAME_UPPER, 2 groups of 4
        ("p1", 8 * 4 * 4, 4, 5),  // 3×3/2 ceil: ceil(5/2)+1 = 4
        ("sa", 4 * 4 * 4, 5, 6),
        ("sb", 4 * 4 * 4, 5, 6),
        ("cat", 8 * 4 * 4, 6, 7),
        ("u5", 8 * 4 * 4, 7, 8),
        ("t5", 8 * 4 * 4, 8, 9),
        ("sq", 8 * 4 * 4, 9, 10), // Shape(sq) is folded: sq's last reader is the Reshape
        ("flat", 128, 10, 11),    // [Shape(sq)[0], -1] = [1, 128]
        ("d", 128, 11, 12),
        ("g", 10, 12, 13),
        ("y", 10, 13, 13),
    ];
    assert_eq!(got, want);
}

/// A path that names no model is refused with what it is, without reading it all: `/dev/zero`
/// (its first byte starts no protobuf field) after one byte, a sparse file past protobuf's 2 GiB
/// from its size.
#[test]
fn a_device_or_a_file_too_large_is_refused_without_reading_it() {
    match onnx::read(Path::new("/dev/zero")) {
        Err(onnx::Error::NotAModel { byte: 0, .. }) => {}
        other => panic!("{other:?}"),
    }
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.onnx");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(onnx::MAX_MODEL_BYTES + 1)
        .unwrap();
    let err = onnx::read(&big).unwrap_err();
    assert!(
        matches!(err, onnx::Error::TooLarge { limit, .. } if limit == 2 << 30),
        "{err}"
    );
    assert!(err.to_string().contains("external data"), "{err}");
    let text = dir.path().join("model.onnx");
    // Text whose first byte could start a field ('a': field 12, wire type 1) fails to decode;
    // one whose first byte cannot ('n': wire type 6) is refused at once.
    std::fs::write(&text, "a text file\n").unwrap();
    assert!(matches!(onnx::read(&text), Err(onnx::Error::Decode(_))));
    std::fs::write(&text, "not a model\n").unwrap();
    assert!(matches!(
        onnx::read(&text),
        Err(onnx::Error::NotAModel { byte: b'n', .. })
    ));
    for byte in [0u8, 7, 0x0e, 0x0f] {
        assert!(!onnx::starts_a_field(byte), "{byte:#x}");
    }
    assert!(onnx::starts_a_field(0x08) && onnx::starts_a_field(0x12));
}
