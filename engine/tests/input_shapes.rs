//! Input shapes other than the loaded one: a context of a batch-1 model runs batch 3 (each row
//! equal to that image run alone), then batch 1 again, on one context; executables are cached
//! per batch in the model, plans in the `PlanCache`, arenas per (context, batch); a seen batch
//! allocates nothing; bad shapes are `BadInput`; at most `MAX_SHAPES` batches compile.
//! Heap use is counted with a global allocator, so the tests here run one at a time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering};
use std::sync::Mutex;

use vigil_engine::ir::{Activation, Graph, Node, Op, UnaryOp};
use vigil_engine::memory::host_pool;
use vigil_engine::model::MAX_SHAPES;
use vigil_engine::plan::PlanCache;
use vigil_engine::{DataType, Error, Model, ModelOptions, Tensor};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
/// Bytes allocated minus bytes freed while counting.
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `f` counting heap allocations: (result, allocation calls, net bytes still held).
fn counted<T>(f: impl FnOnce() -> T) -> (T, usize, isize) {
    ALLOCS.store(0, Ordering::SeqCst);
    LIVE.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let out = f();
    COUNTING.store(false, Ordering::SeqCst);
    (
        out,
        ALLOCS.load(Ordering::SeqCst),
        LIVE.load(Ordering::SeqCst),
    )
}

