//! ONNX import. (Filled by the ONNX import work.)
