//! Generates the ONNX protobuf types from the vendored `proto/onnx.proto`.
//! protox compiles the schema in pure Rust, so no `protoc` is needed and nothing is downloaded.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let fds = protox::compile(["proto/onnx.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
