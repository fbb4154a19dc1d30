//! Seeded mutation fuzzing of the engine's untrusted entry points: image decoding
//! (`vision::decode_image`) and ONNX import + compilation (`onnx::load_model`, `Model::from_graph`).
//!
//! Seeds are small valid files (images encoded here with the `image` crate, ONNX models in
//! `fuzz-regressions/seeds/`, made by `make_seeds.py`). Each case applies a few byte-level (or,
//! for ONNX, protobuf-field-level) mutations from a fixed xorshift seed, runs the target and
//! checks: no panic escapes, no panic happened at all (decode_image contains decoder panics; a
//! counting panic hook still sees them), no single allocation above 2 GiB (refused: the process
//! would abort, and `vigil-fuzz-current-*.bin` in the temp dir then holds the input), and the
//! peak heap growth stays within a budget. Failing inputs are written to the temp dir and named
//! in the failure message; minimized ones belong in `fuzz-regressions/{image,onnx}/`, which
//! `replay_regression_corpus` replays.
//!
//! `VIGIL_FUZZ_CASES` and `VIGIL_FUZZ_SEED` override the case count and seed for longer runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

use image::{ImageBuffer, ImageFormat, Luma, LumaA, Rgb, RgbImage, Rgba};
use prost::Message;
use vigil_engine::onnx::proto;
use vigil_engine::vision::{decode_image, DecodeLimits};
use vigil_engine::{Error, Model, ModelOptions, Tensor};

// ---------------------------------------------------------------------------------------------
// Allocation accounting: a counting global allocator for this test binary.

/// A single allocation above this is refused (null): the engine must never ask for it.
const HARD_CAP: usize = 2 << 30;
/// Peak heap growth allowed per case (the fuzz image limit is 1 Mpx; the seeds are tiny).
const CASE_BUDGET: usize = 512 << 20;

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: forwards to `System` unchanged; only counts sizes and refuses absurd requests with null.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > HARD_CAP {
            return std::ptr::null_mut();
        }
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > HARD_CAP {
            return std::ptr::null_mut();
        }
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > HARD_CAP {
            return std::ptr::null_mut();
        }
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// ---------------------------------------------------------------------------------------------
// Panic accounting: a hook that records every panic (also ones caught inside the engine).

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HOOK: Once = Once::new();
/// Fuzz tests share the allocator counters and the panic log, so they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn install_hook() {
    HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
                (*s).to_string()
            } else if let Some(s) = info.payload().downcast_ref::<String>() {
                s.clone()
            } else {
                "<non-string payload>".to_string()
            };
            let at = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            // Still print it: a failing assertion in a test must show its message.
            eprintln!("panic: {msg} at {at}");
            lock(&PANICS).push(format!("{msg} at {at}"));
        }));
    });
}

// ---------------------------------------------------------------------------------------------
// Deterministic randomness and mutators.

/// xorshift64* generator: tiny, seedable, reproducible across platforms.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform-ish in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

const INTERESTING_U32: [u32; 14] = [
    0,
    1,
    2,
    0x7F,
    0x80,
    0xFF,
    0x100,
    0x7FFF,
    0xFFFF,
    0x1_0000,
    0x7FFF_FFFF,
    0x8000_0000,
    0xFFFF_FFFF,
    100_000,
];

/// Applies 1–4 stacked byte-level mutations; `others` are splice partners of the same kind.
fn mutate_bytes(seed: &[u8], others: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        if b.is_empty() {
            b.push(rng.next() as u8);
            continue;
        }
        let len = b.len();
        match rng.below(9) {
            0 => {
                let i = rng.below(len);
                b[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(len);
                b[i] = [0x00, 0x01, 0x7F, 0x80, 0xFF][rng.below(5)];
            }
            2 => {
                // Overwrite a 16- or 32-bit field (image headers hold sizes as BE or LE ints).
                let v = INTERESTING_U32[rng.below(INTERESTING_U32.len())];
                let bytes = if rng.chance(2) {
                    v.to_be_bytes()
                } else {
                    v.to_le_bytes()
                };
                let w = if rng.chance(2) { 2 } else { 4 };
                let src = if w == 2 { &bytes[2..] } else { &bytes[..] };
                let i = rng.below(len);
                for (k, &x) in src.iter().enumerate() {
                    if let Some(slot) = b.get_mut(i + k) {
                        *slot = x;
                    }
                }
            }
            3 => b.truncate(rng.below(len)),
            4 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                b.drain(i..i + n);
            }
            5 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let ins: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                b.splice(i..i, ins);
            }
            6 => {
                // Duplicate a range in place.
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(256));
                let chunk = b[i..i + n].to_vec();
                let at = rng.below(len + 1);
                b.splice(at..at, chunk);
            }
            7 => {
                // Splice: our prefix, another seed's suffix.
                let other = &others[rng.below(others.len())];
                if !other.is_empty() {
                    let cut = rng.below(len);
                    let from = rng.below(other.len());
                    b.truncate(cut);
                    b.extend_from_slice(&other[from..]);
                }
            }
            _ => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(8));
                for x in &mut b[i..i + n] {
                    *x = rng.next() as u8;
                }
            }
        }
    }
    b
}

