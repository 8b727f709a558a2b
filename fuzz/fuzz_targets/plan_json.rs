//! The tensor-usage JSON reader: never panics on any text, and every accepted input either
//! plans (with a valid plan) or is refused with an error naming a record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use userdma_plan::{self as plan, format, Budget, Options, Strategy};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match format::read_json(text) {
        Ok(tensors) => {
            if let Ok(p) = plan::plan(
                &tensors,
                &Options::default(),
                Strategy::GreedySize,
                Budget::Nodes(0),
            ) {
                p.validate(&tensors).expect("greedy-size plan validates");
            }
        }
        Err(e) => assert!(e.to_string().starts_with("line "), "{e}"),
    }
});
