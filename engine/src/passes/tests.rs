//! Tests for the passes: structure checks plus numerics against a tiny naive reference
//! interpreter (written here, independent of the kernels) run on the graph before and after.

use std::collections::HashMap;

use super::util::{broadcast, permute_tensor, strides};
use super::*;
use crate::ir::*;

// ---------------------------------------------------------------- reference interpreter

fn f(t: &Tensor) -> Vec<f32> {
    t.as_f32().expect("f32 tensor").to_vec()
}

fn t32(shape: &[usize], data: Vec<f32>) -> Tensor {
    Tensor::from_f32(shape.to_vec(), data).expect("tensor")
}

/// Naive NCHW conv (OIHW weights).
fn conv_nchw(x: &Tensor, w: &Tensor, b: Option<&Tensor>, a: &ConvAttrs) -> Tensor {
    let (n, c, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (o, cg, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
    let s = if a.strides.is_empty() {
        vec![1, 1]
    } else {
        a.strides.clone()
    };
    let d = if a.dilations.is_empty() {
        vec![1, 1]
    } else {
        a.dilations.clone()
    };
    let p = if a.pads.is_empty() {
        vec![0; 4]
    } else {
        a.pads.clone()
    };
    let g = a.group;
    assert_eq!(c, cg * g);
    let oh = (h + p[0] + p[2] - ((kh - 1) * d[0] + 1)) / s[0] + 1;
    let ow = (wd + p[1] + p[3] - ((kw - 1) * d[1] + 1)) / s[1] + 1;
    let (xv, wv) = (f(x), f(w));
    let bv = b.map(f);
    let mut out = vec![0f32; n * o * oh * ow];
    let opg = o / g;
    for ni in 0..n {
        for oc in 0..o {
            let grp = oc / opg;
            for y in 0..oh {
                for xx in 0..ow {
                    let mut acc = bv.as_ref().map_or(0.0, |b| b[oc]);
                    for ic in 0..cg {
                        let ci = grp * cg + ic;
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (y * s[0] + ky * d[0]) as isize - p[0] as isize;
                                let ix = (xx * s[1] + kx * d[1]) as isize - p[1] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                acc += xv[((ni * c + ci) * h + iy as usize) * wd + ix as usize]
                                    * wv[((oc * cg + ic) * kh + ky) * kw + kx];
                            }
                        }
                    }
                    out[((ni * o + oc) * oh + y) * ow + xx] =
                        a.activation.map_or(acc, |act| act.apply(acc));
                }
            }
        }
    }
    t32(&[n, o, oh, ow], out)
}

/// Naive NCHW max/average pool.
fn pool_nchw(x: &Tensor, a: &PoolAttrs, max: bool) -> Tensor {
    let (n, c, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (kh, kw) = (a.kernel_shape[0], a.kernel_shape[1]);
    let s = if a.strides.is_empty() {
        vec![1, 1]
    } else {
        a.strides.clone()
    };
    let p = if a.pads.is_empty() {
        vec![0; 4]
    } else {
        a.pads.clone()
    };
    let oh = (h + p[0] + p[2] - kh) / s[0] + 1;
    let ow = (w + p[1] + p[3] - kw) / s[1] + 1;
    let xv = f(x);
    let mut out = Vec::new();
    for ni in 0..n {
        for ci in 0..c {
            for y in 0..oh {
                for xx in 0..ow {
                    let (mut m, mut sum, mut cnt) = (f32::NEG_INFINITY, 0.0f32, 0usize);
                    for ky in 0..kh {
                        for kx in 0..kw {
                            let iy = (y * s[0] + ky) as isize - p[0] as isize;
                            let ix = (xx * s[1] + kx) as isize - p[1] as isize;
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                if a.count_include_pad {
                                    cnt += 1;
                                }
                                continue;
                            }
                            let v = xv[((ni * c + ci) * h + iy as usize) * w + ix as usize];
                            m = m.max(v);
                            sum += v;
                            cnt += 1;
                        }
                    }
                    out.push(if max { m } else { sum / cnt as f32 });
                }
            }
        }
    }
    t32(&[n, c, oh, ow], out)
}

fn to_nchw(t: &Tensor) -> Tensor {
    permute_tensor(t, &TO_NCHW).expect("perm")
}
fn to_nhwc(t: &Tensor) -> Tensor {
    permute_tensor(t, &TO_NHWC).expect("perm")
}

fn bcast_index(out_idx: &[usize], shape: &[usize]) -> usize {
    let off = out_idx.len() - shape.len();
    let st = strides(shape);
    shape
        .iter()
        .enumerate()
        .map(|(k, &d)| if d == 1 { 0 } else { out_idx[k + off] * st[k] })
        .sum()
}

fn binary(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        other => panic!("binary {other:?} not in the reference"),
    }
}

fn unary(u: UnaryOp, x: f32) -> f32 {
    match u {
        UnaryOp::Act(a) => a.apply(x),
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Reciprocal => 1.0 / x,
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round(),
        other => panic!("unary {other:?} not in the reference"),
    }
}

/// Evaluates a broadcasting pointwise function of several inputs.
fn pointwise(ins: &[&Tensor], fun: impl Fn(&[f32]) -> f32) -> Tensor {
    let mut shape: Vec<usize> = vec![];
    for t in ins {
        shape = broadcast(&shape, &t.shape).expect("broadcastable");
    }
    let n: usize = shape.iter().product();
    let datas: Vec<Vec<f32>> = ins.iter().map(|t| f(t)).collect();
    let st = strides(&shape);
    let mut out = Vec::with_capacity(n);
    let mut args = vec![0f32; ins.len()];
    for lin in 0..n {
        let idx: Vec<usize> = st
            .iter()
            .zip(&shape)
            .map(|(&s, &d)| (lin / s) % d)
            .collect();
        for (k, t) in ins.iter().enumerate() {
            args[k] = datas[k][bcast_index(&idx, &t.shape)];
        }
        out.push(fun(&args));
    }
    t32(&shape, out)
}

