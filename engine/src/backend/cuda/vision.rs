//! Camera-frame conversion and model-input preprocessing on the GPU (NVRTC kernels).
//!
//! * YUYV 4:2:2 and NV12 4:2:0 → packed RGB8 with the same fixed-point math as the CPU converter
//!   (`vigil::camera::convert`): 14-bit coefficients, chroma carried with 4 fractional bits,
//!   NV12 chroma interpolated vertically with the 4-tap cubic [`NV12_CUBIC_EVEN`] and rounded
//!   to 8 bits (as swscale does) before the matrix. The results are bit-identical to the CPU's.
//! * RGB8 HWC → resized, normalized f32 NCHW tensor with the CPU preprocessing's own tap tables
//!   (Pillow-exact bilinear, `vision::preprocess`) and value lookup table, so it is bit-identical
//!   to [`crate::vision::preprocess`] too.
//!
//! [`GpuImageConverter`] works on host slices (synchronously, on the legacy default stream) and
//! keeps its device buffers between calls, growing them only when a frame is larger.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result as drv, CudaContext};

use super::device::{drv_err, DeviceBuffer, Function, Module};
use crate::error::{Error, Result};
use crate::ir::Tensor;
use crate::vision::preprocess::{placement, precompute_coeffs, Coeffs, PRECISION_BITS};
use crate::vision::{ImageTransform, Preprocess, ResizeMode};

pub use crate::vision::yuv::{YuvCoeffs, NV12_CUBIC_EVEN};

const BLOCK: u32 = 256;

