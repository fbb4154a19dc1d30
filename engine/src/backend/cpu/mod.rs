//! The CPU backend: kernels compiled once per node, one planned activation arena per context,
//! and a rayon thread pool sized to the machine (or the configured thread count).

mod executor;
pub mod kernels;

pub use executor::{eval_node, CpuBackend, CpuExecutable};
