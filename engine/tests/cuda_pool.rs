//! The fixed pool over real device memory on two CUDA streams.
//!
//! Stream B runs a kernel that spins, then copies block X. Meanwhile the host frees X (owned by
//! stream A, used by B) and stream A allocates a same-sized block and overwrites it. With stream
//! safety the pool must not hand X back before B passes its recorded point, so B copies the
//! original bytes; with stream safety off the pool reuses X at once and B copies the overwrite,
//! which proves the check can fail. Skips with a message where no CUDA device is usable.
#![cfg(feature = "cuda")]

#[path = "common/thread_allocations.rs"]
mod thread_allocations;
#[path = "../benches/common/workload.rs"]
mod workload;

use std::sync::Arc;

use cudarc::driver::{result, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use vigil_engine::memory::cuda::{
    BackgroundPagedRegion, CudaClock, DevicePagedRegion, DeviceRegion,
};
use vigil_engine::memory::Region;
use vigil_engine::memory::{EventId, FixedPool, PoolOptions, StreamClock, StreamId};

const KERNELS: &str = r#"
extern "C" __global__ void fill(unsigned int* p, unsigned long long n, unsigned int v) {
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) p[i] = v;
}
extern "C" __global__ void spin_copy(const unsigned int* src, unsigned int* dst,
                                     unsigned long long n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) dst[i] = src[i];
}
"#;

const A: StreamId = StreamId(0);
const B: StreamId = StreamId(1);
const WORDS: usize = 1 << 20; // 4 MiB blocks
const ORIGINAL: u32 = 0x1111_1111;
const OVERWRITE: u32 = 0x2222_2222;

fn device() -> Option<Arc<CudaContext>> {
    if let Err(e) = vigil_engine::backend::cuda::probe(0) {
        println!("SKIP: no CUDA device: {e}");
        return None;
    }
    match CudaContext::new(0) {
        Ok(c) => Some(c),
        Err(e) => {
            println!("SKIP: no CUDA context: {e}");
            None
        }
    }
}

/// The test kernels and two streams A and B, registered with one clock.
struct Rig {
    fill: CudaFunction,
    spin_copy: CudaFunction,
    sa: Arc<CudaStream>,
    sb: Arc<CudaStream>,
    clock: Arc<CudaClock>,
}

const CFG: LaunchConfig = LaunchConfig {
    grid_dim: (128, 1, 1),
    block_dim: (256, 1, 1),
    shared_mem_bytes: 0,
};

impl Rig {
    fn new(ctx: &Arc<CudaContext>) -> Rig {
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS).expect("NVRTC compiles the test kernels");
        let module = ctx.load_module(ptx).expect("module loads");
        let sa: Arc<CudaStream> = ctx.new_stream().expect("stream A");
        let sb: Arc<CudaStream> = ctx.new_stream().expect("stream B");
        let clock = CudaClock::new(ctx);
        clock.add_stream(A, Arc::clone(&sa));
        clock.add_stream(B, Arc::clone(&sb));
        Rig {
            fill: module.load_function("fill").expect("fill"),
            spin_copy: module.load_function("spin_copy").expect("spin_copy"),
            sa,
            sb,
            clock,
        }
    }

    /// Fills `words` at `ptr` with `v` on `stream`.
    fn fill(&self, stream: &CudaStream, ptr: u64, words: usize, v: u32) {
        let n = words as u64;
        unsafe {
            stream
                .launch_builder(&self.fill)
                .arg(&ptr)
                .arg(&n)
                .arg(&v)
                .launch(CFG)
                .expect("fill");
        }
    }

    /// Fills X with [`ORIGINAL`] on A, then has B (after A's fill) spin for about 0.2 s at H200
    /// clocks, ample time for the host and stream A to race ahead, and copy X to `dst`.
    fn fill_then_spin_copy(&self, x_ptr: u64, dst_ptr: u64, words: usize) {
        self.fill(&self.sa, x_ptr, words, ORIGINAL);
        self.sb.join(&self.sa).expect("B waits for A's fill");
        let (n, cycles) = (words as u64, 400_000_000i64);
        unsafe {
            self.sb
                .launch_builder(&self.spin_copy)
                .arg(&x_ptr)
                .arg(&dst_ptr)
                .arg(&n)
                .arg(&cycles)
                .launch(CFG)
                .expect("spin_copy on B");
        }
    }
}