/// The models directory (`VIGIL_MODELS` overrides; else the repo's, else ../shared/models).
fn models() -> PathBuf {
    if let Some(p) = std::env::var_os("VIGIL_MODELS") {
        return PathBuf::from(p);
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models");
    if repo.join("efficientnet-lite0.onnx").exists() {
        repo
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/models")
    }
}

/// EfficientNet-Lite0 loaded at batch 1 on the CPU, or None (with a SKIP line) without the file.
fn efficientnet() -> Option<Model> {
    let path = models().join("efficientnet-lite0.onnx");
    if !path.exists() {
        println!(
            "SKIP: input shape tests on EfficientNet because {} is missing",
            path.display()
        );
        return None;
    }
    let opts = ModelOptions {
        threads: 1,
        ..ModelOptions::default()
    };
    Some(Model::load(&path, &opts).expect("load efficientnet-lite0"))
}

/// A deterministic pseudo-random "preprocessed image" in [-1, 1].
fn image(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn batch_three_rows_match_batch_one_on_one_context() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(m) = efficientnet() else { return };
    assert_eq!(m.inputs()[0].shape, vec![1, 3, 224, 224]);
    assert_eq!(m.batch(), 1);
    let per_image = 3 * 224 * 224;
    let images: Vec<Vec<f32>> = (0..3).map(|k| image(k + 1, per_image)).collect();
    let mut ctx = m.new_context().expect("context");

    // Each image alone at the loaded batch size: the reference rows.
    let singles: Vec<Vec<f32>> = images
        .iter()
        .map(|im| {
            let x = Tensor::from_f32(vec![1, 3, 224, 224], im.clone()).expect("input");
            let out = ctx.run(&[x]).expect("batch 1");
            assert_eq!(out[0].shape, vec![1, 1000]);
            out[0].to_f32_vec()
        })
        .collect();
    for k in 1..3 {
        assert!(
            max_abs_diff(&singles[0], &singles[k]) > 1e-3,
            "different images should give different logits"
        );
    }
    let cache = PlanCache::global();
    let misses_before = cache.misses();

    // Batch 3 on the same context: compiled for batch 3 on first use.
    let batch3 = Tensor::from_f32(vec![3, 3, 224, 224], images.concat()).expect("batch 3");
    let out3 = ctx.run(std::slice::from_ref(&batch3)).expect("batch 3");
    assert_eq!(out3[0].shape, vec![3, 1000]);
    let rows = out3[0].to_f32_vec();
    for (k, single) in singles.iter().enumerate() {
        let d = max_abs_diff(&rows[k * 1000..(k + 1) * 1000], single);
        println!("batch 3 row {k}: max |diff| to batch 1 = {d:e}");
        assert!(d < 1e-4, "row {k} differs from its batch-1 run by {d}");
    }
    assert_eq!(ctx.arenas(), 2);
    assert_eq!(m.compiled_batches(), vec![1, 3]);
    assert!(
        cache.misses() <= misses_before + 1,
        "batch 3 planned more than once"
    );

    // Batch 1 again on the same context: the loaded executable and arena, nothing planned.
    let (misses, hits, plans) = (cache.misses(), cache.hits(), cache.len());
    let x0 = Tensor::from_f32(vec![1, 3, 224, 224], images[0].clone()).expect("input");
    let again = ctx.run(std::slice::from_ref(&x0)).expect("batch 1 again");
    assert_eq!(again[0].to_f32_vec(), singles[0]);
    assert_eq!(
        (cache.misses(), cache.hits(), cache.len()),
        (misses, hits, plans)
    );
    assert_eq!(ctx.arenas(), 2);

    // Steady state at either seen batch: no heap allocation, no new arena.
    for _ in 0..2 {
        ctx.run_ref(&[&batch3]).expect("warm batch 3");
        ctx.run_ref(&[&x0]).expect("warm batch 1");
    }
    let (_, allocs, _) = counted(|| {
        for _ in 0..3 {
            ctx.run_ref(&[&batch3]).expect("batch 3");
            ctx.run_ref(&[&x0]).expect("batch 1");
        }
    });
    println!("steady state at batches 3 and 1: {allocs} allocations in 6 runs");
    assert_eq!(allocs, 0, "a run at a seen batch size allocated");
    assert_eq!(ctx.arenas(), 2);
    let last = ctx.run_ref(&[&batch3]).expect("batch 3")[0].to_f32_vec();
    assert_eq!(last, rows, "batch 3 results changed across runs");

    // Another context of the model reuses the model's batch-3 executable: nothing compiled
    // or planned, only its own arena.
    let mut ctx2 = m.new_context().expect("second context");
    let out = ctx2.run(std::slice::from_ref(&batch3)).expect("batch 3");
    assert_eq!(out[0].to_f32_vec(), rows);
    assert_eq!((cache.misses(), cache.len()), (misses, plans));
    assert_eq!(m.compiled_batches(), vec![1, 3]);
    assert_eq!(ctx2.arenas(), 2);

    // A second model compiled for batch 3 takes the same plan from the cache.
    let m2 = efficientnet().expect("loaded above");
    let (misses, hits) = (cache.misses(), cache.hits());
    let mut c = m2.new_context().expect("context");
    let out = c.run(std::slice::from_ref(&batch3)).expect("batch 3");
    assert_eq!(out[0].to_f32_vec(), rows);
    assert_eq!(cache.misses(), misses, "batch 3 was planned again");
    assert_eq!(
        cache.hits(),
        hits + 1,
        "batch 3's plan did not come from the cache"
    );
}

#[test]
fn another_batch_costs_its_kernels_and_arena_not_a_second_graph() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(m) = efficientnet() else { return };
    let weights: usize = m
        .graph()
        .values
        .iter()
        .filter_map(|v| v.constant.as_ref())
        .map(|t| t.as_bytes().len())
        .sum();
    let mut ctx = m.new_context().expect("context");
    let x = Tensor::from_f32(vec![2, 3, 224, 224], image(7, 2 * 3 * 224 * 224)).expect("input");
    let (out, _, held) = counted(|| ctx.run(std::slice::from_ref(&x)).expect("batch 2"));
    let rows = out[0].to_f32_vec();
    // Each row against its own batch-1 run.
    for k in 0..2 {
        let one = Tensor::from_f32(
            vec![1, 3, 224, 224],
            x.as_f32().expect("f32")[k * 150_528..(k + 1) * 150_528].to_vec(),
        )
        .expect("row");
        let want = ctx.run(&[one]).expect("batch 1")[0].to_f32_vec();
        let d = max_abs_diff(&rows[k * 1000..(k + 1) * 1000], &want);
        assert!(d < 1e-4, "batch 2 row {k} differs by {d}");
    }
    let arena_bytes: usize = {
        // The batch-2 arena is about twice the batch-1 arena (activations scale with batch).
        2 * m.arena_bytes()
    };
    println!(
        "batch 2 first run kept {held} B: weights {weights} B in the graph, batch-1 arena {} B",
        m.arena_bytes()
    );
    // Kept: prepacked kernel weights (about the weights once) and the arena; a second copy of
    // the graph's constants on top would exceed this.
    let held = usize::try_from(held).unwrap_or(0);
    assert!(
        held < weights + arena_bytes + weights / 2,
        "compiling batch 2 kept {held} B: weights {weights} B, arena ~{arena_bytes} B"
    );
}

