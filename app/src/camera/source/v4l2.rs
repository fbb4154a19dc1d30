//! V4L2 capture with memory-mapped streaming buffers.
//!
//! The device is reached through [`DeviceIo`], a small layer over the V4L2 ioctls: [`SysDevice`]
//! issues the real ioctls (hand-written `#[repr(C)]` mirrors of the kernel UAPI structs, sizes
//! checked at compile time, so no bindgen/libclang is needed), and tests use a fake. The buffer
//! handling ([`V4l2Source`]) — request, map, queue, stream on, poll, dequeue, copy out, re-queue —
//! is the same over both.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{FrameSource, PixelFormat, RawFrame, SourceError, SourceErrorKind, SourceInfo};
use crate::camera::negotiate::{
    negotiate, Choice, DiscreteSize, FrameSizes, OfferedFormat, Request,
};

/// Number of streaming buffers requested.
pub const BUFFERS: u32 = 4;

/// Device identity from VIDIOC_QUERYCAP.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Caps {
    /// Driver name, e.g. "uvcvideo".
    pub driver: String,
    /// Device name as the driver reports it, e.g. the webcam's model.
    pub card: String,
    /// Where the device is attached, e.g. "usb-0000:00:14.0-1".
    pub bus_info: String,
    /// Supports video capture.
    pub capture: bool,
    /// Supports streaming I/O.
    pub streaming: bool,
}

/// The format the driver settled on (VIDIOC_S_FMT's answer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActualFormat {
    /// Pixel format as a V4L2 fourcc, e.g. `*b"YUYV"`.
    pub fourcc: [u8; 4],
    /// Frame width in pixels.
    pub width: u32,
    /// Frame height in pixels.
    pub height: u32,
    /// Bytes per row of the (first) plane, padding included (the stride).
    pub bytes_per_line: u32,
    /// Buffer size one frame needs, in bytes (for MJPEG, an upper bound).
    pub size_image: u32,
}

/// A dequeued buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dequeued {
    /// Index of the buffer among those requested.
    pub index: u32,
    /// Bytes of the buffer filled with frame data.
    pub bytes_used: u32,
    /// The driver flagged the frame as corrupt (V4L2_BUF_FLAG_ERROR).
    pub error: bool,
}

/// The V4L2 operations the capture loop needs; implemented by the real device and by fakes.
pub trait DeviceIo: Send {
    /// VIDIOC_QUERYCAP.
    fn query_caps(&mut self) -> std::io::Result<Caps>;
    /// VIDIOC_ENUM_FMT + ENUM_FRAMESIZES + ENUM_FRAMEINTERVALS.
    fn enum_formats(&mut self) -> std::io::Result<Vec<OfferedFormat>>;
    /// VIDIOC_S_FMT; returns what the driver set.
    fn set_format(
        &mut self,
        fourcc: [u8; 4],
        width: u32,
        height: u32,
    ) -> std::io::Result<ActualFormat>;
    /// VIDIOC_S_PARM; returns the rate the driver set, if it reports one.
    fn set_fps(&mut self, fps: f64) -> std::io::Result<Option<f64>>;
    /// VIDIOC_REQBUFS (MMAP); returns the number granted.
    fn request_buffers(&mut self, count: u32) -> std::io::Result<u32>;
    /// VIDIOC_QUERYBUF + mmap of buffer `index`.
    fn map_buffer(&mut self, index: u32) -> std::io::Result<()>;
    /// The mapped bytes of buffer `index`.
    fn buffer(&self, index: u32) -> &[u8];
    /// VIDIOC_QBUF.
    fn queue(&mut self, index: u32) -> std::io::Result<()>;
    /// VIDIOC_STREAMON / STREAMOFF.
    fn stream(&mut self, on: bool) -> std::io::Result<()>;
    /// poll() for a filled buffer; false on timeout.
    fn wait_frame(&mut self, timeout: Duration) -> std::io::Result<bool>;
    /// VIDIOC_DQBUF.
    fn dequeue(&mut self) -> std::io::Result<Dequeued>;
}

