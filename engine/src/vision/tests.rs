//! Tests for decoding, preprocessing and post-processing, against independent references
//! (hand-built pixel maps, Pillow-generated resize outputs, naive box math).

use std::io::Cursor;

use image::{DynamicImage, ImageFormat, Rgb, RgbImage};

use super::*;
use crate::error::Error;
use crate::ir::Tensor;

// ---------------------------------------------------------------- helpers

/// Deterministic test pattern (also used by the Pillow reference script).
fn pattern(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        let v = |c: u32| ((x * 37 + y * 91 + c * 53 + (x * y) % 7 * 11) % 256) as u8;
        Rgb([v(0), v(1), v(2)])
    })
}

fn encode(img: &RgbImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgb8(img.clone())
        .write_to(&mut out, format)
        .unwrap();
    out.into_inner()
}

fn is_image_err<T: std::fmt::Debug>(r: &crate::error::Result<T>) -> bool {
    matches!(
        r,
        Err(Error::Image(_) | Error::UnsupportedImage(_) | Error::ImageTooLarge(_))
    )
}

/// Minimal big-endian TIFF block holding one Orientation (0x0112) entry.
fn exif_tiff(orientation: u16) -> Vec<u8> {
    let mut t = b"MM\0\x2a\0\0\0\x08".to_vec();
    t.extend_from_slice(&1u16.to_be_bytes()); // entry count
    t.extend_from_slice(&0x0112u16.to_be_bytes()); // tag
    t.extend_from_slice(&3u16.to_be_bytes()); // SHORT
    t.extend_from_slice(&1u32.to_be_bytes()); // count
    t.extend_from_slice(&orientation.to_be_bytes());
    t.extend_from_slice(&[0, 0]); // value padding
    t.extend_from_slice(&0u32.to_be_bytes()); // next IFD
    t
}

/// A JPEG with a hand-built APP1 Exif segment inserted right after SOI.
fn jpeg_with_orientation(img: &RgbImage, orientation: u16) -> Vec<u8> {
    let jpeg = encode(img, ImageFormat::Jpeg);
    assert_eq!(&jpeg[..2], &[0xFF, 0xD8]);
    let mut payload = b"Exif\0\0".to_vec();
    payload.extend(exif_tiff(orientation));
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&((payload.len() + 2) as u16).to_be_bytes());
    out.extend(payload);
    out.extend_from_slice(&jpeg[2..]);
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG with an `eXIf` chunk (raw TIFF) inserted right after IHDR.
fn png_with_orientation(img: &RgbImage, orientation: u16) -> Vec<u8> {
    let png = encode(img, ImageFormat::Png);
    let ihdr_end = 8 + 4 + 4 + 13 + 4;
    assert_eq!(&png[12..16], b"IHDR");
    let data = exif_tiff(orientation);
    let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
    let mut typed = b"eXIf".to_vec();
    typed.extend(&data);
    chunk.extend(&typed);
    chunk.extend(crc32(&typed).to_be_bytes());
    let mut out = png[..ihdr_end].to_vec();
    out.extend(chunk);
    out.extend_from_slice(&png[ihdr_end..]);
    out
}

/// EXIF spec: which stored pixel is shown at displayed (x, y), for a stored w x h image.
fn exif_source(o: u16, w: u32, h: u32, x: u32, y: u32) -> (u32, u32) {
    match o {
        1 => (x, y),
        2 => (w - 1 - x, y),
        3 => (w - 1 - x, h - 1 - y),
        4 => (x, h - 1 - y),
        5 => (y, x),
        6 => (y, h - 1 - x),
        7 => (w - 1 - y, h - 1 - x),
        8 => (w - 1 - y, x),
        _ => unreachable!(),
    }
}

fn shared_dir() -> std::path::PathBuf {
    std::env::var_os("VIGIL_SHARED")
        .map(Into::into)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared").into())
}

// ---------------------------------------------------------------- decode

#[test]
fn decodes_lossless_formats_exactly() {
    let img = pattern(23, 17);
    for format in [ImageFormat::Png, ImageFormat::Bmp, ImageFormat::WebP] {
        let bytes = encode(&img, format);
        let out = decode_image(&bytes, &DecodeLimits::default()).unwrap();
        assert_eq!(out, img, "{format:?} round trip");
    }
}

#[test]
fn decodes_jpeg_close_to_source() {
    let img = RgbImage::from_fn(48, 32, |x, y| Rgb([(x * 5) as u8, (y * 7) as u8, 128]));
    let out = decode_image(&encode(&img, ImageFormat::Jpeg), &DecodeLimits::default()).unwrap();
    assert_eq!(out.dimensions(), (48, 32));
    let mad: f64 = out
        .as_raw()
        .iter()
        .zip(img.as_raw())
        .map(|(&a, &b)| (a as f64 - b as f64).abs())
        .sum::<f64>()
        / img.as_raw().len() as f64;
    assert!(mad < 3.0, "mean abs error {mad}");
}

#[test]
fn rgba_and_grey_inputs_become_rgb() {
    let rgba =
        image::RgbaImage::from_fn(5, 4, |x, y| image::Rgba([x as u8 * 40, y as u8 * 50, 7, 3]));
    let mut buf = Cursor::new(Vec::new());
    DynamicImage::ImageRgba8(rgba.clone())
        .write_to(&mut buf, ImageFormat::Png)
        .unwrap();
    let out = decode_image(buf.get_ref(), &DecodeLimits::default()).unwrap();
    for (x, y, p) in out.enumerate_pixels() {
        let s = rgba.get_pixel(x, y);
        assert_eq!(p.0, [s[0], s[1], s[2]]);
    }
    let grey = image::GrayImage::from_fn(3, 3, |x, y| image::Luma([(x * 3 + y) as u8 * 20]));
    let mut buf = Cursor::new(Vec::new());
    DynamicImage::ImageLuma8(grey.clone())
        .write_to(&mut buf, ImageFormat::Png)
        .unwrap();
    let out = decode_image(buf.get_ref(), &DecodeLimits::default()).unwrap();
    for (x, y, p) in out.enumerate_pixels() {
        let g = grey.get_pixel(x, y)[0];
        assert_eq!(p.0, [g, g, g]);
    }
}