/// What stream B copied out of X, and whether the pool handed X's address back at once.
struct Outcome {
    copied: Vec<u32>,
    reused_at_once: bool,
}

fn run(ctx: &Arc<CudaContext>, stream_safe: bool) -> Outcome {
    let rig = Rig::new(ctx);
    let region = DeviceRegion::new(ctx, 64 << 20).expect("64 MiB of device memory");
    let pool = FixedPool::with_options(
        region,
        rig.clock.clone(),
        PoolOptions {
            stream_safe,
            ..PoolOptions::default()
        },
    )
    .expect("pool");
    let bytes = WORDS * 4;
    // The destination of B's copy, allocated on B so it is never X.
    let dst = pool.alloc(bytes, B).expect("dst");
    let dst_ptr = dst.addr() as u64;
    let mut x = pool.alloc(bytes, A).expect("x");
    let x_ptr = x.addr() as u64;
    rig.fill_then_spin_copy(x_ptr, dst_ptr, WORDS);
    x.record_use(B).expect("record_use");
    drop(x);
    let z = pool.alloc(bytes, A).expect("z");
    let z_ptr = z.addr() as u64;
    rig.fill(&rig.sa, z_ptr, WORDS, OVERWRITE);
    rig.sa.synchronize().expect("sync A");
    rig.sb.synchronize().expect("sync B");
    let mut copied = vec![0u32; WORDS];
    unsafe { result::memcpy_dtoh_sync(&mut copied, dst_ptr) }.expect("copy back");
    Outcome {
        copied,
        reused_at_once: z_ptr == x_ptr,
    }
}

#[test]
fn stream_safety_keeps_a_block_until_the_other_stream_is_done() {
    let Some(ctx) = device() else { return };
    let safe = run(&ctx, true);
    let intact = safe.copied.iter().filter(|&&w| w == ORIGINAL).count();
    println!(
        "stream-safe: X reused at once: {}, intact words {intact}/{WORDS}",
        safe.reused_at_once
    );
    assert!(
        !safe.reused_at_once,
        "stream-safe pool handed X back while B used it"
    );
    assert_eq!(
        intact, WORDS,
        "stream B read corrupted data with stream safety on"
    );

    let unsafe_run = run(&ctx, false);
    let corrupted = unsafe_run
        .copied
        .iter()
        .filter(|&&w| w == OVERWRITE)
        .count();
    println!(
        "stream safety off: X reused at once: {}, overwritten words {corrupted}/{WORDS}",
        unsafe_run.reused_at_once
    );
    assert!(
        unsafe_run.reused_at_once,
        "without stream safety X is reused at once"
    );
    assert!(
        corrupted > 0,
        "without stream safety stream B should have read the overwrite (the check could not fail)"
    );
}

#[test]
fn pinned_and_device_regions_back_pools() {
    let Some(ctx) = device() else { return };
    let pinned = vigil_engine::memory::cuda::PinnedRegion::new(&ctx, 1 << 20).expect("pinned");
    let base = pinned.as_mut_ptr();
    let pool = FixedPool::new(pinned, Arc::new(vigil_engine::memory::SyncClock)).expect("pool");
    let a = pool.alloc(1000, A).expect("a");
    let b = pool.alloc(1000, A).expect("b");
    assert_eq!(a.addr() % 256, 0);
    assert_eq!(b.addr(), a.addr() + 1024);
    // The pinned bytes are writable host memory.
    unsafe { std::ptr::write_bytes(base.add(a.offset()), 7, 1000) };
    let got = unsafe { *base.add(a.offset() + 999) };
    assert_eq!(got, 7);
}

/// Writes `words` to the device at `ptr` and reads them back.
fn roundtrip(ptr: u64, words: &[u32]) -> Vec<u32> {
    unsafe { result::memcpy_htod_sync(ptr, words) }.expect("copy to device");
    read_words(ptr, words.len())
}

