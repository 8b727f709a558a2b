//! Random planning instances to every strategy: each plan validates (the independent
//! checker), never beats the lower bound, a proven-optimal plan is no larger than any other
//! strategy's, and the same input always gives the same plan (the search runs on a node budget,
//! not the clock).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma_plan::{self as plan, Budget, Kind, Options, Strategy, Tensor};

const OPS: [&str; 5] = ["Relu", "Add", "Conv", "Reshape", "MyOp"];

#[derive(Debug, Arbitrary)]
struct Record {
    bytes: u16,
    first: u8,
    len: u8,
    op: u8,
    input: Option<u8>,
    kind: u8,
    fixed: Option<u8>,
    inplace: Option<bool>,
}

#[derive(Debug, Arbitrary)]
struct Input {
    /// log2 of the alignment (0..=8).
    align: u8,
    inplace: bool,
    alias: bool,
    records: Vec<Record>,
}

fuzz_target!(|input: Input| {
    let tensors: Vec<Tensor> = input
        .records
        .iter()
        .take(24)
        .enumerate()
        .map(|(i, r)| {
            let first = u32::from(r.first % 16);
            let mut t = Tensor::new(
                i as u64,
                u64::from(r.bytes) + 1,
                first,
                first + u32::from(r.len % 8),
            );
            t.op = Some(OPS[usize::from(r.op) % OPS.len()].to_owned());
            t.inputs = r
                .input
                .map(|k| u64::from(k) % (i as u64).max(1))
                .into_iter()
                .filter(|&k| k < i as u64)
                .collect();
            t.kind = [Kind::Input, Kind::Intermediate, Kind::Output][usize::from(r.kind % 3)];
            t.offset = r.fixed.map(|f| u64::from(f) * 4096);
            t.inplace = r.inplace;
            t
        })
        .collect();
    let options = Options {
        align: 1 << (input.align % 9),
        inplace: input.inplace,
        alias: input.alias,
    };
    let budget = Budget::Nodes(2_000);
    let mut plans = Vec::new();
    for s in Strategy::ALL {
        let Ok(p) = plan::plan(&tensors, &options, s, budget) else {
            // Refused input (colliding fixed offsets): every strategy refuses it alike.
            assert!(plans.is_empty());
            continue;
        };
        p.validate(&tensors).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert!(
            p.arena_bytes >= p.lower_bound.bytes,
            "{s} beat the lower bound"
        );
        let again = plan::plan(&tensors, &options, s, budget).expect("same input, same answer");
        assert_eq!(again.placements, p.placements, "{s} is not deterministic");
        assert_eq!(again.strategy, p.strategy);
        plans.push(p);
    }
    let best = plans.iter().map(|p| p.arena_bytes).min();
    for p in plans.iter().filter(|p| p.optimal) {
        assert_eq!(Some(p.arena_bytes), best, "{} claims optimal", p.strategy);
    }
});
