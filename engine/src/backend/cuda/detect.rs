//! Detection decoding and non-maximum suppression on the GPU (NVRTC kernels), so that only the
//! kept detections come back to the host.
//!
//! * `nanodet_decode`: one thread per anchor: best class (first on ties, NaN skipped), score
//!   threshold, the GFL distance as the expectation of a softmax over the bins, the mapping to
//!   original-image pixels with clamping, and the empty/non-finite filter; survivors are
//!   appended (atomically) to a candidate list with a sort key `(score descending, anchor index)`.
//! * `bitonic_step`: a global-memory bitonic sort of the keys (padded to a power of two), which
//!   reproduces the CPU's stable sort by descending score exactly (keys are unique).
//! * `nms_mask`: torchvision's NMS kernel: for each sorted candidate, a bit per later candidate
//!   of the same class that it suppresses (IoU not `<=` the threshold), 64 per word.
//! * The host downloads the mask and runs the short greedy pass (as torchvision does).
//!
//! All arithmetic mirrors `vision::detect` operation by operation (explicitly rounded intrinsics,
//! so nothing is fused into an FMA; `exp` in double then rounded to float, which is what the
//! host's correctly rounded `expf` gives), so results match the CPU post-processing.
//!
//! The model outputs arrive as host tensors (the CUDA executable returns its outputs to the
//! host), so [`GpuDetector::nanodet`] uploads them first.

use std::sync::Arc;

use cudarc::driver::{result as drv, CudaContext};

use super::device::{drv_err, Function, Module};
use super::vision::{launch_1d, launch_grid, Arg, Slot};
use crate::backend::DeviceOutput;
use crate::error::{Error, Result};
use crate::ir::{DataType, Tensor};
use crate::vision::detect::{nanodet_levels, NanodetLevel};
use crate::vision::{label_for, BBox, Detection, ImageTransform, VisionSpec};

/// Most candidates the suppression mask is built for (its size grows with the square).
pub const MAX_CANDIDATES: usize = 65_536;

const SRC: &str = r#"
typedef unsigned long long u64;
__device__ __forceinline__ float clampf(float x, float lo, float hi) {
    // Rust's f32::clamp: NaN stays NaN.
    if (x < lo) x = lo;
    if (x > hi) x = hi;
    return x;
}
__device__ __forceinline__ unsigned desc_key(float s) {
    // Ascending order of the result = descending f32::total_cmp order of s.
    unsigned u = __float_as_uint(s);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}
