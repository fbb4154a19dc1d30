//! Writes an explicitly quantized (QDQ) ONNX model, as ONNX Runtime and TensorRT's ONNX parser
//! expect it: `QuantizeLinear` → `DequantizeLinear` pairs on the activation input of every
//! quantized Conv/Gemm/MatMul, int8 weight initializers behind a `DequantizeLinear` (per output
//! channel via `axis`), zero points 0 (symmetric), biases left in float. Everything else of the
//! original model is kept; weights and nodes left without readers are dropped.
//!
//! Names follow ONNX Runtime's quantization tool: `<x>_scale`, `<x>_zero_point`,
//! `<x>_QuantizeLinear`, `<x>_QuantizeLinear_Output`, `<x>_DequantizeLinear_Output`, and
//! `<w>_quantized` for int8 weights.

use std::collections::{HashMap, HashSet};

use prost::Message;

use super::calibrate::QuantizedWeights;
use crate::error::{Error, Result};
use crate::onnx::proto::{AttributeProto, ModelProto, NodeProto, TensorProto};

/// ONNX `TensorProto.DataType` codes used here.
const FLOAT: i32 = 1;
const INT8: i32 = 3;
/// ONNX `AttributeProto.AttributeType.INT`.
const ATTR_INT: i32 = 2;

/// One quantized layer, by ONNX names.
#[derive(Clone, Debug)]
pub struct QdqLayer<'a> {
    /// The first output of the Conv/Gemm/MatMul node (identifies the node).
    pub node_output: &'a str,
    /// The activation input (input 0) and its scale.
    pub input: &'a str,
    /// Scale of the activation (`amax / 127`).
    pub input_scale: f32,
    /// The weight input (input 1).
    pub weight: &'a str,
    /// Its int8 values and scales.
    pub weights: &'a QuantizedWeights,
}

fn f32_tensor(name: &str, dims: Vec<i64>, v: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.to_string()),
        dims,
        data_type: Some(FLOAT),
        raw_data: Some(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        ..Default::default()
    }
}

fn i8_tensor(name: &str, dims: Vec<i64>, v: &[i8]) -> TensorProto {
    TensorProto {
        name: Some(name.to_string()),
        dims,
        data_type: Some(INT8),
        raw_data: Some(v.iter().map(|&x| x as u8).collect()),
        ..Default::default()
    }
}

