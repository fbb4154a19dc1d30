//! The allocator benchmark's workloads, drawn once from a fixed seed: shared by
//! `benches/pool.rs` and `examples/paged_sweep.rs`, so both replay the same sequences.
// Each including target uses part of it.
#![allow(dead_code)]

/// Fixed seed xorshift, so every allocator sees the same sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Live blocks in the window workload.
pub const WINDOW: usize = 64;
/// Length of the pre-drawn tables (the sequences repeat with this period).
pub const TABLE: usize = 1 << 16;

/// Pre-drawn sizes and victims (drawing them is not what we time).
pub struct Workload {
    pub pair_sizes: Vec<usize>,
    pub window_sizes: Vec<usize>,
    pub victims: Vec<usize>,
}

impl Workload {
    /// The benchmark's sequence.
    pub fn new() -> Self {
        Self::with_seed(0x9e37_79b9_7f4a_7c15)
    }

    /// Another sequence of the same distributions (for checking that a result is not the
    /// benchmark seed's alone).
    pub fn with_seed(seed: u64) -> Self {
        let mut r = Rng(seed);
        let pair_sizes = (0..TABLE)
            .map(|_| 1 + (r.next() % 10_000_000) as usize)
            .collect();
        let window_sizes = (0..TABLE)
            .map(|_| {
                let u = (r.next() % 1_000_000) as f64 / 1e6;
                (256.0 * (262_144f64).powf(u)) as usize
            })
            .collect();
        let victims = (0..TABLE)
            .map(|_| (r.next() % WINDOW as u64) as usize)
            .collect();
        Workload {
            pair_sizes,
            window_sizes,
            victims,
        }
    }
}

/// The window workload's peak live bytes over `iters` steps (no allocator involved).
pub fn window_peak_live(w: &Workload, iters: usize) -> usize {
    let mut live = w.window_sizes[..WINDOW].to_vec();
    let mut bytes: usize = live.iter().sum();
    let mut peak = bytes;
    for i in 0..iters {
        let v = w.victims[i % TABLE];
        let size = w.window_sizes[(i + WINDOW) % TABLE];
        bytes = bytes - live[v] + size;
        live[v] = size;
        peak = peak.max(bytes);
    }
    peak
}
