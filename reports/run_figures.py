"""The figures of one run's report: latency CDFs, request timeline, steps, KV, telemetry, roofline.

Each builder takes recorded frames (or a summary's figures) and returns a plotly figure, or
None when the run did not record what the figure needs (no steps, no telemetry, no FLOP
counts or peaks, no speculative verifications), so the report only shows figures that carry
data. Times are seconds since the run started.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servelab.reports.figures import (
    FIGURE_HEIGHT,
    cdf_figure,
    new_figure,
    stacked_figure,
    style_figure,
)
from servelab.reports.html import esc

TIME_AXIS = "time since run start (s)"
TIMELINE_LIMIT = 400
PROMPT_EXCERPT = 60
TELEMETRY_LIMIT = 12
TIME_COLUMNS = ("t", "time", "time_s", "t_s", "timestamp", "elapsed_s")
SEGMENT_COLORS = {
    "queued (client)": "#b8c2cc",
    "queued (engine)": "#8da0b3",
    "waiting + prefill": "#f2a541",
    "prefill": "#f2a541",
    "decode": "#3d7ab8",
    "held (batch end)": "#c9b3d9",
}
UNIT_SUFFIXES = (
    ("_share", "0..1"),
    ("_requests", "requests"),
    ("_percent", "%"),
    ("_pct", "%"),
    ("_util", "%"),
    ("_w", "W"),
    ("_watts", "W"),
    ("_mhz", "MHz"),
    ("_bytes", "bytes"),
    ("_mib", "MiB"),
    ("_mb", "MB"),
    ("_gib", "GiB"),
    ("_gb", "GB"),
    ("_c", "°C"),
    ("_celsius", "°C"),
    ("_j", "J"),
    ("_s", "s"),
)

CDF_SPECS = (
    ("ttft", "TTFT CDF", "TTFT (s)"),
    ("tpot", "TPOT CDF", "TPOT (s/token)"),
    ("e2e", "E2E latency CDF", "E2E latency (s)"),
    ("normalized_latency", "Normalized latency CDF", "normalized latency (s/token)"),
)


def latency_cdfs(metrics: pd.DataFrame, label: str, color: str) -> list[go.Figure]:
    """CDFs of TTFT, TPOT, E2E and normalized latency over the run's counted requests."""
    counted = metrics[metrics["ok"]]
    return [
        cdf_figure(title, x_title, {label: counted[column].to_numpy()}, {label: color})
        for column, title, x_title in CDF_SPECS
    ]


def _segments(row: dict[str, Any], record: dict[str, Any]) -> list[tuple[str, float, float]]:
    t_send, t_first, t_last = row["t_send"], row["t_first"], row["t_last"]
    segments = [("queued (client)", row["t_scheduled"], t_send)]
    admitted = record.get("t_admitted")
    if isinstance(admitted, int | float) and not np.isnan(admitted) and not np.isnan(t_first):
        segments += [("queued (engine)", t_send, float(admitted)), ("prefill", admitted, t_first)]
    else:
        segments.append(("waiting + prefill", t_send, t_first))
    segments.append(("decode", t_first, t_last))
    segments.append(("held (batch end)", t_last, row["t_done"]))
    return [(name, start, end) for name, start, end in segments if end > start]


def _request_label(request_id: object, prompt: object) -> str:
    """`request <id>`, followed by the start of its prompt text when recorded."""
    label = f"request {request_id}"
    if isinstance(prompt, str) and prompt:
        excerpt = prompt if len(prompt) <= PROMPT_EXCERPT else prompt[:PROMPT_EXCERPT] + "…"
        label += f": {excerpt}"
    return label


