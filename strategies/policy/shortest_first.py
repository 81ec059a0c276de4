"""Shortest first: waiting requests with the fewest prompt + max_tokens tokens go first.

The classic shortest-job-first trade: short requests stop queueing behind long ones, which
lowers the median latency, while long requests wait longer, which raises the tail. Ties keep
arrival order. The job size is what the server knows up front (prompt length and the output
limit), not the output length it cannot know.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from servelab.engine.kv_manager import KVManager
from servelab.engine.request import Request
from servelab.engine.scheduling import AdmissionPolicy
from servelab.strategies.registry import NoConfig, Option

if TYPE_CHECKING:
    from servelab.strategies.factories import PolicyOption


class ShortestFirst(AdmissionPolicy):
    def order(self, waiting: Sequence[Request], kv: KVManager) -> list[Request]:
        return sorted(waiting, key=lambda request: request.max_total_tokens)


SHORTEST_FIRST: PolicyOption = Option(
    name="shortest_first",
    summary="fewest prompt + max_tokens first (median down, tail up)",
    config=NoConfig,
    build=lambda config: ShortestFirst(),
)
