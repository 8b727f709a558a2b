#!/bin/sh
# Fetch the ONNX model-zoo graphs that the `onnx` wheel ships (ResNet-50, DenseNet-121, Inception
# v1 and v2, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512, AlexNet; "light" versions whose weights are
# ConstantOfShape nodes) for the ONNX reader's test (plan/tests/plan_onnx.rs), WITHOUT installing
# anything: `pip download --no-deps` puts one pinned wheel into a cache directory, its SHA-256 is
# checked, and only onnx/backend/test/data/light/*.onnx is unpacked from it (a wheel is a zip).
#
# Usage:
#   export USERDMA_ONNX_MODELS="$(scripts/onnx-models.sh | tail -n 1)"
#   cargo test --test plan_onnx -- --nocapture
#
# The last line on stdout is the directory holding the .onnx files, ready for
# USERDMA_ONNX_MODELS. Everything else goes to stderr. Running it again reuses the previous
# download and extraction. Needs python3 with pip (Debian: apt-get install python3-pip).
# Environment:
#   USERDMA_CACHE  cache root (default: $HOME/.cache/userdma)
set -eu

log() { printf 'onnx-models: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# One wheel, pinned by version, platform tags and hash: the graphs in it are the test's data, and
# they are the same in every platform's wheel, so the one picked does not depend on the machine.
version=1.23.2
wheel="onnx-$version-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
sha256=c03ecf6b835d136108eeaeeafbd0026fc7b3cf98661409fbc6b63d5a29361348
models="light_bvlc_alexnet light_densenet121 light_inception_v1 light_inception_v2 light_resnet50 light_shufflenet light_squeezenet light_vgg19 light_zfnet512"

cache_root="${USERDMA_CACHE:-${HOME:?HOME is not set; set USERDMA_CACHE}/.cache/userdma}"
base="$cache_root/onnx-wheel"
dest="$base/onnx-$version/light"

complete() {
    for m in $models; do
        [ -s "$dest/$m.onnx" ] || return 1
    done
}

if complete; then
    log "reusing $dest"
    printf '%s\n' "$dest"
    exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 not found (apt-get install python3 python3-pip)"
python3 -m pip --version >/dev/null 2>&1 || die "pip not found (apt-get install python3-pip)"

mkdir -p "$base"
if [ ! -f "$base/$wheel" ]; then
    log "downloading onnx==$version (no install)"
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux_2_27_x86_64 --python-version 3.11 --implementation cp --abi cp311 \
        -d "$base" "onnx==$version" >&2 || die "pip download onnx==$version failed (network or index?)"
fi
[ -f "$base/$wheel" ] || die "pip did not produce $base/$wheel"

got="$(sha256sum "$base/$wheel" | cut -d' ' -f1)"
if [ "$got" != "$sha256" ]; then
    rm -f "$base/$wheel"
    die "$wheel has SHA-256 $got, expected $sha256 (removed; run again)"
fi

log "extracting onnx/backend/test/data/light/*.onnx from $wheel"
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"
python3 - "$base/$wheel" "$dest.tmp" <<'EOF' || die "extracting from $wheel failed"
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
prefix = "onnx/backend/test/data/light/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and name.endswith(".onnx"):
            with open(os.path.join(out, os.path.basename(name)), "wb") as f:
                f.write(z.read(name))
EOF
rm -rf "$dest"
mv "$dest.tmp" "$dest"
complete || die "$wheel lacks some of: $models"
log "models ready in $dest"
printf '%s\n' "$dest"
