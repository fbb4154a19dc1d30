//! CPU kernels. Each node is compiled once, with static shapes and constant inputs known, into a
//! [`Kernel`] that then runs many times on views into the planned arena.

use crate::error::Result;
use crate::ir::{DataType, Graph, Node, Op};

#[cfg(target_arch = "x86_64")]
mod amx;
mod conv;
mod elementwise;
mod gemm;
mod generate;
mod movement;
mod norm;
mod pool;
mod qadd;
mod qconv;
pub mod qgemm;
mod quantize;
mod resize;

/// Shared with the CUDA backend's int8 kernels, so that both derive the same geometry and
/// requantize with the same arithmetic.
#[cfg(feature = "cuda")]
pub(crate) use conv::{geometry as conv_geometry, Geom as ConvGeometry};
#[cfg(feature = "cuda")]
pub(crate) use qgemm::{bias_i32, u8_params, weights_i8, QEpilogue};

/// Most parallel parts per worker thread for kernels that split rows. With more parts than
/// workers a faster core takes more of them: the two vCPUs of this project's VM ran the same
/// work up to 1.6x apart, and a split into one part per worker waits for the slower.
const PARTS_PER_WORKER: usize = 4;

/// How many parts to split `rows` rows into among the current pool's workers: one a worker,
/// doubled (up to [`PARTS_PER_WORKER`] a worker) while each part keeps `min_rows` rows; one on a
/// single thread. Always a multiple of the worker count, so that equal cores finish together.
pub(crate) fn part_count(rows: usize, min_rows: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    if threads == 1 {
        return 1;
    }
    let mut parts = threads;
    while parts * 2 <= threads * PARTS_PER_WORKER && rows / (parts * 2) >= min_rows.max(1) {
        parts *= 2;
    }
    parts
}

/// Compiles one node for the shapes recorded in `graph` (shape inference must have run, and
/// shape-like inputs must be constants). Fails naming the op and node when unsupported.
pub fn build_kernel(graph: &Graph, node: &Node) -> Result<Box<dyn Kernel>> {
    match &node.op {
        Op::Conv(_) | Op::ConvTranspose(_) => conv::build(graph, node),
        Op::Gemm { .. } | Op::MatMul => gemm::build(graph, node),
        Op::MaxPool(_)
        | Op::AveragePool(_)
        | Op::GlobalAveragePool { .. }
        | Op::GlobalMaxPool { .. } => pool::build(graph, node),
        Op::BatchNormalization { .. } | Op::Softmax { .. } | Op::ReduceMean { .. } => {
            norm::build(graph, node)
        }
        Op::Resize(_) => resize::build(graph, node),
        Op::Unary(_) | Op::Binary(_) | Op::Elementwise(_) | Op::Clip | Op::Where => {
            elementwise::build(graph, node)
        }
        Op::Concat { .. }
        | Op::Split { .. }
        | Op::Slice
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Flatten { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Gather { .. }
        | Op::Expand
        | Op::ScatterND
        | Op::Pad { .. }
        | Op::Cast { .. }
        | Op::Identity => movement::build(graph, node),
        Op::Shape { .. } | Op::ConstantOfShape { .. } | Op::Range => generate::build(graph, node),
        Op::QuantizeLinear { .. } | Op::DequantizeLinear { .. } | Op::QLut { .. } => {
            quantize::build(graph, node)
        }
        Op::QConv(_) => qconv::build(graph, node),
        Op::QGemm(_) => qgemm::build(graph, node),
        Op::QAdd(_) => qadd::build(graph, node),
    }
}

/// A read-only view of one tensor (an arena slice or a constant's bytes).
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    /// Element type.
    pub dtype: DataType,
    /// Static shape, row-major.
    pub shape: &'a [usize],
    /// The elements' native-endian bytes, aligned for the element type.
    pub bytes: &'a [u8],
}

/// A writable view of one output tensor in the arena.
#[derive(Debug)]
pub struct TensorMut<'a> {
    /// Element type.
    pub dtype: DataType,
    /// Static shape, row-major.
    pub shape: &'a [usize],
    /// The elements' native-endian bytes, aligned for the element type.
    pub bytes: &'a mut [u8],
}

