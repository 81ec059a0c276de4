"""One request alone to a running llama-server: its own per-token decode and prefill timings.

Start the server first (scripts/peers/llama_server.sh serve PORT), then, with any Python 3:

    python3 scripts/peers/llama_single.py --port PORT [--prompt-tokens 231] [--max-tokens 256]

The prompt is real English prose (the start of a section of Python's bundled `pydoc_data`
topics, the text servelab draws its prompts from), tokenized by the server and cut to exactly
--prompt-tokens tokens, then sent as token ids with greedy sampling, EOS ignored and the prompt
cache off. The figures are the server's own `timings` from the response
(`predicted_per_token_ms` is the decode time per output token); the wall time of the request
is measured here as well. --repeats N sends N such requests one after another and reports the
median; --quiet-wait S holds each until the machine has been idle for a moment (up to S
seconds), and each records the CPU seconds other processes (the server aside) used meanwhile:
requests where they used over 5% of one core are marked unclean and left out of the median when
clean ones exist. Prints one JSON object and writes it to --out when given. Standard library
only (plus hostload.py beside it); talks to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from hostload import ForeignCpu, add_quiet_arguments, pids_running, quiet_wait

CLEAN_SHARE = 0.05  # a request is clean if other processes used under 5% of one core meanwhile
TOPIC = "sequence-types"


def post(port: int, path: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as response:
        return json.loads(response.read())


def prompt_ids(port: int, tokens: int) -> list[int]:
    from pydoc_data.topics import topics

    text = topics[TOPIC]
    ids = post(port, "/tokenize", {"content": text, "add_special": False}, 60)["tokens"]
    if len(ids) < tokens:
        raise ValueError(f"topic {TOPIC!r} has only {len(ids)} tokens; ask for fewer")
    return ids[:tokens]


def fail(message: str) -> int:
    print(f"llama_single: error: {message}", file=sys.stderr)
    return 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--prompt-tokens", type=int, default=231)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--repeats", type=int, default=1, help="requests, one at a time")
    add_quiet_arguments(parser, "each request")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    if args.repeats < 1:
        return fail("--repeats must be at least 1")

    server = pids_running("llama-server")  # its CPU time is the measurement, not interference
    runs = []
    try:
        ids = prompt_ids(args.port, args.prompt_tokens)
        body = {
            "prompt": ids,
            "n_predict": args.max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "cache_prompt": False,
            "stream": False,
        }
        for _ in range(args.repeats):
            waited_s = quiet_wait(args, "llama_single")
            others = ForeignCpu(also_ours=server)
            load_before = os.getloadavg()
            others.start()
            start = time.perf_counter()
            response = post(args.port, "/completion", body, args.timeout)
            wall_s = time.perf_counter() - start
            foreign_s = others.stop()
            timings = response.get("timings", {})
            runs.append(
                {
                    "tokens_predicted": response.get("tokens_predicted"),
                    "wall_s": round(wall_s, 3),
                    "predicted_per_token_ms": timings.get("predicted_per_token_ms"),
                    "prompt_per_second": timings.get("prompt_per_second"),
                    "waited_for_idle_s": round(waited_s, 1),
                    "foreign_cpu_s": round(foreign_s, 2),
                    "clean": foreign_s <= CLEAN_SHARE * wall_s,
                    "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg(),
                    "timings": timings,
                }
            )
        props = get(args.port, "/props")
    except urllib.error.HTTPError as error:
        if error.code == 503:
            return fail("llama-server is still loading the model (HTTP 503); retry in a moment")
        return fail(f"llama-server answered HTTP {error.code}: {error.read()[:200]!r}")
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        return fail(f"no answer from 127.0.0.1:{args.port} ({error}); is llama-server running?")
    except (ValueError, KeyError) as error:
        return fail(str(error))

    counted = [run for run in runs if run["clean"]] or runs
    median = sorted(counted, key=lambda run: run["predicted_per_token_ms"])[len(counted) // 2]
    result = {
        "engine": "llama.cpp llama-server",
        "server_build": props.get("build_info"),
        "model": props.get("model_path"),
        "total_slots": props.get("total_slots"),
        "prompt_source": f"pydoc_data.topics[{TOPIC!r}] of Python {platform.python_version()}",
        "prompt_tokens": len(ids),
        "max_tokens": args.max_tokens,
        "repeats": len(runs),
        "clean_repeats": sum(run["clean"] for run in runs),
        "predicted_per_token_ms": median["predicted_per_token_ms"],
        "prompt_per_second": median["prompt_per_second"],
        "wall_s": median["wall_s"],
        "runs": runs,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    each = ", ".join(
        f"{run['predicted_per_token_ms']:.2f}{'' if run['clean'] else ' (unclean)'}" for run in runs
    )
    print(
        f"llama_single: {len(ids)}-token prompt, {median['tokens_predicted']} tokens out: "
        f"{result['predicted_per_token_ms']:.2f} ms/token decode (median of {len(counted)}; "
        f"all: {each}), prefill {result['prompt_per_second']:.0f} tok/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
