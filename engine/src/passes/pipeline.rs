//! The optimizer's pass order: pin the batch, fold constants (inferring shapes as it goes),
//! run the structural passes, then re-infer every shape for the backend.

use super::{const_fold, optimize_after_folding_with, PassReport};
use crate::error::Result;
use crate::ir::{shape, Graph};

/// What the optimizer did, for logs and `vigil inspect`.
#[derive(Clone, Debug, Default)]
pub struct OptimizeReport {
    /// Nodes removed by constant folding.
    pub folded: usize,
    /// Rewrites of the structural passes (empty when not optimizing).
    pub passes: PassReport,
}

/// Prepares a freshly imported graph for a backend: static shapes for `batch`, constant folding
/// (always: shape-computing subgraphs must become constants), and, when `optimize` is set, the
/// fusion and (NHWC) layout passes.
pub fn prepare(graph: &mut Graph, batch: usize, optimize: bool) -> Result<OptimizeReport> {
    prepare_with(graph, batch, optimize, true)
}

/// [`prepare`], with the NHWC layout rewrite only when `nhwc` is set (see
/// `backend::prefers_nhwc`).
pub fn prepare_with(
    graph: &mut Graph,
    batch: usize,
    optimize: bool,
    nhwc: bool,
) -> Result<OptimizeReport> {
    shape::pin_inputs(graph, batch)?;
    // QDQ patterns fold into integer ops before constant folding dequantizes their weights.
    let (quant, propagated) = if optimize {
        (super::quant_fold(graph)?, super::quant_propagate(graph)?)
    } else {
        (0, 0)
    };
    let mut report = OptimizeReport {
        folded: const_fold::fold_constants(graph)?,
        ..Default::default()
    };
    if optimize {
        report.passes = optimize_after_folding_with(graph, nhwc)?;
        report.passes.add("quant_fold", quant);
        report.passes.add("quant_propagate", propagated);
    }
    shape::infer(graph)?;
    graph.validate()?;
    Ok(report)
}

/// Fills in the static shapes of a graph as loaded, without changing its nodes: shapes that
/// depend on exporter shape arithmetic are found by folding a copy and read back (ValueIds are
/// stable). Used to report FLOPs of the unoptimized graph.
pub fn annotate_shapes(graph: &mut Graph, batch: usize) -> Result<()> {
    let mut copy = graph.clone();
    shape::pin_inputs(&mut copy, batch)?;
    const_fold::fold_constants(&mut copy)?;
    for (v, c) in graph.values.iter_mut().zip(copy.values) {
        if v.shape.is_none() {
            v.shape = c.shape;
        }
    }
    Ok(())
}
