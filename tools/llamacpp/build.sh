#!/usr/bin/env bash
# Build llama.cpp's static libraries and our probe program, cached under ~/.cache per llama.cpp version.
#
#   tools/llamacpp/build.sh          builds what is missing; prints the path of the llamacpp-probe binary last
#   tools/llamacpp/build.sh --where  only prints where that binary is (or would be), builds nothing
#
# The llama.cpp sources come from the llama-cpp-python sdist, which vendors a pinned llama.cpp. The build folder
# is kept per version, so a repeated CI run on the same machine compiles nothing and a changed probe.cpp
# recompiles only itself; each probe binary is stored under a hash of our sources.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
HERE="$(cd "$(dirname "$0")" && pwd)"
KEY="$(cat "$HERE/CMakeLists.txt" "$HERE/probe.cpp" | sha256sum | cut -c1-12)"
ROOT="${GQA_LLAMACPP_CACHE:-$HOME/.cache/gqa-gpt/llamacpp}"
BUILD="$ROOT/build-$VERSION-$(uname -m)"
PROBE="$ROOT/bin-$VERSION-$(uname -m)-$KEY/llamacpp-probe"
if [[ "${1:-}" == "--where" || -x "$PROBE" ]]; then
    echo "$PROBE"
    exit 0
fi
SDIST="$ROOT/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
    mkdir -p "$ROOT"
    # pip prepares the sdist's metadata in an isolated environment (a minute or more); done once per version.
    python -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$ROOT"
fi
SRC="$ROOT/src-$VERSION"
if [[ ! -f "$SRC/vendor/llama.cpp/include/llama.h" ]]; then
    rm -rf "$SRC" "$SRC.partial"
    mkdir -p "$SRC.partial"
    tar -xzf "$SDIST" -C "$SRC.partial" --strip-components=1
    mv "$SRC.partial" "$SRC"
fi
LOG="$ROOT/build-$VERSION.log"
echo "building llama.cpp $VERSION (llama-cpp-python sdist) into $BUILD; log: $LOG" >&2
# Native code for this CPU: the cache is per machine, and the benchmark compares against llama.cpp at its best.
cmake -S "$HERE" -B "$BUILD" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CPP_DIR="$SRC/vendor/llama.cpp" > "$LOG" 2>&1 || { tail -20 "$LOG" >&2; exit 1; }
cmake --build "$BUILD" --target llamacpp-probe -j "${GQA_LLAMACPP_JOBS:-2}" >> "$LOG" 2>&1 || { tail -20 "$LOG" >&2; exit 1; }
mkdir -p "$(dirname "$PROBE")"
cp "$BUILD/llamacpp-probe" "$PROBE.partial"
mv "$PROBE.partial" "$PROBE"
echo "$PROBE"