fn cast_slice<T>(b: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert!(
        b.len().is_multiple_of(size)
            && (b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()),
        "arena view misaligned or not a multiple of the element size"
    );
    // SAFETY: alignment and length checked above; T is a plain numeric type.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const T, b.len() / size) }
}

fn cast_slice_mut<T>(b: &mut [u8]) -> &mut [T] {
    let size = std::mem::size_of::<T>();
    assert!(
        b.len().is_multiple_of(size)
            && (b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()),
        "arena view misaligned or not a multiple of the element size"
    );
    // SAFETY: alignment and length checked above; T is a plain numeric type.
    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut T, b.len() / size) }
}

impl<'a> TensorRef<'a> {
    /// Elements as f32 (the planner aligns every view to 64 bytes).
    pub fn f32(&self) -> &'a [f32] {
        cast_slice(self.bytes)
    }
    /// Elements as i64.
    pub fn i64(&self) -> &'a [i64] {
        cast_slice(self.bytes)
    }
    /// Elements as i32.
    pub fn i32(&self) -> &'a [i32] {
        cast_slice(self.bytes)
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    /// True when the view holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for TensorMut<'_> {
    /// An empty placeholder view (used to fill fixed-size view arrays without allocating).
    fn default() -> Self {
        TensorMut {
            dtype: DataType::F32,
            shape: &[],
            bytes: &mut [],
        }
    }
}

impl<'a> TensorMut<'a> {
    /// Elements as mutable f32.
    pub fn f32(&mut self) -> &mut [f32] {
        cast_slice_mut(self.bytes)
    }
    /// Elements as mutable i64.
    pub fn i64(&mut self) -> &mut [i64] {
        cast_slice_mut(self.bytes)
    }
    /// Elements as mutable i32.
    pub fn i32(&mut self) -> &mut [i32] {
        cast_slice_mut(self.bytes)
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    /// True when the view holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One node compiled for static shapes. `run` must not allocate: scratch space it needs is
/// declared by [`Kernel::scratch_bytes`] and handed in from the planned arena.
pub trait Kernel: Send + Sync {
    /// Computes the outputs from the inputs (omitted optional inputs are `None`).
    fn run(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [TensorMut<'_>],
        scratch: &mut [u8],
    ) -> Result<()>;

    /// Bytes of scratch memory `run` needs (im2col buffers and the like).
    fn scratch_bytes(&self) -> usize {
        0
    }

    /// The input that [`run_in_place`](Self::run_in_place) takes from output 0's bytes (None:
    /// the kernel cannot run in place). Only kernels that read element i of that input
    /// before writing element i of the output, and nothing else of it, may say so.
    fn in_place_input(&self) -> Option<usize> {
        None
    }

    /// Like [`run`](Self::run), but input [`in_place_input`](Self::in_place_input) is `None`
    /// in `inputs`: its values are already in `outputs[0]`, which the kernel overwrites.
    fn run_in_place(
        &self,
        _inputs: &[Option<TensorRef<'_>>],
        _outputs: &mut [TensorMut<'_>],
        _scratch: &mut [u8],
    ) -> Result<()> {
        Err(crate::error::Error::Unsupported(
            "this kernel cannot run in place".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::part_count;

    fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(f)
    }

    #[test]
    fn parts_are_multiples_of_the_workers_and_keep_their_rows() {
        // One thread: one part, however many rows.
        assert_eq!(in_pool(1, || part_count(100_000, 1)), 1);
        // Two workers: doubled while a part keeps min_rows, at most 4 a worker.
        assert_eq!(in_pool(2, || part_count(1000, 100)), 8);
        assert_eq!(in_pool(2, || part_count(1000, 200)), 4);
        assert_eq!(in_pool(2, || part_count(1000, 300)), 2);
        // Too few rows for even one part a worker: still one a worker.
        assert_eq!(in_pool(2, || part_count(10, 64)), 2);
        assert_eq!(in_pool(3, || part_count(3000, 250)), 12);
        assert_eq!(in_pool(3, || part_count(3000, 400)), 6);
    }
}