/// Capture from a V4L2 device (real or fake).
pub struct V4l2Source<D: DeviceIo> {
    dev: D,
    info: SourceInfo,
    actual: ActualFormat,
    buffers: u32,
    streaming: bool,
}

fn io_err(ctx: &str) -> impl Fn(std::io::Error) -> SourceError + '_ {
    move |e| SourceError::from_io(ctx, &e)
}

impl V4l2Source<SysDevice> {
    /// Opens a device node and negotiates the request.
    pub fn open_path(path: &Path, req: &Request) -> Result<V4l2Source<SysDevice>, SourceError> {
        let dev = SysDevice::open(path).map_err(io_err(&path.display().to_string()))?;
        V4l2Source::open(dev, req, &path.display().to_string())
    }
}

impl<D: DeviceIo> V4l2Source<D> {
    /// Checks capabilities, negotiates, sets format and rate, maps and queues the buffers and
    /// starts streaming.
    pub fn open(mut dev: D, req: &Request, name: &str) -> Result<V4l2Source<D>, SourceError> {
        let caps = dev.query_caps().map_err(io_err("VIDIOC_QUERYCAP"))?;
        if !caps.capture || !caps.streaming {
            return Err(SourceError::new(
                SourceErrorKind::Format,
                format!("{name} ({}) is not a streaming capture device", caps.card),
            ));
        }
        let offered = dev.enum_formats().map_err(io_err("VIDIOC_ENUM_FMT"))?;
        let choice: Choice =
            negotiate(&offered, req).map_err(|e| SourceError::new(SourceErrorKind::Format, e))?;
        let actual = dev
            .set_format(choice.format.fourcc(), choice.width, choice.height)
            .map_err(io_err("VIDIOC_S_FMT"))?;
        let format = PixelFormat::from_fourcc(actual.fourcc).ok_or_else(|| {
            SourceError::new(
                SourceErrorKind::Format,
                format!(
                    "driver switched to unsupported format {}",
                    String::from_utf8_lossy(&actual.fourcc)
                ),
            )
        })?;
        if actual.width == 0 || actual.height == 0 {
            return Err(SourceError::new(
                SourceErrorKind::Format,
                "driver set a zero frame size",
            ));
        }
        let fps = if choice.fps > 0.0 {
            dev.set_fps(choice.fps).ok().flatten().unwrap_or(choice.fps)
        } else {
            0.0
        };
        let granted = dev
            .request_buffers(BUFFERS)
            .map_err(io_err("VIDIOC_REQBUFS"))?;
        if granted == 0 {
            return Err(SourceError::new(
                SourceErrorKind::Io,
                "driver granted no buffers",
            ));
        }
        for i in 0..granted {
            dev.map_buffer(i).map_err(io_err("mmap"))?;
            dev.queue(i).map_err(io_err("VIDIOC_QBUF"))?;
        }
        dev.stream(true).map_err(io_err("VIDIOC_STREAMON"))?;
        let info = SourceInfo {
            description: format!("{} ({name})", caps.card),
            format,
            width: actual.width,
            height: actual.height,
            fps,
        };
        tracing::info!(
            device = name,
            format = format.name(),
            width = actual.width,
            height = actual.height,
            fps,
            exact = choice.exact,
            "V4L2 format negotiated"
        );
        Ok(V4l2Source {
            dev,
            info,
            actual,
            buffers: granted,
            streaming: true,
        })
    }

    /// Number of mapped buffers.
    pub fn buffer_count(&self) -> u32 {
        self.buffers
    }

    /// The device layer (tests inspect fakes through it).
    pub fn device(&self) -> &D {
        &self.dev
    }

    fn expected_bytes(&self) -> usize {
        let (w, h) = (self.actual.width as usize, self.actual.height as usize);
        let stride = self.actual.bytes_per_line as usize;
        match self.info.format {
            PixelFormat::Mjpeg => 4,
            PixelFormat::Yuyv => stride.max(w * 2) * (h - 1) + w * 2,
            PixelFormat::Nv12 => stride.max(w) * h + stride.max(w) * (h / 2 - 1) + w,
            PixelFormat::Rgb24 => stride.max(w * 3) * (h - 1) + w * 3,
        }
    }
}

