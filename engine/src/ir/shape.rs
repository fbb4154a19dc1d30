//! Static shape and type inference.
//!
//! [`pin_inputs`] fixes the runtime inputs' shapes from their declarations and a batch size,
//! [`infer`] then walks the nodes in order and records every output's element type and shape,
//! resolving `auto_pad` and other rank-dependent attribute defaults on the way.
//! Shapes that depend on a runtime value (a non-constant Reshape shape, Slice bound, ...) are
//! rejected with [`Error::Unsupported`].

use crate::error::{Error, Result};
use crate::ir::{
    AutoPad, BinaryOp, ChainStep, DataType, Graph, Layout, Node, Op, Tensor, UnaryOp, ValueId,
};

/// Largest element count of any inferred tensor.
const MAX_ELEMENTS: usize = 1 << 31;

fn err(node: &Node, msg: impl std::fmt::Display) -> Error {
    Error::Shape(format!("node '{}' ({}): {msg}", node.name, node.op.name()))
}

fn runtime(node: &Node, what: &str) -> Error {
    Error::Unsupported(format!(
        "{what} of node '{}' ({}) depends on a runtime value; only constant {what} is supported",
        node.name,
        node.op.name()
    ))
}

fn input_id(g: &Graph, node: &Node, i: usize) -> Result<ValueId> {
    let v = node
        .input(i)
        .ok_or_else(|| err(node, format!("input {i} is missing")))?;
    if v >= g.values.len() {
        return Err(err(node, format!("input {i} is out of range")));
    }
    Ok(v)
}

fn in_shape<'a>(g: &'a Graph, node: &Node, i: usize) -> Result<&'a [usize]> {
    g.shape(input_id(g, node, i)?)
}

fn in_dtype(g: &Graph, node: &Node, i: usize) -> Result<DataType> {
    Ok(g.values[input_id(g, node, i)?].dtype)
}

/// The constant at input `i`: `None` when the input is omitted, an error when it is not constant.
fn const_in<'a>(g: &'a Graph, node: &Node, i: usize, what: &str) -> Result<Option<&'a Tensor>> {
    match node.input(i) {
        None => Ok(None),
        Some(v) if v >= g.values.len() => Err(err(node, format!("input {i} is out of range"))),
        Some(v) => g.constant(v).map(Some).ok_or_else(|| runtime(node, what)),
    }
}

fn const_i64(g: &Graph, node: &Node, i: usize, what: &str) -> Result<Option<Vec<i64>>> {
    const_in(g, node, i, what)?
        .map(Tensor::to_i64_vec)
        .transpose()
}

/// Element count of a shape, bounded by [`MAX_ELEMENTS`].
fn numel(node: &Node, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| {
            n.checked_mul(d).filter(|&n| n <= MAX_ELEMENTS)
        })
        .ok_or_else(|| err(node, format!("shape {shape:?} has too many elements")))
}

/// Converts a signed size into a dim, rejecting negatives and absurd values.
fn dim(node: &Node, v: i128, what: &str) -> Result<usize> {
    if v < 0 || v > MAX_ELEMENTS as i128 {
        return Err(err(node, format!("{what} would be {v}")));
    }
    Ok(v as usize)
}

fn norm_axis(node: &Node, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(err(
            node,
            format!("axis {axis} is out of range for rank {rank}"),
        ));
    }
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}

fn norm_axes(node: &Node, axes: &[i64], rank: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = norm_axis(node, a, rank)?;
        if out.contains(&a) {
            return Err(err(node, format!("axis {a} is repeated in {axes:?}")));
        }
        out.push(a);
    }
    Ok(out)
}

/// Multidirectional (numpy) broadcasting of several shapes.
pub fn broadcast_shapes(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(out)
}

fn broadcast(node: &Node, shapes: &[&[usize]]) -> Result<Vec<usize>> {
    broadcast_shapes(shapes).ok_or_else(|| err(node, format!("shapes {shapes:?} do not broadcast")))
}

/// Spatial dims, channel count and batch of an activation in `layout`.
fn split_activation<'a>(
    node: &Node,
    x: &'a [usize],
    layout: Layout,
) -> Result<(usize, usize, &'a [usize])> {
    match layout {
        Layout::Nchw if x.len() >= 3 => Ok((x[0], x[1], &x[2..])),
        Layout::Nhwc if x.len() == 4 => Ok((x[0], x[3], &x[1..3])),
        _ => Err(err(
            node,
            format!("input shape {x:?} does not fit layout {layout:?}"),
        )),
    }
}

fn join_activation(n: usize, c: usize, spatial: Vec<usize>, layout: Layout) -> Vec<usize> {
    let mut s = vec![n];
    match layout {
        Layout::Nchw => {
            s.push(c);
            s.extend(spatial);
        }
        Layout::Nhwc => {
            s.extend(spatial);
            s.push(c);
        }
    }
    s
}

/// Fully resolved window parameters for one conv/pool application.
struct Window {
    kernel: Vec<usize>,
    strides: Vec<usize>,
    dilations: Vec<usize>,
    pads: Vec<usize>,
}

fn or_default(v: &[usize], rank: usize, default: usize) -> Vec<usize> {
    if v.is_empty() {
        vec![default; rank]
    } else {
        v.to_vec()
    }
}

/// Resolves defaults and `auto_pad` for a window over `input` spatial dims.
#[allow(clippy::too_many_arguments)]
fn window(
    node: &Node,
    input: &[usize],
    kernel: &[usize],
    strides: &[usize],
    dilations: &[usize],
    pads: &[usize],
    auto_pad: AutoPad,
) -> Result<Window> {
    let r = input.len();
    let strides = or_default(strides, r, 1);
    let dilations = or_default(dilations, r, 1);
    let pads = or_default(pads, 2 * r, 0);
    if kernel.len() != r || strides.len() != r || dilations.len() != r || pads.len() != 2 * r {
        return Err(err(
            node,
            format!(
                "{r} spatial dims but kernel {kernel:?}, strides {strides:?}, dilations {dilations:?}, pads {pads:?}"
            ),
        ));
    }
    if strides.contains(&0) || dilations.contains(&0) || kernel.contains(&0) {
        return Err(err(node, "zero kernel size, stride or dilation"));
    }
    let mut out_pads = pads.clone();
    for i in 0..r {
        let eff = (kernel[i] as i128 - 1) * dilations[i] as i128 + 1;
        let (begin, end) = match auto_pad {
            AutoPad::NotSet => (pads[i], pads[i + r]),
            AutoPad::Valid => (0, 0),
            AutoPad::SameUpper | AutoPad::SameLower => {
                let (inp, s) = (input[i] as i128, strides[i] as i128);
                let out = (inp + s - 1) / s;
                let total = ((out - 1) * s + eff - inp).max(0);
                let total = dim(node, total, "SAME padding")?;
                if auto_pad == AutoPad::SameUpper {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                }
            }
        };
        out_pads[i] = begin;
        out_pads[i + r] = end;
    }
    Ok(Window {
        kernel: kernel.to_vec(),
        strides,
        dilations,
        pads: out_pads,
    })
}

/// Output spatial size of a sliding window (conv or pool).
fn window_output(node: &Node, input: &[usize], w: &Window, ceil_mode: bool) -> Result<Vec<usize>> {
    let r = input.len();
    (0..r)
        .map(|i| {
            let eff = (w.kernel[i] as i128 - 1) * w.dilations[i] as i128 + 1;
            let padded = input[i] as i128 + w.pads[i] as i128 + w.pads[i + r] as i128;
            let s = w.strides[i] as i128;
            if padded < eff {
                return Err(err(
                    node,
                    format!(
                        "kernel extent {eff} exceeds padded input {padded} on spatial axis {i}"
                    ),
                ));
            }
            let span = padded - eff;
            let mut out = if ceil_mode {
                (span + s - 1) / s + 1
            } else {
                span / s + 1
            };
            // A window that would start inside the end padding is dropped (ORT/PyTorch rule).
            if ceil_mode && (out - 1) * s >= input[i] as i128 + w.pads[i] as i128 {
                out -= 1;
            }
            dim(node, out, "output size")
        })
        .collect()
}

/// Checks a Q/DQ node's scale and zero point: one element, or (per-axis) one per `x[axis]`.
fn quant_params_fit(g: &Graph, node: &Node, x: &[usize], axis: i64) -> Result<()> {
    let r = x.len() as i64;
    let a = if axis < 0 { axis + r } else { axis };
    for k in [1, 2] {
        if node.input(k).is_none() {
            continue;
        }
        let s = in_shape(g, node, k)?;
        let n: usize = s.iter().product();
        let ok = s.len() <= 1 && (n == 1 || ((0..r).contains(&a) && n == x[a as usize]));
        if !ok {
            return Err(err(
                node,
                format!("scale/zero point shape {s:?} does not fit input {x:?} on axis {axis}"),
            ));
        }
    }
    Ok(())
}

fn conv_shape(g: &Graph, node: &Node, a: &crate::ir::ConvAttrs) -> Result<Vec<usize>> {
    let x = in_shape(g, node, 0)?;
    let w = in_shape(g, node, 1)?;
    let (n, c, spatial) = split_activation(node, x, a.layout)?;
    if w.len() != spatial.len() + 2 {
        return Err(err(
            node,
            format!("weight shape {w:?} does not match input {x:?}"),
        ));
    }
    let kernel = if a.kernel_shape.is_empty() {
        &w[2..]
    } else {
        &a.kernel_shape[..]
    };
    if kernel != &w[2..] {
        return Err(err(
            node,
            format!("kernel_shape {kernel:?} does not match weight {w:?}"),
        ));
    }
    let group = a.group;
    if group == 0 || w[1].checked_mul(group) != Some(c) || w[0] % group != 0 {
        return Err(err(
            node,
            format!("input channels {c}, weight {w:?} and group {group} do not fit"),
        ));
    }
    if let Ok(b) = in_shape(g, node, 2).map(<[usize]>::to_vec) {
        if node.input(2).is_some() && b != [w[0]] {
            return Err(err(node, format!("bias shape {b:?}, expected [{}]", w[0])));
        }
    }
    let win = window(
        node,
        spatial,
        kernel,
        &a.strides,
        &a.dilations,
        &a.pads,
        a.auto_pad,
    )?;
    let out = window_output(node, spatial, &win, false)?;
    Ok(join_activation(n, w[0], out, a.layout))
}

