//! The planner's input record: one tensor, its size, its live interval and what produced it.

/// What a tensor is to the model.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A graph input: written by the application, never taken over by an in-place op.
    Input,
    /// Produced and consumed inside the model.
    #[default]
    Intermediate,
    /// A graph output: read by the application after the run.
    Output,
}

/// One tensor's record: the planner's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tensor {
    /// Unique id within one model.
    pub id: u64,
    /// A name for messages, e.g. the ONNX value name.
    pub name: Option<String>,
    /// Size in bytes (more than zero).
    pub bytes: u64,
    /// The step that produces it (inclusive).
    pub first: u32,
    /// The last step that reads it (inclusive); `first <= last`.
    pub last: u32,
    /// The producing op's type (`"Relu"`, `"Conv"`, ...), for in-place reuse and aliasing.
    pub op: Option<String>,
    /// Ids of the producing op's inputs (for in-place reuse and aliasing).
    pub inputs: Vec<u64>,
    /// Input, intermediate or output.
    pub kind: Kind,
    /// A fixed, pre-placed offset in the arena.
    pub offset: Option<u64>,
    /// Per-tensor override of the op table: `Some(false)` forbids in-place reuse, `Some(true)`
    /// allows it.
    pub inplace: Option<bool>,
}

impl Tensor {
    /// An intermediate tensor of `bytes` bytes live over `[first, last]`, with nothing else set.
    pub fn new(id: u64, bytes: u64, first: u32, last: u32) -> Self {
        Self {
            id,
            name: None,
            bytes,
            first,
            last,
            op: None,
            inputs: Vec::new(),
            kind: Kind::Intermediate,
            offset: None,
            inplace: None,
        }
    }

    /// Sets the name used in messages.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the producing op and its input ids.
    #[must_use]
    pub fn op(mut self, op: impl Into<String>, inputs: impl IntoIterator<Item = u64>) -> Self {
        self.op = Some(op.into());
        self.inputs = inputs.into_iter().collect();
        self
    }

    /// Sets the kind.
    #[must_use]
    pub fn kind(mut self, kind: Kind) -> Self {
        self.kind = kind;
        self
    }

    /// Pins the tensor at `offset`.
    #[must_use]
    pub fn fixed(mut self, offset: u64) -> Self {
        self.offset = Some(offset);
        self
    }

    /// Overrides the op table's in-place decision for this tensor.
    #[must_use]
    pub fn inplace(mut self, allow: bool) -> Self {
        self.inplace = Some(allow);
        self
    }

    /// Whether the live intervals of `self` and `other` share a step.
    pub fn overlaps(&self, other: &Tensor) -> bool {
        self.first <= other.last && other.first <= self.last
    }

    /// How messages name this tensor: `tensor 7` or `tensor 7 ("conv1_out")`.
    pub fn label(&self) -> String {
        match &self.name {
            Some(name) => format!("tensor {} ({name:?})", self.id),
            None => format!("tensor {}", self.id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_and_overlap() {
        let a = Tensor::new(1, 10, 0, 2).name("a").op("Relu", [0]);
        let b = Tensor::new(2, 10, 2, 3).kind(Kind::Output).fixed(256);
        let c = Tensor::new(3, 10, 3, 4).inplace(false);
        assert!(a.overlaps(&b) && b.overlaps(&a));
        assert!(!a.overlaps(&c));
        assert_eq!(a.label(), "tensor 1 (\"a\")");
        assert_eq!(b.label(), "tensor 2");
        assert_eq!(b.offset, Some(256));
        assert_eq!(c.inplace, Some(false));
        assert_eq!(a.inputs, vec![0]);
    }

    #[test]
    fn kind_serialises_lower_case() {
        let text = serde_json::to_string(&Kind::Intermediate).unwrap();
        assert_eq!(text, "\"intermediate\"");
        let kind: Kind = serde_json::from_str("\"input\"").unwrap();
        assert_eq!(kind, Kind::Input);
    }
}
