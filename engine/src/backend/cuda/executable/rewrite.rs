//! Graph rewrites this backend makes before compiling: residual adds folded into the
//! convolutions before them, and uint8 activations made int8.

use super::*;
/// Folds `Add(conv(x), z)` and `Relu(Add(conv(x), z))` (conv with constant bias and no
/// activation, its output read only by the add) into one conv node with `z` as a fourth input,
/// placed where the add was (so every input is computed before it and stays live until it).
/// cuDNN then computes `act(conv(x) + bias + z)` in one call. With `int8`, uint8 activations
/// between int8 ops become int8 first ([`signed_activations`]), then `QAdd(QConv(x), z)` (no
/// activation on the sum but ReLU) folds into a dense NHWC QConv with a residual.
pub(super) fn fuse_residual(g: &Graph, int8: bool) -> Result<Graph> {
    use crate::ir::{BinaryOp, ChainStep, UnaryOp};
    let signed;
    let g = if int8 {
        signed = signed_activations(g);
        &signed
    } else {
        g
    };
    let consumers = g.consumers();
    let mut out = g.clone();
    let mut dead = vec![false; g.nodes.len()];
    let producer: HashMap<ValueId, usize> = g
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.outputs.iter().map(move |&o| (o, i)))
        .collect();
    for (j, add) in g.nodes.iter().enumerate() {
        // What the add is: a float sum (ReLU after or not) or, with `int8`, a QAdd.
        let (float_relu, qadd) = match &add.op {
            Op::QAdd(qa) if int8 && matches!(qa.activation, None | Some(Activation::Relu)) => {
                (false, Some(qa))
            }
            Op::Binary(BinaryOp::Add) => (false, None),
            Op::Elementwise(steps) => match steps.as_slice() {
                [ChainStep::Binary {
                    op: BinaryOp::Add,
                    operand: 1,
                    ..
                }] => (false, None),
                [ChainStep::Binary {
                    op: BinaryOp::Add,
                    operand: 1,
                    ..
                }, ChainStep::Unary(UnaryOp::Act(Activation::Relu))] => (true, None),
                _ => continue,
            },
            _ => continue,
        };
        let dtype = if qadd.is_some() {
            DataType::I8
        } else {
            DataType::F32
        };
        let accept = |conv: &Node| match (&conv.op, qadd) {
            (Op::Conv(c), None) => {
                c.activation.is_none()
                    && conv.inputs.len() == 3
                    && conv.input(2).is_some_and(|bv| g.constant(bv).is_some())
            }
            (Op::QConv(q), Some(_)) => {
                q.conv.activation.is_none()
                    && q.residual.is_none()
                    && q.conv.layout == Layout::Nhwc
                    && q.conv.group == 1
                    && (2..=3).contains(&conv.inputs.len())
            }
            _ => false,
        };
        let operands = residual_operands(g, add, dtype, (&producer, &consumers, &dead), accept);
        let Some((i, z, z_first)) = operands else {
            continue;
        };
        let conv = &g.nodes[i];
        let mut inputs = conv.inputs.clone();
        let op = match (&conv.op, qadd) {
            (Op::Conv(c), None) => {
                let mut c = c.clone();
                c.activation = float_relu.then_some(Activation::Relu);
                Op::Conv(c)
            }
            (Op::QConv(q), Some(qa)) => {
                // `Q(act(conv + DQ(z)))`: the conv's own requantization is skipped (as
                // TensorRT does), so values can differ from the unfused graph by a step.
                let mut q = q.clone();
                q.conv.activation = qa.activation;
                q.y = qa.y;
                q.residual = Some(if z_first { qa.a } else { qa.b });
                inputs.resize(3, None);
                Op::QConv(q)
            }
            _ => continue,
        };
        inputs.push(Some(z));
        out.nodes[j] = Node {
            name: format!("{}+{}", conv.name, add.name),
            op,
            inputs,
            outputs: add.outputs.clone(),
        };
        dead[i] = true;
    }
    let mut k = 0;
    out.nodes.retain(|_| {
        k += 1;
        !dead[k - 1]
    });
    Ok(out)
}

