#!/usr/bin/env bash
# The packaging part of CI (called by scripts/test.sh after the cargo tests):
#   1. systemd-analyze verify of systemd/vigil.service, and its security score;
#   2. the aarch64 release binary (scripts/cross-build) and its glibc symbol check (<= 2.35);
#   3. the amd64 release binary;
#   4. both .deb packages (scripts/package-deb), with dpkg-deb --info/--contents;
#   5. each package installed with dpkg into a scratch root (maintainer scripts run with
#      DPKG_ROOT: user created, service enabled), then a serve-and-infer smoke test of the
#      installed binary with the installed default config and models, playing systemd
#      (READY=1, WATCHDOG=1, SIGTERM -> STOPPING=1) — the arm64 one under
#      qemu-aarch64-static -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib
#      (the whole cross glibc, loader and libc together); then purged.
# Installs the Debian packages it needs with apt-get. Any failure fails CI.
set -euo pipefail
cd "$(dirname "$0")/.."
for d in "$HOME/.cargo/bin"; do
    if [ -d "$d" ]; then PATH="$d:$PATH"; fi
done
# dpkg needs ldconfig and start-stop-daemon, which live in the sbin directories that a bare CI
# environment may leave off PATH.
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
export PATH
T0=$(date +%s)
step() { echo; echo "== packaging: $* (t+$(( $(date +%s) - T0 ))s)"; }

need=()
for p in systemd qemu-user-static binutils file curl; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    step "apt-get install ${need[*]}"
    apt-get update -qq -o DPkg::Lock::Timeout=600
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
        --no-install-recommends "${need[@]}" >/dev/null
fi

step "systemd-analyze verify systemd/vigil.service"
# verify insists that ExecStart's binary exists: check a copy whose ExecStart points at
# /bin/true (the only line that differs), so the host needs no /usr/bin/vigil.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
sed 's|^ExecStart=/usr/bin/vigil |ExecStart=/bin/true |' systemd/vigil.service > "$scratch/vigil.service"
systemd-analyze verify "$scratch/vigil.service"
echo "verify: ok"
systemd-analyze security --offline=true --no-pager "$scratch/vigil.service" | tail -n1

step "cross-build aarch64"
scripts/cross-build

step "build amd64 release"
cargo build --locked --release -p vigil --bin vigil

step "package-deb amd64 arm64"
scripts/package-deb amd64 arm64
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' app/Cargo.toml | head -n1)"
for arch in amd64 arm64; do
    deb="target/deb/vigil_${VERSION}_${arch}.deb"
    echo "--- dpkg-deb --info $deb"
    dpkg-deb --info "$deb"
    echo "--- dpkg-deb --contents $deb"
    dpkg-deb --contents "$deb"
done

IMAGE="${VIGIL_SHARED:-../shared}/images/eval/coffee.png"
if [ ! -f "$IMAGE" ]; then
    echo "packaging: ${IMAGE} missing; the smoke test classifies a generated image instead"
    IMAGE="$scratch/fallback.png"
    python3 - "$IMAGE" <<'PY'
import struct, sys, zlib
w, h = 64, 48
rows = [b"\x00" + b"".join(bytes((x * 4, y * 5, 90)) for x in range(w)) for y in range(h)]
def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
       + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))
open(sys.argv[1], "wb").write(png)
PY
fi

for arch in amd64 arm64; do
    deb="target/deb/vigil_${VERSION}_${arch}.deb"
    root="$scratch/root-$arch"
    step "dpkg -i $deb into a scratch root"
    mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/etc" "$root/usr/lib"
    touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
    if [ "$arch" != "$(dpkg --print-architecture)" ]; then
        dpkg --root="$root" --add-architecture "$arch"
    fi
    dpkg --root="$root" --force-script-chrootless --force-depends -i "$deb"
    dpkg --root="$root" -s vigil | grep -E '^(Status|Architecture|Version):'
    grep '^vigil:' "$root/etc/passwd"
    grep -E '^(video|render):' "$root/etc/group"
    test -L "$root/etc/systemd/system/multi-user.target.wants/vigil.service"
    echo "service enabled: $(readlink "$root/etc/systemd/system/multi-user.target.wants/vigil.service")"

    step "serve-and-infer smoke test of the installed $arch binary"
    # The installed default config, with its model paths moved into the scratch root and an
    # ephemeral loopback port.
    sed -e "s|/usr/share/vigil/models|$root/usr/share/vigil/models|" \
        -e 's|^listen = .*|listen = "127.0.0.1:0"|' "$root/etc/vigil/config.toml" > "$scratch/config-$arch.toml"
    if [ "$arch" = arm64 ]; then
        # -E LD_LIBRARY_PATH keeps the cross glibc's libc with its loader: without it the loader
        # from /usr/aarch64-linux-gnu picks libc.so.6 of the multiarch libc6:arm64 (a different
        # build) through the host's ld.so.cache, and the first pthread_create loops forever.
        runner=(qemu-aarch64-static -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib "$root/usr/bin/vigil")
        file "$root/usr/bin/vigil"
    else
        runner=("$root/usr/bin/vigil")
    fi
    "${runner[@]}" --version
    "${runner[@]}" serve --help >/dev/null
    python3 packaging/smoke-serve.py "$scratch/config-$arch.toml" "$IMAGE" -- "${runner[@]}"

    step "dpkg --purge vigil ($arch)"
    dpkg --root="$root" --force-script-chrootless --purge vigil
    test ! -e "$root/etc/systemd/system/multi-user.target.wants/vigil.service"
    test ! -e "$root/usr/bin/vigil"
    echo "purged: binary and enablement gone"
done

echo
echo "packaging: all checks passed in $(( $(date +%s) - T0 ))s"
