//! Operators with their attributes parsed and defaulted (per the ONNX spec) at import time.
//!
//! Inputs that ONNX passes as tensors but which are static in practice (Reshape's shape, Slice's
//! bounds, Pad's pads, Resize's scales, Clip's bounds, ...) stay graph inputs here; after constant
//! folding they are constant values that shape inference and the kernels read at load time.

/// Memory layout of a 4-D activation. The IR is logically NCHW; the layout pass rewrites
/// convolution regions to NHWC and marks the spatial ops it rewrites with `Nhwc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Layout {
    #[default]
    /// Channels-first `[N, C, H, W]` (ONNX's native layout).
    Nchw,
    /// Channels-last `[N, H, W, C]` (set by the layout pass on the ops it rewrites).
    Nhwc,
}

/// Pointwise activation, usable as a standalone op or fused into a Conv/Gemm epilogue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `max(x, 0)` (ONNX Relu).
    Relu,
    /// Clip(min, max); ReLU6 is Clip(0, 6).
    Clip {
        /// Lower bound of the output.
        min: f32,
        /// Upper bound of the output.
        max: f32,
    },
    /// `x` for `x >= 0`, else `alpha * x` (ONNX LeakyRelu).
    LeakyRelu {
        /// Slope for negative inputs (ONNX default 0.01).
        alpha: f32,
    },
    /// `1 / (1 + exp(-x))` (ONNX Sigmoid).
    Sigmoid,
    /// x * sigmoid(x); produced by fusion of `Mul(x, Sigmoid(x))`.
    Silu,
    /// `x * clamp(x / 6 + 0.5, 0, 1)` (ONNX HardSwish).
    HardSwish,
    /// `clamp(alpha * x + beta, 0, 1)` (ONNX HardSigmoid).
    HardSigmoid {
        /// Slope (ONNX default 0.2).
        alpha: f32,
        /// Offset (ONNX default 0.5).
        beta: f32,
    },
    /// Hyperbolic tangent (ONNX Tanh).
    Tanh,
}

impl Activation {
    /// Applies the activation to one value (reference semantics, also used by kernels).
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Relu => x.max(0.0),
            Activation::Clip { min, max } => x.max(min).min(max),
            Activation::LeakyRelu { alpha } => {
                if x >= 0.0 {
                    x
                } else {
                    alpha * x
                }
            }
            Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
            Activation::HardSigmoid { alpha, beta } => (alpha * x + beta).clamp(0.0, 1.0),
            Activation::Tanh => x.tanh(),
        }
    }
}

/// Unary elementwise math (activations included).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// A pointwise activation (see [`Activation`]).
    Act(Activation),
    /// `-x` (ONNX Neg).
    Neg,
    /// `|x|` (ONNX Abs).
    Abs,
    /// `e^x` (ONNX Exp).
    Exp,
    /// Natural logarithm (ONNX Log).
    Log,
    /// Square root (ONNX Sqrt).
    Sqrt,
    /// `1 / x` (ONNX Reciprocal).
    Reciprocal,
    /// Rounds toward negative infinity (ONNX Floor).
    Floor,
    /// Rounds toward positive infinity (ONNX Ceil).
    Ceil,
    /// Rounds to nearest, ties to even (ONNX Round).
    Round,
    /// Gauss error function (ONNX Erf).
    Erf,
    /// Logical negation of a bool tensor (ONNX Not).
    Not,
}

/// Binary elementwise ops with numpy-style broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b` (ONNX Add, and Sum of two inputs).
    Add,
    /// `a - b` (ONNX Sub).
    Sub,
    /// `a * b` (ONNX Mul).
    Mul,
    /// `a / b` (ONNX Div).
    Div,
    /// `a` raised to the power `b` (ONNX Pow).
    Pow,
    /// Elementwise maximum (ONNX Max of two inputs).
    Max,
    /// Elementwise minimum (ONNX Min of two inputs).
    Min,
    /// `a == b` as a bool tensor (ONNX Equal).
    Equal,
    /// `a < b` as a bool tensor (ONNX Less).
    Less,
    /// `a > b` as a bool tensor (ONNX Greater).
    Greater,
    /// Logical `a && b` of bool tensors (ONNX And).
    And,
    /// Logical `a || b` of bool tensors (ONNX Or).
    Or,
}

/// One step of a fused elementwise chain; the running value starts as the node's first input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ChainStep {
    /// `acc = op(acc)`.
    Unary(UnaryOp),
    /// `acc = acc OP input[operand]` (or `input[operand] OP acc` when `acc_on_right`).
    Binary {
        /// The operation combining the running value with the operand.
        op: BinaryOp,
        /// Index of the node input used as the other operand.
        operand: usize,
        /// Whether the running value is the right-hand operand (matters for Sub, Div, ...).
        acc_on_right: bool,
    },
}