/// Explicit pads and output spatial size of a ConvTranspose.
fn conv_transpose_geometry(
    node: &Node,
    a: &crate::ir::ConvTransposeAttrs,
    spatial: &[usize],
    kernel: &[usize],
) -> Result<(Vec<usize>, Vec<usize>)> {
    let r = spatial.len();
    let c = &a.conv;
    let strides = or_default(&c.strides, r, 1);
    let dilations = or_default(&c.dilations, r, 1);
    let pads = or_default(&c.pads, 2 * r, 0);
    let opad = or_default(&a.output_padding, r, 0);
    if kernel.len() != r
        || strides.len() != r
        || dilations.len() != r
        || pads.len() != 2 * r
        || opad.len() != r
    {
        return Err(err(node, "attribute lengths do not match the spatial rank"));
    }
    if strides.contains(&0) || dilations.contains(&0) {
        return Err(err(node, "zero stride or dilation"));
    }
    let target: Option<Vec<usize>> = match (&a.output_shape, c.auto_pad) {
        (Some(os), _) if os.len() >= r => Some(os[os.len() - r..].to_vec()),
        (Some(os), _) => {
            return Err(err(
                node,
                format!("output_shape {os:?} is shorter than the spatial rank"),
            ));
        }
        (None, AutoPad::SameUpper | AutoPad::SameLower) => Some(
            spatial
                .iter()
                .zip(&strides)
                .map(|(&i, &s)| dim(node, i as i128 * s as i128, "output size"))
                .collect::<Result<_>>()?,
        ),
        _ => None,
    };
    let mut out_pads = pads.clone();
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let eff = (kernel[i] as i128 - 1) * dilations[i] as i128 + 1;
        let full = strides[i] as i128 * (spatial[i] as i128 - 1) + opad[i] as i128 + eff;
        match &target {
            Some(t) => {
                let total = full - t[i] as i128;
                let total = dim(node, total, "total padding for the requested output shape")?;
                let (b, e) = if c.auto_pad == AutoPad::SameUpper {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                };
                out_pads[i] = b;
                out_pads[i + r] = e;
                out.push(t[i]);
            }
            None => {
                if c.auto_pad == AutoPad::Valid {
                    out_pads[i] = 0;
                    out_pads[i + r] = 0;
                }
                let o = full - out_pads[i] as i128 - out_pads[i + r] as i128;
                out.push(dim(node, o, "output size")?);
            }
        }
    }
    Ok((out_pads, out))
}

fn conv_transpose_shape(
    g: &Graph,
    node: &Node,
    a: &crate::ir::ConvTransposeAttrs,
) -> Result<Vec<usize>> {
    let x = in_shape(g, node, 0)?;
    let w = in_shape(g, node, 1)?;
    let (n, c, spatial) = split_activation(node, x, a.conv.layout)?;
    if w.len() != spatial.len() + 2 || w[0] != c {
        return Err(err(
            node,
            format!("weight shape {w:?} does not match input {x:?}"),
        ));
    }
    let kernel = if a.conv.kernel_shape.is_empty() {
        &w[2..]
    } else {
        &a.conv.kernel_shape[..]
    };
    if kernel != &w[2..] || a.conv.group == 0 || c % a.conv.group != 0 {
        return Err(err(
            node,
            format!(
                "weight {w:?}, kernel {kernel:?} and group {} do not fit",
                a.conv.group
            ),
        ));
    }
    let m = w[1]
        .checked_mul(a.conv.group)
        .ok_or_else(|| err(node, "output channel count overflows"))?;
    let (_, out) = conv_transpose_geometry(node, a, spatial, kernel)?;
    Ok(join_activation(n, m, out, a.conv.layout))
}

fn pool_shape(g: &Graph, node: &Node, a: &crate::ir::PoolAttrs) -> Result<Vec<usize>> {
    let x = in_shape(g, node, 0)?;
    let (n, c, spatial) = split_activation(node, x, a.layout)?;
    let win = window(
        node,
        spatial,
        &a.kernel_shape,
        &a.strides,
        &a.dilations,
        &a.pads,
        a.auto_pad,
    )?;
    let out = window_output(node, spatial, &win, a.ceil_mode)?;
    Ok(join_activation(n, c, out, a.layout))
}

fn matmul_shape(node: &Node, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    if a.is_empty() || b.is_empty() {
        return Err(err(node, "MatMul inputs must have rank >= 1"));
    }
    let a2: Vec<usize> = if a.len() == 1 {
        vec![1, a[0]]
    } else {
        a.to_vec()
    };
    let b2: Vec<usize> = if b.len() == 1 {
        vec![b[0], 1]
    } else {
        b.to_vec()
    };
    let (ar, br) = (a2.len(), b2.len());
    if a2[ar - 1] != b2[br - 2] {
        return Err(err(
            node,
            format!("inner dimensions of {a:?} and {b:?} differ"),
        ));
    }
    let mut out = broadcast(node, &[&a2[..ar - 2], &b2[..br - 2]])?;
    if a.len() > 1 {
        out.push(a2[ar - 2]);
    }
    if b.len() > 1 {
        out.push(b2[br - 1]);
    }
    Ok(out)
}

fn slice_shape(g: &Graph, node: &Node) -> Result<Vec<usize>> {
    let x = in_shape(g, node, 0)?;
    let starts =
        const_i64(g, node, 1, "Slice starts")?.ok_or_else(|| err(node, "starts missing"))?;
    let ends = const_i64(g, node, 2, "Slice ends")?.ok_or_else(|| err(node, "ends missing"))?;
    let axes = match const_i64(g, node, 3, "Slice axes")? {
        Some(a) => norm_axes(node, &a, x.len())?,
        None => (0..starts.len()).collect(),
    };
    let steps = const_i64(g, node, 4, "Slice steps")?.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(err(node, "starts, ends, axes and steps differ in length"));
    }
    if axes.iter().any(|&a| a >= x.len()) {
        return Err(err(node, "more slice axes than input dims"));
    }
    let mut out = x.to_vec();
    for (k, &ax) in axes.iter().enumerate() {
        let d = x[ax] as i128;
        let step = steps[k] as i128;
        if step == 0 {
            return Err(err(node, "slice step 0"));
        }
        let (mut s, mut e) = (starts[k] as i128, ends[k] as i128);
        if s < 0 {
            s += d;
        }
        if e < 0 {
            e += d;
        }
        if step > 0 {
            s = s.clamp(0, d);
            e = e.clamp(0, d);
        } else {
            s = s.clamp(0, (d - 1).max(0));
            e = e.clamp(-1, d - 1);
        }
        let len = if d == 0 {
            0
        } else if step > 0 {
            (e - s + step - 1) / step
        } else {
            (s - e + (-step) - 1) / (-step)
        };
        out[ax] = dim(node, len.max(0), "slice length")?;
    }
    Ok(out)
}

fn reshape_shape(g: &Graph, node: &Node, allowzero: bool) -> Result<Vec<usize>> {
    let x = in_shape(g, node, 0)?;
    let spec = const_i64(g, node, 1, "Reshape shape")?.ok_or_else(|| err(node, "shape missing"))?;
    let total = numel(node, x)?;
    let mut out = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &s) in spec.iter().enumerate() {
        match s {
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(
                *x.get(i)
                    .ok_or_else(|| err(node, format!("shape {spec:?} copies dim {i} of {x:?}")))?,
            ),
            s if s >= 0 => out.push(dim(node, s as i128, "reshape dim")?),
            _ => return Err(err(node, format!("invalid reshape target {spec:?}"))),
        }
    }
    let known = numel(node, &out)?;
    if let Some(i) = infer_at {
        if known == 0 || total % known != 0 {
            return Err(err(node, format!("cannot reshape {x:?} into {spec:?}")));
        }
        out[i] = total / known;
    } else if known != total {
        return Err(err(
            node,
            format!("cannot reshape {x:?} ({total} elements) into {out:?}"),
        ));
    }
    Ok(out)
}

fn split_sizes(
    g: &Graph,
    node: &Node,
    axis: i64,
    split: &Option<Vec<usize>>,
) -> Result<(usize, Vec<usize>)> {
    let x = in_shape(g, node, 0)?;
    let ax = norm_axis(node, axis, x.len())?;
    let d = x[ax];
    let n = node.outputs.len();
    let sizes = match split {
        Some(s) => s.clone(),
        None => match const_i64(g, node, 1, "Split sizes")? {
            Some(v) => v
                .iter()
                .map(|&s| dim(node, s as i128, "split size"))
                .collect::<Result<_>>()?,
            None => {
                if n == 0 {
                    return Err(err(node, "no outputs"));
                }
                if d % n == 0 {
                    vec![d / n; n]
                } else if g.opset >= 18 {
                    let chunk = d.div_ceil(n);
                    let last = d as i128 - (chunk * (n - 1)) as i128;
                    let last = dim(node, last, "last split size")?;
                    let mut v = vec![chunk; n - 1];
                    v.push(last);
                    v
                } else {
                    return Err(err(
                        node,
                        format!("dim {d} does not split evenly into {n} outputs"),
                    ));
                }
            }
        },
    };
    if sizes.len() != n || sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b)) != Some(d) {
        return Err(err(
            node,
            format!("split {sizes:?} does not cover dim {d} with {n} outputs"),
        ));
    }
    Ok((ax, sizes))
}

fn pad_shape(g: &Graph, node: &Node) -> Result<Vec<usize>> {
    let x = in_shape(g, node, 0)?;
    let pads = const_i64(g, node, 1, "Pad pads")?.ok_or_else(|| err(node, "pads missing"))?;
    let axes = match const_i64(g, node, 3, "Pad axes")? {
        Some(a) => norm_axes(node, &a, x.len())?,
        None => (0..x.len()).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(err(
            node,
            format!("pads {pads:?} do not fit {} axes", axes.len()),
        ));
    }
    let mut out = x.to_vec();
    let r = axes.len();
    for (k, &ax) in axes.iter().enumerate() {
        let v = x[ax] as i128 + pads[k] as i128 + pads[k + r] as i128;
        out[ax] = dim(node, v, "padded size")?;
    }
    Ok(out)
}

/// A Resize scales/sizes input, treating an empty constant as omitted.
fn resize_param<'a>(g: &'a Graph, node: &Node, i: usize, what: &str) -> Result<Option<&'a Tensor>> {
    Ok(const_in(g, node, i, what)?.filter(|t| !t.is_empty()))
}

fn resize_shape(g: &Graph, node: &Node) -> Result<Vec<usize>> {
    let x = in_shape(g, node, 0)?;
    if let Some(sizes) = resize_param(g, node, 3, "Resize sizes")? {
        let s = sizes.to_i64_vec()?;
        if s.len() != x.len() {
            return Err(err(
                node,
                format!("sizes {s:?} do not match rank {}", x.len()),
            ));
        }
        return s
            .iter()
            .map(|&v| dim(node, v as i128, "resize size"))
            .collect();
    }
    let scales = resize_param(g, node, 2, "Resize scales")?
        .ok_or_else(|| err(node, "neither scales nor sizes is given"))?
        .to_f32_vec();
    if scales.len() != x.len() {
        return Err(err(
            node,
            format!("scales {scales:?} do not match rank {}", x.len()),
        ));
    }
    x.iter()
        .zip(&scales)
        .map(|(&d, &s)| {
            if !(s.is_finite() && s > 0.0) {
                return Err(err(node, format!("invalid scale {s}")));
            }
            let v = (d as f32 * s).floor();
            if !(0.0..=MAX_ELEMENTS as f32).contains(&v) {
                return Err(err(node, format!("resized dim would be {v}")));
            }
            Ok(v as usize)
        })
        .collect()
}

fn scalar_f64(t: &Tensor) -> Option<f64> {
    if t.len() != 1 {
        return None;
    }
    Some(match t.dtype() {
        DataType::F32 => t.to_f32_vec()[0] as f64,
        _ => *t.to_i64_vec().ok()?.first()? as f64,
    })
}

