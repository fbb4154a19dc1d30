//! A generated test pattern: colour bars with a bright square moving across, and the frame
//! number encoded in the top-left pixels (for end-to-end checks).

use std::time::Duration;

use super::{FrameSource, Pacer, PixelFormat, RawFrame, SourceError, SourceInfo};

/// Eight 75% colour bars (white, yellow, cyan, green, magenta, red, blue, black).
const BARS: [[u8; 3]; 8] = [
    [191, 191, 191],
    [191, 191, 0],
    [0, 191, 191],
    [0, 191, 0],
    [191, 0, 191],
    [191, 0, 0],
    [0, 0, 191],
    [0, 0, 0],
];

/// The test-pattern source (RGB24).
pub struct TestPattern {
    width: u32,
    height: u32,
    n: u64,
    pacer: Pacer,
    fps: Option<f64>,
}

impl TestPattern {
    /// A `width`x`height` pattern at `fps` (None: unpaced).
    pub fn new(width: u32, height: u32, fps: Option<f64>) -> TestPattern {
        TestPattern {
            width: width.max(8),
            height: height.max(8),
            n: 0,
            pacer: Pacer::new(fps),
            fps,
        }
    }

    /// Frame `n` of the pattern.
    pub fn render(width: u32, height: u32, n: u64) -> Vec<u8> {
        let (w, h) = (width as usize, height as usize);
        let mut data = vec![0u8; w * h * 3];
        let side = (h / 4).max(1);
        let x0 = (n as usize * 8) % w.max(1);
        let y0 = h / 2 - side / 2;
        for y in 0..h {
            for x in 0..w {
                let i = (y * w + x) * 3;
                let px = if (y0..y0 + side).contains(&y) && (x0..x0 + side).contains(&x) {
                    [255, 255, 255]
                } else {
                    BARS[x * 8 / w]
                };
                data[i..i + 3].copy_from_slice(&px);
            }
        }
        // The frame number, little-endian, in the red channel of the first 8 pixels.
        for (k, b) in n.to_le_bytes().iter().enumerate() {
            data[k * 3] = *b;
        }
        data
    }
}

impl FrameSource for TestPattern {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            description: "test pattern".into(),
            format: PixelFormat::Rgb24,
            width: self.width,
            height: self.height,
            fps: self.fps.unwrap_or(0.0),
        }
    }

    fn next_frame(&mut self, _timeout: Duration) -> Result<RawFrame, SourceError> {
        self.pacer.wait();
        let data = TestPattern::render(self.width, self.height, self.n);
        self.n += 1;
        Ok(RawFrame::new(
            PixelFormat::Rgb24,
            self.width,
            self.height,
            data,
        ))
    }
}