/// ONNX `auto_pad`; shape inference resolves it into explicit `pads` and resets it to `NotSet`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AutoPad {
    #[default]
    /// Use the explicit `pads` (ONNX `NOTSET`, the default).
    NotSet,
    /// Pad so that output = ceil(input / stride); an odd extra pad goes at the end.
    SameUpper,
    /// As `SameUpper`, but an odd extra pad goes at the beginning.
    SameLower,
    /// No padding.
    Valid,
}

/// Convolution attributes (2-D and 1-D; 1-D is handled as H=1).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvAttrs {
    /// Spatial kernel size (`[kH, kW]`, or `[kW]` for 1-D); from W's shape when not given.
    pub kernel_shape: Vec<usize>,
    /// Stride per spatial axis, in input pixels (ONNX default 1).
    pub strides: Vec<usize>,
    /// ONNX order: all begins, then all ends.
    pub pads: Vec<usize>,
    /// Kernel dilation per spatial axis (ONNX default 1).
    pub dilations: Vec<usize>,
    /// Channel groups (ONNX `group`, default 1); depthwise when equal to the input channels.
    pub group: usize,
    /// ONNX `auto_pad`; `NotSet` once shape inference has resolved it into `pads`.
    pub auto_pad: AutoPad,
    /// Fused epilogue activation (set by the fusion pass).
    pub activation: Option<Activation>,
    /// Layout of X and Y (`Nhwc` after the layout pass; weights stay OIHW).
    pub layout: Layout,
}

/// ConvTranspose attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvTransposeAttrs {
    /// Kernel, strides, pads, dilations, groups and layout, with Conv's conventions.
    pub conv: ConvAttrs,
    /// Extra size added at the end of each spatial output axis (ONNX default 0).
    pub output_padding: Vec<usize>,
    /// Explicit output spatial shape, if given (overrides pads).
    pub output_shape: Option<Vec<usize>>,
}

/// MaxPool / AveragePool attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolAttrs {
    /// Pooling window size per spatial axis (required by ONNX).
    pub kernel_shape: Vec<usize>,
    /// Stride per spatial axis, in input pixels (ONNX default 1).
    pub strides: Vec<usize>,
    /// Padding per spatial axis; ONNX order: all begins, then all ends.
    pub pads: Vec<usize>,
    /// Window dilation per spatial axis (ONNX default 1).
    pub dilations: Vec<usize>,
    /// Rounds the output size up instead of down (ONNX `ceil_mode`).
    pub ceil_mode: bool,
    /// ONNX `auto_pad`; `NotSet` once shape inference has resolved it into `pads`.
    pub auto_pad: AutoPad,
    /// AveragePool only: whether padded cells count in the divisor.
    pub count_include_pad: bool,
    /// Layout of X and Y (`Nhwc` when rewritten by the layout pass).
    pub layout: Layout,
}

/// Resize interpolation mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeMode {
    /// Nearest-neighbour sampling, rounded per [`NearestMode`].
    Nearest,
    /// Linear interpolation along each resized axis (ONNX `linear`).
    Linear,
}

/// Resize coordinate mapping (ONNX `coordinate_transformation_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordMode {
    /// Input coordinate `(x + 0.5) / scale - 0.5` for output coordinate `x` (default).
    HalfPixel,
    /// As `HalfPixel`, but 0 when the output length is 1.
    PytorchHalfPixel,
    /// `x * (in - 1) / (out - 1)`: corner pixels map onto corner pixels.
    AlignCorners,
    /// `x / scale`.
    Asymmetric,
    /// `(x + 0.5) / scale` (TensorFlow's nearest-neighbour convention).
    TfHalfPixelForNn,
}

/// Nearest rounding (ONNX `nearest_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NearestMode {
    /// Nearest, halves rounded down (ONNX default).
    RoundPreferFloor,
    /// Nearest, halves rounded up.
    RoundPreferCeil,
    /// Always rounds down.
    Floor,
    /// Always rounds up.
    Ceil,
}

