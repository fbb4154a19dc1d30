//! CPU kernels: QuantizeLinear and DequantizeLinear (per-tensor and per-axis, int8/uint8, and
//! int32 dequantization for biases), and the 256-entry lookup table that a folded
//! `DQ → unary op → Q` chain becomes. These are the reference semantics of the INT8 path: the
//! fused integer kernels (qconv/qgemm) agree with running these around the f32 op.

use super::elementwise::{drive, input, norm_axis, numel, output, shape_err, unsupported, view};
use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{DataType, Graph, Node, Op};

/// Compiles a QuantizeLinear, DequantizeLinear or QLut node.
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    let x = node
        .input(0)
        .ok_or_else(|| unsupported(node, "input 0 is missing"))?;
    let shape = graph.shape(x)?.to_vec();
    let in_dtype = graph.values[x].dtype;
    let out = *node
        .outputs
        .first()
        .ok_or_else(|| unsupported(node, "no output"))?;
    let out_dtype = graph.values[out].dtype;
    let (quantize, axis) = match &node.op {
        Op::QuantizeLinear { axis, .. } => (true, *axis),
        Op::DequantizeLinear { axis } => (false, *axis),
        Op::QLut { table, dtype } => {
            if table.len() != 256 || !matches!(in_dtype, DataType::U8 | DataType::I8) {
                return Err(unsupported(
                    node,
                    "needs a 256-entry table and an 8-bit input",
                ));
            }
            let mut t = [0u8; 256];
            t.copy_from_slice(table);
            return Ok(Box::new(LutKernel {
                table: t,
                len: numel(&shape),
                dtype: *dtype,
                name: node.name.clone(),
            }));
        }
        other => {
            return Err(Error::Unsupported(format!(
                "quantize kernels do not handle {}",
                other.name()
            )))
        }
    };
    let scale_len = node
        .input(1)
        .map(|v| graph.shape(v).map(numel))
        .transpose()?
        .unwrap_or(1);
    // Per-axis when the scale has more than one element (one element means the same either way).
    let per_axis = scale_len > 1;
    let (channels, inner) = if per_axis {
        let a = norm_axis(node, axis, shape.len())?;
        (shape[a], shape[a + 1..].iter().product::<usize>())
    } else {
        (1, 1)
    };
    if scale_len != channels {
        return Err(shape_err(
            node,
            format_args!("{scale_len} scales for {channels} channels"),
        ));
    }
    let zp_dtype = node.input(2).map(|v| graph.values[v].dtype);
    if quantize {
        if in_dtype != DataType::F32 || !matches!(out_dtype, DataType::U8 | DataType::I8) {
            return Err(unsupported(
                node,
                format_args!("quantizing {in_dtype:?} to {out_dtype:?}"),
            ));
        }
        if zp_dtype.is_some_and(|d| d != out_dtype) {
            return Err(unsupported(node, "zero point type differs from the output"));
        }
    } else {
        let ok = matches!(in_dtype, DataType::U8 | DataType::I8 | DataType::I32);
        if !ok || zp_dtype.is_some_and(|d| d != in_dtype) || out_dtype != DataType::F32 {
            return Err(unsupported(
                node,
                format_args!("dequantizing {in_dtype:?} to {out_dtype:?}"),
            ));
        }
    }
    Ok(Box::new(QdqKernel {
        quantize,
        in_dtype,
        out_dtype,
        len: numel(&shape),
        channels,
        inner,
        name: node.name.clone(),
    }))
}

/// Q or DQ over `len` elements with `channels` scale/zero-point pairs (1 = per tensor), the
/// channel of element `i` being `(i / inner) % channels`.
struct QdqKernel {
    quantize: bool,
    in_dtype: DataType,
    out_dtype: DataType,
    len: usize,
    channels: usize,
    inner: usize,
    name: String,
}

