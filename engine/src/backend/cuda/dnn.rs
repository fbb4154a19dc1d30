//! cuDNN and cuBLAS handles and descriptors as RAII wrappers, and the per-shape convolution
//! algorithm cache.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::cudnn::{result as dnn, sys as dnn_sys};

use crate::error::{Error, Result};

/// Maps a cuDNN error.
pub fn dnn_err(what: &str) -> impl Fn(dnn::CudnnError) -> Error + '_ {
    move |e| Error::Unsupported(format!("cuDNN {what} failed: {e:?}"))
}

/// Maps a cuBLAS error.
pub fn blas_err(what: &str) -> impl Fn(blas::CublasError) -> Error + '_ {
    move |e| Error::Unsupported(format!("cuBLAS {what} failed: {e:?}"))
}

/// A cuDNN handle bound to one stream.
pub struct DnnHandle(pub dnn_sys::cudnnHandle_t);
// SAFETY: the handle is used by one context (one thread at a time, `&mut` access).
unsafe impl Send for DnnHandle {}

impl DnnHandle {
    /// Creates a handle issuing work on `stream`.
    pub fn new(stream: cudarc::driver::sys::CUstream) -> Result<Self> {
        let h = dnn::create_handle().map_err(dnn_err("handle creation"))?;
        // SAFETY: fresh handle, live stream.
        unsafe { dnn::set_stream(h, stream as *mut _) }.map_err(dnn_err("set stream"))?;
        Ok(DnnHandle(h))
    }
}

impl Drop for DnnHandle {
    fn drop(&mut self) {
        // SAFETY: created by create_handle, destroyed once.
        let _ = unsafe { dnn::destroy_handle(self.0) };
    }
}

/// A cuBLAS handle bound to one stream, with a caller-provided workspace.
pub struct BlasHandle(pub blas_sys::cublasHandle_t);
// SAFETY: as for DnnHandle.
unsafe impl Send for BlasHandle {}

impl BlasHandle {
    /// Creates a handle on `stream` using `ws` (device bytes) as its workspace.
    pub fn new(stream: cudarc::driver::sys::CUstream, ws: u64, ws_bytes: usize) -> Result<Self> {
        let h = blas::create_handle().map_err(blas_err("handle creation"))?;
        // SAFETY: fresh handle, live stream and workspace owned by the caller's arena.
        unsafe {
            blas::set_stream(h, stream as *mut _).map_err(blas_err("set stream"))?;
            blas_sys::cublasSetWorkspace_v2(h, ws as *mut _, ws_bytes)
                .result()
                .map_err(blas_err("set workspace"))?;
        }
        Ok(BlasHandle(h))
    }
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        // SAFETY: created by create_handle, destroyed once.
        let _ = unsafe { blas::destroy_handle(self.0) };
    }
}

/// The immutable cuDNN descriptors of one convolution (shared by all contexts).
pub struct ConvDescs {
    pub x: dnn_sys::cudnnTensorDescriptor_t,
    pub y: dnn_sys::cudnnTensorDescriptor_t,
    pub bias: dnn_sys::cudnnTensorDescriptor_t,
    pub w: dnn_sys::cudnnFilterDescriptor_t,
    pub conv: dnn_sys::cudnnConvolutionDescriptor_t,
    pub act: dnn_sys::cudnnActivationDescriptor_t,
}
// SAFETY: the descriptors are plain cuDNN objects owned by this value; one context (one thread
// at a time) uses them. Not `Sync`: cuDNN may keep state in a descriptor, so concurrently
// running contexts each build their own (`ConvStep::descs`).
unsafe impl Send for ConvDescs {}

/// Convolution geometry in cuDNN's terms (logical NCHW dims, symmetric pads).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvGeom {
    pub nhwc: bool,
    pub x: [i32; 4],
    pub w: [i32; 4],
    pub y: [i32; 4],
    pub pad: [i32; 2],
    pub stride: [i32; 2],
    pub dilation: [i32; 2],
    pub group: i32,
    /// Half data with float accumulation on tensor cores (else float data, FMA math).
    pub half: bool,
}