/// Resize attributes; scales/sizes are inputs 2 and 3 (constant after folding).
#[derive(Clone, Debug, PartialEq)]
pub struct ResizeAttrs {
    /// Interpolation (ONNX `mode`, default nearest).
    pub mode: ResizeMode,
    /// Coordinate mapping (ONNX `coordinate_transformation_mode`, default half_pixel).
    pub coord: CoordMode,
    /// Rounding in `Nearest` mode (ONNX `nearest_mode`, default round_prefer_floor).
    pub nearest: NearestMode,
    /// Layout of X and Y (`Nhwc` when rewritten by the layout pass).
    pub layout: Layout,
}

/// Pad mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadMode {
    /// Fills with the `constant_value` input (default 0).
    Constant,
    /// Mirrors without repeating the edge: `[a, b, c]` padded by 1 is `[b, a, b, c, b]`.
    Reflect,
    /// Repeats the edge element.
    Edge,
}

/// Quantization parameters of one per-tensor quantized 8-bit tensor: `real = (q - zero_point) * scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QParams {
    /// Real value of one quantization step.
    pub scale: f32,
    /// The integer that represents real 0.
    pub zero_point: i32,
    /// `I8` or `U8`.
    pub dtype: super::DataType,
}

impl QParams {
    /// The representable integer range of the element type.
    pub fn range(&self) -> (i32, i32) {
        match self.dtype {
            super::DataType::U8 => (0, 255),
            _ => (-128, 127),
        }
    }
}

/// An integer convolution folded from `DQ(x) → Conv(DQ(w), DQ(b)) [→ activation] → Q`.
#[derive(Clone, Debug, PartialEq)]
pub struct QConvAttrs {
    /// Geometry, layout and the fused activation (applied to the real-valued result).
    pub conv: ConvAttrs,
    /// Input quantization.
    pub x: QParams,
    /// Output quantization.
    pub y: QParams,
    /// Per-output-channel weight scales (weights are symmetric int8).
    pub w_scales: Vec<f32>,
    /// A residual (input 3, the output's shape, these parameters) added to the real-valued
    /// result before the activation, requantized once: `QConv → QAdd` fused by the CUDA
    /// backend (the CPU backend runs the two ops).
    pub residual: Option<QParams>,
}

/// An integer Gemm folded from `DQ(a) → Gemm(DQ(b), DQ(c)) [→ activation] → Q` (alpha = beta = 1).
#[derive(Clone, Debug, PartialEq)]
pub struct QGemmAttrs {
    /// B is `[N, K]` when set, `[K, N]` otherwise.
    pub trans_b: bool,
    /// Quantization of input A.
    pub a: QParams,
    /// Output quantization.
    pub y: QParams,
    /// Per-output-column weight scales (weights are symmetric int8).
    pub w_scales: Vec<f32>,
    /// Fused activation, applied to the real-valued result before requantization.
    pub activation: Option<Activation>,
}

/// A quantized elementwise sum folded from `DQ(a), DQ(b) → Add [→ activation] → Q` (same
/// shapes): dequantized, added and requantized in f32 exactly as the three ops would be.
#[derive(Clone, Debug, PartialEq)]
pub struct QAddAttrs {
    /// Quantization of input A.
    pub a: QParams,
    /// Quantization of input B.
    pub b: QParams,
    /// Output quantization.
    pub y: QParams,
    /// Applied to the real-valued sum before requantization.
    pub activation: Option<Activation>,
}

