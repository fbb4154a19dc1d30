//! Arena plans of the two shared models: size against an independently computed lower bound,
//! in-place sharing that changes no output bit, and plans reused from the cache per shape.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use vigil_engine::backend::cpu::CpuExecutable;
use vigil_engine::backend::Executable;
use vigil_engine::ir::Graph;
use vigil_engine::plan::{MemoryPlan, PlanCache, ALIGNMENT};
use vigil_engine::{Model, ModelOptions, Tensor};

const MODELS: [&str; 2] = ["efficientnet-lite0.onnx", "nanodet-m-416.onnx"];

fn load(name: &str, batch: usize) -> Option<Model> {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models")
        .join(name);
    if !path.exists() {
        eprintln!("SKIP: {name} because {} is missing", path.display());
        return None;
    }
    let opts = ModelOptions {
        threads: 1,
        batch,
        ..ModelOptions::default()
    };
    Some(Model::load(&path, &opts).expect("load"))
}

fn aligned(n: usize) -> usize {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// Steps each runtime value lives over (producer or 0 for inputs, to last reader or past the
/// end for outputs), computed from the graph alone.
fn lifetimes(g: &Graph) -> Vec<Option<(usize, usize)>> {
    let mut life: Vec<Option<(usize, usize)>> = vec![None; g.values.len()];
    for &v in &g.inputs {
        life[v] = Some((0, 0));
    }
    for (i, n) in g.nodes.iter().enumerate() {
        for &o in &n.outputs {
            life[o] = Some(life[o].map_or((i, i), |(f, l)| (f.min(i), l.max(i))));
        }
        for v in n.present_inputs() {
            if let Some((f, l)) = life[v] {
                life[v] = Some((f, l.max(i)));
            }
        }
    }
    for &o in &g.outputs {
        if let Some((f, _)) = life[o] {
            life[o] = Some((f, g.nodes.len()));
        }
    }
    for (v, value) in g.values.iter().enumerate() {
        if value.constant.is_some() {
            life[v] = None;
        }
    }
    life
}

/// Checks that buffers live at the same step never overlap (except an in-place output with
/// the input it overwrites, at that node), and returns the most bytes of distinct buffers live
/// at one step: the lower bound no arena for this plan can go under.
fn check_and_lower_bound(g: &Graph, p: &MemoryPlan) -> usize {
    let life = lifetimes(g);
    let mut best = 0;
    for step in 0..=g.nodes.len() {
        let mut live: Vec<(usize, usize, usize)> = Vec::new(); // (offset, end, value or MAX)
        for (v, l) in life.iter().enumerate() {
            if let Some((f, e)) = *l {
                if f <= step && step <= e {
                    let s = p.values[v].expect("live value without a slot");
                    let bytes = g.shape(v).expect("shape").iter().product::<usize>()
                        * g.values[v].dtype.size();
                    assert!(bytes <= s.size, "slot of value {v} too small");
                    live.push((s.offset, s.offset + s.size, v));
                }
            }
        }
        if let Some(Some(s)) = p.scratch.get(step) {
            live.push((s.offset, s.offset + s.size, usize::MAX));
        }
        live.sort_unstable();
        live.dedup_by_key(|b| (b.0, b.1));
        for w in live.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "buffers {:?} and {:?} overlap at step {step}",
                w[0],
                w[1]
            );
        }
        best = best.max(live.iter().map(|b| aligned(b.1 - b.0)).sum::<usize>());
    }
    best
}