def request_timeline(metrics: pd.DataFrame, requests: pd.DataFrame) -> go.Figure:
    """One row per request (by arrival): queued, prefill, decode, held; failures and
    preemptions."""
    order = metrics.assign(record=requests.to_dict("records"))
    order = order.sort_values("t_scheduled", kind="stable")
    shown = order.head(TIMELINE_LIMIT)
    title = "Request timeline"
    if len(order) > len(shown):
        title += f" (first {len(shown)} of {len(order)} requests)"
    height = int(min(max(FIGURE_HEIGHT, 140 + 7 * len(shown)), 1100))
    figure = new_figure(title, TIME_AXIS, "request (in order of arrival)", height=height)
    bars: dict[str, tuple[list[int], list[float], list[float], list[str]]] = {}
    failed: tuple[list[int], list[float], list[str]] = ([], [], [])
    preempted: tuple[list[int], list[float], list[str]] = ([], [], [])
    for position, row in enumerate(shown.to_dict("records")):
        record = row["record"]
        label = esc(_request_label(row["id"], record.get("prompt")))
        for name, start, end in _segments(row, record):
            rows, bases, lengths, texts = bars.setdefault(name, ([], [], [], []))
            rows.append(position)
            bases.append(start)
            lengths.append(end - start)
            texts.append(f"{label}<br>{name}: {end - start:.3f} s")
        if not row["ok"] and not row["excluded"]:
            failed[0].append(position)
            failed[1].append(row["t_send"])
            failed[2].append(f"{label}<br>{esc(record.get('finish_reason'))}")
        if row["preemptions"] > 0:
            times = record.get("preempt_times")
            marks = times if isinstance(times, list) and times else [row["t_last"]]
            for moment in marks:
                preempted[0].append(position)
                preempted[1].append(moment)
                preempted[2].append(f"{label}<br>preempted {row['preemptions']}×")
    for name in SEGMENT_COLORS:
        if name not in bars:
            continue
        rows, bases, lengths, texts = bars[name]
        figure.add_trace(
            go.Bar(
                y=rows,
                x=lengths,
                base=bases,
                orientation="h",
                name=name,
                marker={"color": SEGMENT_COLORS[name], "line": {"width": 0}},
                hovertext=texts,
                hoverinfo="text",
            )
        )
    for (rows, times, texts), name, symbol, color in (
        (failed, "failed (rejected or error)", "x", "#c0392b"),
        (preempted, "preempted", "diamond", "#8e44ad"),
    ):
        if rows:
            figure.add_trace(
                go.Scatter(
                    x=times,
                    y=rows,
                    mode="markers",
                    name=name,
                    marker={"symbol": symbol, "color": color, "size": 8},
                    hovertext=texts,
                    hoverinfo="text",
                )
            )
    figure.update_layout(barmode="overlay", bargap=0.15)
    figure.update_yaxes(autorange="reversed")
    return figure


def batch_figure(steps: pd.DataFrame) -> go.Figure:
    """Sequences in each step's batch, requests running and waiting, over time."""
    figure = new_figure("Batch size per step", TIME_AXIS, "sequences (count)")
    series = (("num_seqs", "sequences in batch"), ("running", "running"), ("waiting", "waiting"))
    for column, name in series:
        if column in steps:
            figure.add_trace(
                go.Scatter(x=steps["t_start"], y=steps[column], name=name, line={"shape": "hv"})
            )
    return figure


def tokens_figure(steps: pd.DataFrame) -> go.Figure:
    """Prefill and decode tokens per step, stacked, over time."""
    figure = new_figure("Tokens per step", TIME_AXIS, "tokens per step (tokens)")
    for column, name in (("decode_tokens", "decode"), ("prefill_tokens", "prefill")):
        figure.add_trace(
            go.Scatter(
                x=steps["t_start"],
                y=steps[column].fillna(0),
                name=name,
                stackgroup="tokens",
                line={"shape": "hv", "width": 0.5},
            )
        )
    return figure


def kv_figure(steps: pd.DataFrame) -> go.Figure | None:
    """KV slots allocated, live and in total over time, with the waste share on the right."""
    if "kv_allocated_slots" not in steps:
        return None
    figure = style_figure(
        make_subplots(specs=[[{"secondary_y": True}]]), "KV cache over time", FIGURE_HEIGHT
    )
    for column, name, dash, color in (
        ("kv_total_slots", "total", "dot", "#7f8c8d"),
        ("kv_allocated_slots", "allocated", "solid", "#3d7ab8"),
        ("kv_live_slots", "live", "solid", "#27ae60"),
    ):
        if column in steps:
            figure.add_trace(
                go.Scatter(
                    x=steps["t_start"],
                    y=steps[column],
                    name=name,
                    line={"shape": "hv", "dash": dash, "color": color},
                ),
                secondary_y=False,
            )
    if "kv_waste" in steps:
        figure.add_trace(
            go.Scatter(
                x=steps["t_start"],
                y=steps["kv_waste"],
                name="waste",
                line={"shape": "hv", "color": "#c0392b", "width": 1},
            ),
            secondary_y=True,
        )
    figure.update_xaxes(title_text=TIME_AXIS)
    figure.update_yaxes(title_text="KV slots (tokens)", secondary_y=False)
    figure.update_yaxes(
        title_text="waste (% of allocated)",
        range=[0, 1],
        tickmode="linear",
        dtick=0.2,
        tickformat=".0%",
        secondary_y=True,
        showgrid=False,
    )
    return figure


