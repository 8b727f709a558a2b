//! In-place reuse and aliasing: which ops may write their output over an input, and which share
//! their input's memory without a copy.
//!
//! An op's output takes over an input's memory when all of these hold:
//! * the op is element-wise, each output element depending only on the same element of the
//!   input ([`is_elementwise`]), or the tensor's `inplace` field says `Some(true)`; a tensor with
//!   `inplace: Some(false)` never takes over an input;
//! * the output has the input's byte size (`Some(true)`: at most the input's size);
//! * the input is not a graph input ([`Kind::Input`](super::Kind::Input)), and neither it nor any
//!   tensor already sharing its memory is read after the op's step, nor produced at that step.
//!
//! **Aliasing ops** ([`is_alias`]: Reshape, Flatten, ...) share their first input's memory with
//! no copy, whatever the lifetimes, when the sizes are equal; their output and input may then be
//! live together. Tensors with a fixed offset never share.

/// Element-wise ops whose output may overwrite an input of the same size.
pub const ELEMENTWISE: &[&str] = &[
    "Abs",
    "Add",
    "BatchNormalization",
    "Cast",
    "Ceil",
    "Clip",
    "Div",
    "Elu",
    "Erf",
    "Exp",
    "Floor",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "LeakyRelu",
    "Log",
    "Mul",
    "Neg",
    "PRelu",
    "Pow",
    "Reciprocal",
    "Relu",
    "Round",
    "Selu",
    "Sigmoid",
    "Sign",
    "Softplus",
    "Sqrt",
    "Sub",
    "Tanh",
];

/// Ops whose output is their first input's memory, reinterpreted (no copy).
pub const ALIAS: &[&str] = &[
    "Dropout",
    "Flatten",
    "Identity",
    "Reshape",
    "Squeeze",
    "Unsqueeze",
];

/// Whether `op` is in the built-in element-wise table ([`ELEMENTWISE`]).
pub fn is_elementwise(op: &str) -> bool {
    ELEMENTWISE.contains(&op)
}

/// Whether `op` is an aliasing op ([`ALIAS`]).
pub fn is_alias(op: &str) -> bool {
    ALIAS.contains(&op)
}

/// How a tensor shares another's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Share {
    /// It overwrites an input that is dead from its step on.
    InPlace,
    /// It is a view of its input.
    Alias,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables() {
        assert!(is_elementwise("Relu") && is_elementwise("Add"));
        assert!(!is_elementwise("Conv") && !is_elementwise("Reshape"));
        assert!(is_alias("Reshape") && !is_alias("Relu"));
        let mut sorted = ELEMENTWISE.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, ELEMENTWISE);
    }
}
