"""The sweep report's figures: metrics against load, one curve (and colour) per strategy.

The x axis is the group's load: the arrival rate, or the concurrency for offline runs;
when offline runs have no concurrency either, each figure shows bars per strategy.
Only complete runs (with a summary) are drawn; the runs table lists the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import plotly.graph_objects as go

from servelab.harness.measure.slo.limits import PER_PROMPT_TOKEN
from servelab.reports.figures import new_figure
from servelab.reports.grouping import Group, SweepRun
from servelab.reports.html import esc
from servelab.reports.load import as_dict

Getter = Callable[[SweepRun], float | None]


@dataclass(frozen=True)
class Series:
    """One line per strategy: its name in hover text, how to read its value, its dash style."""

    name: str
    getter: Getter
    dash: str = "solid"


def summary_value(metric: str, stat: str | None = None) -> Getter:
    """A getter for a summary value (`goodput`) or a statistic of one (`ttft`, `p99`)."""

    def get(sweep_run: SweepRun) -> float | None:
        summary = sweep_run.run.summary
        if summary is None:
            return None
        value = as_dict(summary.get(metric)).get(stat) if stat else summary.get(metric)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else None

    return get


def load_figure(
    group: Group,
    colors: dict[str, str],
    title: str,
    y_title: str,
    series: list[Series],
    note: str = "",
) -> go.Figure:
    """Each series against the group's load, one colour per strategy, markers at each run."""
    against = "by strategy" if group.x_kind == "none" else f"vs {group.x_title.split(' (')[0]}"
    figure = new_figure(f"{title} {against}", group.x_title, y_title)
    if note:
        figure.update_layout(legend_title_text=esc(note).replace(", ", "<br>"))
    for label in group.labels:
        runs = [r for r in group.runs if r.label == label and r.run.complete]
        for index, line in enumerate(series):
            points = [(r, line.getter(r)) for r in runs]
            points = [(r, y) for r, y in points if y is not None]
            if group.x_kind == "none":
                _add_bars(figure, label, line, points, colors, index == 0)
                continue
            points.sort(key=lambda item: item[0].x or 0.0)
            figure.add_trace(
                go.Scatter(
                    x=[r.x for r, _ in points],
                    y=[y for _, y in points],
                    mode="lines+markers",
                    name=esc(label),
                    legendgroup=esc(label),
                    showlegend=index == 0,
                    hovertemplate=f"{esc(label)} {esc(line.name)}<br>%{{x:.4g}}, %{{y:.4g}}"
                    "<extra></extra>",
                    line={"color": colors[label], "dash": line.dash},
                    marker={"color": colors[label], "size": 7},
                )
            )
    if group.x_kind == "none":
        figure.update_layout(barmode="group")
    figure.update_yaxes(rangemode="tozero")
    return figure


def _add_bars(
    figure: go.Figure,
    label: str,
    line: Series,
    points: list[tuple[SweepRun, float]],
    colors: dict[str, str],
    show_legend: bool,
) -> None:
    pattern = "" if line.dash == "solid" else "/"
    figure.add_trace(
        go.Bar(
            x=[esc(label)] * len(points),
            y=[y for _, y in points],
            name=esc(label),
            legendgroup=esc(label),
            offsetgroup=esc(line.name),
            showlegend=show_legend,
            hovertext=esc(f"{label} {line.name}"),
            marker={"color": colors[label], "pattern": {"shape": pattern}},
        )
    )


def limit_line(figure: go.Figure, limit: object, text: str) -> go.Figure:
    """A dotted horizontal line at an SLO limit, when the limit is set and one number (a TTFT
    limit that grows with the prompt is none: the SLO's sentence on the page states it)."""
    if isinstance(limit, int | float) and not isinstance(limit, bool):
        figure.add_hline(
            y=float(limit),
            line={"dash": "dot", "color": "#c0392b"},
            annotation_text=esc(text),
            annotation_position="top left",
        )
    return figure


