//! The FP32 graph as the calibrator sees it, and the graphs derived from it.
//!
//! [`QuantGraph`] holds the imported graph with its batch pinned and constants folded but no
//! other rewrite, so every activation keeps its ONNX name (the QDQ model and the TensorRT cache
//! are keyed by those names). From it come:
//! * the observer model: every activation is an extra graph output (the optimizer never fuses a
//!   graph output away), so one run exposes all of them;
//! * the fake-quant graph: the QDQ model's arithmetic in plain f32 ops. Each quantized activation
//!   `x` becomes `Mul(Clip(Round(Div(x, s)), -128, 127), s)` (exactly `DequantizeLinear(
//!   QuantizeLinear(x))` with zero point 0: divide, round half to even, saturate, rescale) and
//!   weights are replaced by their dequantized int8 values;
//! * the shadow graph: the FP32 graph plus, for every quantizable layer, a copy of that layer fed
//!   the fake-quantized FP32 input and weights, for per-layer SQNR with FP32 upstream.

use std::collections::HashMap;

use super::calibrate::{quantize_weights, scale_for, QuantizedWeights};
use crate::error::{Error, Result};
use crate::ir::{Activation, BinaryOp, DataType, Graph, Node, Op, Tensor, UnaryOp, ValueId};
use crate::model::{ExecutionContext, Model, ModelOptions};

/// A Conv/Gemm/MatMul whose activation input and constant weights get quantized.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantLayer {
    /// Index of the node in [`QuantGraph::graph`].
    pub node: usize,
    /// Node name.
    pub name: String,
    /// ONNX op type (`Conv`, `Gemm`, `MatMul`).
    pub op: &'static str,
    /// The activation input (input 0).
    pub input: ValueId,
    /// The constant weight input (input 1).
    pub weight: ValueId,
    /// The node's (first) output.
    pub output: ValueId,
    /// The weights' output-channel axis (per-channel scales run along it).
    pub axis: usize,
}

/// The pinned, constant-folded FP32 graph plus its activations and quantizable layers.
#[derive(Clone, Debug)]
pub struct QuantGraph {
    /// The graph (ONNX value names intact).
    pub graph: Graph,
    /// Every f32 activation: runtime inputs, then node outputs in execution order.
    pub activations: Vec<ValueId>,
    /// Quantizable layers in execution order.
    pub layers: Vec<QuantLayer>,
    act_index: HashMap<ValueId, usize>,
}

impl QuantGraph {
    /// Pins the batch, folds constants and finds activations and quantizable layers.
    pub fn new(mut graph: Graph, batch: usize) -> Result<QuantGraph> {
        crate::passes::prepare(&mut graph, batch, false)?;
        let is_act = |g: &Graph, v: ValueId| {
            g.values[v].constant.is_none() && g.values[v].dtype == DataType::F32
        };
        let mut activations: Vec<ValueId> = graph
            .inputs
            .iter()
            .copied()
            .filter(|&v| is_act(&graph, v))
            .collect();
        for n in &graph.nodes {
            for &o in &n.outputs {
                if is_act(&graph, o) && !activations.contains(&o) {
                    activations.push(o);
                }
            }
        }
        let mut layers = Vec::new();
        for (i, n) in graph.nodes.iter().enumerate() {
            let (op, axis) = match &n.op {
                Op::Conv(a) if a.activation.is_none() => ("Conv", 0),
                Op::Gemm {
                    trans_b,
                    activation: None,
                    ..
                } => ("Gemm", if *trans_b { 0 } else { 1 }),
                Op::MatMul => ("MatMul", 1),
                _ => continue,
            };
            let (Some(x), Some(w), Some(&out)) = (n.input(0), n.input(1), n.outputs.first()) else {
                continue;
            };
            let Some(wt) = graph.constant(w) else {
                continue;
            };
            let rank_ok = match op {
                "Conv" => wt.shape.len() >= 3,
                _ => wt.shape.len() == 2,
            };
            if !is_act(&graph, x) || wt.dtype() != DataType::F32 || !rank_ok {
                continue;
            }
            layers.push(QuantLayer {
                node: i,
                name: n.name.clone(),
                op,
                input: x,
                weight: w,
                output: out,
                axis,
            });
        }
        let act_index = activations
            .iter()
            .enumerate()
            .map(|(i, &v)| (v, i))
            .collect();
        Ok(QuantGraph {
            graph,
            activations,
            layers,
            act_index,
        })
    }