fn read_words(ptr: u64, n: usize) -> Vec<u32> {
    let mut back = vec![0u32; n];
    unsafe { result::memcpy_dtoh_sync(&mut back, ptr) }.expect("copy from device");
    back
}

#[test]
fn paged_device_region_moves_physical_pages_and_keeps_data() {
    let Some(ctx) = device() else { return };
    const MIB2: usize = 2 << 20;
    let mut region = DevicePagedRegion::new(&ctx, 64 * MIB2, 4 * MIB2).expect("paged region");
    if region.physical_pages() < 4 {
        // Pages larger than 2 MiB: ask for 64 and 4 of them whatever their size.
        let page = region.page_size().expect("a paged region has a page size");
        region = DevicePagedRegion::new(&ctx, 64 * page, 4 * page).expect("paged region");
    }
    let page = region.page_size().expect("a paged region has a page size");
    let handles = region.physical_pages();
    let pages = region.len() / page;
    println!("page {page} B, {handles} physical pages, {pages} region pages");
    assert!(page.is_power_of_two());
    assert_eq!(region.len() % page, 0);
    assert!(
        pages >= 64 * MIB2 / page,
        "the address range covers what was asked"
    );
    assert!(handles >= 4);
    assert_eq!(region.mapped_pages(), 0);
    assert_eq!(region.base(), region.device_ptr() as usize);

    let words = page / 4;
    let page_ptr = |i: usize| region.device_ptr() + (i * page) as u64;

    region.map_pages(0, 2).expect("map pages 0..2");
    assert_eq!(region.mapped_pages(), 2);
    let pattern: Vec<u32> = (0..2 * words as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ 0xA5A5_0000)
        .collect();
    assert_eq!(roundtrip(page_ptr(0), &pattern), pattern);

    region.unmap_pages(0, 1).expect("unmap page 0");
    assert_eq!(region.mapped_pages(), 1);
    region
        .map_pages(10, 2)
        .expect("map pages 10..12 from freed and untouched physical pages");
    assert_eq!(region.mapped_pages(), 3);
    // Page 1 kept its physical page and its bytes across the remap.
    assert_eq!(read_words(page_ptr(1), words), pattern[words..]);
    // The new pages are usable, and writing them leaves page 1 alone.
    let second: Vec<u32> = (0..2 * words as u32).map(|i| !i).collect();
    assert_eq!(roundtrip(page_ptr(10), &second), second);
    assert_eq!(read_words(page_ptr(1), words), pattern[words..]);

    // More pages than there are free physical pages: refused, nothing changes.
    let free = handles - region.mapped_pages();
    assert!(region.map_pages(20, free + 1).is_err());
    assert_eq!(region.mapped_pages(), 3);
    // An already-mapped page (a free physical page is there for it): refused, nothing changes.
    assert!(free >= 1);
    assert!(
        region.map_pages(11, 1).is_err(),
        "page 11 is already mapped"
    );
    assert!(region.map_pages(1, 1).is_err(), "page 1 is already mapped");
    assert_eq!(region.mapped_pages(), 3);
    // Outside the region: refused.
    assert!(region.map_pages(pages, 1).is_err());
    assert!(region.map_pages(pages - 1, 2).is_err());
    assert_eq!(region.mapped_pages(), 3);
    // Unmapping an unmapped page (alone, or inside a range): refused, nothing changes.
    assert!(region.unmap_pages(0, 1).is_err());
    assert!(region.unmap_pages(0, 2).is_err(), "page 0 is unmapped");
    assert_eq!(region.mapped_pages(), 3);
    assert_eq!(read_words(page_ptr(1), words), pattern[words..]);

    // Everything back: all physical pages free again, and usable anywhere.
    region.unmap_pages(1, 1).expect("unmap page 1");
    region.unmap_pages(10, 2).expect("unmap pages 10..12");
    assert_eq!(region.mapped_pages(), 0);
    region
        .map_pages(pages - handles, handles)
        .expect("map every physical page at the end of the range");
    assert_eq!(region.mapped_pages(), handles);
    let tail: Vec<u32> = (0..handles * words)
        .map(|i| i as u32 ^ 0x5A5A_5A5A)
        .collect();
    assert_eq!(roundtrip(page_ptr(pages - handles), &tail), tail);
    // Dropped with pages still mapped: Drop unmaps and releases them.
}

