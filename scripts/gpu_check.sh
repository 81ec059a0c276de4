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
# Steps (below): end-to-end runs of vllm, vllm-awq (random int4 weights), orca and
# fastertransformer on dummy-llama3-8b with NVML telemetry, vllm where KV memory decides the
# batch (up to 256 sequences), a profile window, the kernel tests with the Triton kernels
# compiled, kernel timings (CUDA events around loops of calls), the calibrated peaks, this
# device's step profile (what `servelab plan` loads for its preset), and `servelab serve`,
# then the main job (`make run`'s `servelab search`, its overrides as
# RECIPE/comparison.args or `make comparison-args` gives them) on the embedded model's shape
# with random weights, within a budget of a minute.
# --cpu runs the same steps on the CPU (Triton interpreted, dummy-tiny, fewer requests and
# kernel tests), so the script is tested where there is no GPU (tests/scripts/test_gpu_check.py) and
# does not rot.
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

# Steps in the order of what they tell: the machine, four strategies end to end, vllm with
# its batch bounded by KV memory, a profile window over decode steps, the kernel tests, the
# kernel timings, the calibrated peaks (measured by the first run), the step profile of this
# device for the planner, `servelab serve` measured
# through backend=openai, and the main job. Each limit is 1.1-2 times the step's time on an
# H200 where it ran there (docs/gpu.md), the search's its budget and 20 s to start; their sum
# is 9 minutes; --cpu scales them by SLOW. Everything is written under OUT; summary.md opens
# with the verdict.
if [[ $MODE == cuda ]]; then
  unset TRITON_INTERPRET
  DEVICE=cuda MODEL=dummy-llama3-8b REQUESTS=64 RATE=16 DTYPE=bf16 KV_BUDGET=0.8 SLOW=1
  MEMORY=(engine.kv_budget=4GiB engine.max_batch_size=256 engine.max_num_batched_tokens=8192
    workload.num_requests=256 workload.length_scale=0.5 workload.arrival.rate=32)
  PROFILE=(workload.num_requests=32 profile.first_step=12 profile.num_steps=4)
  KERNEL_TESTS=(-n 8 tests/kernels/test_kernels_paged_attention.py tests/kernels/test_attention_entry.py
    tests/kernels/test_int4_kernels.py tests/models/test_gpu_layers.py tests/engine/test_cuda_graphs.py)
  ATTENTION=(--dtype bf16 --batches 32 64 --contexts 512 2048 --q-heads 32 --kv-heads 8
    --head-dim 128)  # llama3-8b's layout
  INT4=(--device cuda --dtypes bf16 --shape llama3-8b --layers 4 --batches 1 16 64)
  SEARCH_MODEL=dummy-smollm2-135m SEARCH_BUDGET=40
  GRID=()  # profile-steps' default grid
else  # the same steps, small: the kernel tests' cases run in the test suite already
  export TRITON_INTERPRET=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  DEVICE=cpu MODEL=dummy-tiny REQUESTS=8 RATE=40 DTYPE=fp32 KV_BUDGET=16MiB SLOW=3
  MEMORY=(engine.kv_budget=256KiB engine.max_batch_size=16 engine.max_num_batched_tokens=256
    workload.num_requests=16 workload.length_scale=0.25 workload.arrival.rate=40)
  PROFILE=(workload.num_requests=8 profile.first_step=6 profile.num_steps=3)
  KERNEL_TESTS=(tests/kernels/test_attention_entry.py -k "triton and decode")
  ATTENTION=(--device cpu --dtype fp32 --batches 2 --contexts 64 --iters 2)
  INT4=(--device cpu --dtypes fp32 --batches 1 --layers 1 --iters 2)
  SEARCH_MODEL=dummy-tiny SEARCH_BUDGET=10
  GRID=(prefill_tokens=8,16,32 prefill_cached=0,32 decode_rows=1,2,4 decode_context=16,64
    subsets=1 repeats=1)
