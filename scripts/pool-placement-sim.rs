//! Placement simulator for issue 3's window workload: replays the allocator bench's exact
//! request sequence (`engine/benches/pool.rs`: same xorshift seed, size and victim tables; 64
//! live blocks, sizes log-uniform in 256 B to 64 MB, a random victim freed each step) against
//! an exact free-span list under different placement rules, and prints footprint / peak live
//! (the bench's reserved/live: the bottom zone's top plus the top zone's depth) for five seeds.
//! The "tlsf" rule with small blocks (< 1 MiB) from the top of their span is what `FixedPool`
//! with `PoolOptions::serving()` does; it reproduces the bench's ratio for the bench's seed.
//!
//! Build and run (not part of the workspace; std only):
//!   rustc -O scripts/pool-placement-sim.rs -o /tmp/pool-sim && /tmp/pool-sim 10000000 [filter]
const TABLE: usize = 1 << 16;
const W: usize = 64;
const A: u64 = 256;
const R: u64 = 1 << 40; // region units

struct Rng(u64);
impl Rng { fn next(&mut self) -> u64 { self.0 ^= self.0 << 13; self.0 ^= self.0 >> 7; self.0 ^= self.0 << 17; self.0 } }

fn gen(seed: u64) -> (Vec<u64>, Vec<usize>) {
    let mut r = Rng(seed);
    for _ in 0..TABLE { r.next(); }
    let ws = (0..TABLE).map(|_| { let u = (r.next() % 1_000_000) as f64 / 1e6; (256.0 * 262_144f64.powf(u)) as u64 }).collect();
    let vic = (0..TABLE).map(|_| (r.next() % W as u64) as usize).collect();
    (ws, vic)
}

fn mapping(size: u64) -> (usize, usize) {
    if size < 32 { (0, size as usize) } else {
        let msb = 63 - size.leading_zeros();
        ((msb - 5 + 1) as usize, ((size >> (msb - 5)) - 32) as usize)
    }
}
fn class(size: u64) -> usize { let (f, s) = mapping(size); f << 5 | s }

#[derive(Clone, Copy)]
enum Pol {
    First,           // lowest address
    Best,            // smallest, tie lowest address
    Fit(f64),        // lowest address with s <= f*req, else lowest address
    Tlsf,            // current pool: best in own class (scan 32, by size then off), else smallest in next nonempty class (tie off)
    TlsfLow(usize),  // classes [c(req), c(req)+k]: lowest address span that fits; else next nonempty class lowest address; else lowest overall
    TlsfGood,        // next class up, head (no scan) – treat as lowest address in next nonempty class
    FirstK(usize),
    ClassFirst(usize), // among spans with class <= c(req)+k that fit, lowest address; else lowest address overall
}

