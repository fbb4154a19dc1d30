//! Vigil's intermediate representation: a typed, statically shaped dataflow graph.
//!
//! `onnx` builds it, `passes` rewrite it, `shape` infers static shapes, and the planner and
//! backends consume it.

mod graph;
mod op;
pub mod shape;
mod tensor;

pub use graph::{Graph, Node, Value, ValueId};
pub use op::*;
pub use tensor::{DataType, Tensor, TensorData};