fn range_len(g: &Graph, node: &Node) -> Result<usize> {
    let get = |i: usize, what: &str| -> Result<&Tensor> {
        const_in(g, node, i, what)?.ok_or_else(|| err(node, format!("{what} missing")))
    };
    let (s, l, d) = (
        get(0, "Range start")?,
        get(1, "Range limit")?,
        get(2, "Range delta")?,
    );
    if s.dtype() == DataType::F32 {
        let (s, l, d) = match (scalar_f64(s), scalar_f64(l), scalar_f64(d)) {
            (Some(s), Some(l), Some(d)) => (s, l, d),
            _ => return Err(err(node, "start, limit and delta must be scalars")),
        };
        if d == 0.0 || !(s.is_finite() && l.is_finite() && d.is_finite()) {
            return Err(err(node, "invalid Range bounds"));
        }
        let n = ((l - s) / d).ceil().max(0.0);
        if n > MAX_ELEMENTS as f64 {
            return Err(err(node, format!("Range would have {n} elements")));
        }
        Ok(n as usize)
    } else {
        let one = |t: &Tensor| -> Result<i128> {
            match t.to_i64_vec()?.as_slice() {
                [v] => Ok(*v as i128),
                _ => Err(err(node, "start, limit and delta must be scalars")),
            }
        };
        let (s, l, d) = (one(s)?, one(l)?, one(d)?);
        if d == 0 {
            return Err(err(node, "Range delta is 0"));
        }
        let span = l - s;
        // ceil(span / delta) for either sign.
        let (q, r) = (span / d, span % d);
        let n = if r != 0 && ((r > 0) == (d > 0)) {
            q + 1
        } else {
            q
        };
        dim(node, n.max(0), "Range length")
    }
}

fn same(g: &Graph, node: &Node) -> Result<Vec<(DataType, Vec<usize>)>> {
    Ok(vec![(
        in_dtype(g, node, 0)?,
        in_shape(g, node, 0)?.to_vec(),
    )])
}

fn is_bool_op(b: BinaryOp) -> bool {
    matches!(
        b,
        BinaryOp::Equal | BinaryOp::Less | BinaryOp::Greater | BinaryOp::And | BinaryOp::Or
    )
}

/// Output element types and shapes of `node`, from its inputs' shapes and constant inputs.
pub fn infer_node(graph: &Graph, node: &Node) -> Result<Vec<(DataType, Vec<usize>)>> {
    let g = graph;
    let one = |dt: DataType, shape: Vec<usize>| -> Result<Vec<(DataType, Vec<usize>)>> {
        numel(node, &shape)?;
        Ok(vec![(dt, shape)])
    };
    let dt0 = || in_dtype(g, node, 0);
    match &node.op {
        Op::Conv(a) => one(dt0()?, conv_shape(g, node, a)?),
        Op::ConvTranspose(a) => one(dt0()?, conv_transpose_shape(g, node, a)?),
        Op::Gemm {
            trans_a, trans_b, ..
        } => {
            let (a, b) = (in_shape(g, node, 0)?, in_shape(g, node, 1)?);
            if a.len() != 2 || b.len() != 2 {
                return Err(err(
                    node,
                    format!("Gemm needs 2-D inputs, got {a:?} and {b:?}"),
                ));
            }
            let (m, k) = if *trans_a { (a[1], a[0]) } else { (a[0], a[1]) };
            let (k2, n) = if *trans_b { (b[1], b[0]) } else { (b[0], b[1]) };
            if k != k2 {
                return Err(err(
                    node,
                    format!("inner dimensions of {a:?} and {b:?} differ"),
                ));
            }
            if node.input(2).is_some() {
                let c = in_shape(g, node, 2)?;
                if broadcast_shapes(&[c, &[m, n]]).as_deref() != Some(&[m, n][..]) {
                    return Err(err(
                        node,
                        format!("C {c:?} does not broadcast to [{m}, {n}]"),
                    ));
                }
            }
            one(dt0()?, vec![m, n])
        }
        Op::MatMul => one(
            dt0()?,
            matmul_shape(node, in_shape(g, node, 0)?, in_shape(g, node, 1)?)?,
        ),
        Op::BatchNormalization { .. } => {
            let x = in_shape(g, node, 0)?;
            if x.len() < 2 {
                return Err(err(node, format!("input {x:?} has no channel dim")));
            }
            for i in 1..5 {
                if numel(node, in_shape(g, node, i)?)? != x[1] {
                    return Err(err(
                        node,
                        format!("parameter {i} does not have {} elements", x[1]),
                    ));
                }
            }
            same(g, node)
        }
        Op::Unary(UnaryOp::Not) => one(DataType::Bool, in_shape(g, node, 0)?.to_vec()),
        Op::Unary(_) | Op::Clip | Op::Identity => same(g, node),
        Op::QuantizeLinear { axis, dtype } => {
            let x = in_shape(g, node, 0)?.to_vec();
            quant_params_fit(g, node, &x, *axis)?;
            let dt = match node.input(2) {
                Some(_) => in_dtype(g, node, 2)?,
                None => dtype.unwrap_or(DataType::U8),
            };
            if !matches!(dt, DataType::U8 | DataType::I8) {
                return Err(err(node, format!("quantizing to {dt:?} is not supported")));
            }
            one(dt, x)
        }
        Op::DequantizeLinear { axis } => {
            let x = in_shape(g, node, 0)?.to_vec();
            quant_params_fit(g, node, &x, *axis)?;
            one(DataType::F32, x)
        }
        Op::QConv(q) => one(q.y.dtype, conv_shape(g, node, &q.conv)?),
        Op::QGemm(q) => {
            let (a, b) = (in_shape(g, node, 0)?, in_shape(g, node, 1)?);
            if a.len() != 2 || b.len() != 2 {
                return Err(err(node, format!("needs 2-D inputs, got {a:?} and {b:?}")));
            }
            let (k2, n) = if q.trans_b {
                (b[1], b[0])
            } else {
                (b[0], b[1])
            };
            if a[1] != k2 || q.w_scales.len() != n {
                return Err(err(node, format!("shapes {a:?} and {b:?} do not fit")));
            }
            one(q.y.dtype, vec![a[0], n])
        }
        Op::QAdd(q) => {
            let (a, b) = (in_shape(g, node, 0)?, in_shape(g, node, 1)?);
            if a != b {
                return Err(err(node, format!("input shapes {a:?} and {b:?} differ")));
            }
            one(q.y.dtype, a.to_vec())
        }
        Op::QLut { table, dtype } => {
            if table.len() != 256 {
                return Err(err(node, "lookup table must have 256 entries"));
            }
            one(*dtype, in_shape(g, node, 0)?.to_vec())
        }
        Op::Binary(b) => {
            let (a, c) = (in_shape(g, node, 0)?, in_shape(g, node, 1)?);
            let (ta, tc) = (dt0()?, in_dtype(g, node, 1)?);
            if *b != BinaryOp::Pow && ta != tc {
                return Err(Error::Type(format!(
                    "node '{}' ({}): input types {ta:?} and {tc:?} differ",
                    node.name,
                    node.op.name()
                )));
            }
            one(
                if is_bool_op(*b) { DataType::Bool } else { ta },
                broadcast(node, &[a, c])?,
            )
        }
        Op::Elementwise(steps) => {
            let shapes = (0..node.inputs.len())
                .map(|i| in_shape(g, node, i))
                .collect::<Result<Vec<_>>>()?;
            let mut dt = dt0()?;
            for s in steps {
                match s {
                    ChainStep::Unary(UnaryOp::Not) => dt = DataType::Bool,
                    ChainStep::Binary { op, operand, .. } => {
                        if *operand >= node.inputs.len() {
                            return Err(err(node, format!("chain operand {operand} out of range")));
                        }
                        if is_bool_op(*op) {
                            dt = DataType::Bool;
                        }
                    }
                    ChainStep::Unary(_) => {}
                }
            }
            one(dt, broadcast(node, &shapes)?)
        }
        Op::MaxPool(a) | Op::AveragePool(a) => one(dt0()?, pool_shape(g, node, a)?),
        Op::GlobalAveragePool { layout } | Op::GlobalMaxPool { layout } => {
            let x = in_shape(g, node, 0)?;
            let (n, c, sp) = split_activation(node, x, *layout)?;
            one(dt0()?, join_activation(n, c, vec![1; sp.len()], *layout))
        }
        Op::Concat { axis } => {
            let first = in_shape(g, node, 0)?;
            let ax = norm_axis(node, *axis, first.len())?;
            let mut out = first.to_vec();
            for i in 1..node.inputs.len() {
                let s = in_shape(g, node, i)?;
                if s.len() != first.len() || (0..s.len()).any(|d| d != ax && s[d] != first[d]) {
                    return Err(err(
                        node,
                        format!("cannot concatenate {first:?} and {s:?} on axis {ax}"),
                    ));
                }
                out[ax] = out[ax]
                    .checked_add(s[ax])
                    .ok_or_else(|| err(node, "concat size overflows"))?;
            }
            one(dt0()?, out)
        }
        Op::Split { axis, split } => {
            let (ax, sizes) = split_sizes(g, node, *axis, split)?;
            let x = in_shape(g, node, 0)?;
            let dt = dt0()?;
            Ok(sizes
                .into_iter()
                .map(|s| {
                    let mut o = x.to_vec();
                    o[ax] = s;
                    (dt, o)
                })
                .collect())
        }
        Op::Slice => one(dt0()?, slice_shape(g, node)?),
        Op::Reshape { allowzero } => one(dt0()?, reshape_shape(g, node, *allowzero)?),
        Op::Transpose { perm } => {
            let x = in_shape(g, node, 0)?;
            let perm: Vec<usize> = if perm.is_empty() {
                (0..x.len()).rev().collect()
            } else {
                perm.clone()
            };
            let mut seen = vec![false; x.len()];
            if perm.len() != x.len()
                || perm
                    .iter()
                    .any(|&p| p >= x.len() || std::mem::replace(&mut seen[p], true))
            {
                return Err(err(
                    node,
                    format!("perm {perm:?} is not a permutation of rank {}", x.len()),
                ));
            }
            one(dt0()?, perm.iter().map(|&p| x[p]).collect())
        }
        Op::Flatten { axis } => {
            let x = in_shape(g, node, 0)?;
            let r = x.len() as i64;
            if *axis < -r || *axis > r {
                return Err(err(node, format!("axis {axis} out of range for rank {r}")));
            }
            let ax = if *axis < 0 { axis + r } else { *axis } as usize;
            one(dt0()?, vec![numel(node, &x[..ax])?, numel(node, &x[ax..])?])
        }
        Op::Squeeze { axes } => {
            let x = in_shape(g, node, 0)?;
            let axes = match axes {
                Some(a) => Some(a.clone()),
                None => const_i64(g, node, 1, "Squeeze axes")?,
            };
            let out = match axes {
                Some(a) => {
                    let a = norm_axes(node, &a, x.len())?;
                    if let Some(&bad) = a.iter().find(|&&i| x[i] != 1) {
                        return Err(err(node, format!("cannot squeeze axis {bad} of {x:?}")));
                    }
                    (0..x.len())
                        .filter(|i| !a.contains(i))
                        .map(|i| x[i])
                        .collect()
                }
                None => x.iter().copied().filter(|&d| d != 1).collect(),
            };
            one(dt0()?, out)
        }
        Op::Unsqueeze { axes } => {
            let x = in_shape(g, node, 0)?;
            let axes = match axes {
                Some(a) => a.clone(),
                None => const_i64(g, node, 1, "Unsqueeze axes")?
                    .ok_or_else(|| err(node, "axes missing"))?,
            };
            let r = x.len() + axes.len();
            let a = norm_axes(node, &axes, r)?;
            let mut it = x.iter();
            let out = (0..r)
                .map(|i| {
                    if a.contains(&i) {
                        1
                    } else {
                        it.next().copied().unwrap_or(1)
                    }
                })
                .collect();
            one(dt0()?, out)
        }
        Op::Gather { axis } => {
            let x = in_shape(g, node, 0)?;
            let idx = in_shape(g, node, 1)?;
            let ax = norm_axis(node, *axis, x.len())?;
            let it = in_dtype(g, node, 1)?;
            if !matches!(it, DataType::I64 | DataType::I32) {
                return Err(Error::Type(format!(
                    "node '{}' (Gather): indices are {it:?}",
                    node.name
                )));
            }
            if let Some(t) = node.input(1).and_then(|v| g.constant(v)) {
                let d = x[ax] as i64;
                if let Some(bad) = t.to_i64_vec()?.into_iter().find(|&i| i < -d || i >= d) {
                    return Err(err(node, format!("index {bad} out of range for dim {d}")));
                }
            }
            let mut out = x[..ax].to_vec();
            out.extend_from_slice(idx);
            out.extend_from_slice(&x[ax + 1..]);
            one(dt0()?, out)
        }
        Op::Expand => {
            let x = in_shape(g, node, 0)?;
            let s =
                const_i64(g, node, 1, "Expand shape")?.ok_or_else(|| err(node, "shape missing"))?;
            let s: Vec<usize> = s
                .iter()
                .map(|&v| dim(node, v as i128, "expand dim"))
                .collect::<Result<_>>()?;
            one(dt0()?, broadcast(node, &[x, &s])?)
        }
        Op::ScatterND => {
            let (x, idx, upd) = (
                in_shape(g, node, 0)?,
                in_shape(g, node, 1)?,
                in_shape(g, node, 2)?,
            );
            let q = *idx
                .last()
                .ok_or_else(|| err(node, "indices must have rank >= 1"))?;
            if q > x.len() {
                return Err(err(
                    node,
                    format!("index depth {q} exceeds data rank {}", x.len()),
                ));
            }
            let mut want = idx[..idx.len() - 1].to_vec();
            want.extend_from_slice(&x[q..]);
            if upd != want.as_slice() {
                return Err(err(
                    node,
                    format!("updates shape {upd:?}, expected {want:?}"),
                ));
            }
            same(g, node)
        }
        Op::Pad { .. } => one(dt0()?, pad_shape(g, node)?),
        Op::Cast { to } => one(*to, in_shape(g, node, 0)?.to_vec()),
        Op::Resize(_) => one(dt0()?, resize_shape(g, node)?),
        Op::Softmax { axis } => {
            let x = in_shape(g, node, 0)?;
            let ax = norm_axis(node, *axis, x.len())?;
            // Before opset 13, Softmax flattens to 2-D at `axis`; that equals a per-axis softmax
            // only when every dim after `axis` is 1.
            if g.opset < 13 && x[ax + 1..].iter().any(|&d| d != 1) {
                return Err(Error::Unsupported(format!(
                    "Softmax (node '{}') over axis {axis} of {x:?} with opset {} semantics (coerced to 2-D)",
                    node.name, g.opset
                )));
            }
            same(g, node)
        }
        Op::Shape { start, end } => {
            let r = in_shape(g, node, 0)?.len() as i64;
            let clampi = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) };
            let (s, e) = (clampi(*start), clampi(end.unwrap_or(r)));
            one(DataType::I64, vec![(e - s).max(0) as usize])
        }
        Op::ConstantOfShape { value } => {
            let s = const_i64(g, node, 0, "ConstantOfShape shape")?
                .ok_or_else(|| err(node, "shape missing"))?;
            let s: Vec<usize> = s
                .iter()
                .map(|&v| dim(node, v as i128, "dim"))
                .collect::<Result<_>>()?;
            one(value.dtype(), s)
        }
        Op::Where => {
            let (c, a, b) = (
                in_shape(g, node, 0)?,
                in_shape(g, node, 1)?,
                in_shape(g, node, 2)?,
            );
            if dt0()? != DataType::Bool {
                return Err(Error::Type(format!(
                    "node '{}' (Where): condition is not Bool",
                    node.name
                )));
            }
            one(in_dtype(g, node, 1)?, broadcast(node, &[c, a, b])?)
        }
        Op::Range => one(dt0()?, vec![range_len(g, node)?]),
        Op::ReduceMean { axes, keepdims } => {
            let x = in_shape(g, node, 0)?;
            let a = match axes {
                Some(a) => norm_axes(node, a, x.len())?,
                None => (0..x.len()).collect(),
            };
            let out = (0..x.len())
                .filter_map(|i| match (a.contains(&i), keepdims) {
                    (true, true) => Some(1),
                    (true, false) => None,
                    (false, _) => Some(x[i]),
                })
                .collect();
            one(dt0()?, out)
        }
    }
}

