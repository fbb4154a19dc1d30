//! The V4L2 capture path over a fake device layer (negotiation, buffer mapping/queueing,
//! ENODEV, stalls, corrupt buffers), and the real device listing where /dev/video* exists.
#![cfg(target_os = "linux")]

use std::collections::VecDeque;
use std::time::Duration;

use vigil::camera::negotiate::{DiscreteSize, FrameSizes, OfferedFormat, Request};
use vigil::camera::source::v4l2::{ActualFormat, Caps, Dequeued, DeviceIo, V4l2Source};
use vigil::camera::source::{FrameSource, PixelFormat, SourceErrorKind};

/// What the fake driver does on the next poll.
enum Next {
    /// Fill the next queued buffer with `bytes_used` bytes of `fill`.
    Frame {
        fill: u8,
        bytes_used: u32,
        error: bool,
    },
    /// poll() times out.
    Timeout,
    /// The device was unplugged.
    Unplug,
}

struct FakeDevice {
    width: u32,
    height: u32,
    buffers: Vec<Vec<u8>>,
    queued: VecDeque<u32>,
    filled: VecDeque<Dequeued>,
    script: VecDeque<Next>,
    streaming: bool,
    stream_offs: usize,
    set: Option<([u8; 4], u32, u32)>,
}

impl FakeDevice {
    fn new(script: Vec<Next>) -> FakeDevice {
        FakeDevice {
            width: 0,
            height: 0,
            buffers: Vec::new(),
            queued: VecDeque::new(),
            filled: VecDeque::new(),
            script: script.into(),
            streaming: false,
            stream_offs: 0,
            set: None,
        }
    }
}

fn enodev() -> std::io::Error {
    std::io::Error::from_raw_os_error(19)
}

impl DeviceIo for FakeDevice {
    fn query_caps(&mut self) -> std::io::Result<Caps> {
        Ok(Caps {
            driver: "fake".into(),
            card: "Fake Cam".into(),
            bus_info: "usb-1".into(),
            capture: true,
            streaming: true,
        })
    }
    fn enum_formats(&mut self) -> std::io::Result<Vec<OfferedFormat>> {
        let sizes = |list: &[(u32, u32)]| {
            FrameSizes::Discrete(
                list.iter()
                    .map(|&(width, height)| DiscreteSize {
                        width,
                        height,
                        fps: vec![30.0, 15.0],
                    })
                    .collect(),
            )
        };
        Ok(vec![
            OfferedFormat {
                fourcc: "YUYV".into(),
                description: "YUYV 4:2:2".into(),
                format: Some(PixelFormat::Yuyv),
                sizes: sizes(&[(640, 480), (320, 240)]),
            },
            OfferedFormat {
                fourcc: "H264".into(),
                description: "H.264".into(),
                format: None,
                sizes: sizes(&[(1920, 1080)]),
            },
        ])
    }
    fn set_format(
        &mut self,
        fourcc: [u8; 4],
        width: u32,
        height: u32,
    ) -> std::io::Result<ActualFormat> {
        self.set = Some((fourcc, width, height));
        self.width = width;
        self.height = height;
        Ok(ActualFormat {
            fourcc,
            width,
            height,
            bytes_per_line: width * 2,
            size_image: width * height * 2,
        })
    }
    fn set_fps(&mut self, fps: f64) -> std::io::Result<Option<f64>> {
        Ok(Some(fps))
    }
    fn request_buffers(&mut self, count: u32) -> std::io::Result<u32> {
        // The driver grants fewer than asked.
        Ok(count.min(3))
    }
    fn map_buffer(&mut self, index: u32) -> std::io::Result<()> {
        assert_eq!(index as usize, self.buffers.len());
        self.buffers
            .push(vec![0; (self.width * self.height * 2) as usize]);
        Ok(())
    }
    fn buffer(&self, index: u32) -> &[u8] {
        &self.buffers[index as usize]
    }
    fn queue(&mut self, index: u32) -> std::io::Result<()> {
        assert!(!self.queued.contains(&index), "buffer {index} queued twice");
        self.queued.push_back(index);
        Ok(())
    }
    fn stream(&mut self, on: bool) -> std::io::Result<()> {
        self.streaming = on;
        if !on {
            self.stream_offs += 1;
        }
        Ok(())
    }
    fn wait_frame(&mut self, _timeout: Duration) -> std::io::Result<bool> {
        assert!(self.streaming);
        match self.script.pop_front() {
            Some(Next::Frame {
                fill,
                bytes_used,
                error,
            }) => {
                let index = self
                    .queued
                    .pop_front()
                    .expect("the driver has a queued buffer");
                self.buffers[index as usize].fill(fill);
                self.filled.push_back(Dequeued {
                    index,
                    bytes_used,
                    error,
                });
                Ok(true)
            }
            Some(Next::Timeout) | None => Ok(false),
            Some(Next::Unplug) => Err(enodev()),
        }
    }
    fn dequeue(&mut self) -> std::io::Result<Dequeued> {
        self.filled.pop_front().ok_or_else(enodev)
    }
}

fn request() -> Request {
    Request {
        formats: vec![PixelFormat::Mjpeg, PixelFormat::Yuyv],
        width: 640,
        height: 480,
        fps: 30.0,
    }
}

