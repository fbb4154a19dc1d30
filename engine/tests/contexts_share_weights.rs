//! Execution contexts of one model share its weights; only activations are per context.
//!
//! Counted with a global allocator: creating another context allocates about one activation
//! arena (or nothing for it, when the arena comes from a host pool), never the weights again.
//! Contexts from a pool give the same outputs as contexts with their own arena, and a pool too
//! small for another arena fails with an out-of-memory error that states the pool's state.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use vigil_engine::memory::host_pool;
use vigil_engine::{Error, Model, ModelOptions, Tensor};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            BYTES.fetch_add(new_size, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Tests in this file count bytes process-wide, so they run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn load(name: &str) -> Model {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(name);
    Model::load(
        &path,
        &ModelOptions {
            threads: 1,
            ..ModelOptions::default()
        },
    )
    .expect("load")
}

fn counted<T>(f: impl FnOnce() -> T) -> (T, usize) {
    BYTES.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let out = f();
    COUNTING.store(false, Ordering::SeqCst);
    (out, BYTES.load(Ordering::SeqCst))
}

fn weight_bytes(m: &Model) -> usize {
    let g = m.graph();
    g.values
        .iter()
        .filter_map(|v| v.constant.as_ref())
        .map(|t| t.as_bytes().len())
        .sum()
}

fn input(m: &Model) -> Tensor {
    let shape = m.inputs()[0].shape.clone();
    let n: usize = shape.iter().product();
    Tensor::from_f32(
        shape,
        (0..n).map(|i| ((i * 31 % 255) as f32) / 255.0).collect(),
    )
    .expect("input")
}

#[test]
fn another_context_costs_one_arena_not_the_weights() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for name in ["efficientnet-lite0.onnx", "nanodet-m-416.onnx"] {
        let m = load(name);
        let weights = weight_bytes(&m);
        let arena = m.arena_bytes();
        let _first = m.new_context().expect("context");
        let (second, bytes) = counted(|| m.new_context().expect("context"));
        let outputs: usize = m
            .outputs()
            .iter()
            .map(|o| o.shape.iter().product::<usize>() * 4)
            .sum();
        println!(
            "{name}: weights {weights} B, arena {arena} B, outputs {outputs} B; a new context allocated {bytes} B"
        );
        assert!(
            bytes < arena + outputs + 64 * 1024,
            "{name}: a context allocated {bytes} B, more than its arena {arena} B + outputs {outputs} B"
        );
        assert!(
            bytes < weights,
            "{name}: a context allocated {bytes} B, as much as the weights ({weights} B): copied?"
        );
        drop(second);
    }
}

#[test]
fn pooled_contexts_match_own_arena_contexts_and_exhaustion_is_clear() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = load("nanodet-m-416.onnx");
    let arena = m.arena_bytes();
    let pool = host_pool(2 * arena + 4096).expect("pool");
    let x = input(&m);
    let mut own = m.new_context().expect("own");
    let want = own.run(std::slice::from_ref(&x)).expect("run own");
    let (ctx_a, bytes) = counted(|| m.new_context_in(&pool).expect("pooled a"));
    let mut ctx_a = ctx_a;
    let mut ctx_b = m.new_context_in(&pool).expect("pooled b");
    assert!(
        bytes < arena / 4,
        "a pooled context allocated {bytes} B of heap; its {arena} B arena should come from the pool"
    );
    let st = pool.stats();
    assert_eq!(st.blocks, 2);
    assert!(st.in_use >= 2 * arena && st.in_use <= 2 * arena + 512);
    for ctx in [&mut ctx_a, &mut ctx_b] {
        let got = ctx.run(std::slice::from_ref(&x)).expect("run pooled");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.shape, w.shape);
            assert_eq!(
                g.as_bytes(),
                w.as_bytes(),
                "pooled arena changed the results"
            );
        }
    }
    match m.new_context_in(&pool) {
        Err(Error::OutOfMemory(msg)) => {
            println!("third context: {msg}");
            assert!(msg.contains("largest free block"), "{msg}");
            assert!(msg.contains("in use"), "{msg}");
        }
        Err(e) => panic!("expected out of memory, got {e}"),
        Ok(_) => panic!("a pool sized for two arenas gave a third"),
    }
    drop(ctx_a);
    // The freed arena is reusable at once.
    let mut ctx_c = m.new_context_in(&pool).expect("reuse after drop");
    let got = ctx_c.run(std::slice::from_ref(&x)).expect("run reused");
    assert_eq!(got[0].as_bytes(), want[0].as_bytes());
}