fn eval_node(node: &Node, env: &HashMap<ValueId, Tensor>) -> Vec<Tensor> {
    let get = |k: usize| -> Option<Tensor> {
        node.input(k)
            .map(|v| env.get(&v).cloned().expect("input computed"))
    };
    let x = get(0).expect("input 0");
    let out = match &node.op {
        Op::Conv(a) => {
            let xin = if a.layout == Layout::Nhwc {
                to_nchw(&x)
            } else {
                x
            };
            let y = conv_nchw(&xin, &get(1).expect("W"), get(2).as_ref(), a);
            if a.layout == Layout::Nhwc {
                to_nhwc(&y)
            } else {
                y
            }
        }
        Op::MaxPool(a) | Op::AveragePool(a) => {
            let max = matches!(node.op, Op::MaxPool(_));
            let xin = if a.layout == Layout::Nhwc {
                to_nchw(&x)
            } else {
                x
            };
            let y = pool_nchw(&xin, a, max);
            if a.layout == Layout::Nhwc {
                to_nhwc(&y)
            } else {
                y
            }
        }
        Op::GlobalAveragePool { layout } => {
            let xin = if *layout == Layout::Nhwc {
                to_nchw(&x)
            } else {
                x
            };
            let (n, c, h, w) = (xin.shape[0], xin.shape[1], xin.shape[2], xin.shape[3]);
            let v = f(&xin);
            let o: Vec<f32> = (0..n * c)
                .map(|k| v[k * h * w..(k + 1) * h * w].iter().sum::<f32>() / (h * w) as f32)
                .collect();
            let y = t32(&[n, c, 1, 1], o);
            if *layout == Layout::Nhwc {
                to_nhwc(&y)
            } else {
                y
            }
        }
        Op::BatchNormalization { epsilon } => {
            let (s, b, m, var) = (
                f(&get(1).unwrap()),
                f(&get(2).unwrap()),
                f(&get(3).unwrap()),
                f(&get(4).unwrap()),
            );
            let c = x.shape[1];
            let inner: usize = x.shape[2..].iter().product();
            let v: Vec<f32> = f(&x)
                .iter()
                .enumerate()
                .map(|(k, &xv)| {
                    let ch = (k / inner) % c;
                    (xv - m[ch]) / (var[ch] + epsilon).sqrt() * s[ch] + b[ch]
                })
                .collect();
            t32(&x.shape, v)
        }
        Op::Unary(u) => pointwise(&[&x], |a| unary(*u, a[0])),
        Op::Clip => {
            let lo = get(1).map_or(f32::NEG_INFINITY, |t| f(&t)[0]);
            let hi = get(2).map_or(f32::INFINITY, |t| f(&t)[0]);
            pointwise(&[&x], |a| a[0].max(lo).min(hi))
        }
        Op::Binary(op) => {
            let y = get(1).unwrap();
            pointwise(&[&x, &y], |a| binary(*op, a[0], a[1]))
        }
        Op::Elementwise(steps) => {
            let ins: Vec<Tensor> = (0..node.inputs.len()).map(|k| get(k).unwrap()).collect();
            let refs: Vec<&Tensor> = ins.iter().collect();
            pointwise(&refs, |a| {
                let mut acc = a[0];
                for s in steps {
                    acc = match *s {
                        ChainStep::Unary(u) => unary(u, acc),
                        ChainStep::Binary {
                            op,
                            operand,
                            acc_on_right,
                        } => {
                            if acc_on_right {
                                binary(op, a[operand], acc)
                            } else {
                                binary(op, acc, a[operand])
                            }
                        }
                    };
                }
                acc
            })
        }
        Op::Pad {
            mode: PadMode::Constant,
        } => {
            let pads = get(1).unwrap().to_i64_vec().unwrap();
            let val = get(2).map_or(0.0, |t| f(&t)[0]);
            let r = x.shape.len();
            let oshape: Vec<usize> = (0..r)
                .map(|d| (x.shape[d] as i64 + pads[d] + pads[r + d]) as usize)
                .collect();
            let ost = strides(&oshape);
            let ist = strides(&x.shape);
            let xv = f(&x);
            let n: usize = oshape.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|lin| {
                    let mut off = 0usize;
                    for d in 0..r {
                        let i = ((lin / ost[d]) % oshape[d]) as i64 - pads[d];
                        if i < 0 || i >= x.shape[d] as i64 {
                            return val;
                        }
                        off += i as usize * ist[d];
                    }
                    xv[off]
                })
                .collect();
            t32(&oshape, v)
        }
        Op::Transpose { perm } => permute_tensor(&x, perm).unwrap(),
        Op::Reshape { .. } => {
            let spec = get(1).unwrap().to_i64_vec().unwrap();
            let total = x.len();
            let mut shape: Vec<usize> = spec
                .iter()
                .enumerate()
                .map(|(k, &d)| {
                    if d == 0 {
                        x.shape[k]
                    } else {
                        d.max(1) as usize
                    }
                })
                .collect();
            if let Some(p) = spec.iter().position(|&d| d == -1) {
                let known: usize = shape
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| *k != p)
                    .map(|(_, &d)| d)
                    .product();
                shape[p] = total / known;
            }
            t32(&shape, f(&x))
        }
        Op::Flatten { axis } => {
            let a = *axis as usize;
            t32(
                &[x.shape[..a].iter().product(), x.shape[a..].iter().product()],
                f(&x),
            )
        }
        Op::Concat { axis } => {
            let ins: Vec<Tensor> = (0..node.inputs.len()).map(|k| get(k).unwrap()).collect();
            let r = x.shape.len() as i64;
            let a = if *axis < 0 { axis + r } else { *axis } as usize;
            let outer: usize = x.shape[..a].iter().product();
            let mut shape = x.shape.clone();
            shape[a] = ins.iter().map(|t| t.shape[a]).sum();
            let mut v = Vec::new();
            for o in 0..outer {
                for t in &ins {
                    let chunk: usize = t.shape[a..].iter().product();
                    v.extend_from_slice(&f(t)[o * chunk..(o + 1) * chunk]);
                }
            }
            t32(&shape, v)
        }
        Op::Identity => x,
        other => panic!("op {other:?} not in the reference"),
    };
    vec![out]
}

/// Runs the graph on the given inputs and returns its outputs.
fn eval(g: &Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    g.validate().expect("valid graph");
    let mut env: HashMap<ValueId, Tensor> = HashMap::new();
    for (v, val) in g.values.iter().enumerate() {
        if let Some(c) = &val.constant {
            env.insert(v, (**c).clone());
        }
    }
    for (&v, t) in g.inputs.iter().zip(inputs) {
        env.insert(v, t.clone());
    }
    for node in &g.nodes {
        let outs = eval_node(node, &env);
        for (&o, t) in node.outputs.iter().zip(outs) {
            if let Some(s) = &g.values[o].shape {
                assert_eq!(
                    s, &t.shape,
                    "recorded shape of '{}' differs from computed",
                    g.values[o].name
                );
            }
            env.insert(o, t);
        }
    }
    g.outputs.iter().map(|o| env[o].clone()).collect()
}

fn assert_close(a: &[Tensor], b: &[Tensor], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.shape, y.shape);
        for (p, q) in f(x).iter().zip(f(y)) {
            assert!((p - q).abs() <= tol * (1.0 + q.abs()), "{p} vs {q}");
        }
    }
}

// ---------------------------------------------------------------- graph building helpers

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn tensor(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        t32(shape, (0..n).map(|_| self.next()).collect())
    }
}

fn input(g: &mut Graph, name: &str, shape: &[usize]) -> ValueId {
    let v = g.add_value(name, DataType::F32);
    g.values[v].shape = Some(shape.to_vec());
    g.inputs.push(v);
    v
}

fn val(g: &mut Graph, name: &str, shape: &[usize]) -> ValueId {
    let v = g.add_value(name, DataType::F32);
    g.values[v].shape = Some(shape.to_vec());
    v
}

fn node(g: &mut Graph, op: Op, inputs: &[Option<ValueId>], outputs: &[ValueId]) {
    let name = format!("n{}", g.nodes.len());
    g.nodes.push(Node {
        name,
        op,
        inputs: inputs.to_vec(),
        outputs: outputs.to_vec(),
    });
}

fn i64c(g: &mut Graph, name: &str, v: Vec<i64>) -> ValueId {
    g.add_constant(name, Tensor::from_i64(vec![v.len()], v).unwrap())
}

fn f32c(g: &mut Graph, name: &str, t: Tensor) -> ValueId {
    g.add_constant(name, t)
}

fn conv_attrs(k: usize, pads: Vec<usize>, group: usize) -> ConvAttrs {
    ConvAttrs {
        kernel_shape: vec![k, k],
        strides: vec![1, 1],
        pads,
        dilations: vec![1, 1],
        group,
        auto_pad: AutoPad::NotSet,
        activation: None,
        layout: Layout::Nchw,
    }
}

fn pool_attrs(k: usize, stride: usize, count_include_pad: bool) -> PoolAttrs {
    PoolAttrs {
        kernel_shape: vec![k, k],
        strides: vec![stride, stride],
        pads: vec![0; 4],
        dilations: vec![1, 1],
        ceil_mode: false,
        auto_pad: AutoPad::NotSet,
        count_include_pad,
        layout: Layout::Nchw,
    }
}

fn count(g: &Graph, name: &str) -> usize {
    g.nodes.iter().filter(|n| n.op.name() == name).count()
}

