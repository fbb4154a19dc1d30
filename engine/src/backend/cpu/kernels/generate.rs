//! CPU kernels: value generators — Shape, ConstantOfShape and Range.
//!
//! Shape's result is fully known at build time (static shapes); ConstantOfShape's output shape
//! comes from inference; Range reads its scalar start and delta at run time and takes its
//! element count from the inferred output shape.

use super::elementwise::{
    in_id, input, numel, out_id, output, shape_err, shape_of, unsupported, view, view_mut, Pod,
};
use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{DataType, Graph, Node, Op};

/// Writes precomputed bytes (Shape's i64 dims, ConstantOfShape's repeated value).
struct FillKernel {
    name: String,
    /// Pattern repeated over the whole output (Shape: the full output).
    pattern: Vec<u8>,
    out_bytes: usize,
}

impl Kernel for FillKernel {
    fn run(
        &self,
        _inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let dst = &mut *output(outputs, 0, &self.name)?.bytes;
        if dst.len() != self.out_bytes {
            return Err(Error::Shape(format!(
                "node '{}': output view holds {} bytes, expected {}",
                self.name,
                dst.len(),
                self.out_bytes
            )));
        }
        if self.pattern.is_empty() {
            return Ok(());
        }
        if self.pattern.iter().all(|&b| b == 0) {
            dst.fill(0);
        } else {
            for c in dst.chunks_exact_mut(self.pattern.len()) {
                c.copy_from_slice(&self.pattern);
            }
        }
        Ok(())
    }
}

fn build_shape(
    graph: &Graph,
    node: &Node,
    start: i64,
    end: Option<i64>,
) -> Result<Box<dyn Kernel>> {
    let (x, out) = (in_id(node, 0)?, out_id(node, 0)?);
    if graph.values[out].dtype != DataType::I64 {
        return Err(Error::Type(format!(
            "Shape node '{}': output must be I64",
            node.name
        )));
    }
    let s = shape_of(graph, x)?;
    let r = s.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let (a, b) = (clamp(start), clamp(end.unwrap_or(r)));
    let dims: &[usize] = if a < b { &s[a..b] } else { &[] };
    let so = shape_of(graph, out)?;
    if so != [dims.len()] {
        return Err(shape_err(
            node,
            format_args!("output {so:?} but the shape slice has {} dims", dims.len()),
        ));
    }
    let pattern: Vec<u8> = dims
        .iter()
        .flat_map(|&d| (d as i64).to_le_bytes())
        .collect();
    Ok(Box::new(FillKernel {
        name: node.name.clone(),
        out_bytes: pattern.len(),
        pattern,
    }))
}

fn build_constant_of_shape(
    graph: &Graph,
    node: &Node,
    value: &crate::ir::Tensor,
) -> Result<Box<dyn Kernel>> {
    let out = out_id(node, 0)?;
    let dt = value.dtype();
    if graph.values[out].dtype != dt {
        return Err(Error::Type(format!(
            "ConstantOfShape node '{}': output is {:?} but value is {dt:?}",
            node.name, graph.values[out].dtype
        )));
    }
    let bytes = value.as_bytes();
    if bytes.len() < dt.size() {
        return Err(shape_err(node, "value tensor is empty"));
    }
    let so = shape_of(graph, out)?;
    Ok(Box::new(FillKernel {
        name: node.name.clone(),
        pattern: bytes[..dt.size()].to_vec(),
        out_bytes: numel(&so) * dt.size(),
    }))
}

/// Range element types.
trait RangeElem: Pod {
    /// `start + i * delta`.
    fn at(start: Self, delta: Self, i: usize) -> Self;
}

impl RangeElem for f32 {
    #[inline(always)]
    fn at(start: f32, delta: f32, i: usize) -> f32 {
        start + i as f32 * delta
    }
}
impl RangeElem for i64 {
    #[inline(always)]
    fn at(start: i64, delta: i64, i: usize) -> i64 {
        start.wrapping_add((i as i64).wrapping_mul(delta))
    }
}
impl RangeElem for i32 {
    #[inline(always)]
    fn at(start: i32, delta: i32, i: usize) -> i32 {
        start.wrapping_add((i as i32).wrapping_mul(delta))
    }
}

struct RangeKernel {
    name: String,
    dtype: DataType,
    len: usize,
}

fn range_typed<T: RangeElem>(
    k: &RangeKernel,
    inputs: &[Option<TensorRef<'_>>],
    out: &mut [u8],
) -> Result<()> {
    let scalar = |i: usize| -> Result<T> {
        let t = input(inputs, i, &k.name)?;
        view::<T>(t.bytes, 1, &k.name)?
            .first()
            .copied()
            .ok_or_else(|| {
                Error::Shape(format!(
                    "Range node '{}': input {i} is not a scalar",
                    k.name
                ))
            })
    };
    let (start, delta) = (scalar(0)?, scalar(2)?);
    let out = view_mut::<T>(out, k.len, &k.name)?;
    for (i, o) in out.iter_mut().enumerate() {
        *o = T::at(start, delta, i);
    }
    Ok(())
}

impl Kernel for RangeKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let out = &mut *output(outputs, 0, &self.name)?.bytes;
        match self.dtype {
            DataType::F32 => range_typed::<f32>(self, inputs, out),
            DataType::I64 => range_typed::<i64>(self, inputs, out),
            _ => range_typed::<i32>(self, inputs, out),
        }
    }
}

