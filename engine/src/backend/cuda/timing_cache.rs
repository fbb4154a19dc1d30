//! The timing cache on disk (TensorRT keeps one too). For each convolution geometry it stores
//! the implicit-GEMM tiling measured fastest on a device, so later builds skip compiling and
//! timing the candidates (about a minute for ResNet-50 on an H200). It is opt-in:
//! `VIGIL_CUDA_TIMING_CACHE=<file>`.
//!
//! The file is text. A header line names the format and Vigil's version; a file with any other
//! header is ignored and started afresh. Then comes one line per measurement:
//! `<device>\t<key>\t<tiling fields>\t<ms>`. Lines for other devices are kept but not used,
//! and lines that do not parse are skipped. A cached tiling is used only if it is one of the
//! convolution's current candidates, so a stale or edited file can cost speed, never
//! correctness.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::codegen::Tiling;

/// The first line of a cache file this build reads and writes.
fn header() -> String {
    format!(
        "vigil-cuda-timing-cache 2 vigil-engine {}",
        env!("CARGO_PKG_VERSION")
    )
}

/// A timing cache file's entries, keyed by (device, geometry key).
pub struct TimingCache {
    path: PathBuf,
    entries: HashMap<(String, String), (Tiling, f32)>,
    /// Whether the file already starts with this build's header (else the first record
    /// rewrites it).
    current: bool,
}

/// The tiling as the cache stores it: fifteen space-separated integers.
fn tiling_fields(t: &Tiling) -> String {
    format!(
        "{} {} {} {} {} {} {} {} {} {} {} {} {} {} {}",
        t.warps_m,
        t.warps_n,
        t.wm,
        t.wn,
        t.stages,
        u8::from(t.wgmma),
        t.splits,
        t.ctas,
        u8::from(t.cluster),
        t.loaders,
        u8::from(t.halo),
        t.min_blocks,
        u8::from(t.tma),
        u8::from(t.serial),
        u8::from(t.multicast) | (u8::from(t.multicast_b) << 1)
    )
}

/// Parses [`tiling_fields`]' form (the fifteenth field holds [`Tiling::multicast`] in bit 0
/// and [`Tiling::multicast_b`] in bit 1), the fourteen fields written before multicast tilings
/// (neither), the thirteen written before [`Tiling::serial`] (not serial), the twelve written
/// before [`Tiling::tma`] (not TMA), the eleven written before [`Tiling::min_blocks`] (none), or the nine written before
/// warp-specialized and halo tilings (neither); None for anything else.
fn parse_tiling(s: &str) -> Option<Tiling> {
    let v: Vec<usize> = s
        .split(' ')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let (nine, loaders, halo, min_blocks) = match v.len() {
        9 => (&v[..], 0, 0, 0),
        11 => (&v[..9], v[9], v[10], 0),
        12..=15 => (&v[..9], v[9], v[10], v[11]),
        _ => return None,
    };
    // The flags added one at a time since: TMA, serial, multicast (absent: off).
    let [tma, serial, multicast] = [12, 13, 14].map(|i| v.get(i).copied().unwrap_or(0));
    if multicast > 3 {
        return None;
    }
    let [warps_m, warps_n, wm, wn, stages, wgmma, splits, ctas, cluster] = nine[..] else {
        return None;
    };
    let flag = |v: usize| match v {
        0 => Some(false),
        1 => Some(true),
        _ => None,
    };
    Some(Tiling {
        warps_m,
        warps_n,
        wm,
        wn,
        stages,
        wgmma: flag(wgmma)?,
        splits,
        ctas,
        cluster: flag(cluster)?,
        serial: flag(serial)?,
        loaders,
        halo: flag(halo)?,
        min_blocks,
        tma: flag(tma)?,
        multicast: multicast & 1 != 0,
        multicast_b: multicast & 2 != 0,
    })
}

/// Device and key must not break the line format.
fn field(s: &str) -> String {
    s.replace(['\t', '\n', '\r'], " ")
}

impl TimingCache {
    /// Reads the cache at `path`; a missing, unreadable or other-version file gives an empty
    /// cache (written afresh on the first record).
    pub fn open(path: &Path) -> TimingCache {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut lines = text.lines();
        let current = lines.next() == Some(header().as_str());
        let mut entries = HashMap::new();
        if current {
            for line in lines {
                let parts: Vec<&str> = line.split('\t').collect();
                let [device, key, tiling, ms] = parts[..] else {
                    continue;
                };
                let (Some(t), Ok(ms)) = (parse_tiling(tiling), ms.parse::<f32>()) else {
                    continue;
                };
                entries.insert((device.to_string(), key.to_string()), (t, ms));
            }
        }
        TimingCache {
            path: path.to_path_buf(),
            entries,
            current,
        }
    }

