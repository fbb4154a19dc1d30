//! Maps one ONNX node onto an [`Op`], parsing and defaulting its attributes per the ONNX spec
//! (opsets 11–21).

use super::attrs::Attrs;
use super::proto::NodeProto;
use super::tensor::{tensor_from_proto, MAX_ELEMENTS};
use crate::error::{Error, Result};
use crate::ir::*;

/// The result of converting one node: the op, its (possibly trimmed) inputs, and how many
/// outputs it may have (`usize::MAX` for variadic outputs).
pub(crate) struct Converted {
    pub op: Op,
    pub inputs: Vec<Option<ValueId>>,
    pub max_outputs: usize,
}

struct Ctx<'a> {
    graph: &'a Graph,
    name: &'a str,
    op: &'a str,
    inputs: &'a [Option<ValueId>],
}

impl Ctx<'_> {
    /// Checks the input count and that the first `required` inputs are present.
    fn arity(&self, required: usize, max: usize) -> Result<()> {
        let n = self.inputs.len();
        if n < required || n > max || self.inputs[..required].iter().any(Option::is_none) {
            let range = if max == usize::MAX {
                format!("at least {required}")
            } else if required == max {
                format!("{required}")
            } else {
                format!("{required} to {max}")
            };
            return Err(Error::InvalidModel(format!(
                "node '{}' ({}) has {n} inputs, expected {range}",
                self.name, self.op
            )));
        }
        Ok(())
    }

    /// The rank of input `i` if known from an inferred or declared shape.
    fn rank(&self, i: usize) -> Option<usize> {
        let v = &self.graph.values[self.inputs.get(i).copied().flatten()?];
        v.shape
            .as_ref()
            .map(Vec::len)
            .or_else(|| v.declared.as_ref().map(Vec::len))
    }

    /// The constant behind input `i` as i64s, if present and constant.
    fn const_i64(&self, i: usize) -> Result<Option<Vec<i64>>> {
        match self
            .inputs
            .get(i)
            .copied()
            .flatten()
            .and_then(|v| self.graph.constant(v))
        {
            Some(t) => Ok(Some(t.to_i64_vec()?)),
            None => Ok(None),
        }
    }

    fn unsupported(&self, what: &str) -> Error {
        Error::Unsupported(format!(
            "{what} in node '{}' ({}) is not supported",
            self.name, self.op
        ))
    }
}

/// Converts a list of non-negative attribute integers (at least `min` each) into usizes.
fn usizes(a: &Attrs, name: &str, v: Vec<i64>, min: i64) -> Result<Vec<usize>> {
    v.iter()
        .map(|&x| {
            if x < min || x as u64 > MAX_ELEMENTS as u64 {
                Err(a.bad(name, &format!("{v:?}")))
            } else {
                Ok(x as usize)
            }
        })
        .collect()
}

fn auto_pad(a: &Attrs) -> Result<AutoPad> {
    Ok(match a.string("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" | "" => AutoPad::NotSet,
        "SAME_UPPER" => AutoPad::SameUpper,
        "SAME_LOWER" => AutoPad::SameLower,
        "VALID" => AutoPad::Valid,
        other => return Err(a.bad("auto_pad", &format!("'{other}'"))),
    })
}

/// Spatial attributes shared by Conv and pools; `kernel` is known or empty (filled later).
struct Spatial {
    kernel_shape: Vec<usize>,
    strides: Vec<usize>,
    pads: Vec<usize>,
    dilations: Vec<usize>,
    auto_pad: AutoPad,
}

fn spatial(a: &Attrs, kernel: Option<Vec<usize>>) -> Result<Spatial> {
    let kernel_shape = kernel.unwrap_or_default();
    let rank = kernel_shape.len();
    let list = |name: &str, min: i64, len: usize, default: usize| -> Result<Vec<usize>> {
        match a.ints(name)? {
            Some(v) => {
                let v = usizes(a, name, v, min)?;
                if rank > 0 && v.len() != len {
                    return Err(a.bad(name, &format!("{v:?} (expected {len} values)")));
                }
                Ok(v)
            }
            None => Ok(vec![default; len]),
        }
    };
    Ok(Spatial {
        strides: list("strides", 1, rank, 1)?,
        pads: list("pads", 0, 2 * rank, 0)?,
        dilations: list("dilations", 1, rank, 1)?,
        auto_pad: auto_pad(a)?,
        kernel_shape,
    })
}