#[test]
fn bad_shapes_are_bad_input_and_compile_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(m) = efficientnet() else { return };
    let mut ctx = m.new_context().expect("context");
    let cases: Vec<(&str, Tensor, &str)> = vec![
        (
            "rank 3",
            Tensor::zeros(DataType::F32, vec![3, 224, 224]),
            "rank 3",
        ),
        (
            "4 channels",
            Tensor::zeros(DataType::F32, vec![1, 4, 224, 224]),
            "only the batch",
        ),
        (
            "200 rows at batch 2",
            Tensor::zeros(DataType::F32, vec![2, 3, 200, 224]),
            "only the batch",
        ),
        (
            "zero batch",
            Tensor::zeros(DataType::F32, vec![0, 3, 224, 224]),
            "at least 1",
        ),
        (
            "i64 elements",
            Tensor::zeros(DataType::I64, vec![2, 3, 224, 224]),
            "element type",
        ),
    ];
    for (what, t, needle) in &cases {
        match ctx.run(std::slice::from_ref(t)) {
            Err(Error::BadInput(msg)) => {
                println!("{what}: {msg}");
                assert!(msg.contains(needle), "{what}: '{msg}' lacks '{needle}'");
                assert!(
                    msg.contains("'input'"),
                    "{what}: '{msg}' does not name the input"
                );
            }
            Err(e) => panic!("{what}: expected bad input, got {e}"),
            Ok(_) => panic!("{what}: ran"),
        }
    }
    let one = Tensor::zeros(DataType::F32, vec![1, 3, 224, 224]);
    match ctx.run(&[one.clone(), one.clone()]) {
        Err(Error::BadInput(msg)) => assert!(msg.contains("1 input"), "{msg}"),
        Err(e) => panic!("two inputs: expected bad input, got {e}"),
        Ok(_) => panic!("two inputs ran"),
    }
    assert_eq!(m.compiled_batches(), vec![1]);
    assert_eq!(ctx.arenas(), 1);
    let out = ctx.run(&[one]).expect("a good input still runs");
    assert_eq!(out[0].shape, vec![1, 1000]);
    assert!(out[0].to_f32_vec().iter().all(|v| v.is_finite()));
}

/// y = relu(x) for x declared `[batch_dim, 4]`.
fn relu_model(batch_dim: Option<usize>, opts: &ModelOptions) -> vigil_engine::Result<Model> {
    let mut g = Graph::default();
    let x = g.add_value("x", DataType::F32);
    g.values[x].declared = Some(vec![batch_dim, Some(4)]);
    let y = g.add_value("y", DataType::F32);
    g.nodes.push(Node {
        name: "relu".into(),
        op: Op::Unary(UnaryOp::Act(Activation::Relu)),
        inputs: vec![Some(x)],
        outputs: vec![y],
    });
    g.inputs = vec![x];
    g.outputs = vec![y];
    g.opset = 17;
    Model::from_graph(g, opts)
}

fn ramp(batch: usize) -> Tensor {
    let n = batch * 4;
    Tensor::from_f32(
        vec![batch, 4],
        (0..n).map(|i| i as f32 - n as f32 / 2.0).collect(),
    )
    .expect("ramp")
}

fn check_relu(x: &Tensor, y: &Tensor) {
    assert_eq!(y.shape, x.shape);
    let want: Vec<f32> = x.to_f32_vec().iter().map(|v| v.max(0.0)).collect();
    assert_eq!(y.to_f32_vec(), want);
}

