//! Drawing results onto frames (boxes, and labels in a built-in 5x7 bitmap font) and JPEG
//! encoding for snapshots and MJPEG streams.

use image::RgbImage;
use vigil_engine::vision::Results;

/// 5x7 glyphs, column-major, least significant bit = top row (the classic HD44780-style font).
fn glyph(c: char) -> [u8; 5] {
    match c.to_ascii_uppercase() {
        '0' => [0x3E, 0x51, 0x49, 0x45, 0x3E],
        '1' => [0x00, 0x42, 0x7F, 0x40, 0x00],
        '2' => [0x42, 0x61, 0x51, 0x49, 0x46],
        '3' => [0x21, 0x41, 0x45, 0x4B, 0x31],
        '4' => [0x18, 0x14, 0x12, 0x7F, 0x10],
        '5' => [0x27, 0x45, 0x45, 0x45, 0x39],
        '6' => [0x3C, 0x4A, 0x49, 0x49, 0x30],
        '7' => [0x01, 0x71, 0x09, 0x05, 0x03],
        '8' => [0x36, 0x49, 0x49, 0x49, 0x36],
        '9' => [0x06, 0x49, 0x49, 0x29, 0x1E],
        'A' => [0x7E, 0x11, 0x11, 0x11, 0x7E],
        'B' => [0x7F, 0x49, 0x49, 0x49, 0x36],
        'C' => [0x3E, 0x41, 0x41, 0x41, 0x22],
        'D' => [0x7F, 0x41, 0x41, 0x22, 0x1C],
        'E' => [0x7F, 0x49, 0x49, 0x49, 0x41],
        'F' => [0x7F, 0x09, 0x09, 0x01, 0x01],
        'G' => [0x3E, 0x41, 0x41, 0x51, 0x32],
        'H' => [0x7F, 0x08, 0x08, 0x08, 0x7F],
        'I' => [0x00, 0x41, 0x7F, 0x41, 0x00],
        'J' => [0x20, 0x40, 0x41, 0x3F, 0x01],
        'K' => [0x7F, 0x08, 0x14, 0x22, 0x41],
        'L' => [0x7F, 0x40, 0x40, 0x40, 0x40],
        'M' => [0x7F, 0x02, 0x04, 0x02, 0x7F],
        'N' => [0x7F, 0x04, 0x08, 0x10, 0x7F],
        'O' => [0x3E, 0x41, 0x41, 0x41, 0x3E],
        'P' => [0x7F, 0x09, 0x09, 0x09, 0x06],
        'Q' => [0x3E, 0x41, 0x51, 0x21, 0x5E],
        'R' => [0x7F, 0x09, 0x19, 0x29, 0x46],
        'S' => [0x46, 0x49, 0x49, 0x49, 0x31],
        'T' => [0x01, 0x01, 0x7F, 0x01, 0x01],
        'U' => [0x3F, 0x40, 0x40, 0x40, 0x3F],
        'V' => [0x1F, 0x20, 0x40, 0x20, 0x1F],
        'W' => [0x7F, 0x20, 0x18, 0x20, 0x7F],
        'X' => [0x63, 0x14, 0x08, 0x14, 0x63],
        'Y' => [0x03, 0x04, 0x78, 0x04, 0x03],
        'Z' => [0x61, 0x51, 0x49, 0x45, 0x43],
        '.' => [0x00, 0x60, 0x60, 0x00, 0x00],
        '-' | '_' => [0x08, 0x08, 0x08, 0x08, 0x08],
        '%' => [0x23, 0x13, 0x08, 0x64, 0x62],
        _ => [0; 5],
    }
}

/// A distinct colour per class id.
pub fn class_color(class_id: usize) -> [u8; 3] {
    const PALETTE: [[u8; 3]; 8] = [
        [255, 56, 56],
        [72, 249, 10],
        [0, 194, 255],
        [255, 157, 151],
        [255, 178, 29],
        [207, 210, 49],
        [146, 204, 23],
        [132, 56, 255],
    ];
    PALETTE[class_id % PALETTE.len()]
}

fn put(img: &mut RgbImage, x: i64, y: i64, c: [u8; 3]) {
    if x >= 0
        && y >= 0
        && (x as u64) < u64::from(img.width())
        && (y as u64) < u64::from(img.height())
    {
        img.put_pixel(x as u32, y as u32, image::Rgb(c));
    }
}

