//! Model graphs with real shapes, for the demo and the benchmarks: [`yolov5s_like`], the
//! tensor graph of YOLOv5s (v6, 640x640 input) at one byte per activation, planned into one
//! arena, its three detection heads filtered on the device so only the detections come back.
//!
//! The shapes are YOLOv5s's: the stem convolution, the C3 blocks of the backbone with their
//! bottlenecks and residual adds, SPPF, the upsampling and concatenating neck, and the three
//! 255-channel heads at strides 8, 16 and 32. Each convolution is one layer step over its
//! inputs at the planner's offsets (the loopback device's `Layer`, whose cost is the tensor
//! traffic); weights are not tensors of the arena (they live in the device's SRAM model,
//! [`YOLOV5S_WEIGHTS`]).

use super::model::{Filter, Model, ModelError};
use crate::plan::{Kind, Tensor};

/// YOLOv5s's weights at one byte per parameter (7.2 M parameters): what a context running it
/// keeps resident in device SRAM besides its hot activations.
pub const YOLOV5S_WEIGHTS: u64 = 7_225_885;

/// Bytes per detection record the filter keeps: the score first, then box and class.
pub const DETECTION_RECORD: u32 = 32;

/// A tensor graph under construction: each op is one step, and a tensor lives from the step
/// that makes it to the last step that reads it.
struct Graph {
    tensors: Vec<Tensor>,
}

impl Graph {
    fn input(bytes: u64) -> Graph {
        let mut t = Tensor::new(0, bytes, 0, 0);
        t.kind = Kind::Input;
        t.name = Some("images".into());
        Graph { tensors: vec![t] }
    }

    /// Adds the output of `op` over `inputs` (tensor ids), `h x w x c` bytes; returns its id.
    fn op(&mut self, op: &str, inputs: &[u64], h: u64, w: u64, c: u64) -> u64 {
        let id = self.tensors.len() as u64;
        let step = id as u32;
        for &i in inputs {
            let t = &mut self.tensors[i as usize];
            t.last = t.last.max(step);
        }
        let mut t = Tensor::new(id, h * w * c, step, step);
        t.op = Some(op.into());
        t.inputs = inputs.to_vec();
        self.tensors.push(t);
        id
    }

    fn conv(&mut self, from: u64, h: u64, w: u64, c: u64) -> u64 {
        self.op("Conv", &[from], h, w, c)
    }

    /// YOLOv5's C3 block: two 1x1 branches of `c / 2`, `n` bottlenecks on the first
    /// (1x1 then 3x3, with a residual add when `shortcut`), concatenated and fused to `c`.
    fn c3(&mut self, from: u64, h: u64, w: u64, c: u64, n: u32, shortcut: bool) -> u64 {
        let half = c / 2;
        let mut x = self.conv(from, h, w, half);
        for _ in 0..n {
            let a = self.conv(x, h, w, half);
            let b = self.conv(a, h, w, half);
            x = if shortcut {
                self.op("Add", &[x, b], h, w, half)
            } else {
                b
            };
        }
        let y = self.conv(from, h, w, half);
        let cat = self.op("Concat", &[x, y], h, w, c);
        self.conv(cat, h, w, c)
    }
}

