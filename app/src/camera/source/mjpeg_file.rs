//! An MJPEG file or stream (concatenated JPEGs, as a UVC camera sends them): a regular file,
//! a FIFO or any reader, split into frames by walking the JPEG marker structure.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{FrameSource, Pacer, PixelFormat, RawFrame, SourceError, SourceErrorKind, SourceInfo};

/// Largest accepted single JPEG frame.
const MAX_FRAME_BYTES: usize = 32 << 20;

/// Returns the length of the complete JPEG at the start of `b` (SOI..EOI), `Ok(None)` when more
/// bytes are needed, or an error when `b` does not start with a JPEG.
pub fn jpeg_frame_len(b: &[u8]) -> Result<Option<usize>, String> {
    if b.len() < 2 {
        return Ok(None);
    }
    if b[0] != 0xFF || b[1] != 0xD8 {
        return Err("MJPEG stream: frame does not start with an SOI marker".into());
    }
    let mut i = 2;
    loop {
        // A marker: fill bytes 0xFF then a code.
        match b.get(i) {
            None => return Ok(None),
            Some(0xFF) => {}
            Some(_) => return Err(format!("MJPEG stream: expected a marker at byte {i}")),
        }
        while b.get(i) == Some(&0xFF) {
            i += 1;
        }
        let Some(&code) = b.get(i) else {
            return Ok(None);
        };
        i += 1;
        match code {
            0xD9 => return Ok(Some(i)),
            0x01 | 0xD0..=0xD7 => continue,
            _ => {}
        }
        let (Some(&hi), Some(&lo)) = (b.get(i), b.get(i + 1)) else {
            return Ok(None);
        };
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        if len < 2 {
            return Err("MJPEG stream: bad segment length".into());
        }
        i += len;
        if code == 0xDA {
            // Entropy-coded data: runs until a marker that is not a stuffed 0xFF00 or a restart.
            loop {
                let Some(pos) = b.get(i..).and_then(|s| s.iter().position(|&x| x == 0xFF)) else {
                    return Ok(None);
                };
                i += pos;
                match b.get(i + 1) {
                    None => return Ok(None),
                    Some(0x00) | Some(0xD0..=0xD7) => i += 2,
                    Some(0xFF) => i += 1,
                    Some(_) => break,
                }
            }
        }
    }
}

/// Splits a byte stream into JPEG frames.
pub struct MjpegReader<R: Read> {
    reader: R,
    buf: Vec<u8>,
    start: usize,
    eof: bool,
}

impl<R: Read> MjpegReader<R> {
    /// Wraps a reader.
    pub fn new(reader: R) -> MjpegReader<R> {
        MjpegReader {
            reader,
            buf: Vec::with_capacity(1 << 20),
            start: 0,
            eof: false,
        }
    }

    /// The next complete JPEG, `Ok(None)` at a clean end of stream.
    pub fn next_jpeg(&mut self) -> Result<Option<Vec<u8>>, SourceError> {
        loop {
            // Skip garbage between frames (some cameras pad with zeros).
            let avail = &self.buf[self.start..];
            if let Some(p) = avail.windows(2).position(|w| w == [0xFF, 0xD8]) {
                self.start += p;
            } else if avail.len() > 1 {
                self.start = self.buf.len() - 1;
            }
            match jpeg_frame_len(&self.buf[self.start..]) {
                Ok(Some(n)) => {
                    let frame = self.buf[self.start..self.start + n].to_vec();
                    self.start += n;
                    return Ok(Some(frame));
                }
                Ok(None) => {}
                Err(e) => return Err(SourceError::new(SourceErrorKind::Format, e)),
            }
            if self.eof {
                let leftover = self.buf.len() - self.start;
                return if leftover > 1 {
                    Err(SourceError::new(
                        SourceErrorKind::Format,
                        format!("MJPEG stream ends inside a frame ({leftover} bytes)"),
                    ))
                } else {
                    Ok(None)
                };
            }
            if self.buf.len() - self.start > MAX_FRAME_BYTES {
                return Err(SourceError::new(
                    SourceErrorKind::Format,
                    "MJPEG frame larger than 32 MiB",
                ));
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let old = self.buf.len();
            self.buf.resize(old + (256 << 10), 0);
            let n = match self.reader.read(&mut self.buf[old..]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(SourceError::from_io("MJPEG read", &e));
                }
            };
            self.buf.truncate(old + n);
            if n == 0 {
                self.eof = true;
            }
        }
    }

