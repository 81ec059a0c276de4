"""/metrics: the engine loop's state in the Prometheus text format.

Gauges for requests running and waiting and for KV slots (total, allocated, live, and the
allocated share, as vLLM's cache usage), counters for prompt and generated tokens, steps and
finished requests by `finish_reason`. Values are the loop's last published snapshot, read
without touching the engine.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from servelab.harness.serving.engine_loop import EngineLoop

PREFIX = "servelab_"


class LoopCollector(Collector):
    def __init__(self, loop: EngineLoop) -> None:
        self.loop = loop

    def collect(self) -> Iterator[Metric]:
        s = self.loop.stats
        gauges = {
            "requests_running": ("requests holding a place in the batch", s.running),
            "requests_waiting": ("requests waiting for a place", s.waiting),
            "requests_in_flight": ("requests accepted and not yet answered", s.in_flight),
            "kv_slots_total": ("KV cache slots (one token's K/V in every layer)", s.kv_total_slots),
            "kv_slots_allocated": ("KV slots handed to requests", s.kv_allocated_slots),
            "kv_slots_live": ("KV slots holding tokens of unfinished requests", s.kv_live_slots),
            "kv_usage": (
                "allocated share of the KV cache (0..1)",
                s.kv_allocated_slots / s.kv_total_slots if s.kv_total_slots else 0.0,
            ),
        }
        for name, (text, value) in gauges.items():
            yield GaugeMetricFamily(PREFIX + name, text, value=value)
        counters = {
            "prompt_tokens": ("prompt tokens of requests admitted", s.prompt_tokens),
            "generation_tokens": ("output tokens generated", s.generation_tokens),
            "steps": ("engine steps run", s.steps),
        }
        for name, (text, value) in counters.items():
            yield CounterMetricFamily(PREFIX + name, text, value=value)
        finished = CounterMetricFamily(
            PREFIX + "requests_finished", "requests that left the engine", labels=["finish_reason"]
        )
        for reason, count in sorted(s.finished.items()):
            finished.add_metric([reason], count)
        yield finished


class Metrics:
    """The registry behind /metrics."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, loop: EngineLoop) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(LoopCollector(loop))

    def render(self) -> bytes:
        return generate_latest(self.registry)