#[test]
fn plans_are_within_five_percent_of_the_lower_bound() {
    for name in MODELS {
        let Some(m) = load(name, 1) else { continue };
        let g = Arc::new(m.graph().clone());
        let exe = CpuExecutable::new(Arc::clone(&g), 1).expect("compile");
        let p = exe.plan();
        let lower = check_and_lower_bound(&g, p);
        assert_eq!(lower, p.lower_bound, "{name}: planner's lower bound");
        let shared = p.in_place.iter().filter(|x| x.is_some()).count();
        let ratio = p.arena_bytes as f64 / lower as f64;
        println!(
            "{name}: arena {} B, lower bound {} B, ratio {ratio:.4}, {shared} nodes in place",
            p.arena_bytes, lower
        );
        assert!(ratio <= 1.05, "{name}: ratio {ratio:.4}");
        assert!(shared > 0, "{name}: no node runs in place");
        // Every in-place node writes its output over its input's slot.
        for (i, k) in p.in_place.iter().enumerate() {
            if let Some(k) = *k {
                let n = &g.nodes[i];
                let v = n.inputs[k].expect("aliased input");
                assert_eq!(p.values[v], p.values[n.outputs[0]]);
            }
        }
        // Without in-place sharing the arena is no smaller.
        let plain = CpuExecutable::with_in_place(g, 1, false).expect("compile");
        assert!(plain.plan().in_place.iter().all(|x| x.is_none()));
        assert!(plain.plan().arena_bytes >= p.arena_bytes);
        println!(
            "{name}: without in place: arena {} B (ratio {:.4} against its own bound)",
            plain.plan().arena_bytes,
            plain.plan().ratio()
        );
    }
}

fn run(exe: Arc<CpuExecutable>, g: &Graph, input: &Tensor) -> Vec<Tensor> {
    let mut ctx = exe.new_context().expect("context");
    let mut outs: Vec<Tensor> = g
        .outputs
        .iter()
        .map(|&o| Tensor::zeros(g.values[o].dtype, g.shape(o).expect("shape").to_vec()))
        .collect();
    ctx.run(&[input], &mut outs).expect("run");
    outs
}

#[test]
fn in_place_outputs_match_the_unshared_run_bit_for_bit() {
    for name in MODELS {
        let Some(m) = load(name, 1) else { continue };
        let g = Arc::new(m.graph().clone());
        let shape = m.inputs()[0].shape.clone();
        let n: usize = shape.iter().product();
        let input = Tensor::from_f32(
            shape,
            (0..n).map(|i| ((i * 37 % 251) as f32) / 251.0).collect(),
        )
        .expect("input");
        let shared = Arc::new(CpuExecutable::new(Arc::clone(&g), 1).expect("compile"));
        let plain = Arc::new(CpuExecutable::with_in_place(Arc::clone(&g), 1, false).expect("c"));
        let a = run(shared, &g, &input);
        let b = run(plain, &g, &input);
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.shape, y.shape);
            assert_eq!(x.as_bytes(), y.as_bytes(), "{name}: outputs differ");
        }
        assert!(a.iter().any(|t| t.as_bytes().iter().any(|&c| c != 0)));
    }
}

#[test]
fn a_shape_seen_before_reuses_its_plan() {
    // nanodet's graph is batch-agnostic (efficientnet's classifier reshape pins batch 1).
    let name = MODELS[1];
    let (Some(m1), Some(m2)) = (load(name, 1), load(name, 2)) else {
        return;
    };
    let cache = PlanCache::global();
    let g1 = Arc::new(m1.graph().clone());
    let g2 = Arc::new(m2.graph().clone());
    let e1 = CpuExecutable::new(Arc::clone(&g1), 1).expect("compile");
    let e2 = CpuExecutable::new(Arc::clone(&g2), 1).expect("compile");
    assert!(!Arc::ptr_eq(e1.shared_plan(), e2.shared_plan()));
    assert!(e2.plan().arena_bytes > e1.plan().arena_bytes);
    let hits = cache.hits();
    // The batch-2 graph again (a fresh copy, as a reload would give): planned once, reused.
    let again = Arc::new(m2.graph().clone());
    let e3 = CpuExecutable::new(again, 1).expect("compile");
    assert!(Arc::ptr_eq(e2.shared_plan(), e3.shared_plan()));
    assert!(cache.hits() > hits);
    assert_eq!(e3.arena_bytes(), e2.arena_bytes());
}