    /// Name of a value.
    pub fn name(&self, v: ValueId) -> &str {
        &self.graph.values[v].name
    }

    /// Position of value `v` in [`QuantGraph::activations`].
    pub fn activation_index(&self, v: ValueId) -> Option<usize> {
        self.act_index.get(&v).copied()
    }

    /// Which layers a mixed-precision list keeps in floating point: a layer matches an entry
    /// equal to its node name, its output name, or its activation input's name.
    pub fn excluded(&self, list: &[String]) -> Vec<bool> {
        self.layers
            .iter()
            .map(|l| {
                list.iter()
                    .any(|e| *e == l.name || e == self.name(l.output) || e == self.name(l.input))
            })
            .collect()
    }

    /// Quantizes every layer's weights (symmetric, per output channel when `per_channel`).
    pub fn quantize_weights(&self, per_channel: bool) -> Result<Vec<QuantizedWeights>> {
        self.layers
            .iter()
            .map(|l| {
                let w = self.graph.constant(l.weight).ok_or_else(|| {
                    Error::InvalidModel(format!("weights of '{}' vanished", l.name))
                })?;
                quantize_weights(w.as_f32()?, &w.shape, l.axis, per_channel)
            })
            .collect()
    }

    /// The observer: a model over this graph whose outputs also include every activation.
    pub fn observer(&self, opts: &ModelOptions) -> Result<Observer> {
        let mut g = self.graph.clone();
        let mut slots = Vec::with_capacity(self.activations.len());
        for &v in &self.activations {
            if let Some(k) = g.inputs.iter().position(|&i| i == v) {
                slots.push(Slot::Input(k));
            } else if let Some(k) = g.outputs.iter().position(|&o| o == v) {
                slots.push(Slot::Output(k));
            } else {
                g.outputs.push(v);
                slots.push(Slot::Output(g.outputs.len() - 1));
            }
        }
        let model = Model::from_graph(g, opts)?;
        let ctx = model.new_context()?;
        Ok(Observer { model, ctx, slots })
    }

    /// Adds fake-quant chains for `targets` (activation, scale) and returns them by activation.
    /// New nodes are recorded in `after` under the node producing the activation (None: inputs).
    fn add_fake_quant(
        &self,
        g: &mut Graph,
        targets: &[(ValueId, f32)],
        after: &mut HashMap<Option<usize>, Vec<Node>>,
    ) -> HashMap<ValueId, ValueId> {
        let producers = g.producers();
        let mut out = HashMap::new();
        for &(v, scale) in targets {
            if out.contains_key(&v) {
                continue;
            }
            let base = g.values[v].name.clone();
            let s = g.add_constant(
                format!("{base}__fq_scale"),
                Tensor {
                    shape: vec![],
                    data: crate::ir::TensorData::F32(vec![scale]),
                },
            );
            let t1 = g.add_value(format!("{base}__fq_div"), DataType::F32);
            let t2 = g.add_value(format!("{base}__fq_round"), DataType::F32);
            let t3 = g.add_value(format!("{base}__fq_clip"), DataType::F32);
            let t4 = g.add_value(format!("{base}__fq"), DataType::F32);
            let node = |name: &str, op: Op, inputs: Vec<ValueId>, o: ValueId| Node {
                name: format!("{base}__fq_{name}"),
                op,
                inputs: inputs.into_iter().map(Some).collect(),
                outputs: vec![o],
            };
            let chain = after.entry(producers[v]).or_default();
            chain.push(node("div", Op::Binary(BinaryOp::Div), vec![v, s], t1));
            chain.push(node("round", Op::Unary(UnaryOp::Round), vec![t1], t2));
            chain.push(node(
                "clip",
                Op::Unary(UnaryOp::Act(Activation::Clip {
                    min: -128.0,
                    max: 127.0,
                })),
                vec![t2],
                t3,
            ));
            chain.push(node("mul", Op::Binary(BinaryOp::Mul), vec![t3, s], t4));
            out.insert(v, t4);
        }
        out
    }