#[test]
fn png_exif_orientation_all_eight() {
    let (w, h) = (5, 3);
    let img = pattern(w, h);
    for o in 1..=8u16 {
        let out = decode_image(&png_with_orientation(&img, o), &DecodeLimits::default()).unwrap();
        let (dw, dh) = if o >= 5 { (h, w) } else { (w, h) };
        assert_eq!(out.dimensions(), (dw, dh), "orientation {o}");
        for y in 0..dh {
            for x in 0..dw {
                let (sx, sy) = exif_source(o, w, h, x, y);
                assert_eq!(
                    out.get_pixel(x, y),
                    img.get_pixel(sx, sy),
                    "orientation {o} at ({x},{y})"
                );
            }
        }
    }
}

#[test]
fn jpeg_exif_orientation_rotates() {
    // Four flat quadrants (32x16 each, MCU-aligned) so JPEG loss does not blur the colours.
    let (w, h) = (64u32, 32u32);
    let colours = [
        [220u8, 20, 20],
        [20, 220, 20],
        [20, 20, 220],
        [230, 230, 230],
    ];
    let quadrant = |x: u32, y: u32| (x >= w / 2) as usize + 2 * (y >= h / 2) as usize;
    let img = RgbImage::from_fn(w, h, |x, y| Rgb(colours[quadrant(x, y)]));
    for o in [1u16, 3, 6, 8] {
        let out = decode_image(&jpeg_with_orientation(&img, o), &DecodeLimits::default()).unwrap();
        let (dw, dh) = if o >= 5 { (h, w) } else { (w, h) };
        assert_eq!(out.dimensions(), (dw, dh), "orientation {o}");
        // Check the centre of each displayed quadrant.
        for (fx, fy) in [(1, 1), (3, 1), (1, 3), (3, 3)] {
            let (x, y) = (dw * fx / 4, dh * fy / 4);
            let (sx, sy) = exif_source(o, w, h, x, y);
            let want = colours[quadrant(sx, sy)];
            let got = out.get_pixel(x, y).0;
            for c in 0..3 {
                assert!(
                    (got[c] as i32 - want[c] as i32).abs() <= 24,
                    "o={o} ({x},{y}): {got:?} vs {want:?}"
                );
            }
        }
    }
}

#[test]
fn pixel_limit_is_enforced() {
    let bytes = encode(&pattern(100, 80), ImageFormat::Png);
    let err = decode_image(&bytes, &DecodeLimits { max_pixels: 5000 }).unwrap_err();
    assert_eq!(
        err.to_string(),
        "image too large: image is 100x80 = 8000 pixels, limit is 5000"
    );
    assert!(decode_image(&bytes, &DecodeLimits { max_pixels: 8000 }).is_ok());

    // A BMP header claiming 20000x20000 with no pixel data: rejected from the header alone.
    let mut bmp = encode(&pattern(4, 4), ImageFormat::Bmp);
    bmp[18..22].copy_from_slice(&20000i32.to_le_bytes());
    bmp[22..26].copy_from_slice(&20000i32.to_le_bytes());
    let err = decode_image(&bmp, &DecodeLimits::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "image too large: image is 20000x20000 = 400000000 pixels, limit is 40000000"
    );
    // The header-only probe agrees, and reports format and size of acceptable images.
    assert!(matches!(
        probe_image(&bmp, &DecodeLimits::default()),
        Err(Error::ImageTooLarge(_))
    ));
    assert_eq!(
        probe_image(&bytes, &DecodeLimits::default()).unwrap(),
        (ImageFormat::Png, 100, 80)
    );
    assert!(matches!(
        probe_image(b"GIF89a\x01\0\x01\0\0\0\0", &DecodeLimits::default()),
        Err(Error::UnsupportedImage(_))
    ));
}

#[test]
fn corrupt_inputs_are_errors_not_panics() {
    let limits = DecodeLimits::default();
    assert!(is_image_err(&decode_image(&[], &limits)));
    assert!(is_image_err(&decode_image(
        b"definitely not an image",
        &limits
    )));
    assert!(is_image_err(&decode_image(
        b"GIF89a\x01\0\x01\0\0\0\0",
        &limits
    )));
    let img = pattern(40, 30);
    for format in [
        ImageFormat::Png,
        ImageFormat::Jpeg,
        ImageFormat::Bmp,
        ImageFormat::WebP,
    ] {
        let bytes = encode(&img, format);
        // Cut in half: every decoder must report an error.
        let half = &bytes[..bytes.len() / 2];
        assert!(
            is_image_err(&decode_image(half, &limits)),
            "{format:?} truncated to half"
        );
        // Every prefix and a corrupted copy: must never panic, and errors are Error::Image.
        for n in (0..bytes.len()).step_by(7) {
            let r = decode_image(&bytes[..n], &limits);
            assert!(r.is_ok() || is_image_err(&r), "{format:?} prefix {n}");
        }
        let mut bad = bytes.clone();
        for i in (bytes.len() / 3..bytes.len()).step_by(5) {
            bad[i] ^= 0x5A;
        }
        let r = decode_image(&bad, &limits);
        assert!(r.is_ok() || is_image_err(&r), "{format:?} corrupted");
    }
    // JPEG: missing only the EOI marker is truncation; data appended after EOI is ignored, and
    // an EXIF thumbnail's own EOI (inside APP1) does not count.
    let jpeg = jpeg_with_orientation(&img, 1);
    assert!(is_image_err(&decode_image(
        &jpeg[..jpeg.len() - 2],
        &limits
    )));
    let mut appended = jpeg.clone();
    appended.extend_from_slice(b"\xFF\xDA trailing video data \xFF\xD8");
    assert_eq!(
        decode_image(&appended, &limits).unwrap(),
        decode_image(&jpeg, &limits).unwrap()
    );
    let thumb = encode(&pattern(8, 8), ImageFormat::Jpeg);
    let mut with_thumb = jpeg[..2].to_vec();
    with_thumb.extend_from_slice(&[0xFF, 0xE1]);
    with_thumb.extend_from_slice(&((thumb.len() + 2) as u16).to_be_bytes());
    with_thumb.extend_from_slice(&thumb);
    with_thumb.extend_from_slice(&jpeg[2..jpeg.len() / 2]);
    assert!(is_image_err(&decode_image(&with_thumb, &limits)));
    // PNG CRC mismatch inside IDAT is detected.
    let mut png = encode(&img, ImageFormat::Png);
    let n = png.len();
    png[n - 20] ^= 0xFF;
    assert!(is_image_err(&decode_image(&png, &limits)));
}