/// CRC-32 (IEEE), bitwise: enough for re-sealing a few small PNG chunks.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &byte in data {
        crc ^= u32::from(byte);
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

/// Recomputes every PNG chunk CRC so mutations reach the chunk parsers instead of the CRC check.
fn fix_png_crcs(b: &mut [u8]) {
    let mut i = 8;
    while i + 8 <= b.len() {
        let n = u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as usize;
        let Some(end) = (i + 8).checked_add(n) else {
            return;
        };
        if end + 4 > b.len() {
            return;
        }
        let crc = crc32(&b[i + 4..end]);
        b[end..end + 4].copy_from_slice(&crc.to_be_bytes());
        i = end + 4;
    }
}

fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&body).to_be_bytes());
    out
}

// ---------------------------------------------------------------------------------------------
// Seeds.

/// A deterministic test picture whose pixels all differ.
fn picture(w: u32, h: u32) -> RgbImage {
    ImageBuffer::from_fn(w, h, |x, y| {
        Rgb([
            (x * 37 + y * 11) as u8,
            (y * 53 + x * 3 + 40) as u8,
            (x * y * 7 + 90) as u8,
        ])
    })
}

fn encode(img: &image::DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format)
        .unwrap_or_else(|e| panic!("encoding a {format:?} seed: {e}"));
    out.into_inner()
}

/// A TIFF-in-EXIF block holding only the orientation tag.
fn exif_orientation(o: u16) -> Vec<u8> {
    let mut t = b"II*\0".to_vec();
    t.extend_from_slice(&8u32.to_le_bytes());
    t.extend_from_slice(&1u16.to_le_bytes()); // one IFD entry
    t.extend_from_slice(&0x0112u16.to_le_bytes()); // Orientation
    t.extend_from_slice(&3u16.to_le_bytes()); // SHORT
    t.extend_from_slice(&1u32.to_le_bytes());
    t.extend_from_slice(&o.to_le_bytes());
    t.extend_from_slice(&[0, 0]);
    t.extend_from_slice(&0u32.to_le_bytes()); // no next IFD
    t
}

/// Inserts an APP1 EXIF segment right after the SOI marker of a JPEG.
fn jpeg_with_orientation(jpeg: &[u8], o: u16) -> Vec<u8> {
    let mut payload = b"Exif\0\0".to_vec();
    payload.extend_from_slice(&exif_orientation(o));
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&((payload.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&payload);
    out.extend_from_slice(&jpeg[2..]);
    out
}

/// Inserts an eXIf chunk right after IHDR of a PNG.
fn png_with_orientation(png: &[u8], o: u16) -> Vec<u8> {
    let ihdr_end = 8 + 8 + 13 + 4;
    let mut out = png[..ihdr_end].to_vec();
    out.extend_from_slice(&png_chunk(b"eXIf", &exif_orientation(o)));
    out.extend_from_slice(&png[ihdr_end..]);
    out
}

/// Small valid images in every supported format, with and without EXIF orientation.
fn image_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use image::DynamicImage as D;
    let rgb = D::ImageRgb8(picture(8, 8));
    let odd = D::ImageRgb8(picture(5, 3));
    let rgba = D::ImageRgba8(ImageBuffer::from_fn(6, 4, |x, y| {
        Rgba([(x * 40) as u8, (y * 60) as u8, 200, (x * y * 10) as u8])
    }));
    let gray16 = D::ImageLuma16(ImageBuffer::from_fn(4, 4, |x, y| {
        Luma([(x * 4000 + y * 9000) as u16])
    }));
    let gray_a = D::ImageLumaA8(ImageBuffer::from_fn(3, 5, |x, y| {
        LumaA([(x * 70 + y) as u8, 128])
    }));
    let jpeg = encode(&rgb, ImageFormat::Jpeg);
    let png_odd = encode(&odd, ImageFormat::Png);
    vec![
        ("png_rgb8", encode(&rgb, ImageFormat::Png)),
        ("png_rgba8", encode(&rgba, ImageFormat::Png)),
        ("png_gray16", encode(&gray16, ImageFormat::Png)),
        ("png_graya8", encode(&gray_a, ImageFormat::Png)),
        ("png_exif6", png_with_orientation(&png_odd, 6)),
        ("bmp_rgb8", encode(&odd, ImageFormat::Bmp)),
        ("bmp_rgba8", encode(&rgba, ImageFormat::Bmp)),
        ("jpeg_rgb8", jpeg.clone()),
        (
            "jpeg_gray",
            encode(&D::ImageLuma8(rgb.to_luma8()), ImageFormat::Jpeg),
        ),
        (
            "jpeg_exif8",
            jpeg_with_orientation(&encode(&odd, ImageFormat::Jpeg), 8),
        ),
        ("webp_rgb8", encode(&odd, ImageFormat::WebP)),
        ("webp_rgba8", encode(&rgba, ImageFormat::WebP)),
    ]
}

