"""Greedy output agreement between two runs of the same prompts, request by request.

Either side is a servelab run directory (its `requests.jsonl`, from any backend) or the JSON
that scripts/peers/vllm_offline.py writes (its `requests`). With any Python 3:

    python3 scripts/peers/agreement.py A B [--out FILE]

Requests are matched by id; a pair whose prompt lengths differ means the two did not serve
the same workload, and the script refuses. Prints one JSON object (written to --out when
given): requests compared, the share whose output ids are identical, the share of all
compared tokens that match up to each request's first difference, and the quartiles of the
position of that first difference among the requests that differ. Token ids a server did not
send (re-tokenised from text, as `output_ids_from` says in the record) are compared as they
are and counted in `retokenised`. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, dict[str, Any]]:
    """id -> record with `prompt_len`, `output_ids` and where the ids came from."""
    if path.is_dir():
        lines = (path / "requests.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
    else:
        records = json.loads(path.read_text())["requests"]
    return {str(r["id"]): r for r in records}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where the two differ (the shorter's length when one is a prefix of
    the other), None when identical."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> dict[str, Any]:
    common = sorted(set(a) & set(b), key=lambda k: (len(k), k))
    if not common:
        raise ValueError("the two runs share no request ids")
    for key in common:
        if a[key].get("prompt_len") != b[key].get("prompt_len"):
            raise ValueError(
                f"request {key}: prompt lengths {a[key].get('prompt_len')} and "
                f"{b[key].get('prompt_len')} differ; not the same workload"
            )
    firsts, agreed, total = [], 0, 0
    for key in common:
        ids_a, ids_b = a[key]["output_ids"], b[key]["output_ids"]
        first = first_difference(ids_a, ids_b)
        total += max(len(ids_a), len(ids_b))
        agreed += len(ids_a) if first is None else first
        if first is not None:
            firsts.append(first)
    retokenised = sum(
        r.get("output_ids_from") == "retokenised" for side in (a, b) for r in side.values()
    )
    result: dict[str, Any] = {
        "requests": len(common),
        "identical_share": round(1 - len(firsts) / len(common), 4),
        "tokens_before_first_difference_share": round(agreed / max(total, 1), 4),
        "retokenised": retokenised,
    }
    if len(firsts) >= 2:
        q1, q2, q3 = statistics.quantiles(firsts, n=4, method="inclusive")
        result["first_difference_quartiles"] = [q1, q2, q3]
    elif firsts:
        result["first_difference_quartiles"] = [firsts[0]] * 3
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="run directory or vllm_offline.py JSON")
    parser.add_argument("b", type=Path, help="run directory or vllm_offline.py JSON")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    try:
        result = {"a": str(args.a), "b": str(args.b), **compare(load(args.a), load(args.b))}
    except (OSError, ValueError, KeyError) as error:
        print(f"agreement: error: {error}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