#[test]
fn real_eval_photos_decode() {
    let dir = shared_dir().join("images/eval");
    // (file, width, height, mean R, G, B) from Pillow with ImageOps.exif_transpose.
    let expected: [(&str, u32, u32, [f64; 3]); 16] = [
        ("HappyFish.jpg", 259, 194, [219.267, 196.415, 170.848]),
        ("aero1.jpg", 640, 480, [147.636, 150.389, 153.577]),
        ("apple.jpg", 512, 512, [159.053, 119.659, 64.766]),
        ("astronaut.png", 512, 512, [141.562, 105.759, 96.475]),
        ("baboon.jpg", 512, 512, [137.068, 129.15, 112.862]),
        ("basketball1.png", 640, 480, [120.31, 120.31, 120.31]),
        ("building.jpg", 868, 600, [142.915, 143.583, 133.725]),
        ("butterfly.jpg", 493, 356, [106.999, 123.577, 77.167]),
        ("china.jpg", 640, 427, [144.72, 145.469, 140.919]),
        ("coffee.png", 600, 400, [158.569, 85.794, 51.485]),
        ("flower.jpg", 640, 427, [55.134, 73.579, 57.0]),
        ("grace_hopper.jpg", 512, 600, [82.485, 72.43, 86.424]),
        ("home.jpg", 512, 384, [91.608, 123.872, 141.24]),
        ("orange.jpg", 512, 512, [150.209, 131.81, 69.185]),
        ("page.png", 384, 191, [171.545, 171.545, 171.545]),
        ("rocket.jpg", 640, 427, [52.266, 61.294, 82.271]),
    ];
    for (name, w, h, mean) in expected {
        let bytes = std::fs::read(dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e} (set VIGIL_SHARED)"));
        let img = decode_image(&bytes, &DecodeLimits::default()).unwrap();
        assert_eq!(img.dimensions(), (w, h), "{name}");
        let mut sums = [0f64; 3];
        for p in img.pixels() {
            for c in 0..3 {
                sums[c] += f64::from(p[c]);
            }
        }
        for c in 0..3 {
            let m = sums[c] / f64::from(w * h);
            // PNG is exact; JPEG decoders (zune vs libjpeg) differ slightly in IDCT/upsampling.
            let tol = if name.ends_with(".png") { 0.001 } else { 1.0 };
            assert!(
                (m - mean[c]).abs() <= tol,
                "{name} channel {c}: {m} vs {}",
                mean[c]
            );
        }
    }
}

// ---------------------------------------------------------------- preprocess

