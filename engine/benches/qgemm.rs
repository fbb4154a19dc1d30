//! INT8 matrix products on the CPU: the AMX tiles against the AVX-512 VNNI registers, in one
//! run, on the pointwise (1x1) convolution shapes of the shared models at batch 1 (rows = output
//! pixels, K = input channels, N = output channels), one thread. Prints the best of `REPS`
//! runs of each arm and VNNI / AMX (above 1: AMX faster).
//!
//! `cargo bench -p vigil-engine --bench qgemm [-- REPS]`; on a CPU without AVX-512 VNNI or AMX
//! it says so and exits.

use std::time::Instant;

use vigil_engine::backend::cpu::kernels::qgemm::{amx_available, PackedQB, QEpilogue, QIsa};
use vigil_engine::ir::{Activation, DataType, QParams};

/// (rows, K, N): every 1x1 convolution geometry of EfficientNet-Lite0 (224x224), then of
/// NanoDet-m (416x416); the 3x3 convolutions' im2col products take the same kernel.
const SHAPES: &[(usize, usize, usize)] = &[
    (12544, 32, 16),
    (12544, 16, 96),
    (3136, 96, 24),
    (3136, 24, 144),
    (3136, 144, 24),
    (784, 144, 40),
    (784, 40, 240),
    (784, 240, 40),
    (196, 240, 80),
    (196, 80, 480),
    (196, 480, 80),
    (196, 480, 112),
    (196, 112, 672),
    (196, 672, 112),
    (49, 672, 192),
    (49, 192, 1152),
    (49, 1152, 192),
    (49, 1152, 320),
    (49, 320, 1280),
    (2704, 128, 128),
    (2704, 128, 124),
    (676, 256, 128),
    (676, 128, 124),
    (169, 512, 128),
    (169, 128, 124),
];

fn main() {
    let reps: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200);
    if !QIsa::Avx512Vnni.available() || !amx_available() {
        println!("SKIP: this CPU (or OS) lacks AVX-512 VNNI or AMX-INT8: nothing to compare");
        return;
    }
    let x = QParams {
        scale: 0.02,
        zero_point: 3,
        dtype: DataType::U8,
    };
    let y = QParams {
        scale: 0.5,
        zero_point: 0,
        dtype: DataType::U8,
    };
    println!("| rows | K | N | VNNI µs | AMX µs | VNNI / AMX |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for &(m, k, n) in SHAPES {
        let a: Vec<u8> = (0..m * k).map(|i| (i * 7 % 251) as u8).collect();
        let b: Vec<i8> = (0..k * n).map(|i| (i * 13 % 255) as i8).collect();
        let ws = vec![0.001f32; n];
        let bias = vec![0i32; n];
        let mut best = [f64::MAX; 2];
        let arms: Vec<(PackedQB, QEpilogue)> = [false, true]
            .into_iter()
            .map(|amx| {
                let p = PackedQB::pack_with(k, n, |kk, j| b[kk * n + j], QIsa::Avx512Vnni, amx);
                let e = QEpilogue::new(x, &ws, y, &bias, &p.col_sums, Some(Activation::Relu));
                (p, e)
            })
            .collect();
        let mut out = vec![0u8; m * n];
        // Interleaved, so a drift of a shared machine moves both arms alike.
        for _ in 0..reps {
            for (arm, (p, e)) in arms.iter().enumerate() {
                let t = Instant::now();
                if let Err(err) = p.run(m, &a, k, &mut out, n, e) {
                    eprintln!("int8 gemm {m}x{k}x{n}: {err}");
                    std::process::exit(1);
                }
                best[arm] = best[arm].min(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        println!(
            "| {m} | {k} | {n} | {:.1} | {:.1} | {:.2} |",
            best[0],
            best[1],
            best[0] / best[1]
        );
    }
}
