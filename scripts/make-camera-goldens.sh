#!/usr/bin/env bash
# Golden RGB for the camera's YUYV/NV12 conversion: ffmpeg (swscale, default flags = bicubic,
# BT.601 limited range) converting the SAME shared YUYV and NV12 frames Vigil converts, so the
# test compares like with like (the shared .rgb24 was cut from the original video instead; see
# docs/camera.md). Converts whole frames, then crops in RGB (so no edge effect of the crop), and
# keeps frames 0 and 7, 256x192 at (192, 144), as PNG.
# Run: scripts/make-camera-goldens.sh   (needs ffmpeg; made with Debian 12's ffmpeg 5.1)
set -euo pipefail
cd "$(dirname "$0")/.."
S=${VIGIL_SHARED:-../shared}/camera
OUT=app/tests/golden
mkdir -p "$OUT"
for pair in yuyv422:yuyv nv12:nv12; do
    pix=${pair%%:*}; ext=${pair##*:}
    ffmpeg -loglevel error -y -f rawvideo -pix_fmt "$pix" -s 640x480 -i "$S/vtest-640x480.$ext" \
        -vf "format=rgb24,crop=256:192:192:144,select='eq(n\,0)+eq(n\,7)'" -fps_mode passthrough \
        -start_number 0 "$OUT/camera-$ext-%d.png"
    mv "$OUT/camera-$ext-1.png" "$OUT/camera-$ext-frame7.png"
    mv "$OUT/camera-$ext-0.png" "$OUT/camera-$ext-frame0.png"
done
ffmpeg -version | head -1 > "$OUT/camera-ffmpeg-version.txt"
ls -la "$OUT"/camera-*
