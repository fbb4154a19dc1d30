//! Graph optimization passes. (Filled by the passes work.)