impl ConvDescs {
    /// Builds the descriptors for `geom`: fp32 data with FMA math (so results match the CPU),
    /// or half data with float compute on tensor cores.
    pub fn new(geom: &ConvGeom) -> Result<Self> {
        let fmt = if geom.nhwc {
            dnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
        } else {
            dnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW
        };
        let f32t = dnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
        let dt = if geom.half {
            dnn_sys::cudnnDataType_t::CUDNN_DATA_HALF
        } else {
            f32t
        };
        let math = if geom.half {
            dnn_sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
        } else {
            dnn_sys::cudnnMathType_t::CUDNN_FMA_MATH
        };
        let d = ConvDescs {
            x: dnn::create_tensor_descriptor().map_err(dnn_err("descriptor"))?,
            y: dnn::create_tensor_descriptor().map_err(dnn_err("descriptor"))?,
            bias: dnn::create_tensor_descriptor().map_err(dnn_err("descriptor"))?,
            w: dnn::create_filter_descriptor().map_err(dnn_err("descriptor"))?,
            conv: dnn::create_convolution_descriptor().map_err(dnn_err("descriptor"))?,
            act: dnn::create_activation_descriptor().map_err(dnn_err("descriptor"))?,
        };
        // SAFETY: freshly created descriptors.
        unsafe {
            dnn::set_tensor4d_descriptor(d.x, fmt, dt, geom.x).map_err(dnn_err("x desc"))?;
            dnn::set_tensor4d_descriptor(d.y, fmt, dt, geom.y).map_err(dnn_err("y desc"))?;
            dnn::set_tensor4d_descriptor(
                d.bias,
                dnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                dt,
                [1, geom.y[1], 1, 1],
            )
            .map_err(dnn_err("bias desc"))?;
            dnn::set_filter4d_descriptor(d.w, dt, fmt, geom.w).map_err(dnn_err("w desc"))?;
            dnn::set_convolution2d_descriptor(
                d.conv,
                geom.pad[0],
                geom.pad[1],
                geom.stride[0],
                geom.stride[1],
                geom.dilation[0],
                geom.dilation[1],
                dnn_sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                f32t,
            )
            .map_err(dnn_err("conv desc"))?;
            dnn::set_convolution_group_count(d.conv, geom.group).map_err(dnn_err("groups"))?;
            dnn::set_convolution_math_type(d.conv, math).map_err(dnn_err("math type"))?;
            dnn::set_activation_descriptor(
                d.act,
                dnn_sys::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
                dnn_sys::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
                0.0,
            )
            .map_err(dnn_err("activation desc"))?;
        }
        Ok(d)
    }
}

impl Drop for ConvDescs {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created in `new` and is destroyed once.
        unsafe {
            let _ = dnn::destroy_tensor_descriptor(self.x);
            let _ = dnn::destroy_tensor_descriptor(self.y);
            let _ = dnn::destroy_tensor_descriptor(self.bias);
            let _ = dnn::destroy_filter_descriptor(self.w);
            let _ = dnn::destroy_convolution_descriptor(self.conv);
            let _ = dnn_sys::cudnnDestroyActivationDescriptor(self.act);
        }
    }
}

/// A benchmarked algorithm: its workspace size, measured time and math type.
#[derive(Clone, Copy, Debug)]
pub struct AlgoChoice {
    pub algo: dnn_sys::cudnnConvolutionFwdAlgo_t,
    pub workspace: usize,
    /// Milliseconds cudnnFind measured.
    pub time_ms: f32,
    pub math: dnn_sys::cudnnMathType_t,
}

impl ConvDescs {
    /// Sets the fused activation used by `cudnnConvolutionBiasActivationForward`.
    pub fn set_activation(&self, mode: dnn_sys::cudnnActivationMode_t, coef: f64) -> Result<()> {
        // SAFETY: a live descriptor owned by self.
        unsafe {
            dnn::set_activation_descriptor(
                self.act,
                mode,
                dnn_sys::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
                coef,
            )
        }
        .map_err(dnn_err("activation desc"))
    }

    /// Sets the math type the chosen algorithm was measured with.
    pub fn set_math(&self, math: dnn_sys::cudnnMathType_t) -> Result<()> {
        // SAFETY: a live descriptor owned by self.
        unsafe { dnn::set_convolution_math_type(self.conv, math) }.map_err(dnn_err("math type"))
    }
}

/// The cuDNN library version (e.g. 91400).
pub fn cudnn_version() -> usize {
    // SAFETY: a plain query.
    unsafe { dnn_sys::cudnnGetVersion() }
}

type AlgoCache = Mutex<HashMap<ConvGeom, Vec<AlgoChoice>>>;

fn cache() -> &'static AlgoCache {
    static C: OnceLock<AlgoCache> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Number of convolution shapes whose algorithm has been chosen (benchmarked) in this process.
pub fn algo_cache_len() -> usize {
    cache().lock().map(|c| c.len()).unwrap_or(0)
}

