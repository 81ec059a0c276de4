"""One fixed colour per strategy, the same in every figure and every report.

Known preset names get fixed colours; any other name is hashed (sha256, so the result
never depends on the Python process) onto a palette that excludes the preset colours.
Within one report, `assign_colors` moves a hashed name to the next free palette entry
when two names collide, deterministically, so two strategies never share a colour there.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

PRESET_COLORS = {
    "fastertransformer": "#1f77b4",
    "orca": "#ff7f0e",
    "orca-chunked": "#9467bd",
    "vllm": "#2ca02c",
    "vllm-noprefix": "#17becf",
    "orca-spec-ngram": "#ffbb78",
    "vllm-spec-ngram": "#98df8a",
    "vllm-spec-layerskip": "#c49c94",
    "vllm-spec-draft": "#f7b6d2",
}

PALETTE = (  # none close to a preset colour, so a hashed name never looks like a preset
    "#d62728",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#7f7f7f",
    "#393b79",
    "#ad494a",
    "#637939",
    "#8c6d31",
    "#7b4173",
    "#843c39",
    "#5254a3",
)


def _palette_index(name: str) -> int:
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % len(PALETTE)


def strategy_color(name: str) -> str:
    """The colour for a strategy name: its preset colour, else its hashed palette colour."""
    return PRESET_COLORS.get(name) or PALETTE[_palette_index(name)]


def assign_colors(names: Iterable[str]) -> dict[str, str]:
    """Colours for the names shown together: preset or hashed, collisions moved aside."""
    colors: dict[str, str] = {}
    used: set[str] = set()
    unique = sorted(set(names))
    for name in unique:
        if name in PRESET_COLORS:
            colors[name] = PRESET_COLORS[name]
    for name in unique:
        if name in colors:
            continue
        start = _palette_index(name)
        candidates = [PALETTE[(start + k) % len(PALETTE)] for k in range(len(PALETTE))]
        free = [color for color in candidates if color not in used]
        colors[name] = free[0] if free else candidates[0]
        used.add(colors[name])
    return colors
