//! The camera pipeline end to end: the MJPEG recording at full speed through the real NanoDet
//! model (every frame inferred or counted as dropped; results identical to `vigil infer`'s
//! engine path on the same JPEG), the same file played serially (24 frames, each inferred, equal to
//! `vision::infer_image` and to the `vigil infer` binary's JSON), and reconnects after ENODEV
//! mid-stream and after stalls.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vigil::camera::config::{CameraConfig, SourceKind};
use vigil::camera::pipeline::{
    start_camera, CameraHandle, CameraState, FrameInfer, FrameTimings, Transform,
};
use vigil::camera::source::mjpeg_file::MjpegReader;
use vigil::camera::source::test_pattern::TestPattern;
use vigil::camera::source::{
    factory_for, FrameSource, RawFrame, SourceError, SourceErrorKind, SourceFactory, SourceInfo,
};
use vigil::config::{default_models, Limits};
use vigil::registry::{load_model, model_options};
use vigil_engine::vision::{self, DecodeLimits, Overrides, Results, VisionSpec};

fn shared(rel: &str) -> PathBuf {
    let base = std::env::var_os("VIGIL_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    let p = base.join(rel);
    assert!(
        p.exists(),
        "shared test data {} is missing; expected ../shared beside the repository",
        p.display()
    );
    p
}

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models")
}