/// Sets each runtime input's `shape` from its declaration, pinning the batch dimension:
/// a symbolic leading dim, or a fixed leading 1, becomes `batch`.
pub fn pin_inputs(graph: &mut Graph, batch: usize) -> Result<()> {
    if batch == 0 {
        return Err(Error::BadInput("batch size must be at least 1".into()));
    }
    for &id in &graph.inputs {
        let v = graph
            .values
            .get_mut(id)
            .ok_or_else(|| Error::InvalidModel("graph input id out of range".into()))?;
        let Some(decl) = &v.declared else {
            if v.shape.is_none() {
                return Err(Error::Shape(format!(
                    "input '{}' has no declared shape",
                    v.name
                )));
            }
            continue;
        };
        let mut shape = Vec::with_capacity(decl.len());
        for (i, d) in decl.iter().enumerate() {
            shape.push(match (i, d) {
                (0, None) | (0, Some(1)) => batch,
                (_, Some(d)) => *d,
                (_, None) => {
                    return Err(Error::Shape(format!(
                        "input '{}' has symbolic dimension {i} in {decl:?}; only the leading (batch) dimension may be symbolic",
                        v.name
                    )))
                }
            });
        }
        if shape
            .iter()
            .try_fold(1usize, |n, &d| {
                n.checked_mul(d).filter(|&n| n <= MAX_ELEMENTS)
            })
            .is_none()
        {
            return Err(Error::Shape(format!(
                "input '{}' shape {shape:?} is too large",
                v.name
            )));
        }
        v.shape = Some(shape);
    }
    Ok(())
}

/// Fills rank-dependent defaults of node `i` and resolves its `auto_pad` into explicit pads.
/// Returns Ok without change when the needed input shapes are not known yet and nothing
/// requires them; errors when `auto_pad` must be resolved but the input shape is unknown.
fn resolve_node(graph: &mut Graph, i: usize) -> Result<()> {
    let node = &graph.nodes[i];
    let shape_of = |k: usize| {
        node.input(k)
            .and_then(|v| graph.values.get(v))
            .and_then(|v| v.shape.clone())
    };
    let x = shape_of(0);
    let w = shape_of(1);
    let needs = match &node.op {
        Op::Conv(a) | Op::QConv(crate::ir::QConvAttrs { conv: a, .. }) => {
            a.auto_pad != AutoPad::NotSet
        }
        Op::ConvTranspose(a) => a.conv.auto_pad != AutoPad::NotSet || a.output_shape.is_some(),
        Op::MaxPool(a) | Op::AveragePool(a) => a.auto_pad != AutoPad::NotSet,
        _ => false,
    };
    if x.is_none() {
        if needs {
            return Err(err(
                node,
                "auto_pad cannot be resolved before the input shape is known",
            ));
        }
        return Ok(());
    }
    let x = x.unwrap_or_default();
    let node_c = node.clone();
    match &mut graph.nodes[i].op {
        Op::Conv(a) | Op::QConv(crate::ir::QConvAttrs { conv: a, .. }) => {
            let (_, _, sp) = split_activation(&node_c, &x, a.layout)?;
            if a.kernel_shape.is_empty() {
                match &w {
                    Some(w) if w.len() >= 2 => a.kernel_shape = w[2..].to_vec(),
                    _ => return Err(err(&node_c, "kernel shape unknown")),
                }
            }
            let win = window(
                &node_c,
                sp,
                &a.kernel_shape,
                &a.strides,
                &a.dilations,
                &a.pads,
                a.auto_pad,
            )?;
            a.strides = win.strides;
            a.dilations = win.dilations;
            a.pads = win.pads;
            a.auto_pad = AutoPad::NotSet;
        }
        Op::ConvTranspose(a) => {
            let (_, _, sp) = split_activation(&node_c, &x, a.conv.layout)?;
            if a.conv.kernel_shape.is_empty() {
                match &w {
                    Some(w) if w.len() >= 2 => a.conv.kernel_shape = w[2..].to_vec(),
                    _ => return Err(err(&node_c, "kernel shape unknown")),
                }
            }
            let r = sp.len();
            let (pads, _) = conv_transpose_geometry(&node_c, a, sp, &a.conv.kernel_shape.clone())?;
            a.conv.strides = or_default(&a.conv.strides, r, 1);
            a.conv.dilations = or_default(&a.conv.dilations, r, 1);
            a.output_padding = or_default(&a.output_padding, r, 0);
            a.conv.pads = pads;
            a.conv.auto_pad = AutoPad::NotSet;
            a.output_shape = None;
        }
        Op::MaxPool(a) | Op::AveragePool(a) => {
            let (_, _, sp) = split_activation(&node_c, &x, a.layout)?;
            let win = window(
                &node_c,
                sp,
                &a.kernel_shape,
                &a.strides,
                &a.dilations,
                &a.pads,
                a.auto_pad,
            )?;
            a.strides = win.strides;
            a.dilations = win.dilations;
            a.pads = win.pads;
            a.auto_pad = AutoPad::NotSet;
        }
        Op::Transpose { perm } if perm.is_empty() => *perm = (0..x.len()).rev().collect(),
        _ => {}
    }
    Ok(())
}

/// Turns `auto_pad` (SAME_UPPER/SAME_LOWER/VALID) and ConvTranspose `output_shape` into explicit
/// pads, and fills other rank-dependent defaults (strides, dilations, Transpose's reversed perm).
/// Needs the input shapes of the affected nodes to be known.
pub fn resolve_auto_pad(graph: &mut Graph) -> Result<()> {
    for i in 0..graph.nodes.len() {
        resolve_node(graph, i)?;
    }
    Ok(())
}

/// Whether an inferred shape agrees with a declaration (symbolic dims match anything; a declared
/// leading 1 matches any batch, as in [`pin_inputs`]).
fn agrees(declared: &[Option<usize>], shape: &[usize]) -> bool {
    declared.len() == shape.len()
        && declared
            .iter()
            .zip(shape)
            .enumerate()
            .all(|(i, (d, &s))| d.is_none_or(|d| d == s || (i == 0 && d == 1 && shape.len() >= 2)))
}

/// Infers and stores every node output's element type and shape, in node order. Inputs must
/// be pinned ([`pin_inputs`]) first. A value whose shape is already known must agree with the
/// inferred one, as must declared shapes; element types are always overwritten.
pub fn infer(graph: &mut Graph) -> Result<()> {
    for i in 0..graph.nodes.len() {
        resolve_node(graph, i)?;
        let node = &graph.nodes[i];
        let outs = infer_node(graph, node)?;
        if outs.len() != node.outputs.len() {
            return Err(err(
                node,
                format!(
                    "has {} outputs, inference gives {}",
                    node.outputs.len(),
                    outs.len()
                ),
            ));
        }
        let ids = node.outputs.clone();
        for (o, (dt, shape)) in ids.into_iter().zip(outs) {
            let v = graph
                .values
                .get_mut(o)
                .ok_or_else(|| Error::InvalidModel("node output id out of range".into()))?;
            if let Some(known) = &v.shape {
                if *known != shape {
                    return Err(Error::Shape(format!(
                        "value '{}': inferred shape {shape:?} conflicts with known shape {known:?}",
                        v.name
                    )));
                }
            }
            if let Some(decl) = &v.declared {
                if !agrees(decl, &shape) {
                    return Err(Error::Shape(format!(
                        "value '{}': inferred shape {shape:?} conflicts with declared shape {decl:?}",
                        v.name
                    )));
                }
            }
            v.dtype = dt;
            v.shape = Some(shape);
        }
    }
    Ok(())
}