/// `g` with uint8 activations between int8 ops stored as int8: a value that a QConv or QAdd
/// produces and only QConvs (as their input) and QAdds read, not a graph input or output,
/// becomes int8 with its zero point minus 128 in the producer's and every consumer's
/// parameters. The same real values, bit for bit (`q_i8 = q_u8 - 128`); it lets cuBLASLt's
/// signed epilogue (and the residual fold) serve ONNX Runtime's default uint8 QDQ models.
pub(super) fn signed_activations(g: &Graph) -> Graph {
    use crate::ir::QParams;
    let consumers = g.consumers();
    let mut producer = vec![None; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for &o in &n.outputs {
            producer[o] = Some(i);
        }
    }
    let reads_as_activation = |node: &Node, v: ValueId| match &node.op {
        Op::QConv(q) => {
            q.residual.is_none()
                && node.input(0) == Some(v)
                && node.present_inputs().filter(|&u| u == v).count() == 1
        }
        Op::QAdd(_) => true,
        _ => false,
    };
    let flip: Vec<ValueId> = (0..g.values.len())
        .filter(|&v| {
            g.values[v].dtype == DataType::U8
                && !g.inputs.contains(&v)
                && !g.outputs.contains(&v)
                && !consumers[v].is_empty()
                && producer[v].is_some_and(|p| match &g.nodes[p].op {
                    Op::QConv(q) => q.residual.is_none(),
                    Op::QAdd(_) => true,
                    _ => false,
                })
                && consumers[v]
                    .iter()
                    .all(|&c| reads_as_activation(&g.nodes[c], v))
        })
        .collect();
    let signed = |q: &mut QParams| {
        if q.dtype == DataType::U8 {
            q.dtype = DataType::I8;
            q.zero_point -= 128;
        }
    };
    let mut out = g.clone();
    for &v in &flip {
        out.values[v].dtype = DataType::I8;
        for i in producer[v].into_iter().chain(consumers[v].iter().copied()) {
            let node = &mut out.nodes[i];
            let (ins, outs) = (node.inputs.clone(), node.outputs.clone());
            match &mut node.op {
                Op::QConv(q) => {
                    if outs.contains(&v) {
                        signed(&mut q.y);
                    }
                    if ins.first() == Some(&Some(v)) {
                        signed(&mut q.x);
                    }
                }
                Op::QAdd(q) => {
                    if outs.contains(&v) {
                        signed(&mut q.y);
                    }
                    if ins.first() == Some(&Some(v)) {
                        signed(&mut q.a);
                    }
                    if ins.get(1) == Some(&Some(v)) {
                        signed(&mut q.b);
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// The conv whose output an add `add` (inputs `a`, `b`) can absorb: the first orientation
/// where one input is produced by a node `accept`s (not fused already), read only by the add
/// and no graph output, with the other input `z` and the sum of its shape, all `dtype`.
/// Returns the conv's index, `z`, and whether `z` is the add's first input.
pub(super) fn residual_operands(
    g: &Graph,
    add: &Node,
    dtype: DataType,
    (producer, consumers, dead): (&HashMap<ValueId, usize>, &[Vec<usize>], &[bool]),
    accept: impl Fn(&Node) -> bool,
) -> Option<(usize, ValueId, bool)> {
    let (Some(Some(a)), Some(Some(b)), 2, 1) = (
        add.inputs.first(),
        add.inputs.get(1),
        add.inputs.len(),
        add.outputs.len(),
    ) else {
        return None;
    };
    let out_v = add.outputs[0];
    [(*a, *b, false), (*b, *a, true)]
        .into_iter()
        .find_map(|(y, z, z_first)| {
            let i = *producer.get(&y)?;
            let ok = !dead[i]
                && y != z
                && accept(&g.nodes[i])
                && consumers[y].len() == 1
                && !g.outputs.contains(&y)
                && [y, z, out_v].iter().all(|&v| g.values[v].dtype == dtype)
                && g.shape(y).ok() == g.shape(z).ok()
                && g.shape(y).ok() == g.shape(out_v).ok();
            ok.then_some((i, z, z_first))
        })
}
