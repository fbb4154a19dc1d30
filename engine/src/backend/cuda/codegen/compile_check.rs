//! The offline compile check (no GPU needed): every implicit-GEMM tiling the builder may time
//! for ResNet-50's int8 convolutions at batch 32, serial K splits included, generated and
//! compiled by NVRTC for sm_90a, then (where `VIGIL_PTXAS` names a `ptxas`) assembled for its
//! registers and spills. It catches a kernel that does not compile before device time is spent
//! on it. NVRTC and ptxas come from PyPI (`pip download nvidia-cuda-nvrtc nvidia-cuda-nvcc`,
//! unpacked; the NVRTC lib folder on `LD_LIBRARY_PATH`); `scripts/kernel-compile-check.sh`
//! fetches both and runs this. Without NVRTC it prints SKIP.

use super::{
    halo_fits, multicast_versions, serial_tilings, tma_fits, Arg, Gen, QConvParts, Tiling,
};
use super::{igemm_smem, DEEP_HALO_TILINGS, DEEP_WG_TILINGS, HALO_TILINGS, TILINGS, WG_TILINGS};
use crate::backend::cpu::kernels::ConvGeometry;

/// ResNet-50's int8 convolutions at batch 32 past the stem: (input channels, input side,
/// output channels, kernel side, stride, residual), one per distinct geometry.
const RESNET50: [(usize, usize, usize, usize, usize, bool); 23] = [
    (64, 56, 256, 1, 1, false),
    (64, 56, 64, 1, 1, false),
    (64, 56, 64, 3, 1, false),
    (64, 56, 256, 1, 1, true),
    (256, 56, 64, 1, 1, false),
    (256, 56, 512, 1, 2, false),
    (256, 56, 128, 1, 1, false),
    (128, 56, 128, 3, 2, false),
    (128, 28, 512, 1, 1, true),
    (512, 28, 128, 1, 1, false),
    (128, 28, 128, 3, 1, false),
    (512, 28, 1024, 1, 2, false),
    (512, 28, 256, 1, 1, false),
    (256, 28, 256, 3, 2, false),
    (256, 14, 1024, 1, 1, true),
    (1024, 14, 256, 1, 1, false),
    (256, 14, 256, 3, 1, false),
    (1024, 14, 2048, 1, 2, false),
    (1024, 14, 512, 1, 1, false),
    (512, 14, 512, 3, 2, false),
    (512, 7, 2048, 1, 1, true),
    (2048, 7, 512, 1, 1, false),
    (512, 7, 512, 3, 1, false),
];

/// The most dynamic shared memory an sm_90 block may opt into.
const SMEM_PER_BLOCK: usize = 232_448;

/// QConv parts of one [`RESNET50`] geometry at batch `n`.
fn resnet_parts(
    (cin, side, cout, k, stride, residual): (usize, usize, usize, usize, usize, bool),
    n: usize,
) -> QConvParts {
    let geom = ConvGeometry::plain(n, (cin, cout), (side, side), (k, stride, k / 2));
    let packed = (0..cout * k * k * cin).map(|i| (i % 251) as u8).collect();
    let mut p = QConvParts::for_test(geom, packed, cin, 0, false);
    if residual {
        p.residual = Some(super::quant::Residual {
            z: 7,
            beta: 0.5,
            zero_point: 0,
        });
    }
    p
}

/// The tilings the builder may time for `p` with every opt-in path on, on a 132-SM device
/// (the default ones, deeper rings, TMA-fed and multicast, warp-specialized, halo, partial-sum,
/// cluster and serial K splits, persistent blocks), those that fit an sm_90 block's shared memory.
fn candidates(p: &QConvParts) -> Vec<Tiling> {
    let c = p.geom;
    let n = c.cout;
    let kt = (c.kh * c.kw * p.c4).div_ceil(64);
    let mut out: Vec<Tiling> = TILINGS
        .iter()
        .chain(&WG_TILINGS)
        .chain(&DEEP_WG_TILINGS)
        .copied()
        .collect();
    if tma_fits(p) {
        let tma: Vec<Tiling> = WG_TILINGS
            .iter()
            .chain(&DEEP_WG_TILINGS)
            .map(|t| t.with_tma())
            .collect();
        out.extend(multicast_versions(&tma, c.n * c.oh * c.ow, n));
        out.extend(tma);
    }
    if kt >= 8 {
        out.extend([WG_TILINGS[1], WG_TILINGS[2], WG_TILINGS[3]].map(|t| t.warp_specialized(2)));
        out.push(WG_TILINGS[1].warp_specialized(4));
        for t in [WG_TILINGS[1], WG_TILINGS[2]] {
            out.extend([2, 4].map(|s| t.split(s)));
            out.push(t.split_in_cluster(2));
        }
        // One and two blocks an SM, on 132 SMs.
        for slots in [132, 264] {
            out.extend(serial_tilings(p, tma_fits(p), |_| slots));
        }
    }
    if kt <= 8 {
        out.extend([TILINGS[1], WG_TILINGS[1]].map(|t| t.persistent(264)));
    }
    if halo_fits(p) {
        let fits = |t: &&Tiling| n.is_multiple_of(t.bn());
        out.extend(
            HALO_TILINGS
                .iter()
                .chain(&DEEP_HALO_TILINGS)
                .filter(fits)
                .copied(),
        );
        out.extend(HALO_TILINGS.iter().filter(fits).map(|t| t.persistent(132)));
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|&t| igemm_smem(p, t) <= SMEM_PER_BLOCK && seen.insert(t));
    out
}

