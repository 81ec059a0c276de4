"""A knee and a rate in words, as `servelab search`, `servelab knee` and the report print them."""

from __future__ import annotations

import math

from servelab.harness.search.estimator import Knee


def rate_text(value: float | None) -> str:
    """A rate (or ratio) to 3 digits; '-' where there is none."""
    return "-" if value is None or math.isinf(value) else f"{value:.3g}"


def knee_text(knee: Knee) -> str:
    """The knee in words: "0.73 req/s [0.61, 0.80] req/s (high / low 1.31)", or a cliff's
    bracket, or the side of every probed rate it lies on; its widening for the speed drift."""
    where = f"[{rate_text(knee.low)}, {rate_text(knee.high)}] req/s"
    widened = f", widened x{knee.widened_by:.3g} for the speed drift" if knee.widened_by > 1 else ""
    if knee.cliff:
        return (
            f"a cliff between {rate_text(knee.below)} and {rate_text(knee.above)} req/s, "
            f"{where}{widened}"
        )
    if knee.estimate is None:
        side = "above every probed rate" if knee.above is None else "below every probed rate"
        return f"not crossed: the knee lies {side}, {where}{widened}"
    return f"{rate_text(knee.estimate)} req/s {where} (high / low {knee.width:.2f}{widened})"