__device__ float softmax_expectation(const float* b, int nb) {
    float m = -__int_as_float(0x7f800000);
    for (int k = 0; k < nb; ++k) m = fmaxf(m, b[k]);
    float total = 0.0f, acc = -0.0f;
    for (int k = 0; k < nb; ++k) {
        float p = (float)exp((double)__fsub_rn(b[k], m));
        total = __fadd_rn(total, p);
        acc = __fadd_rn(acc, __fmul_rn((float)k, p));
    }
    return __fdiv_rn(acc, total);
}
extern "C" __global__ void nanodet_decode(
        const float* scores, const float* boxes, int n, int c, int fw, float sf, int nb,
        float thr, unsigned base, float sx, float sy, float ox, float oy, float W, float H,
        float4* cbox, float* cscore, int* ccls, u64* ckey, unsigned* count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float* s = scores + (size_t)i * c;
    int best = -1;
    float bs = 0.0f;
    for (int k = 0; k < c; ++k) {
        float v = s[k];
        if (isnan(v)) continue;
        if (best >= 0 && v <= bs) continue;
        best = k; bs = v;
    }
    if (best < 0 || bs < thr) return;
    float cx = __fmul_rn(__fadd_rn((float)(i % fw), 0.5f), sf);
    float cy = __fmul_rn(__fadd_rn((float)(i / fw), 0.5f), sf);
    const float* b = boxes + (size_t)i * 4 * nb;
    float d0 = __fmul_rn(softmax_expectation(b, nb), sf);
    float d1 = __fmul_rn(softmax_expectation(b + nb, nb), sf);
    float d2 = __fmul_rn(softmax_expectation(b + 2 * nb, nb), sf);
    float d3 = __fmul_rn(softmax_expectation(b + 3 * nb, nb), sf);
    float x1 = __fmul_rn(__fsub_rn(__fsub_rn(cx, d0), ox), sx);
    float y1 = __fmul_rn(__fsub_rn(__fsub_rn(cy, d1), oy), sy);
    float x2 = __fmul_rn(__fsub_rn(__fadd_rn(cx, d2), ox), sx);
    float y2 = __fmul_rn(__fsub_rn(__fadd_rn(cy, d3), oy), sy);
    float4 o;
    o.x = clampf(fminf(x1, x2), 0.0f, W);
    o.y = clampf(fminf(y1, y2), 0.0f, H);
    o.z = clampf(fmaxf(x2, x1), 0.0f, W);
    o.w = clampf(fmaxf(y2, y1), 0.0f, H);
    bool ok = isfinite(o.x) && isfinite(o.y) && isfinite(o.z) && isfinite(o.w) && o.z > o.x && o.w > o.y;
    if (!ok) return;
    unsigned slot = atomicAdd(count, 1u);
    cbox[slot] = o;
    cscore[slot] = bs;
    ccls[slot] = best;
    ckey[slot] = ((u64)desc_key(bs) << 32) | (u64)(base + (unsigned)i);
}
// Keys of the candidates given by the host (same key as the decode writes).
extern "C" __global__ void make_keys(const float* cscore, u64* ckey, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    ckey[i] = ((u64)desc_key(cscore[i]) << 32) | (u64)i;
}
// Sort input: keys (padded with ~0) and the candidate slot each came from.
extern "C" __global__ void sort_init(const u64* ckey, u64* keys, unsigned* vals, int n, int p) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p) return;
    keys[i] = i < n ? ckey[i] : ~0ull;
    vals[i] = (unsigned)i;
}
extern "C" __global__ void bitonic_step(u64* keys, unsigned* vals, unsigned j, unsigned k, unsigned p) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p) return;
    unsigned l = i ^ j;
    if (l <= i) return;
    u64 a = keys[i], b = keys[l];
    bool up = (i & k) == 0;
    if ((a > b) == up) {
        keys[i] = b; keys[l] = a;
        unsigned t = vals[i]; vals[i] = vals[l]; vals[l] = t;
    }
}
// Candidates in sorted order.
extern "C" __global__ void gather(const unsigned* vals, const float4* cbox, const float* cscore, const int* ccls,
                                  float4* sbox, float* sscore, int* scls, int n) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    unsigned s = vals[r];
    sbox[r] = cbox[s]; sscore[r] = cscore[s]; scls[r] = ccls[s];
}
__device__ __forceinline__ float iou(float4 a, float4 b) {
    float iw = fmaxf(__fsub_rn(fminf(a.z, b.z), fmaxf(a.x, b.x)), 0.0f);
    float ih = fmaxf(__fsub_rn(fminf(a.w, b.w), fmaxf(a.y, b.y)), 0.0f);
    float inter = __fmul_rn(iw, ih);
    float aa = __fmul_rn(fmaxf(__fsub_rn(a.z, a.x), 0.0f), fmaxf(__fsub_rn(a.w, a.y), 0.0f));
    float ab = __fmul_rn(fmaxf(__fsub_rn(b.z, b.x), 0.0f), fmaxf(__fsub_rn(b.w, b.y), 0.0f));
    float uni = __fsub_rn(__fadd_rn(aa, ab), inter);
    return uni > 0.0f ? __fdiv_rn(inter, uni) : 0.0f;
}
// Bit t of mask[i * col_blocks + cb]: sorted candidate i suppresses candidate cb*64+t (> i).
extern "C" __global__ void nms_mask(const float4* sbox, const int* scls, int n, float thr,
                                    u64* mask, int col_blocks) {
    int rb = blockIdx.y, cb = blockIdx.x;
    if (rb > cb) return;
    int rows = min(n - rb * 64, 64), cols = min(n - cb * 64, 64);
    __shared__ float4 bx[64];
    __shared__ int bc[64];
    int t = threadIdx.x;
    if (t < cols) { bx[t] = sbox[cb * 64 + t]; bc[t] = scls[cb * 64 + t]; }
    __syncthreads();
    if (t >= rows) return;
    int i = rb * 64 + t;
    float4 a = sbox[i];
    int ca = scls[i];
    u64 bits = 0;
    for (int j = (rb == cb ? t + 1 : 0); j < cols; ++j) {
        if (bc[j] == ca && !(iou(a, bx[j]) <= thr)) bits |= 1ull << j;
    }
    mask[(size_t)i * col_blocks + cb] = bits;
}
"#;

