//! The graph: values (tensors) and nodes (ops) in execution order.

use std::collections::HashMap;
use std::sync::Arc;

use super::{DataType, Op, Tensor};
use crate::error::{Error, Result};

/// Index of a value in [`Graph::values`].
pub type ValueId = usize;

/// One tensor-valued edge of the graph.
#[derive(Clone, Debug)]
pub struct Value {
    /// Tensor name from the model, or one made up by the pass that created the value.
    pub name: String,
    /// Element type.
    pub dtype: DataType,
    /// Static shape once inference has run; `None` before, or when it cannot be known.
    pub shape: Option<Vec<usize>>,
    /// Declared shape from the model file (symbolic dims as `None`), for graph inputs/outputs.
    pub declared: Option<Vec<Option<usize>>>,
    /// Constant contents (initializers and folded values); shared so clones stay cheap.
    pub constant: Option<Arc<Tensor>>,
}

/// One operator application.
#[derive(Clone, Debug)]
pub struct Node {
    /// Node name from the model, else `<op_type>#<index>` (for messages and reports).
    pub name: String,
    /// The operator and its attributes.
    pub op: Op,
    /// Inputs in ONNX order; `None` for an omitted optional input.
    pub inputs: Vec<Option<ValueId>>,
    /// Output values, in ONNX order.
    pub outputs: Vec<ValueId>,
}

impl Node {
    /// The present inputs (omitted optionals skipped).
    pub fn present_inputs(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.inputs.iter().flatten().copied()
    }

    /// Input `i` if present.
    pub fn input(&self, i: usize) -> Option<ValueId> {
        self.inputs.get(i).copied().flatten()
    }
}

/// A model graph. `nodes` is kept in a valid execution (topological) order by every pass.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// Every value, indexed by [`ValueId`].
    pub values: Vec<Value>,
    /// Nodes in execution order.
    pub nodes: Vec<Node>,
    /// Runtime inputs (initializers are not listed here).
    pub inputs: Vec<ValueId>,
    /// Model outputs, in model order.
    pub outputs: Vec<ValueId>,
    /// The default-domain opset the model was exported with.
    pub opset: i64,
}

impl Graph {
    /// Adds a non-constant value and returns its id.
    pub fn add_value(&mut self, name: impl Into<String>, dtype: DataType) -> ValueId {
        self.values.push(Value {
            name: name.into(),
            dtype,
            shape: None,
            declared: None,
            constant: None,
        });
        self.values.len() - 1
    }

    /// Adds a constant value (its shape is known immediately).
    pub fn add_constant(&mut self, name: impl Into<String>, t: Tensor) -> ValueId {
        self.values.push(Value {
            name: name.into(),
            dtype: t.dtype(),
            shape: Some(t.shape.clone()),
            declared: None,
            constant: Some(Arc::new(t)),
        });
        self.values.len() - 1
    }

    /// The constant behind a value, if it is one.
    pub fn constant(&self, v: ValueId) -> Option<&Tensor> {
        self.values[v].constant.as_deref()
    }

    /// The constant behind input `i` of `node`, if present and constant.
    pub fn const_input(&self, node: &Node, i: usize) -> Option<&Tensor> {
        node.input(i).and_then(|v| self.constant(v))
    }

    /// The static shape of a value, or an error naming it.
    pub fn shape(&self, v: ValueId) -> Result<&[usize]> {
        self.values[v]
            .shape
            .as_deref()
            .ok_or_else(|| Error::Shape(format!("shape of '{}' is unknown", self.values[v].name)))
    }

    /// Looks a value up by name.
    pub fn value_by_name(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v.name == name)
    }

    /// For each value, the indices of the nodes that read it.
    pub fn consumers(&self) -> Vec<Vec<usize>> {
        let mut c = vec![Vec::new(); self.values.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for v in n.present_inputs() {
                if !c[v].contains(&i) {
                    c[v].push(i);
                }
            }
        }
        c
    }

    /// For each value, the index of the node that writes it (None for inputs and constants).
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut p = vec![None; self.values.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &o in &n.outputs {
                p[o] = Some(i);
            }
        }
        p
    }

    /// Replaces every use of `from` (node inputs and graph outputs) with `to`.
    pub fn replace_uses(&mut self, from: ValueId, to: ValueId) {
        for n in &mut self.nodes {
            for i in n.inputs.iter_mut().flatten() {
                if *i == from {
                    *i = to;
                }
            }
        }
        for o in &mut self.outputs {
            if *o == from {
                *o = to;
            }
        }
    }

    /// Number of non-constant-input parameters (elements of all constants read by nodes).
    pub fn parameter_count(&self) -> usize {
        let mut seen = vec![false; self.values.len()];
        let mut total = 0;
        for n in &self.nodes {
            for v in n.present_inputs() {
                if !seen[v] {
                    seen[v] = true;
                    if let Some(t) = self.constant(v) {
                        total += t.len();
                    }
                }
            }
        }
        total
    }

    /// Node counts by op name, sorted by name (for `vigil inspect`).
    pub fn op_histogram(&self) -> Vec<(&'static str, usize)> {
        let mut m: HashMap<&'static str, usize> = HashMap::new();
        for n in &self.nodes {
            *m.entry(n.op.name()).or_default() += 1;
        }
        let mut v: Vec<_> = m.into_iter().collect();
        v.sort();
        v
    }

    /// Checks structural invariants: ids in range, each value written once, topological order.
    pub fn validate(&self) -> Result<()> {
        let mut ready = vec![false; self.values.len()];
        for &i in &self.inputs {
            ready[i] = true;
        }
        for (i, v) in self.values.iter().enumerate() {
            if v.constant.is_some() {
                ready[i] = true;
            }
        }
        for n in &self.nodes {
            for v in n.present_inputs() {
                if v >= self.values.len() {
                    return Err(Error::InvalidModel(format!(
                        "node '{}' reads a value out of range",
                        n.name
                    )));
                }
                if !ready[v] {
                    return Err(Error::InvalidModel(format!(
                        "node '{}' reads '{}' before it is produced (graph not topologically sorted or value undefined)",
                        n.name, self.values[v].name
                    )));
                }
            }
            for &o in &n.outputs {
                if o >= self.values.len() {
                    return Err(Error::InvalidModel(format!(
                        "node '{}' writes a value out of range",
                        n.name
                    )));
                }
                if ready[o] {
                    return Err(Error::InvalidModel(format!(
                        "value '{}' is written more than once",
                        self.values[o].name
                    )));
                }
                ready[o] = true;
            }
        }
        for &o in &self.outputs {
            if !ready[o] {
                return Err(Error::InvalidModel(format!(
                    "graph output '{}' is never produced",
                    self.values[o].name
                )));
            }
        }
        Ok(())
    }
}
