//! The planner's input record: one tensor, its size and its live interval in execution steps.

/// What a tensor is to the model.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A graph input: the application writes it before the first step.
    Input,
    /// Produced and consumed inside the model.
    #[default]
    Intermediate,
    /// A graph output: the application reads it after the last step.
    Output,
}

/// One tensor's record: the planner's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// Dense id, unique within one model.
    pub id: u64,
    /// The ONNX value name, if the tensor came from a model file.
    pub name: Option<String>,
    /// Size in bytes (> 0).
    pub bytes: u64,
    /// The step that produces it (inclusive); graph inputs: 0.
    pub first: u32,
    /// The last step that reads it (inclusive); graph outputs: the last step.
    pub last: u32,
    /// The producing op's type ("Relu", "Conv", ...).
    pub op: Option<String>,
    /// Ids of the producing op's (non-weight) inputs.
    pub inputs: Vec<u64>,
    /// What the tensor is to the model.
    pub kind: Kind,
    /// A fixed offset in the arena (a pre-placed tensor); always `None` from ONNX.
    pub offset: Option<u64>,
    /// Whether the tensor may take over an input's memory; always `None` from ONNX.
    pub inplace: Option<bool>,
}