/// Reads the (integer) zero points as i32, `channels` of them, or zeros when absent.
fn zero_points(t: Option<TensorRef<'_>>, channels: usize, buf: &mut [i32]) -> Result<()> {
    let buf = &mut buf[..channels];
    match t {
        None => buf.fill(0),
        Some(t) => {
            if t.len() != channels {
                return Err(Error::Shape(format!(
                    "{} zero points for {channels} channels",
                    t.len()
                )));
            }
            match t.dtype {
                DataType::U8 => buf
                    .iter_mut()
                    .zip(t.bytes)
                    .for_each(|(z, &b)| *z = b as i32),
                DataType::I8 => buf
                    .iter_mut()
                    .zip(t.bytes)
                    .for_each(|(z, &b)| *z = b as i8 as i32),
                DataType::I32 => buf.copy_from_slice(t.i32()),
                other => {
                    return Err(Error::Type(format!("zero point of type {other:?}")));
                }
            }
        }
    }
    Ok(())
}

/// Rounds half to even and saturates to `[lo, hi]` (ONNX QuantizeLinear semantics).
#[inline(always)]
pub(super) fn quantize_one(x: f32, scale: f32, zp: i32, lo: i32, hi: i32) -> i32 {
    let q = (x / scale).round_ties_even();
    // NaN maps to the zero point's saturation of 0 (as_ i32 of NaN is 0).
    let q = q.clamp(i32::MIN as f32, i32::MAX as f32) as i64 + zp as i64;
    q.clamp(lo as i64, hi as i64) as i32
}

