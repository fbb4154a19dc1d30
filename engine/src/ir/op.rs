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
    Nchw,
    Nhwc,
}

/// Pointwise activation, usable as a standalone op or fused into a Conv/Gemm epilogue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    Relu,
    /// Clip(min, max); ReLU6 is Clip(0, 6).
    Clip {
        min: f32,
        max: f32,
    },
    LeakyRelu {
        alpha: f32,
    },
    Sigmoid,
    /// x * sigmoid(x); produced by fusion of `Mul(x, Sigmoid(x))`.
    Silu,
    HardSwish,
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
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
    Act(Activation),
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Reciprocal,
    Floor,
    Ceil,
    Round,
    Erf,
    Not,
}

/// Binary elementwise ops with numpy-style broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    Equal,
    Less,
    Greater,
    And,
    Or,
}

/// One step of a fused elementwise chain; the running value starts as the node's first input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ChainStep {
    Unary(UnaryOp),
    /// `acc = acc OP input[operand]` (or `input[operand] OP acc` when `acc_on_right`).
    Binary {
        op: BinaryOp,
        operand: usize,
        acc_on_right: bool,
    },
}

/// ONNX `auto_pad`; shape inference resolves it into explicit `pads` and resets it to `NotSet`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AutoPad {
    #[default]
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// Convolution attributes (2-D and 1-D; 1-D is handled as H=1).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvAttrs {
    pub kernel_shape: Vec<usize>,
    pub strides: Vec<usize>,
    /// ONNX order: all begins, then all ends.
    pub pads: Vec<usize>,
    pub dilations: Vec<usize>,
    pub group: usize,
    pub auto_pad: AutoPad,
    /// Fused epilogue activation (set by the fusion pass).
    pub activation: Option<Activation>,
    pub layout: Layout,
}

/// ConvTranspose attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvTransposeAttrs {
    pub conv: ConvAttrs,
    pub output_padding: Vec<usize>,
    /// Explicit output spatial shape, if given (overrides pads).
    pub output_shape: Option<Vec<usize>>,
}

/// MaxPool / AveragePool attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolAttrs {
    pub kernel_shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub pads: Vec<usize>,
    pub dilations: Vec<usize>,
    pub ceil_mode: bool,
    pub auto_pad: AutoPad,
    /// AveragePool only: whether padded cells count in the divisor.
    pub count_include_pad: bool,
    pub layout: Layout,
}

/// Resize interpolation mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeMode {
    Nearest,
    Linear,
}

/// Resize coordinate mapping (ONNX `coordinate_transformation_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordMode {
    HalfPixel,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfHalfPixelForNn,
}

/// Nearest rounding (ONNX `nearest_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NearestMode {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

/// Resize attributes; scales/sizes are inputs 2 and 3 (constant after folding).
#[derive(Clone, Debug, PartialEq)]
pub struct ResizeAttrs {
    pub mode: ResizeMode,
    pub coord: CoordMode,
    pub nearest: NearestMode,
    pub layout: Layout,
}

/// Pad mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadMode {
    Constant,
    Reflect,
    Edge,
}

/// Quantization parameters of one per-tensor quantized 8-bit tensor: `real = (q - zero_point) * scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QParams {
    pub scale: f32,
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
    pub a: QParams,
    pub y: QParams,
    /// Per-output-column weight scales (weights are symmetric int8).
    pub w_scales: Vec<f32>,
    pub activation: Option<Activation>,
}

/// A quantized elementwise sum folded from `DQ(a), DQ(b) → Add [→ activation] → Q` (same
/// shapes): dequantized, added and requantized in f32 exactly as the three ops would be.
#[derive(Clone, Debug, PartialEq)]
pub struct QAddAttrs {
    pub a: QParams,
    pub b: QParams,
    pub y: QParams,
    /// Applied to the real-valued sum before requantization.
    pub activation: Option<Activation>,
}

/// Every operator the IR can represent. Inputs are documented per variant (ONNX order).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// X, W, [B]
    Conv(ConvAttrs),
    /// X, W, [B]
    ConvTranspose(ConvTransposeAttrs),
    /// A, B, [C]; `activation` is a fused epilogue.
    Gemm {
        alpha: f32,
        beta: f32,
        trans_a: bool,
        trans_b: bool,
        activation: Option<Activation>,
    },
    /// A, B
    MatMul,
    /// X, scale, B, mean, var
    BatchNormalization {
        epsilon: f32,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// Fused elementwise chain over inputs; the result has the broadcast shape of all inputs.
    Elementwise(Vec<ChainStep>),
    /// X, [min], [max] (opset >= 11 passes bounds as inputs; older ones are rewritten to Act).
    Clip,
    MaxPool(PoolAttrs),
    AveragePool(PoolAttrs),
    GlobalAveragePool {
        layout: Layout,
    },
    GlobalMaxPool {
        layout: Layout,
    },
    Concat {
        axis: i64,
    },
    /// X, [split]; `num_outputs` is the node's output count.
    Split {
        axis: i64,
        split: Option<Vec<usize>>,
    },
    /// data, starts, ends, [axes], [steps]
    Slice,
    /// data, shape
    Reshape {
        allowzero: bool,
    },
    Transpose {
        perm: Vec<usize>,
    },
    Flatten {
        axis: i64,
    },
    /// data, [axes] (attribute axes of older opsets are stored here)
    Squeeze {
        axes: Option<Vec<i64>>,
    },
    /// data, [axes]
    Unsqueeze {
        axes: Option<Vec<i64>>,
    },
    /// data, indices
    Gather {
        axis: i64,
    },
    /// input, shape
    Expand,
    /// data, indices, updates
    ScatterND,
    /// data, pads, [constant_value], [axes]
    Pad {
        mode: PadMode,
    },
    Cast {
        to: super::DataType,
    },
    /// X, [roi], [scales], [sizes]
    Resize(ResizeAttrs),
    Softmax {
        axis: i64,
    },
    Shape {
        start: i64,
        end: Option<i64>,
    },
    /// input (shape)
    ConstantOfShape {
        value: super::Tensor,
    },
    /// condition, X, Y
    Where,
    /// start, limit, delta
    Range,
    ReduceMean {
        axes: Option<Vec<i64>>,
        keepdims: bool,
    },
    Identity,
    /// x (f32), y_scale, [y_zero_point]: `saturate(round(x / scale) + zero_point)`; `axis` is the
    /// per-axis dimension; `dtype` is the `output_dtype` attribute when given.
    QuantizeLinear {
        axis: i64,
        dtype: Option<super::DataType>,
    },
    /// x (int), x_scale, [x_zero_point]: `(x - zero_point) * scale` as f32.
    DequantizeLinear {
        axis: i64,
    },
    /// Quantized X (NCHW or NHWC per `conv.layout`), W (int8, OIHW), [bias (i32, scale x*w)].
    QConv(QConvAttrs),
    /// Quantized A `[M, K]`, B (int8), [C (i32 `[N]`, scale a*w)].
    QGemm(QGemmAttrs),
    /// Quantized elementwise map by a 256-entry table (a `DQ → unary op → Q` chain); input byte
    /// `b` (as u8 bits) maps to `table[b]`, of element type `dtype`.
    QLut {
        table: Vec<u8>,
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
