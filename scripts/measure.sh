#!/usr/bin/env bash
# The measurements quoted in the issue notes, run one after another on one machine (strategy
# comparisons are ratios within this one run of the script). Writes under runs/measure/.
# Usage: scripts/measure.sh [section ...]
#   sections: offline batch roofline prefix heads search verify awq peers speculative
#             cpu-speed fidelity policy parallel
set -euo pipefail
cd "$(dirname "$0")/.."
S=${SERVELAB:-.venv/bin/servelab}  # SERVELAB="python -m harness" runs from a checkout
PY=${PYTHON:-.venv/bin/python}
OUT=runs/measure
sections=("$@")
[ ${#sections[@]} -eq 0 ] &&
  sections=(offline batch roofline prefix heads search verify awq peers speculative)

for section in "${sections[@]}"; do
  case "$section" in
    cpu-speed)  # the speed yardstick side by side: servelab's vllm strategy (batch 64) and
      # vLLM's CPU build offline on the same 64 prompts (scripts/peers/ installs and exports it),
      # each in the best dtype this machine has (bf16 where the CPU multiplies it, else fp32),
      # servelab before and after vLLM so drift shows; then the step shapes against the floor.
      # A finished run directory is never run again, so an earlier sitting's runs go first.
      rm -rf $OUT/cpu-speed
      $S calibrate --refresh
      $PY scripts/peers/dump_workload.py
      vllm_dtype=$($PY -c "from servelab.kernels.capabilities import capabilities as c
print('bfloat16' if c().bf16_native else 'float32')")
      for turn in 1 2; do
        $S strategy=vllm workload=offline engine.dtype=auto engine.max_batch_size=64 \
          engine.kv_budget=1GiB hydra.run.dir=$OUT/cpu-speed/servelab-$turn
      done
      "${VLLM_VENV:-/work/peers/vllm-venv}/bin/python" scripts/peers/vllm_offline.py --repeats 3 \
        --dtype "$vllm_dtype" --out $OUT/cpu-speed/vllm.json
      $S strategy=vllm workload=offline engine.dtype=auto engine.max_batch_size=64 \
        engine.kv_budget=1GiB hydra.run.dir=$OUT/cpu-speed/servelab-3
      $PY -m benchmarks.bench_steps --repeats 3 | tee $OUT/cpu-speed/steps.txt ;;
    fidelity)  # what the measurement fixes moved, at one load (Poisson 2 req/s, 32 MiB): the code
      # before them (FIDELITY_BEFORE, default cfb4d7e, run from a git worktree) beside this code;
      # then static batching's switches added one by one, each run against the same orca run
      F=$PWD/$OUT/fidelity
      common=(workload=comparison workload.arrival.rate=2 engine.kv_budget=32MiB engine.dtype=bf16)
      before=$F/code-before
      [ -d "$before" ] || git worktree add --detach "$before" "${FIDELITY_BEFORE:-cfb4d7e}"
      for strategy in fastertransformer orca; do
        (cd "$before" && PYTHONPATH=. "$OLDPWD/$PY" -m harness strategy=$strategy "${common[@]}" \
          hydra.run.dir=$F/before-$strategy)
      done
      $S strategy=orca "${common[@]}" hydra.run.dir=$F/orca
      static=(strategy=fastertransformer "${common[@]}")
      $S "${static[@]}" strategy.return_at=own_finish strategy.pad_finished=false \
        strategy.pad_prompts=false hydra.run.dir=$F/ft-none
      $S "${static[@]}" strategy.pad_finished=false strategy.pad_prompts=false \
        hydra.run.dir=$F/ft-batch-end
      $S "${static[@]}" strategy.pad_prompts=false hydra.run.dir=$F/ft-pad-finished
      $S "${static[@]}" hydra.run.dir=$F/ft
      $PY -m scripts.fidelity_table "before the fixes=$F/before-fastertransformer,$F/before-orca,old" \
        "before the fixes, from arrival=$F/before-fastertransformer,$F/before-orca" \
        "this code, static switches off=$F/ft-none,$F/orca" \
        "this code, as FasterTransformer served=$F/ft,$F/orca" | tee $F/fidelity.md
      $PY -m scripts.ablation_table $F/orca "own finish, nothing padded=$F/ft-none" \
        "+ responses held to the batch end=$F/ft-batch-end" \
        "+ finished rows padded=$F/ft-pad-finished" \
        "+ prompts padded (fastertransformer)=$F/ft" | tee $F/ablation.md ;;
    parallel)  # parallel sampling (the vLLM paper's "more complex decoding"): n = 2, 4, 6 samples
      # of 8 real-text prompts, 32 sampled tokens each, in one 32 MiB budget of fp32 KV; orca
      # (contiguous: a slab per sample) against vllm (paged: the prompt's blocks shared)
      for n in 2 4 6; do
        for strategy in orca vllm; do
          $S strategy=$strategy workload=offline workload.num_requests=8 \
            workload.output_len.value=32 workload.sampling.n=$n workload.sampling.temperature=1 \
            engine.dtype=fp32 engine.kv_budget=32MiB hydra.run.dir=$OUT/parallel/$strategy-n$n
        done
      done
      $PY -m scripts.parallel_sampling_table $OUT/parallel | tee $OUT/parallel/table.md ;;
    policy)  # admission policies: on shared system prompts (prefix hits, TTFT, throughput) and on
      # the default comparison workload at 4 req/s (median against tail normalized latency)
      for policy in fcfs shortest_first prefix_first; do
        $S strategy=vllm strategy.policy=$policy workload=shared_prefix engine.kv_budget=64MiB \
          engine.dtype=bf16 hydra.run.dir=$OUT/policy/shared-prefix-$policy
        $S strategy=vllm strategy.policy=$policy workload=comparison workload.arrival.rate=4 \
          engine.kv_budget=32MiB engine.dtype=bf16 hydra.run.dir=$OUT/policy/comparison-$policy
      done
      for load in shared-prefix comparison; do
        $PY -m scripts.policy_table $OUT/policy/$load-{fcfs,shortest_first,prefix_first} |
          tee $OUT/policy/$load.md
      done ;;
    offline)  # throughput yardstick: 64 real-text prompts of 32-256 tokens, 64 outputs, bf16
      $S -m strategy=fastertransformer,orca,vllm workload=offline engine.dtype=bf16 \
        hydra.sweep.dir=$OUT/offline ;;
    batch)  # scheduler overhead per step at batch 32 and 64
      $S -m strategy=orca,vllm workload=offline engine.max_batch_size=32,64 \
        engine.kv_budget=512MiB hydra.sweep.dir=$OUT/batch ;;
    roofline)  # MFU / MBU at batch 1 and 32
      $S calibrate --refresh
      $S -m strategy=vllm workload=offline workload.num_requests=32 engine.max_batch_size=1,32 \
        hydra.sweep.dir=$OUT/roofline ;;
    prefix)  # shared system prompts: prefix caching on and off
      $S -m strategy=vllm,vllm-noprefix,orca workload=shared_prefix engine.kv_budget=64MiB \
        hydra.sweep.dir=$OUT/prefix ;;
    heads)  # one KV budget, three head layouts: capacity and throughput; then perplexity
      $S -m strategy=vllm strategy.heads=mha,gqa,mqa workload=offline engine.kv_budget=24MiB \
        engine.max_batch_size=64 hydra.sweep.dir=$OUT/heads
      for heads in gqa mha mqa; do $S perplexity strategy.heads=$heads engine.dtype=fp32; done ;;
    search)  # each KV strategy's knee under normalized latency <= 0.1 s per token, then under
      # a tighter SLO that tells the iteration strategies apart (TTFT <= 2 s as well)
      $S search "search.strategies=[fastertransformer,orca,vllm]" workload=comparison \
        engine.dtype=fp32 engine.kv_budget=32MiB slo.normalized_latency_s=0.1 \
        search.out_dir=$OUT/search
      $S search "search.strategies=[fastertransformer,orca,vllm]" workload=comparison \
        engine.dtype=fp32 engine.kv_budget=32MiB slo.normalized_latency_s=0.1 slo.ttft_s=2 \
        search.out_dir=$OUT/search-ttft ;;
    verify)  # lossless check of every strategy against static batching, fp32 and bf16
      for dtype in fp32 bf16; do
        $S verify workload=offline workload.num_requests=32 engine.dtype=$dtype \
          out=$OUT/verify-$dtype.json
      done ;;
    awq)  # int4 weights: quality in fp32 (held-out perplexity, greedy agreement with dense on
          # instructions), speed in bf16 (linears alone, decode steps, runs at batch 1 and 32)
      mkdir -p $OUT/awq
      rm -rf ~/.cache/servelab/quantized/*-int4-*  # remade here: calibration time and memory
      for method in "method=rtn" "method=awq" "method=rtn strategy.group_size=32"; do
        $S quantize $method workload=instruct workload.num_requests=16
      done | tee $OUT/awq/quality.txt
      .venv/bin/python -m benchmarks.bench_int4 | tee $OUT/awq/linears.txt
      .venv/bin/python -m benchmarks.bench_int4_decode | tee $OUT/awq/decode.txt
      $S -m strategy=vllm strategy.weights=dense,int4-rtn,int4-awq workload=offline \
        workload.num_requests=32 engine.dtype=bf16 engine.max_batch_size=1,32 \
        hydra.sweep.dir=$OUT/awq/sweep
      # one request alone, as scripts/peers/llama_single.py times llama-server on the GGUF
      $S -m strategy=orca strategy.weights=dense,int4-awq workload=offline \
        workload.num_requests=1 workload.input_len.dist=fixed workload.input_len.value=231 \
        workload.output_len.value=256 engine.dtype=bf16 hydra.sweep.dir=$OUT/awq/single ;;
    peers)  # one workload at the same loads through servelab's strategies in process and over
      # HTTP (its own server on a loopback port, measured as any OpenAI endpoint), vLLM CPU's
      # server, llama.cpp's server, and transformers (hf_static, hf_continuous); one report.
      # The recipe and its options: scripts/peers/sweep.sh
      SWEEP_DIR=$OUT/peers SERVELAB="$S" scripts/peers/sweep.sh ;;
    speculative)  # docs/speculative.md: per proposer and gamma, at batch 1 and 8, on
      # input-grounded prompts, in bf16, paired round by round against plain decoding (which
      # keeps the ratio through a shared machine's drifting load): acceptance rate, tokens
      # per target forward, measured and predicted speedup, where a decode step's time goes
      D=$OUT/speculative
      mkdir -p $D
      spec="workload=instruct engine.kv_budget=128MiB engine.dtype=bf16"
      $PY -m benchmarks.bench_speculative --batch 1 --variants \
        "strategy=vllm-spec-ngram strategy.gamma=2" "strategy=vllm-spec-ngram strategy.gamma=4" \
        "strategy=vllm-spec-ngram strategy.gamma=8" \
        "strategy=vllm-spec-ngram strategy.gamma=8 strategy.gamma_rule=adaptive" \
        -- $spec workload.num_requests=8 | tee $D/b1-ngram.txt
      $PY -m benchmarks.bench_speculative --batch 1 --variants \
        "strategy=vllm-spec-layerskip strategy.layerskip_layers=8 strategy.gamma=2" \
        "strategy=vllm-spec-layerskip strategy.layerskip_layers=16 strategy.gamma=2" \
        "strategy=vllm-spec-draft strategy.draft_weights=int4-awq strategy.gamma=2" \
        "strategy=vllm-spec-draft strategy.draft_weights=int4-awq strategy.gamma=4" \
        -- $spec workload.num_requests=3 | tee $D/b1-models.txt
      $PY -m benchmarks.bench_speculative --batch 8 --variants \
        "strategy=vllm-spec-ngram strategy.gamma=4" "strategy=vllm-spec-ngram strategy.gamma=8" \
        "strategy=vllm-spec-ngram strategy.gamma=8 strategy.gamma_rule=adaptive" \
        "strategy=vllm-spec-layerskip strategy.layerskip_layers=8 strategy.gamma=2" \
        "strategy=vllm-spec-draft strategy.draft_weights=int4-awq strategy.gamma=2" \
        -- $spec workload.num_requests=16 | tee $D/b8.txt
      # the claims: at least 1.5x at batch 1 (interleaved repeats, bootstrap interval), exact
      $S gate conf/gates/speculative.yaml out=$D/gate
      $S verify strategies=orca-spec-ngram,vllm-spec-ngram,vllm-spec-layerskip,vllm-spec-draft \
        workload=instruct workload.num_requests=16 engine.dtype=fp32 out=$D/verify-fp32.json ;;
    *) echo "unknown section $section" >&2; exit 2 ;;
  esac
done