    /// The tiling measured fastest for `key` on `device`, and its milliseconds.
    pub fn get(&self, device: &str, key: &str) -> Option<(Tiling, f32)> {
        self.entries.get(&(field(device), field(key))).copied()
    }

    /// Stores a measurement and appends it to the file (writing the header first when the
    /// file is new or from another version).
    pub fn record(
        &mut self,
        device: &str,
        key: &str,
        (t, ms): (Tiling, f32),
    ) -> std::io::Result<()> {
        let (device, key) = (field(device), field(key));
        let line = format!("{device}\t{key}\t{}\t{ms}\n", tiling_fields(&t));
        self.entries.insert((device, key), (t, ms));
        let mut f = if self.current {
            std::fs::OpenOptions::new().append(true).open(&self.path)?
        } else {
            let mut f = std::fs::File::create(&self.path)?;
            f.write_all(format!("{}\n", header()).as_bytes())?;
            self.current = true;
            f
        };
        f.write_all(line.as_bytes())
    }
}

/// The process's cache from `VIGIL_CUDA_TIMING_CACHE`, opened on first use (None when unset).
pub fn process_cache() -> Option<&'static Mutex<TimingCache>> {
    static CACHE: OnceLock<Option<Mutex<TimingCache>>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            let path = std::env::var_os("VIGIL_CUDA_TIMING_CACHE")?;
            Some(Mutex::new(TimingCache::open(Path::new(&path))))
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::codegen::{HALO_TILINGS, TILINGS, WG_TILINGS};

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vigil-timing-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        dir
    }

    #[test]
    fn measurements_survive_a_reopen_per_device() {
        let path = temp("reopen");
        let mut c = TimingCache::open(&path);
        assert!(c.get("H200 cc9.0", "conv a").is_none());
        let split = WG_TILINGS[1].split(4);
        c.record("H200 cc9.0", "conv a", (split, 0.0102))
            .expect("write");
        c.record("H200 cc9.0", "conv\tb", (TILINGS[2], 0.5))
            .expect("write");
        let cluster = WG_TILINGS[3].split_in_cluster(2);
        c.record("H200 cc9.0", "conv c", (cluster, 0.02))
            .expect("write");
        c.record("Orin cc8.7", "conv a", (TILINGS[0].persistent(32), 1.25))
            .expect("write");
        let ws = WG_TILINGS[1].warp_specialized(2).split(2);
        c.record("H200 cc9.0", "conv d", (ws, 0.03)).expect("write");
        c.record("H200 cc9.0", "conv e", (HALO_TILINGS[2], 0.04))
            .expect("write");
        let resident = TILINGS[1].resident(6);
        c.record("H200 cc9.0", "conv f", (resident, 0.05))
            .expect("write");
        let tma = WG_TILINGS[1].with_tma();
        c.record("H200 cc9.0", "conv g", (tma, 0.06))
            .expect("write");
        let serial = WG_TILINGS[2].with_tma().split_serial(3);
        c.record("H200 cc9.0", "conv h", (serial, 0.07))
            .expect("write");
        let multicast = WG_TILINGS[1].with_tma().with_multicast();
        c.record("H200 cc9.0", "conv i", (multicast, 0.08))
            .expect("write");
        let both = multicast.with_multicast_b();
        c.record("H200 cc9.0", "conv j", (both, 0.09))
            .expect("write");
        let b = WG_TILINGS[2].with_tma().with_multicast_b();
        c.record("H200 cc9.0", "conv k", (b, 0.1)).expect("write");
        let again = TimingCache::open(&path);
        assert_eq!(again.get("H200 cc9.0", "conv a"), Some((split, 0.0102)));
        assert_eq!(again.get("H200 cc9.0", "conv\tb"), Some((TILINGS[2], 0.5)));
        assert_eq!(again.get("H200 cc9.0", "conv c"), Some((cluster, 0.02)));
        assert_ne!(cluster, WG_TILINGS[3].split(2));
        assert_eq!(
            again.get("Orin cc8.7", "conv a"),
            Some((TILINGS[0].persistent(32), 1.25))
        );
        assert!(again.get("A100 cc8.0", "conv a").is_none());
        assert_eq!(again.get("H200 cc9.0", "conv d"), Some((ws, 0.03)));
        assert_ne!(ws, WG_TILINGS[1].split(2));
        assert_eq!(
            again.get("H200 cc9.0", "conv e"),
            Some((HALO_TILINGS[2], 0.04))
        );
        assert_eq!(again.get("H200 cc9.0", "conv f"), Some((resident, 0.05)));
        assert_ne!(resident, TILINGS[1]);
        assert_eq!(again.get("H200 cc9.0", "conv g"), Some((tma, 0.06)));
        assert_ne!(tma, WG_TILINGS[1].warp_specialized(1));
        assert_eq!(again.get("H200 cc9.0", "conv h"), Some((serial, 0.07)));
        assert_ne!(serial, WG_TILINGS[2].with_tma().split(3));
        assert_eq!(again.get("H200 cc9.0", "conv i"), Some((multicast, 0.08)));
        assert_ne!(multicast, WG_TILINGS[1].with_tma());
        assert_eq!(again.get("H200 cc9.0", "conv j"), Some((both, 0.09)));
        assert_eq!(again.get("H200 cc9.0", "conv k"), Some((b, 0.1)));
        assert_ne!(both, multicast);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn other_versions_and_broken_lines_are_ignored() {
        let path = temp("broken");
        let good = format!("dev\tk\t{}\t0.25", tiling_fields(&TILINGS[1]));
        // Lines from before warp-specialized tilings (nine fields, read as not one) and from
        // before resident-block bounds (eleven fields, read as none).
        let fields = tiling_fields(&WG_TILINGS[2]);
        let nine = fields.split(' ').take(9).collect::<Vec<_>>().join(" ");
        let halo = tiling_fields(&HALO_TILINGS[1]);
        let eleven = halo.split(' ').take(11).collect::<Vec<_>>().join(" ");
        // And from before TMA tilings (twelve fields, read as not one).
        let resident = tiling_fields(&TILINGS[2].resident(3));
        let twelve = resident.split(' ').take(12).collect::<Vec<_>>().join(" ");
        // And from before serial K splits (thirteen fields, read as not one).
        let tma = tiling_fields(&WG_TILINGS[1].with_tma());
        let thirteen = tma.split(' ').take(13).collect::<Vec<_>>().join(" ");
        // And from before multicast pairs (fourteen fields, read as unicast).
        let fourteen = tma.split(' ').take(14).collect::<Vec<_>>().join(" ");
        // A multicast field with bits beyond A and B is not a tiling.
        let bad_flags = format!("{fourteen} 4");
        let body = format!(
            "dev\tshort\t1 2 3\t0.1\ndev\tbad\t{}\tfast\ndev\tnine\t{nine}\t0.5\n\
             dev\televen\t{eleven}\t0.6\ndev\ttwelve\t{twelve}\t0.7\n\
             dev\tthirteen\t{thirteen}\t0.8\ndev\tfourteen\t{fourteen}\t0.9\ndev\tflags\t{bad_flags}\t0.95\n{good}\n",
            tiling_fields(&TILINGS[1])
        );
        std::fs::write(&path, format!("{}\n{body}", header())).expect("write");
        let c = TimingCache::open(&path);
        assert_eq!(c.get("dev", "k"), Some((TILINGS[1], 0.25)));
        assert!(c.get("dev", "short").is_none());
        assert!(c.get("dev", "bad").is_none());
        assert_eq!(c.get("dev", "nine"), Some((WG_TILINGS[2], 0.5)));
        assert_eq!(c.get("dev", "eleven"), Some((HALO_TILINGS[1], 0.6)));
        assert_eq!(c.get("dev", "twelve"), Some((TILINGS[2].resident(3), 0.7)));
        assert_eq!(
            c.get("dev", "thirteen"),
            Some((WG_TILINGS[1].with_tma(), 0.8))
        );
        assert_eq!(
            c.get("dev", "fourteen"),
            Some((WG_TILINGS[1].with_tma(), 0.9))
        );
        assert!(c.get("dev", "flags").is_none());
        // Another version's file: nothing is read, and the first record starts it afresh.
        std::fs::write(&path, format!("vigil-cuda-timing-cache 0 old\n{good}\n")).expect("write");
        let mut c = TimingCache::open(&path);
        assert!(c.get("dev", "k").is_none());
        c.record("dev", "k2", (TILINGS[3], 2.0)).expect("write");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.lines().next(), Some(header().as_str()));
        assert_eq!(text.lines().count(), 2);
        let _ = std::fs::remove_file(&path);
    }
}
