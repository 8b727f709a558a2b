//! The exact search checks its own limits before it builds its tables: a graph too dense for
//! them gets the best heuristic's plan, valid and unproven, never an aborted process.

use std::time::Instant;

use userdma_plan::{self as plan, Budget, Options, Strategy, Tensor};

#[test]
fn the_exact_search_stands_down_on_a_graph_too_dense_for_its_tables() {
    // 5,000 tensors all live together: 12.5 million pairs, past what the exact search's
    // tables may hold. It keeps the best heuristic's plan (valid, unproven) and returns fast.
    let tensors: Vec<Tensor> = (0..5_000u64)
        .map(|i| Tensor::new(i, 256 + (i % 7) * 64, 0, 1))
        .collect();
    let start = Instant::now();
    let plan = plan::plan(
        &tensors,
        &Options::default(),
        Strategy::Exact,
        Budget::Nodes(1_000),
    )
    .expect("a plan");
    assert!(start.elapsed().as_secs() < 60, "took {:?}", start.elapsed());
    assert_eq!(plan.placements.len(), 5_000);
    plan.validate(&tensors).expect("a valid plan");
}

/// The tensors of the C API reproducer that crashed the exact search at 10,000 tensors:
/// about 40 live at each of 500 steps, sizes that no heuristic packs optimally.
fn staggered(n: u64) -> Vec<Tensor> {
    (0..n)
        .map(|i| {
            let first = (i % 500) as u32;
            Tensor::new(i, 64 + (i * 37) % 4096, first, first + (i % 7) as u32)
        })
        .collect()
}

#[test]
fn the_exact_search_needs_no_stack_per_tensor() {
    // The search used to recurse once per block placed: 20,000 tensors overflowed even an
    // 8 MiB main thread. Now its depth is on the heap, so a 256 KiB thread is plenty.
    let tensors = staggered(3_000);
    let handle = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            let plan = plan::plan(
                &tensors,
                &Options::default(),
                Strategy::Exact,
                Budget::Nodes(100_000),
            )
            .expect("a plan");
            plan.validate(&tensors).expect("a valid plan");
        })
        .expect("a thread");
    handle
        .join()
        .expect("the search returns instead of overflowing its stack");
}
