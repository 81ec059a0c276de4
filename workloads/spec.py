"""The workload contract: the requests that arrive, fully described, as frozen values.

`build_workload` produces a `Workload`; the replay sends each `RequestSpec` at its
`arrival` time (or, in a closed loop, whenever one of `concurrency` users is free), and
the run directory records `Workload.hash` so that two runs can be checked to have served
the same load.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestSpec:
    """One request: what to send, when, and how to sample its answer."""

    id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    arrival: float  # scheduled send time, seconds from the run start (0 for offline/closed loop)
    excluded: bool = False  # warm-up / cool-down: still run and recorded, left out of metrics
    prompt_text: str | None = None
    ignore_eos: bool = False
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None  # per-request sampling seed (derived from the workload seed)
    n: int = 1  # samples of this prompt (parallel sampling), each its own output


@dataclass(frozen=True)
class Workload:
    """A named, hashed, arrival-ordered list of requests."""

    name: str
    requests: tuple[RequestSpec, ...]  # sorted by arrival
    hash: str  # sha256 hex of a canonical encoding of the requests (+ concurrency)
    concurrency: int | None = None  # closed loop: N users; the next is sent when one finishes
    think_s: float = 0.0  # closed loop: a user's pause between a response and its next request
