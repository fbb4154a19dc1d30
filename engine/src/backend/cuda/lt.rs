//! cuBLASLt matrix multiplies with their epilogue fused (bias, a residual through C, ReLU), as
//! RAII wrappers over cudarc's raw bindings. Pointwise (1x1, stride 1) NHWC convolutions run as
//! one of these: `y[m, n] = act(x[m, k] · w[n, k]ᵀ + bias[n] + z[m, n])`, one kernel in all;
//! int8 ones either return the int32 sums or requantize to int8 in the same kernel (a
//! per-channel alpha vector and an f32 bias).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::sys as dsys;

use super::dnn::time_warm;

use crate::error::{Error, Result};

fn lt_err(what: &str) -> impl Fn(lt::CublasError) -> Error + '_ {
    move |e| Error::Unsupported(format!("cuBLASLt {what} failed: {e:?}"))
}

/// A cuBLASLt handle (not bound to a stream: the stream is passed per call).
pub struct LtHandle(pub lt_sys::cublasLtHandle_t);
// SAFETY: the handle is only a library context; cuBLASLt allows its use from any thread.
unsafe impl Send for LtHandle {}
// SAFETY: as above; matmul calls only read it.
unsafe impl Sync for LtHandle {}

impl LtHandle {
    /// Creates a handle.
    pub fn new() -> Result<Self> {
        lt::create_handle()
            .map(LtHandle)
            .map_err(lt_err("handle creation"))
    }
}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: created by create_handle, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

/// What a pointwise matmul computes besides the product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Epilogue {
    /// A bias vector of n elements (the pointer is fixed when the matmul is built).
    pub bias: bool,
    /// A residual `z[m, n]` is added (through cuBLASLt's C operand, beta = 1).
    pub residual: bool,
    /// ReLU after bias and residual.
    pub relu: bool,
}

/// Shape and types of one pointwise matmul; also the key of the process-wide algorithm cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PointwiseShape {
    /// Rows of x and y (N·H·W).
    pub m: usize,
    /// Output channels.
    pub n: usize,
    /// Input channels.
    pub k: usize,
    /// Half operands (float accumulation) instead of f32.
    pub half: bool,
    /// Signed int8 operands with an int32 result and accumulation (no epilogue; `half` unset).
    pub int8: bool,
    /// With `int8`: the requantization fused instead, an int8 result
    /// `sat(round(act(alpha[n] · acc + beta · z + bias[n])))` with per-channel f32 alpha (a
    /// device vector) and f32 bias (`epilogue.bias` set; ReLU and an int8 residual `z`
    /// optional).
    pub requant: bool,
    pub epilogue: Epilogue,
}

/// A built matmul: descriptors, the chosen algorithm and its measured time.
pub struct LtMatmul {
    desc: lt_sys::cublasLtMatmulDesc_t,
    a: lt_sys::cublasLtMatrixLayout_t,
    b: lt_sys::cublasLtMatrixLayout_t,
    c: lt_sys::cublasLtMatrixLayout_t,
    algo: lt_sys::cublasLtMatmulAlgo_t,
    /// Workspace bytes the algorithm needs.
    pub workspace: usize,
    /// Mean milliseconds measured (epilogue included).
    pub time_ms: f32,
    shape: PointwiseShape,
    bias: u64,
    /// Device address of the per-channel alpha vector (`requant` only).
    alpha: u64,
    /// The residual's factor (`requant` with a residual only).
    beta: f32,
}
// SAFETY: the descriptors are immutable after construction; cuBLASLt only reads them.
unsafe impl Send for LtMatmul {}
// SAFETY: as above.
unsafe impl Sync for LtMatmul {}