fn repo_dir(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Sorted `(name, bytes)` of the files directly in a folder (missing folder: none).
fn read_dir_files(dir: &Path, ext: Option<&str>) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let hidden = e.file_name().to_string_lossy().starts_with('.');
            if hidden
                || !p.is_file()
                || ext.is_some_and(|x| p.extension().and_then(|s| s.to_str()) != Some(x))
            {
                continue;
            }
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            out.push((e.file_name().to_string_lossy().into_owned(), bytes));
        }
    }
    out.sort();
    out
}

fn onnx_seeds() -> Vec<(String, Vec<u8>)> {
    let seeds = read_dir_files(&repo_dir("tests/fuzz-regressions/seeds"), Some("onnx"));
    assert!(
        seeds.len() >= 4,
        "expected the ONNX seed models in fuzz-regressions/seeds"
    );
    seeds
}

// ---------------------------------------------------------------------------------------------
// Targets.

/// Pixel limit used while fuzzing (keeps legitimate decodes small).
const FUZZ_LIMITS: DecodeLimits = DecodeLimits {
    max_pixels: 1 << 20,
};

/// decode_image must give an RGB picture within the limit or an image error (corrupt,
/// unsupported format, or over the pixel limit).
fn image_target(bytes: &[u8]) -> Result<&'static str, String> {
    match decode_image(bytes, &FUZZ_LIMITS) {
        Ok(img) => {
            let px = u64::from(img.width()) * u64::from(img.height());
            if px == 0 || px > FUZZ_LIMITS.max_pixels {
                return Err(format!(
                    "decoded {}x{} despite the limit",
                    img.width(),
                    img.height()
                ));
            }
            Ok("decoded")
        }
        Err(Error::Image(_) | Error::UnsupportedImage(_) | Error::ImageTooLarge(_)) => {
            Ok("rejected")
        }
        Err(e) => Err(format!("error of the wrong kind: {e:?}")),
    }
}

/// Largest input (elements) and arena (bytes) for which a compiled fuzz model is also run.
const RUN_MAX_ELEMS: usize = 1 << 20;
const RUN_MAX_ARENA: usize = 64 << 20;

/// load_model then from_graph (shape inference, folding, kernel selection), then one run with
/// zero inputs when the model is small: each step must return Ok or Err.
fn onnx_target(bytes: &[u8]) -> Result<&'static str, String> {
    let Ok(graph) = vigil_engine::onnx::load_model(bytes) else {
        return Ok("load error");
    };
    let opts = ModelOptions {
        threads: 1,
        ..ModelOptions::default()
    };
    let Ok(model) = Model::from_graph(graph, &opts) else {
        return Ok("compile error");
    };
    let elems: usize = model
        .inputs()
        .iter()
        .map(|i| i.shape.iter().product::<usize>())
        .sum();
    if elems > RUN_MAX_ELEMS || model.arena_bytes() > RUN_MAX_ARENA {
        return Ok("compiled, too big to run");
    }
    let Ok(mut ctx) = model.new_context() else {
        return Ok("context error");
    };
    let inputs: Vec<Tensor> = model
        .inputs()
        .iter()
        .map(|i| Tensor::zeros(i.dtype, i.shape.clone()))
        .collect();
    let Ok(outs) = ctx.run(&inputs) else {
        return Ok("run error");
    };
    {
        if outs.len() != model.outputs().len() {
            return Err(format!(
                "run gave {} outputs, model declares {}",
                outs.len(),
                model.outputs().len()
            ));
        }
        for (o, info) in outs.iter().zip(model.outputs()) {
            if o.shape != info.shape {
                return Err(format!(
                    "output '{}' has shape {:?}, model declares {:?}",
                    info.name, o.shape, info.shape
                ));
            }
        }
    }
    Ok("ran")
}