    /// A weight constant holding the dequantized int8 weights of layer `l`.
    fn add_dequantized_weights(
        &self,
        g: &mut Graph,
        l: &QuantLayer,
        q: &QuantizedWeights,
    ) -> Result<ValueId> {
        let t = Tensor::from_f32(q.shape.clone(), q.dequantize())?;
        Ok(g.add_constant(format!("{}__int8_dq", self.name(l.weight)), t))
    }

    /// Re-lists the nodes with each entry of `after` placed right after its key node.
    fn splice(g: &mut Graph, mut after: HashMap<Option<usize>, Vec<Node>>) {
        let old = std::mem::take(&mut g.nodes);
        let mut nodes = after.remove(&None).unwrap_or_default();
        for (i, n) in old.into_iter().enumerate() {
            nodes.push(n);
            if let Some(extra) = after.remove(&Some(i)) {
                nodes.extend(extra);
            }
        }
        g.nodes = nodes;
    }

    fn check_lengths(
        &self,
        amax: &[f32],
        weights: &[QuantizedWeights],
        excluded: &[bool],
    ) -> Result<()> {
        if amax.len() != self.activations.len()
            || weights.len() != self.layers.len()
            || excluded.len() != self.layers.len()
        {
            return Err(Error::BadInput(format!(
                "calibration data does not fit the graph: {} thresholds for {} activations, {} weights and {} exclusion flags for {} layers",
                amax.len(),
                self.activations.len(),
                weights.len(),
                excluded.len(),
                self.layers.len()
            )));
        }
        Ok(())
    }

    fn input_scale(&self, l: &QuantLayer, amax: &[f32]) -> Result<f32> {
        let i = self.activation_index(l.input).ok_or_else(|| {
            Error::InvalidModel(format!("input of layer '{}' is not an activation", l.name))
        })?;
        Ok(scale_for(amax[i]))
    }

    /// The fake-quant graph: the QDQ model's arithmetic with the given activation thresholds
    /// (`amax`, one per activation), quantized weights (one per layer) and excluded layers.
    pub fn fake_quant_graph(
        &self,
        amax: &[f32],
        weights: &[QuantizedWeights],
        excluded: &[bool],
    ) -> Result<Graph> {
        self.check_lengths(amax, weights, excluded)?;
        let mut g = self.graph.clone();
        let mut targets = Vec::new();
        for (l, &ex) in self.layers.iter().zip(excluded) {
            if !ex {
                targets.push((l.input, self.input_scale(l, amax)?));
            }
        }
        let mut after = HashMap::new();
        let fq = self.add_fake_quant(&mut g, &targets, &mut after);
        for ((l, q), &ex) in self.layers.iter().zip(weights).zip(excluded) {
            if ex {
                continue;
            }
            let w = self.add_dequantized_weights(&mut g, l, q)?;
            let node = &mut g.nodes[l.node];
            node.inputs[0] = fq.get(&l.input).copied();
            node.inputs[1] = Some(w);
        }
        Self::splice(&mut g, after);
        Ok(g)
    }