impl Drop for LtMatmul {
    fn drop(&mut self) {
        // SAFETY: created in `build`, destroyed once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

type AlgoCache = Mutex<HashMap<PointwiseShape, (lt_sys::cublasLtMatmulAlgo_t, usize, f32)>>;

fn cache() -> &'static AlgoCache {
    static C: OnceLock<AlgoCache> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Device buffers an algorithm search may use (each sized for the shape, in f32 bytes).
pub struct SearchBuffers {
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub z: u64,
    pub ws: u64,
    pub ws_limit: usize,
}

impl LtMatmul {
    /// Builds the matmul for `shape` (bias at device address `bias`, 0 if none; for
    /// `requant`, the alpha vector at `alpha` and the residual's factor `beta`, else 0) and
    /// picks the fastest of cuBLASLt's heuristic candidates by timing each on `buf` on
    /// `stream` (once per shape per process).
    pub fn build(
        h: &LtHandle,
        shape: PointwiseShape,
        bias: u64,
        (alpha, beta): (u64, f32),
        stream: dsys::CUstream,
        buf: &SearchBuffers,
    ) -> Result<Self> {
        let mut mm = Self::describe(shape, bias, (alpha, beta))?;
        if let Some(&(algo, ws, t)) = cache().lock().ok().as_ref().and_then(|c| c.get(&shape)) {
            mm.algo = algo;
            mm.workspace = ws;
            mm.time_ms = t;
            return Ok(mm);
        }
        mm.search(h, stream, buf)?;
        if let Ok(mut c) = cache().lock() {
            c.insert(shape, (mm.algo, mm.workspace, mm.time_ms));
        }
        Ok(mm)
    }

    /// The same matmul (algorithm included) with descriptors of its own, for one execution
    /// context, so that no cuBLASLt object is shared between concurrently running streams.
    pub fn instance(&self) -> Result<Self> {
        let mut mm = Self::describe(self.shape, self.bias, (self.alpha, self.beta))?;
        mm.algo = self.algo;
        mm.workspace = self.workspace;
        mm.time_ms = self.time_ms;
        Ok(mm)
    }

    /// Creates the descriptors (no algorithm chosen yet).
    fn describe(shape: PointwiseShape, bias: u64, (alpha, beta): (u64, f32)) -> Result<Self> {
        use lt_sys::cudaDataType as T;
        let (dt, ct, compute, scale) = if shape.int8 && shape.requant {
            if !shape.epilogue.bias {
                return Err(Error::Unsupported(
                    "cuBLASLt int8 requantization takes a bias".into(),
                ));
            }
            // IMMA with an int8 C/D: f32 scale, alpha and bias (cublasLt.h, BIAS_DATA_TYPE).
            (
                T::CUDA_R_8I,
                T::CUDA_R_8I,
                lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32I,
                T::CUDA_R_32F,
            )
        } else if shape.requant {
            return Err(Error::Unsupported("requantization needs int8".into()));
        } else if shape.int8 {
            let e = &shape.epilogue;
            if e.bias || e.residual || e.relu {
                return Err(Error::Unsupported(
                    "cuBLASLt int8 matmuls take no epilogue".into(),
                ));
            }
            (
                T::CUDA_R_8I,
                T::CUDA_R_32I,
                lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32I,
                T::CUDA_R_32I,
            )
        } else if shape.half {
            (
                T::CUDA_R_16F,
                T::CUDA_R_16F,
                lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                T::CUDA_R_32F,
            )
        } else {
            (
                T::CUDA_R_32F,
                T::CUDA_R_32F,
                lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                T::CUDA_R_32F,
            )
        };
        let (m, n, k) = (shape.m as u64, shape.n as u64, shape.k as u64);
        // Row-major y[m, n] = x[m, k] · w[n, k]ᵀ is column-major yᵀ (n × m) = wᵀᵀ · xᵀ:
        // A = w stored column-major as k × n (ld k), transposed; B = x as k × m (ld k)
        // (the "TN" form cuBLASLt's int8 kernels require).
        let desc = lt::create_matmul_desc(compute, scale).map_err(lt_err("matmul descriptor"))?;
        let mut mm = LtMatmul {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            // SAFETY: plain-old-data, overwritten below before any use.
            algo: unsafe { std::mem::zeroed() },
            workspace: 0,
            time_ms: f32::INFINITY,
            shape,
            bias,
            alpha,
            beta,
        };
        mm.a = lt::create_matrix_layout(dt, k, n, k as i64).map_err(lt_err("layout"))?;
        mm.b = lt::create_matrix_layout(dt, k, m, k as i64).map_err(lt_err("layout"))?;
        mm.c = lt::create_matrix_layout(ct, n, m, n as i64).map_err(lt_err("layout"))?;
        let trans: i32 = 1; // CUBLAS_OP_T
        use lt_sys::cublasLtEpilogue_t as E;
        let e = &shape.epilogue;
        let epi = match (e.bias, e.relu) {
            (true, true) => E::CUBLASLT_EPILOGUE_RELU_BIAS,
            (true, false) => E::CUBLASLT_EPILOGUE_BIAS,
            (false, true) => E::CUBLASLT_EPILOGUE_RELU,
            (false, false) => E::CUBLASLT_EPILOGUE_DEFAULT,
        };
        use lt_sys::cublasLtMatmulDescAttributes_t as D;
        // SAFETY: a live descriptor; each buffer is the attribute's documented type.
        unsafe {
            lt::set_matmul_desc_attribute(
                mm.desc,
                D::CUBLASLT_MATMUL_DESC_TRANSA,
                &trans as *const i32 as *const c_void,
                4,
            )
            .map_err(lt_err("transpose attribute"))?;
            lt::set_matmul_desc_attribute(
                mm.desc,
                D::CUBLASLT_MATMUL_DESC_EPILOGUE,
                &epi as *const E as *const c_void,
                std::mem::size_of::<E>(),
            )
            .map_err(lt_err("epilogue attribute"))?;
            if e.bias {
                lt::set_matmul_desc_attribute(
                    mm.desc,
                    D::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &bias as *const u64 as *const c_void,
                    8,
                )
                .map_err(lt_err("bias attribute"))?;
            }
            if shape.requant {
                // Alpha as a device vector with a host beta (0): the mode the H200's IMMA
                // kernels accepted (with a zero beta mode the heuristic found none), and the
                // bias in f32 like alpha (cublasLt.h, BIAS_DATA_TYPE, IMMA with an int8 C).
                let mode = lt_sys::cublasLtPointerMode_t::CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST;
                lt::set_matmul_desc_attribute(
                    mm.desc,
                    D::CUBLASLT_MATMUL_DESC_POINTER_MODE,
                    &mode as *const lt_sys::cublasLtPointerMode_t as *const c_void,
                    std::mem::size_of::<lt_sys::cublasLtPointerMode_t>(),
                )
                .map_err(lt_err("pointer mode attribute"))?;
                let bt = T::CUDA_R_32F as i32;
                lt::set_matmul_desc_attribute(
                    mm.desc,
                    D::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                    &bt as *const i32 as *const c_void,
                    4,
                )
                .map_err(lt_err("bias type attribute"))?;
            }
        }
        Ok(mm)
    }

    fn search(&mut self, h: &LtHandle, stream: dsys::CUstream, buf: &SearchBuffers) -> Result<()> {
        const N: usize = 8;
        let pref = lt::create_matmul_pref().map_err(lt_err("preference"))?;
        let limit = buf.ws_limit as u64;
        // SAFETY: zeroed plain-old-data result structs; live descriptors.
        let mut found: [lt_sys::cublasLtMatmulHeuristicResult_t; N] = unsafe { std::mem::zeroed() };
        let mut count = 0i32;
        // SAFETY: live descriptors and preference; results sized N.
        let r = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &limit as *const u64 as *const c_void,
                8,
            )
            .and_then(|_| {
                // The plan aligns arena slots to `plan::ALIGNMENT` bytes only (the default
                // assumption is 256): exclude algorithms that need more.
                use lt_sys::cublasLtMatmulPreferenceAttributes_t as P;
                let align = crate::plan::ALIGNMENT as u32;
                for attr in [
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                ] {
                    lt::set_matmul_pref_attribute(
                        pref,
                        attr,
                        &align as *const u32 as *const c_void,
                        4,
                    )?;
                }
                lt_sys::cublasLtMatmulAlgoGetHeuristic(
                    h.0,
                    self.desc,
                    self.a,
                    self.b,
                    self.c,
                    self.c,
                    pref,
                    N as i32,
                    found.as_mut_ptr(),
                    &mut count,
                )
                .result()
            })
        };
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        r.map_err(lt_err("algorithm heuristic"))?;
        let mut best: Option<(lt_sys::cublasLtMatmulAlgo_t, usize, f32)> = None;
        for cand in &found[..(count.max(0) as usize).min(N)] {
            if cand.state != lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                || cand.workspaceSize > buf.ws_limit
            {
                continue;
            }
            self.algo = cand.algo;
            self.workspace = cand.workspaceSize;
            let z = if self.shape.epilogue.residual {
                buf.z
            } else {
                buf.y
            };
            let timed = time_warm(stream, || {
                self.run(h, stream, buf.x, buf.w, z, buf.y, buf.ws)
            });
            if let Ok(t) = timed {
                if best.is_none_or(|b| t < b.2) {
                    best = Some((cand.algo, cand.workspaceSize, t));
                }
            }
        }
        let (algo, ws, t) =
            best.ok_or_else(|| Error::Unsupported("cuBLASLt: no algorithm ran".into()))?;
        self.algo = algo;
        self.workspace = ws;
        self.time_ms = t;
        Ok(())
    }