def per_user_rate(sweep_run: SweepRun) -> float | None:
    """Output tokens/s one user sees while decoding: 1 / mean TPOT."""
    tpot = summary_value("tpot", "mean")(sweep_run)
    return 1 / tpot if tpot else None


def pareto_figure(group: Group, colors: dict[str, str]) -> go.Figure:
    """What each user gets (1 / TPOT) against what the server delivers in all (output
    tokens/s), a point per run joined in load order, one curve per strategy: the trade a
    deployment picks a point on. Shaded: the per-user rates that meet the TPOT limit; with
    only a normalized-latency limit, the rates it needs at least (a token every limit)."""
    figure = new_figure(
        "Per-user vs total output rate",
        "output throughput, all users (tokens/s)",
        "output rate per user, 1 / mean TPOT (tokens/s)",
    )
    for label in group.labels:
        runs = sorted(
            (r for r in group.runs if r.label == label and r.run.complete),
            key=lambda r: r.x or 0.0,
        )
        points = [(summary_value("output_throughput")(r), per_user_rate(r), r) for r in runs]
        points = [(x, y, r) for x, y, r in points if x is not None and y is not None]
        figure.add_trace(
            go.Scatter(
                x=[x for x, _, _ in points],
                y=[y for _, y, _ in points],
                mode="lines+markers",
                name=esc(label),
                text=[esc(r.run.path.name) for _, _, r in points],
                hovertemplate=f"{esc(label)} %{{text}}<br>total %{{x:.4g}} tokens/s, "
                "per user %{y:.4g} tokens/s<extra></extra>",
                line={"color": colors[label]},
                marker={"color": colors[label], "size": 7},
            )
        )
    slo = group.slo
    tpot, normalized = slo.get("tpot_s"), slo.get("normalized_latency_s")
    limit, text = (tpot, "meets the TPOT SLO") if tpot else (normalized, "needed by the SLO")
    if isinstance(limit, int | float) and not isinstance(limit, bool) and limit > 0:
        needed = 1 / float(limit)
        drawn = [y for trace in figure.data for y in trace.y]
        figure.add_hrect(  # to just above the highest point: shapes widen the autorange
            y0=needed,
            y1=max([needed, *drawn]) * 1.1,
            fillcolor="#27ae60",
            opacity=0.08,
            line_width=0,
            annotation_text=esc(text),
            annotation_position="bottom left",
        )
    figure.update_xaxes(rangemode="tozero")
    figure.update_yaxes(rangemode="tozero")
    return figure


def group_figures(group: Group, colors: dict[str, str]) -> list[go.Figure]:
    """The comparison figures of one group."""
    slo = group.slo
    normalized = load_figure(
        group,
        colors,
        "Normalized latency",
        "normalized latency (s/token)",
        [
            Series("mean", summary_value("normalized_latency", "mean")),
            Series("p99", summary_value("normalized_latency", "p99"), "dash"),
        ],
        "solid: mean, hatched: p99" if group.x_kind == "none" else "solid: mean, dashed: p99",
    )
    ttft = load_figure(
        group,
        colors,
        "p99 TTFT",
        "p99 TTFT (s)",
        [Series("p99 TTFT", summary_value("ttft", "p99"))],
    )
    goodput = load_figure(
        group, colors, "Goodput", "goodput (req/s)", [Series("goodput", summary_value("goodput"))]
    )
    throughput = load_figure(
        group,
        colors,
        "Output throughput",
        "output throughput (tokens/s)",
        [Series("output throughput", summary_value("output_throughput"))],
    )
    waste = load_figure(
        group,
        colors,
        "KV cache waste",
        "KV waste, mean (fraction of allocated)",
        [Series("KV waste", summary_value("kv_waste_mean"))],
    )
    return [
        limit_line(normalized, slo.get("normalized_latency_s"), "SLO"),
        limit_line(ttft, None if slo.get(PER_PROMPT_TOKEN) else slo.get("ttft_s"), "TTFT SLO"),
        goodput,
        throughput,
        pareto_figure(group, colors),
        waste,
    ]