/// ptxas's report per kernel name: registers and spill-store bytes.
fn ptxas_report(ptx: &str, ptxas: &str) -> Result<Vec<(String, usize, usize)>, String> {
    let dir = std::env::temp_dir().join(format!("vigil-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("k.ptx");
    std::fs::write(&src, ptx).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(ptxas)
        .args(["-arch=sm_90a", "-v", "-o"])
        .arg(dir.join("k.cubin"))
        .arg(&src)
        .output()
        .map_err(|e| format!("{ptxas}: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    if !out.status.success() {
        return Err(log);
    }
    // "Compiling entry function 'vk3' ..." then "N bytes spill stores" then "Used R registers".
    let mut report = Vec::new();
    let (mut name, mut spill) = (String::new(), 0);
    for line in log.lines() {
        if let Some(rest) = line.split("entry function '").nth(1) {
            name = rest.split('\'').next().unwrap_or("").to_string();
        } else if let Some(v) = line
            .split(" bytes spill stores")
            .next()
            .filter(|_| line.contains("spill stores"))
        {
            spill = v
                .rsplit(',')
                .next()
                .unwrap_or("")
                .trim()
                .parse()
                .unwrap_or(usize::MAX);
        } else if let Some(v) = line.split("Used ").nth(1) {
            let regs = v
                .split(' ')
                .next()
                .unwrap_or("")
                .parse()
                .unwrap_or(usize::MAX);
            report.push((std::mem::take(&mut name), regs, spill));
        }
    }
    Ok(report)
}

#[test]
fn resnet50_int8_kernels_compile_for_sm90a() {
    // SAFETY: only probes whether the library loads.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        println!(
            "SKIP: no NVRTC library to compile the generated kernels with (no GPU needed: \
             scripts/kernel-compile-check.sh fetches one)"
        );
        return;
    }
    let ptxas = std::env::var("VIGIL_PTXAS").ok();
    if ptxas.is_none() {
        println!("ptxas not named (VIGIL_PTXAS): NVRTC only, no registers or spills");
    }
    let (mut kernels, mut serial, mut multicast) = (0, 0, 0);
    for shape in RESNET50 {
        let p = resnet_parts(shape, 32);
        let mut g = Gen::new(false);
        let named: Vec<(String, Tiling)> = candidates(&p)
            .into_iter()
            .map(|t| (g.qigemm(Arg::Val(0), 1, &p, t).name, t))
            .collect();
        let opts = cudarc::nvrtc::CompileOptions {
            arch: Some("sm_90a"),
            options: vec!["--std=c++17".into()],
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(&g.src, opts)
            .unwrap_or_else(|e| panic!("{shape:?}: NVRTC failed: {e:?}"))
            .to_src();
        kernels += named.len();
        let Some(ptxas) = ptxas.as_deref() else {
            continue;
        };
        let report = ptxas_report(&ptx, ptxas).unwrap_or_else(|e| panic!("{shape:?}: {e}"));
        for (name, t) in &named {
            let &(_, regs, spill) = report
                .iter()
                .find(|(n, ..)| n == name)
                .unwrap_or_else(|| panic!("{shape:?}: ptxas did not report {name} ({t})"));
            println!("{shape:?} {t}: {regs} registers, {spill} bytes spilled");
            if t.clustered() {
                // The cluster's bookkeeping adds no spills either.
                multicast += 1;
                assert_eq!(spill, 0, "{shape:?} {t} spills");
            }
            if t.serial {
                // The reduction adds no spills to the loop it follows.
                serial += 1;
                assert_eq!(spill, 0, "{shape:?} {t} spills");
            }
        }
    }
    println!(
        "{kernels} kernels compiled for sm_90a ({serial} serial K splits, {multicast} multicast \
         kernels assembled)"
    );
    assert!(kernels > 0);
}