/// Adds `Conv(x; W [cout, cin/group, k, k], B)` writing a new value of the given output shape.
#[allow(clippy::too_many_arguments)]
fn add_conv(
    g: &mut Graph,
    rng: &mut Rng,
    x: ValueId,
    cin: usize,
    cout: usize,
    k: usize,
    pads: Vec<usize>,
    group: usize,
    out_shape: &[usize],
) -> ValueId {
    let w = f32c(g, "W", rng.tensor(&[cout, cin / group, k, k]));
    let b = f32c(g, "B", rng.tensor(&[cout]));
    let y = val(g, "conv_out", out_shape);
    node(
        g,
        Op::Conv(conv_attrs(k, pads, group)),
        &[Some(x), Some(w), Some(b)],
        &[y],
    );
    y
}

// ---------------------------------------------------------------- cleanup

#[test]
fn cleanup_removes_identity_and_dead_nodes_keeping_output_ids() {
    let mut g = Graph::default();
    let x = input(&mut g, "x", &[1, 2, 3, 3]);
    let a = val(&mut g, "a", &[1, 2, 3, 3]);
    let r = val(&mut g, "r", &[1, 2, 3, 3]);
    let out = val(&mut g, "out", &[1, 2, 3, 3]);
    let dead = val(&mut g, "dead", &[1, 2, 3, 3]);
    node(&mut g, Op::Identity, &[Some(x)], &[a]);
    node(&mut g, Op::Unary(UnaryOp::Exp), &[Some(a)], &[dead]);
    node(
        &mut g,
        Op::Unary(UnaryOp::Act(Activation::Relu)),
        &[Some(a)],
        &[r],
    );
    node(&mut g, Op::Identity, &[Some(r)], &[out]);
    g.outputs = vec![out];
    let mut rng = Rng(1);
    let xin = rng.tensor(&[1, 2, 3, 3]);
    let before = eval(&g, std::slice::from_ref(&xin));
    let n = cleanup(&mut g).unwrap();
    assert_eq!(n, 3);
    assert_eq!(g.nodes.len(), 1);
    assert_eq!(g.nodes[0].op.name(), "Relu");
    assert_eq!(g.nodes[0].inputs, vec![Some(x)]);
    assert_eq!(g.outputs, vec![out]);
    assert_eq!(g.nodes[0].outputs, vec![out]);
    assert_close(&eval(&g, &[xin]), &before, 0.0);
    assert_eq!(cleanup(&mut g).unwrap(), 0);
}

#[test]
fn cleanup_keeps_identity_between_graph_input_and_output() {
    let mut g = Graph::default();
    let x = input(&mut g, "x", &[2]);
    let out = val(&mut g, "out", &[2]);
    node(&mut g, Op::Identity, &[Some(x)], &[out]);
    g.outputs = vec![out];
    assert_eq!(cleanup(&mut g).unwrap(), 0);
    assert_eq!(g.nodes.len(), 1);
    g.validate().unwrap();
}

// ---------------------------------------------------------------- pad_fold

fn pad_node(
    g: &mut Graph,
    x: ValueId,
    pads: Vec<i64>,
    value: Option<f32>,
    out_shape: &[usize],
) -> ValueId {
    let p = i64c(g, "pads", pads);
    let cv = value.map(|v| f32c(g, "pv", t32(&[], vec![v])));
    let y = val(g, "padded", out_shape);
    node(
        g,
        Op::Pad {
            mode: PadMode::Constant,
        },
        &[Some(x), Some(p), cv],
        &[y],
    );
    y
}

#[test]
fn pad_fold_into_conv_matches_reference() {
    let mut rng = Rng(2);
    let mut g = Graph::default();
    let x = input(&mut g, "x", &[1, 3, 6, 5]);
    // TF-style asymmetric SAME padding: top 0, left 1, bottom 1, right 2.
    let p = pad_node(
        &mut g,
        x,
        vec![0, 0, 0, 1, 0, 0, 1, 2],
        Some(0.0),
        &[1, 3, 7, 8],
    );
    let y = add_conv(
        &mut g,
        &mut rng,
        p,
        3,
        4,
        3,
        vec![1, 0, 1, 0],
        1,
        &[1, 4, 7, 6],
    );
    g.outputs = vec![y];
    let xin = rng.tensor(&[1, 3, 6, 5]);
    let before = eval(&g, std::slice::from_ref(&xin));
    assert_eq!(pad_fold(&mut g).unwrap(), 1);
    assert_eq!(count(&g, "Pad"), 0);
    let Op::Conv(a) = &g.nodes[0].op else {
        panic!("conv expected")
    };
    assert_eq!(a.pads, vec![1, 1, 2, 2]);
    assert_eq!(g.nodes[0].inputs[0], Some(x));
    assert_close(&eval(&g, &[xin]), &before, 1e-5);
}

#[test]
fn pad_fold_refuses_unsafe_cases() {
    let mut rng = Rng(3);
    // Channel padding, non-zero value, and a Pad with two readers stay.
    for case in 0..3 {
        let mut g = Graph::default();
        let x = input(&mut g, "x", &[1, 2, 4, 4]);
        let (pads, value, cin) = match case {
            0 => (vec![0, 1, 1, 1, 0, 0, 1, 1], None, 3),
            1 => (vec![0, 0, 1, 1, 0, 0, 1, 1], Some(1.0), 2),
            _ => (vec![0, 0, 1, 1, 0, 0, 1, 1], None, 2),
        };
        let pshape = [1, cin, 6, 6];
        let p = pad_node(&mut g, x, pads, value, &pshape);
        let y = add_conv(&mut g, &mut rng, p, cin, 2, 3, vec![], 1, &[1, 2, 4, 4]);
        g.outputs = vec![y];
        if case == 2 {
            g.outputs.push(p);
        }
        assert_eq!(pad_fold(&mut g).unwrap(), 0, "case {case}");
        assert_eq!(count(&g, "Pad"), 1);
    }
}

#[test]
fn pad_fold_into_maxpool_neg_inf_and_after_relu() {
    let mut rng = Rng(4);
    for (case, value, relu, expect) in [
        (0, -f32::MAX, false, 1),
        (1, 0.0, true, 1),
        (2, 0.0, false, 0),
    ] {
        let mut g = Graph::default();
        let x = input(&mut g, "x", &[1, 2, 5, 5]);
        let src = if relu {
            let r = val(&mut g, "r", &[1, 2, 5, 5]);
            node(
                &mut g,
                Op::Unary(UnaryOp::Act(Activation::Relu)),
                &[Some(x)],
                &[r],
            );
            r
        } else {
            x
        };
        let p = pad_node(
            &mut g,
            src,
            vec![0, 0, 0, 0, 0, 0, 1, 1],
            Some(value),
            &[1, 2, 6, 6],
        );
        let y = val(&mut g, "y", &[1, 2, 3, 3]);
        node(
            &mut g,
            Op::MaxPool(pool_attrs(2, 2, false)),
            &[Some(p)],
            &[y],
        );
        g.outputs = vec![y];
        let xin = rng.tensor(&[1, 2, 5, 5]);
        let before = eval(&g, std::slice::from_ref(&xin));
        assert_eq!(pad_fold(&mut g).unwrap(), expect, "case {case}");
        if expect == 1 {
            let Some(Op::MaxPool(a)) = g.nodes.last().map(|n| &n.op) else {
                panic!()
            };
            assert_eq!(a.pads, vec![0, 0, 1, 1]);
        }
        assert_close(&eval(&g, &[xin]), &before, 0.0);
    }
}

