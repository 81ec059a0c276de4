"""Which source sets each SLO limit: one source a limit, said in the error when two are given.

`search.slo_from` gives every limit (an earlier search's, `earlier_run`), else
`search.slo_scale` the limits it names (`scaled`), else `slo.*` the rest; a second source for
one limit is refused before any run, with this rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.base.errors import ConfigError
from servelab.harness.measure.slo.limits import LIMITS, PER_PROMPT_TOKEN
from servelab.harness.measure.slo.scaled import scaled_keys

SOURCES_RULE = (
    "each limit has one source: search.slo_from (every limit, as the earlier search recorded "
    "them), else search.slo_scale for the limits it names, else slo.* for the rest"
)


def one_source_each(scale: dict[str, float], slo_node: Mapping[str, Any], slo_from: object) -> None:
    """Refuse two sources for one limit, before any run, with the rule that says which wins."""
    given = {k for k in (*LIMITS, PER_PROMPT_TOKEN) if slo_node.get(k) is not None}
    if slo_from is not None and (scale or given):
        others = [f"search.slo_scale.{k}" for k in scale] + [f"slo.{k}" for k in sorted(given)]
        raise ConfigError("search.slo_from", f"{SOURCES_RULE}; drop {', '.join(others)}")
    both = sorted(scaled_keys(scale) & given)
    if both:
        raise ConfigError(f"slo.{both[0]}", f"{SOURCES_RULE}; search.slo_scale sets it too")
