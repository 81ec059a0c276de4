"""Dump a servelab workload as JSONL token ids, so peer servers are fed identical prompts.

Run with servelab's python from the repository root:

    python scripts/peers/dump_workload.py [--out FILE] [OVERRIDE ...]

Overrides are servelab's Hydra overrides (default `workload=offline`, the throughput yardstick:
64 real-text prompts of 32-256 tokens, 64 output tokens each). Each line is one request in
arrival order: `id`, `prompt_ids`, `max_tokens`, `ignore_eos`, `temperature`. The workload hash
printed at the end is the one servelab records in a run's meta.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_OUT = Path("/work/peers/workload-offline.jsonl")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    parser.add_argument("overrides", nargs="*", default=["workload=offline"])
    args = parser.parse_args()

    from servelab.base.errors import ConfigError
    from servelab.harness.run.compose import compose
    from servelab.harness.run.settings import model_of
    from servelab.models.load import model_config_of, tokenizer_for
    from servelab.workloads.build import build_workload

    try:
        cfg = compose(args.overrides)
        tokenizer = tokenizer_for(model_of(cfg))
        max_context = model_config_of(model_of(cfg)).max_context
        workload = build_workload(cfg.workload, tokenizer, max_context)
    except ConfigError as error:
        print(f"dump_workload: error: {error}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as out:
        for request in workload.requests:
            line = {
                "id": request.id,
                "prompt_ids": list(request.prompt_ids),
                "max_tokens": request.max_tokens,
                "ignore_eos": request.ignore_eos,
                "temperature": request.temperature,
            }
            out.write(json.dumps(line) + "\n")
    lengths = [len(r.prompt_ids) for r in workload.requests]
    print(
        f"dump_workload: {workload.name}: {len(lengths)} requests, prompts "
        f"{min(lengths)}-{max(lengths)} tokens ({sum(lengths)} in all), "
        f"hash {workload.hash} -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