/// The device's page granularity, as a default paged region reports it.
fn granularity(ctx: &Arc<CudaContext>) -> usize {
    let probe = DevicePagedRegion::new(ctx, 1, 1).expect("paged region");
    probe.page_size().expect("a paged region has a page size")
}

/// Pages of the granularity and of twice it: pages given back move with their bytes to a
/// new place, the old place can be backed again at once from untouched physical pages, and
/// writing either place never shows through the other. A page size that is not a power-of-two
/// multiple of the granularity is refused. The same holds with every physical page also kept
/// mapped at a home address (`keep_home_mappings`), where the moves are second mappings.
#[test]
fn paged_region_moves_pages_of_each_size() {
    let Some(ctx) = device() else { return };
    let granularity = granularity(&ctx);
    assert!(
        DevicePagedRegion::with_page(&ctx, 1, 1, Some(3 * granularity)).is_err(),
        "a page of three granules is refused"
    );
    assert!(
        DevicePagedRegion::with_page(&ctx, 1, 1, Some(granularity / 2)).is_err(),
        "a page under the granularity is refused"
    );
    let shapes = [granularity, 2 * granularity].map(|p| [(p, false), (p, true)]);
    for (page, home) in shapes.into_iter().flatten() {
        let mut region = DevicePagedRegion::with_page(&ctx, 64 * page, 8 * page, Some(page))
            .expect("paged region");
        if home {
            region.keep_home_mappings().expect("home mappings");
        }
        println!("page {page} B, home mappings {home}");
        assert_eq!(region.page_size(), Some(page));
        assert_eq!(region.physical_pages(), 8);
        let words = page / 4;
        let at = |i: usize| region.device_ptr() + (i * page) as u64;
        region.map_pages(0, 3).expect("map pages 0..3");
        let pattern: Vec<u32> = (0..3 * words as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ 0x0F0F_0000)
            .collect();
        assert_eq!(roundtrip(at(0), &pattern), pattern);
        // Pages 0 and 1 go back; pages 20 and 21 take their physical pages (last freed first).
        region.unmap_pages(0, 2).expect("unmap pages 0..2");
        region.map_pages(20, 2).expect("map pages 20..22");
        assert_eq!(read_words(at(20), words), pattern[words..2 * words]);
        assert_eq!(read_words(at(21), words), pattern[..words]);
        // The old places again, at once, from untouched physical pages.
        region.map_pages(0, 2).expect("map pages 0..2 again");
        assert_eq!(region.mapped_pages(), 5);
        let fresh: Vec<u32> = (0..2 * words as u32).map(|i| !i).collect();
        assert_eq!(roundtrip(at(0), &fresh), fresh);
        assert_eq!(read_words(at(20), words), pattern[words..2 * words]);
        assert_eq!(read_words(at(21), words), pattern[..words]);
        assert_eq!(read_words(at(2), words), pattern[2 * words..]);
        let moved: Vec<u32> = (0..2 * words as u32).map(|i| i ^ 0x7777_7777).collect();
        assert_eq!(roundtrip(at(20), &moved), moved);
        assert_eq!(read_words(at(0), 2 * words), fresh);
        assert!(region.unmap_pages(3, 1).is_err(), "page 3 was never mapped");
    }
}

