#!/usr/bin/env bash
# The GPU check, in one go, on a GPU machine as it comes: its own Python, torch and Triton, no
# package registry. What the project needs beyond them travels in .gpu-wheels/ (`make
# gpu-wheels`; docs/gpu.md): wheels unpacked into OUT/site for the Python they were built for,
# beside a wheel of this tree built there unless servelab is installed already
# (scripts/gpu_recipe.sh), and the tokenizer the dummy shapes borrow. Every step runs whatever
# the one before did, its output in OUT/STEP.log; OUT/summary.md says what passed, what failed
# and the figures.
#
#   scripts/gpu_check.sh [--cpu] [OUT]      (OUT: runs/gpu-check)
#
# Steps: the machine; the kernel tests with the Triton kernels compiled (their differences
# asserted); decode-attention and int4 linear timings (CUDA events around loops of calls);
# `servelab calibrate`; end-to-end runs of vllm, orca and fastertransformer on
# dummy-llama3-8b at two loads, with NVML telemetry. --cpu runs the same steps on the CPU
# (Triton interpreted, dummy-tiny, one load, fewer requests and kernel tests), so the script
# is tested where there is no GPU (tests/test_gpu_check.py) and does not rot.
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=cuda
if [[ ${1:-} == --cpu ]]; then MODE=cpu; shift; fi
OUT=${1:-runs/gpu-check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: > "$OUT/steps.tsv"

PYTHON=${PYTHON:-}
if [[ -z "$PYTHON" ]]; then
  if [[ $MODE == cpu && -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
source scripts/gpu_recipe.sh  # PYTHONPATH for the recipe and servelab, TOKENIZER
export PYTHONUNBUFFERED=1
SERVELAB=("$PYTHON" -m servelab)

if [[ $MODE == cuda ]]; then
  unset TRITON_INTERPRET
  DEVICE=cuda MODEL=dummy-llama3-8b REQUESTS=64 RATES=(4 16) DTYPES=(bf16 fp16)
  KV_BUDGET=0.8  # of the memory left after the weights: calibration must run before it
  KERNEL_TESTS=(tests/test_kernels_paged_attention.py tests/test_attention_entry.py
    tests/test_int4_kernels.py)
  ATTENTION=(--dtype bf16 --batches 32 64 --contexts 512 2048)
  INT4=(--device cuda --dtypes bf16 fp16 --batches 1 32)
  REFRESH=(--refresh)
else  # the same steps, small: the kernel tests' Triton cases run in the test suite already
  export TRITON_INTERPRET=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  DEVICE=cpu MODEL=dummy-tiny REQUESTS=8 RATES=(40) DTYPES=(fp32) KV_BUDGET=16MiB
  KERNEL_TESTS=(tests/test_attention_entry.py)
  ATTENTION=(--device cpu --dtype fp32 --batches 2 --contexts 64 --iters 2)
  INT4=(--device cpu --dtypes fp32 --batches 1 --layers 1 --iters 2)
  REFRESH=()
fi

step() {  # step NAME LIMIT_S COMMAND...: run it, keep its log, record its status and time
  local name=$1 limit=$2
  shift 2
  echo "== $name =="
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$OUT/steps.tsv"
  tail -n 15 "$OUT/$name.log"
  echo "-- $name: exit $rc in $((SECONDS - start)) s"
}

step machine 60 "$PYTHON" -m scripts.gpu_check_machine "$DEVICE"
step kernel-tests 240 "$PYTHON" -m pytest -q -p no:cacheprovider \
  --junitxml="$OUT/kernel-tests.xml" "${KERNEL_TESTS[@]}"
step bench-attention 60 "$PYTHON" -m benchmarks.bench_attention "${ATTENTION[@]}"
step bench-int4 60 "$PYTHON" -m benchmarks.bench_int4 "${INT4[@]}"
for dtype in "${DTYPES[@]}"; do
  step "calibrate-$dtype" 60 "${SERVELAB[@]}" calibrate "${REFRESH[@]}" "engine.device=$DEVICE" \
    "engine.dtype=$dtype"
done
for strategy in vllm orca fastertransformer; do
  for rate in "${RATES[@]}"; do
    step "run-$strategy-$rate" 120 "${SERVELAB[@]}" "strategy=$strategy" "model=$MODEL" \
      "${TOKENIZER[@]}" \
      "engine.device=$DEVICE" "engine.kv_budget=$KV_BUDGET" workload=sharegpt_like \
      workload.length_scale=0.25 \
      "workload.num_requests=$REQUESTS" "workload.arrival.rate=$rate" \
      "hydra.run.dir=$OUT/runs/$strategy-$rate"
  done
done
"$PYTHON" -m scripts.gpu_check_summary "$OUT" | tee "$OUT/summary.md"