#[test]
fn at_most_max_shapes_batches_and_the_rest_still_run() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let m = relu_model(None, &ModelOptions::default()).expect("model");
    let mut ctx = m.new_context().expect("context");
    for b in 1..=MAX_SHAPES {
        let x = ramp(b);
        let y = ctx.run(std::slice::from_ref(&x)).expect("batch");
        check_relu(&x, &y[0]);
    }
    assert_eq!(ctx.arenas(), MAX_SHAPES);
    let extra = MAX_SHAPES + 1;
    match ctx.run(&[ramp(extra)]) {
        Err(Error::BadInput(msg)) => {
            println!("batch {extra}: {msg}");
            assert!(msg.contains(&format!("at most {MAX_SHAPES}")), "{msg}");
        }
        Err(e) => panic!("expected bad input, got {e}"),
        Ok(_) => panic!("a {extra}th shape compiled"),
    }
    assert_eq!(m.compiled_batches(), (1..=MAX_SHAPES).collect::<Vec<_>>());
    // Seen batches still run, on the arenas they had.
    for b in [3, 1, MAX_SHAPES] {
        let x = ramp(b);
        let y = ctx.run(std::slice::from_ref(&x)).expect("seen batch");
        check_relu(&x, &y[0]);
    }
    assert_eq!(ctx.arenas(), MAX_SHAPES);
}

#[test]
fn fixed_batch_models_reject_other_batches_and_pooled_contexts_use_the_pool() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fixed = relu_model(Some(2), &ModelOptions::default()).expect("fixed model");
    assert_eq!(fixed.inputs()[0].shape, vec![2, 4]);
    let mut ctx = fixed.new_context().expect("context");
    match ctx.run(&[ramp(3)]) {
        Err(Error::BadInput(msg)) => assert!(msg.contains("fixed shape"), "{msg}"),
        Err(e) => panic!("expected bad input, got {e}"),
        Ok(_) => panic!("a fixed-batch model ran batch 3"),
    }
    let x = ramp(2);
    check_relu(&x, &ctx.run(std::slice::from_ref(&x)).expect("batch 2")[0]);

    // Loaded at batch 4 (symbolic batch), run at 2 from a pooled context: the second arena is
    // a block of the same pool.
    let opts = ModelOptions {
        batch: 4,
        ..ModelOptions::default()
    };
    let m = relu_model(None, &opts).expect("model");
    let pool = host_pool(1 << 20).expect("pool");
    let mut ctx = m.new_context_in(&pool).expect("pooled");
    assert_eq!(pool.stats().blocks, 1);
    for b in [4, 2, 4, 2] {
        let x = ramp(b);
        check_relu(&x, &ctx.run(std::slice::from_ref(&x)).expect("run")[0]);
    }
    assert_eq!(pool.stats().blocks, 2);
    assert_eq!(ctx.arenas(), 2);
    drop(ctx);
    assert_eq!(pool.stats().blocks, 0);
}

/// NanoDet's heads reshape with a batch-1 shape the exporter computes from constants: at batch
/// 2 every output must be the two batch-1 outputs stacked (not the batch folded into anchors).
#[test]
fn nanodet_batch_two_outputs_stack_the_batch_one_outputs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = models().join("nanodet-m-416.onnx");
    if !path.exists() {
        println!(
            "SKIP: NanoDet batch test because {} is missing",
            path.display()
        );
        return;
    }
    let opts = ModelOptions {
        threads: 1,
        ..ModelOptions::default()
    };
    let m = Model::load(&path, &opts).expect("load nanodet");
    let mut ctx = m.new_context().expect("context");
    let n = 3 * 416 * 416;
    let images: Vec<Vec<f32>> = (0..2)
        .map(|k| image(k + 11, n).iter().map(|v| v * 0.5 + 0.5).collect())
        .collect();
    let singles: Vec<Vec<Tensor>> = images
        .iter()
        .map(|im| {
            let x = Tensor::from_f32(vec![1, 3, 416, 416], im.clone()).expect("input");
            ctx.run(&[x]).expect("batch 1")
        })
        .collect();
    let x = Tensor::from_f32(vec![2, 3, 416, 416], images.concat()).expect("batch 2");
    let outs = ctx.run(&[x]).expect("batch 2");
    assert_eq!(outs.len(), 6);
    for (k, o) in outs.iter().enumerate() {
        let one = &singles[0][k];
        let mut want = one.shape.clone();
        want[0] = 2;
        assert_eq!(o.shape, want, "output {k}");
        let v = o.to_f32_vec();
        let half = v.len() / 2;
        for (row, single) in singles.iter().enumerate() {
            let got = &v[row * half..(row + 1) * half];
            let d = max_abs_diff(got, &single[k].to_f32_vec());
            assert!(d < 1e-4, "output {k} row {row} differs from batch 1 by {d}");
        }
    }
}

