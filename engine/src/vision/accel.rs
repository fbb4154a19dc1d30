//! Where an execution context's image work runs: [`Preprocessor::Cpu`] (the reference code in
//! this module's siblings) or [`Preprocessor::Gpu`] (the NVRTC kernels of
//! `backend::cuda::vision`, bit-identical to the CPU). Chosen once, when a model is loaded: models
//! on the CUDA backend get the GPU one, and if its kernels cannot be built the CPU one is used
//! (with a log line saying why).
//!
//! Camera frames convert with the coefficients of [`super::yuv`] (shared with the app's CPU
//! converter).

#[cfg(feature = "cuda")]
use std::sync::{Arc, Mutex};

use image::RgbImage;

use super::yuv::YuvCoeffs;
#[cfg(feature = "cuda")]
use super::{DetectionHead, Task};
use super::{ImageTransform, Overrides, Preprocess, Results, VisionSpec};
use crate::error::Result;
use crate::ir::Tensor;

/// Layout of a raw YUV camera frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YuvLayout {
    /// Packed 4:2:2, Y0 U Y1 V per pixel pair.
    Yuyv,
    /// 4:2:0: a Y plane, then interleaved UV rows; `cubic` = vertical cubic chroma (else nearest).
    Nv12 {
        /// Upsample chroma vertically with a cubic filter (else nearest).
        cubic: bool,
    },
}

/// A borrowed raw YUV frame (`stride` bytes per row of each plane, 0 = tightly packed).
#[derive(Clone, Copy, Debug)]
pub struct YuvFrame<'a> {
    /// Pixel layout.
    pub layout: YuvLayout,
    /// Frame bytes.
    pub data: &'a [u8],
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// Bytes per row (0 = packed).
    pub stride: usize,
}

/// The GPU side of a [`Preprocessor`]: the kernels, one user at a time.
#[cfg(feature = "cuda")]
pub struct GpuVision {
    conv: Mutex<crate::backend::cuda::vision::GpuImageConverter>,
    /// NanoDet decode + NMS kernels (None when they failed to build: the CPU decodes).
    det: Option<GpuDetectorLock>,
}

/// The GPU NanoDet decoder, one user at a time.
#[cfg(feature = "cuda")]
type GpuDetectorLock = Mutex<crate::backend::cuda::detect::GpuDetector>;

/// Preprocessing (and camera-frame conversion) for one model: on the CPU, or on CUDA.
#[derive(Clone, Default)]
pub enum Preprocessor {
    /// `vision::preprocess` on the host; frames are converted by the caller.
    #[default]
    Cpu,
    /// The CUDA kernels, shared (behind a mutex) by every context of a model.
    #[cfg(feature = "cuda")]
    Gpu(Arc<GpuVision>),
}

impl std::fmt::Debug for Preprocessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_gpu() { "Gpu" } else { "Cpu" })
    }
}

impl Preprocessor {
    /// The preprocessor for a model compiled by `backend` ("cpu", "cuda"): the GPU one for CUDA
    /// unless its kernels fail to build on device `ordinal`, in which case the CPU one (logged).
    pub fn for_backend(backend: &str, ordinal: usize) -> Preprocessor {
        if backend != "cuda" {
            return Preprocessor::Cpu;
        }
        Self::gpu(ordinal).unwrap_or_else(|e| {
            tracing::warn!("GPU preprocessing unavailable, using the CPU: {e}");
            Preprocessor::Cpu
        })
    }

    /// The GPU preprocessor on device `ordinal` (errors without a usable CUDA device or build).
    pub fn gpu(ordinal: usize) -> Result<Preprocessor> {
        #[cfg(feature = "cuda")]
        {
            let conv = crate::backend::cuda::vision::GpuImageConverter::new(ordinal)?;
            let det = match crate::backend::cuda::detect::GpuDetector::new(ordinal) {
                Ok(d) => Some(Mutex::new(d)),
                Err(e) => {
                    tracing::warn!("GPU detection decoding unavailable, using the CPU: {e}");
                    None
                }
            };
            Ok(Preprocessor::Gpu(Arc::new(GpuVision {
                conv: Mutex::new(conv),
                det,
            })))
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(crate::error::Error::Unsupported(format!(
                "GPU preprocessing on device {ordinal}: this build has no CUDA backend"
            )))
        }
    }

    /// Whether the work runs on the GPU.
    pub fn is_gpu(&self) -> bool {
        match self {
            Preprocessor::Cpu => false,
            #[cfg(feature = "cuda")]
            Preprocessor::Gpu(_) => true,
        }
    }

    /// RGB image → model input tensor and transform (identical results on either side).
    pub fn preprocess(&self, img: &RgbImage, p: &Preprocess) -> Result<(Tensor, ImageTransform)> {
        match self {
            Preprocessor::Cpu => super::preprocess::preprocess(img, p),
            #[cfg(feature = "cuda")]
            Preprocessor::Gpu(g) => {
                let mut conv = g.conv.lock().unwrap_or_else(|e| e.into_inner());
                conv.preprocess(img.as_raw(), img.width() as usize, img.height() as usize, p)
            }
        }
    }

