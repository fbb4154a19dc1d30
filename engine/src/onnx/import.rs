//! Builds an IR [`Graph`] from a decoded `ModelProto`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::attrs::Attrs;
use super::ops::convert;
use super::proto::tensor_shape_proto::dimension::Value as Dim;
use super::proto::type_proto::Value as TypeValue;
use super::proto::{GraphProto, ModelProto, NodeProto, ValueInfoProto};
use super::tensor::{tensor_from_proto, MAX_ELEMENTS};
use crate::error::{Error, Result};
use crate::ir::{DataType, Graph, Tensor, ValueId};

/// The default-domain (ai.onnx) opsets the importer accepts. Opsets 22 to 25 changed only the
/// element types the supported ops accept (bf16, float8/4, int4/2), not their semantics; types
/// Vigil lacks are rejected when a tensor of that type is met.
pub const OPSET_RANGE: std::ops::RangeInclusive<i64> = 11..=25;

/// Declared element type and shape of a value (symbolic dims as `None`).
type Declared = (DataType, Option<Vec<Option<usize>>>);

fn default_opset(model: &ModelProto) -> Result<i64> {
    let mut found = None;
    for o in &model.opset_import {
        let domain = o.domain.as_deref().unwrap_or("");
        if domain.is_empty() || domain == "ai.onnx" {
            found = Some(o.version.unwrap_or(0));
        }
    }
    let v = found.ok_or_else(|| {
        if model.opset_import.is_empty() {
            Error::InvalidModel("model declares no opset".into())
        } else {
            Error::Unsupported(
                "model uses only non-default operator domains (no ai.onnx opset)".into(),
            )
        }
    })?;
    if !OPSET_RANGE.contains(&v) {
        return Err(Error::Unsupported(format!(
            "ONNX opset {v}; supported opsets are {} to {}",
            OPSET_RANGE.start(),
            OPSET_RANGE.end()
        )));
    }
    Ok(v)
}

/// Parses a value's declared tensor type.
fn declared_type(vi: &ValueInfoProto) -> Result<Declared> {
    let name = vi.name.as_deref().unwrap_or("");
    let tp = vi
        .r#type
        .as_ref()
        .ok_or_else(|| Error::InvalidModel(format!("value '{name}' has no type")))?;
    let Some(TypeValue::TensorType(t)) = &tp.value else {
        return Err(Error::Unsupported(format!(
            "value '{name}' is not a dense tensor"
        )));
    };
    let code = t.elem_type.unwrap_or(0);
    let dtype = DataType::from_onnx(code)
        .map_err(|_| Error::Unsupported(format!("value '{name}' has data type code {code}")))?;
    let shape = match &t.shape {
        None => None,
        Some(s) => Some(
            s.dim
                .iter()
                .map(|d| match &d.value {
                    Some(Dim::DimValue(v)) if *v > MAX_ELEMENTS as i64 => Err(Error::InvalidModel(
                        format!("value '{name}' has dimension {v}"),
                    )),
                    Some(Dim::DimValue(v)) if *v >= 0 => Ok(Some(*v as usize)),
                    _ => Ok(None),
                })
                .collect::<Result<Vec<_>>>()?,
        ),
    };
    Ok((dtype, shape))
}

/// Display name of a node: its name, else its op and position.
fn node_name(n: &NodeProto, i: usize) -> String {
    match n.name.as_deref() {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => format!("{}#{i}", n.op_type.as_deref().unwrap_or("?")),
    }
}