/// Forgets the shapes of all node outputs and runs [`infer`] again (for passes that changed
/// shapes, e.g. a layout rewrite).
pub fn reinfer(graph: &mut Graph) -> Result<()> {
    for n in &graph.nodes {
        for &o in &n.outputs {
            if let Some(v) = graph.values.get_mut(o) {
                v.shape = None;
            }
        }
    }
    infer(graph)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{ConvAttrs, ConvTransposeAttrs, PoolAttrs, ResizeAttrs};

    struct B {
        g: Graph,
    }

    impl B {
        fn new() -> Self {
            B {
                g: Graph {
                    opset: 17,
                    ..Graph::default()
                },
            }
        }
        fn input(&mut self, name: &str, dt: DataType, shape: &[usize]) -> ValueId {
            let id = self.g.add_value(name, dt);
            self.g.values[id].shape = Some(shape.to_vec());
            self.g.inputs.push(id);
            id
        }
        fn x(&mut self, shape: &[usize]) -> ValueId {
            let n = format!("x{}", self.g.values.len());
            self.input(&n, DataType::F32, shape)
        }
        fn ci(&mut self, v: &[i64]) -> ValueId {
            let n = format!("c{}", self.g.values.len());
            self.g
                .add_constant(n, Tensor::from_i64(vec![v.len()], v.to_vec()).unwrap())
        }
        fn cf(&mut self, shape: &[usize], v: &[f32]) -> ValueId {
            let n = format!("c{}", self.g.values.len());
            self.g
                .add_constant(n, Tensor::from_f32(shape.to_vec(), v.to_vec()).unwrap())
        }
        fn node(&mut self, op: Op, inputs: &[Option<ValueId>], n_out: usize) -> Vec<ValueId> {
            let k = self.g.nodes.len();
            let outs: Vec<ValueId> = (0..n_out)
                .map(|i| self.g.add_value(format!("n{k}_{i}"), DataType::F32))
                .collect();
            self.g.nodes.push(Node {
                name: format!("n{k}"),
                op,
                inputs: inputs.to_vec(),
                outputs: outs.clone(),
            });
            outs
        }
        /// Infers the single node and returns its outputs' types and shapes.
        fn run(mut self) -> Result<Vec<(DataType, Vec<usize>)>> {
            let outs = self
                .g
                .nodes
                .last()
                .map(|n| n.outputs.clone())
                .unwrap_or_default();
            self.g.outputs = outs.clone();
            infer(&mut self.g)?;
            Ok(outs
                .iter()
                .map(|&o| {
                    (
                        self.g.values[o].dtype,
                        self.g.values[o].shape.clone().unwrap(),
                    )
                })
                .collect())
        }
    }

    /// Infers `op` over float inputs of the given shapes plus extra (constant) inputs.
    fn shape1(op: Op, shapes: &[&[usize]]) -> Result<Vec<usize>> {
        let mut b = B::new();
        let ins: Vec<_> = shapes.iter().map(|s| Some(b.x(s))).collect();
        b.node(op, &ins, 1);
        Ok(b.run()?.remove(0).1)
    }

    fn conv(
        k: &[usize],
        s: &[usize],
        p: &[usize],
        d: &[usize],
        group: usize,
        auto_pad: AutoPad,
        layout: Layout,
    ) -> ConvAttrs {
        ConvAttrs {
            kernel_shape: k.to_vec(),
            strides: s.to_vec(),
            pads: p.to_vec(),
            dilations: d.to_vec(),
            group,
            auto_pad,
            activation: None,
            layout,
        }
    }

    fn pool(
        k: &[usize],
        s: &[usize],
        p: &[usize],
        ceil_mode: bool,
        auto_pad: AutoPad,
    ) -> PoolAttrs {
        PoolAttrs {
            kernel_shape: k.to_vec(),
            strides: s.to_vec(),
            pads: p.to_vec(),
            dilations: vec![],
            ceil_mode,
            auto_pad,
            count_include_pad: false,
            layout: Layout::Nchw,
        }
    }

    fn is_shape_err<T: std::fmt::Debug>(r: Result<T>) -> bool {
        matches!(r, Err(Error::Shape(_)))
    }

    fn is_runtime<T: std::fmt::Debug>(r: Result<T>) -> bool {
        matches!(&r, Err(Error::Unsupported(m)) if m.contains("depends on a runtime value"))
    }

    #[test]
    fn pin_inputs_sets_batch() {
        let mut g = Graph::default();
        let a = g.add_value("a", DataType::F32);
        g.values[a].declared = Some(vec![None, Some(3), Some(5)]);
        let b = g.add_value("b", DataType::F32);
        g.values[b].declared = Some(vec![Some(1), Some(2)]);
        let c = g.add_value("c", DataType::I64);
        g.values[c].declared = Some(vec![Some(7)]);
        g.inputs = vec![a, b, c];
        pin_inputs(&mut g, 4).unwrap();
        assert_eq!(g.values[a].shape, Some(vec![4, 3, 5]));
        assert_eq!(g.values[b].shape, Some(vec![4, 2]));
        assert_eq!(g.values[c].shape, Some(vec![7]));
        assert!(matches!(pin_inputs(&mut g, 0), Err(Error::BadInput(_))));
        g.values[c].declared = Some(vec![Some(2), None]);
        match pin_inputs(&mut g, 1) {
            Err(Error::Shape(m)) => assert!(m.contains("'c'"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    /// Brute-force count of sliding-window positions (independent of the closed-form formula).
    fn windows_ref(
        input: usize,
        k: usize,
        s: usize,
        d: usize,
        pb: usize,
        pe: usize,
        ceil_mode: bool,
    ) -> Option<usize> {
        let padded = input + pb + pe;
        let eff = (k - 1) * d + 1;
        if padded < eff {
            return None;
        }
        let mut n = 0;
        for o in 0..=padded {
            let start = o * s;
            let ok = if ceil_mode {
                o == 0 || ((o - 1) * s + eff < padded && start < input + pb)
            } else {
                start + eff <= padded
            };
            if ok {
                n += 1;
            }
        }
        Some(n)
    }

    #[test]
    fn window_sizes_match_brute_force() {
        let node = Node {
            name: "t".into(),
            op: Op::Identity,
            inputs: vec![],
            outputs: vec![],
        };
        for input in 1..=9 {
            for k in 1..=4 {
                for s in 1..=3 {
                    for d in 1..=2 {
                        for (pb, pe) in [(0, 0), (1, 0), (0, 2), (1, 1), (2, 1)] {
                            // Beyond a kernel's worth of end padding ORT/PyTorch drop only one
                            // window, a case real models never hit; compare the sane range.
                            if pe > (k - 1) * d + 1 {
                                continue;
                            }
                            for ceil_mode in [false, true] {
                                let w = window(
                                    &node,
                                    &[input],
                                    &[k],
                                    &[s],
                                    &[d],
                                    &[pb, pe],
                                    AutoPad::NotSet,
                                )
                                .unwrap();
                                let got = window_output(&node, &[input], &w, ceil_mode)
                                    .ok()
                                    .map(|v| v[0]);
                                let want = windows_ref(input, k, s, d, pb, pe, ceil_mode);
                                assert_eq!(
                                    got, want,
                                    "in={input} k={k} s={s} d={d} pads=({pb},{pe}) ceil={ceil_mode}"
                                );
                            }
                        }
                        // SAME: output is ceil(in / s), padding is the minimum total that achieves it.
                        for ap in [AutoPad::SameUpper, AutoPad::SameLower] {
                            let w = window(&node, &[input], &[k], &[s], &[d], &[], ap).unwrap();
                            let out = window_output(&node, &[input], &w, false).unwrap()[0];
                            assert_eq!(out, input.div_ceil(s));
                            let total = w.pads[0] + w.pads[1];
                            let eff = (k - 1) * d + 1;
                            assert_eq!(total, ((out - 1) * s + eff).saturating_sub(input));
                            let (small, big) = if ap == AutoPad::SameUpper {
                                (w.pads[0], w.pads[1])
                            } else {
                                (w.pads[1], w.pads[0])
                            };
                            assert!(big == small || big == small + 1);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn conv_shapes() {
        let c = |a: ConvAttrs, x: &[usize], w: &[usize]| shape1(Op::Conv(a), &[x, w]);
        let a = conv(
            &[3, 3],
            &[2, 2],
            &[1, 1, 1, 1],
            &[1, 1],
            1,
            AutoPad::NotSet,
            Layout::Nchw,
        );
        assert_eq!(
            c(a.clone(), &[2, 3, 224, 224], &[32, 3, 3, 3]).unwrap(),
            vec![2, 32, 112, 112]
        );
        // Defaults from the weight; 1-D conv.
        let a0 = conv(&[], &[], &[], &[], 1, AutoPad::NotSet, Layout::Nchw);
        assert_eq!(
            c(a0.clone(), &[1, 4, 10], &[6, 4, 3]).unwrap(),
            vec![1, 6, 8]
        );
        // Depthwise, dilated, asymmetric pads.
        let a = conv(
            &[3, 3],
            &[1, 1],
            &[0, 1, 2, 0],
            &[2, 1],
            8,
            AutoPad::NotSet,
            Layout::Nchw,
        );
        assert_eq!(
            c(a, &[1, 8, 10, 10], &[8, 1, 3, 3]).unwrap(),
            vec![1, 8, 8, 9]
        );
        // NHWC: spatial dims 1..3, weights stay [Cout, Cin/g, kh, kw].
        let a = conv(
            &[3, 3],
            &[2, 2],
            &[1, 1, 1, 1],
            &[1, 1],
            1,
            AutoPad::NotSet,
            Layout::Nhwc,
        );
        assert_eq!(
            c(a, &[1, 224, 200, 3], &[16, 3, 3, 3]).unwrap(),
            vec![1, 112, 100, 16]
        );
        // SAME_UPPER with stride 2 gives ceil(in / 2); VALID drops the remainder.
        let a = conv(
            &[3, 3],
            &[2, 2],
            &[],
            &[],
            1,
            AutoPad::SameUpper,
            Layout::Nchw,
        );
        assert_eq!(
            c(a, &[1, 3, 225, 224], &[8, 3, 3, 3]).unwrap(),
            vec![1, 8, 113, 112]
        );
        let a = conv(&[3, 3], &[2, 2], &[], &[], 1, AutoPad::Valid, Layout::Nchw);
        assert_eq!(
            c(a, &[1, 3, 225, 224], &[8, 3, 3, 3]).unwrap(),
            vec![1, 8, 112, 111]
        );
        // Errors: channel mismatch, group mismatch, kernel larger than input, bad bias.
        assert!(is_shape_err(c(a0.clone(), &[1, 4, 8, 8], &[6, 3, 3, 3])));
        let ag = conv(&[], &[], &[], &[], 3, AutoPad::NotSet, Layout::Nchw);
        assert!(is_shape_err(c(ag, &[1, 6, 8, 8], &[4, 2, 3, 3])));
        assert!(is_shape_err(c(a0.clone(), &[1, 4, 2, 8], &[6, 4, 3, 3])));
        assert!(is_shape_err(shape1(
            Op::Conv(a0),
            &[&[1, 4, 8, 8], &[6, 4, 3, 3], &[5]]
        )));
    }

    #[test]
    fn auto_pad_is_resolved() {
        let mut b = B::new();
        let x = b.x(&[1, 3, 7, 8]);
        let w = b.cf(&[4, 3, 3, 3], &[0.0; 108]);
        let a = conv(&[], &[2, 2], &[], &[], 1, AutoPad::SameLower, Layout::Nchw);
        b.node(Op::Conv(a), &[Some(x), Some(w)], 1);
        let p = pool(&[2, 2], &[], &[], false, AutoPad::SameUpper);
        let y = b.g.nodes[0].outputs[0];
        b.node(Op::MaxPool(p), &[Some(y)], 1);
        b.node(Op::Transpose { perm: vec![] }, &[Some(x)], 1);
        let mut g = b.g.clone();
        // Unknown input shape: cannot resolve.
        let mut g2 = g.clone();
        g2.values[x].shape = None;
        assert!(is_shape_err(resolve_auto_pad(&mut g2)));
        infer(&mut g).unwrap();
        let Op::Conv(a) = &g.nodes[0].op else {
            panic!()
        };
        // in 7, s 2 -> out 4, total pad (4-1)*2+3-7 = 2 -> (1,1); in 8 -> out 4, total 1 -> lower gets it.
        assert_eq!(
            (a.auto_pad, a.kernel_shape.clone(), a.pads.clone()),
            (AutoPad::NotSet, vec![3, 3], vec![1, 1, 1, 0])
        );
        assert_eq!(a.dilations, vec![1, 1]);
        let Op::MaxPool(p) = &g.nodes[1].op else {
            panic!()
        };
        // 4x4, k2 s1 -> total 1, upper puts it at the end.
        assert_eq!(
            (p.auto_pad, p.pads.clone(), p.strides.clone()),
            (AutoPad::NotSet, vec![0, 0, 1, 1], vec![1, 1])
        );
        assert_eq!(
            g.values[g.nodes[1].outputs[0]].shape,
            Some(vec![1, 4, 4, 4])
        );
        assert_eq!(
            g.nodes[2].op,
            Op::Transpose {
                perm: vec![3, 2, 1, 0]
            }
        );
        assert_eq!(
            g.values[g.nodes[2].outputs[0]].shape,
            Some(vec![8, 7, 3, 1])
        );
        // Re-inferring the resolved graph gives the same shapes.
        reinfer(&mut g).unwrap();
        assert_eq!(
            g.values[g.nodes[1].outputs[0]].shape,
            Some(vec![1, 4, 4, 4])
        );
    }

    #[test]
    fn conv_transpose_shapes() {
        let ct = |conv: ConvAttrs, op: &[usize], os: Option<Vec<usize>>| {
            Op::ConvTranspose(ConvTransposeAttrs {
                conv,
                output_padding: op.to_vec(),
                output_shape: os,
            })
        };
        let a = conv(
            &[3, 3],
            &[2, 2],
            &[1, 1, 1, 1],
            &[],
            1,
            AutoPad::NotSet,
            Layout::Nchw,
        );
        // 2*(5-1) + 1 + 3 - 2 = 10 ; 2*(6-1) + 0 + 3 - 2 = 11
        assert_eq!(
            shape1(
                ct(a.clone(), &[1, 0], None),
                &[&[1, 4, 5, 6], &[4, 2, 3, 3]]
            )
            .unwrap(),
            vec![1, 2, 10, 11]
        );
        // group 2: out channels = W[1] * group.
        let ag = conv(&[3, 3], &[1, 1], &[], &[], 2, AutoPad::NotSet, Layout::Nchw);
        assert_eq!(
            shape1(ct(ag, &[], None), &[&[1, 4, 5, 5], &[4, 3, 3, 3]]).unwrap(),
            vec![1, 6, 7, 7]
        );
        // output_shape and SAME_UPPER fix the output; pads are derived.
        let mut b = B::new();
        let x = b.x(&[1, 4, 5, 6]);
        let w = b.cf(&[4, 2, 3, 3], &[0.0; 72]);
        let a0 = conv(&[3, 3], &[2, 2], &[], &[], 1, AutoPad::NotSet, Layout::Nchw);
        b.node(ct(a0, &[], Some(vec![10, 12])), &[Some(x), Some(w)], 1);
        let mut g = b.g.clone();
        infer(&mut g).unwrap();
        assert_eq!(
            g.values[g.nodes[0].outputs[0]].shape,
            Some(vec![1, 2, 10, 12])
        );
        let Op::ConvTranspose(r) = &g.nodes[0].op else {
            panic!()
        };
        // full sizes 11 and 13 -> total padding 1 each, begin gets the odd one (not SAME_UPPER).
        assert_eq!(
            (r.conv.pads.clone(), r.output_shape.clone()),
            (vec![1, 1, 0, 0], None)
        );
        reinfer(&mut g).unwrap();
        assert_eq!(
            g.values[g.nodes[0].outputs[0]].shape,
            Some(vec![1, 2, 10, 12])
        );
        let su = conv(
            &[3, 3],
            &[2, 2],
            &[],
            &[],
            1,
            AutoPad::SameUpper,
            Layout::Nchw,
        );
        assert_eq!(
            shape1(ct(su, &[], None), &[&[1, 4, 5, 6], &[4, 2, 3, 3]]).unwrap(),
            vec![1, 2, 10, 12]
        );
        // An output_shape larger than reachable is an error.
        let a1 = conv(&[3, 3], &[1, 1], &[], &[], 1, AutoPad::NotSet, Layout::Nchw);
        assert!(is_shape_err(shape1(
            ct(a1, &[], Some(vec![20, 20])),
            &[&[1, 4, 5, 6], &[4, 2, 3, 3]]
        )));
    }

    #[test]
    fn pool_shapes() {
        let p = pool(&[3, 3], &[2, 2], &[0, 0, 0, 0], false, AutoPad::NotSet);
        assert_eq!(
            shape1(Op::MaxPool(p), &[&[1, 8, 8, 9]]).unwrap(),
            vec![1, 8, 3, 4]
        );
        let p = pool(&[3, 3], &[2, 2], &[0, 0, 0, 0], true, AutoPad::NotSet);
        assert_eq!(
            shape1(Op::AveragePool(p), &[&[1, 8, 8, 9]]).unwrap(),
            vec![1, 8, 4, 4]
        );
        let mut p = pool(&[2, 2], &[2, 2], &[], false, AutoPad::NotSet);
        p.layout = Layout::Nhwc;
        assert_eq!(
            shape1(Op::MaxPool(p), &[&[2, 8, 6, 5]]).unwrap(),
            vec![2, 4, 3, 5]
        );
        assert_eq!(
            shape1(
                Op::GlobalAveragePool {
                    layout: Layout::Nchw
                },
                &[&[2, 7, 5, 5]]
            )
            .unwrap(),
            vec![2, 7, 1, 1]
        );
        assert_eq!(
            shape1(
                Op::GlobalAveragePool {
                    layout: Layout::Nhwc
                },
                &[&[2, 5, 5, 7]]
            )
            .unwrap(),
            vec![2, 1, 1, 7]
        );
        assert_eq!(
            shape1(
                Op::GlobalMaxPool {
                    layout: Layout::Nchw
                },
                &[&[2, 7, 9]]
            )
            .unwrap(),
            vec![2, 7, 1]
        );
        let p = pool(&[3, 3], &[1, 1], &[], false, AutoPad::NotSet);
        assert!(is_shape_err(shape1(
            Op::MaxPool(p.clone()),
            &[&[1, 1, 2, 5]]
        )));
        assert!(is_shape_err(shape1(Op::MaxPool(p), &[&[1, 1, 5, 5, 5]])));
    }

    #[test]
    fn gemm_and_matmul() {
        let gemm = |ta: bool, tb: bool| Op::Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: ta,
            trans_b: tb,
            activation: None,
        };
        assert_eq!(
            shape1(gemm(false, true), &[&[2, 5], &[7, 5], &[7]]).unwrap(),
            vec![2, 7]
        );
        assert_eq!(
            shape1(gemm(true, false), &[&[5, 2], &[5, 7], &[2, 1]]).unwrap(),
            vec![2, 7]
        );
        assert!(is_shape_err(shape1(
            gemm(false, false),
            &[&[2, 5], &[7, 5]]
        )));
        assert!(is_shape_err(shape1(
            gemm(false, true),
            &[&[2, 5], &[7, 5], &[3]]
        )));
        assert_eq!(shape1(Op::MatMul, &[&[3, 4], &[4, 5]]).unwrap(), vec![3, 5]);
        assert_eq!(shape1(Op::MatMul, &[&[4], &[2, 4, 5]]).unwrap(), vec![2, 5]);
        assert_eq!(
            shape1(Op::MatMul, &[&[2, 1, 3, 4], &[4]]).unwrap(),
            vec![2, 1, 3]
        );
        assert_eq!(
            shape1(Op::MatMul, &[&[2, 1, 3, 4], &[5, 4, 6]]).unwrap(),
            vec![2, 5, 3, 6]
        );
        assert_eq!(
            shape1(Op::MatMul, &[&[4], &[4]]).unwrap(),
            Vec::<usize>::new()
        );
        assert!(is_shape_err(shape1(Op::MatMul, &[&[3, 4], &[5, 6]])));
        assert!(is_shape_err(shape1(Op::MatMul, &[&[2, 3, 4], &[3, 4, 6]])));
    }

    #[test]
    fn elementwise_types_and_broadcast() {
        let mut b = B::new();
        let x = b.x(&[2, 1, 4]);
        let y = b.x(&[3, 1]);
        b.node(Op::Binary(BinaryOp::Add), &[Some(x), Some(y)], 1);
        assert_eq!(b.run().unwrap(), vec![(DataType::F32, vec![2, 3, 4])]);
        let mut b = B::new();
        let x = b.x(&[2, 4]);
        let y = b.x(&[4]);
        b.node(Op::Binary(BinaryOp::Less), &[Some(x), Some(y)], 1);
        assert_eq!(b.run().unwrap(), vec![(DataType::Bool, vec![2, 4])]);
        let mut b = B::new();
        let x = b.input("b", DataType::Bool, &[3]);
        b.node(Op::Unary(UnaryOp::Not), &[Some(x)], 1);
        assert_eq!(b.run().unwrap(), vec![(DataType::Bool, vec![3])]);
        // Type mismatch and non-broadcastable shapes.
        let mut b = B::new();
        let x = b.x(&[2]);
        let y = b.input("i", DataType::I64, &[2]);
        b.node(Op::Binary(BinaryOp::Mul), &[Some(x), Some(y)], 1);
        assert!(matches!(b.run(), Err(Error::Type(_))));
        assert!(is_shape_err(shape1(
            Op::Binary(BinaryOp::Sub),
            &[&[2, 3], &[2]]
        )));
        // Where: three-way broadcast, value type from X.
        let mut b = B::new();
        let c = b.input("c", DataType::Bool, &[1, 4]);
        let x = b.input("xi", DataType::I64, &[3, 1]);
        let y = b.input("yi", DataType::I64, &[4]);
        b.node(Op::Where, &[Some(c), Some(x), Some(y)], 1);
        assert_eq!(b.run().unwrap(), vec![(DataType::I64, vec![3, 4])]);
        // Elementwise chain: broadcast of all inputs; a comparison makes it Bool.
        let steps = vec![
            ChainStep::Binary {
                op: BinaryOp::Add,
                operand: 1,
                acc_on_right: false,
            },
            ChainStep::Unary(UnaryOp::Act(crate::ir::Activation::Relu)),
            ChainStep::Binary {
                op: BinaryOp::Mul,
                operand: 2,
                acc_on_right: true,
            },
        ];
        assert_eq!(
            shape1(
                Op::Elementwise(steps.clone()),
                &[&[2, 1, 1], &[1, 3, 1], &[5]]
            )
            .unwrap(),
            vec![2, 3, 5]
        );
        let mut b = B::new();
        let x = b.x(&[2]);
        let y = b.x(&[1]);
        let mut s = steps.clone();
        s[2] = ChainStep::Binary {
            op: BinaryOp::Greater,
            operand: 1,
            acc_on_right: false,
        };
        b.node(Op::Elementwise(s), &[Some(x), Some(y)], 1);
        assert_eq!(b.run().unwrap(), vec![(DataType::Bool, vec![2])]);
        assert_eq!(shape1(Op::Clip, &[&[2, 3]]).unwrap(), vec![2, 3]);
        assert_eq!(
            shape1(
                Op::BatchNormalization { epsilon: 1e-5 },
                &[&[1, 3, 2, 2], &[3], &[3], &[3], &[3]]
            )
            .unwrap(),
            vec![1, 3, 2, 2]
        );
        assert!(is_shape_err(shape1(
            Op::BatchNormalization { epsilon: 1e-5 },
            &[&[1, 3, 2], &[4], &[3], &[3], &[3]]
        )));
    }

    #[test]
    fn concat_and_split() {
        assert_eq!(
            shape1(Op::Concat { axis: -1 }, &[&[2, 3], &[2, 5], &[2, 1]]).unwrap(),
            vec![2, 9]
        );
        assert!(is_shape_err(shape1(
            Op::Concat { axis: 1 },
            &[&[2, 3], &[3, 5]]
        )));
        assert!(is_shape_err(shape1(
            Op::Concat { axis: 2 },
            &[&[2, 3], &[2, 5]]
        )));
        let split = |axis: i64,
                     split: Option<Vec<usize>>,
                     input: Option<&[i64]>,
                     n: usize,
                     opset: i64,
                     x: &[usize]| {
            let mut b = B::new();
            b.g.opset = opset;
            let xi = b.x(x);
            let s = input.map(|v| b.ci(v));
            let ins = if s.is_some() {
                vec![Some(xi), s]
            } else {
                vec![Some(xi)]
            };
            b.node(Op::Split { axis, split }, &ins, n);
            b.run()
                .map(|v| v.into_iter().map(|(_, s)| s).collect::<Vec<_>>())
        };
        assert_eq!(
            split(1, Some(vec![1, 3]), None, 2, 11, &[2, 4]).unwrap(),
            vec![vec![2, 1], vec![2, 3]]
        );
        assert_eq!(
            split(0, None, Some(&[3, 1]), 2, 13, &[4]).unwrap(),
            vec![vec![3], vec![1]]
        );
        assert_eq!(
            split(-1, None, None, 3, 13, &[2, 6]).unwrap(),
            vec![vec![2, 2]; 3]
        );
        assert_eq!(
            split(0, None, None, 3, 18, &[7]).unwrap(),
            vec![vec![3], vec![3], vec![1]]
        );
        assert!(is_shape_err(split(0, None, None, 3, 13, &[7])));
        assert!(is_shape_err(split(0, Some(vec![1, 2]), None, 2, 11, &[4])));
        // A non-constant split input.
        let mut b = B::new();
        let x = b.x(&[4]);
        let s = b.input("s", DataType::I64, &[2]);
        b.node(
            Op::Split {
                axis: 0,
                split: None,
            },
            &[Some(x), Some(s)],
            2,
        );
        assert!(is_runtime(b.run()));
    }

    /// Reference Slice length on one dim by filtering indices (numpy semantics).
    fn slice_ref(d: i64, start: i64, end: i64, step: i64) -> usize {
        let s = if start < 0 {
            start as i128 + d as i128
        } else {
            start as i128
        };
        let e = if end < 0 {
            end as i128 + d as i128
        } else {
            end as i128
        };
        // The stride phase starts at the clamped start (as in numpy; for negative steps the
        // ONNX spec clamps into [0, d-1], so a start below 0 still yields index 0).
        let s = if step < 0 {
            s.clamp(0, (d as i128 - 1).max(0))
        } else {
            s.max(0)
        };
        (0..d as i128)
            .filter(|&i| {
                if step > 0 {
                    i >= s && i < e
                } else {
                    i <= s && i > e
                }
            })
            .filter(|&i| (i - s) % step as i128 == 0)
            .count()
    }

    #[test]
    fn slice_matches_reference() {
        let vals = [i64::MIN, -9, -5, -2, -1, 0, 1, 2, 4, 5, 6, 9, i64::MAX];
        for d in [0usize, 1, 5] {
            for &start in &vals {
                for &end in &vals {
                    for step in [-3i64, -1, 1, 2] {
                        let mut b = B::new();
                        let x = b.x(&[3, d]);
                        let (s, e, a, st) =
                            (b.ci(&[start]), b.ci(&[end]), b.ci(&[-1]), b.ci(&[step]));
                        b.node(
                            Op::Slice,
                            &[Some(x), Some(s), Some(e), Some(a), Some(st)],
                            1,
                        );
                        let got = b.run().unwrap().remove(0).1;
                        assert_eq!(
                            got,
                            vec![3, slice_ref(d as i64, start, end, step)],
                            "d={d} {start}:{end}:{step}"
                        );
                    }
                }
            }
        }
        // Default axes and steps; errors.
        let mut b = B::new();
        let x = b.x(&[6, 4]);
        let (s, e) = (b.ci(&[1, -3]), b.ci(&[4, 100]));
        b.node(Op::Slice, &[Some(x), Some(s), Some(e)], 1);
        assert_eq!(b.run().unwrap()[0].1, vec![3, 3]);
        let mut b = B::new();
        let x = b.x(&[6]);
        let (s, e, a, st) = (b.ci(&[0]), b.ci(&[3]), b.ci(&[0]), b.ci(&[0]));
        b.node(
            Op::Slice,
            &[Some(x), Some(s), Some(e), Some(a), Some(st)],
            1,
        );
        assert!(is_shape_err(b.run()));
        let mut b = B::new();
        let x = b.x(&[6]);
        let s = b.input("s", DataType::I64, &[1]);
        let e = b.ci(&[3]);
        b.node(Op::Slice, &[Some(x), Some(s), Some(e)], 1);
        assert!(is_runtime(b.run()));
    }

    fn with_const(op: Op, x: &[usize], c: &[&[i64]]) -> Result<Vec<usize>> {
        let mut b = B::new();
        let xi = b.x(x);
        let mut ins = vec![Some(xi)];
        ins.extend(c.iter().map(|v| Some(b.ci(v))));
        b.node(op, &ins, 1);
        Ok(b.run()?.remove(0).1)
    }

    #[test]
    fn reshape_and_friends() {
        let r =
            |az: bool, x: &[usize], s: &[i64]| with_const(Op::Reshape { allowzero: az }, x, &[s]);
        assert_eq!(r(false, &[2, 3, 4], &[0, -1]).unwrap(), vec![2, 12]);
        assert_eq!(
            r(false, &[2, 3, 4], &[-1, 0, 2, 2]).unwrap(),
            vec![2, 3, 2, 2]
        );
        assert_eq!(r(true, &[0, 3], &[3, 0]).unwrap(), vec![3, 0]);
        assert!(is_shape_err(r(false, &[2, 3, 4], &[5, -1])));
        assert!(is_shape_err(r(false, &[2, 3, 4], &[-1, -1])));
        assert!(is_shape_err(r(false, &[2, 3, 4], &[2, 3, 3])));
        assert!(is_shape_err(r(false, &[2, 3], &[0, 0, 0])));
        let mut b = B::new();
        let x = b.x(&[4]);
        let s = b.input("s", DataType::I64, &[1]);
        b.node(Op::Reshape { allowzero: false }, &[Some(x), Some(s)], 1);
        match b.run() {
            Err(Error::Unsupported(m)) => assert!(m.contains("runtime") && m.contains("n0"), "{m}"),
            other => panic!("{other:?}"),
        }

        assert_eq!(
            shape1(
                Op::Transpose {
                    perm: vec![0, 2, 3, 1]
                },
                &[&[1, 3, 5, 7]]
            )
            .unwrap(),
            vec![1, 5, 7, 3]
        );
        assert!(is_shape_err(shape1(
            Op::Transpose { perm: vec![0, 1] },
            &[&[1, 3, 5]]
        )));
        assert_eq!(
            shape1(Op::Flatten { axis: 2 }, &[&[2, 3, 4, 5]]).unwrap(),
            vec![6, 20]
        );
        assert_eq!(
            shape1(Op::Flatten { axis: 0 }, &[&[2, 3]]).unwrap(),
            vec![1, 6]
        );
        assert_eq!(
            shape1(Op::Flatten { axis: -1 }, &[&[2, 3, 4]]).unwrap(),
            vec![6, 4]
        );
        assert_eq!(
            shape1(
                Op::Squeeze {
                    axes: Some(vec![0, -1])
                },
                &[&[1, 3, 1, 1]]
            )
            .unwrap(),
            vec![3, 1]
        );
        assert_eq!(
            shape1(Op::Squeeze { axes: None }, &[&[1, 3, 1, 2]]).unwrap(),
            vec![3, 2]
        );
        assert_eq!(
            with_const(Op::Squeeze { axes: None }, &[1, 3, 1], &[&[2]]).unwrap(),
            vec![1, 3]
        );
        assert!(is_shape_err(shape1(
            Op::Squeeze {
                axes: Some(vec![1])
            },
            &[&[1, 3]]
        )));
        assert_eq!(
            shape1(
                Op::Unsqueeze {
                    axes: Some(vec![0, -1])
                },
                &[&[3, 4]]
            )
            .unwrap(),
            vec![1, 3, 4, 1]
        );
        assert_eq!(
            with_const(Op::Unsqueeze { axes: None }, &[3, 4], &[&[1, 3]]).unwrap(),
            vec![3, 1, 4, 1]
        );
        assert!(is_shape_err(shape1(
            Op::Unsqueeze {
                axes: Some(vec![0, 0])
            },
            &[&[3]]
        )));
        assert_eq!(
            with_const(Op::Expand, &[3, 1], &[&[2, 1, 4]]).unwrap(),
            vec![2, 3, 4]
        );
        assert!(is_shape_err(with_const(Op::Expand, &[3, 2], &[&[4]])));
        let pad = Op::Pad {
            mode: crate::ir::PadMode::Constant,
        };
        assert_eq!(
            with_const(pad.clone(), &[1, 3, 4, 4], &[&[0, 0, 1, 2, 0, 0, 3, -1]]).unwrap(),
            vec![1, 3, 8, 5]
        );
        assert_eq!(
            with_const(
                pad.clone(),
                &[1, 3, 4, 4],
                &[&[1, 2, 1, 1], &[0.0f32 as i64], &[2, -1]]
            )
            .unwrap(),
            vec![1, 3, 6, 7]
        );
        assert!(is_shape_err(with_const(
            pad.clone(),
            &[2, 2],
            &[&[0, -3, 0, 0]]
        )));
        assert!(is_shape_err(with_const(pad, &[2, 2], &[&[1, 1]])));
    }

    #[test]
    fn gather_scatter_cast_shape() {
        let mut b = B::new();
        let x = b.x(&[5, 6, 7]);
        let i = b.input("i", DataType::I64, &[2, 3]);
        b.node(Op::Gather { axis: 1 }, &[Some(x), Some(i)], 1);
        assert_eq!(b.run().unwrap()[0].1, vec![5, 2, 3, 7]);
        assert!(is_shape_err(with_const(
            Op::Gather { axis: 0 },
            &[5],
            &[&[5]]
        )));
        assert_eq!(
            with_const(Op::Gather { axis: 0 }, &[5, 2], &[&[-5]]).unwrap(),
            vec![1, 2]
        );
        let mut b = B::new();
        let x = b.x(&[4, 5, 6]);
        let i = b.input("i", DataType::I64, &[3, 2]);
        let u = b.x(&[3, 6]);
        b.node(Op::ScatterND, &[Some(x), Some(i), Some(u)], 1);
        assert_eq!(b.run().unwrap()[0].1, vec![4, 5, 6]);
        let mut b = B::new();
        let x = b.x(&[4, 5, 6]);
        let i = b.input("i", DataType::I64, &[3, 2]);
        let u = b.x(&[3, 5]);
        b.node(Op::ScatterND, &[Some(x), Some(i), Some(u)], 1);
        assert!(is_shape_err(b.run()));
        let mut b = B::new();
        let x = b.x(&[2, 3]);
        b.node(Op::Cast { to: DataType::I32 }, &[Some(x)], 1);
        assert_eq!(b.run().unwrap(), vec![(DataType::I32, vec![2, 3])]);
        for (start, end, want) in [
            (0, None, 4),
            (1, None, 3),
            (-1, None, 1),
            (1, Some(-1), 2),
            (-10, Some(10), 4),
            (3, Some(1), 0),
        ] {
            let mut b = B::new();
            let x = b.x(&[2, 3, 4, 5]);
            b.node(Op::Shape { start, end }, &[Some(x)], 1);
            assert_eq!(
                b.run().unwrap(),
                vec![(DataType::I64, vec![want])],
                "{start} {end:?}"
            );
        }
    }

    #[test]
    fn resize_shapes() {
        let attrs = |layout| {
            Op::Resize(ResizeAttrs {
                mode: crate::ir::ResizeMode::Nearest,
                coord: crate::ir::CoordMode::Asymmetric,
                nearest: crate::ir::NearestMode::Floor,
                layout,
            })
        };
        let run = |layout, x: &[usize], scales: &[f32], sizes: Option<&[i64]>| {
            let mut b = B::new();
            let xi = b.x(x);
            let roi = b.cf(&[0], &[]);
            let sc = b.cf(&[scales.len()], scales);
            let mut ins = vec![Some(xi), Some(roi), Some(sc)];
            if let Some(s) = sizes {
                ins.push(Some(b.ci(s)));
            }
            b.node(attrs(layout), &ins, 1);
            b.run().map(|mut v| v.remove(0).1)
        };
        assert_eq!(
            run(Layout::Nchw, &[1, 3, 13, 13], &[1.0, 1.0, 2.0, 2.0], None).unwrap(),
            vec![1, 3, 26, 26]
        );
        assert_eq!(
            run(Layout::Nchw, &[1, 3, 5, 5], &[1.0, 1.0, 0.5, 1.5], None).unwrap(),
            vec![1, 3, 2, 7]
        );
        // NHWC: scales are in the tensor's own axis order.
        assert_eq!(
            run(Layout::Nhwc, &[1, 13, 13, 3], &[1.0, 2.0, 2.0, 1.0], None).unwrap(),
            vec![1, 26, 26, 3]
        );
        assert_eq!(
            run(Layout::Nchw, &[1, 3, 5, 5], &[], Some(&[1, 3, 8, 9])).unwrap(),
            vec![1, 3, 8, 9]
        );
        assert!(is_shape_err(run(
            Layout::Nchw,
            &[1, 3, 5, 5],
            &[2.0, 2.0],
            None
        )));
        assert!(is_shape_err(run(
            Layout::Nchw,
            &[1, 3, 5, 5],
            &[1.0, 1.0, -2.0, 2.0],
            None
        )));
        assert!(is_shape_err(run(Layout::Nchw, &[1, 3, 5, 5], &[], None)));
        let mut b = B::new();
        let x = b.x(&[1, 3, 5, 5]);
        let s = b.x(&[4]);
        b.node(attrs(Layout::Nchw), &[Some(x), None, Some(s)], 1);
        assert!(is_runtime(b.run()));
    }

    #[test]
    fn generators_and_reductions() {
        let mut b = B::new();
        let s = b.ci(&[2, 0, 3]);
        let v = Tensor::from_i64(vec![1], vec![7]).unwrap();
        b.node(Op::ConstantOfShape { value: v }, &[Some(s)], 1);
        assert_eq!(b.run().unwrap(), vec![(DataType::I64, vec![2, 0, 3])]);
        let mut b = B::new();
        let s = b.input("s", DataType::I64, &[2]);
        b.node(
            Op::ConstantOfShape {
                value: Tensor::from_f32(vec![1], vec![0.0]).unwrap(),
            },
            &[Some(s)],
            1,
        );
        assert!(is_runtime(b.run()));
        // Range: count matches a naive loop.
        for (st, li, de) in [
            (0i64, 10i64, 3i64),
            (10, 0, -3),
            (9, 0, -3),
            (3, 7, -1),
            (-7, 9, 4),
            (5, 5, 1),
            (0, -4, 1),
            (-7, 8, 5),
        ] {
            let mut b = B::new();
            let (a, l, d) = (b.ci(&[st]), b.ci(&[li]), b.ci(&[de]));
            b.node(Op::Range, &[Some(a), Some(l), Some(d)], 1);
            let mut n = 0;
            let mut v = st;
            while (de > 0 && v < li) || (de < 0 && v > li) {
                n += 1;
                v += de;
            }
            assert_eq!(
                b.run().unwrap(),
                vec![(DataType::I64, vec![n])],
                "{st} {li} {de}"
            );
        }
        let mut b = B::new();
        let (a, l, d) = (b.cf(&[], &[0.5]), b.cf(&[], &[2.0]), b.cf(&[], &[0.4]));
        b.node(Op::Range, &[Some(a), Some(l), Some(d)], 1);
        assert_eq!(b.run().unwrap(), vec![(DataType::F32, vec![4])]);
        let mut b = B::new();
        let (a, l, d) = (b.ci(&[0]), b.ci(&[3]), b.ci(&[0]));
        b.node(Op::Range, &[Some(a), Some(l), Some(d)], 1);
        assert!(is_shape_err(b.run()));

        let rm = |axes: Option<Vec<i64>>, keepdims| Op::ReduceMean { axes, keepdims };
        assert_eq!(
            shape1(rm(Some(vec![2, 3]), true), &[&[2, 3, 4, 5]]).unwrap(),
            vec![2, 3, 1, 1]
        );
        assert_eq!(
            shape1(rm(Some(vec![-1]), false), &[&[2, 3, 4]]).unwrap(),
            vec![2, 3]
        );
        assert_eq!(
            shape1(rm(None, false), &[&[2, 3]]).unwrap(),
            Vec::<usize>::new()
        );
        assert!(is_shape_err(shape1(rm(Some(vec![3]), false), &[&[2, 3]])));
        assert_eq!(shape1(Op::Identity, &[&[4, 1]]).unwrap(), vec![4, 1]);
    }

    #[test]
    fn softmax_old_opset_semantics() {
        assert_eq!(
            shape1(Op::Softmax { axis: 1 }, &[&[2, 5]]).unwrap(),
            vec![2, 5]
        );
        let run = |opset: i64, axis: i64, x: &[usize]| {
            let mut b = B::new();
            b.g.opset = opset;
            let xi = b.x(x);
            b.node(Op::Softmax { axis }, &[Some(xi)], 1);
            b.run()
        };
        assert!(run(11, 1, &[2, 5]).is_ok());
        assert!(run(11, 1, &[2, 5, 1, 1]).is_ok());
        assert!(matches!(run(11, 1, &[2, 5, 3]), Err(Error::Unsupported(_))));
        assert!(run(13, 1, &[2, 5, 3]).is_ok());
    }

    #[test]
    fn declared_and_known_shapes_are_checked() {
        let mut b = B::new();
        let x = b.x(&[4, 3]);
        let y = b.node(Op::Unary(UnaryOp::Neg), &[Some(x)], 1)[0];
        b.g.outputs = vec![y];
        let mut g = b.g.clone();
        // A declared batch of 1 or a symbolic dim agrees; a wrong fixed dim does not.
        g.values[y].declared = Some(vec![Some(1), None]);
        infer(&mut g).unwrap();
        assert_eq!(g.values[y].shape, Some(vec![4, 3]));
        let mut g = b.g.clone();
        g.values[y].declared = Some(vec![None, Some(2)]);
        assert!(is_shape_err(infer(&mut g)));
        let mut g = b.g.clone();
        g.values[y].shape = Some(vec![4, 4]);
        assert!(is_shape_err(infer(&mut g)));
        // Element types are refined from placeholders.
        let mut g = b.g.clone();
        g.values[y].dtype = DataType::I64;
        infer(&mut g).unwrap();
        assert_eq!(g.values[y].dtype, DataType::F32);
        // Missing input shape.
        let mut g = b.g.clone();
        g.values[x].shape = None;
        assert!(is_shape_err(infer(&mut g)));
    }

    #[test]
    fn real_models_infer_where_static() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../models/efficientnet-lite0.onnx"
        );
        let mut g = crate::onnx::load_file(std::path::Path::new(path)).unwrap();
        pin_inputs(&mut g, 2).unwrap();
        assert_eq!(g.values[g.inputs[0]].shape, Some(vec![2, 3, 224, 224]));
        // The exporter computes Pad's pads at run time; constant folding must remove that first.
        match infer(&mut g) {
            Err(Error::Unsupported(m)) => assert!(m.contains("depends on a runtime value"), "{m}"),
            other => panic!("{other:?}"),
        }

        // nanodet: everything before the first Reshape (whose shape the exporter computes from a
        // ScatterND chain) infers; expected shapes from python onnx shape inference, batch 2.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/nanodet-m-416.onnx");
        let mut g = crate::onnx::load_file(std::path::Path::new(path)).unwrap();
        pin_inputs(&mut g, 2).unwrap();
        match infer(&mut g) {
            Err(Error::Unsupported(m)) => {
                assert!(m.contains("Reshape shape") && m.contains("runtime"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        let expect = [
            ("PartitionedCall/MaxPool2d:0", [2, 32, 104, 104]),
            (
                "PartitionedCall/onnx_tf_prefix_Concat_12:0",
                [2, 64, 104, 104],
            ),
            (
                "PartitionedCall/onnx_tf_prefix_Concat_27:0",
                [2, 128, 52, 52],
            ),
            (
                "PartitionedCall/onnx_tf_prefix_Concat_42:0",
                [2, 256, 26, 26],
            ),
            (
                "PartitionedCall/onnx_tf_prefix_Concat_62:0",
                [2, 512, 13, 13],
            ),
            ("Resize__108:0", [2, 128, 26, 26]),
            ("Resize__112:0", [2, 128, 52, 52]),
            ("Resize__128:0", [2, 128, 13, 13]),
        ];
        for (name, want) in expect {
            let v = g.value_by_name(name).unwrap();
            assert_eq!(g.values[v].shape.as_deref(), Some(&want[..]), "{name}");
        }
    }
}