/// A pool over the paged region on two streams: stream B spins, then copies block X; the host
/// frees X (used by B) and asks on stream A for a block that fits only by moving X's physical
/// pages. The pool must not unmap them before B passes its recorded point: the plain
/// allocation fails at once, the waiting one returns once B is done, and B copied X intact.
#[test]
fn paged_pool_moves_pages_only_after_the_reading_stream_is_done() {
    let Some(ctx) = device() else { return };
    let page = granularity(&ctx);
    let rig = Rig::new(&ctx);
    // Six physical pages: dst (2, on B), X (2, on A), Y (1, on A, kept), one in reserve.
    let region = DevicePagedRegion::new(&ctx, 64 * page, 6 * page).expect("paged region");
    let pool = FixedPool::new(region, rig.clock.clone()).expect("paged pool");
    let words = 2 * page / 4;
    let dst = pool.alloc(2 * page, B).expect("dst");
    let dst_ptr = dst.addr() as u64;
    let mut x = pool.alloc(2 * page, A).expect("x");
    let x_ptr = x.addr() as u64;
    let _y = pool.alloc(page, A).expect("y");
    assert_eq!(pool.stats().committed, 5 * page);
    rig.fill_then_spin_copy(x_ptr, dst_ptr, words);
    x.record_use(B).expect("record_use");
    drop(x);
    // Three pages fit only with X's two: not while B may still read them.
    let early = pool.alloc(3 * page, A);
    println!("while B runs: {:?}", early.as_ref().map(|b| b.addr()));
    assert!(early.is_err(), "the pool moved X's pages while B used them");
    drop(early);
    let z = pool
        .alloc_wait(3 * page, A, std::time::Duration::from_secs(20))
        .expect("z once B is done");
    let z_ptr = z.addr() as u64;
    rig.fill(&rig.sa, z_ptr, 3 * page / 4, OVERWRITE);
    rig.sa.synchronize().expect("sync A");
    rig.sb.synchronize().expect("sync B");
    let s = pool.stats();
    println!(
        "z at {:#x} (X was {x_ptr:#x}), committed {} pages, remaps {}",
        z_ptr,
        s.committed / page,
        s.remaps
    );
    assert_ne!(z_ptr, x_ptr);
    assert_eq!(
        s.committed,
        6 * page,
        "dst, Y and Z: X's pages moved into Z"
    );
    assert_eq!(pool.region().mapped_pages(), 6);
    let copied = read_words(dst_ptr, words);
    let intact = copied.iter().filter(|&&w| w == ORIGINAL).count();
    println!("paged, stream-safe: intact words {intact}/{words}");
    assert_eq!(intact, words, "stream B read corrupted data");
    assert!(read_words(z_ptr, 3 * page / 4)
        .iter()
        .all(|&w| w == OVERWRITE));
}

/// A pool over 8 physical pages of a region whose pages move on a mover thread, its streams
/// on the rig's clock.
fn background_pool(
    ctx: &Arc<CudaContext>,
    rig: &Rig,
    page: usize,
) -> Arc<FixedPool<BackgroundPagedRegion>> {
    let region = DevicePagedRegion::new(ctx, 64 * page, 8 * page).expect("paged region");
    let region = BackgroundPagedRegion::new(region, rig.clock.clone()).expect("mover");
    FixedPool::new(region, rig.clock.clone()).expect("paged pool")
}

/// A paged pool whose pages move on a mover thread (`BackgroundPagedRegion`). With the mover
/// held back, a block whose pages are still to be mapped is handed out at once, and work on its
/// stream (and on a stream ordered with `ready_on`) waits on the device until the pages are
/// mapped: nothing has run while the mover is held, and every word lands once it goes on.
/// Whether the check can fail: the child test below writes from a stream that was not ordered
/// and faults on the unmapped page.
#[test]
fn background_moves_hold_the_streams_until_the_pages_are_mapped() {
    let Some(ctx) = device() else { return };
    let page = granularity(&ctx);
    let rig = Rig::new(&ctx);
    let pool = background_pool(&ctx, &rig, page);
    let words = 3 * page / 4;
    let paused = pool.region().pause_moves();
    let x = pool
        .alloc(3 * page, A)
        .expect("x, handed out before its pages move");
    let dst = pool.alloc(3 * page, B).expect("dst, on B");
    assert_eq!(pool.region().inner().mapped_pages(), 0, "the mover is held");
    assert!(pool.region().pending_moves() >= 2);
    let (x_ptr, dst_ptr) = (x.addr() as u64, dst.addr() as u64);
    rig.fill(&rig.sa, x_ptr, words, OVERWRITE);
    x.ready_on(B).expect("B ordered after X's pages");
    rig.sb.join(&rig.sa).expect("B after A's fill");
    let n = words as u64;
    let no_spin = 0i64;
    unsafe {
        rig.sb
            .launch_builder(&rig.spin_copy)
            .arg(&x_ptr)
            .arg(&dst_ptr)
            .arg(&n)
            .arg(&no_spin)
            .launch(CFG)
            .expect("copy on B");
    }
    let done = ctx.new_event(None).expect("event");
    done.record(&rig.sb).expect("record on B");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let ran_early = done.try_is_complete().expect("query B");
    println!("background moves: B done while the mover was held: {ran_early}");
    assert!(!ran_early, "stream B ran before X's pages were mapped");
    drop(paused);
    rig.sb
        .synchronize()
        .expect("B completes once the pages are mapped");
    rig.sa.synchronize().expect("A completes");
    pool.region().settle().expect("moves done");
    assert_eq!(pool.region().inner().mapped_pages(), 6);
    let copied = read_words(dst_ptr, words);
    let landed = copied.iter().filter(|&&w| w == OVERWRITE).count();
    println!(
        "background moves: {landed}/{words} words copied; mover busy {} us",
        pool.region().mover_busy_ns() / 1000
    );
    assert_eq!(landed, words);
    drop((x, dst));
}