#[test]
fn negotiates_maps_queues_and_cycles_buffers() {
    let full = 640 * 480 * 2;
    let mut script = Vec::new();
    for i in 0..7u8 {
        script.push(Next::Frame {
            fill: 10 + i,
            bytes_used: full,
            error: false,
        });
    }
    let mut src = V4l2Source::open(FakeDevice::new(script), &request(), "/dev/fake0").unwrap();
    // MJPEG is not offered: falls back to YUYV at the exact size.
    let info = src.info();
    assert_eq!(
        (info.format, info.width, info.height, info.fps),
        (PixelFormat::Yuyv, 640, 480, 30.0)
    );
    assert_eq!(src.device().set, Some((*b"YUYV", 640, 480)));
    assert_eq!(src.buffer_count(), 3);
    assert_eq!(
        src.device().queued.len(),
        3,
        "all buffers queued before streaming"
    );
    // More frames than buffers: each buffer is re-queued after its bytes are copied out.
    for i in 0..7u8 {
        let f = src.next_frame(Duration::from_millis(10)).unwrap();
        assert_eq!(f.data.len(), full as usize);
        assert!(
            f.data.iter().all(|&b| b == 10 + i),
            "frame {i} has the bytes of its own buffer fill"
        );
        assert_eq!(f.stride, 1280);
        assert_eq!(src.device().queued.len(), 3);
    }
    drop(src);
}

#[test]
fn short_and_flagged_buffers_are_skipped() {
    let full = 640 * 480 * 2;
    let script = vec![
        Next::Frame {
            fill: 1,
            bytes_used: 1000,
            error: false,
        },
        Next::Frame {
            fill: 2,
            bytes_used: full,
            error: true,
        },
        Next::Frame {
            fill: 3,
            bytes_used: full,
            error: false,
        },
    ];
    let mut src = V4l2Source::open(FakeDevice::new(script), &request(), "/dev/fake0").unwrap();
    let f = src.next_frame(Duration::from_secs(5)).unwrap();
    assert!(f.data.iter().all(|&b| b == 3));
    assert_eq!(
        src.device().queued.len(),
        3,
        "skipped buffers went back to the driver"
    );
}

#[test]
fn unplug_and_stall_map_to_their_error_kinds() {
    let full = 640 * 480 * 2;
    let script = vec![
        Next::Frame {
            fill: 1,
            bytes_used: full,
            error: false,
        },
        Next::Timeout,
        Next::Unplug,
    ];
    let mut src = V4l2Source::open(FakeDevice::new(script), &request(), "/dev/fake0").unwrap();
    assert!(src.next_frame(Duration::from_millis(10)).is_ok());
    let e = src.next_frame(Duration::from_millis(10)).unwrap_err();
    assert_eq!(e.kind, SourceErrorKind::Stalled, "{e}");
    let e = src.next_frame(Duration::from_millis(10)).unwrap_err();
    assert_eq!(e.kind, SourceErrorKind::Disconnected, "{e}");
}

#[test]
fn no_convertible_format_is_a_format_error() {
    struct H264Only(FakeDevice);
    impl DeviceIo for H264Only {
        fn query_caps(&mut self) -> std::io::Result<Caps> {
            self.0.query_caps()
        }
        fn enum_formats(&mut self) -> std::io::Result<Vec<OfferedFormat>> {
            Ok(self
                .0
                .enum_formats()?
                .into_iter()
                .filter(|f| f.format.is_none())
                .collect())
        }
        fn set_format(&mut self, f: [u8; 4], w: u32, h: u32) -> std::io::Result<ActualFormat> {
            self.0.set_format(f, w, h)
        }
        fn set_fps(&mut self, fps: f64) -> std::io::Result<Option<f64>> {
            self.0.set_fps(fps)
        }
        fn request_buffers(&mut self, c: u32) -> std::io::Result<u32> {
            self.0.request_buffers(c)
        }
        fn map_buffer(&mut self, i: u32) -> std::io::Result<()> {
            self.0.map_buffer(i)
        }
        fn buffer(&self, i: u32) -> &[u8] {
            self.0.buffer(i)
        }
        fn queue(&mut self, i: u32) -> std::io::Result<()> {
            self.0.queue(i)
        }
        fn stream(&mut self, on: bool) -> std::io::Result<()> {
            self.0.stream(on)
        }
        fn wait_frame(&mut self, t: Duration) -> std::io::Result<bool> {
            self.0.wait_frame(t)
        }
        fn dequeue(&mut self) -> std::io::Result<Dequeued> {
            self.0.dequeue()
        }
    }
    let e = V4l2Source::open(H264Only(FakeDevice::new(vec![])), &request(), "/dev/fake1")
        .err()
        .unwrap();
    assert_eq!(e.kind, SourceErrorKind::Format);
    assert!(e.message.contains("H264"), "{e}");
}

#[test]
fn real_devices_when_present() {
    let devices = vigil::camera::source::v4l2::list_devices();
    if devices.is_empty() {
        println!("SKIP: no /dev/video* device, so the real V4L2 capture path was not exercised");
        return;
    }
    for d in &devices {
        println!("{}: {:?} {:?}", d.path.display(), d.caps, d.error);
    }
    // Where a capture device exists, open it and read one frame.
    let Some(d) = devices.iter().find(|d| {
        d.caps.as_ref().is_some_and(|c| c.capture && c.streaming)
            && d.formats.iter().any(|f| f.format.is_some())
    }) else {
        println!("SKIP: /dev/video* present but none is a streaming capture device with a convertible format");
        return;
    };
    let mut src = V4l2Source::open_path(&d.path, &request()).unwrap();
    let f = src.next_frame(Duration::from_secs(5)).unwrap();
    assert!(!f.data.is_empty());
}
