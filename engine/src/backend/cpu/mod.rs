//! The CPU backend: NHWC kernels, a planned arena, rayon threads.

pub mod kernels;
