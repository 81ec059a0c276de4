"""The answer of a knee search (`servelab search`, `make run`), first in its report.

From the search's `search.json`: one sentence per pair of contenders (servelab's strategies,
engines' servers), the faster on top,
with the ratio of their knees and its interval ("vllm sustains 1.9x [1.7, 2.1] orca's rate
at this SLO on this machine"); the SLO, the machine's speed drift and what stayed unresolved
beside it; what served each contender (engine, version, switches, KV, start-up, its server's
own peaks); then, per contender, its probes' ratio quantiles against the rate with their
intervals, the line at 1 they cross, the knee's estimate and interval, and the simulator's
predicted knee where there was one.
"""

from __future__ import annotations

import json
import math
from importlib.metadata import version
from itertools import combinations
from pathlib import Path

import plotly.graph_objects as go

from servelab.harness.measure.rundir import read_json
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.search.estimator import knee_ratio
from servelab.harness.search.result import StrategyResult, result_of_record
from servelab.harness.search.text import rate_text
from servelab.reports.figures import new_figure
from servelab.reports.html import Page, table_html

SEARCH_RECORD = "search.json"
QUANTILE_CAP = 10.0  # a quantile shown above this (or unbounded) is drawn at it


def search_record(path: Path) -> dict | None:
    """The search recorded in `path` (a search's out_dir), or None."""
    file = path / SEARCH_RECORD
    return json.loads(file.read_text()) if file.is_file() else None


def strategy_dirs(path: Path, record: dict) -> list[Path]:
    """A search's probe directories, one folder per contender (not its predicted runs); a
    search recorded before its contenders named their folders had one per strategy preset."""
    folders = [c["folder"] for c in record.get("contenders") or []]
    return [path / f for f in folders or record["settings"]["strategies"] if (path / f).is_dir()]


def answer_lines(knees: list[StrategyResult]) -> list[str]:
    """One sentence per pair of strategies, the one with the higher knee first (by its low
    end, what is sure of it, then its estimate): decided (the ratio's interval, both ends
    above 1), one-sided ("at least 12x": the bound its probes support), not separated (the
    interval holds 1: neither is shown to sustain more), or not measured, and why."""
    ordered = sorted(knees, key=lambda k: (k.low or 0.0, k.knee.centre or 0.0), reverse=True)
    return [pair_sentence(top, bottom) for top, bottom in combinations(ordered, 2)]


def pair_sentence(top: StrategyResult, bottom: StrategyResult) -> str:
    """`top` against `bottom` in one sentence that no probe of either contradicts."""
    ratio = knee_ratio(top.knee, bottom.knee)
    where = "at this SLO on this machine"
    if ratio.low is None and ratio.high is None:
        ends = ((top, "low", top.low), (bottom, "high", bottom.high))
        missing = [
            f"{knee.strategy}'s knee has no {side} end" + (f" ({knee.note})" if knee.note else "")
            for knee, side, end in ends
            if end is None
        ]
        return f"{top.strategy} against {bottom.strategy}: not measured: {'; '.join(missing)}"
    span = f"[{rate_text(ratio.low)}, {rate_text(ratio.high)}]"
    if ratio.low is None or ratio.low <= 1:
        return (
            f"{top.strategy} and {bottom.strategy} are not separated {where}: "
            f"{top.strategy}'s rate over {bottom.strategy}'s lies in {span}"
        )
    if ratio.high is None:
        how = f"at least {rate_text(ratio.low)}x"
    else:
        how = ("" if ratio.estimate is None else f"{ratio.estimate:.2g}x ") + span
    return f"{top.strategy} sustains {how} {bottom.strategy}'s rate {where}"


def predicted_text(knee: StrategyResult) -> str:
    """The simulator's knee and where the measured interval lies against it, e.g. "0.591
    (inside the measured interval)", "0.851 (the measured interval starts 7% above it)"."""
    if knee.predicted is None:
        return "-"
    predicted, low, high = knee.predicted, knee.low, knee.high
    if low is not None and predicted < low:
        where = f"the measured interval starts {low / predicted - 1:.0%} above it"
    elif high is not None and predicted > high:
        where = f"the measured interval ends {1 - high / predicted:.0%} below it"
    else:
        where = "inside the measured interval"
    return f"{rate_text(predicted)} ({where})"


