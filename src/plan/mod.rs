//! Static buffer planning: tensor lifetimes to offsets in one DMA arena.
//!
//! | module | owns |
//! |---|---|
//! | [`tensor`] | the input record ([`Tensor`], [`Kind`]) |

pub mod tensor;

pub use tensor::{Kind, Tensor};