/// A clock that claims to order a stream after another's point but does nothing: the failing
/// side of the hand-over test below (it shows that the device-side wait keeps the data).
struct NoWaitClock(Arc<CudaClock>);

impl StreamClock for NoWaitClock {
    fn record(&self, stream: StreamId) -> EventId {
        self.0.record(stream)
    }
    fn is_complete(&self, stream: StreamId, epoch: EventId) -> bool {
        self.0.is_complete(stream, epoch)
    }
    fn capturing(&self) -> bool {
        self.0.capturing()
    }
    fn orders_streams(&self) -> bool {
        true
    }
    fn order_after(&self, _waiter: StreamId, _stream: StreamId, _epoch: EventId) -> bool {
        true
    }
}

/// With every physical page of a background pool in use, stream A fills X, spins for about
/// 0.2 s and copies X to `dst`, while the host frees X on A and asks for X's size on B. B gets
/// X in place (no page moves, no host wait) and overwrites it. Returns the words of `dst` that
/// kept X's original value, whether B got X's address, and the pool's hand-overs.
fn hand_over(ctx: &Arc<CudaContext>, rig: &Rig, clock: Arc<dyn StreamClock>) -> (usize, bool, u64) {
    let page = granularity(ctx);
    let region = DevicePagedRegion::new(ctx, 64 * page, 8 * page).expect("paged region");
    let region = BackgroundPagedRegion::new(region, rig.clock.clone()).expect("mover");
    let pool = FixedPool::new(region, clock).expect("paged pool");
    let words = page; // four pages of u32
    let dst = pool.alloc(4 * page, A).expect("dst");
    let x = pool
        .alloc(4 * page, A)
        .expect("x: the last four physical pages");
    let (x_ptr, dst_ptr) = (x.addr() as u64, dst.addr() as u64);
    rig.fill(&rig.sa, x_ptr, words, ORIGINAL);
    let (n, cycles) = (words as u64, 400_000_000i64);
    unsafe {
        rig.sa
            .launch_builder(&rig.spin_copy)
            .arg(&x_ptr)
            .arg(&dst_ptr)
            .arg(&n)
            .arg(&cycles)
            .launch(CFG)
            .expect("spin_copy on A");
    }
    drop(x);
    let z = pool.alloc(4 * page, B).expect("X's span handed to B");
    let z_ptr = z.addr() as u64;
    rig.fill(&rig.sb, z_ptr, words, OVERWRITE);
    rig.sa.synchronize().expect("sync A");
    rig.sb.synchronize().expect("sync B");
    let intact = read_words(dst_ptr, words)
        .iter()
        .filter(|&&w| w == ORIGINAL)
        .count();
    let adoptions = pool.stats().adoptions;
    drop((dst, z));
    (intact, z_ptr == x_ptr, adoptions)
}

