#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what the tests need, then runs
# formatting, lints and every test (unit, ONNX conformance, golden models, HTTP server).
set -euo pipefail
cd "$(dirname "$0")/.."
# rustup's and pyenv's tools, where this machine has them (a bare CI environment may not put
# them on PATH).
for d in "$HOME/.cargo/bin" "$HOME/.pyenv/shims"; do
    if [ -d "$d" ]; then PATH="$d:$PATH"; fi
done
export PATH

# ONNX's own backend node tests (the conformance cases) ship inside PyPI onnx 1.22.0.
if ! python3 -c 'import onnx, sys; sys.exit(onnx.__version__ != "1.22.0")' 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check "onnx==1.22.0" ||
        python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "onnx==1.22.0"
fi
# ONNX Runtime, the oracle of the INT8 checks that run QDQ models in it (with pillow and numpy for
# the scripts that feed it). Without it those checks print SKIP, so a failed install is said, not
# fatal.
if ! python3 -c 'import onnxruntime, PIL, numpy, sys; sys.exit(onnxruntime.__version__ != "1.32.0")' 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check "onnxruntime==1.32.0" pillow numpy ||
        python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "onnxruntime==1.32.0" pillow numpy ||
        echo "SKIP: could not install onnxruntime 1.32.0, pillow and numpy: the QDQ checks in ONNX Runtime will skip"
fi
VIGIL_ONNX_NODE_TESTS="$(python3 -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/node"))')"
export VIGIL_ONNX_NODE_TESTS

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The engine without its default `cuda` feature (a CPU-only build) lints clean too; the CUDA
# test files compile to nothing there.
cargo clippy -p vigil-engine --no-default-features --all-targets -- -D warnings
# The API docs build without a broken or private link.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
cargo test --workspace -- --nocapture 2>&1 | tee target/test-output.log
# Packaging: unit verification, aarch64 cross-build + glibc check, both .debs, and serve-and-infer
# smoke tests of the installed packages (arm64 under qemu-user). VIGIL_SKIP_PACKAGING=1 skips it
# locally (never in CI).
if [ "${VIGIL_SKIP_PACKAGING:-0}" = 1 ] && [ "${CI:-}" != true ]; then
    echo "SKIP: packaging checks because VIGIL_SKIP_PACKAGING=1" | tee -a target/test-output.log
else
    scripts/ci-packaging.sh 2>&1 | tee -a target/test-output.log
fi
grep -E "^conformance:|agreement|worst relative|allocations in|SKIP" target/test-output.log || true
# One closing line with the totals over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' target/test-output.log