// Pillow 13 `pattern(w, h).resize((ow, oh), Image.BILINEAR)` outputs, row-major RGB.
#[rustfmt::skip]
mod pil {
    pub const PIL_7X5_TO_3X4: [u8; 36] = [57, 110, 149, 123, 150, 177, 163, 148, 118, 151, 158, 141, 133, 118, 136, 111, 126, 179, 119, 126, 109, 138, 141, 97, 150, 69, 122, 140, 193, 109, 98, 133, 88, 102, 114, 167];
    pub const PIL_7X5_TO_11X9: [u8; 297] = [0, 53, 106, 17, 70, 123, 40, 93, 146, 64, 117, 170, 87, 140, 193, 111, 164, 217, 135, 188, 241, 158, 211, 194, 182, 235, 55, 205, 119, 55, 222, 19, 72, 30, 83, 136, 49, 102, 155, 74, 127, 173, 101, 154, 145, 126, 148, 147, 152, 120, 173, 124, 146, 199, 119, 172, 178, 145, 198, 96, 170, 131, 106, 189, 71, 124, 81, 134, 187, 102, 155, 208, 132, 185, 217, 162, 215, 102, 191, 161, 69, 221, 47, 100, 107, 77, 130, 53, 106, 151, 83, 136, 163, 113, 150, 190, 134, 159, 212, 131, 184, 124, 156, 157, 148, 179, 128, 168, 140, 162, 112, 142, 144, 106, 176, 87, 140, 98, 99, 152, 67, 120, 173, 101, 154, 207, 134, 126, 179, 159, 98, 151, 182, 235, 32, 209, 145, 59, 223, 43, 96, 98, 81, 134, 65, 118, 171, 103, 156, 209, 92, 145, 198, 101, 154, 207, 139, 192, 245, 176, 90, 143, 203, 0, 53, 90, 143, 83, 120, 121, 112, 151, 100, 140, 120, 142, 92, 114, 167, 78, 129, 182, 93, 149, 112, 113, 166, 77, 130, 181, 91, 144, 140, 67, 120, 105, 44, 97, 27, 80, 133, 60, 113, 153, 104, 157, 161, 144, 197, 56, 151, 204, 12, 135, 188, 14, 176, 84, 54, 199, 24, 77, 201, 26, 79, 111, 60, 113, 36, 89, 142, 78, 131, 184, 113, 166, 141, 157, 210, 85, 174, 227, 47, 137, 190, 49, 62, 115, 83, 79, 78, 100, 102, 70, 123, 135, 103, 156, 107, 121, 174, 80, 133, 186, 108, 161, 214, 145, 198, 134, 189, 242, 39, 192, 245, 42, 129, 182, 72, 18, 71, 124, 21, 74, 127, 44, 97, 150, 96, 149, 202, 105, 158, 211, 107, 160, 213];
    pub const PIL_40X30_TO_9X13: [u8; 351] = [117, 137, 149, 127, 131, 149, 127, 138, 136, 128, 137, 143, 132, 139, 130, 134, 142, 138, 132, 142, 122, 134, 147, 124, 126, 146, 129, 126, 142, 105, 124, 124, 122, 129, 127, 115, 130, 138, 117, 132, 125, 115, 135, 138, 110, 134, 131, 118, 135, 121, 117, 126, 127, 114, 123, 156, 105, 127, 155, 108, 131, 144, 101, 128, 141, 114, 135, 140, 110, 134, 144, 110, 134, 137, 120, 142, 138, 108, 135, 112, 103, 133, 135, 106, 132, 121, 118, 140, 113, 108, 135, 111, 118, 138, 100, 120, 140, 110, 115, 126, 114, 127, 131, 106, 119, 144, 116, 114, 116, 110, 136, 129, 114, 130, 124, 112, 125, 128, 114, 131, 132, 116, 113, 127, 118, 110, 133, 121, 110, 133, 121, 114, 132, 125, 114, 108, 143, 119, 117, 130, 132, 112, 142, 129, 113, 141, 121, 118, 136, 134, 117, 151, 115, 120, 143, 120, 122, 144, 129, 120, 138, 114, 116, 129, 142, 132, 137, 144, 118, 137, 152, 113, 136, 147, 122, 137, 152, 120, 137, 141, 120, 137, 143, 127, 144, 135, 120, 139, 145, 122, 136, 120, 119, 132, 128, 124, 128, 133, 126, 141, 115, 126, 119, 125, 130, 132, 115, 130, 134, 124, 133, 124, 114, 134, 146, 113, 115, 150, 100, 121, 150, 102, 123, 145, 96, 121, 157, 107, 129, 153, 103, 126, 151, 103, 128, 139, 113, 136, 141, 106, 127, 145, 111, 128, 131, 109, 125, 116, 123, 134, 122, 119, 130, 131, 114, 132, 122, 115, 141, 121, 109, 134, 110, 121, 139, 101, 116, 146, 119, 114, 111, 102, 134, 123, 107, 148, 119, 108, 145, 122, 109, 142, 127, 113, 129, 123, 110, 126, 130, 113, 131, 132, 112, 115, 128, 119, 110, 104, 138, 112, 111, 123, 128, 108, 135, 134, 112, 135, 121, 115, 129, 135, 114, 145, 123, 116, 137, 122, 117, 137, 131, 117, 154, 105, 105, 123, 138, 123, 124, 140, 116, 129, 146, 117, 127, 144, 128, 133, 147, 119, 132, 151, 105, 132, 149, 117, 140, 154, 108, 134, 139];
}

#[test]
fn resize_matches_pillow_exactly() {
    let cases: [(u32, u32, u32, u32, &[u8]); 3] = [
        (7, 5, 3, 4, &pil::PIL_7X5_TO_3X4),
        (7, 5, 11, 9, &pil::PIL_7X5_TO_11X9),
        (40, 30, 9, 13, &pil::PIL_40X30_TO_9X13),
    ];
    for (w, h, ow, oh, want) in cases {
        let out = resize_bilinear(&pattern(w, h), ow, oh).unwrap();
        assert_eq!(out.as_raw().as_slice(), want, "{w}x{h} -> {ow}x{oh}");
    }
}

fn rgb_spec(width: u32, height: u32, resize: ResizeMode) -> Preprocess {
    Preprocess {
        width,
        height,
        resize,
        scale: 1.0 / 255.0,
        mean: [0.485, 0.456, 0.406],
        std: [0.229, 0.224, 0.225],
        bgr: false,
    }
}

fn tensor_at(t: &Tensor, c: usize, y: usize, x: usize) -> f32 {
    let (h, w) = (t.shape[2], t.shape[3]);
    t.as_f32().unwrap()[(c * h + y) * w + x]
}