#[test]
fn pad_fold_into_average_pool_counts_padding() {
    let mut rng = Rng(5);
    let mut g = Graph::default();
    let x = input(&mut g, "x", &[1, 2, 4, 4]);
    let p = pad_node(&mut g, x, vec![0, 0, 1, 1, 0, 0, 1, 1], None, &[1, 2, 6, 6]);
    let y = val(&mut g, "y", &[1, 2, 4, 4]);
    node(
        &mut g,
        Op::AveragePool(pool_attrs(3, 1, false)),
        &[Some(p)],
        &[y],
    );
    g.outputs = vec![y];
    let xin = rng.tensor(&[1, 2, 4, 4]);
    let before = eval(&g, std::slice::from_ref(&xin));
    assert_eq!(pad_fold(&mut g).unwrap(), 1);
    let Op::AveragePool(a) = &g.nodes[0].op else {
        panic!()
    };
    assert!(a.count_include_pad);
    assert_close(&eval(&g, &[xin]), &before, 1e-6);
}

// ---------------------------------------------------------------- bn_fold

fn bn_consts(g: &mut Graph, rng: &mut Rng, c: usize) -> [Option<ValueId>; 4] {
    let scale = f32c(g, "g", rng.tensor(&[c]));
    let beta = f32c(g, "b", rng.tensor(&[c]));
    let mean = f32c(g, "m", rng.tensor(&[c]));
    let var_t = t32(&[c], (0..c).map(|_| rng.next().abs() + 0.1).collect());
    let var = f32c(g, "v", var_t);
    [Some(scale), Some(beta), Some(mean), Some(var)]
}

#[test]
fn bn_fold_into_conv_and_depthwise_conv() {
    for (group, cin) in [(1, 3), (4, 4)] {
        let mut rng = Rng(6 + group as u64);
        let mut g = Graph::default();
        let x = input(&mut g, "x", &[1, cin, 5, 5]);
        let y = add_conv(
            &mut g,
            &mut rng,
            x,
            cin,
            4,
            3,
            vec![1, 1, 1, 1],
            group,
            &[1, 4, 5, 5],
        );
        let [s, b, m, v] = bn_consts(&mut g, &mut rng, 4);
        let out = val(&mut g, "out", &[1, 4, 5, 5]);
        node(
            &mut g,
            Op::BatchNormalization { epsilon: 1e-3 },
            &[Some(y), s, b, m, v],
            &[out],
        );
        g.outputs = vec![out];
        let xin = rng.tensor(&[1, cin, 5, 5]);
        let before = eval(&g, std::slice::from_ref(&xin));
        assert_eq!(bn_fold(&mut g).unwrap(), 1);
        assert_eq!(g.nodes.len(), 1);
        assert_eq!(g.nodes[0].outputs, vec![out]);
        assert_close(&eval(&g, &[xin]), &before, 1e-5);
    }
}

#[test]
fn bn_after_non_conv_becomes_mul_add() {
    let mut rng = Rng(9);
    let mut g = Graph::default();
    let x = input(&mut g, "x", &[1, 3, 2, 2]);
    let r = val(&mut g, "r", &[1, 3, 2, 2]);
    node(
        &mut g,
        Op::Unary(UnaryOp::Act(Activation::Relu)),
        &[Some(x)],
        &[r],
    );
    let [s, b, m, v] = bn_consts(&mut g, &mut rng, 3);
    let out = val(&mut g, "out", &[1, 3, 2, 2]);
    node(
        &mut g,
        Op::BatchNormalization { epsilon: 1e-5 },
        &[Some(r), s, b, m, v],
        &[out],
    );
    g.outputs = vec![out];
    let xin = rng.tensor(&[1, 3, 2, 2]);
    let before = eval(&g, std::slice::from_ref(&xin));
    assert_eq!(bn_fold(&mut g).unwrap(), 1);
    assert_eq!(
        (
            count(&g, "Mul"),
            count(&g, "Add"),
            count(&g, "BatchNormalization")
        ),
        (1, 1, 0)
    );
    assert_close(&eval(&g, &[xin]), &before, 1e-5);
}

// ---------------------------------------------------------------- fuse_activation

#[test]
fn fuse_activation_clip_silu_hardswish_and_bias_add() {
    let mut rng = Rng(10);
    for case in 0..4 {
        let mut g = Graph::default();
        let x = input(&mut g, "x", &[1, 2, 4, 4]);
        let y = add_conv(
            &mut g,
            &mut rng,
            x,
            2,
            3,
            3,
            vec![1, 1, 1, 1],
            1,
            &[1, 3, 4, 4],
        );
        let out = val(&mut g, "out", &[1, 3, 4, 4]);
        let expect = match case {
            0 => {
                let lo = f32c(&mut g, "lo", t32(&[], vec![0.0]));
                let hi = f32c(&mut g, "hi", t32(&[], vec![6.0]));
                node(&mut g, Op::Clip, &[Some(y), Some(lo), Some(hi)], &[out]);
                Some(Activation::Clip { min: 0.0, max: 6.0 })
            }
            1 => {
                let s = val(&mut g, "s", &[1, 3, 4, 4]);
                node(
                    &mut g,
                    Op::Unary(UnaryOp::Act(Activation::Sigmoid)),
                    &[Some(y)],
                    &[s],
                );
                node(
                    &mut g,
                    Op::Binary(BinaryOp::Mul),
                    &[Some(s), Some(y)],
                    &[out],
                );
                Some(Activation::Silu)
            }
            2 => {
                let s = val(&mut g, "s", &[1, 3, 4, 4]);
                let hs = Activation::HardSigmoid {
                    alpha: 1.0 / 6.0,
                    beta: 0.5,
                };
                node(&mut g, Op::Unary(UnaryOp::Act(hs)), &[Some(y)], &[s]);
                node(
                    &mut g,
                    Op::Binary(BinaryOp::Mul),
                    &[Some(y), Some(s)],
                    &[out],
                );
                Some(Activation::HardSwish)
            }
            _ => {
                let c = f32c(&mut g, "c", rng.tensor(&[1, 3, 1, 1]));
                node(
                    &mut g,
                    Op::Binary(BinaryOp::Add),
                    &[Some(c), Some(y)],
                    &[out],
                );
                None
            }
        };
        g.outputs = vec![out];
        let xin = rng.tensor(&[1, 2, 4, 4]);
        let before = eval(&g, std::slice::from_ref(&xin));
        assert!(fuse_activation(&mut g).unwrap() >= 1);
        assert_eq!(g.nodes.len(), 1, "case {case}");
        let Op::Conv(a) = &g.nodes[0].op else {
            panic!()
        };
        assert_eq!(a.activation, expect);
        assert_eq!(g.nodes[0].outputs, vec![out]);
        assert_close(&eval(&g, &[xin]), &before, 1e-5);
    }
}

#[test]
fn fuse_activation_needs_sole_reader() {
    let mut rng = Rng(11);
    let mut g = Graph::default();
    let x = input(&mut g, "x", &[1, 2, 4, 4]);
    let y = add_conv(&mut g, &mut rng, x, 2, 2, 1, vec![], 1, &[1, 2, 4, 4]);
    let r = val(&mut g, "r", &[1, 2, 4, 4]);
    node(
        &mut g,
        Op::Unary(UnaryOp::Act(Activation::Relu)),
        &[Some(y)],
        &[r],
    );
    g.outputs = vec![r, y];
    assert_eq!(fuse_activation(&mut g).unwrap(), 0);
    // A per-channel [C] constant aligns with W, not C, so it must not become the bias.
    let mut g2 = Graph::default();
    let x = input(&mut g2, "x", &[1, 2, 4, 4]);
    let y = add_conv(&mut g2, &mut rng, x, 2, 4, 1, vec![], 1, &[1, 4, 4, 4]);
    let c = f32c(&mut g2, "c", rng.tensor(&[4]));
    let out = val(&mut g2, "out", &[1, 4, 4, 4]);
    node(
        &mut g2,
        Op::Binary(BinaryOp::Add),
        &[Some(y), Some(c)],
        &[out],
    );
    g2.outputs = vec![out];
    assert_eq!(fuse_activation(&mut g2).unwrap(), 0);
}