fn wait_for(what: &str, cam: &CameraHandle, mut cond: impl FnMut(&CameraHandle) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cond(cam) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; status {:?}",
            cam.summary()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn mjpeg_recording_at_full_speed_matches_the_engine_path() {
    let path = shared("camera/vtest-640x480-10fps.mjpeg");
    let mcfg = default_models(&models_dir())
        .into_iter()
        .find(|m| m.name == "nanodet-m-416")
        .unwrap();
    let mut opts = model_options(&mcfg);
    opts.threads = 1;
    let (model, spec) = load_model(&mcfg, &opts).unwrap();
    let mut cam = CameraConfig::new("rec", SourceKind::MjpegFile, "nanodet-m-416");
    cam.path = Some(path.clone());
    cam.realtime = false;
    cam.looping = false;
    let max_pixels = Limits::default().max_pixels;
    let transform = Transform {
        infer: Box::new(model.new_context().unwrap()),
        spec: spec.clone(),
        max_pixels,
    };
    let handle = start_camera(cam.clone(), factory_for(&cam, max_pixels), transform).unwrap();
    let mut events = handle.subscribe();
    wait_for("the recording to finish", &handle, |c| {
        c.status().state == CameraState::Finished
    });
    handle.stop();
    let s = handle.summary();
    println!(
        "recording at full speed: captured {}, inferred {}, dropped {}, failed {}",
        s.frames_captured, s.frames_inferred, s.frames_dropped, s.frames_failed
    );
    assert_eq!(s.frames_captured, 300);
    assert_eq!(s.frames_failed, 0);
    assert_eq!(
        s.frames_inferred + s.frames_dropped,
        300,
        "every frame is inferred or dropped"
    );
    assert!(s.frames_inferred >= 1);

    // Every inferred frame's results equal vision::infer_image on the same JPEG bytes.
    let mut reader = MjpegReader::new(std::fs::File::open(&path).unwrap());
    let mut jpegs = Vec::new();
    while let Some(j) = reader.next_jpeg().unwrap() {
        jpegs.push(j);
    }
    assert_eq!(jpegs.len(), 300);
    let mut ctx = model.new_context().unwrap();
    let mut seen = Vec::new();
    while let Ok(r) = events.try_recv() {
        seen.push(r);
    }
    assert_eq!(
        seen.len() as u64,
        s.frames_inferred,
        "one event per inferred frame"
    );
    let mut detections = 0;
    for r in seen.iter().step_by((seen.len() / 12).max(1)) {
        let want = vision::infer_image(
            &mut ctx,
            &spec,
            &jpegs[r.seq as usize],
            &DecodeLimits::default(),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(r.results, want.results, "frame {}", r.seq);
        assert_eq!((r.width, r.height), (640, 480));
        if let Results::Detections(d) = &r.results {
            detections += d.len();
        }
    }
    assert!(
        detections > 0,
        "the pedestrian video should yield person boxes"
    );
    // Sequence numbers rise strictly (older frames are dropped, never re-ordered).
    assert!(seen.windows(2).all(|w| w[0].seq < w[1].seq));
}

/// Counts frames and returns no detections (fast; for the reconnect tests).
struct CountingInfer;

impl FrameInfer for CountingInfer {
    fn infer_rgb(
        &mut self,
        _img: &image::RgbImage,
        _spec: &VisionSpec,
        _o: &Overrides,
        _t: &mut FrameTimings,
    ) -> vigil_engine::Result<Results> {
        Ok(Results::Detections(Vec::new()))
    }
}

/// A source that delivers `good` frames, then fails as `fault` says.
struct Faulty {
    inner: TestPattern,
    good: usize,
    fault: SourceErrorKind,
}

impl FrameSource for Faulty {
    fn info(&self) -> SourceInfo {
        self.inner.info()
    }
    fn next_frame(&mut self, timeout: Duration) -> Result<RawFrame, SourceError> {
        if self.good == 0 {
            return match self.fault {
                SourceErrorKind::Stalled => {
                    // What the V4L2 poll does: wait the stall timeout, then report it.
                    std::thread::sleep(timeout);
                    Err(SourceError::new(
                        SourceErrorKind::Stalled,
                        format!("no frame for {} ms", timeout.as_millis()),
                    ))
                }
                k => Err(SourceError::from_io(
                    "VIDIOC_DQBUF",
                    &std::io::Error::from_raw_os_error(if k == SourceErrorKind::Disconnected {
                        19
                    } else {
                        5
                    }),
                )),
            };
        }
        self.good -= 1;
        self.inner.next_frame(timeout)
    }
}

fn quick_config(id: &str) -> CameraConfig {
    let mut c = CameraConfig::new(id, SourceKind::TestPattern, "stand-in");
    c.width = 64;
    c.height = 48;
    c.stall_timeout_ms = 50;
    c.backoff_initial_ms = 10;
    c.backoff_max_ms = 40;
    c
}

fn transform() -> Transform {
    Transform {
        infer: Box::new(CountingInfer),
        spec: VisionSpec::nanodet_m_416(vec![]),
        max_pixels: 1 << 24,
    }
}

/// Open 1: 5 frames then `fault`; open 2: the device is missing (ENODEV at open); open 3+: healthy.
fn scripted(fault: SourceErrorKind, opens: Arc<AtomicUsize>) -> SourceFactory {
    Box::new(move || {
        let n = opens.fetch_add(1, Ordering::SeqCst);
        let inner = TestPattern::new(64, 48, Some(200.0));
        match n {
            0 => Ok(Box::new(Faulty {
                inner,
                good: 5,
                fault,
            }) as Box<dyn FrameSource>),
            1 => Err(SourceError::from_io(
                "open /dev/video9",
                &std::io::Error::from_raw_os_error(19),
            )),
            _ => Ok(Box::new(inner) as Box<dyn FrameSource>),
        }
    })
}

fn reconnects_after(fault: SourceErrorKind) {
    let opens = Arc::new(AtomicUsize::new(0));
    let cam = start_camera(
        quick_config("flaky"),
        scripted(fault, opens.clone()),
        transform(),
    )
    .unwrap();
    // A healthy camera next to it keeps running throughout.
    let other = start_camera(
        quick_config("steady"),
        Box::new(|| Ok(Box::new(TestPattern::new(64, 48, Some(200.0))) as Box<dyn FrameSource>)),
        transform(),
    )
    .unwrap();
    let mut saw_backoff = false;
    wait_for("the reopened source to deliver frames", &cam, |c| {
        let s = c.summary();
        saw_backoff |= s.status.state == CameraState::Backoff;
        s.status.reconnects >= 2
            && s.status.state == CameraState::Running
            && s.frames_captured >= 20
    });
    let s = cam.summary();
    assert_eq!(opens.load(Ordering::SeqCst), 3, "closed and reopened twice");
    let err = s.status.last_error.clone().unwrap_or_default();
    println!("{fault:?}: last_error = {err}");
    // The last source error was the missing device at the second open.
    assert!(
        err.contains("Disconnected") && err.contains("open /dev/video9"),
        "{err}"
    );
    assert!(saw_backoff || s.status.reconnects >= 2);
    let before = other.summary().frames_captured;
    wait_for("the other camera to keep capturing", &other, |c| {
        c.summary().frames_captured > before + 5
    });
    assert_eq!(other.summary().status.reconnects, 0);
    assert_eq!(other.status().state, CameraState::Running);
    cam.stop();
    other.stop();
    assert_eq!(cam.status().state, CameraState::Stopped);
    let s = cam.summary();
    assert_eq!(
        s.frames_captured,
        s.frames_inferred + s.frames_dropped + s.frames_failed
    );
}

#[test]
fn reconnects_after_enodev_mid_stream() {
    reconnects_after(SourceErrorKind::Disconnected);
}

#[test]
fn reconnects_after_a_stall() {
    reconnects_after(SourceErrorKind::Stalled);
}

#[test]
fn stall_error_is_reported_in_the_status() {
    // A source that stalls forever: the camera cycles through backoff with a Stalled error.
    let cam = start_camera(
        quick_config("stuck"),
        Box::new(|| {
            Ok(Box::new(Faulty {
                inner: TestPattern::new(64, 48, None),
                good: 0,
                fault: SourceErrorKind::Stalled,
            }) as Box<dyn FrameSource>)
        }),
        transform(),
    )
    .unwrap();
    wait_for("a stall to be reported", &cam, |c| {
        c.status().reconnects >= 1
    });
    let st = cam.status();
    assert!(
        st.last_error
            .as_deref()
            .unwrap_or("")
            .starts_with("Stalled"),
        "{st:?}"
    );
    cam.stop();
    assert_eq!(cam.summary().frames_captured, 0);
}

#[test]
fn corrupt_frames_are_counted_as_failed_not_fatal() {
    // Every third frame is garbage JPEG: counted as failed, the camera keeps running.
    struct Mixed(u64);
    impl FrameSource for Mixed {
        fn info(&self) -> SourceInfo {
            SourceInfo {
                description: "mixed".into(),
                format: vigil::camera::PixelFormat::Mjpeg,
                width: 16,
                height: 16,
                fps: 0.0,
            }
        }
        fn next_frame(&mut self, _t: Duration) -> Result<RawFrame, SourceError> {
            self.0 += 1;
            std::thread::sleep(Duration::from_millis(2));
            if self.0 > 30 {
                return Err(SourceError::new(SourceErrorKind::EndOfStream, "done"));
            }
            let data = if self.0.is_multiple_of(3) {
                vec![0xFF, 0xD8, 0xFF, 0xDB, 0x00]
            } else {
                let img = image::RgbImage::from_pixel(16, 16, image::Rgb([10, 200, 30]));
                let mut out = Vec::new();
                image::codecs::jpeg::JpegEncoder::new(&mut out)
                    .encode_image(&img)
                    .unwrap();
                out
            };
            Ok(RawFrame::new(
                vigil::camera::PixelFormat::Mjpeg,
                16,
                16,
                data,
            ))
        }
    }
    let cam = start_camera(
        quick_config("mixed"),
        Box::new(|| Ok(Box::new(Mixed(0)) as Box<dyn FrameSource>)),
        transform(),
    )
    .unwrap();
    wait_for("the source to end", &cam, |c| {
        c.status().state == CameraState::Finished
    });
    cam.stop();
    let s = cam.summary();
    assert_eq!(s.frames_captured, 30);
    assert_eq!(s.frames_inferred + s.frames_dropped + s.frames_failed, 30);
    assert!(s.frames_failed >= 1, "{s:?}");
    assert!(s.status.last_error.unwrap_or_default().contains("JPEG"));
}

/// Wraps the real model runner and counts finished inferences (a test hook for serial playback).
struct CountedInfer {
    inner: Box<dyn FrameInfer>,
    done: Arc<AtomicUsize>,
}

impl FrameInfer for CountedInfer {
    fn infer_rgb(
        &mut self,
        img: &image::RgbImage,
        spec: &VisionSpec,
        o: &Overrides,
        t: &mut FrameTimings,
    ) -> vigil_engine::Result<Results> {
        let r = self.inner.infer_rgb(img, spec, o, t);
        self.done.fetch_add(1, Ordering::SeqCst);
        r
    }
}

/// The MJPEG file source, made serial: it hands out frame n+1 only after frame n was inferred,
/// and ends after `limit` frames, so no frame is dropped.
struct Serial {
    inner: Box<dyn FrameSource>,
    done: Arc<AtomicUsize>,
    sent: usize,
    limit: usize,
}

impl FrameSource for Serial {
    fn info(&self) -> SourceInfo {
        self.inner.info()
    }
    fn next_frame(&mut self, timeout: Duration) -> Result<RawFrame, SourceError> {
        if self.sent == self.limit {
            return Err(SourceError::new(SourceErrorKind::EndOfStream, "limit"));
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.done.load(Ordering::SeqCst) < self.sent {
            if Instant::now() > deadline {
                return Err(SourceError::new(
                    SourceErrorKind::Stalled,
                    "inference did not finish",
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.sent += 1;
        self.inner.next_frame(timeout)
    }
}

#[test]
fn serial_mjpeg_playback_matches_infer_image_and_the_vigil_binary() {
    const N: usize = 24;
    let path = shared("camera/vtest-640x480-10fps.mjpeg");
    let mcfg = default_models(&models_dir())
        .into_iter()
        .find(|m| m.name == "nanodet-m-416")
        .unwrap();
    let (model, spec) = load_model(&mcfg, &model_options(&mcfg)).unwrap();
    let mut cam = CameraConfig::new("serial", SourceKind::MjpegFile, "nanodet-m-416");
    cam.path = Some(path.clone());
    cam.realtime = false;
    cam.looping = false;
    let max_pixels = Limits::default().max_pixels;
    let done = Arc::new(AtomicUsize::new(0));
    let transform = Transform {
        infer: Box::new(CountedInfer {
            inner: Box::new(model.new_context().unwrap()),
            done: done.clone(),
        }),
        spec: spec.clone(),
        max_pixels,
    };
    let mut inner_factory = factory_for(&cam, max_pixels);
    let d = done.clone();
    let factory: SourceFactory = Box::new(move || {
        Ok(Box::new(Serial {
            inner: inner_factory()?,
            done: d.clone(),
            sent: 0,
            limit: N,
        }) as Box<dyn FrameSource>)
    });
    let handle = start_camera(cam, factory, transform).unwrap();
    let mut events = handle.subscribe();
    wait_for("the serial playback to finish", &handle, |c| {
        c.status().state == CameraState::Finished
    });
    handle.stop();
    let s = handle.summary();
    assert_eq!(s.frames_captured, N as u64);
    assert_eq!(
        (s.frames_inferred, s.frames_dropped, s.frames_failed),
        (N as u64, 0, 0)
    );
    let mut seen = Vec::new();
    while let Ok(r) = events.try_recv() {
        seen.push(r);
    }
    assert_eq!(seen.len(), N, "one event per frame");

    let mut reader = MjpegReader::new(std::fs::File::open(&path).unwrap());
    let mut ctx = model.new_context().unwrap();
    let mut detections = 0;
    for (i, r) in seen.iter().enumerate() {
        assert_eq!(r.seq as usize, i);
        let jpeg = reader.next_jpeg().unwrap().unwrap();
        let want = vision::infer_image(
            &mut ctx,
            &spec,
            &jpeg,
            &DecodeLimits::default(),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(r.results, want.results, "frame {i}");
        if let Results::Detections(d) = &r.results {
            detections += d.len();
        }
    }
    assert!(
        detections > 0,
        "the pedestrian video should yield person boxes"
    );

    // The real `vigil infer` on three of the frames, written out as JPEG files.
    let dir = std::env::temp_dir().join(format!("vigil-camera-serial-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut reader = MjpegReader::new(std::fs::File::open(&path).unwrap());
    let picks = [0usize, 11, 23];
    let mut files = Vec::new();
    for i in 0..N {
        let jpeg = reader.next_jpeg().unwrap().unwrap();
        if picks.contains(&i) {
            let f = dir.join(format!("frame{i}.jpg"));
            std::fs::write(&f, &jpeg).unwrap();
            files.push(f);
        }
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
        .arg("infer")
        .arg("--models-dir")
        .arg(models_dir())
        .args(["--model", "nanodet-m-416"])
        .args(&files)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "vigil infer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cli = cli.as_array().unwrap();
    assert_eq!(cli.len(), picks.len());
    for (k, &i) in picks.iter().enumerate() {
        assert_eq!(
            cli[k]["results"],
            // Through the JSON text, as the CLI's f32 numbers are printed (shortest round trip).
            serde_json::from_str::<serde_json::Value>(
                &serde_json::to_string(&seen[i].results).unwrap()
            )
            .unwrap(),
            "frame {i}: vigil infer and the pipeline disagree"
        );
        assert_eq!(
            (cli[k]["width"].as_u64(), cli[k]["height"].as_u64()),
            (Some(640), Some(480))
        );
    }
}
