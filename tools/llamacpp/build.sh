#!/usr/bin/env bash
# Build llama.cpp's static libraries and our probe program once per llama.cpp version, cached under ~/.cache.
#
#   tools/llamacpp/build.sh          prints the path of the built llamacpp-probe binary on its last line
#
# The llama.cpp sources come from the llama-cpp-python sdist, which vendors a pinned llama.cpp. The cache key
# is that version plus a hash of our probe sources, so a repeated CI run on the same machine builds nothing.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
HERE="$(cd "$(dirname "$0")" && pwd)"
KEY="$(cat "$HERE/CMakeLists.txt" "$HERE/probe.cpp" | sha256sum | cut -c1-12)"
ROOT="${GQA_LLAMACPP_CACHE:-$HOME/.cache/gqa-gpt/llamacpp}"
BUILD="$ROOT/build-$VERSION-$(uname -m)-$KEY"
PROBE="$BUILD/llamacpp-probe"
if [[ -x "$PROBE" ]]; then
    echo "$PROBE"
    exit 0
fi
SDIST="$ROOT/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
    mkdir -p "$ROOT"
    python -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation "llama-cpp-python==$VERSION" \
        -d "$ROOT"
fi
SRC="$ROOT/src-$VERSION"
if [[ ! -f "$SRC/vendor/llama.cpp/include/llama.h" ]]; then
    rm -rf "$SRC" "$SRC.partial"
    mkdir -p "$SRC.partial"
    tar -xzf "$SDIST" -C "$SRC.partial" --strip-components=1
    mv "$SRC.partial" "$SRC"
fi
JOBS="${GQA_LLAMACPP_JOBS:-2}"
# Native code for this CPU: the cache is per machine, and the benchmark compares against llama.cpp at its best.
cmake -S "$HERE" -B "$BUILD.partial" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CPP_DIR="$SRC/vendor/llama.cpp" > "$ROOT/cmake-$VERSION.log"
cmake --build "$BUILD.partial" --target llamacpp-probe -j "$JOBS" >> "$ROOT/cmake-$VERSION.log"
mkdir -p "$BUILD"
cp "$BUILD.partial/llamacpp-probe" "$PROBE.partial"
mv "$PROBE.partial" "$PROBE"
rm -rf "$BUILD.partial"
echo "$PROBE"