// ---------------------------------------------------------------- fuse_elementwise

#[test]
fn fuse_elementwise_chain_steps_and_numerics() {
    let mut rng = Rng(12);
    let mut g = Graph::default();
    let x = input(&mut g, "x", &[1, 3, 2, 2]);
    let a = val(&mut g, "a", &[1, 3, 2, 2]);
    let b = val(&mut g, "b", &[1, 3, 2, 2]);
    let c = val(&mut g, "c", &[1, 3, 2, 2]);
    let out = val(&mut g, "out", &[1, 3, 2, 2]);
    let k = f32c(&mut g, "k", rng.tensor(&[1, 3, 1, 1]));
    let one = f32c(&mut g, "one", t32(&[], vec![1.0]));
    let lo = f32c(&mut g, "lo", t32(&[], vec![0.0]));
    let hi = f32c(&mut g, "hi", t32(&[], vec![0.5]));
    node(
        &mut g,
        Op::Unary(UnaryOp::Act(Activation::Relu)),
        &[Some(x)],
        &[a],
    );
    node(&mut g, Op::Binary(BinaryOp::Mul), &[Some(a), Some(k)], &[b]);
    node(
        &mut g,
        Op::Binary(BinaryOp::Sub),
        &[Some(one), Some(b)],
        &[c],
    );
    node(&mut g, Op::Clip, &[Some(c), Some(lo), Some(hi)], &[out]);
    g.outputs = vec![out];
    let xin = rng.tensor(&[1, 3, 2, 2]);
    let before = eval(&g, std::slice::from_ref(&xin));
    assert_eq!(fuse_elementwise(&mut g).unwrap(), 1);
    assert_eq!(g.nodes.len(), 1);
    assert_eq!(g.nodes[0].inputs, vec![Some(x), Some(k), Some(one)]);
    assert_eq!(g.nodes[0].outputs, vec![out]);
    let Op::Elementwise(steps) = &g.nodes[0].op else {
        panic!()
    };
    assert_eq!(
        steps,
        &vec![
            ChainStep::Unary(UnaryOp::Act(Activation::Relu)),
            ChainStep::Binary {
                op: BinaryOp::Mul,
                operand: 1,
                acc_on_right: false
            },
            ChainStep::Binary {
                op: BinaryOp::Sub,
                operand: 2,
                acc_on_right: true
            },
            ChainStep::Unary(UnaryOp::Act(Activation::Clip { min: 0.0, max: 0.5 })),
        ]
    );
    assert_close(&eval(&g, &[xin]), &before, 1e-6);
}

#[test]
fn fuse_elementwise_never_grows_the_accumulator_and_respects_fanout() {
    let mut rng = Rng(13);
    let mut g = Graph::default();
    let s = input(&mut g, "s", &[1, 3, 1, 1]);
    let y = input(&mut g, "y", &[1, 3, 2, 2]);
    let e = val(&mut g, "e", &[1, 3, 1, 1]);
    let a = val(&mut g, "a", &[1, 3, 2, 2]);
    let n = val(&mut g, "n", &[1, 3, 2, 2]);
    let t = val(&mut g, "t", &[1, 3, 2, 2]);
    let out = val(&mut g, "out", &[1, 3, 2, 2]);
    node(&mut g, Op::Unary(UnaryOp::Exp), &[Some(s)], &[e]);
    node(&mut g, Op::Binary(BinaryOp::Add), &[Some(e), Some(y)], &[a]);
    node(&mut g, Op::Unary(UnaryOp::Neg), &[Some(a)], &[n]);
    // `n` has two readers: the chain must stop there.
    node(&mut g, Op::Unary(UnaryOp::Abs), &[Some(n)], &[t]);
    node(
        &mut g,
        Op::Binary(BinaryOp::Mul),
        &[Some(n), Some(t)],
        &[out],
    );
    g.outputs = vec![out];
    let ins = [rng.tensor(&[1, 3, 1, 1]), rng.tensor(&[1, 3, 2, 2])];
    let before = eval(&g, &ins);
    assert_eq!(fuse_elementwise(&mut g).unwrap(), 2);
    // Exp stays alone (its output would be broadcast), Add+Neg fuse from `y`, Abs+Mul fuse.
    assert_eq!(count(&g, "Exp"), 1);
    assert_eq!(count(&g, "FusedElementwise"), 2);
    let fused: Vec<&Node> = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Elementwise(_)))
        .collect();
    assert_eq!(fused[0].inputs, vec![Some(y), Some(e)]);
    assert_eq!(
        fused[0].op,
        Op::Elementwise(vec![
            ChainStep::Binary {
                op: BinaryOp::Add,
                operand: 1,
                acc_on_right: true
            },
            ChainStep::Unary(UnaryOp::Neg)
        ])
    );
    assert_eq!(fused[1].inputs, vec![Some(n)]);
    assert_eq!(
        fused[1].op,
        Op::Elementwise(vec![
            ChainStep::Unary(UnaryOp::Abs),
            ChainStep::Binary {
                op: BinaryOp::Mul,
                operand: 0,
                acc_on_right: true
            }
        ])
    );
    assert_close(&eval(&g, &ins), &before, 1e-6);
}

// ---------------------------------------------------------------- layout + transpose_cancel

#[test]
fn layout_rewrites_conv_region_to_nhwc() {
    let mut rng = Rng(14);
    let mut g = Graph::default();
    let x = input(&mut g, "x", &[1, 3, 6, 6]);
    let y = add_conv(
        &mut g,
        &mut rng,
        x,
        3,
        4,
        3,
        vec![1, 1, 1, 1],
        1,
        &[1, 4, 6, 6],
    );
    let r = val(&mut g, "r", &[1, 4, 6, 6]);
    node(
        &mut g,
        Op::Unary(UnaryOp::Act(Activation::Relu)),
        &[Some(y)],
        &[r],
    );
    let kdata: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0];
    let k = f32c(&mut g, "k", t32(&[1, 4, 1, 1], kdata.clone()));
    let a = val(&mut g, "a", &[1, 4, 6, 6]);
    node(&mut g, Op::Binary(BinaryOp::Add), &[Some(r), Some(k)], &[a]);
    let k3 = f32c(&mut g, "k3", rng.tensor(&[1, 6, 6]));
    let m = val(&mut g, "m", &[1, 4, 6, 6]);
    node(
        &mut g,
        Op::Binary(BinaryOp::Mul),
        &[Some(k3), Some(a)],
        &[m],
    );
    let cat = val(&mut g, "cat", &[1, 8, 6, 6]);
    node(&mut g, Op::Concat { axis: 1 }, &[Some(m), Some(a)], &[cat]);
    let p = val(&mut g, "p", &[1, 8, 3, 3]);
    node(
        &mut g,
        Op::MaxPool(pool_attrs(2, 2, false)),
        &[Some(cat)],
        &[p],
    );
    let gap = val(&mut g, "gap", &[1, 8, 1, 1]);
    node(
        &mut g,
        Op::GlobalAveragePool {
            layout: Layout::Nchw,
        },
        &[Some(p)],
        &[gap],
    );
    let flat = val(&mut g, "flat", &[1, 8]);
    node(&mut g, Op::Flatten { axis: 1 }, &[Some(gap)], &[flat]);
    g.outputs = vec![flat, r];
    let xin = rng.tensor(&[1, 3, 6, 6]);
    let before = eval(&g, std::slice::from_ref(&xin));

    let n = layout(&mut g).unwrap();
    assert_eq!(n, 7, "conv, relu, add, mul, concat, maxpool, gap");
    g.validate().unwrap();
    // Graph outputs keep their ids and logical shapes.
    assert_eq!(g.outputs, vec![flat, r]);
    assert_eq!(g.values[r].shape, Some(vec![1, 4, 6, 6]));
    assert_eq!(g.values[flat].shape, Some(vec![1, 8]));
    // Input converter first.
    assert_eq!(
        g.nodes[0].op,
        Op::Transpose {
            perm: vec![0, 2, 3, 1]
        }
    );
    assert_eq!(
        g.values[g.nodes[0].outputs[0]].shape,
        Some(vec![1, 6, 6, 3])
    );
    for nd in &g.nodes {
        match &nd.op {
            Op::Conv(c) => {
                assert_eq!(c.layout, Layout::Nhwc);
                assert_eq!(g.values[nd.outputs[0]].shape, Some(vec![1, 6, 6, 4]));
            }
            Op::Concat { axis } => assert_eq!(*axis, 3),
            Op::MaxPool(pa) => assert_eq!(pa.layout, Layout::Nhwc),
            Op::GlobalAveragePool { layout } => assert_eq!(*layout, Layout::Nhwc),
            Op::Binary(BinaryOp::Add) => {
                let kc = g.constant(nd.inputs[1].unwrap()).unwrap();
                assert_eq!(kc.shape, vec![1, 1, 1, 4]);
                assert_eq!(kc.as_f32().unwrap(), kdata.as_slice());
            }
            Op::Binary(BinaryOp::Mul) => {
                assert_eq!(
                    g.constant(nd.inputs[0].unwrap()).unwrap().shape,
                    vec![1, 6, 6, 1]
                );
            }
            _ => {}
        }
    }
    assert_eq!(g.values[gap].shape, Some(vec![1, 1, 1, 8]));
    assert_close(&eval(&g, std::slice::from_ref(&xin)), &before, 1e-5);
    // Idempotent.
    assert_eq!(layout(&mut g).unwrap(), 0);

    // The Relu output (a graph output) gets one NCHW converter writing its original id; the GAP
    // converter in front of Flatten is a memory no-op and goes away.
    let transposes_before = count(&g, "Transpose");
    assert_eq!(transposes_before, 3);
    transpose_cancel(&mut g).unwrap();
    cleanup(&mut g).unwrap();
    assert_eq!(count(&g, "Transpose"), 2);
    assert_eq!(count(&g, "Flatten"), 0);
    assert_close(&eval(&g, &[xin]), &before, 1e-5);
}

