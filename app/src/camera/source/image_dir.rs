//! A directory of images (JPEG, PNG, BMP, WebP), played in file-name order.

use std::path::{Path, PathBuf};
use std::time::Duration;

use vigil_engine::vision::{decode_image, DecodeLimits};

use super::{FrameSource, Pacer, PixelFormat, RawFrame, SourceError, SourceErrorKind, SourceInfo};

/// Plays the images of a directory as RGB24 frames.
pub struct ImageDirSource {
    dir: PathBuf,
    files: Vec<PathBuf>,
    next: usize,
    pacer: Pacer,
    looping: bool,
    fps: Option<f64>,
    limits: DecodeLimits,
}

impl ImageDirSource {
    /// Lists the directory (files with an image extension, sorted by name).
    pub fn open(
        dir: &Path,
        fps: Option<f64>,
        looping: bool,
        max_pixels: u64,
    ) -> Result<ImageDirSource, SourceError> {
        let entries = std::fs::read_dir(dir)
            .map_err(|e| SourceError::from_io(&format!("list {}", dir.display()), &e))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension()
                    .and_then(|e| e.to_str())
                    .map(|e| e.to_ascii_lowercase())
                    .is_some_and(|e| ["jpg", "jpeg", "png", "bmp", "webp"].contains(&e.as_str()))
            })
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(SourceError::new(
                SourceErrorKind::Format,
                format!("{} holds no images", dir.display()),
            ));
        }
        Ok(ImageDirSource {
            dir: dir.to_path_buf(),
            files,
            next: 0,
            pacer: Pacer::new(fps),
            looping,
            fps,
            limits: DecodeLimits { max_pixels },
        })
    }

    /// The image files, in play order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }
}

impl FrameSource for ImageDirSource {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            description: format!("image directory {}", self.dir.display()),
            format: PixelFormat::Rgb24,
            width: 0,
            height: 0,
            fps: self.fps.unwrap_or(0.0),
        }
    }

    fn next_frame(&mut self, _timeout: Duration) -> Result<RawFrame, SourceError> {
        if self.next >= self.files.len() {
            if !self.looping {
                return Err(SourceError::new(
                    SourceErrorKind::EndOfStream,
                    format!("end of {}", self.dir.display()),
                ));
            }
            self.next = 0;
        }
        let path = &self.files[self.next];
        self.next += 1;
        let bytes = std::fs::read(path)
            .map_err(|e| SourceError::from_io(&format!("read {}", path.display()), &e))?;
        let img = decode_image(&bytes, &self.limits).map_err(|e| {
            SourceError::new(SourceErrorKind::Format, format!("{}: {e}", path.display()))
        })?;
        self.pacer.wait();
        let (w, h) = img.dimensions();
        Ok(RawFrame::new(PixelFormat::Rgb24, w, h, img.into_raw()))
    }
}
