//! Probe variants of a generated wgmma kernel, for finding what bounds it: the same source
//! with its ring loads, its wgmmas, both, its L2 reads, or its whole body left out. Timed next to the real
//! kernel (`VIGIL_CUDA_WS_PROBE=1`), they split its time into the loads' side, the
//! multiplies' side and what is left (launch, barriers, epilogue). Their outputs are wrong;
//! they are only ever timed, never run in a plan.

/// What a probe variant leaves out of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The ring's loads: every `load(slot, step)` returns at once, so the multiplies read
    /// whatever the slots hold and never wait for memory.
    Loads,
    /// The wgmmas: the math warps still wait for every slot and release it, and requantize
    /// zero sums.
    Multiplies,
    /// Both: what is left is the launch, the barriers and the epilogue.
    Both,
    /// The ring's global reads: every `cp.async` becomes a plain 16-byte shared store to
    /// the same slot, so the slots fill (shared-memory traffic and barriers as before) but
    /// nothing comes from L2.
    Fills,
    /// Everything: the kernel returns at once, so only its launch is left (with the real
    /// grid, block and shared memory).
    Launch,
}

impl Probe {
    /// The variants, in the order the probe prints them.
    pub const ALL: [Probe; 5] = [
        Probe::Loads,
        Probe::Multiplies,
        Probe::Both,
        Probe::Fills,
        Probe::Launch,
    ];
}

/// The loader lambdas' openings in the implicit-GEMM and halo kernels.
const LOAD_OPENINGS: [&str; 2] = [
    "auto load = [&](int stage, int kt) {",
    "auto load = [&](int stage, int ks) {",
];

/// `src` (one generated wgmma kernel) as probe `p`, or None if it has nothing the probe could
/// leave out (no ring loader lambda, or no wgmma).
pub fn probe_variant(src: &str, p: Probe) -> Option<String> {
    let mut out = src.to_string();
    if p == Probe::Launch {
        let body = out.find("__global__")?;
        let open = out[body..].find(") {\n")? + body + 3;
        out.insert_str(open, " return;");
        return Some(out);
    }
    if p == Probe::Fills {
        return without_global_reads(&out);
    }
    if matches!(p, Probe::Loads | Probe::Both) {
        let open = LOAD_OPENINGS.iter().find(|o| out.contains(*o))?;
        out = out.replace(open, &format!("{open} return;"));
    }
    if matches!(p, Probe::Multiplies | Probe::Both) {
        out = without_wgmmas(&out)?;
    }
    Some(out)
}

/// The ring copies' forms: destination `%0`, source `%1` (a 64-bit register), 16 bytes, and
/// the zero-filling one's source size `%2`.
const COPIES: [&str; 2] = [
    "cp.async.cg.shared.global [%0], [%1], 16, %2;",
    "cp.async.cg.shared.global [%0], [%1], 16;",
];

/// `src` with every ring copy a shared store of its source address's 16 bytes (twice the
/// 64-bit register), or None if it has none.
fn without_global_reads(src: &str) -> Option<String> {
    let mut out = src.to_string();
    let mut cut = 0;
    for c in COPIES {
        cut += out.matches(c).count();
        out = out.replace(c, "st.shared.v2.b64 [%0], {%1, %1};");
    }
    (cut > 0).then_some(out)
}

/// `src` with each `wgmma.mma_async ... p;` instruction cut out of its inline assembly (the
/// operands stay, so the accumulators keep their registers and fences).
fn without_wgmmas(src: &str) -> Option<String> {
    const OP: &str = "wgmma.mma_async";
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    let mut cut = 0;
    while let Some(at) = rest.find(OP) {
        let end = rest[at..].find("p; }")? + at + 2;
        out.push_str(&rest[..at]);
        rest = &rest[end..];
        cut += 1;
    }
    out.push_str(rest);
    (cut > 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::codegen::{Gen, Tiling, HALO_TILINGS, WG_TILINGS};
    use crate::ir::ValueId;

    fn sources() -> Vec<String> {
        let parts = crate::backend::cuda::codegen::igemm::tests::parts;
        let p = parts(64, 64, 128, false);
        let mut halo = parts(64, 64, 128, false);
        (
            halo.geom.n,
            halo.geom.h,
            halo.geom.w,
            halo.geom.oh,
            halo.geom.ow,
        ) = (2, 14, 14, 14, 14);
        let mut out = Vec::new();
        for (parts, t) in [
            (&p, WG_TILINGS[0]),
            (
                &p,
                Tiling {
                    loaders: 4,
                    ..WG_TILINGS[0]
                },
            ),
            (&halo, HALO_TILINGS[0]),
        ] {
            let mut g = Gen::new(false);
            g.qigemm(
                crate::backend::cuda::codegen::Arg::Val(0),
                1 as ValueId,
                parts,
                t,
            );
            out.push(g.src);
        }
        out
    }

    #[test]
    fn probes_leave_out_the_loads_or_the_wgmmas_and_nothing_else() {
        for src in sources() {
            assert!(src.contains("wgmma.mma_async"));
            let loads = probe_variant(&src, Probe::Loads).expect("a loader");
            assert!(loads.contains(" return;"), "loads probe returns early");
            assert!(loads.contains("wgmma.mma_async"));
            assert_eq!(loads.len(), src.len() + " return;".len());
            let mults = probe_variant(&src, Probe::Multiplies).expect("wgmmas");
            assert!(!mults.contains("wgmma.mma_async"));
            // The fences, commits and waits stay, with every accumulator operand.
            for keep in [
                "wgmma.fence",
                "wgmma.commit_group",
                "wgmma.wait_group",
                "setp.ne.b32",
            ] {
                assert_eq!(
                    mults.matches(keep).count(),
                    src.matches(keep).count(),
                    "{keep}"
                );
            }
            let both = probe_variant(&src, Probe::Both).expect("both");
            assert!(!both.contains("wgmma.mma_async") && both.contains(" return;"));
            let fills = probe_variant(&src, Probe::Fills).expect("copies");
            assert!(!fills.contains("cp.async.cg") && fills.contains("st.shared.v2.b64"));
            assert!(
                fills.contains("wgmma.mma_async")
                    && fills.contains("cp.async.mbarrier") == src.contains("cp.async.mbarrier")
            );
            let launch = probe_variant(&src, Probe::Launch).expect("a kernel");
            let opening = launch.find("__global__").expect("kernel");
            let first = launch[opening..].find('{').expect("body") + opening;
            assert!(launch[first..].starts_with("{ return;"), "returns first");
        }
        assert_eq!(probe_variant("int x;", Probe::Loads), None);
        assert_eq!(probe_variant("int x;", Probe::Multiplies), None);
        assert_eq!(probe_variant("int x;", Probe::Fills), None);
    }
}
