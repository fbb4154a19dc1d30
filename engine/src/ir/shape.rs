//! Static shape and type inference. (Filled by the ONNX/shape work.)