/// Turns a `Constant` node into a tensor.
fn constant_value(n: &NodeProto, name: &str) -> Result<Tensor> {
    let a = Attrs::new(n, name, "Constant")?;
    let mut found = Vec::new();
    if let Some(t) = a.tensor("value")? {
        found.push(tensor_from_proto(
            t,
            &format!("value of Constant node '{name}'"),
        )?);
    }
    if a.has("value_float") {
        found.push(Tensor::from_f32(
            vec![],
            vec![a.float("value_float", 0.0)?],
        )?);
    }
    if let Some(v) = a.floats("value_floats")? {
        found.push(Tensor::from_f32(vec![v.len()], v)?);
    }
    if let Some(v) = a.opt_int("value_int")? {
        found.push(Tensor::from_i64(vec![], vec![v])?);
    }
    if let Some(v) = a.ints("value_ints")? {
        found.push(Tensor::from_i64(vec![v.len()], v)?);
    }
    for unsupported in ["sparse_value", "value_string", "value_strings"] {
        if a.has(unsupported) {
            return Err(Error::Unsupported(format!(
                "Constant node '{name}' with attribute {unsupported}"
            )));
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Error::InvalidModel(format!(
            "Constant node '{name}' has no value attribute"
        ))),
        _ => Err(Error::InvalidModel(format!(
            "Constant node '{name}' has more than one value attribute"
        ))),
    }
}