    /// The GPU NanoDet decoder for `spec` when there is one: the detector, the head's `reg_max`
    /// and strides, and the score threshold in force (none for other heads, the CPU, a detector
    /// that failed to build, or a NaN threshold).
    #[cfg(feature = "cuda")]
    fn gpu_decoder<'a>(
        &'a self,
        spec: &'a VisionSpec,
        overrides: &Overrides,
    ) -> Option<(&'a GpuDetectorLock, usize, &'a [usize], f32)> {
        let (
            Preprocessor::Gpu(g),
            Task::Detection {
                head: DetectionHead::Nanodet { reg_max, strides },
            },
        ) = (self, &spec.task)
        else {
            return None;
        };
        let threshold = overrides.score_threshold.unwrap_or(spec.score_threshold);
        let det = g.det.as_ref().filter(|_| !threshold.is_nan())?;
        Some((det, *reg_max, strides, threshold))
    }

    /// Model outputs → results, as [`super::postprocess`]. On the GPU, NanoDet heads are decoded
    /// and NMS-ed by `backend::cuda::detect` (same detections; the outputs are uploaded from the
    /// host first); everything else, and any GPU failure (logged), uses the CPU.
    pub fn postprocess(
        &self,
        spec: &VisionSpec,
        outputs: &[Tensor],
        transform: &ImageTransform,
        overrides: &Overrides,
    ) -> Result<Results> {
        #[cfg(feature = "cuda")]
        if let Some((det, reg_max, strides, threshold)) = self.gpu_decoder(spec, overrides) {
            let mut det = det.lock().unwrap_or_else(|e| e.into_inner());
            match det.nanodet(spec, outputs, reg_max, strides, threshold, transform) {
                Ok(d) => return Ok(Results::Detections(d)),
                Err(e) => tracing::warn!("GPU NanoDet decoding failed, using the CPU: {e}"),
            }
        }
        super::pipeline::postprocess(spec, outputs, transform, overrides)
    }

    /// Whether [`Self::postprocess_device`] can decode `spec`'s outputs where they were
    /// computed (a NanoDet head, the GPU detector built, and a usable score threshold).
    pub fn decodes_on_device(&self, spec: &VisionSpec, overrides: &Overrides) -> bool {
        #[cfg(feature = "cuda")]
        return self.gpu_decoder(spec, overrides).is_some();
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (spec, overrides);
            false
        }
    }

    /// Model outputs still in device memory → results, decoded and NMS-ed on the GPU so that
    /// only the kept detections come back. Errors (the caller then downloads the outputs and
    /// uses [`Self::postprocess`]) when [`Self::decodes_on_device`] is false or the GPU fails.
    pub fn postprocess_device(
        &self,
        spec: &VisionSpec,
        outputs: &[crate::backend::DeviceOutput],
        transform: &ImageTransform,
        overrides: &Overrides,
    ) -> Result<Results> {
        #[cfg(feature = "cuda")]
        if let Some((det, reg_max, strides, threshold)) = self.gpu_decoder(spec, overrides) {
            let mut det = det.lock().unwrap_or_else(|e| e.into_inner());
            let d = det.nanodet_device(spec, outputs, reg_max, strides, threshold, transform)?;
            return Ok(Results::Detections(d));
        }
        let _ = (spec, outputs, transform, overrides);
        Err(crate::error::Error::Unsupported(
            "no device postprocessing for this model here".into(),
        ))
    }

    /// Converts a YUV frame to RGB on the GPU; `None` on the CPU (the caller converts itself).
    pub fn yuv_to_rgb(&self, f: &YuvFrame<'_>, k: &YuvCoeffs) -> Option<Result<RgbImage>> {
        match self {
            Preprocessor::Cpu => {
                let _ = (f, k);
                None
            }
            #[cfg(feature = "cuda")]
            Preprocessor::Gpu(g) => Some((|| {
                let mut conv = g.conv.lock().unwrap_or_else(|e| e.into_inner());
                let rgb = match f.layout {
                    YuvLayout::Yuyv => conv.yuyv_to_rgb(f.data, f.width, f.height, f.stride, k)?,
                    YuvLayout::Nv12 { cubic } => {
                        conv.nv12_to_rgb(f.data, f.width, f.height, f.stride, k, cubic)?
                    }
                };
                let (w, h) = (
                    u32::try_from(f.width).map_err(|_| too_big(f.width))?,
                    u32::try_from(f.height).map_err(|_| too_big(f.height))?,
                );
                RgbImage::from_raw(w, h, rgb).ok_or_else(|| {
                    crate::error::Error::Image("GPU conversion returned the wrong size".into())
                })
            })()),
        }
    }
}

#[cfg(feature = "cuda")]
fn too_big(v: usize) -> crate::error::Error {
    crate::error::Error::BadInput(format!("frame dimension {v} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vision::ResizeMode;

    #[test]
    fn cpu_models_preprocess_on_the_host() {
        let p = Preprocessor::for_backend("cpu", 0);
        assert!(!p.is_gpu());
        let img = RgbImage::from_fn(5, 3, |x, y| image::Rgb([x as u8 * 40, y as u8 * 90, 7]));
        let spec = Preprocess {
            width: 2,
            height: 2,
            resize: ResizeMode::Stretch,
            scale: 1.0,
            mean: [0.0; 3],
            std: [1.0; 3],
            bgr: false,
        };
        let (t, tr) = p.preprocess(&img, &spec).unwrap();
        let (want, want_tr) = crate::vision::preprocess(&img, &spec).unwrap();
        assert_eq!(t.as_f32().unwrap(), want.as_f32().unwrap());
        assert_eq!(tr, want_tr);
        // Blue is constant 7 everywhere; the host converts YUV frames itself.
        assert!(t.as_f32().unwrap()[8..].iter().all(|&v| v == 7.0));
        let f = YuvFrame {
            layout: YuvLayout::Yuyv,
            data: &[16, 128, 16, 128],
            width: 2,
            height: 1,
            stride: 0,
        };
        let k = crate::vision::yuv::YuvCoeffs::new(
            crate::vision::yuv::YuvMatrix::Bt601,
            crate::vision::yuv::YuvRange::Limited,
        );
        assert!(p.yuv_to_rgb(&f, &k).is_none());
    }
}