impl<D: DeviceIo> FrameSource for V4l2Source<D> {
    fn info(&self) -> SourceInfo {
        self.info.clone()
    }

    fn next_frame(&mut self, timeout: Duration) -> Result<RawFrame, SourceError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.dev.wait_frame(left).map_err(io_err("poll"))? {
                return Err(SourceError::new(
                    SourceErrorKind::Stalled,
                    format!("no frame for {} ms", timeout.as_millis()),
                ));
            }
            let d = self.dev.dequeue().map_err(io_err("VIDIOC_DQBUF"))?;
            if d.index >= self.buffers {
                return Err(SourceError::new(
                    SourceErrorKind::Io,
                    format!("driver returned unknown buffer {}", d.index),
                ));
            }
            let buf = self.dev.buffer(d.index);
            let used = (d.bytes_used as usize).min(buf.len());
            let usable = !d.error && used >= self.expected_bytes();
            let data = usable.then(|| buf[..used].to_vec());
            // Re-queue at once: the copy is ours, the buffer goes back to the driver.
            self.dev.queue(d.index).map_err(io_err("VIDIOC_QBUF"))?;
            if let Some(data) = data {
                let mut f =
                    RawFrame::new(self.info.format, self.info.width, self.info.height, data);
                f.stride = self.actual.bytes_per_line as usize;
                if f.format == PixelFormat::Mjpeg {
                    f.stride = 0;
                }
                return Ok(f);
            }
            // A corrupt or short frame: skip it, unless time is up.
            if Instant::now() >= deadline {
                return Err(SourceError::new(
                    SourceErrorKind::Format,
                    "only corrupt or short frames within the stall timeout",
                ));
            }
        }
    }
}