// ---------------------------------------------------------------------------------------------
// Case runner.

/// Runs one input through a target under the panic and allocation checks: `Ok(outcome label)`
/// or `Err(finding)`.
fn run_case(
    target: &str,
    input: &[u8],
    f: fn(&[u8]) -> Result<&'static str, String>,
) -> Result<&'static str, String> {
    install_hook();
    // If the process aborts (refused allocation), this file holds the culprit.
    let current = std::env::temp_dir().join(format!("vigil-fuzz-current-{target}.bin"));
    let _ = std::fs::write(&current, input);
    lock(&PANICS).clear();
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let outcome = catch_unwind(AssertUnwindSafe(|| f(input)));
    let growth = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let panics = std::mem::take(&mut *lock(&PANICS));
    let problem = match outcome {
        Err(_) => format!("panic escaped: {}", panics.join(" | ")),
        Ok(_) if !panics.is_empty() => format!("panic (contained): {}", panics.join(" | ")),
        Ok(Err(msg)) => msg,
        Ok(Ok(_)) if growth > CASE_BUDGET => format!("peak heap growth {growth} bytes"),
        Ok(Ok(label)) => return Ok(label),
    };
    let saved = std::env::temp_dir().join(format!("vigil-fuzz-{target}-{:08x}.bin", crc32(input)));
    let _ = std::fs::write(&saved, input);
    Err(format!("{problem} [input saved to {}]", saved.display()))
}

/// Outcome tally and findings of a run.
#[derive(Default)]
struct Tally {
    cases: usize,
    outcomes: BTreeMap<&'static str, usize>,
    findings: Vec<String>,
}

