//! `[memory] pool_mb` / `pool_fraction`: the daemon reserves one host pool at start-up (a fixed
//! size, or a share of the memory available then), every CPU context's activation arena is a
//! block of it, its occupancy is on /metrics, and a pool too small for the configured contexts
//! fails start-up with a message stating the pool's state.

mod common;

use std::path::PathBuf;

use common::*;
use vigil::config::{default_models, Config, Limits};
use vigil::http::AppState;
use vigil::registry::Registry;
use vigil_engine::memory::PoolSize;

/// The pool gauges are process-wide (one Prometheus recorder), so the tests that load a pool and
/// read its gauges take turns.
static GAUGES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn models_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models"))
}

/// Gauge `name` of the host pool in a metrics page.
fn gauge(page: &str, name: &str, kind: Option<&str>) -> Option<f64> {
    pool_gauge(page, name, "host", kind)
}

#[test]
fn contexts_take_their_arenas_from_the_configured_pool() {
    let _turn = GAUGES.lock().unwrap_or_else(|e| e.into_inner());
    let limits = Limits {
        workers: 2,
        ..Limits::default()
    };
    let models = default_models(&models_dir());
    let registry = Registry::load_all_in(&models, &limits, Some(PoolSize::Bytes(64 << 20)))
        .unwrap_or_else(|e| panic!("{e}"));
    let pool = registry.host_pool().expect("pool configured").clone();
    let st = pool.stats();
    // Two models x two workers, each one arena (EfficientNet 6.0 MB, NanoDet 7.7 MB).
    assert_eq!(st.reserved, 64 << 20);
    assert_eq!(st.blocks, 4);
    assert!(
        st.in_use > 2 * (6 << 20) + 2 * (7 << 20),
        "in use {}",
        st.in_use
    );
    let base = start(AppState::new(registry, limits));
    let r = get(&format!("{base}/metrics"));
    assert_eq!(r.status, 200);
    let page = r.text();
    assert_eq!(
        gauge(&page, "vigil_memory_pool_bytes", Some("reserved")),
        Some((64u64 << 20) as f64),
        "{page}"
    );
    assert_eq!(
        gauge(&page, "vigil_memory_pool_bytes", Some("in_use")),
        Some(st.in_use as f64)
    );
    assert_eq!(gauge(&page, "vigil_memory_pool_blocks", None), Some(4.0));
    // A fixed host region is backed whole, and never moves pages.
    assert_eq!(
        gauge(&page, "vigil_memory_pool_bytes", Some("committed")),
        Some((64u64 << 20) as f64)
    );
    assert_eq!(gauge(&page, "vigil_memory_pool_remaps", None), Some(0.0));
    // Inference through pooled arenas works.
    let bytes = std::fs::read(PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/images/eval/coffee.png"
    )))
    .expect("shared/images/eval/coffee.png");
    let r = post(
        &format!("{base}/v1/models/efficientnet-lite0/infer?top_k=1"),
        "image/png",
        &[],
        &bytes,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["results"]["classes"][0]["label"], "espresso");
}

#[test]
fn too_small_a_pool_fails_start_up_clearly() {
    let models = default_models(&models_dir());
    let err =
        match Registry::load_all_in(&models, &Limits::default(), Some(PoolSize::Bytes(8 << 20))) {
            Ok(_) => panic!("an 8 MiB pool cannot hold 4 arenas of 6-8 MB"),
            Err(e) => e,
        };
    println!("{err}");
    assert!(err.contains("out of memory"), "{err}");
    assert!(err.contains("largest free block"), "{err}");
}

#[test]
fn pool_mb_zero_is_rejected_by_the_config() {
    let dir = models_dir();
    let text = format!(
        "[memory]\npool_mb = 0\n[[models]]\nname = \"m\"\npath = \"{}\"\n",
        dir.join("efficientnet-lite0.onnx").display()
    );
    let err = Config::from_toml(&text, std::path::Path::new("test.toml"), &dir)
        .map(|_| ())
        .expect_err("pool_mb = 0 is invalid");
    assert!(err.to_string().contains("pool_mb"), "{err}");
}

#[test]
fn pool_fraction_reserves_a_share_of_available_memory() {
    // 2% of MemAvailable: about 460 MiB on a 24 GiB machine, committed only as it is used.
    let fraction = 0.02;
    let _turn = GAUGES.lock().unwrap_or_else(|e| e.into_inner());
    let before = vigil_engine::memory::host_available_bytes().expect("MemAvailable");
    let models = default_models(&models_dir());
    let limits = Limits::default();
    let registry = Registry::load_all_in(
        &models,
        &limits,
        Some(PoolSize::fraction(fraction).expect("a valid fraction")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let after = vigil_engine::memory::host_available_bytes().expect("MemAvailable");
    let st = registry.host_pool().expect("pool configured").stats();
    println!(
        "pool_fraction = {fraction}: {} MiB reserved of {} MiB available",
        st.reserved >> 20,
        before >> 20
    );
    // Whole MiB, and the fraction of what was available (which other processes may move a
    // little while the models load).
    assert_eq!(st.reserved % (1 << 20), 0);
    let (lo, hi) = (before.min(after) as f64, before.max(after) as f64);
    let share = st.reserved as f64 / fraction;
    assert!(
        share > lo * 0.9 && share <= hi + (1 << 20) as f64 / fraction,
        "{} B reserved for {fraction} of {before}..{after} B available",
        st.reserved
    );
    // Every context's arena came from it.
    assert_eq!(st.blocks, 2 * limits.workers);
    // And it is on /metrics.
    let base = start(AppState::new(registry, limits));
    let page = get(&format!("{base}/metrics")).text();
    assert_eq!(
        gauge(&page, "vigil_memory_pool_bytes", Some("reserved")),
        Some(st.reserved as f64),
        "{page}"
    );
}
