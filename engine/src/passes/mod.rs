//! Graph optimization passes, run after import and constant folding. Every pass keeps
//! `graph.nodes` topologically ordered, keeps graph outputs' ValueIds and logical shapes, and
//! changes results by float rounding at most. Each returns the number of rewrites it made.

mod bn_fold;
mod cleanup;
mod const_fold;
mod fuse_activation;
mod fuse_elementwise;
mod layout;
mod pad_fold;
mod pipeline;
mod quant_fold;
mod quant_propagate;
mod transpose_cancel;
mod util;

#[cfg(test)]
mod tests;

pub use bn_fold::bn_fold;
pub use cleanup::cleanup;
pub use const_fold::fold_constants;
pub use fuse_activation::fuse_activation;
pub use fuse_elementwise::fuse_elementwise;
pub use layout::{layout, TO_NCHW, TO_NHWC};
pub use pad_fold::pad_fold;
pub use pipeline::{annotate_shapes, prepare, prepare_with, OptimizeReport};
pub use quant_fold::quant_fold;
pub use quant_propagate::quant_propagate;
pub use transpose_cancel::transpose_cancel;

use crate::error::{Error, Result};
use crate::ir::Graph;

/// Rewrite counts of one optimizer run, per pass name (summed over fixed-point rounds).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// `(pass name, rewrites)` in the order the passes first ran.
    pub rewrites: Vec<(&'static str, usize)>,
    /// Fixed-point rounds of the local (pre-layout) passes.
    pub rounds: usize,
}

impl PassReport {
    /// Total rewrites over all passes.
    pub fn total(&self) -> usize {
        self.rewrites.iter().map(|(_, n)| n).sum()
    }

    /// Rewrites made by the named pass (0 if it never ran).
    pub fn get(&self, pass: &str) -> usize {
        self.rewrites
            .iter()
            .filter(|(p, _)| *p == pass)
            .map(|(_, n)| n)
            .sum()
    }

    fn add(&mut self, pass: &'static str, n: usize) {
        match self.rewrites.iter_mut().find(|(p, _)| *p == pass) {
            Some(e) => e.1 += n,
            None => self.rewrites.push((pass, n)),
        }
    }
}

type Pass = fn(&mut Graph) -> Result<usize>;

/// Upper bound on fixed-point rounds; real graphs settle in two or three.
const MAX_ROUNDS: usize = 32;

fn run_to_fixed_point(
    graph: &mut Graph,
    passes: &[(&'static str, Pass)],
    report: &mut PassReport,
) -> Result<usize> {
    for round in 1..=MAX_ROUNDS {
        let mut changed = 0;
        for (name, pass) in passes {
            let n = pass(graph)?;
            report.add(name, n);
            changed += n;
        }
        if changed == 0 {
            return Ok(round);
        }
    }
    Err(Error::InvalidModel(format!(
        "graph optimizer did not converge in {MAX_ROUNDS} rounds"
    )))
}

/// Runs the optimizer (after constant folding): cleanup, pad/BN folding and fusions to a fixed
/// point, then the NHWC layout rewrite, then transpose cancellation, QDQ propagation and cleanup
/// to a fixed point.
pub fn optimize_after_folding(graph: &mut Graph) -> Result<PassReport> {
    optimize_after_folding_with(graph, true)
}

/// [`optimize_after_folding`], with the NHWC layout rewrite only when `nhwc` is set.
pub fn optimize_after_folding_with(graph: &mut Graph, nhwc: bool) -> Result<PassReport> {
    let mut report = PassReport::default();
    let local: [(&'static str, Pass); 5] = [
        ("cleanup", cleanup),
        ("pad_fold", pad_fold),
        ("bn_fold", bn_fold),
        ("fuse_activation", fuse_activation),
        ("fuse_elementwise", fuse_elementwise),
    ];
    report.rounds = run_to_fixed_point(graph, &local, &mut report)?;
    if nhwc {
        let n = layout(graph)?;
        report.add("layout", n);
    }
    let post: [(&'static str, Pass); 3] = [
        ("transpose_cancel", transpose_cancel),
        ("quant_propagate", quant_propagate),
        ("cleanup", cleanup),
    ];
    run_to_fixed_point(graph, &post, &mut report)?;
    Ok(report)
}