fn node(op: &str, name: &str, inputs: [&str; 3], output: &str, axis: Option<i64>) -> NodeProto {
    NodeProto {
        op_type: Some(op.to_string()),
        name: Some(name.to_string()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.to_string()],
        attribute: axis
            .map(|a| AttributeProto {
                name: Some("axis".into()),
                r#type: Some(ATTR_INT),
                i: Some(a),
                ..Default::default()
            })
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

/// Hands out names not used anywhere in the model yet.
struct Names(HashSet<String>);

impl Names {
    fn fresh(&mut self, want: String) -> String {
        let mut name = want.clone();
        let mut k = 1;
        while self.0.contains(&name) {
            name = format!("{want}_{k}");
            k += 1;
        }
        self.0.insert(name.clone());
        name
    }
}

/// Rewrites `model_bytes` into a QDQ model quantizing `layers`.
pub fn write_qdq_model(model_bytes: &[u8], layers: &[QdqLayer]) -> Result<Vec<u8>> {
    let mut model = ModelProto::decode(model_bytes)
        .map_err(|e| Error::InvalidModel(format!("not an ONNX protobuf: {e}")))?;
    let opset = model
        .opset_import
        .iter()
        .filter(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        .filter_map(|o| o.version)
        .max()
        .unwrap_or(0);
    if opset < 13 {
        return Err(Error::Unsupported(format!(
            "QDQ export needs opset 13 or later (per-channel DequantizeLinear); the model has opset {opset}"
        )));
    }
    let graph = model
        .graph
        .as_mut()
        .ok_or_else(|| Error::InvalidModel("model has no graph".into()))?;

    let mut names = Names(HashSet::new());
    for n in &graph.node {
        names.0.extend(n.output.iter().cloned());
        names.0.extend(n.input.iter().cloned());
        if let Some(s) = &n.name {
            names.0.insert(s.clone());
        }
    }
    names
        .0
        .extend(graph.initializer.iter().filter_map(|t| t.name.clone()));
    names
        .0
        .extend(graph.input.iter().filter_map(|v| v.name.clone()));

    let producer: HashMap<String, usize> = graph
        .node
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.output.iter().map(move |o| (o.clone(), i)))
        .collect();

    let mut after: HashMap<Option<usize>, Vec<NodeProto>> = HashMap::new();
    let mut act_dq: HashMap<&str, String> = HashMap::new();
    let mut w_dq: HashMap<&str, String> = HashMap::new();
    let mut new_inits = Vec::new();
    let mut rewires = Vec::new();
    for l in layers {
        let &node_idx = producer
            .get(l.node_output)
            .ok_or_else(|| Error::InvalidModel(format!("no node writes '{}'", l.node_output)))?;
        let n = &graph.node[node_idx];
        if n.input.first().map(String::as_str) != Some(l.input)
            || n.input.get(1).map(String::as_str) != Some(l.weight)
        {
            return Err(Error::InvalidModel(format!(
                "node writing '{}' does not read '{}' and '{}'",
                l.node_output, l.input, l.weight
            )));
        }
        if !(l.input_scale > 0.0 && l.input_scale.is_finite()) {
            return Err(Error::BadInput(format!(
                "activation '{}' has scale {}",
                l.input, l.input_scale
            )));
        }
        if !act_dq.contains_key(l.input) {
            let scale = names.fresh(format!("{}_scale", l.input));
            let zp = names.fresh(format!("{}_zero_point", l.input));
            let q_out = names.fresh(format!("{}_QuantizeLinear_Output", l.input));
            let dq_out = names.fresh(format!("{}_DequantizeLinear_Output", l.input));
            let q_name = names.fresh(format!("{}_QuantizeLinear", l.input));
            let dq_name = names.fresh(format!("{}_DequantizeLinear", l.input));
            new_inits.push(f32_tensor(&scale, vec![], &[l.input_scale]));
            new_inits.push(i8_tensor(&zp, vec![], &[0]));
            let slot = after.entry(producer.get(l.input).copied()).or_default();
            slot.push(node(
                "QuantizeLinear",
                &q_name,
                [l.input, &scale, &zp],
                &q_out,
                None,
            ));
            slot.push(node(
                "DequantizeLinear",
                &dq_name,
                [&q_out, &scale, &zp],
                &dq_out,
                None,
            ));
            act_dq.insert(l.input, dq_out);
        }
        if !w_dq.contains_key(l.weight) {
            let q = l.weights;
            let dims: Vec<i64> = q.shape.iter().map(|&d| d as i64).collect();
            let per_channel = q.scales.len() > 1;
            let scale_dims = if per_channel {
                vec![q.scales.len() as i64]
            } else {
                vec![]
            };
            let qname = names.fresh(format!("{}_quantized", l.weight));
            let scale = names.fresh(format!("{}_scale", l.weight));
            let zp = names.fresh(format!("{}_zero_point", l.weight));
            let dq_out = names.fresh(format!("{}_DequantizeLinear_Output", l.weight));
            let dq_name = names.fresh(format!("{}_DequantizeLinear", l.weight));
            new_inits.push(i8_tensor(&qname, dims, &q.values));
            new_inits.push(f32_tensor(&scale, scale_dims.clone(), &q.scales));
            new_inits.push(i8_tensor(&zp, scale_dims, &vec![0; q.scales.len()]));
            after.entry(None).or_default().push(node(
                "DequantizeLinear",
                &dq_name,
                [&qname, &scale, &zp],
                &dq_out,
                per_channel.then_some(q.axis as i64),
            ));
            w_dq.insert(l.weight, dq_out);
        }
        rewires.push((node_idx, act_dq[l.input].clone(), w_dq[l.weight].clone()));
    }
    for (i, a, w) in rewires {
        graph.node[i].input[0] = a;
        graph.node[i].input[1] = w;
    }

    let old = std::mem::take(&mut graph.node);
    let mut nodes = after.remove(&None).unwrap_or_default();
    for (i, n) in old.into_iter().enumerate() {
        nodes.push(n);
        if let Some(extra) = after.remove(&Some(i)) {
            nodes.extend(extra);
        }
    }
    graph.node = nodes;
    graph.initializer.extend(new_inits);
    prune(graph);
    Ok(model.encode_to_vec())
}

/// Drops nodes whose outputs nobody reads (and that write no graph output), then initializers,
/// initializer-backed inputs and value_info entries that nothing refers to any more.
fn prune(graph: &mut crate::onnx::proto::GraphProto) {
    let outputs: HashSet<String> = graph.output.iter().filter_map(|o| o.name.clone()).collect();
    loop {
        let used: HashSet<&str> = graph
            .node
            .iter()
            .flat_map(|n| n.input.iter().map(String::as_str))
            .collect();
        let before = graph.node.len();
        let keep: Vec<bool> = graph
            .node
            .iter()
            .map(|n| {
                n.output
                    .iter()
                    .any(|o| !o.is_empty() && (used.contains(o.as_str()) || outputs.contains(o)))
            })
            .collect();
        let mut k = keep.into_iter();
        graph.node.retain(|_| k.next().unwrap_or(true));
        if graph.node.len() == before {
            break;
        }
    }
    let mut used: HashSet<String> = graph
        .node
        .iter()
        .flat_map(|n| n.input.iter().cloned())
        .collect();
    used.extend(outputs);
    let inits: HashSet<String> = graph
        .initializer
        .iter()
        .filter_map(|t| t.name.clone())
        .collect();
    graph
        .initializer
        .retain(|t| t.name.as_ref().is_some_and(|n| used.contains(n)));
    graph.input.retain(|v| {
        v.name
            .as_ref()
            .is_some_and(|n| !inits.contains(n) || used.contains(n))
    });
    let live: HashSet<String> = graph
        .node
        .iter()
        .flat_map(|n| n.output.iter().cloned())
        .collect();
    graph
        .value_info
        .retain(|v| v.name.as_ref().is_some_and(|n| live.contains(n)));
}