#[test]
fn layout_remaps_split_pad_slice_and_resize_inputs() {
    let mut rng = Rng(15);
    let mut g = Graph {
        opset: 17,
        ..Default::default()
    };
    let x = input(&mut g, "x", &[1, 2, 4, 4]);
    let y = add_conv(&mut g, &mut rng, x, 2, 4, 1, vec![], 1, &[1, 4, 4, 4]);
    let s0 = val(&mut g, "s0", &[1, 2, 4, 4]);
    let s1 = val(&mut g, "s1", &[1, 2, 4, 4]);
    node(
        &mut g,
        Op::Split {
            axis: -3,
            split: None,
        },
        &[Some(y)],
        &[s0, s1],
    );
    let pads = i64c(&mut g, "pads", vec![0, 0, 1, 2, 0, 0, 3, 4]);
    let pd = val(&mut g, "pd", &[1, 2, 8, 10]);
    node(
        &mut g,
        Op::Pad {
            mode: PadMode::Constant,
        },
        &[Some(s0), Some(pads)],
        &[pd],
    );
    let roi = f32c(&mut g, "roi", t32(&[0], vec![]));
    let scales = f32c(&mut g, "scales", t32(&[4], vec![1.0, 1.0, 2.0, 3.0]));
    let rs = val(&mut g, "rs", &[1, 2, 16, 30]);
    let ra = ResizeAttrs {
        mode: ResizeMode::Linear,
        coord: CoordMode::HalfPixel,
        nearest: NearestMode::Floor,
        layout: Layout::Nchw,
    };
    node(
        &mut g,
        Op::Resize(ra),
        &[Some(pd), Some(roi), Some(scales)],
        &[rs],
    );
    let st = i64c(&mut g, "st", vec![1, 0]);
    let en = i64c(&mut g, "en", vec![2, 3]);
    let sl = val(&mut g, "sl", &[1, 1, 3, 4]);
    node(&mut g, Op::Slice, &[Some(s1), Some(st), Some(en)], &[sl]);
    g.outputs = vec![rs, sl];
    assert_eq!(layout(&mut g).unwrap(), 5);
    g.validate().unwrap();
    for nd in &g.nodes {
        match &nd.op {
            Op::Split { axis, .. } => assert_eq!(*axis, 3),
            Op::Pad { .. } => {
                let p = g
                    .constant(nd.inputs[1].unwrap())
                    .unwrap()
                    .to_i64_vec()
                    .unwrap();
                assert_eq!(p, vec![0, 1, 2, 0, 0, 3, 4, 0]);
                assert_eq!(g.values[nd.outputs[0]].shape, Some(vec![1, 8, 10, 2]));
            }
            Op::Resize(a) => {
                assert_eq!(a.layout, Layout::Nhwc);
                let s = g.constant(nd.inputs[2].unwrap()).unwrap();
                assert_eq!(s.as_f32().unwrap(), &[1.0, 2.0, 3.0, 1.0]);
            }
            Op::Slice => {
                let ax = g
                    .constant(nd.inputs[3].unwrap())
                    .unwrap()
                    .to_i64_vec()
                    .unwrap();
                assert_eq!(ax, vec![0, 3]);
            }
            _ => {}
        }
    }
    assert_eq!(g.values[rs].shape, Some(vec![1, 2, 16, 30]));
    assert_eq!(g.values[sl].shape, Some(vec![1, 1, 3, 4]));
    // Both outputs are produced by NCHW converters with the right perm.
    for &o in &g.outputs {
        let p = g.producers()[o].unwrap();
        assert_eq!(
            g.nodes[p].op,
            Op::Transpose {
                perm: vec![0, 3, 1, 2]
            }
        );
    }
}

#[test]
fn transpose_cancel_composes_folds_and_removes_inverse_pairs() {
    let mut rng = Rng(16);
    let mut g = Graph::default();
    let x = input(&mut g, "x", &[1, 2, 3, 4]);
    let a = val(&mut g, "a", &[1, 3, 4, 2]);
    let b = val(&mut g, "b", &[1, 2, 3, 4]);
    let c = val(&mut g, "c", &[1, 2, 3, 4]);
    node(
        &mut g,
        Op::Transpose {
            perm: vec![0, 2, 3, 1],
        },
        &[Some(x)],
        &[a],
    );
    node(
        &mut g,
        Op::Transpose {
            perm: vec![0, 3, 1, 2],
        },
        &[Some(a)],
        &[b],
    );
    node(&mut g, Op::Unary(UnaryOp::Neg), &[Some(b)], &[c]);
    // A transposed constant folds.
    let k = f32c(&mut g, "k", rng.tensor(&[1, 3, 4, 2]));
    let kt = val(&mut g, "kt", &[1, 2, 3, 4]);
    node(
        &mut g,
        Op::Transpose {
            perm: vec![0, 3, 1, 2],
        },
        &[Some(k)],
        &[kt],
    );
    let out = val(&mut g, "out", &[1, 2, 3, 4]);
    node(
        &mut g,
        Op::Binary(BinaryOp::Add),
        &[Some(c), Some(kt)],
        &[out],
    );
    // Two transposes compose into one.
    let d = val(&mut g, "d", &[2, 1, 3, 4]);
    let e = val(&mut g, "e", &[4, 3, 1, 2]);
    node(
        &mut g,
        Op::Transpose {
            perm: vec![1, 0, 2, 3],
        },
        &[Some(x)],
        &[d],
    );
    node(
        &mut g,
        Op::Transpose {
            perm: vec![3, 2, 1, 0],
        },
        &[Some(d)],
        &[e],
    );
    g.outputs = vec![out, e];
    let xin = rng.tensor(&[1, 2, 3, 4]);
    let before = eval(&g, std::slice::from_ref(&xin));
    assert!(transpose_cancel(&mut g).unwrap() >= 3);
    cleanup(&mut g).unwrap();
    assert_eq!(count(&g, "Transpose"), 1);
    assert!(g.values[kt].constant.is_some());
    let p = g.producers()[e].unwrap();
    assert_eq!(
        g.nodes[p].op,
        Op::Transpose {
            perm: vec![3, 2, 0, 1]
        }
    );
    assert_eq!(g.nodes[p].inputs, vec![Some(x)]);
    assert_close(&eval(&g, &[xin]), &before, 0.0);
}