fn build_range(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    let out = out_id(node, 0)?;
    let dt = graph.values[out].dtype;
    if !matches!(dt, DataType::F32 | DataType::I64 | DataType::I32) {
        return Err(unsupported(node, format_args!("Range of {dt:?}")));
    }
    for i in 0..3 {
        let v = in_id(node, i)?;
        if graph.values[v].dtype != dt {
            return Err(Error::Type(format!(
                "Range node '{}': input {i} is not {dt:?}",
                node.name
            )));
        }
        if numel(&shape_of(graph, v)?) != 1 {
            return Err(shape_err(node, format_args!("input {i} is not a scalar")));
        }
    }
    let so = shape_of(graph, out)?;
    if so.len() != 1 {
        return Err(shape_err(node, format_args!("output {so:?} is not 1-D")));
    }
    // When the bounds are constants, check the inferred length against the ONNX formula.
    if let (Some(s), Some(l), Some(d)) = (
        graph.const_input(node, 0),
        graph.const_input(node, 1),
        graph.const_input(node, 2),
    ) {
        let n = if dt == DataType::F32 {
            let f = |t: &crate::ir::Tensor| t.to_f32_vec().first().copied().unwrap_or(0.0) as f64;
            let (s, l, d) = (f(s), f(l), f(d));
            if d == 0.0 {
                return Err(shape_err(node, "delta is zero"));
            }
            ((l - s) / d).ceil().max(0.0) as usize
        } else {
            let f = |t: &crate::ir::Tensor| -> Result<i128> {
                Ok(t.to_i64_vec()?.first().copied().unwrap_or(0) as i128)
            };
            let (s, l, d) = (f(s)?, f(l)?, f(d)?);
            if d == 0 {
                return Err(shape_err(node, "delta is zero"));
            }
            let span = l - s;
            // ceil(span / d) for any signs.
            let q = span / d;
            let q = if span % d != 0 && ((span < 0) == (d < 0)) {
                q + 1
            } else {
                q
            };
            q.max(0) as usize
        };
        if n != so[0] {
            return Err(shape_err(
                node,
                format_args!("range has {n} elements, inferred output {so:?}"),
            ));
        }
    }
    Ok(Box::new(RangeKernel {
        name: node.name.clone(),
        dtype: dt,
        len: so[0],
    }))
}

/// Compiles a generator node (Shape, ConstantOfShape, Range).
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    match &node.op {
        Op::Shape { start, end } => build_shape(graph, node, *start, *end),
        Op::ConstantOfShape { value } => build_constant_of_shape(graph, node, value),
        Op::Range => build_range(graph, node),
        _ => Err(unsupported(node, "not a generator op")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::elementwise::test_util::*;
    use crate::ir::{DataType, Op};

    #[test]
    fn shape_with_start_end() {
        let x = f32t(&[2, 3, 4, 5], vec![0.0; 120]);
        let out = run1(
            Op::Shape {
                start: 0,
                end: None,
            },
            vec![In::Rt(x.clone())],
            DataType::I64,
            &[4],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![2, 3, 4, 5]);
        let out = run1(
            Op::Shape {
                start: -3,
                end: Some(-1),
            },
            vec![In::Rt(x.clone())],
            DataType::I64,
            &[2],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![3, 4]);
        let out = run1(
            Op::Shape {
                start: 1,
                end: Some(100),
            },
            vec![In::Rt(x.clone())],
            DataType::I64,
            &[3],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![3, 4, 5]);
        let out = run1(
            Op::Shape {
                start: 3,
                end: Some(1),
            },
            vec![In::Rt(x)],
            DataType::I64,
            &[0],
        )
        .unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn constant_of_shape_fills() {
        let shape_in = In::Const(i64t(&[2], vec![2, 3]));
        let out = run1(
            Op::ConstantOfShape {
                value: i64t(&[1], vec![7]),
            },
            vec![shape_in],
            DataType::I64,
            &[2, 3],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![7; 6]);
        let shape_in = In::Const(i64t(&[1], vec![3]));
        let out = run1(
            Op::ConstantOfShape {
                value: f32t(&[1], vec![0.0]),
            },
            vec![shape_in],
            DataType::F32,
            &[3],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[0.0, 0.0, 0.0]);
        let shape_in = In::Const(i64t(&[1], vec![2]));
        let out = run1(
            Op::ConstantOfShape {
                value: f32t(&[1], vec![1.5]),
            },
            vec![shape_in],
            DataType::F32,
            &[2],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[1.5, 1.5]);
    }

    #[test]
    fn range_each_type() {
        let out = run1(
            Op::Range,
            vec![
                In::Rt(f32t(&[], vec![0.0])),
                In::Rt(f32t(&[], vec![1.0])),
                In::Rt(f32t(&[], vec![0.25])),
            ],
            DataType::F32,
            &[4],
        )
        .unwrap();
        assert_eq!(out.as_f32().unwrap(), &[0.0, 0.25, 0.5, 0.75]);
        let out = run1(
            Op::Range,
            vec![
                In::Const(i64t(&[], vec![10])),
                In::Const(i64t(&[], vec![4])),
                In::Const(i64t(&[], vec![-3])),
            ],
            DataType::I64,
            &[2],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![10, 7]);
        let out = run1(
            Op::Range,
            vec![
                In::Rt(i32t(&[], vec![-2])),
                In::Rt(i32t(&[], vec![3])),
                In::Rt(i32t(&[], vec![2])),
            ],
            DataType::I32,
            &[3],
        )
        .unwrap();
        assert_eq!(out.to_i64_vec().unwrap(), vec![-2, 0, 2]);
        // Constant bounds that disagree with the inferred length are rejected.
        assert!(run1(
            Op::Range,
            vec![
                In::Const(i64t(&[], vec![0])),
                In::Const(i64t(&[], vec![4])),
                In::Const(i64t(&[], vec![1]))
            ],
            DataType::I64,
            &[3],
        )
        .is_err());
    }
}