fn conv_attrs(a: &Attrs, cx: &Ctx) -> Result<ConvAttrs> {
    let kernel = match a.ints("kernel_shape")? {
        Some(k) => Some(usizes(a, "kernel_shape", k, 1)?),
        // Taken from the weight's shape when it is known now; otherwise shape inference fills it.
        None => cx.inputs.get(1).copied().flatten().and_then(|w| {
            let s = cx.graph.values[w].shape.as_ref()?;
            (s.len() >= 3).then(|| s[2..].to_vec())
        }),
    };
    let s = spatial(a, kernel)?;
    let group = a.int("group", 1)?;
    if group < 1 || group as u64 > MAX_ELEMENTS as u64 {
        return Err(a.bad("group", &group.to_string()));
    }
    Ok(ConvAttrs {
        kernel_shape: s.kernel_shape,
        strides: s.strides,
        pads: s.pads,
        dilations: s.dilations,
        group: group as usize,
        auto_pad: s.auto_pad,
        activation: None,
        layout: Layout::Nchw,
    })
}

fn pool_attrs(a: &Attrs, average: bool) -> Result<PoolAttrs> {
    let k = a
        .ints("kernel_shape")?
        .ok_or_else(|| a.missing("kernel_shape"))?;
    let k = usizes(a, "kernel_shape", k, 1)?;
    if k.is_empty() {
        return Err(a.bad("kernel_shape", "[]"));
    }
    let s = spatial(a, Some(k))?;
    Ok(PoolAttrs {
        kernel_shape: s.kernel_shape,
        strides: s.strides,
        pads: s.pads,
        dilations: s.dilations,
        ceil_mode: a.flag("ceil_mode", false)?,
        auto_pad: s.auto_pad,
        count_include_pad: average && a.flag("count_include_pad", false)?,
        layout: Layout::Nchw,
    })
}

fn act(u: Activation) -> Op {
    Op::Unary(UnaryOp::Act(u))
}