// ---------------------------------------------------------------- whole optimizer

#[test]
fn optimizer_on_efficientnet_like_block() {
    let mut rng = Rng(17);
    let mut g = Graph {
        opset: 17,
        ..Default::default()
    };
    let x = input(&mut g, "x", &[1, 3, 8, 8]);
    let id = val(&mut g, "id", &[1, 3, 8, 8]);
    node(&mut g, Op::Identity, &[Some(x)], &[id]);
    let p = pad_node(
        &mut g,
        id,
        vec![0, 0, 0, 0, 0, 0, 1, 1],
        None,
        &[1, 3, 9, 9],
    );
    let mut a = conv_attrs(3, vec![0; 4], 1);
    a.strides = vec![2, 2];
    let w = f32c(&mut g, "W", rng.tensor(&[4, 3, 3, 3]));
    let y = val(&mut g, "y", &[1, 4, 4, 4]);
    node(&mut g, Op::Conv(a), &[Some(p), Some(w), None], &[y]);
    let [s, b, m, v] = bn_consts(&mut g, &mut rng, 4);
    let bn = val(&mut g, "bn", &[1, 4, 4, 4]);
    node(
        &mut g,
        Op::BatchNormalization { epsilon: 1e-3 },
        &[Some(y), s, b, m, v],
        &[bn],
    );
    let lo = f32c(&mut g, "lo", t32(&[], vec![0.0]));
    let hi = f32c(&mut g, "hi", t32(&[], vec![6.0]));
    let r6 = val(&mut g, "r6", &[1, 4, 4, 4]);
    node(&mut g, Op::Clip, &[Some(bn), Some(lo), Some(hi)], &[r6]);
    let dw = add_conv(
        &mut g,
        &mut rng,
        r6,
        4,
        4,
        3,
        vec![1, 1, 1, 1],
        4,
        &[1, 4, 4, 4],
    );
    let r6b = val(&mut g, "r6b", &[1, 4, 4, 4]);
    node(&mut g, Op::Clip, &[Some(dw), Some(lo), Some(hi)], &[r6b]);
    let res = val(&mut g, "res", &[1, 4, 4, 4]);
    node(
        &mut g,
        Op::Binary(BinaryOp::Add),
        &[Some(r6b), Some(r6)],
        &[res],
    );
    let gap = val(&mut g, "gap", &[1, 4, 1, 1]);
    node(
        &mut g,
        Op::GlobalAveragePool {
            layout: Layout::Nchw,
        },
        &[Some(res)],
        &[gap],
    );
    let shp = i64c(&mut g, "shape", vec![0, -1]);
    let flat = val(&mut g, "flat", &[1, 4]);
    node(
        &mut g,
        Op::Reshape { allowzero: false },
        &[Some(gap), Some(shp)],
        &[flat],
    );
    g.outputs = vec![flat];
    let xin = rng.tensor(&[1, 3, 8, 8]);
    let before = eval(&g, std::slice::from_ref(&xin));

    let report = optimize_after_folding(&mut g).unwrap();
    g.validate().unwrap();
    assert_eq!(report.get("pad_fold"), 1);
    assert_eq!(report.get("bn_fold"), 1);
    assert_eq!(report.get("fuse_activation"), 2);
    let hist = g.op_histogram();
    assert_eq!(
        hist,
        vec![
            ("Add", 1),
            ("FusedConv", 2),
            ("GlobalAveragePool", 1),
            ("Reshape", 1),
            ("Transpose", 1)
        ],
        "{hist:?}"
    );
    assert_eq!(g.outputs, vec![flat]);
    assert_close(&eval(&g, &[xin]), &before, 1e-4);
}

#[test]
fn optimizer_on_nanodet_like_head() {
    let mut rng = Rng(18);
    let mut g = Graph {
        opset: 17,
        ..Default::default()
    };
    let x = input(&mut g, "x", &[1, 2, 8, 8]);
    let p = pad_node(
        &mut g,
        x,
        vec![0, 0, 1, 1, 0, 0, 1, 1],
        None,
        &[1, 2, 10, 10],
    );
    let y = add_conv(&mut g, &mut rng, p, 2, 4, 3, vec![], 1, &[1, 4, 8, 8]);
    let lr = val(&mut g, "lr", &[1, 4, 8, 8]);
    node(
        &mut g,
        Op::Unary(UnaryOp::Act(Activation::LeakyRelu { alpha: 0.1 })),
        &[Some(y)],
        &[lr],
    );
    let pm = pad_node(
        &mut g,
        lr,
        vec![0, 0, 0, 0, 0, 0, 1, 1],
        Some(f32::NEG_INFINITY),
        &[1, 4, 9, 9],
    );
    let mp = val(&mut g, "mp", &[1, 4, 4, 4]);
    node(
        &mut g,
        Op::MaxPool(pool_attrs(3, 2, false)),
        &[Some(pm)],
        &[mp],
    );
    let head = add_conv(&mut g, &mut rng, mp, 4, 3, 1, vec![], 1, &[1, 3, 4, 4]);
    let sg = val(&mut g, "sg", &[1, 3, 4, 4]);
    node(
        &mut g,
        Op::Unary(UnaryOp::Act(Activation::Sigmoid)),
        &[Some(head)],
        &[sg],
    );
    let shp = i64c(&mut g, "shape", vec![1, 3, 16]);
    let rsh = val(&mut g, "rsh", &[1, 3, 16]);
    node(
        &mut g,
        Op::Reshape { allowzero: false },
        &[Some(sg), Some(shp)],
        &[rsh],
    );
    let out = val(&mut g, "out", &[1, 16, 3]);
    node(
        &mut g,
        Op::Transpose {
            perm: vec![0, 2, 1],
        },
        &[Some(rsh)],
        &[out],
    );
    g.outputs = vec![out];
    let xin = rng.tensor(&[1, 2, 8, 8]);
    let before = eval(&g, std::slice::from_ref(&xin));
    let report = optimize_after_folding(&mut g).unwrap();
    g.validate().unwrap();
    assert_eq!(report.get("pad_fold"), 2);
    assert_eq!(count(&g, "Pad"), 0);
    assert_eq!(count(&g, "FusedConv"), 2);
    assert_eq!(count(&g, "MaxPool"), 1);
    // NHWC head → Reshape [1, H*W, C] directly: only the input converter remains.
    assert_eq!(count(&g, "Transpose"), 1, "{:?}", g.op_histogram());
    assert_eq!(count(&g, "Reshape"), 1);
    assert_eq!(g.outputs, vec![out]);
    assert_close(&eval(&g, &[xin]), &before, 1e-5);
}