/// `y = reshape(x, [-1])` with x `[batch, 4]`: a graph that folds the batch away (at batch 1
/// y is [4], at batch 2 it would be [8], not 2 rows of [4]).
fn flatten_graph() -> Graph {
    let mut g = Graph::default();
    let x = g.add_value("x", DataType::F32);
    g.values[x].declared = Some(vec![None, Some(4)]);
    let s = g.add_constant("s", Tensor::from_i64(vec![1], vec![-1]).expect("shape"));
    let y = g.add_value("y", DataType::F32);
    g.nodes.push(Node {
        name: "flat".into(),
        op: Op::Reshape { allowzero: false },
        inputs: vec![Some(x), Some(s)],
        outputs: vec![y],
    });
    g.inputs = vec![x];
    g.outputs = vec![y];
    g.opset = 17;
    g
}

/// Loading at batch 2 (`ModelOptions::batch`, what `batch = 2` in the config does) carries the
/// batch through the Reshapes the exporter wrote batch 1 into: each row equals a batch-1 model's
/// result for that image; a graph that folds the batch away refuses to load at batch 2.
#[test]
fn loading_at_batch_two_carries_the_batch_through() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (file, side) in [
        ("nanodet-m-416.onnx", 416usize),
        ("efficientnet-lite0.onnx", 224),
    ] {
        let path = models().join(file);
        if !path.exists() {
            println!(
                "SKIP: {file} batch-2 load because {} is missing",
                path.display()
            );
            continue;
        }
        let at = |batch: usize| {
            let opts = ModelOptions {
                threads: 1,
                batch,
                ..ModelOptions::default()
            };
            Model::load(&path, &opts).unwrap_or_else(|e| panic!("{file} at batch {batch}: {e}"))
        };
        let (one, two) = (at(1), at(2));
        let n = 3 * side * side;
        let images: Vec<Vec<f32>> = (0..2).map(|k| image(k + 31, n)).collect();
        let mut c1 = one.new_context().expect("context");
        let singles: Vec<Vec<Tensor>> = images
            .iter()
            .map(|im| {
                let x = Tensor::from_f32(vec![1, 3, side, side], im.clone()).expect("input");
                c1.run(&[x]).expect("batch 1")
            })
            .collect();
        let mut c2 = two.new_context().expect("context");
        let x = Tensor::from_f32(vec![2, 3, side, side], images.concat()).expect("batch 2");
        let outs = c2.run(&[x]).expect("batch 2");
        assert_eq!(outs.len(), singles[0].len());
        for (k, o) in outs.iter().enumerate() {
            let mut want = singles[0][k].shape.clone();
            want[0] = 2;
            assert_eq!(o.shape, want, "{file} output {k}");
            let v = o.to_f32_vec();
            let half = v.len() / 2;
            for (row, single) in singles.iter().enumerate() {
                let d = max_abs_diff(&v[row * half..(row + 1) * half], &single[k].to_f32_vec());
                assert!(d < 1e-4, "{file} output {k} row {row} differs by {d}");
            }
        }
        println!("{file}: loaded at batch 2, both rows equal batch-1 runs");
    }
    // y = reshape(x, [-1]) cannot carry a batch: loading it at batch 2 is refused.
    let g = flatten_graph();
    let opts = ModelOptions {
        batch: 2,
        ..ModelOptions::default()
    };
    match Model::from_graph(g, &opts) {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("does not carry the batch"), "{msg}"),
        Err(e) => panic!("expected unsupported, got {e}"),
        Ok(m) => panic!("loaded, giving outputs {:?}", m.outputs()),
    }
}