/// Device buffers reused across calls (grown on demand).
#[derive(Default)]
struct Buffers {
    input: Slot,
    cbox: Slot,
    cscore: Slot,
    ccls: Slot,
    ckey: Slot,
    count: Slot,
    keys: Slot,
    vals: Slot,
    sbox: Slot,
    sscore: Slot,
    scls: Slot,
    mask: Slot,
}

/// NanoDet decoding and per-class NMS on one CUDA device.
pub struct GpuDetector {
    ctx: Arc<CudaContext>,
    _module: Module,
    decode: Function,
    make_keys: Function,
    sort_init: Function,
    bitonic: Function,
    gather: Function,
    mask: Function,
    buf: Buffers,
}

/// The kept candidates, best first: boxes, scores, classes and the candidate slots they came from.
#[derive(Default)]
struct Kept {
    boxes: Vec<[f32; 4]>,
    scores: Vec<f32>,
    classes: Vec<i32>,
    origin: Vec<u32>,
}

fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| Error::BadInput(format!("{what} {v} is too large for the GPU path")))
}

/// The greedy pass over the suppression mask: sorted indices kept, at most `max` of them.
pub fn greedy_keep(mask: &[u64], n: usize, max: usize) -> Vec<usize> {
    let col_blocks = n.div_ceil(64);
    let mut removed = vec![0u64; col_blocks];
    let mut keep = Vec::new();
    for i in 0..n {
        if keep.len() >= max {
            break;
        }
        if removed[i / 64] >> (i % 64) & 1 == 1 {
            continue;
        }
        keep.push(i);
        let row = &mask[i * col_blocks..(i + 1) * col_blocks];
        for (r, &m) in removed.iter_mut().zip(row).skip(i / 64) {
            *r |= m;
        }
    }
    keep
}

impl GpuDetector {
    /// Compiles the kernels for device `ordinal` (errors when no usable CUDA device exists).
    pub fn new(ordinal: usize) -> Result<GpuDetector> {
        super::probe(ordinal)?;
        let ctx = CudaContext::new(ordinal).map_err(drv_err("context creation"))?;
        let module = Module::compile(&ctx, SRC)?;
        Ok(GpuDetector {
            decode: module.function("nanodet_decode")?,
            make_keys: module.function("make_keys")?,
            sort_init: module.function("sort_init")?,
            bitonic: module.function("bitonic_step")?,
            gather: module.function("gather")?,
            mask: module.function("nms_mask")?,
            _module: module,
            ctx,
            buf: Buffers::default(),
        })
    }

