//! CPU kernel: the quantized sum [`Op::QAdd`] of two 8-bit tensors of one shape. Each element is
//! dequantized, added, passed through the activation and requantized with the same f32
//! operations as the DequantizeLinear, Add and QuantizeLinear kernels, so the result is
//! bit-identical to running those three; one pass over bytes instead of three over floats.

use super::elementwise::{drive, input, numel, output, unsupported};
use super::qgemm::QIsa;
use super::{Kernel, TensorMut, TensorRef};
use crate::error::{Error, Result};
use crate::ir::{Activation, DataType, Graph, Node, Op, QParams};

/// Compiles a QAdd node.
pub fn build(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    let Op::QAdd(q) = &node.op else {
        return Err(unsupported(node, "not a QAdd"));
    };
    let (Some(a), Some(b), Some(&y)) = (node.input(0), node.input(1), node.outputs.first()) else {
        return Err(unsupported(node, "needs two inputs and one output"));
    };
    let (sa, sb, sy) = (graph.shape(a)?, graph.shape(b)?, graph.shape(y)?);
    if sa != sb || sa != sy {
        return Err(unsupported(
            node,
            format_args!("shapes {sa:?} + {sb:?} -> {sy:?} differ"),
        ));
    }
    let bytes =
        |v: crate::ir::ValueId| matches!(graph.values[v].dtype, DataType::U8 | DataType::I8);
    if !bytes(a) || !bytes(b) || graph.values[y].dtype != q.y.dtype {
        return Err(unsupported(node, "needs 8-bit inputs and output"));
    }
    let (relu, general) = match q.activation {
        None => (false, None),
        Some(Activation::Relu) => (true, None),
        Some(act) => (false, Some(act)),
    };
    Ok(Box::new(QAddKernel {
        p: (Dq::new(&q.a), Dq::new(&q.b), Q::new(&q.y)),
        relu,
        general,
        isa: QIsa::detect(),
        len: numel(sa),
        name: node.name.clone(),
    }))
}

/// A compiled QAdd: the per-input and output arithmetic, the activation (ReLU in the
/// vectorised loop, any other per element) and the instruction set, all fixed at build time.
struct QAddKernel {
    p: Params,
    relu: bool,
    general: Option<Activation>,
    /// Read by the x86 loops only.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    isa: QIsa,
    len: usize,
    name: String,
}

/// One input's dequantization as `((b ^ flip) as i32 - zero) as f32 * scale`: i8 codes are
/// flipped into u8 order and the 128 folded into `zero`, so one loop serves both types and
/// computes exactly what the DequantizeLinear kernel does.
#[derive(Clone, Copy)]
struct Dq {
    flip: u8,
    zero: i32,
    scale: f32,
}

impl Dq {
    fn new(p: &QParams) -> Dq {
        let signed = p.dtype == DataType::I8;
        Dq {
            flip: if signed { 0x80 } else { 0 },
            zero: p.zero_point + if signed { 128 } else { 0 },
            scale: p.scale,
        }
    }

    #[inline(always)]
    fn apply(self, b: u8) -> f32 {
        ((b ^ self.flip) as i32 - self.zero) as f32 * self.scale
    }
}

/// The requantization (the QuantizeLinear kernel's arithmetic: divide, clamp relative to the
/// zero point, round half to even by adding and subtracting 1.5 * 2^23, add the zero point);
/// an i8 result is stored as its two's-complement byte.
#[derive(Clone, Copy)]
struct Q {
    scale: f32,
    zero: f32,
    lo: f32,
    hi: f32,
}

impl Q {
    fn new(p: &QParams) -> Q {
        let (lo, hi) = p.range();
        let z = p.zero_point as f32;
        Q {
            scale: p.scale,
            zero: z,
            lo: lo as f32 - z,
            hi: hi as f32 - z,
        }
    }

    #[inline(always)]
    fn apply(self, v: f32) -> u8 {
        const MAGIC: f32 = 12_582_912.0;
        let v = v / self.scale;
        let v = if v.is_nan() {
            0.0
        } else {
            v.max(self.lo).min(self.hi)
        };
        // SAFETY: v is finite and within [-255, 255] here.
        unsafe { ((v + MAGIC) - MAGIC + self.zero).to_int_unchecked::<i32>() as u8 }
    }
}

/// The loop over one chunk, for no activation or ReLU (others take [`qadd_general`]).
#[inline(always)]
fn qadd_impl(a: &[u8], b: &[u8], out: &mut [u8], (da, db, q): (Dq, Dq, Q), relu: bool) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        let s = da.apply(x) + db.apply(y);
        let s = if relu { s.max(0.0) } else { s };
        *o = q.apply(s);
    }
}

type Params = (Dq, Dq, Q);

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn qadd_avx512(a: &[u8], b: &[u8], out: &mut [u8], p: Params, relu: bool) {
    qadd_impl(a, b, out, p, relu)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn qadd_avx2(a: &[u8], b: &[u8], out: &mut [u8], p: Params, relu: bool) {
    qadd_impl(a, b, out, p, relu)
}

/// Any other activation, applied per element.
fn qadd_general(a: &[u8], b: &[u8], out: &mut [u8], (da, db, q): Params, act: Activation) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = q.apply(act.apply(da.apply(x) + db.apply(y)));
    }
}

impl Kernel for QAddKernel {
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        let a = input(inputs, 0, &self.name)?.bytes;
        let b = input(inputs, 1, &self.name)?.bytes;
        let out = output(outputs, 0, &self.name)?;
        if a.len() != self.len || b.len() != self.len || out.bytes.len() != self.len {
            return Err(Error::Shape(format!(
                "node '{}': QAdd input/output size",
                self.name
            )));
        }
        let (p, relu) = (self.p, self.relu);
        drive(out.bytes, |start, chunk| {
            let (xa, xb) = (
                &a[start..start + chunk.len()],
                &b[start..start + chunk.len()],
            );
            if let Some(act) = self.general {
                return qadd_general(xa, xb, chunk, p, act);
            }
            #[cfg(target_arch = "x86_64")]
            match self.isa {
                // SAFETY: `QIsa::detect` checked the features (AVX-512 VNNI implies F/BW,
                // AVX-VNNI implies AVX2).
                QIsa::Avx512Vnni => return unsafe { qadd_avx512(xa, xb, chunk, p, relu) },
                // SAFETY: as above.
                QIsa::AvxVnni | QIsa::Avx2 => return unsafe { qadd_avx2(xa, xb, chunk, p, relu) },
                QIsa::Portable => {}
            }
            qadd_impl(xa, xb, chunk, p, relu)
        });
        Ok(())
    }
}