#[test]
fn constant_colour_normalizes_exactly() {
    let colour = [10u8, 128, 250];
    let img = RgbImage::from_pixel(37, 23, Rgb(colour));
    for resize in [
        ResizeMode::Stretch,
        ResizeMode::ShortSideCenterCrop { short_side: 20 },
    ] {
        for bgr in [false, true] {
            let p = Preprocess {
                bgr,
                ..rgb_spec(16, 12, resize.clone())
            };
            let (t, _) = preprocess(&img, &p).unwrap();
            assert_eq!(t.shape, vec![1, 3, 12, 16]);
            for c in 0..3 {
                let src = if bgr { colour[2 - c] } else { colour[c] };
                let want = (f64::from(src) / 255.0 - f64::from(p.mean[c])) / f64::from(p.std[c]);
                for y in 0..12 {
                    for x in 0..16 {
                        let v = tensor_at(&t, c, y, x);
                        assert!(
                            (f64::from(v) - want).abs() < 1e-5,
                            "{resize:?} bgr={bgr} c={c}: {v} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn letterbox_pads_and_maps_back() {
    let img = RgbImage::from_pixel(200, 100, Rgb([255, 0, 0]));
    let p = Preprocess {
        mean: [0.0; 3],
        std: [1.0; 3],
        ..rgb_spec(64, 64, ResizeMode::Letterbox { pad_value: 51 })
    };
    let (t, tr) = preprocess(&img, &p).unwrap();
    // 200x100 fits as 64x32, centred: rows 16..48 hold the image.
    assert_eq!((tr.offset_x, tr.offset_y), (0.0, 16.0));
    assert_eq!((tr.scale_x, tr.scale_y), (200.0 / 64.0, 100.0 / 32.0));
    assert_eq!((tr.orig_width, tr.orig_height), (200, 100));
    for y in 0..64 {
        let inside = (16..48).contains(&y);
        for x in [0usize, 31, 63] {
            let want = if inside { [1.0, 0.0, 0.0] } else { [0.2; 3] };
            for (c, w) in want.iter().enumerate() {
                assert!((tensor_at(&t, c, y, x) - w).abs() < 1e-6, "({x},{y}) c={c}");
            }
        }
    }
    // A box in original pixels → input pixels (naive math) → back through the transform.
    let b = BBox {
        x1: 20.0,
        y1: 30.0,
        x2: 120.0,
        y2: 80.0,
    };
    let s = 64.0 / 200.0;
    let input = BBox {
        x1: 20.0 * s,
        y1: 30.0 * s + 16.0,
        x2: 120.0 * s,
        y2: 80.0 * s + 16.0,
    };
    let (ix, iy) = tr.to_input(b.x1, b.y1);
    assert!(
        (ix - input.x1).abs() < 1e-4 && (iy - input.y1).abs() < 1e-4,
        "{ix},{iy}"
    );
    let back = tr.box_to_original(&input);
    for (a, e) in [
        (back.x1, b.x1),
        (back.y1, b.y1),
        (back.x2, b.x2),
        (back.y2, b.y2),
    ] {
        assert!((a - e).abs() < 1e-4, "{back:?} vs {b:?}");
    }
    // Boxes reaching into the padding are clamped to the image.
    let clamped = tr.box_to_original(&BBox {
        x1: -5.0,
        y1: 2.0,
        x2: 70.0,
        y2: 60.0,
    });
    assert_eq!(
        clamped,
        BBox {
            x1: 0.0,
            y1: 0.0,
            x2: 200.0,
            y2: 100.0
        }
    );
}

#[test]
fn centre_crop_matches_full_resize_then_crop() {
    // 301x200 → short side 256 gives 385x256 (torchvision truncation); (385-224)/2 = 80.5 rounds
    // half-to-even to 80; (256-224)/2 = 16.
    let img = pattern(301, 200);
    let p = Preprocess {
        mean: [0.0; 3],
        std: [1.0; 3],
        scale: 1.0,
        ..rgb_spec(
            224,
            224,
            ResizeMode::ShortSideCenterCrop { short_side: 256 },
        )
    };
    let (t, tr) = preprocess(&img, &p).unwrap();
    assert_eq!((tr.offset_x, tr.offset_y), (-80.0, -16.0));
    assert_eq!((tr.scale_x, tr.scale_y), (301.0 / 385.0, 200.0 / 256.0));
    let full = resize_bilinear(&img, 385, 256).unwrap();
    for y in 0..224 {
        for x in 0..224 {
            let px = full.get_pixel(x as u32 + 80, y as u32 + 16);
            for c in 0..3 {
                assert_eq!(tensor_at(&t, c, y, x), f32::from(px[c]), "({x},{y}) c={c}");
            }
        }
    }
    // Centre of the input maps to the centre of the original image.
    let (cx, cy) = tr.to_original(112.0, 112.0);
    assert!(
        (cx - 150.5).abs() < 0.5 && (cy - 100.0).abs() < 0.01,
        "{cx},{cy}"
    );
    // Too-small short side is a configuration error, not a panic.
    let bad = rgb_spec(
        224,
        224,
        ResizeMode::ShortSideCenterCrop { short_side: 200 },
    );
    assert!(matches!(preprocess(&img, &bad), Err(Error::BadInput(_))));
}

#[test]
fn coffee_preprocess_matches_pillow_pipeline() {
    // Pillow: resize((384, 256), BILINEAR) then crop((80, 16, 304, 240)); sum of all bytes and
    // three probe pixels.
    let bytes = std::fs::read(shared_dir().join("images/eval/coffee.png")).unwrap();
    let img = decode_image(&bytes, &DecodeLimits::default()).unwrap();
    let p = Preprocess {
        scale: 1.0,
        mean: [0.0; 3],
        std: [1.0; 3],
        ..VisionSpec::efficientnet_lite0(vec![]).preprocess
    };
    let (t, _) = preprocess(&img, &p).unwrap();
    let sum: f64 = t.as_f32().unwrap().iter().map(|&v| f64::from(v)).sum();
    assert_eq!(sum, 14237279.0);
    let probe = |x: usize, y: usize| [0, 1, 2].map(|c| tensor_at(&t, c, y, x));
    assert_eq!(probe(0, 0), [158.0, 63.0, 24.0]);
    assert_eq!(probe(37, 100), [124.0, 22.0, 5.0]);
    assert_eq!(probe(223, 223), [152.0, 82.0, 43.0]);
}

// ---------------------------------------------------------------- classification

#[test]
fn classification_softmax_topk_labels() {
    let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
    let out = Tensor::from_f32(vec![1, 5], logits.to_vec()).unwrap();
    let labels = vec!["a".to_string(), "b".into(), "c".into()];
    let spec = VisionSpec {
        top_k: 3,
        ..VisionSpec::efficientnet_lite0(labels)
    };
    let tr = ImageTransform {
        scale_x: 1.0,
        scale_y: 1.0,
        offset_x: 0.0,
        offset_y: 0.0,
        orig_width: 1,
        orig_height: 1,
    };
    let Results::Classes(c) = postprocess(
        &spec,
        std::slice::from_ref(&out),
        &tr,
        &Overrides::default(),
    )
    .unwrap() else {
        panic!("expected classes")
    };
    let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
    let p = |i: usize| f64::from(logits[i]).exp() / z;
    assert_eq!(
        c.iter().map(|c| c.class_id).collect::<Vec<_>>(),
        vec![1, 3, 0]
    );
    assert_eq!(
        c.iter().map(|c| c.label.as_str()).collect::<Vec<_>>(),
        vec!["b", "class_3", "a"]
    );
    for k in &c {
        assert!((f64::from(k.score) - p(k.class_id)).abs() < 1e-6);
    }
    // Overrides: top_k and a threshold that only the two best pass.
    let o = Overrides {
        top_k: Some(10),
        score_threshold: Some(0.3),
    };
    let Results::Classes(c) = postprocess(&spec, &[out], &tr, &o).unwrap() else {
        panic!()
    };
    assert_eq!(c.len(), 2);
    // No softmax: raw values; [C] shape accepted.
    let raw = Tensor::from_f32(vec![3], vec![0.2, 0.7, 0.1]).unwrap();
    let c = classify(&raw, &[], false, 1, 0.0).unwrap();
    assert_eq!(
        (c[0].class_id, c[0].score, c[0].label.as_str()),
        (1, 0.7, "class_1")
    );
    // Bad shape.
    let bad = Tensor::from_f32(vec![2, 3], vec![0.0; 6]).unwrap();
    assert!(matches!(
        classify(&bad, &[], true, 1, 0.0),
        Err(Error::Shape(_))
    ));
}

// ---------------------------------------------------------------- detection

fn bb(x1: f32, y1: f32, x2: f32, y2: f32) -> BBox {
    BBox { x1, y1, x2, y2 }
}

fn det(class_id: usize, score: f32, b: BBox) -> Detection {
    Detection {
        class_id,
        label: format!("class_{class_id}"),
        score,
        bbox: b,
    }
}

#[test]
fn iou_cases() {
    let a = bb(0.0, 0.0, 2.0, 2.0);
    assert_eq!(iou(&a, &a), 1.0);
    assert_eq!(iou(&a, &bb(1.0, 1.0, 3.0, 3.0)), 1.0 / 7.0);
    assert_eq!(iou(&a, &bb(2.0, 0.0, 4.0, 2.0)), 0.0); // touching edges
    assert_eq!(iou(&a, &bb(5.0, 5.0, 6.0, 6.0)), 0.0);
    assert_eq!(iou(&a, &bb(0.0, 0.0, 1.0, 2.0)), 0.5); // contained half
    assert_eq!(iou(&bb(1.0, 1.0, 1.0, 1.0), &bb(1.0, 1.0, 1.0, 1.0)), 0.0); // degenerate
}

#[test]
fn nms_is_greedy_per_class() {
    let dets = vec![
        det(0, 0.6, bb(1.0, 1.0, 11.0, 11.0)), // IoU with #1 = 81/119 ≈ 0.68 → suppressed
        det(0, 0.9, bb(0.0, 0.0, 10.0, 10.0)),
        det(1, 0.8, bb(0.0, 0.0, 10.0, 10.0)), // other class: kept
        det(0, 0.7, bb(5.0, 0.0, 15.0, 10.0)), // IoU with #1 = 50/150 → kept at 0.5
        det(0, 0.5, bb(20.0, 20.0, 30.0, 30.0)),
    ];
    let kept = nms(dets.clone(), 0.5, 100);
    let got: Vec<(usize, f32)> = kept.iter().map(|d| (d.class_id, d.score)).collect();
    assert_eq!(got, vec![(0, 0.9), (1, 0.8), (0, 0.7), (0, 0.5)]);
    // Stricter threshold suppresses the 1/3-overlap box too.
    let kept = nms(dets.clone(), 0.3, 100);
    assert_eq!(
        kept.iter().map(|d| d.score).collect::<Vec<_>>(),
        vec![0.9, 0.8, 0.5]
    );
    // max_detections keeps the best.
    let kept = nms(dets, 0.5, 2);
    assert_eq!(
        kept.iter().map(|d| d.score).collect::<Vec<_>>(),
        vec![0.9, 0.8]
    );
}

/// Synthetic NanoDet outputs for a 416x416 input with `c` classes, in a scrambled order.
struct NanoOut {
    scores: Vec<Vec<f32>>,
    boxes: Vec<Vec<f32>>,
}

const STRIDES: [usize; 3] = [8, 16, 32];

impl NanoOut {
    fn new(c: usize) -> Self {
        let n = |s: usize| (416 / s) * (416 / s);
        NanoOut {
            scores: STRIDES.iter().map(|&s| vec![0.01; n(s) * c]).collect(),
            boxes: STRIDES.iter().map(|&s| vec![0.0; n(s) * 44]).collect(),
        }
    }
    /// Plants a score and one-hot-ish bins (logit 40 at `bins[side]`) at anchor (col, row).
    fn plant(
        &mut self,
        (level, col, row): (usize, usize, usize),
        class: usize,
        score: f32,
        bins: [usize; 4],
    ) {
        let fw = 416 / STRIDES[level];
        let c = self.scores[level].len() / (fw * fw);
        let i = row * fw + col;
        self.scores[level][i * c + class] = score;
        for (side, &b) in bins.iter().enumerate() {
            self.boxes[level][i * 44 + side * 11 + b] = 40.0;
        }
    }
    fn tensors(&self, c: usize) -> Vec<Tensor> {
        let n = |s: usize| (416 / s) * (416 / s);
        let mut v = Vec::new();
        for l in [2, 0, 1] {
            v.push(Tensor::from_f32(vec![1, n(STRIDES[l]), 44], self.boxes[l].clone()).unwrap());
            v.push(Tensor::from_f32(vec![1, n(STRIDES[l]), c], self.scores[l].clone()).unwrap());
        }
        v
    }
}

#[test]
fn nanodet_decodes_planted_boxes() {
    let c = 3;
    let mut o = NanoOut::new(c);
    // Stride 16, col 10, row 7: centre (168, 120); bins l=3, t=2, r=4, b=1 → 48, 32, 64, 16.
    o.plant((1, 10, 7), 2, 0.9, [3, 2, 4, 1]);
    // Same class, neighbouring anchor, heavy overlap, lower score → suppressed by NMS.
    o.plant((1, 11, 7), 2, 0.8, [4, 2, 3, 1]);
    // Same place, another class → kept.
    o.plant((1, 11, 7), 0, 0.85, [4, 2, 3, 1]);
    // Stride 8, col 0, row 0: centre (4, 4); left 2*8 → clamped at the image edge.
    o.plant((0, 0, 0), 1, 0.5, [2, 0, 1, 1]);
    // Below threshold.
    o.plant((2, 5, 5), 1, 0.3, [1, 1, 1, 1]);
    let labels = vec!["person".to_string(), "bicycle".into(), "car".into()];
    let spec = VisionSpec::nanodet_m_416(labels);
    // Original image 832x624 stretched to 416x416: x * 2, y * 1.5.
    let tr = ImageTransform {
        scale_x: 2.0,
        scale_y: 1.5,
        offset_x: 0.0,
        offset_y: 0.0,
        orig_width: 832,
        orig_height: 624,
    };
    let Results::Detections(d) =
        postprocess(&spec, &o.tensors(c), &tr, &Overrides::default()).unwrap()
    else {
        panic!("expected detections")
    };
    assert_eq!(d.len(), 3, "{d:?}");
    assert_eq!(
        (d[0].class_id, d[0].label.as_str(), d[0].score),
        (2, "car", 0.9)
    );
    let want = [
        (168.0 - 48.0) * 2.0,
        (120.0 - 32.0) * 1.5,
        (168.0 + 64.0) * 2.0,
        (120.0 + 16.0) * 1.5,
    ];
    let got = [d[0].bbox.x1, d[0].bbox.y1, d[0].bbox.x2, d[0].bbox.y2];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-3, "{got:?} vs {want:?}");
    }
    assert_eq!((d[1].class_id, d[1].score), (0, 0.85));
    let want1 = [
        (184.0 - 64.0) * 2.0,
        (120.0 - 32.0) * 1.5,
        (184.0 + 48.0) * 2.0,
        (120.0 + 16.0) * 1.5,
    ];
    let got1 = [d[1].bbox.x1, d[1].bbox.y1, d[1].bbox.x2, d[1].bbox.y2];
    for (g, w) in got1.iter().zip(want1) {
        assert!((g - w).abs() < 1e-3, "{got1:?} vs {want1:?}");
    }
    assert_eq!(d[2].class_id, 1);
    let got2 = [d[2].bbox.x1, d[2].bbox.y1, d[2].bbox.x2, d[2].bbox.y2];
    let want2 = [0.0, (4.0 - 0.0) * 1.5, (4.0 + 8.0) * 2.0, (4.0 + 8.0) * 1.5];
    for (g, w) in got2.iter().zip(want2) {
        assert!((g - w).abs() < 1e-3, "{got2:?} vs {want2:?}");
    }
    // Lowering the threshold brings back the 0.3 box.
    let o2 = Overrides {
        score_threshold: Some(0.2),
        ..Default::default()
    };
    let Results::Detections(d) = postprocess(&spec, &o.tensors(c), &tr, &o2).unwrap() else {
        panic!()
    };
    assert_eq!(d.len(), 4);
}

#[test]
fn nanodet_distribution_expectation() {
    // Two equal bins (2 and 3) → expectation 2.5 bins; check against a naive softmax.
    let c = 1;
    let mut o = NanoOut::new(c);
    o.plant((2, 6, 6), 0, 0.99, [2, 2, 2, 2]);
    let i = 6 * 13 + 6;
    for side in 0..4 {
        o.boxes[2][i * 44 + side * 11 + 3] = 40.0;
    }
    let spec = VisionSpec::nanodet_m_416(vec![]);
    let tr = ImageTransform {
        scale_x: 1.0,
        scale_y: 1.0,
        offset_x: 0.0,
        offset_y: 0.0,
        orig_width: 416,
        orig_height: 416,
    };
    let Results::Detections(d) =
        postprocess(&spec, &o.tensors(c), &tr, &Overrides::default()).unwrap()
    else {
        panic!()
    };
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].label, "class_0");
    let centre = 6.5 * 32.0;
    let dist = 2.5 * 32.0;
    let b = d[0].bbox;
    for (g, w) in [
        (b.x1, centre - dist),
        (b.y1, centre - dist),
        (b.x2, centre + dist),
        (b.y2, centre + dist),
    ] {
        assert!((g - w).abs() < 1e-3, "{b:?}");
    }
}

#[test]
fn nanodet_rejects_bad_shapes() {
    let spec = VisionSpec::nanodet_m_416(vec![]);
    let tr = ImageTransform {
        scale_x: 1.0,
        scale_y: 1.0,
        offset_x: 0.0,
        offset_y: 0.0,
        orig_width: 416,
        orig_height: 416,
    };
    let mut t = NanoOut::new(2).tensors(2);
    t.pop();
    let err = postprocess(&spec, &t, &tr, &Overrides::default()).unwrap_err();
    assert!(matches!(err, Error::Shape(_)), "{err}");
    let wrong = vec![Tensor::from_f32(vec![1, 10, 44], vec![0.0; 440]).unwrap()];
    assert!(matches!(
        postprocess(&spec, &wrong, &tr, &Overrides::default()),
        Err(Error::Shape(_))
    ));
}

fn yolo_spec() -> VisionSpec {
    VisionSpec {
        task: Task::Detection {
            head: DetectionHead::Yolov8,
        },
        preprocess: Preprocess {
            mean: [0.0; 3],
            std: [1.0; 3],
            ..rgb_spec(640, 640, ResizeMode::Letterbox { pad_value: 114 })
        },
        labels: vec!["person".into(), "dog".into()],
        top_k: 5,
        score_threshold: 0.25,
        iou_threshold: 0.5,
        max_detections: 100,
    }
}

#[test]
fn yolov8_decodes_planted_boxes() {
    let spec = yolo_spec();
    // Letterbox transform of a 1280x640 image: scale 2, 320 rows centred (offset 160).
    let img = RgbImage::from_pixel(1280, 640, Rgb([0, 0, 0]));
    let (_, tr) = preprocess(&img, &spec.preprocess).unwrap();
    assert_eq!(
        (tr.scale_x, tr.scale_y, tr.offset_x, tr.offset_y),
        (2.0, 2.0, 0.0, 160.0)
    );
    // N = 5 anchors, rows: cx, cy, w, h, score person, score dog.
    let anchors: [[f32; 6]; 5] = [
        [320.0, 320.0, 100.0, 50.0, 0.1, 0.9],  // dog
        [322.0, 321.0, 100.0, 50.0, 0.2, 0.6],  // dog, overlaps → suppressed
        [322.0, 321.0, 100.0, 50.0, 0.7, 0.1],  // person at the same place → kept
        [600.0, 200.0, 200.0, 200.0, 0.0, 0.3], // dog, runs off the right edge → clamped
        [100.0, 400.0, 10.0, 10.0, 0.2, 0.1],   // below threshold
    ];
    let n = anchors.len();
    let mut data = vec![0f32; 6 * n];
    for (i, a) in anchors.iter().enumerate() {
        for (r, v) in a.iter().enumerate() {
            data[r * n + i] = *v;
        }
    }
    let out = Tensor::from_f32(vec![1, 6, n], data).unwrap();
    let Results::Detections(d) = postprocess(&spec, &[out], &tr, &Overrides::default()).unwrap()
    else {
        panic!()
    };
    let to_orig = |cx: f32, cy: f32, w: f32, h: f32| {
        let m = |x: f32, y: f32| (x * 2.0, (y - 160.0) * 2.0);
        let (x1, y1) = m(cx - w / 2.0, cy - h / 2.0);
        let (x2, y2) = m(cx + w / 2.0, cy + h / 2.0);
        bb(
            x1.clamp(0.0, 1280.0),
            y1.clamp(0.0, 640.0),
            x2.clamp(0.0, 1280.0),
            y2.clamp(0.0, 640.0),
        )
    };
    let got: Vec<(&str, f32, BBox)> = d
        .iter()
        .map(|d| (d.label.as_str(), d.score, d.bbox))
        .collect();
    assert_eq!(
        got,
        vec![
            ("dog", 0.9, to_orig(320.0, 320.0, 100.0, 50.0)),
            ("person", 0.7, to_orig(322.0, 321.0, 100.0, 50.0)),
            ("dog", 0.3, to_orig(600.0, 200.0, 200.0, 200.0)),
        ]
    );
    assert_eq!(d[2].bbox.x2, 1280.0);
    assert_eq!(d[0].bbox, bb(540.0, 270.0, 740.0, 370.0));
    // Bad shape.
    let bad = Tensor::from_f32(vec![1, 4, 3], vec![0.0; 12]).unwrap();
    assert!(matches!(
        postprocess(&spec, &[bad], &tr, &Overrides::default()),
        Err(Error::Shape(_))
    ));
}

// ---------------------------------------------------------------- pipeline and labels

#[test]
fn labels_parse_and_load() {
    assert_eq!(
        parse_labels("\u{feff}a\n b \r\n\nc\n\n"),
        vec!["a", "b", "", "c"]
    );
    assert_eq!(parse_labels("x\ny"), vec!["x", "y"]);
    let path = std::env::temp_dir().join(format!("vigil-labels-{}.txt", std::process::id()));
    std::fs::write(&path, "cat\ndog\n").unwrap();
    assert_eq!(load_labels(&path).unwrap(), vec!["cat", "dog"]);
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(load_labels(&path), Err(Error::Io(_))));
    let imagenet = load_labels(&shared_dir().join("models/imagenet-labels.txt")).unwrap();
    assert_eq!((imagenet.len(), imagenet[0].as_str()), (1000, "tench"));
    let coco = load_labels(&shared_dir().join("models/coco-labels.txt")).unwrap();
    assert_eq!((coco.len(), coco[0].as_str()), (80, "person"));
}

#[test]
fn infer_image_reports_decode_errors_first() {
    let model = crate::Model::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/nanodet-m-416.onnx"),
        &crate::ModelOptions::default(),
    )
    .unwrap();
    let mut ctx = model.new_context().unwrap();
    let spec = VisionSpec::nanodet_m_416(vec![]);
    let r = infer_image(
        &mut ctx,
        &spec,
        b"\x89PNG\r\n\x1a\ntruncated",
        &DecodeLimits::default(),
        &Overrides::default(),
    );
    assert!(is_image_err(&r));
}