/// Every operator the IR can represent. Inputs are documented per variant (ONNX order).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// X, W, \[B\]
    Conv(ConvAttrs),
    /// X, W, \[B\]
    ConvTranspose(ConvTransposeAttrs),
    /// A, B, \[C\]; `activation` is a fused epilogue.
    Gemm {
        /// Scale of the product in `Y = alpha * A' * B' + beta * C` (ONNX default 1).
        alpha: f32,
        /// Scale of C (ONNX default 1).
        beta: f32,
        /// A is `[K, M]` and used transposed (ONNX `transA`).
        trans_a: bool,
        /// B is `[N, K]` and used transposed (ONNX `transB`).
        trans_b: bool,
        /// Fused epilogue activation (set by the fusion pass).
        activation: Option<Activation>,
    },
    /// A, B
    MatMul,
    /// X, scale, B, mean, var
    BatchNormalization {
        /// Added to the variance before the square root (ONNX default 1e-5).
        epsilon: f32,
    },
    /// X; a unary elementwise op (see [`UnaryOp`]).
    Unary(UnaryOp),
    /// A, B; a broadcasting binary elementwise op (see [`BinaryOp`]).
    Binary(BinaryOp),
    /// Fused elementwise chain over inputs; the result has the broadcast shape of all inputs.
    Elementwise(Vec<ChainStep>),
    /// X, \[min\], \[max\] (opset >= 11 passes bounds as inputs; older ones are rewritten to Act).
    Clip,
    /// X; maximum over each window (ONNX MaxPool).
    MaxPool(PoolAttrs),
    /// X; mean over each window (ONNX AveragePool).
    AveragePool(PoolAttrs),
    /// X; per-channel mean over all spatial positions (spatial dims become 1).
    GlobalAveragePool {
        /// Layout of X and Y (`Nhwc` when rewritten by the layout pass).
        layout: Layout,
    },
    /// X; per-channel maximum over all spatial positions (spatial dims become 1).
    GlobalMaxPool {
        /// Layout of X and Y (`Nhwc` when rewritten by the layout pass).
        layout: Layout,
    },
    /// Inputs (one or more), joined along `axis`.
    Concat {
        /// Axis to join on; negative counts from the end (required by ONNX).
        axis: i64,
    },
    /// X, \[split\]; `num_outputs` is the node's output count.
    Split {
        /// Axis to split; negative counts from the end (ONNX default 0).
        axis: i64,
        /// Output sizes along `axis` (attribute or constant input); `None`: equal parts.
        split: Option<Vec<usize>>,
    },
    /// data, starts, ends, \[axes\], \[steps\]
    Slice,
    /// data, shape
    Reshape {
        /// A 0 in `shape` makes a 0-sized dim instead of copying the input's (opset >= 14).
        allowzero: bool,
    },
    /// data; permutes the axes.
    Transpose {
        /// Output axis `i` is input axis `perm[i]`; empty until inferred when defaulted (reversed).
        perm: Vec<usize>,
    },
    /// input; reshaped to 2-D `[prod(dims[..axis]), prod(dims[axis..])]`.
    Flatten {
        /// Where the second output dim starts; negative counts from the end (ONNX default 1).
        axis: i64,
    },
    /// data, \[axes\] (attribute axes of older opsets are stored here)
    Squeeze {
        /// Axes to remove (negative count from the end); `None`: input 1, else every size-1 axis.
        axes: Option<Vec<i64>>,
    },
    /// data, \[axes\]
    Unsqueeze {
        /// Output positions of the new size-1 axes (negative count from the end); `None`: input 1.
        axes: Option<Vec<i64>>,
    },
    /// data, indices
    Gather {
        /// Axis of data that indices select along; negative counts from the end (default 0).
        axis: i64,
    },
    /// input, shape
    Expand,
    /// data, indices, updates
    ScatterND,
    /// data, pads, \[constant_value\], \[axes\]
    Pad {
        /// How padded cells are filled (ONNX `mode`, default constant).
        mode: PadMode,
    },
    /// input; converted to another element type.
    Cast {
        /// Target element type (ONNX `to`).
        to: super::DataType,
    },
    /// X, \[roi\], \[scales\], \[sizes\]
    Resize(ResizeAttrs),
    /// input; `exp(x) / sum(exp(x))` along `axis`.
    Softmax {
        /// Normalized axis; negative counts from the end (default -1; 1 before opset 13).
        axis: i64,
    },
    /// data; its dims `start..end` as a 1-D i64 tensor.
    Shape {
        /// First dim included; negative counts from the end (ONNX default 0).
        start: i64,
        /// One past the last dim included; negative counts from the end; `None`: the rank.
        end: Option<i64>,
    },
    /// input (shape)
    ConstantOfShape {
        /// One-element tensor giving the fill value and element type (ONNX default f32 0).
        value: super::Tensor,
    },
    /// condition, X, Y
    Where,
    /// start, limit, delta
    Range,
    /// data; mean over `axes` (ONNX ReduceMean).
    ReduceMean {
        /// Axes to reduce (negative count from the end); `None` reduces all of them.
        axes: Option<Vec<i64>>,
        /// Keeps reduced axes as size 1 (ONNX default true).
        keepdims: bool,
    },
    /// input, unchanged (inference-mode Dropout also becomes this).
    Identity,
    /// x (f32), y_scale, \[y_zero_point\]: `saturate(round(x / scale) + zero_point)`; `axis` is the
    /// per-axis dimension; `dtype` is the `output_dtype` attribute when given.
    QuantizeLinear {
        /// Axis a 1-D scale/zero point runs along (ONNX default 1); negative counts from the end.
        axis: i64,
        /// Output type (ONNX `output_dtype`) used when no zero point gives one; U8 if neither.
        dtype: Option<super::DataType>,
    },
    /// x (int), x_scale, \[x_zero_point\]: `(x - zero_point) * scale` as f32.
    DequantizeLinear {
        /// Axis a 1-D scale/zero point runs along (ONNX default 1); negative counts from the end.
        axis: i64,
    },
    /// Quantized X (NCHW or NHWC per `conv.layout`), W (int8, OIHW), [bias (i32, scale x*w)].
    QConv(QConvAttrs),
    /// Quantized A `[M, K]`, B (int8), [C (i32 `[N]`, scale a*w)].
    QGemm(QGemmAttrs),
    /// Quantized elementwise map by a 256-entry table (a `DQ → unary op → Q` chain); input byte
    /// `b` (as u8 bits) maps to `table[b]`, of element type `dtype`.
    QLut {
        /// Output byte for each input byte (256 entries).
        table: Vec<u8>,
        /// Output element type (`I8` or `U8`).
        dtype: super::DataType,
    },
    /// Quantized A + B, both of the output's shape (see [`QAddAttrs`]).
    QAdd(QAddAttrs),
}