/// The tensor graph of [`yolov5s_like`], before planning: the 640x640x3 input, every
/// activation, and the detection tensor (the three heads' outputs as records) as the output.
pub fn yolov5s_graph() -> Vec<Tensor> {
    let mut g = Graph::input(640 * 640 * 3);
    // Backbone.
    let x = g.conv(0, 320, 320, 32);
    let x = g.conv(x, 160, 160, 64);
    let x = g.c3(x, 160, 160, 64, 1, true);
    let x = g.conv(x, 80, 80, 128);
    let p3 = g.c3(x, 80, 80, 128, 2, true);
    let x = g.conv(p3, 40, 40, 256);
    let p4 = g.c3(x, 40, 40, 256, 3, true);
    let x = g.conv(p4, 20, 20, 512);
    let x = g.c3(x, 20, 20, 512, 1, true);
    // SPPF: a 1x1 conv, three chained max pools, concatenated, a 1x1 conv.
    let a = g.conv(x, 20, 20, 256);
    let m1 = g.op("MaxPool", &[a], 20, 20, 256);
    let m2 = g.op("MaxPool", &[m1], 20, 20, 256);
    let m3 = g.op("MaxPool", &[m2], 20, 20, 256);
    let cat = g.op("Concat", &[a, m1, m2], 20, 20, 768);
    let cat = g.op("Concat", &[cat, m3], 20, 20, 1024);
    let p5 = g.conv(cat, 20, 20, 512);
    // Neck (top-down).
    let h10 = g.conv(p5, 20, 20, 256);
    let up = g.op("Resize", &[h10], 40, 40, 256);
    let cat = g.op("Concat", &[up, p4], 40, 40, 512);
    let h13 = g.c3(cat, 40, 40, 256, 1, false);
    let h14 = g.conv(h13, 40, 40, 128);
    let up = g.op("Resize", &[h14], 80, 80, 128);
    let cat = g.op("Concat", &[up, p3], 80, 80, 256);
    let out3 = g.c3(cat, 80, 80, 128, 1, false);
    // Neck (bottom-up).
    let d = g.conv(out3, 40, 40, 128);
    let cat = g.op("Concat", &[d, h14], 40, 40, 256);
    let out4 = g.c3(cat, 40, 40, 256, 1, false);
    let d = g.conv(out4, 20, 20, 256);
    let cat = g.op("Concat", &[d, h10], 20, 20, 512);
    let out5 = g.c3(cat, 20, 20, 512, 1, false);
    // Heads: 3 anchors x 85 values per cell, decoded into one tensor of detection records.
    let h3 = g.conv(out3, 80, 80, 255);
    let h4 = g.conv(out4, 40, 40, 255);
    let h5 = g.conv(out5, 20, 20, 255);
    let boxes = (80 * 80 + 40 * 40 + 20 * 20) * 3;
    let det = g.op(
        "Detect",
        &[h3, h4, h5],
        boxes,
        1,
        u64::from(DETECTION_RECORD),
    );
    g.tensors[det as usize].kind = Kind::Output;
    g.tensors
}

/// YOLOv5s-like: [`yolov5s_graph`] planned into one arena (greedy by size, 256-byte
/// alignment), each op a layer step, then the detections filtered on the device: records of
/// [`DETECTION_RECORD`] bytes whose score passes a threshold that keeps about one in 256, at
/// most `max_detections` of them copied back.
///
/// # Errors
/// [`ModelError`] if the plan or the filter is refused (not for `max_detections >= 1`).
pub fn yolov5s_like(max_detections: u32) -> Result<Model, ModelError> {
    Model::planned(&yolov5s_graph())?.with_filter(Filter {
        record: DETECTION_RECORD,
        score_at: 0,
        threshold: u32::MAX - u32::MAX / 256,
        capacity: max_detections.max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use userdma_loopback::{Cost, Work};

    #[test]
    fn the_graph_has_yolov5s_shapes_and_plans_into_one_arena() {
        let g = yolov5s_graph();
        assert_eq!(g[0].bytes, 1_228_800);
        let out = g.last().unwrap();
        assert_eq!(out.kind, Kind::Output);
        assert_eq!(out.bytes, 25_200 * 32);
        let model = yolov5s_like(300).unwrap();
        assert_eq!(model.result().bytes, 8 + 300 * 32);
        // Far below the sum of the activations: the arena reuses memory.
        let total: u64 = g.iter().map(|t| t.bytes).sum();
        assert!(
            model.arena_bytes() < total / 3,
            "{} of {total}",
            model.arena_bytes()
        );
    }

    #[test]
    fn the_default_cost_makes_a_frame_about_18_ms_with_its_working_set_mostly_resident() {
        // The npu cost model's claim: about 18 ms of compute at 85 % SRAM hits.
        let model = yolov5s_like(300).unwrap();
        let bytes = model.compute_bytes();
        assert!((60e6..90e6).contains(&(bytes as f64)), "{bytes}");
        let npu = Cost::npu();
        let steps = model.steps().len() as u64;
        let ms = |hit: f64| {
            let missed = (bytes as f64 * (1.0 - hit)) as u64;
            let w = Work {
                compute_bytes: bytes,
                missed_bytes: missed,
                ..Work::default()
            };
            (npu.charge_work(w).as_nanos() as u64 + steps * npu.descriptor_ns) as f64 / 1e6
        };
        let resident = ms(0.85);
        assert!((15.0..21.0).contains(&resident), "{resident} ms");
        assert!(ms(0.40) > 1.5 * resident);
    }
}