/// Converts node `n` (display name `name`, inputs already resolved to value ids).
pub(crate) fn convert(
    graph: &Graph,
    n: &NodeProto,
    name: &str,
    inputs: &[Option<ValueId>],
    opset: i64,
) -> Result<Converted> {
    let op_type = n.op_type.as_deref().unwrap_or("");
    let a = Attrs::new(n, name, op_type)?;
    let cx = Ctx {
        graph,
        name,
        op: op_type,
        inputs,
    };
    let mut ins = inputs.to_vec();
    let mut max_outputs = 1;
    let unary = |u: UnaryOp| -> Result<Op> {
        cx.arity(1, 1)?;
        Ok(Op::Unary(u))
    };
    let binary = |b: BinaryOp| -> Result<Op> {
        cx.arity(2, 2)?;
        Ok(Op::Binary(b))
    };
    let op = match op_type {
        "Conv" => {
            cx.arity(2, 3)?;
            Op::Conv(conv_attrs(&a, &cx)?)
        }
        "ConvTranspose" => {
            cx.arity(2, 3)?;
            let conv = conv_attrs(&a, &cx)?;
            let rank = conv.kernel_shape.len();
            let output_padding = match a.ints("output_padding")? {
                Some(v) => usizes(&a, "output_padding", v, 0)?,
                None => vec![0; rank],
            };
            let output_shape = a
                .ints("output_shape")?
                .map(|v| usizes(&a, "output_shape", v, 0))
                .transpose()?;
            Op::ConvTranspose(ConvTransposeAttrs {
                conv,
                output_padding,
                output_shape,
            })
        }
        "Gemm" => {
            cx.arity(2, 3)?;
            Op::Gemm {
                alpha: a.float("alpha", 1.0)?,
                beta: a.float("beta", 1.0)?,
                trans_a: a.flag("transA", false)?,
                trans_b: a.flag("transB", false)?,
                activation: None,
            }
        }
        "MatMul" => {
            cx.arity(2, 2)?;
            Op::MatMul
        }
        "BatchNormalization" => {
            cx.arity(5, 5)?;
            if a.int("training_mode", 0)? != 0 {
                return Err(a.unsupported("training_mode", "1"));
            }
            Op::BatchNormalization {
                epsilon: a.float("epsilon", 1e-5)?,
            }
        }
        "Relu" => unary(UnaryOp::Act(Activation::Relu))?,
        "LeakyRelu" => unary(UnaryOp::Act(Activation::LeakyRelu {
            alpha: a.float("alpha", 0.01)?,
        }))?,
        "Sigmoid" => unary(UnaryOp::Act(Activation::Sigmoid))?,
        "HardSwish" => unary(UnaryOp::Act(Activation::HardSwish))?,
        "HardSigmoid" => unary(UnaryOp::Act(Activation::HardSigmoid {
            alpha: a.float("alpha", 0.2)?,
            beta: a.float("beta", 0.5)?,
        }))?,
        "Tanh" => unary(UnaryOp::Act(Activation::Tanh))?,
        "Clip" => {
            if opset < 11 {
                cx.arity(1, 1)?;
                act(Activation::Clip {
                    min: a.float("min", f32::MIN)?,
                    max: a.float("max", f32::MAX)?,
                })
            } else {
                cx.arity(1, 3)?;
                Op::Clip
            }
        }
        "Neg" => unary(UnaryOp::Neg)?,
        "Abs" => unary(UnaryOp::Abs)?,
        "Exp" => unary(UnaryOp::Exp)?,
        "Log" => unary(UnaryOp::Log)?,
        "Sqrt" => unary(UnaryOp::Sqrt)?,
        "Reciprocal" => unary(UnaryOp::Reciprocal)?,
        "Floor" => unary(UnaryOp::Floor)?,
        "Ceil" => unary(UnaryOp::Ceil)?,
        "Round" => unary(UnaryOp::Round)?,
        "Erf" => unary(UnaryOp::Erf)?,
        "Not" => unary(UnaryOp::Not)?,
        "Add" => binary(BinaryOp::Add)?,
        "Sub" => binary(BinaryOp::Sub)?,
        "Mul" => binary(BinaryOp::Mul)?,
        "Div" => binary(BinaryOp::Div)?,
        "Pow" => binary(BinaryOp::Pow)?,
        "Equal" => binary(BinaryOp::Equal)?,
        "Less" => binary(BinaryOp::Less)?,
        "Greater" => binary(BinaryOp::Greater)?,
        "And" => binary(BinaryOp::And)?,
        "Or" => binary(BinaryOp::Or)?,
        "Max" | "Min" | "Sum" => {
            if inputs.len() != 2 {
                return Err(cx.unsupported(&format!(
                    "{op_type} with {} inputs (only 2 are)",
                    inputs.len()
                )));
            }
            binary(match op_type {
                "Max" => BinaryOp::Max,
                "Min" => BinaryOp::Min,
                _ => BinaryOp::Add,
            })?
        }
        "MaxPool" => {
            cx.arity(1, 1)?;
            Op::MaxPool(pool_attrs(&a, false)?)
        }
        "AveragePool" => {
            cx.arity(1, 1)?;
            Op::AveragePool(pool_attrs(&a, true)?)
        }
        "GlobalAveragePool" => {
            cx.arity(1, 1)?;
            Op::GlobalAveragePool {
                layout: Layout::Nchw,
            }
        }
        "GlobalMaxPool" => {
            cx.arity(1, 1)?;
            Op::GlobalMaxPool {
                layout: Layout::Nchw,
            }
        }
        "Concat" => {
            cx.arity(1, usize::MAX)?;
            if ins.iter().any(Option::is_none) {
                return Err(Error::InvalidModel(format!(
                    "node '{name}' (Concat) has an empty input"
                )));
            }
            Op::Concat {
                axis: a.req_int("axis")?,
            }
        }
        "Split" => {
            max_outputs = usize::MAX;
            let axis = a.int("axis", 0)?;
            let split = if opset < 13 {
                cx.arity(1, 1)?;
                a.ints("split")?
                    .map(|v| usizes(&a, "split", v, 0))
                    .transpose()?
            } else {
                cx.arity(1, 2)?;
                match cx.const_i64(1)? {
                    Some(v) => Some(usizes(&a, "split", v, 0)?),
                    None => None,
                }
            };
            if opset >= 18 {
                if let Some(k) = a.opt_int("num_outputs")? {
                    if k < 1 || k as usize != n.output.len() {
                        return Err(
                            a.bad("num_outputs", &format!("{k} ({} outputs)", n.output.len()))
                        );
                    }
                }
            }
            Op::Split { axis, split }
        }
        "Slice" => {
            cx.arity(3, 5)?;
            Op::Slice
        }
        "Reshape" => {
            cx.arity(2, 2)?;
            Op::Reshape {
                allowzero: opset >= 14 && a.flag("allowzero", false)?,
            }
        }
        "Transpose" => {
            cx.arity(1, 1)?;
            let perm = match a.ints("perm")? {
                Some(p) => {
                    let p = usizes(&a, "perm", p, 0)?;
                    let mut seen = vec![false; p.len()];
                    for &i in &p {
                        match seen.get_mut(i) {
                            Some(s) if !*s => *s = true,
                            _ => return Err(a.bad("perm", &format!("{p:?} (not a permutation)"))),
                        }
                    }
                    p
                }
                // Default: reverse the dimensions; filled by shape inference when the rank is unknown here.
                None => cx
                    .rank(0)
                    .map(|r| (0..r).rev().collect())
                    .unwrap_or_default(),
            };
            Op::Transpose { perm }
        }
        "Flatten" => {
            cx.arity(1, 1)?;
            Op::Flatten {
                axis: a.int("axis", 1)?,
            }
        }
        "Squeeze" | "Unsqueeze" => {
            let axes = if opset < 13 {
                cx.arity(1, 1)?;
                a.ints("axes")?
            } else {
                cx.arity(1, 2)?;
                cx.const_i64(1)?
            };
            if op_type == "Squeeze" {
                Op::Squeeze { axes }
            } else {
                if opset < 13 && axes.is_none() {
                    return Err(a.missing("axes"));
                }
                if opset >= 13 && ins.get(1).copied().flatten().is_none() {
                    return Err(Error::InvalidModel(format!(
                        "node '{name}' (Unsqueeze) lacks its axes input"
                    )));
                }
                Op::Unsqueeze { axes }
            }
        }
        "Gather" => {
            cx.arity(2, 2)?;
            Op::Gather {
                axis: a.int("axis", 0)?,
            }
        }
        "Expand" => {
            cx.arity(2, 2)?;
            Op::Expand
        }
        "ScatterND" => {
            cx.arity(3, 3)?;
            let r = a.string("reduction", "none")?;
            if r != "none" {
                return Err(a.unsupported("reduction", &r));
            }
            Op::ScatterND
        }
        "Pad" => {
            if opset < 11 {
                return Err(cx.unsupported("Pad with pads as an attribute (opset < 11)"));
            }
            cx.arity(2, 4)?;
            let mode = match a.string("mode", "constant")?.as_str() {
                "constant" => PadMode::Constant,
                "reflect" => PadMode::Reflect,
                "edge" => PadMode::Edge,
                other => return Err(a.unsupported("mode", other)),
            };
            Op::Pad { mode }
        }
        "Cast" => {
            cx.arity(1, 1)?;
            let to = a.req_int("to")?;
            let to = i32::try_from(to).map_err(|_| a.bad("to", &to.to_string()))?;
            // f16/f64/bf16 tensors are held as f32, so a cast to them cannot round as ONNX says.
            if matches!(to, 10 | 11 | 16) {
                return Err(cx.unsupported(&format!("Cast to element type {to} (f16/f64/bf16)")));
            }
            Op::Cast {
                to: DataType::from_onnx(to).map_err(|_| a.unsupported("to", &to.to_string()))?,
            }
        }
        "Resize" => {
            cx.arity(1, 4)?;
            let mode = match a.string("mode", "nearest")?.as_str() {
                "nearest" => ResizeMode::Nearest,
                "linear" => ResizeMode::Linear,
                other => return Err(a.unsupported("mode", other)),
            };
            let coord = match a
                .string("coordinate_transformation_mode", "half_pixel")?
                .as_str()
            {
                "half_pixel" => CoordMode::HalfPixel,
                "pytorch_half_pixel" => CoordMode::PytorchHalfPixel,
                "align_corners" => CoordMode::AlignCorners,
                "asymmetric" => CoordMode::Asymmetric,
                "tf_half_pixel_for_nn" => CoordMode::TfHalfPixelForNn,
                other => return Err(a.unsupported("coordinate_transformation_mode", other)),
            };
            let nearest = match a.string("nearest_mode", "round_prefer_floor")?.as_str() {
                "round_prefer_floor" => NearestMode::RoundPreferFloor,
                "round_prefer_ceil" => NearestMode::RoundPreferCeil,
                "floor" => NearestMode::Floor,
                "ceil" => NearestMode::Ceil,
                other => return Err(a.unsupported("nearest_mode", other)),
            };
            if a.int("exclude_outside", 0)? != 0 {
                return Err(a.unsupported("exclude_outside", "1"));
            }
            if a.int("antialias", 0)? != 0 {
                return Err(a.unsupported("antialias", "1"));
            }
            if a.has("axes") {
                return Err(a.unsupported("axes", "(any)"));
            }
            let policy = a.string("keep_aspect_ratio_policy", "stretch")?;
            if policy != "stretch" {
                return Err(a.unsupported("keep_aspect_ratio_policy", &policy));
            }
            Op::Resize(ResizeAttrs {
                mode,
                coord,
                nearest,
                layout: Layout::Nchw,
            })
        }
        "Softmax" => {
            cx.arity(1, 1)?;
            Op::Softmax {
                axis: a.int("axis", if opset < 13 { 1 } else { -1 })?,
            }
        }
        "Shape" => {
            cx.arity(1, 1)?;
            Op::Shape {
                start: a.int("start", 0)?,
                end: a.opt_int("end")?,
            }
        }
        "ConstantOfShape" => {
            cx.arity(1, 1)?;
            let value = match a.tensor("value")? {
                Some(t) => {
                    let t = tensor_from_proto(t, &format!("value of node '{name}'"))?;
                    if t.len() != 1 {
                        return Err(
                            a.bad("value", &format!("with {} elements (expected 1)", t.len()))
                        );
                    }
                    t
                }
                None => Tensor::from_f32(vec![1], vec![0.0])?,
            };
            Op::ConstantOfShape { value }
        }
        "Where" => {
            cx.arity(3, 3)?;
            Op::Where
        }
        "Range" => {
            cx.arity(3, 3)?;
            Op::Range
        }
        "ReduceMean" => {
            let axes = if opset < 18 {
                cx.arity(1, 1)?;
                a.ints("axes")?
            } else {
                cx.arity(1, 2)?;
                match ins.get(1).copied().flatten() {
                    None => None,
                    Some(_) => Some(cx.const_i64(1)?.ok_or_else(|| {
                        Error::Unsupported(format!(
                            "axes of node '{name}' (ReduceMean) depends on a runtime value"
                        ))
                    })?),
                }
            };
            ins.truncate(1);
            let empty = axes.as_ref().is_none_or(Vec::is_empty);
            if opset >= 18 && empty && a.int("noop_with_empty_axes", 0)? != 0 {
                return Err(a.unsupported("noop_with_empty_axes", "1"));
            }
            Op::ReduceMean {
                axes: if empty { None } else { axes },
                keepdims: a.flag("keepdims", true)?,
            }
        }
        "Identity" => {
            cx.arity(1, 1)?;
            Op::Identity
        }
        "QuantizeLinear" | "DequantizeLinear" => {
            cx.arity(2, 3)?;
            if a.int("block_size", 0)? != 0 {
                return Err(a.unsupported("block_size", "(blocked quantization)"));
            }
            if op_type == "QuantizeLinear" {
                if a.int("saturate", 1)? != 1 {
                    return Err(a.unsupported("saturate", "0"));
                }
                let dtype = match a.opt_int("output_dtype")? {
                    None | Some(0) => None,
                    Some(2) => Some(DataType::U8),
                    Some(3) => Some(DataType::I8),
                    Some(other) => return Err(a.unsupported("output_dtype", &other.to_string())),
                };
                Op::QuantizeLinear {
                    axis: a.int("axis", 1)?,
                    dtype,
                }
            } else {
                Op::DequantizeLinear {
                    axis: a.int("axis", 1)?,
                }
            }
        }
        "Dropout" => {
            cx.arity(1, 3)?;
            // Inference only: training_mode must be absent or a constant false.
            if cx.inputs.get(2).copied().flatten().is_some()
                && cx.const_i64(2)?.is_none_or(|t| t.iter().any(|&x| x != 0))
            {
                return Err(cx.unsupported("Dropout in training mode"));
            }
            ins.truncate(1);
            Op::Identity
        }
        other => {
            return Err(Error::Unsupported(format!(
                "op {other} (node '{name}') is not supported"
            )));
        }
    };
    Ok(Converted {
        op,
        inputs: ins,
        max_outputs,
    })
}
