//! Sizes a caller passes are checked against what can be had before anything is allocated for
//! them: an absurd one is an error naming the limit, never an aborted process or a panic.
#![cfg(not(loom))]

use std::sync::Arc;
use std::time::Instant;

use userdma::dma::{Loopback, Space};
use userdma::memory::{PageSize, Region};
use userdma::pipeline::{zoo, Model, ModelError};
use userdma::plan::{self, Budget, Kind, Options, Strategy, Tensor};
use userdma::pool::{Config, Error as PoolError, Pool};

#[test]
fn models_past_what_any_pipeline_could_run_are_refused_before_they_are_built() {
    for (layers, bytes) in [
        (u32::MAX, 4096u64),
        (5000, 4096),
        (1, u64::MAX),
        (3, 1 << 62),
    ] {
        let error = Model::chain(layers, bytes).expect_err("too large");
        assert!(
            matches!(error, ModelError::TooLarge { .. }),
            "{layers} x {bytes}: {error:?}"
        );
    }
    // The largest of each is built.
    Model::chain(Model::MAX_STEPS as u32, 64).expect("the most steps");
    Model::chain(1, Model::MAX_TENSOR_BYTES).expect("the largest tensor");
    // A filter keeping more records than the result holds.
    let error = zoo::yolov5s_like(u32::MAX).expect_err("more records than the result holds");
    assert!(error.to_string().contains("25200"), "{error}");
    zoo::yolov5s_like(25_200).expect("every record");
}

#[test]
fn a_model_too_large_for_the_host_is_an_error_when_its_result_is_computed() {
    let model = Model::chain(1, Model::MAX_TENSOR_BYTES).expect("a 1 TiB model");
    let mut result = vec![0u8; 16];
    let error = model
        .expected_into(&[0u8; 16], &mut result)
        .expect_err("inputs shorter than the model's");
    assert!(matches!(error, ModelError::Short { .. }), "{error:?}");
}

#[test]
fn a_planner_error_is_reported_as_it_is() {
    let mut t = Tensor::new(1, 64, 3, 1);
    t.kind = Kind::Input;
    let error = Model::planned(&[t]).expect_err("an interval backwards");
    assert!(matches!(error, ModelError::Plan(_)), "{error:?}");
    assert!(error.to_string().contains("after last step"), "{error}");
}

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

#[test]
fn more_buffers_than_a_pool_holds_are_refused_before_anything_is_reserved() {
    let region = Region::builder(4 << 20)
        .page_size(PageSize::Base)
        .lock(false)
        .build()
        .expect("region");
    let mapping = Loopback::new(48)
        .expect("space")
        .map(Arc::new(region))
        .expect("mapping");
    let pool = Pool::new(mapping, Config::default().chunk_size(64 << 10)).expect("pool");
    let mut out = Vec::new();
    for count in [1 << 20, usize::MAX / 2, usize::MAX] {
        let error = pool
            .alloc_bulk(4096, count, &mut out)
            .expect_err("too many");
        assert!(matches!(error, PoolError::Exhausted { .. }), "{error:?}");
        assert!(out.is_empty() && out.capacity() < 1 << 20);
    }
    pool.alloc_bulk(4096, 8, &mut out).expect("eight");
}