impl<D: DeviceIo> Drop for V4l2Source<D> {
    fn drop(&mut self) {
        if self.streaming {
            let _ = self.dev.stream(false);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The real device: raw ioctls on the kernel UAPI structs.

mod sys {
    #![allow(non_camel_case_types, dead_code)]

    pub const BUF_TYPE_VIDEO_CAPTURE: u32 = 1;
    pub const MEMORY_MMAP: u32 = 1;
    pub const CAP_VIDEO_CAPTURE: u32 = 0x0000_0001;
    pub const CAP_STREAMING: u32 = 0x0400_0000;
    pub const CAP_DEVICE_CAPS: u32 = 0x8000_0000;
    pub const FRMSIZE_TYPE_DISCRETE: u32 = 1;
    pub const FRMIVAL_TYPE_DISCRETE: u32 = 1;
    pub const BUF_FLAG_ERROR: u32 = 0x0000_0040;

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct v4l2_capability {
        pub driver: [u8; 16],
        pub card: [u8; 32],
        pub bus_info: [u8; 32],
        pub version: u32,
        pub capabilities: u32,
        pub device_caps: u32,
        pub reserved: [u32; 3],
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct v4l2_fmtdesc {
        pub index: u32,
        pub type_: u32,
        pub flags: u32,
        pub description: [u8; 32],
        pub pixelformat: u32,
        pub mbus_code: u32,
        pub reserved: [u32; 3],
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct v4l2_frmsizeenum {
        pub index: u32,
        pub pixel_format: u32,
        pub type_: u32,
        /// discrete: [w, h]; stepwise: [min_w, max_w, step_w, min_h, max_h, step_h].
        pub u: [u32; 6],
        pub reserved: [u32; 2],
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct v4l2_frmivalenum {
        pub index: u32,
        pub pixel_format: u32,
        pub width: u32,
        pub height: u32,
        pub type_: u32,
        /// discrete: [num, den]; stepwise: min, max, step fractions.
        pub u: [u32; 6],
        pub reserved: [u32; 2],
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct v4l2_pix_format {
        pub width: u32,
        pub height: u32,
        pub pixelformat: u32,
        pub field: u32,
        pub bytesperline: u32,
        pub sizeimage: u32,
        pub colorspace: u32,
        pub priv_: u32,
        pub flags: u32,
        pub ycbcr_enc: u32,
        pub quantization: u32,
        pub xfer_func: u32,
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub union v4l2_format_union {
        pub pix: v4l2_pix_format,
        pub raw_data: [u8; 200],
        /// The kernel union holds pointers (v4l2_window): 8-byte aligned on 64-bit.
        pub align: [u64; 25],
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct v4l2_format {
        pub type_: u32,
        pub fmt: v4l2_format_union,
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct v4l2_requestbuffers {
        pub count: u32,
        pub type_: u32,
        pub memory: u32,
        pub capabilities: u32,
        pub flags: u8,
        pub reserved: [u8; 3],
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct v4l2_timecode {
        pub type_: u32,
        pub flags: u32,
        pub frames: u8,
        pub seconds: u8,
        pub minutes: u8,
        pub hours: u8,
        pub userbits: [u8; 4],
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub union v4l2_buffer_m {
        pub offset: u32,
        pub userptr: libc::c_ulong,
        pub fd: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct v4l2_buffer {
        pub index: u32,
        pub type_: u32,
        pub bytesused: u32,
        pub flags: u32,
        pub field: u32,
        pub timestamp: libc::timeval,
        pub timecode: v4l2_timecode,
        pub sequence: u32,
        pub memory: u32,
        pub m: v4l2_buffer_m,
        pub length: u32,
        pub reserved2: u32,
        pub request_fd: i32,
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct v4l2_captureparm {
        pub capability: u32,
        pub capturemode: u32,
        pub timeperframe: [u32; 2],
        pub extendedmode: u32,
        pub readbuffers: u32,
        pub reserved: [u32; 4],
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub union v4l2_streamparm_union {
        pub capture: v4l2_captureparm,
        pub raw_data: [u8; 200],
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct v4l2_streamparm {
        pub type_: u32,
        pub parm: v4l2_streamparm_union,
    }

    // The kernel's sizes on LP64 targets (x86_64, aarch64): a mismatch fails the build.
    #[cfg(target_pointer_width = "64")]
    const _: () = {
        assert!(std::mem::size_of::<v4l2_capability>() == 104);
        assert!(std::mem::size_of::<v4l2_fmtdesc>() == 64);
        assert!(std::mem::size_of::<v4l2_frmsizeenum>() == 44);
        assert!(std::mem::size_of::<v4l2_frmivalenum>() == 52);
        assert!(std::mem::size_of::<v4l2_format>() == 208);
        assert!(std::mem::size_of::<v4l2_requestbuffers>() == 20);
        assert!(std::mem::size_of::<v4l2_buffer>() == 88);
        assert!(std::mem::size_of::<v4l2_streamparm>() == 204);
    };

    const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
        (dir << 30) | ((size as u64) << 16) | ((b'V' as u64) << 8) | nr
    }
    const R: u64 = 2;
    const W: u64 = 1;
    const RW: u64 = 3;
    pub const VIDIOC_QUERYCAP: u64 = ioc(R, 0, std::mem::size_of::<v4l2_capability>());
    pub const VIDIOC_ENUM_FMT: u64 = ioc(RW, 2, std::mem::size_of::<v4l2_fmtdesc>());
    pub const VIDIOC_S_FMT: u64 = ioc(RW, 5, std::mem::size_of::<v4l2_format>());
    pub const VIDIOC_REQBUFS: u64 = ioc(RW, 8, std::mem::size_of::<v4l2_requestbuffers>());
    pub const VIDIOC_QUERYBUF: u64 = ioc(RW, 9, std::mem::size_of::<v4l2_buffer>());
    pub const VIDIOC_QBUF: u64 = ioc(RW, 15, std::mem::size_of::<v4l2_buffer>());
    pub const VIDIOC_DQBUF: u64 = ioc(RW, 17, std::mem::size_of::<v4l2_buffer>());
    pub const VIDIOC_STREAMON: u64 = ioc(W, 18, std::mem::size_of::<i32>());
    pub const VIDIOC_STREAMOFF: u64 = ioc(W, 19, std::mem::size_of::<i32>());
    pub const VIDIOC_S_PARM: u64 = ioc(RW, 22, std::mem::size_of::<v4l2_streamparm>());
    pub const VIDIOC_ENUM_FRAMESIZES: u64 = ioc(RW, 74, std::mem::size_of::<v4l2_frmsizeenum>());
    pub const VIDIOC_ENUM_FRAMEINTERVALS: u64 =
        ioc(RW, 75, std::mem::size_of::<v4l2_frmivalenum>());
}

/// A zero-initialised UAPI struct (all of them are plain data for which zero is valid).
fn zeroed<T: Copy>() -> T {
    // SAFETY: only used with the `#[repr(C)]` integer/array/union structs of `sys`, for which the
    // all-zero bit pattern is a valid value (as the kernel API expects before each call).
    unsafe { std::mem::zeroed() }
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

/// An open V4L2 device node.
pub struct SysDevice {
    fd: OwnedFd,
    maps: Vec<Mapping>,
}

// SAFETY: the mappings are owned by this value and only touched through `&self`/`&mut self`.
unsafe impl Send for SysDevice {}

impl SysDevice {
    /// Opens the node read-write, non-blocking.
    pub fn open(path: &Path) -> std::io::Result<SysDevice> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))?;
        // SAFETY: a valid NUL-terminated path; the returned fd is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a freshly opened descriptor we own.
        Ok(SysDevice {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            maps: Vec::new(),
        })
    }

    fn ioctl<T>(&self, req: u64, arg: &mut T) -> std::io::Result<()> {
        loop {
            // SAFETY: `req` encodes sizeof(T) and `arg` points to a live, properly laid out T.
            let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, arg as *mut T) };
            if r >= 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn intervals(&self, code: u32, w: u32, h: u32) -> Vec<f64> {
        let mut out = Vec::new();
        for index in 0..64 {
            let mut iv: sys::v4l2_frmivalenum = zeroed();
            iv.index = index;
            iv.pixel_format = code;
            iv.width = w;
            iv.height = h;
            if self
                .ioctl(sys::VIDIOC_ENUM_FRAMEINTERVALS, &mut iv)
                .is_err()
            {
                break;
            }
            let (num, den) = (iv.u[0], iv.u[1]);
            if num > 0 {
                out.push(f64::from(den) / f64::from(num));
            }
            if iv.type_ != sys::FRMIVAL_TYPE_DISCRETE {
                // Stepwise: u = min, max, step; report min and max intervals as rates.
                if iv.u[2] > 0 {
                    out.push(f64::from(iv.u[3]) / f64::from(iv.u[2]));
                }
                break;
            }
        }
        out
    }
}

impl Drop for SysDevice {
    fn drop(&mut self) {
        for m in self.maps.drain(..) {
            // SAFETY: each mapping came from a successful mmap of exactly `len` bytes.
            unsafe { libc::munmap(m.ptr, m.len) };
        }
    }
}

impl DeviceIo for SysDevice {
    fn query_caps(&mut self) -> std::io::Result<Caps> {
        let mut c: sys::v4l2_capability = zeroed();
        self.ioctl(sys::VIDIOC_QUERYCAP, &mut c)?;
        let caps = if c.capabilities & sys::CAP_DEVICE_CAPS != 0 {
            c.device_caps
        } else {
            c.capabilities
        };
        Ok(Caps {
            driver: cstr(&c.driver),
            card: cstr(&c.card),
            bus_info: cstr(&c.bus_info),
            capture: caps & sys::CAP_VIDEO_CAPTURE != 0,
            streaming: caps & sys::CAP_STREAMING != 0,
        })
    }

    fn enum_formats(&mut self) -> std::io::Result<Vec<OfferedFormat>> {
        let mut out = Vec::new();
        for index in 0..64 {
            let mut d: sys::v4l2_fmtdesc = zeroed();
            d.index = index;
            d.type_ = sys::BUF_TYPE_VIDEO_CAPTURE;
            if let Err(e) = self.ioctl(sys::VIDIOC_ENUM_FMT, &mut d) {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    break;
                }
                return Err(e);
            }
            let code = d.pixelformat;
            let mut sizes = Vec::new();
            let mut stepwise = None;
            for si in 0..256 {
                let mut s: sys::v4l2_frmsizeenum = zeroed();
                s.index = si;
                s.pixel_format = code;
                if self.ioctl(sys::VIDIOC_ENUM_FRAMESIZES, &mut s).is_err() {
                    break;
                }
                if s.type_ == sys::FRMSIZE_TYPE_DISCRETE {
                    let (w, h) = (s.u[0], s.u[1]);
                    sizes.push(DiscreteSize {
                        width: w,
                        height: h,
                        fps: self.intervals(code, w, h),
                    });
                } else {
                    let u = s.u;
                    stepwise = Some(FrameSizes::Stepwise {
                        min_width: u[0],
                        max_width: u[1],
                        step_width: u[2],
                        min_height: u[3],
                        max_height: u[4],
                        step_height: u[5],
                        fps: self.intervals(code, u[1], u[4]),
                    });
                    break;
                }
            }
            let fourcc = code.to_le_bytes();
            out.push(OfferedFormat {
                fourcc: String::from_utf8_lossy(&fourcc).into_owned(),
                description: cstr(&d.description),
                format: PixelFormat::from_fourcc(fourcc),
                sizes: stepwise.unwrap_or(FrameSizes::Discrete(sizes)),
            });
        }
        Ok(out)
    }

    fn set_format(
        &mut self,
        fourcc: [u8; 4],
        width: u32,
        height: u32,
    ) -> std::io::Result<ActualFormat> {
        let mut f: sys::v4l2_format = zeroed();
        f.type_ = sys::BUF_TYPE_VIDEO_CAPTURE;
        let mut pix: sys::v4l2_pix_format = zeroed();
        pix.width = width;
        pix.height = height;
        pix.pixelformat = u32::from_le_bytes(fourcc);
        pix.field = 1; // V4L2_FIELD_NONE (progressive)
        f.fmt.pix = pix;
        self.ioctl(sys::VIDIOC_S_FMT, &mut f)?;
        // SAFETY: the driver filled `pix` for a capture type.
        let p = unsafe { f.fmt.pix };
        Ok(ActualFormat {
            fourcc: p.pixelformat.to_le_bytes(),
            width: p.width,
            height: p.height,
            bytes_per_line: p.bytesperline,
            size_image: p.sizeimage,
        })
    }

    fn set_fps(&mut self, fps: f64) -> std::io::Result<Option<f64>> {
        let mut p: sys::v4l2_streamparm = zeroed();
        p.type_ = sys::BUF_TYPE_VIDEO_CAPTURE;
        let mut cap: sys::v4l2_captureparm = zeroed();
        cap.timeperframe = [1000, (fps * 1000.0).round() as u32];
        p.parm.capture = cap;
        self.ioctl(sys::VIDIOC_S_PARM, &mut p)?;
        // SAFETY: the driver filled `capture`.
        let [num, den] = unsafe { p.parm.capture.timeperframe };
        Ok((num > 0).then(|| f64::from(den) / f64::from(num)))
    }

    fn request_buffers(&mut self, count: u32) -> std::io::Result<u32> {
        let mut r: sys::v4l2_requestbuffers = zeroed();
        r.count = count;
        r.type_ = sys::BUF_TYPE_VIDEO_CAPTURE;
        r.memory = sys::MEMORY_MMAP;
        self.ioctl(sys::VIDIOC_REQBUFS, &mut r)?;
        Ok(r.count)
    }

    fn map_buffer(&mut self, index: u32) -> std::io::Result<()> {
        let mut b: sys::v4l2_buffer = zeroed();
        b.index = index;
        b.type_ = sys::BUF_TYPE_VIDEO_CAPTURE;
        b.memory = sys::MEMORY_MMAP;
        self.ioctl(sys::VIDIOC_QUERYBUF, &mut b)?;
        let len = b.length as usize;
        // SAFETY: the offset comes from QUERYBUF for this fd; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                b.m.offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        if self.maps.len() != index as usize {
            // SAFETY: just mapped above.
            unsafe { libc::munmap(ptr, len) };
            return Err(std::io::Error::other(
                "buffers must be mapped in index order",
            ));
        }
        self.maps.push(Mapping { ptr, len });
        Ok(())
    }

    fn buffer(&self, index: u32) -> &[u8] {
        match self.maps.get(index as usize) {
            // SAFETY: a live mapping of `len` bytes; the driver does not write it while dequeued.
            Some(m) => unsafe { std::slice::from_raw_parts(m.ptr as *const u8, m.len) },
            None => &[],
        }
    }

    fn queue(&mut self, index: u32) -> std::io::Result<()> {
        let mut b: sys::v4l2_buffer = zeroed();
        b.index = index;
        b.type_ = sys::BUF_TYPE_VIDEO_CAPTURE;
        b.memory = sys::MEMORY_MMAP;
        self.ioctl(sys::VIDIOC_QBUF, &mut b)
    }

    fn stream(&mut self, on: bool) -> std::io::Result<()> {
        let mut t: i32 = sys::BUF_TYPE_VIDEO_CAPTURE as i32;
        let req = if on {
            sys::VIDIOC_STREAMON
        } else {
            sys::VIDIOC_STREAMOFF
        };
        self.ioctl(req, &mut t)
    }

    fn wait_frame(&mut self, timeout: Duration) -> std::io::Result<bool> {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        if p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            return Err(std::io::Error::from_raw_os_error(libc::ENODEV));
        }
        Ok(r > 0)
    }

    fn dequeue(&mut self) -> std::io::Result<Dequeued> {
        let mut b: sys::v4l2_buffer = zeroed();
        b.type_ = sys::BUF_TYPE_VIDEO_CAPTURE;
        b.memory = sys::MEMORY_MMAP;
        self.ioctl(sys::VIDIOC_DQBUF, &mut b)?;
        Ok(Dequeued {
            index: b.index,
            bytes_used: b.bytesused,
            error: b.flags & sys::BUF_FLAG_ERROR != 0,
        })
    }
}

/// A capture device found by [`list_devices`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct DeviceListing {
    /// Device node, e.g. `/dev/video0`.
    pub path: PathBuf,
    /// Stable `/dev/v4l/by-id` aliases pointing at it.
    pub by_id: Vec<PathBuf>,
    /// Capabilities from VIDIOC_QUERYCAP (`None` when the device could not be queried).
    pub caps: Option<Caps>,
    /// Formats and sizes offered (empty when the device could not be queried).
    pub formats: Vec<OfferedFormat>,
    /// Set when the device could not be queried.
    pub error: Option<String>,
}

/// Lists `/dev/video*` nodes with their capabilities and formats.
pub fn list_devices() -> Vec<DeviceListing> {
    let mut nodes: Vec<PathBuf> = std::fs::read_dir("/dev")
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("video"))
                })
                .collect()
        })
        .unwrap_or_default();
    nodes.sort();
    let aliases: Vec<(PathBuf, PathBuf)> = std::fs::read_dir("/dev/v4l/by-id")
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter_map(|p| std::fs::canonicalize(&p).ok().map(|t| (p, t)))
                .collect()
        })
        .unwrap_or_default();
    nodes
        .into_iter()
        .map(|path| {
            let by_id = aliases
                .iter()
                .filter(|(_, t)| *t == path)
                .map(|(a, _)| a.clone())
                .collect();
            let mut l = DeviceListing {
                path: path.clone(),
                by_id,
                caps: None,
                formats: Vec::new(),
                error: None,
            };
            match SysDevice::open(&path).and_then(|mut d| Ok((d.query_caps()?, d.enum_formats()?)))
            {
                Ok((caps, formats)) => {
                    l.caps = Some(caps);
                    l.formats = formats;
                }
                Err(e) => l.error = Some(e.to_string()),
            }
            l
        })
        .collect()
}
