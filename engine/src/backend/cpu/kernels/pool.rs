//! CPU kernels: pool. (Being written.)

use super::Kernel;
use crate::error::{Error, Result};
use crate::ir::{Graph, Node};

/// Compiles a node handled by this module.
pub fn build(_graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    Err(Error::Unsupported(format!("op {} (node '{}') has no CPU kernel yet", node.op.name(), node.name)))
}
