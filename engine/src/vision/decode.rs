//! Decoding untrusted image bytes (JPEG, PNG, BMP, WebP) to RGB, with a pixel limit checked
//! from the header before any pixel is decoded, and EXIF orientation applied.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

use super::DecodeLimits;
use crate::error::{Error, Result};

/// Bytes per pixel the allocation budget allows for (16-bit RGBA PNG, the widest decoded layout).
const MAX_BYTES_PER_PIXEL: u64 = 8;
/// Extra allocation headroom for decoder-internal buffers (Huffman tables, row buffers, chunks).
const ALLOC_SLACK: u64 = 64 << 20;

/// Identifies the container format from the leading bytes (magic numbers), never from a name.
pub fn sniff_format(bytes: &[u8]) -> Result<ImageFormat> {
    if bytes.is_empty() {
        return Err(Error::Image("image data is empty (0 bytes)".into()));
    }
    let format = image::guess_format(bytes).map_err(|_| {
        Error::UnsupportedImage(
            "unrecognised image format (expected JPEG, PNG, BMP or WebP)".into(),
        )
    })?;
    match format {
        ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::Bmp | ImageFormat::WebP => Ok(format),
        other => Err(Error::UnsupportedImage(format!(
            "unsupported image format {other:?} (expected JPEG, PNG, BMP or WebP)"
        ))),
    }
}

/// Checks declared dimensions against the pixel limit (and rejects empty images).
fn check_pixels(w: u32, h: u32, limits: &DecodeLimits) -> Result<()> {
    let pixels = u64::from(w) * u64::from(h);
    if pixels > limits.max_pixels {
        return Err(Error::ImageTooLarge(format!(
            "image is {w}x{h} = {pixels} pixels, limit is {}",
            limits.max_pixels
        )));
    }
    if pixels == 0 {
        return Err(Error::Image(format!("image has zero size ({w}x{h})")));
    }
    Ok(())
}

/// Reads only the header: the format, width and height, checked against `limits`. Cheap
/// admission control before an upload is queued for a full decode.
pub fn probe_image(bytes: &[u8], limits: &DecodeLimits) -> Result<(ImageFormat, u32, u32)> {
    let format = sniff_format(bytes)?;
    let mut reader = ImageReader::new(Cursor::new(bytes));
    reader.set_format(format);
    let (w, h) = reader
        .into_dimensions()
        .map_err(|e| image_err("corrupt or truncated image header", e))?;
    check_pixels(w, h, limits)?;
    Ok((format, w, h))
}

fn image_err(context: &str, e: image::ImageError) -> Error {
    match e {
        // The decoder's own dimension/allocation limits: the image is too large, not corrupt.
        image::ImageError::Limits(_) => Error::ImageTooLarge(format!("{context}: {e}")),
        _ => Error::Image(format!("{context}: {e}")),
    }
}

/// Decodes JPEG/PNG/BMP/WebP bytes to RGB8, applying EXIF orientation and `limits`.
///
/// The pixel count is read from the header and checked against `limits.max_pixels` before any
/// pixel data is decoded; alpha is dropped (not composited), like PIL's `convert("RGB")`.
pub fn decode_image(bytes: &[u8], limits: &DecodeLimits) -> Result<image::RgbImage> {
    let format = sniff_format(bytes)?;
    // Decoders are fuzzed upstream, but a panic on hostile input must never take the server down:
    // contain it and report it as an image error.
    match std::panic::catch_unwind(|| decode_inner(bytes, format, limits)) {
        Ok(r) => r,
        Err(_) => Err(Error::Image(format!(
            "the {format:?} decoder failed on malformed data"
        ))),
    }
}

/// Walks the JPEG marker structure from SOI to EOI and errors when the stream ends first.
///
/// The JPEG decoder is lenient and would return a grey-filled picture for a truncated upload;
/// this catches that. Segments are skipped by their length (so embedded EXIF thumbnails are not
/// confused with the main image) and data after EOI (e.g. an appended motion-photo video) is
/// ignored.
fn check_jpeg_complete(b: &[u8]) -> Result<()> {
    let truncated = || Error::Image("JPEG data is truncated (no end-of-image marker)".into());
    if b.len() < 4 || b[0] != 0xFF || b[1] != 0xD8 {
        return Err(Error::Image(
            "JPEG data does not start with an SOI marker".into(),
        ));
    }
    let mut i = 2;
    loop {
        // Expect a marker: one or more 0xFF fill bytes then the marker code.
        if *b.get(i).ok_or_else(truncated)? != 0xFF {
            return Err(Error::Image(format!(
                "corrupt JPEG: expected a marker at byte {i}"
            )));
        }
        while b.get(i) == Some(&0xFF) {
            i += 1;
        }
        let code = *b.get(i).ok_or_else(truncated)?;
        i += 1;
        match code {
            0xD9 => return Ok(()),
            0x01 | 0xD0..=0xD7 => continue,
            _ => {}
        }
        let len = match (b.get(i), b.get(i + 1)) {
            (Some(&hi), Some(&lo)) => usize::from(u16::from_be_bytes([hi, lo])),
            _ => return Err(truncated()),
        };
        if len < 2 {
            return Err(Error::Image(format!(
                "corrupt JPEG: segment length {len} at byte {i}"
            )));
        }
        i += len;
        if i > b.len() {
            return Err(truncated());
        }
        if code == 0xDA {
            // Entropy-coded data: runs until a 0xFF that is not stuffing (0x00) or a restart marker.
            loop {
                let rel = b[i..]
                    .iter()
                    .position(|&x| x == 0xFF)
                    .ok_or_else(truncated)?;
                i += rel;
                match b.get(i + 1) {
                    None => return Err(truncated()),
                    Some(0x00) | Some(0xD0..=0xD7) => i += 2,
                    Some(0xFF) => i += 1,
                    Some(_) => break,
                }
            }
        }
    }
}

fn decode_inner(
    bytes: &[u8],
    format: ImageFormat,
    limits: &DecodeLimits,
) -> Result<image::RgbImage> {
    if format == ImageFormat::Jpeg {
        check_jpeg_complete(bytes)?;
    }
    let mut img_limits = Limits::default();
    img_limits.max_alloc = Some(
        limits
            .max_pixels
            .saturating_mul(MAX_BYTES_PER_PIXEL)
            .saturating_add(ALLOC_SLACK),
    );

    let mut reader = ImageReader::new(Cursor::new(bytes));
    reader.set_format(format);
    reader.limits(img_limits);
    let mut decoder = reader
        .into_decoder()
        .map_err(|e| image_err("cannot read image header", e))?;

    let (w, h) = decoder.dimensions();
    check_pixels(w, h, limits)?;

    // Orientation comes from EXIF (JPEG APP1, PNG eXIf, WebP EXIF chunk). A malformed EXIF block
    // is not fatal: the pixels are still valid, so fall back to "as stored".
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);

    let mut img =
        DynamicImage::from_decoder(decoder).map_err(|e| image_err("cannot decode image", e))?;
    img.apply_orientation(orientation);
    Ok(match img {
        DynamicImage::ImageRgb8(rgb) => rgb,
        other => other.to_rgb8(),
    })
}
