//! Typed access to a node's attributes, with ONNX defaults supplied by the caller.

use std::collections::HashMap;

use super::proto::attribute_proto::AttributeType;
use super::proto::{AttributeProto, NodeProto, TensorProto};
use crate::error::{Error, Result};

/// The attributes of one node, looked up by name.
pub(crate) struct Attrs<'a> {
    node: &'a str,
    op: &'a str,
    map: HashMap<&'a str, &'a AttributeProto>,
}

impl<'a> Attrs<'a> {
    /// Indexes `n`'s attributes; `node` is the display name used in messages.
    pub(crate) fn new(n: &'a NodeProto, node: &'a str, op: &'a str) -> Result<Self> {
        let mut map = HashMap::new();
        for a in &n.attribute {
            let name = a.name.as_deref().unwrap_or("");
            if map.insert(name, a).is_some() {
                return Err(Error::InvalidModel(format!(
                    "node '{node}' ({op}) has attribute '{name}' twice"
                )));
            }
        }
        Ok(Attrs { node, op, map })
    }

    /// Whether the attribute is present.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    fn get(
        &self,
        name: &str,
        want: AttributeType,
        present: fn(&AttributeProto) -> bool,
    ) -> Result<Option<&'a AttributeProto>> {
        let Some(a) = self.map.get(name).copied() else {
            return Ok(None);
        };
        let t = AttributeType::try_from(a.r#type.unwrap_or(0)).unwrap_or(AttributeType::Undefined);
        if t == want || (t == AttributeType::Undefined && present(a)) {
            Ok(Some(a))
        } else {
            Err(Error::InvalidModel(format!(
                "attribute '{name}' of node '{}' ({}) has type {}, expected {}",
                self.node,
                self.op,
                t.as_str_name(),
                want.as_str_name()
            )))
        }
    }

    /// An integer attribute, if present.
    pub(crate) fn opt_int(&self, name: &str) -> Result<Option<i64>> {
        Ok(self
            .get(name, AttributeType::Int, |a| a.i.is_some())?
            .map(|a| a.i.unwrap_or(0)))
    }

    /// An integer attribute or its default.
    pub(crate) fn int(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.opt_int(name)?.unwrap_or(default))
    }

    /// A required integer attribute.
    pub(crate) fn req_int(&self, name: &str) -> Result<i64> {
        self.opt_int(name)?.ok_or_else(|| self.missing(name))
    }

    /// A boolean (0/1 integer) attribute or its default.
    pub(crate) fn flag(&self, name: &str, default: bool) -> Result<bool> {
        match self.int(name, default as i64)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.bad(name, &format!("{v} (expected 0 or 1)"))),
        }
    }

    /// A float attribute or its default.
    pub(crate) fn float(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self
            .get(name, AttributeType::Float, |a| a.f.is_some())?
            .map_or(default, |a| a.f.unwrap_or(0.0)))
    }

    /// A list-of-integers attribute, if present.
    pub(crate) fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        Ok(self
            .get(name, AttributeType::Ints, |a| !a.ints.is_empty())?
            .map(|a| a.ints.clone()))
    }

    /// A list-of-floats attribute, if present.
    pub(crate) fn floats(&self, name: &str) -> Result<Option<Vec<f32>>> {
        Ok(self
            .get(name, AttributeType::Floats, |a| !a.floats.is_empty())?
            .map(|a| a.floats.clone()))
    }

    /// A string attribute or its default.
    pub(crate) fn string(&self, name: &str, default: &str) -> Result<String> {
        match self.get(name, AttributeType::String, |a| a.s.is_some())? {
            None => Ok(default.to_string()),
            Some(a) => {
                let bytes = a.s.as_deref().unwrap_or(&[]);
                String::from_utf8(bytes.to_vec())
                    .map_err(|_| self.bad(name, "a string that is not UTF-8"))
            }
        }
    }

    /// A tensor attribute, if present.
    pub(crate) fn tensor(&self, name: &str) -> Result<Option<&'a TensorProto>> {
        Ok(self
            .get(name, AttributeType::Tensor, |a| a.t.is_some())?
            .and_then(|a| a.t.as_ref()))
    }

    /// Error for a required attribute that is absent.
    pub(crate) fn missing(&self, name: &str) -> Error {
        Error::InvalidModel(format!(
            "node '{}' ({}) lacks required attribute '{name}'",
            self.node, self.op
        ))
    }

    /// Error for an attribute value that is malformed.
    pub(crate) fn bad(&self, name: &str, what: &str) -> Error {
        Error::InvalidModel(format!(
            "attribute '{name}' of node '{}' ({}) has invalid value {what}",
            self.node, self.op
        ))
    }

    /// Error for an attribute value that is valid ONNX but not implemented.
    pub(crate) fn unsupported(&self, name: &str, what: &str) -> Error {
        Error::Unsupported(format!(
            "attribute {name}={what} of node '{}' ({}) is not supported",
            self.node, self.op
        ))
    }
}