// returns ratio footprint/peak_live
fn sim(ws: &[u64], vic: &[usize], iters: usize, pol: Pol, small_thr: u64, small_pol: Option<Pol>) -> f64 {
    let mut free: Vec<(u64, u64)> = vec![(0, R)];
    let (mut hi, mut lo) = (0u64, R);
    let choose = |free: &Vec<(u64, u64)>, sz: u64, pol: Pol, top: bool| -> usize {
        let n = free.len();
        let order = |k: usize| if top { n - 1 - k } else { k };
        let fits = |k: usize| free[k].1 >= sz;
        let lowest = || (0..n).map(order).find(|&k| fits(k));
        let r = match pol {
            Pol::First => lowest(),
            Pol::Best => {
                let mut b: Option<usize> = None;
                for j in 0..n { let k = order(j); if fits(k) && b.map_or(true, |b| free[k].1 < free[b].1) { b = Some(k); } }
                b
            }
            Pol::Fit(f) => (0..n).map(order).find(|&k| fits(k) && (free[k].1 as f64) <= f * sz as f64).or_else(lowest),
            Pol::Tlsf => {
                let c = class(sz);
                let mut b: Option<usize> = None;
                for j in 0..n { let k = order(j); if class(free[k].1) == c && fits(k) && b.map_or(true, |b| free[k].1 < free[b].1) { b = Some(k); } }
                b.or_else(|| {
                    let nc = (0..n).filter(|&k| class(free[k].1) > c).map(|k| class(free[k].1)).min()?;
                    let mut b: Option<usize> = None;
                    for j in 0..n { let k = order(j); if class(free[k].1) == nc && b.map_or(true, |b| free[k].1 < free[b].1) { b = Some(k); } }
                    b
                })
            }
            Pol::TlsfLow(kk) => {
                let c = class(sz);
                (0..n).map(order).find(|&k| fits(k) && class(free[k].1) <= c + kk).or_else(|| {
                    let nc = (0..n).filter(|&k| class(free[k].1) > c + kk).map(|k| class(free[k].1)).min()?;
                    (0..n).map(order).find(|&k| class(free[k].1) == nc)
                })
            }
            Pol::TlsfGood => {
                let c = class(sz);
                let nc = (0..n).filter(|&k| class(free[k].1) > c).map(|k| class(free[k].1)).min();
                nc.and_then(|nc| (0..n).map(order).find(|&k| class(free[k].1) == nc)).or_else(lowest)
            }
            Pol::FirstK(kk) => {
                let c = class(sz);
                let mut cls: Vec<usize> = (0..n).filter(|&k| fits(k) && class(free[k].1) >= c).map(|k| class(free[k].1)).collect();
                cls.sort(); cls.dedup(); cls.truncate(kk);
                (0..n).map(order).find(|&k| fits(k) && cls.contains(&class(free[k].1)))
            }
            Pol::ClassFirst(kk) => {
                let c = class(sz);
                (0..n).map(order).find(|&k| fits(k) && class(free[k].1) <= c + kk).or_else(lowest)
            }
        };
        r.expect("region exhausted")
    };
    let mut alloc = |free: &mut Vec<(u64, u64)>, bytes: u64| -> (u64, u64) {
        let sz = bytes.div_ceil(A).max(1);
        let small = sz * A < small_thr;
        let p = if small { small_pol.unwrap_or(pol) } else { pol };
        let k = choose(free, sz, p, small && small_pol.is_some());
        let (o, s) = free[k];
        let off = if small { o + s - sz } else { o };
        if s == sz { free.remove(k); } else if small { free[k] = (o, s - sz); } else { free[k] = (o + sz, s - sz); }
        if small { if off >= hi { lo = lo.min(off); } else if off + sz > hi { hi = hi.max(off+sz);} } else if off + sz <= lo { hi = hi.max(off + sz); } else if off < lo { lo = lo.min(off); }
        (off, sz)
    };
    let dealloc = |free: &mut Vec<(u64, u64)>, (mut o, mut sz): (u64, u64)| {
        let mut k = free.partition_point(|&(fo, _)| fo < o);
        if k > 0 && free[k - 1].0 + free[k - 1].1 == o { o = free[k - 1].0; sz += free[k - 1].1; free.remove(k - 1); k -= 1; }
        if k < free.len() && o + sz == free[k].0 { sz += free[k].1; free.remove(k); }
        free.insert(k, (o, sz));
    };
    let mut live = Vec::with_capacity(W);
    let mut lb = 0u64;
    for i in 0..W { live.push((alloc(&mut free, ws[i]), ws[i])); lb += ws[i]; }
    let mut peak = lb;
    for i in 0..iters {
        let v = vic[i % TABLE];
        let (b, s) = live[v];
        dealloc(&mut free, b); lb -= s;
        let sz = ws[(i + W) % TABLE];
        live[v] = (alloc(&mut free, sz), sz); lb += sz;
        peak = peak.max(lb);
    }
    ((hi + (R - lo)) * A) as f64 / peak as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let iters: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let which: String = args.get(2).cloned().unwrap_or_default();
    let seeds = [0x9e3779b97f4a7c15u64, 12345, 987654321, 0xdeadbeef, 424242];
    let data: Vec<_> = seeds.iter().map(|&s| gen(s)).collect();
    let mut cfgs: Vec<(String, Pol, u64, Option<Pol>)> = vec![];
    let m = 1u64 << 20;
    for k in [1usize,2,3,4,8] { for thr in [m/4, m/2, m, 2*m] {
        cfgs.push((format!("firstk{k} small<{}K top-of-span", thr>>10), Pol::FirstK(k), thr, None));
        cfgs.push((format!("firstk{k} small<{}K top-zone", thr>>10), Pol::FirstK(k), thr, Some(Pol::FirstK(k))));
    }}
    for thr in [m/4, m/2, 2*m] { cfgs.push((format!("first small<{}K top-zone", thr>>10), Pol::First, thr, Some(Pol::First))); }
    for (n, p) in [("first", Pol::First), ("best", Pol::Best), ("fit1.5", Pol::Fit(1.5)), ("fit2", Pol::Fit(2.0)), ("tlsf", Pol::Tlsf), ("tlsfgood", Pol::TlsfGood), ("tlsflow0", Pol::TlsfLow(0)), ("tlsflow8", Pol::TlsfLow(8)), ("tlsflow16", Pol::TlsfLow(16)), ("classfirst16", Pol::ClassFirst(16)), ("classfirst32", Pol::ClassFirst(32))] {
        cfgs.push((format!("{n} all-bottom"), p, 0, None));
        for thr in [m, 4 * m, 16 * m] {
            cfgs.push((format!("{n} small<{}M top-of-span", thr / m), p, thr, None));
            cfgs.push((format!("{n} small<{}M top-zone", thr / m), p, thr, Some(p)));
        }
    }
    for (name, p, thr, sp) in cfgs {
        if !which.is_empty() && !name.contains(&which) { continue; }
        let rs: Vec<f64> = data.iter().map(|(ws, vic)| sim(ws, vic, iters, p, thr, sp)).collect();
        let mean = rs.iter().sum::<f64>() / rs.len() as f64;
        println!("{:40} {} mean {:.3}", name, rs.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>().join(" "), mean);
    }
}