const SRC: &str = r#"
typedef unsigned char u8;
__device__ __forceinline__ u8 clip18(int x) { x >>= 18; return (u8)(x < 0 ? 0 : (x > 255 ? 255 : x)); }
__device__ __forceinline__ void yuv_px(int y, int u16, int v16, int yo, int ym, int rv, int gu, int gv, int bu, u8* o) {
    int yy = ((y - yo) * ym) << 4;
    int u = u16 - 2048, v = v16 - 2048;
    o[0] = clip18(yy + rv * v);
    o[1] = clip18(yy - gu * u - gv * v);
    o[2] = clip18(yy + bu * u);
}
extern "C" __global__ void yuyv_rgb(const u8* src, u8* dst, int w, int h, int stride,
                                    int yo, int ym, int rv, int gu, int gv, int bu) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int pairs = w / 2;
    if (i >= pairs * h) return;
    int row = i / pairs, p = i % pairs;
    const u8* s = src + (size_t)row * stride + p * 4;
    u8* o = dst + ((size_t)row * w + p * 2) * 3;
    int u = s[1] << 4, v = s[3] << 4;
    yuv_px(s[0], u, v, yo, ym, rv, gu, gv, bu, o);
    yuv_px(s[2], u, v, yo, ym, rv, gu, gv, bu, o + 3);
}
extern "C" __global__ void nv12_rgb(const u8* src, u8* dst, int w, int h, int stride, int cubic,
                                    int yo, int ym, int rv, int gu, int gv, int bu) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int pairs = w / 2;
    if (i >= pairs * h) return;
    int row = i / pairs, p = i % pairs;
    const u8* uv = src + (size_t)stride * h;
    int ch = h / 2;
    int u, v;
    if (cubic) {
        const int we[4] = {W0, W1, W2, W3};
        int c = row / 2;
        int odd = row & 1;
        int su = 0, sv = 0;
        for (int t = 0; t < 4; ++t) {
            int r = odd ? c - 1 + t : c - 2 + t;
            int wt = odd ? we[3 - t] : we[t];
            r = r < 0 ? 0 : (r > ch - 1 ? ch - 1 : r);
            const u8* q = uv + (size_t)r * stride + p * 2;
            su += wt * q[0];
            sv += wt * q[1];
        }
        su = (su + 2048) >> 12; sv = (sv + 2048) >> 12;
        u = (su < 0 ? 0 : (su > 255 ? 255 : su)) << 4;
        v = (sv < 0 ? 0 : (sv > 255 ? 255 : sv)) << 4;
    } else {
        const u8* q = uv + (size_t)(row / 2) * stride + p * 2;
        u = q[0] << 4; v = q[1] << 4;
    }
    const u8* ys = src + (size_t)row * stride + p * 2;
    u8* o = dst + ((size_t)row * w + p * 2) * 3;
    yuv_px(ys[0], u, v, yo, ym, rv, gu, gv, bu, o);
    yuv_px(ys[1], u, v, yo, ym, rv, gu, gv, bu, o + 3);
}
__device__ __forceinline__ u8 clip22(int a) { a >>= 22; return (u8)(a < 0 ? 0 : (a > 255 ? 255 : a)); }
// Horizontal pass: source rows row_first.. → `rows` rows of `ow` pixels (taps hb/hw, ksize hk).
extern "C" __global__ void resize_h(const u8* src, u8* tmp, int in_w, int row_first, int rows, int ow,
                                    const int* hb, const int* hw, int hk) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * ow) return;
    int r = i / ow, x = i % ow;
    int xmin = hb[2 * x], n = hb[2 * x + 1];
    const u8* s = src + ((size_t)(row_first + r) * in_w + xmin) * 3;
    const int* k = hw + (size_t)x * hk;
    int a0 = 1 << 21, a1 = 1 << 21, a2 = 1 << 21;
    for (int t = 0; t < n; ++t) { int wt = k[t]; a0 += s[3*t] * wt; a1 += s[3*t+1] * wt; a2 += s[3*t+2] * wt; }
    u8* o = tmp + (size_t)i * 3;
    o[0] = clip22(a0); o[1] = clip22(a1); o[2] = clip22(a2);
}
// Vertical pass + normalisation into the NCHW tensor (window at dst_x, dst_y of a tw x th plane).
extern "C" __global__ void resize_v_norm(const u8* tmp, float* out, int row_first, int ww, int wh,
                                         const int* vb, const int* vw, int vk, const float* lut,
                                         int tw, int th, int dst_x, int dst_y, int bgr) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= ww * wh) return;
    int y = i / ww, x = i % ww;
    int ymin = vb[2 * y], n = vb[2 * y + 1];
    const int* k = vw + (size_t)y * vk;
    int a[3] = {1 << 21, 1 << 21, 1 << 21};
    for (int t = 0; t < n; ++t) {
        const u8* s = tmp + ((size_t)(ymin - row_first + t) * ww + x) * 3;
        a[0] += s[0] * k[t]; a[1] += s[1] * k[t]; a[2] += s[2] * k[t];
    }
    size_t plane = (size_t)tw * th, at = (size_t)(dst_y + y) * tw + dst_x + x;
    for (int c = 0; c < 3; ++c) {
        int sc = bgr ? 2 - c : c;
        out[c * plane + at] = lut[c * 256 + clip22(a[sc])];
    }
}
extern "C" __global__ void fill_planes(float* out, int plane, const float* lut, int pad) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 3 * plane) return;
    out[i] = lut[(i / plane) * 256 + pad];
}
"#;

/// A device buffer that is reused and grown on demand.
#[derive(Default)]
pub(super) struct Slot(Option<DeviceBuffer>);

impl Slot {
    /// The buffer's address, after growing it to at least `len` bytes.
    pub(super) fn at_least(&mut self, ctx: &Arc<CudaContext>, len: usize) -> Result<u64> {
        if self.0.as_ref().is_none_or(|b| b.len() < len) {
            self.0 = None;
            self.0 = Some(DeviceBuffer::alloc(ctx, len)?);
        }
        Ok(self.0.as_ref().map(|b| b.ptr()).unwrap_or(0))
    }
}

/// One kernel argument: a device pointer, an `int` or a `float` (all passed by address).
pub(super) enum Arg {
    P(u64),
    I(i32),
    F(f32),
}

/// Launches `f` on the legacy default stream with a `grid` of `block`-thread blocks.
pub(super) fn launch_grid(
    ctx: &CudaContext,
    f: Function,
    grid: (u32, u32, u32),
    block: u32,
    args: &[Arg],
) -> Result<()> {
    if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
        return Ok(());
    }
    let vals: Vec<u64> = args
        .iter()
        .map(|a| match a {
            Arg::P(p) => *p,
            Arg::I(i) => u64::from(*i as u32),
            Arg::F(x) => u64::from(x.to_bits()),
        })
        .collect();
    // Each argument is read from the start of its 8-byte slot: pointers whole, ints and floats
    // as their low 4 bytes (little endian).
    let mut ptrs: Vec<*mut c_void> = vals
        .iter()
        .map(|v| v as *const u64 as *mut c_void)
        .collect();
    ctx.bind_to_thread().map_err(drv_err("bind context"))?;
    // SAFETY: the caller passes exactly the kernel's arguments; every pointer is a live device
    // buffer sized by the caller for the launched work items.
    unsafe { drv::launch_kernel(f.0, grid, (block, 1, 1), 0, std::ptr::null_mut(), &mut ptrs) }
        .map_err(drv_err("kernel launch"))
}