def telemetry_unit(column: str) -> str:
    """An axis title for a telemetry column: its name and the unit its suffix names."""
    lowered = column.lower()
    for suffix, unit in UNIT_SUFFIXES:
        if lowered.endswith(suffix):
            return f"{column} ({unit})"
    if "util" in lowered or "percent" in lowered:
        return f"{column} (%)"
    return f"{column} (as recorded)"


def telemetry_figure(
    telemetry: pd.DataFrame, title: str = "Telemetry over time"
) -> go.Figure | None:
    """Every numeric column of a sampled table (telemetry, the server's metrics) over time,
    one row each (at most twelve)."""
    time_column = next((c for c in TIME_COLUMNS if c in telemetry), None)
    if time_column is None:
        return None
    numeric = telemetry.select_dtypes("number")
    columns = [c for c in numeric.columns if c != time_column][:TELEMETRY_LIMIT]
    if not columns:
        return None
    figure = stacked_figure(title, TIME_AXIS, [telemetry_unit(c) for c in columns])
    for row, column in enumerate(columns, start=1):
        figure.add_trace(
            go.Scatter(x=telemetry[time_column], y=telemetry[column], name=esc(column)),
            row=row,
            col=1,
        )
    return figure


def roofline_figure(steps: pd.DataFrame, peaks: dict[str, Any]) -> go.Figure | None:
    """Each step's achieved FLOP/s against its arithmetic intensity, under the measured roof."""
    peak_flops = peaks.get("matmul_flops_per_s")
    peak_bytes = peaks.get("copy_bytes_per_s")
    if not {"flops", "bytes"} <= set(steps) or not peak_flops or not peak_bytes:
        return None
    usable = steps[(steps["flops"] > 0) & (steps["bytes"] > 0) & (steps["duration"] > 0)]
    if usable.empty:
        return None
    intensity = usable["flops"] / usable["bytes"]
    achieved = usable["flops"] / usable["duration"]
    figure = new_figure(
        "Steps on the roofline",
        "arithmetic intensity (FLOP/byte)",
        "achieved compute (FLOP/s)",
        x_log=True,
        y_log=True,
    )
    figure.update_yaxes(exponentformat="SI")
    ridge = peak_flops / peak_bytes
    low = min(float(intensity.min()), ridge) / 4
    high = max(float(intensity.max()), ridge) * 4
    roof_x = np.geomspace(low, high, 64)
    figure.add_trace(
        go.Scatter(
            x=roof_x,
            y=np.minimum(peak_flops, roof_x * peak_bytes),
            name="roof (measured peaks)",
            line={"color": "#333", "dash": "dash"},
        )
    )
    has_prefill = usable["prefill_tokens"].fillna(0) > 0
    for mask, name, color in (
        (has_prefill, "steps with prefill", "#f2a541"),
        (~has_prefill, "decode-only steps", "#3d7ab8"),
    ):
        if mask.any():
            figure.add_trace(
                go.Scatter(
                    x=intensity[mask],
                    y=achieved[mask],
                    mode="markers",
                    name=name,
                    marker={"color": color, "size": 6, "opacity": 0.7},
                    hovertext=[f"step {s}" for s in usable.loc[mask, "step"]]
                    if "step" in usable
                    else None,
                )
            )
    return figure


def utilization_figure(steps: pd.DataFrame) -> go.Figure | None:
    """MFU and MBU per step over time, when the engine recorded them."""
    columns = [c for c in ("mfu", "mbu") if c in steps]
    if not columns:
        return None
    figure = new_figure("MFU and MBU per step", TIME_AXIS, "share of measured peak (fraction)")
    for column in columns:
        figure.add_trace(go.Scatter(x=steps["t_start"], y=steps[column], name=column.upper()))
    return figure


def acceptance_figure(histogram: list[int]) -> go.Figure | None:
    """Speculative verifications by how many drafts the target accepted (0 = the first draft
    was rejected; the most = every draft passed), when the run speculated."""
    if not histogram or sum(histogram) == 0:
        return None
    figure = new_figure(
        "Accepted drafts per verification",
        "drafts accepted in one verification (tokens)",
        "verifications (count)",
    )
    total = sum(histogram)
    figure.add_trace(
        go.Bar(
            x=list(range(len(histogram))),
            y=histogram,
            name="verifications",
            marker={"color": "#3d7ab8"},
            hovertext=[f"{k} accepted: {n} ({n / total:.1%})" for k, n in enumerate(histogram)],
            hoverinfo="text",
        )
    )
    figure.update_xaxes(dtick=1)
    return figure