/// Per-tensor quantization of `xs` into `out`: (scale, zero point, clamp low/high relative to the
/// zero point, signed output). Runs the AVX-512 or AVX2 compilation of the same loop when present.
fn quantize_slice(xs: &[f32], out: &mut [u8], p: (f32, f32, f32, f32, bool)) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
            // SAFETY: the required CPU features were detected at run time.
            return unsafe { quantize_slice_avx512(xs, out, p) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { quantize_slice_avx2(xs, out, p) };
        }
    }
    quantize_slice_impl(xs, out, p)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn quantize_slice_avx512(xs: &[f32], out: &mut [u8], p: (f32, f32, f32, f32, bool)) {
    quantize_slice_impl(xs, out, p)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_slice_avx2(xs: &[f32], out: &mut [u8], p: (f32, f32, f32, f32, bool)) {
    quantize_slice_impl(xs, out, p)
}

/// Per-tensor dequantization of 8-bit `xs` (scale, zero point, signed input) into `out`:
/// `(x - z) as f32 * s`, with the AVX-512 or AVX2 compilation of the loop when present.
fn dequantize_slice(xs: &[u8], out: &mut [f32], p: (f32, i32, bool)) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
            // SAFETY: the required CPU features were detected at run time.
            return unsafe { dequantize_slice_avx512(xs, out, p) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: as above.
            return unsafe { dequantize_slice_avx2(xs, out, p) };
        }
    }
    dequantize_slice_impl(xs, out, p)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn dequantize_slice_avx512(xs: &[u8], out: &mut [f32], p: (f32, i32, bool)) {
    dequantize_slice_impl(xs, out, p)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dequantize_slice_avx2(xs: &[u8], out: &mut [f32], p: (f32, i32, bool)) {
    dequantize_slice_impl(xs, out, p)
}

#[inline(always)]
fn dequantize_slice_impl(xs: &[u8], out: &mut [f32], (s, z, signed): (f32, i32, bool)) {
    if signed {
        for (y, &x) in out.iter_mut().zip(xs) {
            *y = (x as i8 as i32 - z) as f32 * s;
        }
    } else {
        for (y, &x) in out.iter_mut().zip(xs) {
            *y = (x as i32 - z) as f32 * s;
        }
    }
}

#[inline(always)]
fn quantize_slice_impl(xs: &[f32], out: &mut [u8], p: (f32, f32, f32, f32, bool)) {
    // Round half to even by adding and subtracting 1.5 * 2^23 (exact once clamped to the 8-bit
    // range); NaN maps to the zero point, as in the reference path.
    const MAGIC: f32 = 12_582_912.0;
    let (s, z, flo, fhi, signed) = p;
    for (b, &x) in out.iter_mut().zip(xs) {
        let v = x / s;
        let v = if v.is_nan() { 0.0 } else { v.max(flo).min(fhi) };
        // SAFETY: v is finite and within [-255, 255] here.
        let q = unsafe { ((v + MAGIC) - MAGIC + z).to_int_unchecked::<i32>() };
        *b = if signed { q as i8 as u8 } else { q as u8 };
    }
}

/// Stack buffer size for per-axis parameters; larger axes use a heap buffer built once per run.
const MAX_STACK_CHANNELS: usize = 64;

impl Kernel for QdqKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let name = &self.name;
        let x = input(inputs, 0, name)?;
        let s = input(inputs, 1, name)?;
        let zt = inputs.get(2).copied().flatten();
        if s.dtype != DataType::F32 || s.len() != self.channels {
            return Err(shape_err_name(
                name,
                "scale must be f32 with one value per channel",
            ));
        }
        let scales: &[f32] = view(s.bytes, self.channels, name)?;
        // Per-axis parameters of big axes need a heap buffer; ONNX node tests and real models
        // use per-axis Q/DQ only on constant weights, which constant folding evaluates once.
        let mut stack = [0i32; MAX_STACK_CHANNELS];
        let mut heap = Vec::new();
        let zps: &mut [i32] = if self.channels <= MAX_STACK_CHANNELS {
            &mut stack[..]
        } else {
            heap.resize(self.channels, 0);
            &mut heap[..]
        };
        zero_points(zt, self.channels, zps)?;
        let zps = &zps[..self.channels];
        let (c, inner) = (self.channels, self.inner);
        let chan = move |i: usize| if c == 1 { 0 } else { (i / inner) % c };
        let out = output(outputs, 0, name)?;
        if self.quantize {
            let xs: &[f32] = view(x.bytes, self.len, name)?;
            let (lo, hi) = if self.out_dtype == DataType::U8 {
                (0, 255)
            } else {
                (-128, 127)
            };
            let signed = self.out_dtype == DataType::I8;
            let o: &mut [u8] = &mut out.bytes[..];
            if o.len() != self.len {
                return Err(shape_err_name(name, "output size"));
            }
            if c == 1 {
                // Per tensor: divide, clamp, round half to even by the 1.5 * 2^23 trick
                // (exact once clamped to the 8-bit range); vectorisable.
                let (s, z) = (scales[0], zps[0] as f32);
                let p = (s, z, lo as f32 - z, hi as f32 - z, signed);
                drive(o, |start, chunk| quantize_slice(&xs[start..], chunk, p));
            } else {
                drive(o, |start, chunk| {
                    for (j, b) in chunk.iter_mut().enumerate() {
                        let i = start + j;
                        let k = chan(i);
                        let q = quantize_one(xs[i], scales[k], zps[k], lo, hi);
                        *b = if signed { q as i8 as u8 } else { q as u8 };
                    }
                });
            }
        } else {
            let o: &mut [f32] = super::elementwise::view_mut(out.bytes, self.len, name)?;
            match self.in_dtype {
                DataType::U8 | DataType::I8 if c == 1 => {
                    // Per tensor: one vectorised loop (`(x - z) as f32 * s`, as below).
                    let xs: &[u8] = view(x.bytes, self.len, name)?;
                    let p = (scales[0], zps[0], self.in_dtype == DataType::I8);
                    drive(o, |start, chunk| {
                        dequantize_slice(&xs[start..start + chunk.len()], chunk, p)
                    });
                }
                DataType::U8 => {
                    let xs: &[u8] = view(x.bytes, self.len, name)?;
                    drive(o, |start, chunk| {
                        for (j, y) in chunk.iter_mut().enumerate() {
                            let k = chan(start + j);
                            *y = (xs[start + j] as i32 - zps[k]) as f32 * scales[k];
                        }
                    });
                }
                DataType::I8 => {
                    let xs: &[i8] = view(x.bytes, self.len, name)?;
                    drive(o, |start, chunk| {
                        for (j, y) in chunk.iter_mut().enumerate() {
                            let k = chan(start + j);
                            *y = (xs[start + j] as i32 - zps[k]) as f32 * scales[k];
                        }
                    });
                }
                _ => {
                    let xs: &[i32] = view(x.bytes, self.len, name)?;
                    drive(o, |start, chunk| {
                        for (j, y) in chunk.iter_mut().enumerate() {
                            let k = chan(start + j);
                            *y = (xs[start + j] as i64 - zps[k] as i64) as f32 * scales[k];
                        }
                    });
                }
            }
        }
        Ok(())
    }
}

