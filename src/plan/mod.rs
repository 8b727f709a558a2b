//! Static buffer planning: tensor lifetimes to offsets in one DMA arena.
//!
//! The planner's input is a list of [`Tensor`] records (size, live interval in execution steps,
//! producing op). The format readers turn model files into these records; [`onnx`] reads ONNX
//! models.

mod tensor;
pub use tensor::{Kind, Tensor};

pub mod onnx;
