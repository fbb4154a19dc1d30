//! The steady state allocates nothing: after warm-up, `ExecutionContext::run_ref` on the shared
//! models makes zero heap allocations (activations live in the planned arena, kernels use
//! planned scratch, outputs are the context's own buffers). Counted with a global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use vigil_engine::{Model, ModelOptions, Tensor};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_per_run(path: &Path, threads: usize) -> usize {
    let m = Model::load(
        path,
        &ModelOptions {
            threads,
            ..ModelOptions::default()
        },
    )
    .expect("load");
    let mut ctx = m.new_context().expect("context");
    let inputs: Vec<Tensor> = m
        .inputs()
        .iter()
        .map(|i| {
            let n: usize = i.shape.iter().product();
            Tensor::from_f32(
                i.shape.clone(),
                (0..n).map(|k| (k % 251) as f32 / 251.0).collect(),
            )
            .expect("input")
        })
        .collect();
    let refs: Vec<&Tensor> = inputs.iter().collect();
    for _ in 0..3 {
        ctx.run_ref(&refs).expect("warm-up");
    }
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        ctx.run_ref(&refs).expect("run");
    }
    COUNTING.store(false, Ordering::SeqCst);
    ALLOCS.load(Ordering::SeqCst)
}

#[test]
fn shared_models_run_without_heap_allocation() {
    // One test function: the counter is global, so the cases must not run concurrently.
    // The INT8 runs of the QDQ models (made by scripts/make-qdq-models.py, which the
    // int8_models test runs when they are missing) too, when they are there.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut models = vec![
        root.join("models/efficientnet-lite0.onnx"),
        root.join("models/nanodet-m-416.onnx"),
    ];
    for qdq in ["efficientnet-lite0", "nanodet-m-416"] {
        let p = root.join(format!("target/qdq/{qdq}.qdq.onnx"));
        if p.exists() {
            models.push(p);
        } else {
            println!(
                "SKIP: {qdq} INT8 allocation check: {} is missing",
                p.display()
            );
        }
    }
    for path in &models {
        let model = path
            .file_name()
            .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
        for threads in [1, 2] {
            let n = allocations_per_run(path, threads);
            println!("{model}, {threads} thread(s): {n} allocations in 5 steady-state runs");
            assert_eq!(
                n, 0,
                "{model} with {threads} threads allocated {n} times in 5 runs"
            );
        }
    }
}
