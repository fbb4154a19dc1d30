//! The fixed pool over real device memory on two CUDA streams.
//!
//! Stream B runs a kernel that spins, then copies block X. Meanwhile the host frees X (owned by
//! stream A, used by B) and stream A allocates a same-sized block and overwrites it. With stream
//! safety the pool must not hand X back before B passes its recorded point, so B copies the
//! original bytes; with stream safety off the pool reuses X at once and B copies the overwrite,
//! which proves the check can fail. Skips with a message where no CUDA device is usable.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use cudarc::driver::{result, CudaContext, CudaStream, LaunchConfig, PushKernelArg};
use vigil_engine::memory::cuda::{CudaClock, DeviceRegion};
use vigil_engine::memory::{FixedPool, PoolOptions, StreamId};

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

/// What stream B copied out of X, and whether the pool handed X's address back at once.
struct Outcome {
    copied: Vec<u32>,
    reused_at_once: bool,
}

fn run(ctx: &Arc<CudaContext>, stream_safe: bool) -> Outcome {
    let ptx = cudarc::nvrtc::compile_ptx(KERNELS).expect("NVRTC compiles the test kernels");
    let module = ctx.load_module(ptx).expect("module loads");
    let fill = module.load_function("fill").expect("fill");
    let spin_copy = module.load_function("spin_copy").expect("spin_copy");
    let sa: Arc<CudaStream> = ctx.new_stream().expect("stream A");
    let sb: Arc<CudaStream> = ctx.new_stream().expect("stream B");
    let clock = CudaClock::new(ctx);
    clock.add_stream(A, Arc::clone(&sa));
    clock.add_stream(B, Arc::clone(&sb));
    let region = DeviceRegion::new(ctx, 64 << 20).expect("64 MiB of device memory");
    let pool = FixedPool::with_options(
        region,
        clock,
        PoolOptions {
            stream_safe,
            ..PoolOptions::default()
        },
    )
    .expect("pool");
    let bytes = WORDS * 4;
    let n = WORDS as u64;
    let cfg = LaunchConfig {
        grid_dim: (128, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // The destination of B's copy, allocated on B so it is never X.
    let dst = pool.alloc(bytes, B).expect("dst");
    let dst_ptr = dst.addr() as u64;
    let mut x = pool.alloc(bytes, A).expect("x");
    let x_ptr = x.addr() as u64;
    unsafe {
        sa.launch_builder(&fill)
            .arg(&x_ptr)
            .arg(&n)
            .arg(&ORIGINAL)
            .launch(cfg)
            .expect("fill X");
    }
    sb.join(&sa).expect("B waits for A's fill");
    // About 0.2 s at H200 clocks: ample time for the host and stream A to race ahead.
    let cycles: i64 = 400_000_000;
    unsafe {
        sb.launch_builder(&spin_copy)
            .arg(&x_ptr)
            .arg(&dst_ptr)
            .arg(&n)
            .arg(&cycles)
            .launch(cfg)
            .expect("spin_copy on B");
    }
    x.record_use(B).expect("record_use");
    drop(x);
    let z = pool.alloc(bytes, A).expect("z");
    let z_ptr = z.addr() as u64;
    unsafe {
        sa.launch_builder(&fill)
            .arg(&z_ptr)
            .arg(&n)
            .arg(&OVERWRITE)
            .launch(cfg)
            .expect("fill Z");
    }
    sa.synchronize().expect("sync A");
    sb.synchronize().expect("sync B");
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
