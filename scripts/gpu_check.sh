#!/usr/bin/env bash
# GPU checks for the Triton kernels, for a machine with CUDA: the attention kernel and
# entry-point tests and the int4 GEMM test with the kernels compiled (no interpreter;
# bfloat16 included for attention), then the decode attention benchmark (Triton against the
# PyTorch path, batch 32/64 x context 512/2048, CUDA events) and the int4 linear-layer
# benchmark (dense fp16 against the int4 Triton GEMM, batch 1 and 32).
# Run from anywhere; PYTHON picks the interpreter (default: the repo's .venv, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-}
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: $PYTHON sees no CUDA device; run this on a GPU machine" >&2
  exit 1
fi

unset TRITON_INTERPRET
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

echo "== kernel tests (compiled Triton) =="
"$PYTHON" -m pytest -q -p no:cacheprovider --noconftest \
  tests/test_kernels_paged_attention.py tests/test_attention_entry.py
"$PYTHON" -m pytest -q -p no:cacheprovider --noconftest tests/test_int4_kernels.py -k triton

echo "== decode benchmark =="
"$PYTHON" -m benchmarks.bench_attention --dtype bf16 --batches 32 64 --contexts 512 2048
"$PYTHON" -m benchmarks.bench_attention --dtype bf16 --batches 32 64 --contexts 512 2048 --contiguous

echo "== int4 linear layers =="
"$PYTHON" -m benchmarks.bench_int4 --device cuda --dtypes fp16 --batches 1 32