#[test]
fn a_graph_that_folds_the_batch_away_is_refused() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // y = reshape(x, [-1]): at batch 1 y is [4], at batch 2 it would be [8], not 2 rows of [4].
    let g = flatten_graph();
    let m = Model::from_graph(g, &ModelOptions::default()).expect("model");
    let mut ctx = m.new_context().expect("context");
    match ctx.run(&[ramp(2)]) {
        Err(Error::Unsupported(msg)) => {
            println!("batch 2: {msg}");
            assert!(msg.contains("does not carry the batch"), "{msg}");
        }
        Err(e) => panic!("expected unsupported, got {e}"),
        Ok(o) => panic!("ran, giving {:?}", o[0].shape),
    }
    assert_eq!(m.compiled_batches(), vec![1]);
    // Refused again from the cache, from another context too (same reason).
    let mut other = m.new_context().expect("context");
    match other.run(&[ramp(2)]) {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("[8]"), "{msg}"),
        Err(e) => panic!("expected unsupported, got {e}"),
        Ok(_) => panic!("ran"),
    }
    assert_eq!(other.arenas(), 1);
    let x = ramp(1);
    let y = ctx.run(std::slice::from_ref(&x)).expect("batch 1");
    assert_eq!(y[0].shape, vec![4]);
    assert_eq!(y[0].to_f32_vec(), x.to_f32_vec());
}

/// Backends other than the CPU run only the loaded batch: another is `Unsupported`, and the
/// loaded one still runs.
#[cfg(feature = "cuda")]
#[test]
fn cuda_models_refuse_a_batch_change() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = vigil_engine::backend::cuda::probe(0) {
        println!("SKIP: CUDA batch-change test because there is no usable CUDA device: {e}");
        return;
    }
    let path = models().join("efficientnet-lite0.onnx");
    let opts = ModelOptions {
        device: vigil_engine::Device::Cuda,
        ..ModelOptions::default()
    };
    let m = Model::load(&path, &opts).expect("load on cuda");
    let mut ctx = m.new_context().expect("context");
    let x2 = Tensor::from_f32(vec![2, 3, 224, 224], image(3, 2 * 150_528)).expect("batch 2");
    match ctx.run(&[x2]) {
        Err(Error::Unsupported(msg)) => {
            println!("cuda batch 2: {msg}");
            assert!(msg.contains("cuda backend"), "{msg}");
        }
        Err(e) => panic!("expected unsupported, got {e}"),
        Ok(_) => panic!("the cuda backend ran another batch"),
    }
    assert_eq!(m.compiled_batches(), vec![1]);
    assert_eq!(ctx.arenas(), 1);
    let x1 = Tensor::from_f32(vec![1, 3, 224, 224], image(3, 150_528)).expect("batch 1");
    let out = ctx.run(&[x1]).expect("batch 1 on cuda");
    assert_eq!(out[0].shape, vec![1, 1000]);
    assert!(out[0].to_f32_vec().iter().all(|v| v.is_finite()));
}

/// Lanes (parts of the batch run at once on CUDA streams) are refused with a clear error
/// wherever they cannot run: zero lanes, a batch they do not split evenly, and the CPU.
#[test]
fn lanes_that_cannot_run_are_clear_errors() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = models().join("efficientnet-lite0.onnx");
    if !path.exists() {
        println!("SKIP: lanes test because {} is missing", path.display());
        return;
    }
    let load = |batch, lanes| {
        Model::load(
            &path,
            &ModelOptions {
                batch,
                lanes,
                threads: 1,
                ..ModelOptions::default()
            },
        )
        .map(|_| ())
    };
    match load(2, 0) {
        Err(Error::BadInput(msg)) => assert!(msg.contains("at least 1"), "{msg}"),
        other => panic!("0 lanes: {other:?}"),
    }
    match load(3, 2) {
        Err(Error::BadInput(msg)) => assert!(msg.contains("evenly"), "{msg}"),
        other => panic!("2 lanes of batch 3: {other:?}"),
    }
    match load(4, 2) {
        Err(Error::Unsupported(msg)) => assert!(msg.contains("CUDA"), "{msg}"),
        other => panic!("2 lanes on the CPU: {other:?}"),
    }
    load(4, 1).expect("one lane is the plain model");
}
