"""Prefix first: waiting requests whose prompt has the longest cached prefix go first.

The longest-prefix-match order SGLang's scheduler uses: a request whose leading blocks are in
the prefix cache now skips that much prefill, and admitting it before the blocks are evicted
keeps the hit. Ties keep arrival order. Only a KV strategy with a prefix cache reports
cached tokens (paged KV with `prefix_caching`); elsewhere this is first come, first served.
Looking every waiting request up costs time per step, so beyond `LOOKUP_LIMIT` waiting
requests the order falls back to arrival, as SGLang does.
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

LOOKUP_LIMIT = 128


class PrefixFirst(AdmissionPolicy):
    def order(self, waiting: Sequence[Request], kv: KVManager) -> list[Request]:
        if len(waiting) > LOOKUP_LIMIT:
            return list(waiting)
        cached = {id(r): kv.cached_prefix_tokens(r) for r in waiting}
        return sorted(waiting, key=lambda request: -cached[id(request)])


PREFIX_FIRST: PolicyOption = Option(
    name="prefix_first",
    summary="longest cached prompt prefix first (SGLang's longest prefix match)",
    config=NoConfig,
    build=lambda config: PrefixFirst(),
)
