//! The engine's one error type.

/// Everything that can go wrong while loading, optimizing or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model file is not valid ONNX (bad protobuf, dangling references, missing fields).
    #[error("invalid model: {0}")]
    InvalidModel(String),
    /// An operator, attribute value or data type the engine does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Shapes that do not fit together.
    #[error("shape error: {0}")]
    Shape(String),
    /// A tensor of the wrong element type.
    #[error("type error: {0}")]
    Type(String),
    /// A caller-supplied input that does not match the model's signature.
    #[error("bad input: {0}")]
    BadInput(String),
    /// Image bytes in a format Vigil does not decode (not JPEG, PNG, BMP or WebP).
    #[error("unsupported image: {0}")]
    UnsupportedImage(String),
    /// An image whose header declares more pixels than the configured limit.
    #[error("image too large: {0}")]
    ImageTooLarge(String),
    /// Image decoding or pre/post-processing failure.
    #[error("image error: {0}")]
    Image(String),
    /// A memory pool that cannot satisfy an allocation; the message states the pool's state.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// I/O failure reading a model or image.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Result alias used across the engine.
pub type Result<T> = std::result::Result<T, Error>;