/// Benchmarks (once per shape, process-wide) the algorithms by running the candidates on the
/// given buffers (cudnnFindConvolutionForwardAlgorithmEx); usable ones, fastest first.
#[allow(clippy::too_many_arguments)]
pub fn choose_algo(
    h: &DnnHandle,
    geom: &ConvGeom,
    d: &ConvDescs,
    x: u64,
    w: u64,
    y: u64,
    ws: u64,
    ws_limit: usize,
) -> Result<Vec<AlgoChoice>> {
    if let Some(c) = cache().lock().ok().and_then(|c| c.get(geom).cloned()) {
        return Ok(c);
    }
    const N: usize = 16;
    let mut count = 0i32;
    // SAFETY: zeroed plain-old-data result structs.
    let mut perf: [dnn_sys::cudnnConvolutionFwdAlgoPerf_t; N] = unsafe { std::mem::zeroed() };
    // SAFETY: descriptors and buffers are valid and sized for this convolution.
    unsafe {
        dnn_sys::cudnnFindConvolutionForwardAlgorithmEx(
            h.0,
            d.x,
            x as *const _,
            d.w,
            w as *const _,
            d.conv,
            d.y,
            y as *mut _,
            N as i32,
            &mut count,
            perf.as_mut_ptr(),
            ws as *mut _,
            ws_limit,
        )
        .result()
        .map_err(dnn_err("algorithm search"))?;
    }
    let c: Vec<AlgoChoice> = perf[..(count.max(0) as usize).min(N)]
        .iter()
        .filter(|p| {
            p.status == dnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS && p.memory <= ws_limit
        })
        .map(|p| AlgoChoice {
            algo: p.algo,
            workspace: p.memory,
            time_ms: p.time,
            math: p.mathType,
        })
        .collect();
    if c.is_empty() {
        return Err(Error::Unsupported(format!(
            "cuDNN has no algorithm for convolution {geom:?}"
        )));
    }
    // cudnnFind runs each candidate once, so a kernel's first (lazy module load) launch is in
    // its time: it then prefers kernels an earlier search already loaded (the slow non-tensor-op
    // implicit GEMM for fp16 1x1 convolutions). Re-time every candidate after warm-up runs.
    let mut c = c;
    for a in c.iter_mut() {
        if let Ok(t) = time_algo(h, d, a, x, w, y, ws) {
            a.time_ms = t;
        } else {
            a.time_ms = f32::INFINITY;
        }
    }
    c.retain(|a| a.time_ms.is_finite());
    c.sort_by(|a, b| a.time_ms.total_cmp(&b.time_ms));
    if c.is_empty() {
        return Err(Error::Unsupported(format!(
            "cuDNN: no algorithm ran for convolution {geom:?}"
        )));
    }
    if let Ok(mut m) = cache().lock() {
        m.insert(geom.clone(), c.clone());
    }
    Ok(c)
}

/// Mean device milliseconds of `run` on `stream`: two warm-up calls, then eight timed between
/// two CUDA events (the algorithm searches of cuDNN and cuBLASLt both use it).
pub fn time_warm(
    stream: cudarc::driver::sys::CUstream,
    run: impl Fn() -> Result<()>,
) -> Result<f32> {
    use cudarc::driver::result as drv;
    use cudarc::driver::sys as dsys;
    const REPS: usize = 8;
    let drv_e = |e: drv::DriverError| Error::Unsupported(format!("CUDA event: {e}"));
    let e0 = drv::event::create(dsys::CUevent_flags::CU_EVENT_DEFAULT).map_err(drv_e)?;
    let e1 = match drv::event::create(dsys::CUevent_flags::CU_EVENT_DEFAULT) {
        Ok(e) => e,
        Err(e) => {
            // SAFETY: created above, destroyed once.
            let _ = unsafe { drv::event::destroy(e0) };
            return Err(drv_e(e));
        }
    };
    let r = (|| -> Result<f32> {
        run()?;
        run()?;
        // SAFETY: live events and stream.
        unsafe { drv::event::record(e0, stream) }.map_err(drv_e)?;
        for _ in 0..REPS {
            run()?;
        }
        // SAFETY: as above.
        unsafe {
            drv::event::record(e1, stream).map_err(drv_e)?;
            drv::event::synchronize(e1).map_err(drv_e)?;
            drv::event::elapsed(e0, e1).map_err(drv_e)
        }
        .map(|t| t / REPS as f32)
    })();
    // SAFETY: created above, destroyed once; synchronised (or never recorded) by now.
    unsafe {
        let _ = drv::event::synchronize(e1);
        let _ = drv::event::destroy(e0);
        let _ = drv::event::destroy(e1);
    }
    r
}

/// Mean milliseconds of one convolution with algorithm `a` on the given buffers (warm; see
/// [`time_warm`]) on the handle's stream.
#[allow(clippy::too_many_arguments)]
fn time_algo(
    h: &DnnHandle,
    d: &ConvDescs,
    a: &AlgoChoice,
    x: u64,
    w: u64,
    y: u64,
    ws: u64,
) -> Result<f32> {
    d.set_math(a.math)?;
    let mut stream: dnn_sys::cudaStream_t = std::ptr::null_mut();
    // SAFETY: a live handle.
    unsafe { dnn_sys::cudnnGetStream(h.0, &mut stream) }
        .result()
        .map_err(dnn_err("get stream"))?;
    let (one, zero) = (1f32, 0f32);
    time_warm(stream as cudarc::driver::sys::CUstream, || {
        // SAFETY: descriptors and buffers are valid and sized for this convolution.
        unsafe {
            dnn::convolution_forward(
                h.0,
                &one as *const f32 as *const std::ffi::c_void,
                d.x,
                x as *const _,
                d.w,
                w as *const _,
                d.conv,
                a.algo,
                ws as *mut _,
                a.workspace,
                &zero as *const f32 as *const std::ffi::c_void,
                d.y,
                y as *mut _,
            )
        }
        .map_err(dnn_err("convolution (timing)"))
    })
}