/// Orders `nodes` so every node follows the producers of its inputs, keeping file order where
/// possible. `known` holds names available before any node runs.
fn topo_order(
    nodes: &[(usize, &NodeProto)],
    known: &HashMap<String, ValueId>,
) -> Result<Vec<usize>> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (k, (i, n)) in nodes.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            if known.contains_key(o.as_str()) || producer.insert(o.as_str(), k).is_some() {
                return Err(Error::InvalidModel(format!(
                    "value '{o}' (output of node '{}') is defined more than once",
                    node_name(n, *i)
                )));
            }
        }
    }
    let mut indegree = vec![0usize; nodes.len()];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (k, (i, n)) in nodes.iter().enumerate() {
        for inp in n.input.iter().filter(|s| !s.is_empty()) {
            if known.contains_key(inp.as_str()) {
                continue;
            }
            let &p = producer.get(inp.as_str()).ok_or_else(|| {
                Error::InvalidModel(format!(
                    "node '{}' reads undefined value '{inp}'",
                    node_name(n, *i)
                ))
            })?;
            indegree[k] += 1;
            users[p].push(k);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..nodes.len())
        .filter(|&k| indegree[k] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(Reverse(k)) = ready.pop() {
        order.push(k);
        for &u in &users[k] {
            indegree[u] -= 1;
            if indegree[u] == 0 {
                ready.push(Reverse(u));
            }
        }
    }
    if order.len() != nodes.len() {
        let stuck = (0..nodes.len()).find(|&k| indegree[k] > 0).map_or(0, |k| k);
        let (i, n) = nodes[stuck];
        return Err(Error::InvalidModel(format!(
            "the graph has a cycle through node '{}'",
            node_name(n, i)
        )));
    }
    Ok(order)
}

/// Builds the IR graph of `model`.
pub(crate) fn import_model(model: &ModelProto) -> Result<Graph> {
    let opset = default_opset(model)?;
    let g: &GraphProto = model
        .graph
        .as_ref()
        .ok_or_else(|| Error::InvalidModel("model has no graph".into()))?;
    if !g.sparse_initializer.is_empty() {
        return Err(Error::Unsupported("sparse initializers".into()));
    }
    let mut graph = Graph {
        opset,
        ..Graph::default()
    };
    let mut names: HashMap<String, ValueId> = HashMap::new();

    for t in &g.initializer {
        let name = t.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(Error::InvalidModel("an initializer has no name".into()));
        }
        let tensor = tensor_from_proto(t, &format!("initializer '{name}'"))?;
        if names.contains_key(&name) {
            return Err(Error::InvalidModel(format!(
                "initializer '{name}' is defined twice"
            )));
        }
        let id = graph.add_constant(name.clone(), tensor);
        names.insert(name, id);
    }

    for vi in &g.input {
        let name = vi.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(Error::InvalidModel("a graph input has no name".into()));
        }
        if let Some(&id) = names.get(&name) {
            if graph.values[id].constant.is_some() && !graph.inputs.contains(&id) {
                continue; // An initializer listed as input (with a default): not a runtime input.
            }
            return Err(Error::InvalidModel(format!(
                "graph input '{name}' is listed twice"
            )));
        }
        let (dtype, declared) = declared_type(vi)?;
        let id = graph.add_value(name.clone(), dtype);
        graph.values[id].declared = declared;
        graph.inputs.push(id);
        names.insert(name, id);
    }

    // Declared types of intermediate values (best effort) and of graph outputs (required).
    let mut declared: HashMap<&str, Declared> = HashMap::new();
    for vi in &g.value_info {
        if let (Some(name), Ok(d)) = (vi.name.as_deref(), declared_type(vi)) {
            declared.insert(name, d);
        }
    }
    for vi in &g.output {
        let name = vi.name.as_deref().unwrap_or("");
        if name.is_empty() {
            return Err(Error::InvalidModel("a graph output has no name".into()));
        }
        declared.insert(name, declared_type(vi)?);
    }

    // Constant nodes become constant values; the rest are sorted and converted.
    let mut rest: Vec<(usize, &NodeProto)> = Vec::new();
    for (i, n) in g.node.iter().enumerate() {
        let domain = n.domain.as_deref().unwrap_or("");
        let op = n.op_type.as_deref().unwrap_or("");
        let name = node_name(n, i);
        if !(domain.is_empty() || domain == "ai.onnx") {
            return Err(Error::Unsupported(format!(
                "op {domain}.{op} (node '{name}') is not supported"
            )));
        }
        if op == "Constant" {
            let out = match n.output.as_slice() {
                [o] if !o.is_empty() => o.clone(),
                _ => {
                    return Err(Error::InvalidModel(format!(
                        "Constant node '{name}' must have one output"
                    )));
                }
            };
            if names.contains_key(&out) {
                return Err(Error::InvalidModel(format!(
                    "value '{out}' is defined more than once"
                )));
            }
            let t = constant_value(n, &name)?;
            let id = graph.add_constant(out.clone(), t);
            names.insert(out, id);
        } else {
            rest.push((i, n));
        }
    }

    for k in topo_order(&rest, &names)? {
        let (i, n) = rest[k];
        let name = node_name(n, i);
        let op_type = n.op_type.as_deref().unwrap_or("");
        let inputs: Vec<Option<ValueId>> = n
            .input
            .iter()
            .map(|s| {
                if s.is_empty() {
                    None
                } else {
                    names.get(s).copied()
                }
            })
            .collect();
        // Every non-empty input resolves: topo_order checked that each one is known or produced earlier.
        if n.input
            .iter()
            .zip(&inputs)
            .any(|(s, v)| !s.is_empty() && v.is_none())
        {
            return Err(Error::InvalidModel(format!(
                "node '{name}' reads an undefined value"
            )));
        }
        let c = convert(&graph, n, &name, &inputs, opset)?;
        let mut outs: Vec<&str> = n.output.iter().map(String::as_str).collect();
        while outs.last() == Some(&"") {
            outs.pop();
        }
        if outs.is_empty() {
            return Err(Error::InvalidModel(format!(
                "node '{name}' ({op_type}) has no outputs"
            )));
        }
        if outs.len() > c.max_outputs {
            return Err(Error::Unsupported(format!(
                "output {} of node '{name}' ({op_type}) is not supported; only the first output is",
                c.max_outputs + 1
            )));
        }
        let mut out_ids = Vec::with_capacity(outs.len());
        for o in outs {
            if o.is_empty() {
                return Err(Error::Unsupported(format!(
                    "node '{name}' ({op_type}) with an omitted middle output"
                )));
            }
            let dtype = declared.get(o).map_or(DataType::F32, |d| d.0);
            let id = graph.add_value(o, dtype);
            names.insert(o.to_string(), id);
            out_ids.push(id);
        }
        graph.nodes.push(crate::ir::Node {
            name,
            op: c.op,
            inputs: c.inputs,
            outputs: out_ids,
        });
    }

    for vi in &g.output {
        let name = vi.name.as_deref().unwrap_or("");
        let &id = names.get(name).ok_or_else(|| {
            Error::InvalidModel(format!("graph output '{name}' is never produced"))
        })?;
        let v = &mut graph.values[id];
        if v.constant.is_none() && v.declared.is_none() {
            v.declared = declared.get(name).and_then(|d| d.1.clone());
        }
        graph.outputs.push(id);
    }
    if graph.outputs.is_empty() {
        return Err(Error::InvalidModel("the graph has no outputs".into()));
    }
    graph.validate()?;
    Ok(graph)
}