    /// Enqueues `y = act(x · wᵀ + bias + z)` on `stream` (`z` is read only with a residual).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        h: &LtHandle,
        stream: dsys::CUstream,
        x: u64,
        w: u64,
        z: u64,
        y: u64,
        ws: u64,
    ) -> Result<()> {
        // Scalars in the scale type: i32 for int8 matmuls, else f32 (same bit patterns for
        // 1 and 0 would not hold, so each is spelled out).
        let (one, beta): (u32, u32) = match (self.shape.int8, self.shape.epilogue.residual) {
            (true, true) => (1, self.beta.to_bits()),
            (true, false) => (1, 0),
            (false, true) => (1f32.to_bits(), 1f32.to_bits()),
            (false, false) => (1f32.to_bits(), 0),
        };
        // With `requant` alpha is the device vector (the pointer mode says so) and beta the
        // host f32 (zero without a residual: the same bits as the integer zero).
        let alpha = if self.shape.requant {
            self.alpha as *const c_void
        } else {
            &one as *const u32 as *const c_void
        };
        let c = if self.shape.epilogue.residual { z } else { y };
        // SAFETY: live descriptors; the caller's buffers are sized for this shape and the
        // workspace holds `self.workspace` bytes.
        unsafe {
            lt::matmul(
                h.0,
                self.desc,
                alpha,
                &beta as *const u32 as *const c_void,
                w as *const c_void,
                self.a,
                x as *const c_void,
                self.b,
                c as *const c_void,
                self.c,
                y as *mut c_void,
                self.c,
                &self.algo,
                ws as *mut c_void,
                self.workspace,
                stream as _,
            )
        }
        .map_err(lt_err("matmul"))
    }
}