    fn upload(&self, dst: u64, bytes: &[u8]) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv_err("bind context"))?;
        // SAFETY: the caller sized `dst` for `bytes`.
        unsafe { drv::memcpy_htod_sync(dst, bytes) }.map_err(drv_err("upload"))
    }

    fn download<T>(&self, dst: &mut [T], src: u64) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(drv_err("bind context"))?;
        // SAFETY: `src` holds at least size_of_val(dst) bytes written by kernels on the legacy
        // default stream, which this synchronous copy waits for.
        unsafe { drv::memcpy_dtoh_sync(dst, src) }.map_err(drv_err("download"))
    }

    /// Candidate buffers for up to `cap` candidates: (box, score, class, key) addresses.
    fn candidates(&mut self, cap: usize) -> Result<(u64, u64, u64, u64)> {
        let ctx = Arc::clone(&self.ctx);
        Ok((
            self.buf.cbox.at_least(&ctx, cap * 16)?,
            self.buf.cscore.at_least(&ctx, cap * 4)?,
            self.buf.ccls.at_least(&ctx, cap * 4)?,
            self.buf.ckey.at_least(&ctx, cap * 8)?,
        ))
    }

    /// Sorts the first `n` candidates by key, builds the suppression mask and runs the greedy
    /// pass; returns the kept candidates' boxes, scores and classes, best first.
    fn sort_and_suppress(&mut self, n: usize, iou_threshold: f32, max: usize) -> Result<Kept> {
        if n == 0 || max == 0 {
            return Ok(Kept::default());
        }
        if n > MAX_CANDIDATES {
            return Err(Error::Unsupported(format!(
                "{n} detection candidates exceed the GPU NMS limit of {MAX_CANDIDATES}"
            )));
        }
        let ctx = Arc::clone(&self.ctx);
        let p = n.next_power_of_two();
        let (cbox, cscore, ccls, ckey) = self.candidates(n)?;
        let keys = self.buf.keys.at_least(&ctx, p * 8)?;
        let vals = self.buf.vals.at_least(&ctx, p * 4)?;
        let (ni, pi) = (to_i32(n, "candidates")?, to_i32(p, "candidates")?);
        launch_1d(
            &ctx,
            self.sort_init,
            p,
            &[
                Arg::P(ckey),
                Arg::P(keys),
                Arg::P(vals),
                Arg::I(ni),
                Arg::I(pi),
            ],
        )?;
        let mut k = 2usize;
        while k <= p {
            let mut j = k / 2;
            while j > 0 {
                launch_1d(
                    &ctx,
                    self.bitonic,
                    p,
                    &[
                        Arg::P(keys),
                        Arg::P(vals),
                        Arg::I(j as i32),
                        Arg::I(k as i32),
                        Arg::I(pi),
                    ],
                )?;
                j /= 2;
            }
            k *= 2;
        }
        let sbox = self.buf.sbox.at_least(&ctx, n * 16)?;
        let sscore = self.buf.sscore.at_least(&ctx, n * 4)?;
        let scls = self.buf.scls.at_least(&ctx, n * 4)?;
        launch_1d(
            &ctx,
            self.gather,
            n,
            &[
                Arg::P(vals),
                Arg::P(cbox),
                Arg::P(cscore),
                Arg::P(ccls),
                Arg::P(sbox),
                Arg::P(sscore),
                Arg::P(scls),
                Arg::I(ni),
            ],
        )?;
        let col_blocks = n.div_ceil(64);
        let mask = self.buf.mask.at_least(&ctx, n * col_blocks * 8)?;
        let cb = u32::try_from(col_blocks)
            .map_err(|_| Error::BadInput("too many candidate blocks".into()))?;
        launch_grid(
            &ctx,
            self.mask,
            (cb, cb, 1),
            64,
            &[
                Arg::P(sbox),
                Arg::P(scls),
                Arg::I(ni),
                Arg::F(iou_threshold),
                Arg::P(mask),
                Arg::I(to_i32(col_blocks, "blocks")?),
            ],
        )?;
        let mut host_mask = vec![0u64; n * col_blocks];
        self.download(&mut host_mask, mask)?;
        let keep = greedy_keep(&host_mask, n, max);
        let mut boxes = vec![[0f32; 4]; n];
        let mut scores = vec![0f32; n];
        let mut classes = vec![0i32; n];
        let mut origin = vec![0u32; n];
        self.download(&mut boxes, sbox)?;
        self.download(&mut scores, sscore)?;
        self.download(&mut classes, scls)?;
        self.download(&mut origin, vals)?;
        Ok(Kept {
            boxes: keep.iter().map(|&i| boxes[i]).collect(),
            scores: keep.iter().map(|&i| scores[i]).collect(),
            classes: keep.iter().map(|&i| classes[i]).collect(),
            origin: keep.iter().map(|&i| origin[i]).collect(),
        })
    }

    fn detections(spec_labels: &[String], kept: Kept) -> Result<Vec<Detection>> {
        kept.boxes
            .into_iter()
            .zip(kept.scores)
            .zip(kept.classes)
            .map(|((b, score), c)| {
                let class_id = usize::try_from(c)
                    .map_err(|_| Error::Unsupported(format!("GPU NMS returned class {c}")))?;
                Ok(Detection {
                    class_id,
                    label: label_for(spec_labels, class_id),
                    score,
                    bbox: BBox {
                        x1: b[0],
                        y1: b[1],
                        x2: b[2],
                        y2: b[3],
                    },
                })
            })
            .collect()
    }

    /// Greedy per-class NMS of `dets` on the GPU: the same result as [`crate::vision::nms`]
    /// (stable by descending score, IoU not `<=` `iou_threshold` suppresses, at most `max`).
    pub fn nms(
        &mut self,
        dets: &[Detection],
        iou_threshold: f32,
        max_detections: usize,
    ) -> Result<Vec<Detection>> {
        let n = dets.len();
        if n == 0 || max_detections == 0 {
            return Ok(Vec::new());
        }
        if n > MAX_CANDIDATES {
            return Err(Error::Unsupported(format!(
                "{n} detections exceed the GPU NMS limit of {MAX_CANDIDATES}"
            )));
        }
        let classes = dets
            .iter()
            .map(|d| to_i32(d.class_id, "class"))
            .collect::<Result<Vec<i32>>>()?;
        let (cbox, cscore, ccls, ckey) = self.candidates(n)?;
        let boxes: Vec<u8> = dets
            .iter()
            .flat_map(|d| [d.bbox.x1, d.bbox.y1, d.bbox.x2, d.bbox.y2])
            .flat_map(f32::to_le_bytes)
            .collect();
        let scores: Vec<u8> = dets.iter().flat_map(|d| d.score.to_le_bytes()).collect();
        let cls: Vec<u8> = classes.iter().flat_map(|c| c.to_le_bytes()).collect();
        self.upload(cbox, &boxes)?;
        self.upload(cscore, &scores)?;
        self.upload(ccls, &cls)?;
        launch_1d(
            &self.ctx,
            self.make_keys,
            n,
            &[
                Arg::P(cscore),
                Arg::P(ckey),
                Arg::I(to_i32(n, "detections")?),
            ],
        )?;
        let kept = self.sort_and_suppress(n, iou_threshold, max_detections)?;
        kept.origin
            .iter()
            .map(|&o| {
                dets.get(o as usize).cloned().ok_or_else(|| {
                    Error::Unsupported(format!("GPU NMS returned candidate {o} of {n}"))
                })
            })
            .collect()
    }

    /// Decodes NanoDet GFL outputs and runs per-class NMS on the GPU: the same detections as
    /// [`crate::vision::decode_nanodet`] (boxes in original pixels, best first). The host
    /// outputs are uploaded first; [`Self::nanodet_device`] starts from device outputs.
    pub fn nanodet(
        &mut self,
        spec: &VisionSpec,
        outputs: &[Tensor],
        reg_max: usize,
        strides: &[usize],
        score_threshold: f32,
        transform: &ImageTransform,
    ) -> Result<Vec<Detection>> {
        let shapes: Vec<&[usize]> = outputs.iter().map(|t| t.shape.as_slice()).collect();
        let (levels, c) = nanodet_levels(spec, &shapes, reg_max, strides)?;
        // Stage every level's scores and boxes in one upload buffer.
        let mut offsets = Vec::with_capacity(levels.len());
        let mut staged: Vec<u8> = Vec::new();
        for lv in &levels {
            let s = outputs[lv.scores].as_f32()?;
            let b = outputs[lv.boxes].as_f32()?;
            offsets.push((staged.len(), staged.len() + s.len() * 4));
            staged.extend(s.iter().flat_map(|v| v.to_le_bytes()));
            staged.extend(b.iter().flat_map(|v| v.to_le_bytes()));
        }
        let ctx = Arc::clone(&self.ctx);
        let input = self.buf.input.at_least(&ctx, staged.len())?;
        self.upload(input, &staged)?;
        let ptrs: Vec<(u64, u64)> = offsets
            .iter()
            .map(|&(so, bo)| (input + so as u64, input + bo as u64))
            .collect();
        let p = DecodeParams {
            reg_max,
            classes: c,
            score_threshold,
        };
        self.decode_levels(spec, &levels, &ptrs, &p, transform)
    }

    /// [`Self::nanodet`] on outputs that are still in device memory (from
    /// [`crate::backend::BackendContext::run_on_device`], same device): only the kept
    /// detections come back to the host.
    pub fn nanodet_device(
        &mut self,
        spec: &VisionSpec,
        outputs: &[DeviceOutput],
        reg_max: usize,
        strides: &[usize],
        score_threshold: f32,
        transform: &ImageTransform,
    ) -> Result<Vec<Detection>> {
        if let Some(o) = outputs.iter().find(|o| o.dtype != DataType::F32) {
            return Err(Error::BadInput(format!(
                "NanoDet outputs must be f32, got {:?} {:?}",
                o.dtype, o.shape
            )));
        }
        let shapes: Vec<&[usize]> = outputs.iter().map(|o| o.shape.as_slice()).collect();
        let (levels, c) = nanodet_levels(spec, &shapes, reg_max, strides)?;
        let ptrs: Vec<(u64, u64)> = levels
            .iter()
            .map(|lv| (outputs[lv.scores].ptr, outputs[lv.boxes].ptr))
            .collect();
        let p = DecodeParams {
            reg_max,
            classes: c,
            score_threshold,
        };
        self.decode_levels(spec, &levels, &ptrs, &p, transform)
    }

    /// Decodes the levels (score and box tensors at the given device addresses), then sorts
    /// and suppresses the candidates on the device.
    fn decode_levels(
        &mut self,
        spec: &VisionSpec,
        levels: &[NanodetLevel],
        ptrs: &[(u64, u64)],
        p: &DecodeParams,
        transform: &ImageTransform,
    ) -> Result<Vec<Detection>> {
        let nb = p.reg_max + 1;
        let total: usize = levels.iter().map(|l| l.n).sum();
        let ctx = Arc::clone(&self.ctx);
        let count = self.buf.count.at_least(&ctx, 4)?;
        self.upload(count, &0u32.to_le_bytes())?;
        let (cbox, cscore, ccls, ckey) = self.candidates(total.max(1))?;
        let mut base = 0usize;
        for (lv, &(sp, bp)) in levels.iter().zip(ptrs) {
            launch_1d(
                &ctx,
                self.decode,
                lv.n,
                &[
                    Arg::P(sp),
                    Arg::P(bp),
                    Arg::I(to_i32(lv.n, "anchors")?),
                    Arg::I(to_i32(p.classes, "classes")?),
                    Arg::I(to_i32(lv.fw, "feature width")?),
                    Arg::F(lv.stride as f32),
                    Arg::I(to_i32(nb, "bins")?),
                    Arg::F(p.score_threshold),
                    Arg::I(to_i32(base, "anchor")?),
                    Arg::F(transform.scale_x),
                    Arg::F(transform.scale_y),
                    Arg::F(transform.offset_x),
                    Arg::F(transform.offset_y),
                    Arg::F(transform.orig_width as f32),
                    Arg::F(transform.orig_height as f32),
                    Arg::P(cbox),
                    Arg::P(cscore),
                    Arg::P(ccls),
                    Arg::P(ckey),
                    Arg::P(count),
                ],
            )?;
            base += lv.n;
        }
        let mut n = [0u32; 1];
        self.download(&mut n, count)?;
        let n = n[0] as usize;
        if n > total {
            return Err(Error::Unsupported(format!(
                "GPU decode reported {n} candidates for {total} anchors"
            )));
        }
        let kept = self.sort_and_suppress(n, spec.iou_threshold, spec.max_detections)?;
        Self::detections(&spec.labels, kept)
    }
}

