"""First come, first served: waiting requests are offered places in arrival order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from servelab.engine.kv_manager import KVManager
from servelab.engine.request import Request
from servelab.engine.scheduling import AdmissionPolicy
from servelab.strategies.registry import NoConfig, Option

if TYPE_CHECKING:
    from servelab.strategies.factories import PolicyOption


class FirstComeFirstServed(AdmissionPolicy):
    def order(self, waiting: Sequence[Request], kv: KVManager) -> list[Request]:
        return list(waiting)


FCFS: PolicyOption = Option(
    name="fcfs",
    summary="arrival order",
    config=NoConfig,
    build=lambda config: FirstComeFirstServed(),
)
