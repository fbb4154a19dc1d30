//! Execution backends, each behind the same small trait.

pub mod cpu;