/// Launches `f` over `n` work items in 1-D blocks of [`BLOCK`] threads.
pub(super) fn launch_1d(ctx: &CudaContext, f: Function, n: usize, args: &[Arg]) -> Result<()> {
    let grid = u32::try_from(n.div_ceil(BLOCK as usize))
        .map_err(|_| Error::BadInput(format!("{n} GPU work items are too many")))?;
    launch_grid(ctx, f, (grid, 1, 1), BLOCK, args)
}

/// Converts camera frames and preprocesses images on one CUDA device.
pub struct GpuImageConverter {
    ctx: Arc<CudaContext>,
    _module: Module,
    yuyv: Function,
    nv12: Function,
    resize_h: Function,
    resize_v: Function,
    fill: Function,
    src: Slot,
    rgb: Slot,
    tmp: Slot,
    out: Slot,
    tables: Slot,
}

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::BadInput(format!("{what} {v} is too large for the GPU path")))
}

impl GpuImageConverter {
    /// Compiles the kernels for device `ordinal` (errors when no usable CUDA device exists).
    pub fn new(ordinal: usize) -> Result<GpuImageConverter> {
        super::probe(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(drv_err("context creation"))?;
        let w = NV12_CUBIC_EVEN;
        let src = SRC
            .replace("W0", &w[0].to_string())
            .replace("W1", &w[1].to_string())
            .replace("W2", &w[2].to_string())
            .replace("W3", &w[3].to_string());
        let module = Module::compile(&ctx, &src)?;
        Ok(GpuImageConverter {
            yuyv: module.function("yuyv_rgb")?,
            nv12: module.function("nv12_rgb")?,
            resize_h: module.function("resize_h")?,
            resize_v: module.function("resize_v_norm")?,
            fill: module.function("fill_planes")?,
            _module: module,
            ctx,
            src: Slot::default(),
            rgb: Slot::default(),
            tmp: Slot::default(),
            out: Slot::default(),
            tables: Slot::default(),
        })
    }

    fn launch(&self, f: Function, n: usize, args: &[Arg]) -> Result<()> {
        launch_1d(&self.ctx, f, n, args)
    }

    fn upload(&mut self, which: u8, bytes: &[u8]) -> Result<u64> {
        let ctx = Arc::clone(&self.ctx);
        let slot = match which {
            0 => &mut self.src,
            _ => &mut self.tables,
        };
        let p = slot.at_least(&ctx, bytes.len())?;
        ctx.bind_to_thread().map_err(drv_err("bind context"))?;
        // SAFETY: the slot holds at least bytes.len() bytes.
        unsafe { drv::memcpy_htod_sync(p, bytes) }.map_err(drv_err("upload"))?;
        Ok(p)
    }

    fn download<T>(&self, dst: &mut [T], src: u64) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv_err("bind context"))?;
        // SAFETY: `src` is a device buffer of at least size_of_val(dst) bytes written by the
        // kernels just launched on the legacy default stream, which this copy waits for.
        unsafe { drv::memcpy_dtoh_sync(dst, src) }.map_err(drv_err("download"))
    }

    fn coeff_args(k: &YuvCoeffs) -> [Arg; 6] {
        [
            Arg::I(k.y_offset),
            Arg::I(k.y_mul),
            Arg::I(k.rv),
            Arg::I(k.gu),
            Arg::I(k.gv),
            Arg::I(k.bu),
        ]
    }

    /// YUYV (`stride` bytes per row, 0 = 2·width) → packed RGB8, width·height·3 bytes.
    pub fn yuyv_to_rgb(
        &mut self,
        src: &[u8],
        width: usize,
        height: usize,
        stride: usize,
        k: &YuvCoeffs,
    ) -> Result<Vec<u8>> {
        let stride = if stride == 0 { width * 2 } else { stride };
        if width == 0 || height == 0 || !width.is_multiple_of(2) || stride < width * 2 {
            return Err(Error::BadInput(format!(
                "YUYV needs an even, non-zero width and stride >= 2*width ({width}x{height}, stride {stride})"
            )));
        }
        let need = stride * (height - 1) + width * 2;
        if src.len() < need {
            return Err(Error::BadInput(format!(
                "YUYV frame is {} bytes, expected at least {need}",
                src.len()
            )));
        }
        self.yuv_kernel(self.yuyv, &src[..need], (width, height, stride), None, k)
    }

    /// Uploads a YUV frame, runs conversion kernel `f` (one thread per pixel pair; `extra` is
    /// the NV12 kernel's chroma-mode argument) and downloads the packed RGB8 result.
    fn yuv_kernel(
        &mut self,
        f: Function,
        src: &[u8],
        (width, height, stride): (usize, usize, usize),
        extra: Option<i32>,
        k: &YuvCoeffs,
    ) -> Result<Vec<u8>> {
        let s = self.upload(0, src)?;
        let ctx = Arc::clone(&self.ctx);
        let d = self.rgb.at_least(&ctx, width * height * 3)?;
        let mut args = vec![
            Arg::P(s),
            Arg::P(d),
            Arg::I(to_i32(width, "width")?),
            Arg::I(to_i32(height, "height")?),
            Arg::I(to_i32(stride, "stride")?),
        ];
        args.extend(extra.map(Arg::I));
        args.extend(Self::coeff_args(k));
        self.launch(f, width / 2 * height, &args)?;
        let mut out = vec![0u8; width * height * 3];
        self.download(&mut out, d)?;
        Ok(out)
    }

    /// NV12 (Y plane then interleaved UV, both `stride` bytes per row, 0 = width) → packed RGB8;
    /// `cubic` selects the vertical cubic chroma interpolation (else nearest row).
    pub fn nv12_to_rgb(
        &mut self,
        src: &[u8],
        width: usize,
        height: usize,
        stride: usize,
        k: &YuvCoeffs,
        cubic: bool,
    ) -> Result<Vec<u8>> {
        let stride = if stride == 0 { width } else { stride };
        if width == 0
            || height == 0
            || !width.is_multiple_of(2)
            || !height.is_multiple_of(2)
            || stride < width
        {
            return Err(Error::BadInput(format!(
                "NV12 needs even, non-zero dimensions and stride >= width ({width}x{height}, stride {stride})"
            )));
        }
        let need = stride * height + stride * (height / 2 - 1) + width;
        if src.len() < need {
            return Err(Error::BadInput(format!(
                "NV12 frame is {} bytes, expected at least {need}",
                src.len()
            )));
        }
        self.yuv_kernel(
            self.nv12,
            &src[..need],
            (width, height, stride),
            Some(i32::from(cubic)),
            k,
        )
    }

    /// Packed RGB8 HWC (`width`·`height`·3 bytes) → [1, 3, H, W] f32 tensor and its transform,
    /// exactly as [`crate::vision::preprocess`] computes them on the CPU.
    pub fn preprocess(
        &mut self,
        rgb: &[u8],
        width: usize,
        height: usize,
        p: &Preprocess,
    ) -> Result<(Tensor, ImageTransform)> {
        if width == 0 || height == 0 || rgb.len() < width * height * 3 {
            return Err(Error::Image(format!(
                "cannot preprocess a {width}x{height} image from {} bytes",
                rgb.len()
            )));
        }
        if p.width == 0 || p.height == 0 {
            return Err(Error::BadInput(format!(
                "model input size {}x{} is empty",
                p.width, p.height
            )));
        }
        if p.std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
            return Err(Error::BadInput(format!(
                "preprocess std {:?} must be finite and non-zero",
                p.std
            )));
        }
        let (pl, transform) = placement(width, height, p)?;
        let (x0, y0, ww, wh) = pl.window;
        let one = 1i32 << PRECISION_BITS;
        // Identity taps where an axis is not resized (what the CPU's plain copy computes).
        let identity = |first: usize, count: usize| Coeffs {
            bounds: (first..first + count).map(|i| (i, 1)).collect(),
            weights: vec![one; count],
            ksize: 1,
        };
        let hc = if pl.resized_w != width {
            precompute_coeffs(width, pl.resized_w, x0, ww)
        } else {
            identity(x0, ww)
        };
        let vc = if pl.resized_h != height {
            precompute_coeffs(height, pl.resized_h, y0, wh)
        } else {
            identity(y0, wh)
        };
        let row_first = vc.bounds.iter().map(|b| b.0).min().unwrap_or(0);
        let row_last = vc.bounds.iter().map(|b| b.0 + b.1).max().unwrap_or(0);
        let rows = row_last.saturating_sub(row_first);
        if row_last > height || hc.bounds.iter().any(|b| b.0 + b.1 > width) {
            return Err(Error::Image("resize taps fall outside the image".into()));
        }

        // Tables: h bounds, h weights, v bounds, v weights (i32), then the 3x256 f32 LUT.
        let mut lut = [0f32; 768];
        for c in 0..3 {
            for v in 0..256 {
                lut[c * 256 + v] = (v as f32 * p.scale - p.mean[c]) / p.std[c];
            }
        }
        let mut words: Vec<u32> = Vec::new();
        let mut push_coeffs = |c: &Coeffs| -> Result<(usize, usize)> {
            let b = words.len();
            for &(s, n) in &c.bounds {
                words.push(to_i32(s, "tap")? as u32);
                words.push(to_i32(n, "tap count")? as u32);
            }
            let wts = words.len();
            words.extend(c.weights.iter().map(|&w| w as u32));
            Ok((b, wts))
        };
        let (hb, hw) = push_coeffs(&hc)?;
        let (vb, vw) = push_coeffs(&vc)?;
        let lut_at = words.len();
        words.extend(lut.iter().map(|f| f.to_bits()));
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let t = self.upload(1, &bytes)?;
        let s = self.upload(0, &rgb[..width * height * 3])?;
        let ctx = Arc::clone(&self.ctx);
        let tmp = self.tmp.at_least(&ctx, rows * ww * 3)?;
        let (tw, th) = (p.width as usize, p.height as usize);
        let out = self.out.at_least(&ctx, 3 * tw * th * 4)?;
        let at = |i: usize| t + 4 * i as u64;
        let pad = match p.resize {
            ResizeMode::Letterbox { pad_value } => i32::from(pad_value),
            _ => 0,
        };
        if ww != tw || wh != th {
            self.launch(
                self.fill,
                3 * tw * th,
                &[
                    Arg::P(out),
                    Arg::I(to_i32(tw * th, "plane")?),
                    Arg::P(at(lut_at)),
                    Arg::I(pad),
                ],
            )?;
        }
        self.launch(
            self.resize_h,
            rows * ww,
            &[
                Arg::P(s),
                Arg::P(tmp),
                Arg::I(to_i32(width, "width")?),
                Arg::I(to_i32(row_first, "row")?),
                Arg::I(to_i32(rows, "rows")?),
                Arg::I(to_i32(ww, "width")?),
                Arg::P(at(hb)),
                Arg::P(at(hw)),
                Arg::I(to_i32(hc.ksize, "ksize")?),
            ],
        )?;
        self.launch(
            self.resize_v,
            ww * wh,
            &[
                Arg::P(tmp),
                Arg::P(out),
                Arg::I(to_i32(row_first, "row")?),
                Arg::I(to_i32(ww, "width")?),
                Arg::I(to_i32(wh, "height")?),
                Arg::P(at(vb)),
                Arg::P(at(vw)),
                Arg::I(to_i32(vc.ksize, "ksize")?),
                Arg::P(at(lut_at)),
                Arg::I(to_i32(tw, "width")?),
                Arg::I(to_i32(th, "height")?),
                Arg::I(to_i32(pl.dst_x, "offset")?),
                Arg::I(to_i32(pl.dst_y, "offset")?),
                Arg::I(i32::from(p.bgr)),
            ],
        )?;
        let mut data = vec![0f32; 3 * tw * th];
        self.download(&mut data, out)?;
        Ok((Tensor::from_f32(vec![1, 3, th, tw], data)?, transform))
    }
}
