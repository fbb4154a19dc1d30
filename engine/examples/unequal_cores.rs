//! Whether this machine's cores run the same work at the same speed: one node of pure integer
//! work split into 2, 4 and 8 equal parts on a two-worker rayon pool, against the whole node on
//! one worker. Where 4 or 8 parts finish clearly sooner than 2, one core is slower than the
//! other, which is why the CPU kernels split into more parts than workers
//! (`kernels::part_count`).
//!
//! `cargo run --release -p vigil-engine --example unequal_cores -- [ITERS] [NODES]`
//! (defaults 100 and 2000): microseconds per node, six rounds.

use std::time::Instant;

use rayon::prelude::*;

/// A dependent multiply-add chain per element: compute-bound, no memory traffic beyond L1.
fn work(buf: &mut [u64], iters: usize) {
    for _ in 0..iters {
        for x in buf.iter_mut() {
            *x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
        }
    }
}

fn main() -> Result<(), String> {
    let arg = |i: usize, d: usize| -> Result<usize, String> {
        std::env::args().nth(i).map_or(Ok(d), |v| {
            v.parse().map_err(|e| format!("argument {i}: {e}"))
        })
    };
    let (iters, nodes) = (arg(1, 100)?, arg(2, 2000)?);
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .map_err(|e| e.to_string())
    };
    let (two, one) = (pool(2)?, pool(1)?);
    const LEN: usize = 2048;
    let mut buf = vec![1u64; LEN];
    for round in 0..6 {
        let mut row = Vec::new();
        for parts in [2usize, 4, 8] {
            let t = Instant::now();
            two.install(|| {
                for _ in 0..nodes {
                    buf.par_chunks_mut(LEN / parts).for_each(|c| work(c, iters));
                }
            });
            row.push(format!(
                "{parts} parts {:.1}",
                t.elapsed().as_secs_f64() * 1e6 / nodes as f64
            ));
        }
        let t = Instant::now();
        one.install(|| {
            for _ in 0..nodes {
                work(&mut buf, iters);
            }
        });
        row.push(format!(
            "1 worker {:.1}",
            t.elapsed().as_secs_f64() * 1e6 / nodes as f64
        ));
        println!("round {round}: us per node: {}", row.join(", "));
    }
    Ok(())
}