fi
# the model and engine every run and the server share; the check's own cache (peaks measured
# afresh on this machine, nothing downloaded where the recipe brings the tokenizer)
MODEL_ON=("model=$MODEL" "${TOKENIZER[@]}" "engine.device=$DEVICE" "engine.dtype=$DTYPE"
  "engine.cache_dir=$OUT/cache")
ENGINE=("${MODEL_ON[@]}" "engine.kv_budget=$KV_BUDGET")
WORKLOAD=(workload=sharegpt_like workload.length_scale=0.25)

step() {  # step NAME LIMIT_S COMMAND...: run it, keep its log, record its status and time
  local name=$1 limit=$(($2 * SLOW))
  shift 2
  echo "== $name =="
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$OUT/steps.tsv"
  tail -n 15 "$OUT/$name.log"
  echo "-- $name: exit $rc in $((SECONDS - start)) s"
}

step machine 10 "$PYTHON" -m scripts.gpu_check_machine "$DEVICE"
for strategy in vllm vllm-awq orca fastertransformer; do
  step "run-$strategy-$RATE" 35 "${SERVELAB[@]}" "strategy=$strategy" "${ENGINE[@]}" \
    "${WORKLOAD[@]}" "workload.num_requests=$REQUESTS" "workload.arrival.rate=$RATE" \
    "hydra.run.dir=$OUT/runs/$strategy-$RATE"
done
step run-vllm-memory 50 "${SERVELAB[@]}" strategy=vllm "${MODEL_ON[@]}" workload=sharegpt_like \
  "${MEMORY[@]}" "hydra.run.dir=$OUT/runs/vllm-memory"
step profile-vllm 35 "${SERVELAB[@]}" strategy=vllm "${ENGINE[@]}" "${WORKLOAD[@]}" \
  workload.arrival.rate=1000 profile.enabled=true "${PROFILE[@]}" \
  "hydra.run.dir=$OUT/profile-vllm"
step kernel-tests 85 "$PYTHON" -m pytest -q -p no:cacheprovider \
  --junitxml="$OUT/kernel-tests.xml" "${KERNEL_TESTS[@]}"
step bench-attention 20 "$PYTHON" -m benchmarks.bench_attention "${ATTENTION[@]}"
step bench-int4 20 "$PYTHON" -m benchmarks.bench_int4 "${INT4[@]}" --cache-dir "$OUT/cache"
step "calibrate-$DTYPE" 15 "${SERVELAB[@]}" calibrate "engine.device=$DEVICE" \
  "engine.dtype=$DTYPE" "engine.cache_dir=$OUT/cache"
# this device's step profile, which `servelab plan` loads for its preset (plan.profiles)
step step-profile 40 "${SERVELAB[@]}" profile-steps "out=$OUT/step-profile.json" "${GRID[@]}" \
  "${MODEL_ON[@]}"
step serve-openai 45 "$PYTHON" -m scripts.gpu_check_serve "$OUT/runs/serve-openai" "$((40 * SLOW))" \
  -- strategy=vllm "${ENGINE[@]}" \
  -- "${ENGINE[@]}" "${WORKLOAD[@]}" workload.num_requests=16 "workload.arrival.rate=$RATE"
# the main job as `make run` runs it, but for its model, the device and a budget of a minute
if [[ -f $RECIPE/comparison.args ]]; then read -ra COMPARISON < "$RECIPE/comparison.args"
else read -ra COMPARISON <<< "$(make -s --no-print-directory comparison-args)"; fi
step search 60 "${SERVELAB[@]}" search "${COMPARISON[@]}" \
  "model=$SEARCH_MODEL" "${TOKENIZER[@]}" "engine.device=$DEVICE" "engine.cache_dir=$OUT/cache" \
  "search.budget_s=$SEARCH_BUDGET" "search.out_dir=$OUT/search"
"$PYTHON" -m scripts.gpu_check_summary "$OUT" > "$OUT/summary.md"
status=$?
cat "$OUT/summary.md"
exit $status
