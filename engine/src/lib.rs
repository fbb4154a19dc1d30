//! vigil-engine: Vigil's inference engine.
//!
//! Data flows one way: model file ([`onnx`]) → IR ([`ir`]) → graph passes ([`passes`]) →
//! memory plan ([`plan`]) → backend ([`backend`]) → results; [`vision`] turns images into input
//! tensors and output tensors into classes and boxes. [`model`] ties the chain together.

pub mod backend;
pub mod error;
pub mod ir;
pub mod memory;
pub mod model;
pub mod onnx;
pub mod passes;
pub mod plan;
pub mod quant;
pub mod vision;

pub use backend::{Device, Precision};
pub use error::{Error, Result};
pub use ir::{DataType, Tensor, TensorData};
pub use model::{ExecutionContext, Model, ModelOptions, TensorInfo};