impl Op {
    /// The ONNX-style name of the op, for messages and `vigil inspect` counts.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Conv(a) if a.activation.is_some() => "FusedConv",
            Op::Conv(_) => "Conv",
            Op::ConvTranspose(_) => "ConvTranspose",
            Op::Gemm {
                activation: Some(_),
                ..
            } => "FusedGemm",
            Op::Gemm { .. } => "Gemm",
            Op::MatMul => "MatMul",
            Op::BatchNormalization { .. } => "BatchNormalization",
            Op::Unary(u) => match u {
                UnaryOp::Act(a) => match a {
                    Activation::Relu => "Relu",
                    Activation::Clip { .. } => "Clip",
                    Activation::LeakyRelu { .. } => "LeakyRelu",
                    Activation::Sigmoid => "Sigmoid",
                    Activation::Silu => "Silu",
                    Activation::HardSwish => "HardSwish",
                    Activation::HardSigmoid { .. } => "HardSigmoid",
                    Activation::Tanh => "Tanh",
                },
                UnaryOp::Neg => "Neg",
                UnaryOp::Abs => "Abs",
                UnaryOp::Exp => "Exp",
                UnaryOp::Log => "Log",
                UnaryOp::Sqrt => "Sqrt",
                UnaryOp::Reciprocal => "Reciprocal",
                UnaryOp::Floor => "Floor",
                UnaryOp::Ceil => "Ceil",
                UnaryOp::Round => "Round",
                UnaryOp::Erf => "Erf",
                UnaryOp::Not => "Not",
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => "Add",
                BinaryOp::Sub => "Sub",
                BinaryOp::Mul => "Mul",
                BinaryOp::Div => "Div",
                BinaryOp::Pow => "Pow",
                BinaryOp::Max => "Max",
                BinaryOp::Min => "Min",
                BinaryOp::Equal => "Equal",
                BinaryOp::Less => "Less",
                BinaryOp::Greater => "Greater",
                BinaryOp::And => "And",
                BinaryOp::Or => "Or",
            },
            Op::Elementwise(_) => "FusedElementwise",
            Op::Clip => "Clip",
            Op::MaxPool(_) => "MaxPool",
            Op::AveragePool(_) => "AveragePool",
            Op::GlobalAveragePool { .. } => "GlobalAveragePool",
            Op::GlobalMaxPool { .. } => "GlobalMaxPool",
            Op::Concat { .. } => "Concat",
            Op::Split { .. } => "Split",
            Op::Slice => "Slice",
            Op::Reshape { .. } => "Reshape",
            Op::Transpose { .. } => "Transpose",
            Op::Flatten { .. } => "Flatten",
            Op::Squeeze { .. } => "Squeeze",
            Op::Unsqueeze { .. } => "Unsqueeze",
            Op::Gather { .. } => "Gather",
            Op::Expand => "Expand",
            Op::ScatterND => "ScatterND",
            Op::Pad { .. } => "Pad",
            Op::Cast { .. } => "Cast",
            Op::Resize(_) => "Resize",
            Op::Softmax { .. } => "Softmax",
            Op::Shape { .. } => "Shape",
            Op::ConstantOfShape { .. } => "ConstantOfShape",
            Op::Where => "Where",
            Op::Range => "Range",
            Op::ReduceMean { .. } => "ReduceMean",
            Op::Identity => "Identity",
            Op::QuantizeLinear { .. } => "QuantizeLinear",
            Op::DequantizeLinear { .. } => "DequantizeLinear",
            Op::QConv(_) => "QConv",
            Op::QGemm(_) => "QGemm",
            Op::QLut { .. } => "QLut",
            Op::QAdd(_) => "QAdd",
        }
    }
}
