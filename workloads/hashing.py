"""The workload hash: sha256 of a canonical encoding of everything the replay sends.

Two workloads with the same hash send the same token ids, at the same scheduled times,
with the same limits and sampling settings. The name and the display text are left out:
renaming a preset does not change the load it describes.
"""

from __future__ import annotations

import hashlib
import json

from servelab.workloads.spec import RequestSpec


def _canonical(request: RequestSpec) -> list[object]:
    """The request's fields in a fixed order (`n` only when above 1, so hashes of workloads
    from before parallel sampling stay valid)."""
    fields: list[object] = [
        request.id,
        list(request.prompt_ids),
        request.max_tokens,
        request.arrival,
        request.excluded,
        request.ignore_eos,
        request.temperature,
        request.top_k,
        request.top_p,
        request.seed,
    ]
    return fields + [request.n] if request.n != 1 else fields


def workload_hash(
    requests: tuple[RequestSpec, ...], concurrency: int | None, think_s: float = 0.0
) -> str:
    """sha256 hex of the requests (in order) and the closed-loop concurrency and think time
    (the think time only when set, so hashes of earlier workloads stay valid)."""
    payload: dict = {"concurrency": concurrency, "requests": [_canonical(r) for r in requests]}
    if think_s:
        payload["think_s"] = think_s
    encoded = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()
