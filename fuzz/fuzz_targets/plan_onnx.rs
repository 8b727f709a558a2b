//! The ONNX reader: never panics on any bytes, and every model it accepts gives records the
//! planner can take (dense ids, sizes above zero, `first <= last`, inputs produced earlier),
//! the same ones on a second read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use userdma_plan::{onnx, Kind};

fuzz_target!(|data: &[u8]| {
    let Ok(tensors) = onnx::parse(data) else {
        return;
    };
    let last_step = tensors.iter().map(|t| t.last).max().unwrap_or(0);
    for (i, t) in tensors.iter().enumerate() {
        assert_eq!(t.id, i as u64);
        assert!(t.bytes > 0);
        assert!(t.first <= t.last);
        assert!(t.inputs.iter().all(|&j| j < t.id));
        assert_eq!((t.offset, t.inplace), (None, None));
        match t.kind {
            Kind::Input => assert!(t.first == 0 && t.inputs.is_empty()),
            Kind::Output => assert_eq!(t.last, last_step),
            Kind::Intermediate => assert!(t.op.is_some()),
        }
    }
    assert_eq!(onnx::parse(data).ok(), Some(tensors));
});
