#!/usr/bin/env bash
# The measurements quoted in the issue notes, run one after another on one machine (strategy
# comparisons are ratios within this one run of the script). Writes under runs/measure/.
# Usage: scripts/measure.sh [section ...]
#   sections: offline batch roofline prefix heads search verify awq peers speculative
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
    search)  # highest rate each KV strategy sustains under p50 normalized latency <= 0.1 s
      $S search "search.strategies=[fastertransformer,orca,vllm]" workload=comparison \
        engine.kv_budget=32MiB slo.normalized_latency_s=0.1 search.low=0.5 search.high=12 \
        search.iterations=3 search.out_dir=$OUT/search
      # a tighter SLO that tells the iteration strategies apart: p99 TTFT <= 2 s
      $S search "search.strategies=[fastertransformer,orca,vllm]" workload=comparison \
        engine.kv_budget=32MiB slo.ttft_s=2 search.low=0.5 search.high=12 \
        search.iterations=3 search.out_dir=$OUT/search-ttft ;;
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
    speculative)  # per proposer and gamma, at batch 1 and 8, on input-grounded prompts:
      # acceptance rate, tokens per target forward, the acceptance histogram and the speedup
      # predicted from alpha and c (each run's report; sweep reports give throughput x against
      # plain vllm, which a shared machine's drifting load blurs); then the same comparison
      # paired round by round, which keeps the ratio through such drift
      spec="workload=instruct workload.num_requests=16 engine.kv_budget=128MiB"
      for batch in 1 8; do
        dir=$OUT/speculative-b$batch
        $S -m strategy=vllm $spec engine.max_batch_size=$batch hydra.sweep.dir=$dir/standard
        $S -m strategy=vllm-spec-ngram strategy.gamma=2,4,8 $spec engine.max_batch_size=$batch \
          hydra.sweep.dir=$dir/ngram
        $S -m strategy=vllm-spec-layerskip strategy.layerskip_layers=8,24 strategy.gamma=2 $spec \
          engine.max_batch_size=$batch hydra.sweep.dir=$dir/layerskip
        $S -m strategy=vllm-spec-draft strategy.draft_weights=int4-awq strategy.gamma=2,4 $spec \
          engine.max_batch_size=$batch hydra.sweep.dir=$dir/draft
        $S report $dir/standard $dir/ngram $dir/layerskip $dir/draft --baseline vllm
        $PY -m benchmarks.bench_speculative --batch $batch --variants \
          "strategy=vllm-spec-ngram strategy.gamma=2" "strategy=vllm-spec-ngram strategy.gamma=4" \
          "strategy=vllm-spec-ngram strategy.gamma=8" \
          "strategy=vllm-spec-ngram strategy.gamma=8 strategy.gamma_rule=adaptive" \
          "strategy=vllm-spec-layerskip strategy.gamma=2" \
          "strategy=vllm-spec-draft strategy.draft_weights=int4-awq strategy.gamma=2" \
          -- workload=instruct workload.num_requests=$((batch == 1 ? 8 : 32)) \
          engine.kv_budget=128MiB | tee $dir/paired.txt
      done
      # the claims: at least 1.5x at batch 1 (interleaved repeats, bootstrap interval), exact
      $S gate conf/gates/speculative.yaml out=$OUT/speculative-gate
      $S verify strategies=orca-spec-ngram,vllm-spec-ngram,vllm-spec-layerskip,vllm-spec-draft \
        workload=instruct workload.num_requests=16 engine.dtype=fp32 \
        out=$OUT/verify-spec-fp32.json ;;
    *) echo "unknown section $section" >&2; exit 2 ;;
  esac
done