/// A background pool hands a span freed on a busy stream to another stream in place, with the
/// new owner ordered on the device after a point on the old one (`CudaClock::order_after`):
/// the old owner's last reads still see the original bytes. Whether the check can fail: a clock
/// that skips the device-side wait lets B's overwrite land first.
#[test]
fn background_pool_hands_a_busy_streams_span_to_another_stream_in_place() {
    let Some(ctx) = device() else { return };
    let rig = Rig::new(&ctx);
    let (intact, in_place, adoptions) = hand_over(&ctx, &rig, rig.clock.clone());
    let words = granularity(&ctx);
    println!(
        "hand-over, ordered: X in place {in_place}, hand-overs {adoptions}, intact words \
         {intact}/{words}"
    );
    assert!(in_place, "B got X's span in place");
    assert_eq!(adoptions, 1);
    assert_eq!(intact, words, "A read B's overwrite");
    let (intact, in_place, _) = hand_over(&ctx, &rig, Arc::new(NoWaitClock(rig.clock.clone())));
    println!("hand-over, no wait: X in place {in_place}, intact words {intact}/{words}");
    assert!(in_place);
    assert!(
        intact < words,
        "without the device-side wait A should have read the overwrite (the check could not fail)"
    );
}

/// The failing side of the test above, run in a child process because a fault ends the CUDA
/// context: with the mover held, a fill of a fresh block from a stream that was never ordered
/// after its moves must fault on the unmapped page.
#[test]
fn background_moves_unordered_stream_faults() {
    if std::env::var_os("VIGIL_POOL_FAULT_CHILD").is_some() {
        return;
    }
    let Some(_ctx) = device() else { return };
    let exe = std::env::current_exe().expect("test binary");
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "background_moves_unordered_write_child",
            "--ignored",
            "--nocapture",
        ])
        .env("VIGIL_POOL_FAULT_CHILD", "1")
        .output()
        .expect("child runs");
    let text = String::from_utf8_lossy(&out.stdout);
    println!(
        "child: {}",
        text.lines()
            .filter(|l| l.contains("unordered"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    assert!(
        text.contains("unordered write faulted"),
        "an unordered write to a block whose pages had not moved did not fault:\n{text}"
    );
}

#[test]
#[ignore = "run by background_moves_unordered_stream_faults in a child process"]
fn background_moves_unordered_write_child() {
    let Some(ctx) = device() else { return };
    let page = granularity(&ctx);
    let rig = Rig::new(&ctx);
    let pool = background_pool(&ctx, &rig, page);
    let _paused = pool.region().pause_moves();
    let x = pool.alloc(2 * page, A).expect("x");
    let other = ctx.new_stream().expect("a stream the pool does not order");
    rig.fill(&other, x.addr() as u64, 2 * page / 4, OVERWRITE);
    match other.synchronize() {
        Err(e) => println!("unordered write faulted: {e}"),
        Ok(()) => println!("unordered write completed without a fault"),
    }
    // The context is gone after a fault: leave without running any destructor.
    std::process::exit(0);
}

/// The allocator benchmark's two-stream window over a background pool on the device: once
/// warm, its slow paths (page moves queued to the mover, hand-overs with a device-side wait,
/// events recorded) make no heap allocation on the allocating thread. The host-only twin is
/// `tests/pool_slow_paths_alloc.rs`.
#[test]
fn background_pool_on_two_streams_allocates_nothing_once_warm() {
    use workload::{Workload, TABLE, WINDOW};
    let Some(ctx) = device() else { return };
    let rig = Rig::new(&ctx);
    let page = 4 << 20;
    let region =
        DevicePagedRegion::with_page(&ctx, 64 << 30, 2 << 30, Some(page)).expect("paged region");
    let region = BackgroundPagedRegion::new(region, rig.clock.clone()).expect("mover");
    let opts = PoolOptions {
        small_from_top: Some(4 * page),
        ..PoolOptions::serving()
    };
    let pool = FixedPool::with_options(region, rig.clock.clone(), opts).expect("paged pool");
    let w = Workload::new();
    let claim = pool.claim();
    let stream = |i: usize| if i.is_multiple_of(2) { A } else { B };
    let mut live = Vec::with_capacity(WINDOW);
    for (i, &size) in w.window_sizes[..WINDOW].iter().enumerate() {
        live.push(Some(claim.alloc(size, stream(i)).expect("first blocks")));
    }
    let (warm, counted) = (40_000, 40_000);
    let mut step = |i: usize| {
        let v = w.victims[i % TABLE];
        live[v] = None;
        let size = w.window_sizes[(i + WINDOW) % TABLE];
        match claim.alloc(size, stream(i)) {
            Ok(b) => live[v] = Some(b),
            Err(e) => panic!("step {i}: {e}"),
        }
    };
    for i in 0..warm {
        step(i);
    }
    // The host runs ahead of the mover here (no kernels): start the count with its queue empty.
    pool.region().settle().expect("the mover catches up");
    let before = pool.stats();
    let ((), allocations, first) =
        thread_allocations::counted(|| (warm..warm + counted).for_each(&mut step));
    let after = pool.stats();
    let (remaps, adoptions) = (
        after.remaps - before.remaps,
        after.adoptions - before.adoptions,
    );
    println!(
        "background pool, two streams, {counted} window steps after {warm}: {allocations} heap \
         allocations on this thread, {remaps} page moves, {adoptions} hand-overs, {} pages mapped",
        after.pages_mapped - before.pages_mapped
    );
    assert!(remaps > 0, "no page move in the counted steps");
    assert_eq!(
        allocations, 0,
        "the pool's thread allocated on the heap; the first allocations:\n{first}"
    );
}

/// A stream that runs far behind holds at most 128 events: past that, each new point re-records
/// the newest event. A point it stood for still orders another stream and still reads as not
/// passed until the stream gets there.
#[test]
fn clock_holds_a_bounded_list_of_events_for_a_busy_stream() {
    let Some(ctx) = device() else { return };
    let rig = Rig::new(&ctx);
    let region = DeviceRegion::new(&ctx, 1 << 20).expect("1 MiB of device memory");
    let (src_ptr, dst_ptr) = (region.base() as u64, region.base() as u64 + 4096);
    // B spins for about 0.2 s at H200 clocks.
    let (n, cycles) = (256u64, 400_000_000i64);
    unsafe {
        rig.sb
            .launch_builder(&rig.spin_copy)
            .arg(&src_ptr)
            .arg(&dst_ptr)
            .arg(&n)
            .arg(&cycles)
            .launch(CFG)
            .expect("spin_copy on B");
    }
    let points: Vec<EventId> = (0..1000).map(|_| rig.clock.record(B)).collect();
    let held = rig.clock.in_flight(B);
    // A point from the middle, whose event now stands for later points.
    let mid = points[500];
    let passed_early = rig.clock.is_complete(B, mid);
    let ordered = rig.clock.order_after(A, B, mid);
    let a_point = rig.clock.record(A);
    let a_early = rig.clock.is_complete(A, a_point);
    rig.sb.synchronize().expect("sync B");
    rig.sa.synchronize().expect("sync A");
    let passed_late = rig.clock.is_complete(B, points[999]);
    println!(
        "events in flight on a busy stream after 1000 points: {held}; point 500 passed while \
         busy: {passed_early}; A ordered after it: {ordered}, A's later point passed while B \
         busy: {a_early}; point 999 passed after sync: {passed_late}"
    );
    assert!(held <= 128, "{held} events held for a busy stream");
    assert!(!passed_early, "a point B has not reached reads as passed");
    assert!(ordered, "A could not be ordered after B's point");
    assert!(!a_early, "A ran past B's point while B was busy");
    assert!(passed_late);
}

/// A stream nothing asks about keeps few events: recording a point first recycles the completed
/// ones once many are in flight, so a stream whose spans only give pages does not hold an event
/// for every point ever recorded on it.
#[test]
fn clock_recycles_events_of_a_stream_nobody_queries() {
    let Some(ctx) = device() else { return };
    let rig = Rig::new(&ctx);
    for _ in 0..1000 {
        rig.clock.record(A);
    }
    rig.sa.synchronize().expect("sync A");
    rig.clock.record(A);
    let held = rig.clock.in_flight(A);
    println!("events in flight on an idle stream after 1001 points: {held}");
    assert!(held <= 65, "{held} events held for an idle stream");
}