    /// Drops buffered bytes and the end-of-stream flag (after seeking the reader).
    pub fn reset(&mut self) {
        self.buf.clear();
        self.start = 0;
        self.eof = false;
    }

    /// The inner reader.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.reader
    }
}

/// Plays an MJPEG file at `fps` (or unpaced), looping if asked.
pub struct MjpegFileSource {
    path: PathBuf,
    reader: MjpegReader<File>,
    pacer: Pacer,
    looping: bool,
    fps: Option<f64>,
    size: (u32, u32),
}

impl MjpegFileSource {
    /// Opens the file and reads the first frame's size.
    pub fn open(
        path: &Path,
        fps: Option<f64>,
        looping: bool,
    ) -> Result<MjpegFileSource, SourceError> {
        let file = File::open(path)
            .map_err(|e| SourceError::from_io(&format!("open {}", path.display()), &e))?;
        let mut src = MjpegFileSource {
            path: path.to_path_buf(),
            reader: MjpegReader::new(file),
            pacer: Pacer::new(fps),
            looping,
            fps,
            size: (0, 0),
        };
        // Probe the first frame for its size, then rewind (FIFOs keep the probed frame lost).
        if let Some(first) = src.reader.next_jpeg()? {
            let (_, w, h) = vigil_engine::vision::probe_image(&first, &Default::default())
                .map_err(|e| SourceError::new(SourceErrorKind::Format, e.to_string()))?;
            src.size = (w, h);
        }
        if src.reader.get_mut().seek(SeekFrom::Start(0)).is_ok() {
            src.reader.reset();
        }
        Ok(src)
    }
}

impl FrameSource for MjpegFileSource {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            description: format!("MJPEG file {}", self.path.display()),
            format: PixelFormat::Mjpeg,
            width: self.size.0,
            height: self.size.1,
            fps: self.fps.unwrap_or(0.0),
        }
    }

    fn next_frame(&mut self, _timeout: Duration) -> Result<RawFrame, SourceError> {
        let mut rewound = false;
        loop {
            match self.reader.next_jpeg()? {
                Some(data) => {
                    self.pacer.wait();
                    let mut f = RawFrame::new(PixelFormat::Mjpeg, self.size.0, self.size.1, data);
                    f.captured = Instant::now();
                    return Ok(f);
                }
                None if self.looping && !rewound => {
                    self.reader
                        .get_mut()
                        .seek(SeekFrom::Start(0))
                        .map_err(|e| SourceError::from_io("MJPEG rewind", &e))?;
                    self.reader.reset();
                    rewound = true;
                }
                None => {
                    return Err(SourceError::new(
                        SourceErrorKind::EndOfStream,
                        format!("end of {}", self.path.display()),
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_jpeg(seed: u8) -> Vec<u8> {
        let img = image::RgbImage::from_fn(16, 8, |x, y| {
            image::Rgb([seed.wrapping_add(x as u8 * 9), y as u8 * 20, 0xFF])
        });
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
            .encode_image(&img)
            .unwrap();
        out
    }

    #[test]
    fn splits_concatenated_jpegs_with_garbage_between() {
        let (a, b) = (tiny_jpeg(1), tiny_jpeg(100));
        let mut stream = a.clone();
        stream.extend_from_slice(&[0, 0, 0]);
        stream.extend_from_slice(&b);
        // Read one byte at a time to exercise partial frames.
        struct Slow(std::io::Cursor<Vec<u8>>);
        impl Read for Slow {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(7);
                self.0.read(&mut buf[..n])
            }
        }
        let mut r = MjpegReader::new(Slow(std::io::Cursor::new(stream)));
        assert_eq!(r.next_jpeg().unwrap().unwrap(), a);
        assert_eq!(r.next_jpeg().unwrap().unwrap(), b);
        assert_eq!(r.next_jpeg().unwrap(), None);
    }

    #[test]
    fn truncated_stream_is_a_format_error() {
        let a = tiny_jpeg(5);
        let mut r = MjpegReader::new(std::io::Cursor::new(a[..a.len() - 10].to_vec()));
        assert_eq!(r.next_jpeg().unwrap_err().kind, SourceErrorKind::Format);
        assert!(jpeg_frame_len(&[0x00, 0x11]).is_err());
        assert_eq!(jpeg_frame_len(&a).unwrap(), Some(a.len()));
    }
}
