//! A model's sizes are checked against what can be had before anything is built for them: an
//! absurd one is an error naming the limit, never an aborted process or a panic.

use userdma_infer::pipeline::{zoo, Model, ModelError};
use userdma_infer::plan::{Kind, Tensor};

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