impl Tally {
    fn add(&mut self, r: Result<&'static str, String>) {
        self.cases += 1;
        match r {
            Ok(label) => *self.outcomes.entry(label).or_default() += 1,
            Err(f) => self.findings.push(f),
        }
    }
    /// Prints the outcome mix and fails on any finding.
    fn finish(&self, target: &str) {
        println!(
            "{target}: {} cases, outcomes {:?}, {} findings",
            self.cases,
            self.outcomes,
            self.findings.len()
        );
        assert!(
            self.findings.is_empty(),
            "{target}: {} of {} cases failed:\n{}",
            self.findings.len(),
            self.cases,
            self.findings.join("\n")
        );
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// Protobuf-level ONNX mutations (reach shape inference and folding instead of the decoder).

const INTERESTING_I64: [i64; 16] = [
    0,
    1,
    -1,
    2,
    -2,
    3,
    7,
    64,
    -64,
    65_536,
    1 << 31,
    -(1 << 31),
    1 << 40,
    i64::MAX,
    i64::MIN,
    i64::MAX / 3,
];

fn pick_i64(rng: &mut Rng, old: i64) -> i64 {
    match rng.below(4) {
        0 => old.wrapping_add(1),
        1 => old.wrapping_sub(1),
        _ => INTERESTING_I64[rng.below(INTERESTING_I64.len())],
    }
}

fn pick_f32(rng: &mut Rng) -> f32 {
    [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        1e-30,
        1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        3.0,
    ][rng.below(11)]
}

fn mutate_tensor(t: &mut proto::TensorProto, rng: &mut Rng) {
    match rng.below(6) {
        0 if !t.dims.is_empty() => {
            let i = rng.below(t.dims.len());
            t.dims[i] = pick_i64(rng, t.dims[i]);
        }
        5 if t.dims.len() >= 2 => {
            // Same element count, different shape: swap two dims or merge the first two.
            if rng.chance(2) {
                let last = t.dims.len() - 1;
                t.dims.swap(0, last);
            } else {
                let d = t.dims.remove(0);
                t.dims[0] = t.dims[0].wrapping_mul(d);
            }
        }
        5 => t.dims.insert(0, 1),
        1 => {
            if rng.chance(2) || t.dims.is_empty() {
                t.dims.push(pick_i64(rng, 1));
            } else {
                t.dims.pop();
            }
        }
        2 => t.data_type = Some([1, 2, 3, 6, 7, 9, 10, 11, 16, 0, 99][rng.below(11)]),
        _ => {
            let Some(raw) = t.raw_data.as_mut() else {
                t.dims.clear();
                return;
            };
            if raw.is_empty() {
                raw.push(1);
                return;
            }
            // Rewrite one element as an interesting int64 or float32 (by the declared type).
            if t.data_type == Some(7) && raw.len() >= 8 {
                let i = rng.below(raw.len() / 8) * 8;
                let old = i64::from_le_bytes(raw[i..i + 8].try_into().unwrap_or([0; 8]));
                raw[i..i + 8].copy_from_slice(&pick_i64(rng, old).to_le_bytes());
            } else if raw.len() >= 4 {
                let i = rng.below(raw.len() / 4) * 4;
                raw[i..i + 4].copy_from_slice(&pick_f32(rng).to_le_bytes());
            } else {
                raw.truncate(rng.below(raw.len()));
            }
        }
    }
}

fn mutate_attr(a: &mut proto::AttributeProto, rng: &mut Rng) {
    if !a.ints.is_empty() {
        match rng.below(3) {
            0 => {
                a.ints.pop();
            }
            1 => a.ints.push(pick_i64(rng, 1)),
            _ => {
                let i = rng.below(a.ints.len());
                a.ints[i] = pick_i64(rng, a.ints[i]);
            }
        }
    } else if let Some(i) = a.i {
        a.i = Some(pick_i64(rng, i));
    } else if a.f.is_some() {
        a.f = Some(pick_f32(rng));
    } else if let Some(t) = a.t.as_mut() {
        mutate_tensor(t, rng);
    } else if a.s.is_some() {
        let choices: [&[u8]; 6] = [b"", b"nearest", b"linear", b"cubic", b"reflect", b"\xff"];
        a.s = Some(choices[rng.below(choices.len())].to_vec());
    }
}

fn mutate_value_info(v: &mut proto::ValueInfoProto, rng: &mut Rng) {
    use proto::tensor_shape_proto::dimension::Value as Dim;
    use proto::type_proto::Value as Ty;
    let Some(Ty::TensorType(t)) = v.r#type.as_mut().and_then(|t| t.value.as_mut()) else {
        return;
    };
    if rng.chance(4) {
        t.elem_type = Some([1, 6, 7, 9, 10, 0, 42][rng.below(7)]);
        return;
    }
    let Some(shape) = t.shape.as_mut() else {
        return;
    };
    match rng.below(4) {
        0 => {
            shape.dim.pop();
        }
        1 => shape.dim.push(proto::tensor_shape_proto::Dimension {
            denotation: None,
            value: Some(Dim::DimValue(pick_i64(rng, 1))),
        }),
        _ if !shape.dim.is_empty() => {
            let i = rng.below(shape.dim.len());
            shape.dim[i].value = match rng.below(4) {
                0 => Some(Dim::DimParam("N".into())),
                1 => None,
                _ => Some(Dim::DimValue(pick_i64(rng, 4))),
            };
        }
        _ => {}
    }
}

const OP_TYPES: [&str; 24] = [
    "Relu",
    "Conv",
    "Add",
    "Mul",
    "Reshape",
    "Transpose",
    "Concat",
    "Split",
    "Slice",
    "Gather",
    "Resize",
    "Pad",
    "Expand",
    "Range",
    "ConstantOfShape",
    "Shape",
    "Cast",
    "MatMul",
    "Gemm",
    "MaxPool",
    "Where",
    "ReduceMean",
    "Softmax",
    "ScatterND",
];

/// Applies 1–3 field-level mutations to a decoded ModelProto.
fn mutate_model(m: &mut proto::ModelProto, rng: &mut Rng) {
    if rng.chance(2) {
        // Forget the declared output shapes so inference runs on instead of stopping at a mismatch.
        if let Some(g) = m.graph.as_mut() {
            for o in &mut g.output {
                if let Some(proto::type_proto::Value::TensorType(t)) =
                    o.r#type.as_mut().and_then(|t| t.value.as_mut())
                {
                    t.shape = None;
                }
            }
        }
    }
    let rounds = 1 + rng.below(3);
    for _ in 0..rounds {
        if rng.chance(20) {
            if let Some(o) = m.opset_import.first_mut() {
                o.version = Some([1, 10, 11, 13, 17, 21, 25, 26, 1000][rng.below(9)]);
            }
            continue;
        }
        let Some(g) = m.graph.as_mut() else {
            return;
        };
        match rng.below(10) {
            0 | 1 if !g.initializer.is_empty() => {
                let i = rng.below(g.initializer.len());
                mutate_tensor(&mut g.initializer[i], rng);
            }
            2..=4 if !g.node.is_empty() => {
                let n = rng.below(g.node.len());
                let node = &mut g.node[n];
                if node.attribute.is_empty() {
                    continue;
                }
                let a = rng.below(node.attribute.len());
                mutate_attr(&mut node.attribute[a], rng);
            }
            5 => {
                if rng.chance(2) && !g.input.is_empty() {
                    let i = rng.below(g.input.len());
                    mutate_value_info(&mut g.input[i], rng);
                } else if !g.output.is_empty() {
                    let i = rng.below(g.output.len());
                    mutate_value_info(&mut g.output[i], rng);
                }
            }
            6 if !g.node.is_empty() => {
                // Rewire one input to another existing value name (or drop it / leave it empty).
                let mut names: Vec<String> =
                    g.input.iter().filter_map(|v| v.name.clone()).collect();
                names.extend(g.initializer.iter().filter_map(|t| t.name.clone()));
                names.extend(g.node.iter().flat_map(|n| n.output.iter().cloned()));
                names.push(String::new());
                let n = rng.below(g.node.len());
                let node = &mut g.node[n];
                if node.input.is_empty() || rng.chance(5) {
                    node.input.push(names[rng.below(names.len())].clone());
                } else {
                    let i = rng.below(node.input.len());
                    if rng.chance(4) {
                        node.input.remove(i);
                    } else {
                        node.input[i] = names[rng.below(names.len())].clone();
                    }
                }
            }
            7 if !g.node.is_empty() => {
                let n = rng.below(g.node.len());
                g.node[n].op_type = Some(OP_TYPES[rng.below(OP_TYPES.len())].to_string());
            }
            8 if !g.node.is_empty() => {
                let n = rng.below(g.node.len());
                if rng.chance(2) {
                    g.node.remove(n);
                } else {
                    let mut dup = g.node[n].clone();
                    dup.name = None;
                    g.node.insert(rng.below(g.node.len() + 1), dup);
                }
            }
            _ if !g.node.is_empty() && rng.chance(4) => {
                let n = rng.below(g.node.len());
                if let Some(o) = g.node[n].output.first_mut() {
                    o.push('x');
                }
            }
            _ if !g.node.is_empty() => {
                // Another attribute value on a node that has none mutated yet: add a stray one.
                let n = rng.below(g.node.len());
                let names = [
                    "axis", "perm", "axes", "keepdims", "mode", "pads", "strides", "group",
                ];
                let name = names[rng.below(names.len())].to_string();
                let attr = if rng.chance(2) {
                    proto::AttributeProto {
                        name: Some(name),
                        r#type: Some(2),
                        i: Some(pick_i64(rng, 1)),
                        ..Default::default()
                    }
                } else {
                    proto::AttributeProto {
                        name: Some(name),
                        r#type: Some(7),
                        ints: (0..rng.below(5)).map(|_| pick_i64(rng, 1)).collect(),
                        ..Default::default()
                    }
                };
                g.node[n].attribute.retain(|a| a.name != attr.name);
                g.node[n].attribute.push(attr);
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn fuzz_decode_image() {
    let _serial = lock(&SERIAL);
    let seeds: Vec<Vec<u8>> = image_seeds().into_iter().map(|(_, b)| b).collect();
    let cases = env_or("VIGIL_FUZZ_CASES", 500) as usize;
    let mut rng = Rng::new(env_or("VIGIL_FUZZ_SEED", 0x5EED_1A6E));
    let mut tally = Tally::default();
    for _ in 0..cases {
        let seed = &seeds[rng.below(seeds.len())];
        let mut input = mutate_bytes(seed, &seeds, &mut rng);
        if input.starts_with(b"\x89PNG") && rng.chance(2) {
            fix_png_crcs(&mut input);
        }
        tally.add(run_case("image", &input, image_target));
    }
    tally.finish("decode_image");
}

#[test]
fn fuzz_onnx_load_and_compile() {
    let _serial = lock(&SERIAL);
    let seeds: Vec<Vec<u8>> = onnx_seeds().into_iter().map(|(_, b)| b).collect();
    let protos: Vec<proto::ModelProto> = seeds
        .iter()
        .map(|b| proto::ModelProto::decode(b.as_slice()).unwrap_or_else(|e| panic!("seed: {e}")))
        .collect();
    let cases = env_or("VIGIL_FUZZ_CASES", 500) as usize;
    let mut rng = Rng::new(env_or("VIGIL_FUZZ_SEED", 0x0_0CC5_EED5));
    let mut tally = Tally::default();
    for _ in 0..cases {
        let k = rng.below(seeds.len());
        // A quarter byte-level (the protobuf decoder and import checks), the rest field-level.
        let input = if rng.chance(4) {
            mutate_bytes(&seeds[k], &seeds, &mut rng)
        } else {
            let mut m = protos[k].clone();
            mutate_model(&mut m, &mut rng);
            m.encode_to_vec()
        };
        tally.add(run_case("onnx", &input, onnx_target));
    }
    tally.finish("load_model+from_graph");
}

/// A PNG whose IHDR declares `w`x`h` (RGB8), with valid CRCs and a tiny IDAT.
fn png_header_only(w: u32, h: u32) -> Vec<u8> {
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend_from_slice(&png_chunk(b"IHDR", &ihdr));
    // zlib stream of a few zero bytes (stored block).
    out.extend_from_slice(&png_chunk(
        b"IDAT",
        &[
            0x78, 0x01, 0x01, 0x04, 0x00, 0xFB, 0xFF, 0, 0, 0, 0, 0, 4, 0, 1,
        ],
    ));
    out.extend_from_slice(&png_chunk(b"IEND", &[]));
    out
}

#[test]
fn decompression_bombs_are_rejected_from_the_header() {
    let _serial = lock(&SERIAL);
    let defaults = DecodeLimits::default();
    // PNG 100000x100000 (10 Gpx) and headers just over the default 40 Mpx limit in each format.
    let png = png_header_only(100_000, 100_000);
    let png_edge = png_header_only(8000, 5001);
    let mut jpeg = encode(
        &image::DynamicImage::ImageRgb8(picture(8, 8)),
        ImageFormat::Jpeg,
    );
    // Patch the SOF0 frame size to 65535x65535.
    let sof = jpeg
        .windows(2)
        .position(|w| w == [0xFF, 0xC0])
        .unwrap_or_else(|| panic!("baseline JPEG seed has no SOF0"));
    jpeg[sof + 5..sof + 9].copy_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]);
    let mut bmp = encode(
        &image::DynamicImage::ImageRgb8(picture(8, 8)),
        ImageFormat::Bmp,
    );
    bmp[18..22].copy_from_slice(&100_000i32.to_le_bytes());
    bmp[22..26].copy_from_slice(&100_000i32.to_le_bytes());
    for (name, bytes) in [
        ("png", png),
        ("png_edge", png_edge),
        ("jpeg", jpeg),
        ("bmp", bmp),
    ] {
        install_hook();
        lock(&PANICS).clear();
        let base = CURRENT.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let r = decode_image(&bytes, &defaults);
        let growth = PEAK.load(Ordering::Relaxed).saturating_sub(base);
        match r {
            // BMP's decoder refuses > 65535 per side itself, as a format error naming its limit.
            Err(Error::ImageTooLarge(msg) | Error::Image(msg)) => {
                assert!(
                    msg.contains("limit"),
                    "{name}: expected the pixel-limit error, got '{msg}'"
                )
            }
            other => panic!("{name}: expected a pixel-limit error, got {other:?}"),
        }
        // Rejected from the header: nothing near the declared size was allocated.
        assert!(
            growth < 16 << 20,
            "{name}: heap grew {growth} bytes before rejecting"
        );
        assert!(
            lock(&PANICS).is_empty(),
            "{name}: panicked: {:?}",
            lock(&PANICS)
        );
    }
}

/// Decodes every image seed and checks the pixels against the picture that was encoded.
#[test]
fn image_seeds_decode_to_their_pixels() {
    let _serial = lock(&SERIAL);
    let seeds = image_seeds();
    let limits = DecodeLimits::default();
    for (name, bytes) in &seeds {
        let img = decode_image(bytes, &limits).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (w, h) = (img.width(), img.height());
        match *name {
            "png_rgb8" | "jpeg_rgb8" => assert_eq!((w, h), (8, 8), "{name}"),
            "png_rgba8" | "bmp_rgba8" | "webp_rgba8" => assert_eq!((w, h), (6, 4), "{name}"),
            "png_gray16" => assert_eq!((w, h), (4, 4)),
            "png_graya8" => assert_eq!((w, h), (3, 5)),
            "bmp_rgb8" | "webp_rgb8" => assert_eq!((w, h), (5, 3), "{name}"),
            "jpeg_gray" => assert_eq!((w, h), (8, 8)),
            // Orientation 6 (rotate 90 CW) and 8 (rotate 270 CW) swap the 5x3 axes.
            "png_exif6" | "jpeg_exif8" => assert_eq!((w, h), (3, 5), "{name}"),
            other => panic!("unexpected seed {other}"),
        }
        let src = picture(5, 3);
        match *name {
            "bmp_rgb8" | "webp_rgb8" => assert_eq!(img, src, "{name}: lossless pixels"),
            "png_rgb8" => assert_eq!(img, picture(8, 8)),
            "png_exif6" => {
                // Rotate 90 CW: out(x, y) = in(y, H-1-x), H = 3.
                for (x, y, p) in img.enumerate_pixels() {
                    assert_eq!(*p, *src.get_pixel(y, 2 - x), "png_exif6 at ({x},{y})");
                }
            }
            "jpeg_exif8" => {
                // Rotate 270 CW: out(x, y) = in(W-1-y, x), W = 5; JPEG is lossy, allow slack.
                let mut worst = 0i32;
                for (x, y, p) in img.enumerate_pixels() {
                    let q = src.get_pixel(4 - y, x);
                    for c in 0..3 {
                        worst = worst.max((i32::from(p[c]) - i32::from(q[c])).abs());
                    }
                }
                assert!(worst <= 40, "jpeg_exif8: max channel error {worst}");
            }
            "png_graya8" => {
                // Gray+alpha: alpha dropped, gray replicated to RGB.
                for (x, y, p) in img.enumerate_pixels() {
                    let g = (x * 70 + y) as u8;
                    assert_eq!(*p, Rgb([g, g, g]), "png_graya8 at ({x},{y})");
                }
            }
            _ => {}
        }
    }
}

/// The reshape/transpose/concat seed computes sigmoid(2 * transpose(reshape(x))[..., :3]).
#[test]
fn onnx_seeds_compile_and_run() {
    let _serial = lock(&SERIAL);
    for (name, bytes) in onnx_seeds() {
        assert!(bytes.len() < 50_000, "{name} is too big for a seed");
        let model = Model::from_bytes(&bytes, &ModelOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut ctx = model
            .new_context()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let shape = model.inputs()[0].shape.clone();
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let x = Tensor::from_f32(shape, data.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let outs = ctx.run(&[x]).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(outs[0].shape, model.outputs()[0].shape, "{name}");
        let y = outs[0].as_f32().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(y.iter().all(|v| v.is_finite()), "{name}: non-finite output");
        if name == "reshape_transpose_concat.onnx" {
            // x [1,48] -> a [1,4,2,6] -> b [1,2,4,6] (b[0,i,j,k] = a[0,j,i,k]) -> y [1,2,4,3].
            let mut worst = 0f32;
            for i in 0..2 {
                for j in 0..4 {
                    for k in 0..3 {
                        let b = data[j * 12 + i * 6 + k];
                        let want = 1.0 / (1.0 + (-2.0 * b).exp());
                        worst = worst.max((y[i * 12 + j * 3 + k] - want).abs());
                    }
                }
            }
            assert!(worst < 1e-6, "reshape_transpose_concat: max error {worst}");
        }
        if name == "conv_relu.onnx" {
            // Softmax output: a probability vector.
            let s: f32 = y.iter().sum();
            assert!(
                (s - 1.0).abs() < 1e-5 && y.iter().all(|&p| p >= 0.0),
                "softmax {y:?}"
            );
        }
    }
}

/// Regression inputs whose engine bug is not fixed yet: (folder/file, what goes wrong).
/// The lead removes entries as the bugs are fixed.
const KNOWN_BUGS: &[(&str, &str)] = &[];

/// Replays every file in fuzz-regressions/{image,onnx}/ through its target.
#[test]
fn replay_regression_corpus() {
    let _serial = lock(&SERIAL);
    let mut tally = Tally::default();
    for (folder, target) in [
        (
            "image",
            image_target as fn(&[u8]) -> Result<&'static str, String>,
        ),
        ("onnx", onnx_target),
    ] {
        for (file, bytes) in
            read_dir_files(&repo_dir(&format!("tests/fuzz-regressions/{folder}")), None)
        {
            let key = format!("{folder}/{file}");
            if let Some((_, why)) = KNOWN_BUGS.iter().find(|(k, _)| *k == key) {
                println!("KNOWN BUG, skipped: {key}: {why}");
                continue;
            }
            tally.add(run_case(folder, &bytes, target).map_err(|f| format!("{key}: {f}")));
        }
    }
    tally.finish("regression corpus");
}
