#!/usr/bin/env bash
# Build llama.cpp's static libraries, our probe program and llama.cpp's llama-quantize, llama-bench and llama-simple,
# cached under ~/.cache per llama.cpp version.
#
#   tools/llamacpp/build.sh                   builds what is missing; prints the path of the llamacpp-probe binary last
#   tools/llamacpp/build.sh --where           only prints where that binary is (or would be), builds nothing
#   tools/llamacpp/build.sh --where-quantize  the same for the llama-quantize binary
#   tools/llamacpp/build.sh --where-bench     the same for llama-bench
#   tools/llamacpp/build.sh --where-simple    the same for llama-simple
#   tools/llamacpp/build.sh --where-converter the path of llama.cpp's convert_hf_to_gguf.py in the unpacked sources
#
# The llama.cpp sources come from the llama-cpp-python sdist, which vendors a pinned llama.cpp. The build folder
# is kept per version, so a repeated CI run on the same machine compiles nothing and a changed probe.cpp
# recompiles only itself; the binaries are stored under a hash of our sources.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
HERE="$(cd "$(dirname "$0")" && pwd)"
KEY="$(cat "$HERE/CMakeLists.txt" "$HERE/probe.cpp" | sha256sum | cut -c1-12)"
ROOT="${GQA_LLAMACPP_CACHE:-$HOME/.cache/gqa-gpt/llamacpp}"
BUILD="$ROOT/build-$VERSION-$(uname -m)"
PROBE="$ROOT/bin-$VERSION-$(uname -m)-$KEY/llamacpp-probe"
QUANTIZE="$(dirname "$PROBE")/llama-quantize"
BENCH="$(dirname "$PROBE")/llama-bench"
SIMPLE="$(dirname "$PROBE")/llama-simple"
case "${1:-}" in
    --where) echo "$PROBE"; exit 0 ;;
    --where-quantize) echo "$QUANTIZE"; exit 0 ;;
    --where-bench) echo "$BENCH"; exit 0 ;;
    --where-simple) echo "$SIMPLE"; exit 0 ;;
    --where-converter) echo "$ROOT/src-$VERSION/vendor/llama.cpp/convert_hf_to_gguf.py"; exit 0 ;;
    "") ;;
    *) echo "usage: $0 [--where | --where-quantize | --where-bench | --where-simple | --where-converter]" >&2; exit 2 ;;
esac
if [[ -x "$PROBE" && -x "$QUANTIZE" && -x "$BENCH" && -x "$SIMPLE" ]]; then
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
# CMake refuses a build folder configured from another checkout of this repository (a worktree, a moved clone):
# its cache is dropped and configured afresh, and the compiled llama.cpp objects, whose sources and flags are the
# same, stay up to date.
if [[ -f "$BUILD/CMakeCache.txt" ]] && ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$HERE" "$BUILD/CMakeCache.txt"; then
    rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
fi
# Native code for this CPU: the cache is per machine, and the benchmark compares against llama.cpp at its best.
cmake -S "$HERE" -B "$BUILD" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CPP_DIR="$SRC/vendor/llama.cpp" > "$LOG" 2>&1 || { tail -20 "$LOG" >&2; exit 1; }
cmake --build "$BUILD" --target llamacpp-probe llama-quantize llama-bench llama-simple -j "${GQA_LLAMACPP_JOBS:-2}" >> "$LOG" 2>&1 \
    || { tail -20 "$LOG" >&2; exit 1; }
mkdir -p "$(dirname "$PROBE")"
# Copied under a temporary name and renamed, so a reader never finds half a binary.
for binary in "$BUILD/llamacpp-probe" "$BUILD/llama-quantize" "$BUILD/llama-bench" "$BUILD/llama-simple"; do
    target="$(dirname "$PROBE")/$(basename "$binary")"
    cp "$binary" "$target.partial"
    mv "$target.partial" "$target"
done
echo "$PROBE"