fn shape_err_name(name: &str, what: &str) -> Error {
    Error::Shape(format!("node '{name}': {what}"))
}

/// Maps each input byte through a 256-entry table.
struct LutKernel {
    table: [u8; 256],
    len: usize,
    dtype: DataType,
    name: String,
}

impl Kernel for LutKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let x = input(inputs, 0, &self.name)?;
        let out = output(outputs, 0, &self.name)?;
        if x.bytes.len() != self.len || out.bytes.len() != self.len || out.dtype != self.dtype {
            return Err(shape_err_name(&self.name, "lookup table input/output size"));
        }
        let xs = x.bytes;
        let t = &self.table;
        #[cfg(target_arch = "x86_64")]
        let (vbmi, avx2) = (vbmi_available(), is_x86_feature_detected!("avx2"));
        drive(out.bytes, |start, chunk| {
            let src = &xs[start..start + chunk.len()];
            #[cfg(target_arch = "x86_64")]
            if vbmi {
                // SAFETY: AVX-512 VBMI/BW checked at run time; equal slice lengths.
                unsafe { lut_vbmi(t, src, chunk) };
                return;
            } else if avx2 {
                // SAFETY: AVX2 checked at run time.
                unsafe { lut_avx2(t, src, chunk) };
                return;
            }
            lut_scalar(t, src, chunk);
        });
        Ok(())
    }
}

/// Table lookup, portable (the fixed-size table removes the bounds checks).
fn lut_scalar(t: &[u8; 256], src: &[u8], dst: &mut [u8]) {
    for (y, &x) in dst.iter_mut().zip(src) {
        *y = t[x as usize];
    }
}

/// True when AVX-512 VBMI byte permutes (`vpermi2b`/`vpermt2b`) can run: the 64-byte table
/// lookup here and the depthwise tap interleave in `qconv`.
#[cfg(target_arch = "x86_64")]
pub(super) fn vbmi_available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vbmi")
}

/// Table lookup of 64 bytes at a time: two `vpermi2b` over the table's halves (indexed by
/// the low 7 bits), selected by each byte's top bit; the tail is masked.
///
/// # Safety
/// AVX-512F/BW/VBMI must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn lut_vbmi(t: &[u8; 256], src: &[u8], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    let tp = t.as_ptr();
    let q: [__m512i; 4] = [
        _mm512_loadu_si512(tp as *const _),
        _mm512_loadu_si512(tp.add(64) as *const _),
        _mm512_loadu_si512(tp.add(128) as *const _),
        _mm512_loadu_si512(tp.add(192) as *const _),
    ];
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i < n {
        let rest = n - i;
        let m: __mmask64 = if rest >= 64 { !0 } else { (1u64 << rest) - 1 };
        let x = _mm512_maskz_loadu_epi8(m, src.as_ptr().add(i) as *const i8);
        let lo = _mm512_permutex2var_epi8(q[0], x, q[1]);
        let hi = _mm512_permutex2var_epi8(q[2], x, q[3]);
        let top = _mm512_movepi8_mask(x);
        let y = _mm512_mask_blend_epi8(top, lo, hi);
        _mm512_mask_storeu_epi8(dst.as_mut_ptr().add(i) as *mut i8, m, y);
        i += 64;
    }
}