/// The scalar parameters of a NanoDet decode.
struct DecodeParams {
    reg_max: usize,
    classes: usize,
    score_threshold: f32,
}

#[cfg(test)]
mod tests {
    use super::greedy_keep;

    /// Naive greedy over an explicit suppression relation.
    #[allow(clippy::needless_range_loop)]
    fn naive(sup: &[Vec<bool>], max: usize) -> Vec<usize> {
        let mut keep: Vec<usize> = Vec::new();
        for j in 0..sup.len() {
            if keep.len() >= max {
                break;
            }
            // `sup` is indexed [i][j] with i from `keep`: a range loop is the clear form here.
            if keep.iter().all(|&i| !sup[i][j]) {
                keep.push(j);
            }
        }
        keep
    }

    #[test]
    fn greedy_pass_over_the_mask_matches_a_naive_greedy() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for n in [1usize, 5, 63, 64, 65, 130, 200] {
            let cb = n.div_ceil(64);
            let mut sup = vec![vec![false; n]; n];
            let mut mask = vec![0u64; n * cb];
            for i in 0..n {
                for j in i + 1..n {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    if s.is_multiple_of(7) {
                        sup[i][j] = true;
                        mask[i * cb + j / 64] |= 1 << (j % 64);
                    }
                }
            }
            for max in [0, 1, 3, n] {
                assert_eq!(
                    greedy_keep(&mask, n, max),
                    naive(&sup, max),
                    "n {n} max {max}"
                );
            }
        }
    }
}