/// Draws a rectangle outline `thickness` pixels wide (clipped to the image).
pub fn draw_rect(
    img: &mut RgbImage,
    x1: f32,
    y1: f32,
    x2: f32,
    y2: f32,
    thickness: i64,
    c: [u8; 3],
) {
    let (x1, y1, x2, y2) = (
        x1.round() as i64,
        y1.round() as i64,
        x2.round() as i64 - 1,
        y2.round() as i64 - 1,
    );
    for t in 0..thickness {
        for x in x1..=x2 {
            put(img, x, y1 + t, c);
            put(img, x, y2 - t, c);
        }
        for y in y1..=y2 {
            put(img, x1 + t, y, c);
            put(img, x2 - t, y, c);
        }
    }
}

/// Draws `text` with its top-left corner at (x, y) on a filled background, scaled by `scale`.
pub fn draw_text(
    img: &mut RgbImage,
    x: i64,
    y: i64,
    text: &str,
    scale: i64,
    fg: [u8; 3],
    bg: [u8; 3],
) {
    let n = text.chars().count() as i64;
    for yy in y..y + 9 * scale {
        for xx in x..x + (n * 6 + 1) * scale {
            put(img, xx, yy, bg);
        }
    }
    for (i, ch) in text.chars().enumerate() {
        let g = glyph(ch);
        for (col, bits) in g.iter().enumerate() {
            for row in 0..7 {
                if bits >> row & 1 == 1 {
                    for dy in 0..scale {
                        for dx in 0..scale {
                            put(
                                img,
                                x + (1 + i as i64 * 6 + col as i64) * scale + dx,
                                y + (1 + row) * scale + dy,
                                fg,
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Draws detections (box + "label 87%") or the top class (a caption) onto the frame.
pub fn draw_results(img: &mut RgbImage, results: &Results) {
    let scale = i64::from((img.width() / 640).max(1));
    match results {
        Results::Detections(dets) => {
            for d in dets {
                let c = class_color(d.class_id);
                draw_rect(
                    img,
                    d.bbox.x1,
                    d.bbox.y1,
                    d.bbox.x2,
                    d.bbox.y2,
                    2 * scale,
                    c,
                );
                let text = format!("{} {:.0}%", d.label, d.score * 100.0);
                let ty = (d.bbox.y1.round() as i64 - 9 * scale).max(0);
                draw_text(
                    img,
                    d.bbox.x1.round() as i64,
                    ty,
                    &text,
                    scale,
                    [0, 0, 0],
                    c,
                );
            }
        }
        Results::Classes(classes) => {
            if let Some(top) = classes.first() {
                let text = format!("{} {:.0}%", top.label, top.score * 100.0);
                draw_text(img, 4, 4, &text, scale, [255, 255, 255], [0, 0, 0]);
            }
        }
    }
}

/// Encodes RGB8 as a baseline JPEG.
pub fn encode_jpeg(img: &RgbImage, quality: u8) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(img.as_raw().len() / 8);
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality)
        .encode_image(img)
        .map_err(|e| format!("JPEG encoding failed: {e}"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_engine::vision::{BBox, Detection};

    #[test]
    fn boxes_are_drawn_on_their_edges_only() {
        let mut img = RgbImage::new(100, 80);
        let det = Detection {
            class_id: 0,
            label: "person".into(),
            score: 0.9,
            bbox: BBox {
                x1: 20.0,
                y1: 30.0,
                x2: 60.0,
                y2: 70.0,
            },
        };
        draw_results(&mut img, &Results::Detections(vec![det]));
        let c = class_color(0);
        assert_eq!(img.get_pixel(20, 50).0, c); // left edge
        assert_eq!(img.get_pixel(59, 50).0, c); // right edge
        assert_eq!(img.get_pixel(40, 69).0, c); // bottom edge
        assert_eq!(img.get_pixel(40, 50).0, [0, 0, 0]); // inside untouched
        assert_eq!(img.get_pixel(80, 50).0, [0, 0, 0]); // outside untouched
                                                        // The label strip sits above the box (y 21..30) with black text pixels on it.
        let strip: Vec<[u8; 3]> = (21..30)
            .flat_map(|y| (20..60).map(move |x| (x, y)))
            .map(|(x, y)| img.get_pixel(x, y).0)
            .collect();
        assert!(strip.contains(&c) && strip.contains(&[0, 0, 0]));
    }

    #[test]
    fn jpeg_round_trips() {
        let img = RgbImage::from_fn(32, 16, |x, _| image::Rgb([x as u8 * 8, 100, 50]));
        let j = encode_jpeg(&img, 90).unwrap();
        let back = image::load_from_memory(&j).unwrap().to_rgb8();
        assert_eq!(back.dimensions(), (32, 16));
        let p = back.get_pixel(16, 8).0;
        assert!(
            (i32::from(p[0]) - 128).abs() <= 6 && (i32::from(p[1]) - 100).abs() <= 6,
            "{p:?}"
        );
    }
}