/// Table lookup of 32 bytes at a time with AVX2: the table as sixteen 16-byte rows, each
/// looked up by the low nibble (`vpshufb`) and blended in where the high nibble selects
/// that row; the tail goes through [`lut_scalar`].
///
/// # Safety
/// AVX2 must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn lut_avx2(t: &[u8; 256], src: &[u8], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    let rows: [__m256i; 16] = std::array::from_fn(|r| {
        _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr().add(r * 16) as *const __m128i))
    });
    let nib = _mm256_set1_epi8(0x0f);
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 32 <= n {
        let x = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
        let lo = _mm256_and_si256(x, nib);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), nib);
        let mut y = _mm256_shuffle_epi8(rows[0], lo);
        for (r, row) in rows.iter().enumerate().skip(1) {
            let sel = _mm256_cmpeq_epi8(hi, _mm256_set1_epi8(r as i8));
            y = _mm256_blendv_epi8(y, _mm256_shuffle_epi8(*row, lo), sel);
        }
        _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, y);
        i += 32;
    }
    lut_scalar(t, &src[i..n], &mut dst[i..n]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Tensor;

    /// Runs a one-node Q/DQ graph with all inputs constant through `eval_node`.
    fn eval(op: Op, ins: Vec<Tensor>) -> Tensor {
        let mut g = Graph {
            opset: 21,
            ..Default::default()
        };
        let ids: Vec<Option<usize>> = ins
            .into_iter()
            .enumerate()
            .map(|(i, t)| Some(g.add_constant(format!("i{i}"), t)))
            .collect();
        let out = g.add_value("y", DataType::F32);
        let node = Node {
            name: "n".into(),
            op,
            inputs: ids,
            outputs: vec![out],
        };
        let types = crate::ir::shape::infer_node(&g, &node).unwrap_or_else(|e| panic!("{e}"));
        g.values[out].dtype = types[0].0;
        let r = crate::backend::cpu::eval_node(&g, &node);
        r.map(|mut v| v.remove(0)).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn quantize_per_tensor_rounds_half_even_and_saturates() {
        let x = Tensor::from_f32(vec![7], vec![0.0, 1.0, 3.0, 5.0, -1.0, 1000.0, -1000.0]).unwrap();
        let s = Tensor::from_f32(vec![], vec![2.0]).unwrap();
        let z = Tensor::new(vec![], crate::ir::TensorData::U8(vec![128])).unwrap();
        let y = eval(
            Op::QuantizeLinear {
                axis: 1,
                dtype: None,
            },
            vec![x.clone(), s.clone(), z],
        );
        // 1/2 = 0.5 -> 0, 3/2 = 1.5 -> 2, 5/2 = 2.5 -> 2, -1/2 -> -0 -> 0.
        assert_eq!(
            y.data,
            crate::ir::TensorData::U8(vec![128, 128, 130, 130, 128, 255, 0])
        );
        let z = Tensor::new(vec![], crate::ir::TensorData::I8(vec![-1])).unwrap();
        let y = eval(
            Op::QuantizeLinear {
                axis: 1,
                dtype: None,
            },
            vec![x, s, z],
        );
        assert_eq!(
            y.data,
            crate::ir::TensorData::I8(vec![-1, -1, 1, 1, -1, 127, -128])
        );
    }

    #[test]
    fn per_axis_round_trip_matches_naive() {
        // [2, 3, 2] quantized on axis 1 with 3 scales, then dequantized.
        let xs: Vec<f32> = (0..12).map(|i| i as f32 * 0.37 - 2.0).collect();
        let scales = [0.01f32, 0.05, 0.2];
        let zps = [3i8, -4, 0];
        let x = Tensor::from_f32(vec![2, 3, 2], xs.clone()).unwrap();
        let s = Tensor::from_f32(vec![3], scales.to_vec()).unwrap();
        let z = Tensor::new(vec![3], crate::ir::TensorData::I8(zps.to_vec())).unwrap();
        let q = eval(
            Op::QuantizeLinear {
                axis: 1,
                dtype: None,
            },
            vec![x, s.clone(), z.clone()],
        );
        let crate::ir::TensorData::I8(qv) = &q.data else {
            panic!("not i8")
        };
        for (i, &v) in qv.iter().enumerate() {
            let c = (i / 2) % 3;
            let want = ((xs[i] / scales[c]).round_ties_even() + zps[c] as f32).clamp(-128.0, 127.0);
            assert_eq!(v as f32, want, "element {i}");
        }
        let d = eval(Op::DequantizeLinear { axis: 1 }, vec![q.clone(), s, z]);
        let dv = d.as_f32().unwrap();
        for (i, &v) in dv.iter().enumerate() {
            let c = (i / 2) % 3;
            assert_eq!(v, (qv[i] as i32 - zps[c] as i32) as f32 * scales[c]);
        }
    }

    #[test]
    fn dequantize_per_tensor_u8_and_i8_match_naive() {
        let n = 3 * 4096 + 37;
        let bytes: Vec<u8> = (0..n).map(|i| (i * 97 % 256) as u8).collect();
        let s = Tensor::from_f32(vec![], vec![0.0137]).unwrap();
        let x = Tensor::new(vec![n], crate::ir::TensorData::U8(bytes.clone())).unwrap();
        let z = Tensor::new(vec![], crate::ir::TensorData::U8(vec![131])).unwrap();
        let d = eval(Op::DequantizeLinear { axis: 1 }, vec![x, s.clone(), z]);
        for (i, &v) in d.as_f32().unwrap().iter().enumerate() {
            assert_eq!(v, (bytes[i] as i32 - 131) as f32 * 0.0137, "u8 element {i}");
        }
        let signed: Vec<i8> = bytes.iter().map(|&b| b as i8).collect();
        let x = Tensor::new(vec![n], crate::ir::TensorData::I8(signed.clone())).unwrap();
        let z = Tensor::new(vec![], crate::ir::TensorData::I8(vec![-9])).unwrap();
        let d = eval(Op::DequantizeLinear { axis: 1 }, vec![x, s, z]);
        for (i, &v) in d.as_f32().unwrap().iter().enumerate() {
            assert_eq!(v, (signed[i] as i32 + 9) as f32 * 0.0137, "i8 element {i}");
        }
    }

    #[test]
    fn lut_paths_match_naive_lookup() {
        let mut t = [0u8; 256];
        for (i, v) in t.iter_mut().enumerate() {
            *v = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        // All byte values, a length with a 64-byte tail, and an empty run.
        for n in [0usize, 1, 31, 32, 63, 64, 256 + 77] {
            let src: Vec<u8> = (0..n).map(|i| (i * 151 % 256) as u8).collect();
            let want: Vec<u8> = src
                .iter()
                .map(|&b| b.wrapping_mul(37).wrapping_add(11))
                .collect();
            let mut got = vec![0u8; n];
            lut_scalar(&t, &src, &mut got);
            assert_eq!(got, want, "scalar n={n}");
            #[cfg(target_arch = "x86_64")]
            if vbmi_available() {
                let mut got = vec![0u8; n];
                // SAFETY: availability checked just above.
                unsafe { lut_vbmi(&t, &src, &mut got) };
                assert_eq!(got, want, "vbmi n={n}");
            } else {
                println!("SKIP: QLut VBMI path because this CPU lacks AVX-512 VBMI");
            }
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") {
                let mut got = vec![0u8; n];
                // SAFETY: availability checked just above.
                unsafe { lut_avx2(&t, &src, &mut got) };
                assert_eq!(got, want, "avx2 n={n}");
            } else {
                println!("SKIP: QLut AVX2 path because this CPU lacks AVX2");
            }
        }
    }

    #[test]
    fn dequantize_i32_bias_and_lut() {
        let x = Tensor::new(vec![3], crate::ir::TensorData::I32(vec![-5, 0, 1 << 20])).unwrap();
        let s = Tensor::from_f32(vec![], vec![0.5]).unwrap();
        let d = eval(Op::DequantizeLinear { axis: 1 }, vec![x, s]);
        assert_eq!(d.as_f32().unwrap(), &[-2.5, 0.0, (1 << 19) as f32]);
        let table: Vec<u8> = (0..=255u8).map(|b| b.wrapping_mul(3)).collect();
        let x = Tensor::new(vec![4], crate::ir::TensorData::U8(vec![0, 1, 100, 255])).unwrap();
        let y = eval(
            Op::QLut {
                table,
                dtype: DataType::U8,
            },
            vec![x],
        );
        assert_eq!(y.data, crate::ir::TensorData::U8(vec![0, 3, 44, 253]));
    }
}