#[test]
fn transpose_reshape_transpose_becomes_reshape_only_when_order_is_kept() {
    for (zs, expect_reshape_only) in [(vec![1usize, 4, 6], true), (vec![1, 8, 3], false)] {
        let mut rng = Rng(19);
        let mut g = Graph::default();
        let x = input(&mut g, "x", &[1, 2, 3, 4]);
        let t1 = val(&mut g, "t1", &[1, 4, 2, 3]);
        node(
            &mut g,
            Op::Transpose {
                perm: vec![0, 3, 1, 2],
            },
            &[Some(x)],
            &[t1],
        );
        let shp = i64c(&mut g, "shape", zs.iter().map(|&d| d as i64).collect());
        let rs = val(&mut g, "rs", &zs);
        node(
            &mut g,
            Op::Reshape { allowzero: false },
            &[Some(t1), Some(shp)],
            &[rs],
        );
        let out = val(&mut g, "out", &[zs[0], zs[2], zs[1]]);
        node(
            &mut g,
            Op::Transpose {
                perm: vec![0, 2, 1],
            },
            &[Some(rs)],
            &[out],
        );
        g.outputs = vec![out];
        let xin = rng.tensor(&[1, 2, 3, 4]);
        let before = eval(&g, std::slice::from_ref(&xin));
        transpose_cancel(&mut g).unwrap();
        cleanup(&mut g).unwrap();
        if expect_reshape_only {
            assert_eq!(g.op_histogram(), vec![("Reshape", 1)]);
        } else {
            assert_eq!(count(&g, "Transpose"), 2);
        }
        assert_eq!(g.outputs, vec![out]);
        assert_close(&eval(&g, &[xin]), &before, 0.0);
    }
}

/// Per-tensor Q and DQ around `x`: returns the dequantized value.
fn fake_quant(g: &mut Graph, x: ValueId, shape: &[usize], scale: f32, zp: u8) -> ValueId {
    let s = f32c(g, &format!("s{}", g.values.len()), t32(&[], vec![scale]));
    let z = g.add_constant(
        format!("z{}", g.values.len()),
        Tensor::new(vec![], TensorData::U8(vec![zp])).unwrap(),
    );
    let q = g.add_value(format!("q{}", g.values.len()), DataType::U8);
    g.values[q].shape = Some(shape.to_vec());
    node(
        g,
        Op::QuantizeLinear {
            axis: 1,
            dtype: None,
        },
        &[Some(x), Some(s), Some(z)],
        &[q],
    );
    let d = val(g, &format!("dq{}", g.values.len()), shape);
    node(
        g,
        Op::DequantizeLinear { axis: 1 },
        &[Some(q), Some(s), Some(z)],
        &[d],
    );
    d
}

#[test]
fn quant_propagate_runs_selection_ops_and_sums_on_codes_exactly() {
    // x -> fq(0.05, 128) -> MaxPool(pad 1) ┐
    // y -> fq(0.03, 100) -----------------┴ Concat -> fq(0.04, 120) -> Transpose -> Reshape
    //   -> fq(0.04, 120) -> out0;  the fq(0.04, 120) value also -> Split -> fq(0.02, 90) -> out1
    let mut g = Graph::default();
    let x = input(&mut g, "x", &[1, 4, 6, 6]);
    let y = input(&mut g, "y", &[1, 4, 4, 4]);
    let xd = fake_quant(&mut g, x, &[1, 4, 6, 6], 0.05, 128);
    let m = val(&mut g, "m", &[1, 4, 4, 4]);
    let mut pa = pool_attrs(2, 2, false);
    pa.pads = vec![1; 4];
    node(&mut g, Op::MaxPool(pa), &[Some(xd)], &[m]);
    let yd = fake_quant(&mut g, y, &[1, 4, 4, 4], 0.03, 100);
    let c = val(&mut g, "c", &[1, 8, 4, 4]);
    node(&mut g, Op::Concat { axis: 1 }, &[Some(m), Some(yd)], &[c]);
    let cd = fake_quant(&mut g, c, &[1, 8, 4, 4], 0.04, 120);
    let t = val(&mut g, "t", &[1, 4, 4, 8]);
    node(
        &mut g,
        Op::Transpose {
            perm: vec![0, 2, 3, 1],
        },
        &[Some(cd)],
        &[t],
    );
    let shape = i64c(&mut g, "shape", vec![1, 16, 8]);
    let r = val(&mut g, "r", &[1, 16, 8]);
    node(
        &mut g,
        Op::Reshape { allowzero: false },
        &[Some(t), Some(shape)],
        &[r],
    );
    let out0 = fake_quant(&mut g, r, &[1, 16, 8], 0.04, 120);
    let (s0, s1) = (
        val(&mut g, "s0", &[1, 3, 4, 4]),
        val(&mut g, "s1", &[1, 5, 4, 4]),
    );
    node(
        &mut g,
        Op::Split {
            axis: 1,
            split: Some(vec![3, 5]),
        },
        &[Some(cd)],
        &[s0, s1],
    );
    let out1 = fake_quant(&mut g, s1, &[1, 5, 4, 4], 0.02, 90);
    // Residual-style sums: Relu(m + y) and Sigmoid(y + m), each requantized.
    let mut sums = Vec::new();
    for (k, act) in [(0, Activation::Relu), (1, Activation::Sigmoid)] {
        let (s, r) = (
            val(&mut g, "sum", &[1, 4, 4, 4]),
            val(&mut g, "act", &[1, 4, 4, 4]),
        );
        let ins = if k == 0 { [m, yd] } else { [yd, m] };
        node(
            &mut g,
            Op::Binary(BinaryOp::Add),
            &[Some(ins[0]), Some(ins[1])],
            &[s],
        );
        node(&mut g, Op::Unary(UnaryOp::Act(act)), &[Some(s)], &[r]);
        sums.push(fake_quant(&mut g, r, &[1, 4, 4, 4], 0.06, 30));
    }
    // A sum requantized, then ReLU between its own Q/DQ (how symmetric-int8 exports look).
    let s = val(&mut g, "sum", &[1, 4, 4, 4]);
    node(
        &mut g,
        Op::Binary(BinaryOp::Add),
        &[Some(m), Some(yd)],
        &[s],
    );
    let sq = fake_quant(&mut g, s, &[1, 4, 4, 4], 0.05, 128);
    let r = val(&mut g, "relu", &[1, 4, 4, 4]);
    node(
        &mut g,
        Op::Unary(UnaryOp::Act(Activation::Relu)),
        &[Some(sq)],
        &[r],
    );
    sums.push(fake_quant(&mut g, r, &[1, 4, 4, 4], 0.05, 128));
    g.outputs = vec![out0, out1, s0, sums[0], sums[1], sums[2]];

    let mut rng = Rng(7);
    let xs = t32(&[1, 4, 6, 6], (0..144).map(|_| rng.next() * 6.0).collect());
    let ys = t32(&[1, 4, 4, 4], (0..64).map(|_| rng.next() * 4.0).collect());
    let run = |optimize: bool| {
        let opts = crate::ModelOptions {
            optimize,
            threads: 1,
            ..Default::default()
        };
        let model = crate::Model::from_graph(g.clone(), &opts).unwrap();
        assert_eq!(
            count(model.graph(), "QAdd"),
            if optimize { 3 } else { 0 },
            "the sums fold into QAdd"
        );
        if optimize {
            assert_eq!(
                count(model.graph(), "QLut"),
                3,
                "the ReLU table joins its QAdd"
            );
        }
        let dq_before_selection = model.graph().nodes.iter().any(|n| {
            matches!(
                n.op,
                Op::MaxPool(_) | Op::Concat { .. } | Op::Split { .. } | Op::Transpose { .. }
            ) && n
                .present_inputs()
                .any(|v| model.graph().values[v].dtype == DataType::F32)
        });
        let outs = model
            .new_context()
            .unwrap()
            .run(&[xs.clone(), ys.clone()])
            .unwrap();
        (outs, dq_before_selection)
    };
    let (want, float_selection) = run(false);
    let (got, code_selection) = run(true);
    assert!(float_selection, "the unoptimized graph selects floats");
    assert!(
        !code_selection,
        "after propagation MaxPool/Concat/Split/Transpose read 8-bit codes"
    );
    assert_eq!(got, want, "propagation must not change a single value");
}
