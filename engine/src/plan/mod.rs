//! Activation memory planning by tensor lifetime.