    /// The shadow graph: outputs are the FP32 outputs, then each layer's FP32 output, then each
    /// layer's output computed from fake-quantized input and weights (every layer, excluded or
    /// not, so the report ranks them all).
    pub fn shadow_graph(&self, amax: &[f32], weights: &[QuantizedWeights]) -> Result<ShadowGraph> {
        self.check_lengths(amax, weights, &vec![false; self.layers.len()])?;
        let mut g = self.graph.clone();
        let targets = self
            .layers
            .iter()
            .map(|l| Ok((l.input, self.input_scale(l, amax)?)))
            .collect::<Result<Vec<_>>>()?;
        let mut after = HashMap::new();
        let fq = self.add_fake_quant(&mut g, &targets, &mut after);
        let model_outputs = g.outputs.len();
        let mut reference = Vec::new();
        let mut shadow = Vec::new();
        for (l, q) in self.layers.iter().zip(weights) {
            let w = self.add_dequantized_weights(&mut g, l, q)?;
            let out = g.add_value(
                format!("{}__int8_shadow", self.name(l.output)),
                DataType::F32,
            );
            let mut node = g.nodes[l.node].clone();
            node.name = format!("{}__int8_shadow", node.name);
            node.inputs[0] = fq.get(&l.input).copied();
            node.inputs[1] = Some(w);
            node.outputs = vec![out];
            after.entry(Some(l.node)).or_default().push(node);
            reference.push(match g.outputs.iter().position(|&o| o == l.output) {
                Some(k) => k,
                None => {
                    g.outputs.push(l.output);
                    g.outputs.len() - 1
                }
            });
            shadow.push(out);
        }
        for s in shadow.iter_mut() {
            g.outputs.push(*s);
            *s = g.outputs.len() - 1;
        }
        Self::splice(&mut g, after);
        Ok(ShadowGraph {
            graph: g,
            model_outputs,
            reference,
            shadow,
        })
    }
}

/// The shadow graph and where its outputs are.
#[derive(Clone, Debug)]
pub struct ShadowGraph {
    /// The graph to run.
    pub graph: Graph,
    /// The first `model_outputs` outputs are the FP32 model's own.
    pub model_outputs: usize,
    /// Per layer: output index of the layer's FP32 result.
    pub reference: Vec<usize>,
    /// Per layer: output index of the layer's fake-quant result.
    pub shadow: Vec<usize>,
}

/// Where an activation is found after a run.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Input(usize),
    Output(usize),
}

/// Runs the FP32 graph and hands every activation to a callback.
pub struct Observer {
    model: Model,
    ctx: ExecutionContext,
    slots: Vec<Slot>,
}

impl Observer {
    /// The underlying model (its first outputs are the original model's).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Runs `inputs` and calls `f(activation index, values)` for every activation.
    pub fn observe(
        &mut self,
        inputs: &[&Tensor],
        mut f: impl FnMut(usize, &[f32]) -> Result<()>,
    ) -> Result<()> {
        let outputs = self.ctx.run_ref(inputs)?;
        for (i, slot) in self.slots.iter().enumerate() {
            let t = match *slot {
                Slot::Input(k) => inputs.get(k).copied(),
                Slot::Output(k) => outputs.get(k),
            }
            .ok_or_else(|| Error::BadInput("observer slot out of range".into()))?;
            f(i, t.as_f32()?)?;
        }
        Ok(())
    }

    /// Runs `inputs` and returns every activation, in [`QuantGraph::activations`] order.
    pub fn observe_all<'a>(&'a mut self, inputs: &[&'a Tensor]) -> Result<Vec<&'a [f32]>> {
        let outputs = self.ctx.run_ref(inputs)?;
        self.slots
            .iter()
            .map(|slot| {
                match *slot {
                    Slot::Input(k) => inputs.get(k).copied(),
                    Slot::Output(k) => outputs.get(k),
                }
                .ok_or_else(|| Error::BadInput("observer slot out of range".into()))
                .and_then(|t| t.as_f32())
            })
            .collect()
    }
}