def add_search_section(page: Page, path: Path, record: dict) -> None:
    """The answer, the conditions it holds under, and each strategy's curve."""
    knees = [result_of_record(k) for k in record["knees"]]
    page.heading("The answer")
    for line in answer_lines(knees):
        page.paragraph(line + ".")
    slo = SLO.from_config(record["slo"])
    drift = record.get("drift") or {}
    notes = [slo.describe()]
    if drift:
        notes.append(
            f"The machine's speed moved {drift['change']:+.1%} between the first probe and the "
            "last (median TPOT one request at a time); every interval is widened by it."
        )
    busy = record.get("busy_probes") or []
    if busy:
        notes.append(
            f"Other processes shared the machine during {len(busy)} probe(s) ({', '.join(busy)}):"
            " their requests ran slower than this machine runs alone (flag busy_machine)."
        )
    estimated = record.get("estimated_probes") or []
    if estimated:
        notes.append(
            f"A server did not report its tokens in {len(estimated)} probe(s) "
            f"({', '.join(estimated)}): their counts or times are estimated (flag estimated)."
        )
    unresolved = [k.strategy for k in knees if k.budget_spent]
    if unresolved:
        notes.append(
            f"Not within {record['settings']['resolution']:.0%} in the budget: "
            f"{', '.join(unresolved)}."
        )
    notes.append(f"Every probe's run is under {path}; search.json holds these numbers.")
    for note in notes:
        page.paragraph(note, "note")
    page.tables([table_html(
        ["strategy", "knee (req/s)", "low", "high", "predicted", "ceiling", "note"],
        [[k.strategy, rate_text(k.estimate), rate_text(k.low), rate_text(k.high),
          predicted_text(k), rate_text(k.ceiling), k.note] for k in knees],
        "Each strategy's knee: the 95% interval of the highest rate it sustains",
    )])  # fmt: skip
    served = contenders_table(path, record)
    if served is not None:
        page.tables([served])
    page.figures([quantile_figure(k, r) for k, r in zip(knees, record["knees"], strict=True)])


def contenders_table(path: Path, record: dict) -> str | None:
    """What served each contender (servelab in this process, or a server: its kind, version
    and every switch it started with, from its `server.json`), the KV it held, its start-up,
    and the most its server said it held at once over its probes (its own /metrics); None
    where every contender is servelab's in this process."""
    contenders = record.get("contenders") or []
    if all(c["backend"] == "inprocess" for c in contenders):
        return None
    rows = []
    for contender in contenders:
        folder = path / contender["folder"]
        server = read_json(folder / "server" / "server.json")
        if server:
            served = server.get("version") or server["kind"]
            switches = [*server.get("strategy_flags", []), *server.get("budget_flags", []),
                        *server.get("flags", [])]  # fmt: skip
            kv, started = server.get("kv_tokens"), server.get("startup_s")
            if server["kind"] == "servelab":  # servelab's engine on the run's settings
                switches, kv = [f"strategy={server.get('strategy')}", *switches], "engine.kv_budget"
        elif contender["backend"] == "inprocess":
            served, switches, kv, started = f"servelab {version('servelab')}, in this process", \
                [contender["item"]], "engine.kv_budget", None  # fmt: skip
        else:
            served, switches, kv, started = "a server running elsewhere", [contender["item"]], \
                None, None  # fmt: skip
        peaks = [(read_json(run) or {}).get("server_metrics") or {}
                 for run in sorted(folder.glob("*/summary.json"))]  # fmt: skip
        running = max((m.get("running_requests_max") or 0 for m in peaks), default=0)
        used = max((m.get("kv_usage_share_max") or 0 for m in peaks), default=0)
        rows.append([
            contender["name"], served, " ".join(switches) or "-", str(kv or "-"),
            "-" if started is None else f"{started:.1f}",
            f"{running:g} running, {used:.0%} of its KV" if running or used else "-",
        ])  # fmt: skip
    return table_html(
        ["contender", "engine", "switches", "KV tokens", "start-up (s)", "its server at most"],
        rows,
        "What served each contender: every server started once, cold for each probe, stopped "
        "after its last (start-up outside the budget); its peaks as its own /metrics said",
    )


def quantile_figure(knee: StrategyResult, recorded: dict) -> go.Figure:
    """The probes' ratio quantiles against the rate, the crossing of 1 and its interval."""
    figure = new_figure(
        f"{knee.strategy}: SLO-ratio quantile by rate",
        "request rate (req/s)",
        "ratio quantile (1: the limit; shaded: the knee's interval)",
        x_log=True,
        y_log=True,
    )
    probes = [p for p in recorded["probes"] if p["kind"] == "rate"]
    shown = [min(p["quantile"] or math.inf, QUANTILE_CAP) for p in probes]
    figure.add_trace(go.Scatter(
        x=[p["rate"] for p in probes], y=shown, mode="markers", name="probes",
        error_y={"type": "data", "symmetric": False,
                 "array": [min(p["quantile_high"] or math.inf, QUANTILE_CAP) - y
                           for p, y in zip(probes, shown, strict=True)],
                 "arrayminus": [y - min(p["quantile_low"], y)
                                for p, y in zip(probes, shown, strict=True)]},
        text=[f"{p['requests']} requests, {p['met']}/{p['counted']} met"
              + (", stopped early" if p["stopped"] else "") for p in probes],
    ))  # fmt: skip
    figure.add_hline(y=1.0, line_dash="dot")  # the limit
    if knee.low is not None and knee.high is not None:  # shaded: the knee's interval
        figure.add_vrect(x0=knee.low, x1=knee.high, fillcolor="#7f8c9b", opacity=0.3,
                         line_width=0, layer="below")  # fmt: skip
    span = [min([*(p["quantile_low"] for p in probes), 0.5]), QUANTILE_CAP]
    marks = ((knee.estimate, "knee", "solid"), (knee.predicted, "predicted knee", "dash"))
    for rate, label, dash in marks:  # lines as traces: annotations misplace on a log axis
        if rate is not None:
            figure.add_trace(go.Scatter(x=[rate, rate], y=span, mode="lines", name=label,
                                        line={"dash": dash, "width": 1.5}))  # fmt: skip
    return figure
