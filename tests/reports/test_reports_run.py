"""The per-run HTML report: its figures, one plotly.js, escaping, and crashed runs."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import plotly.offline
import pytest
from reports_rundirs import RunSpec, page_text, write_run

from servelab.base.records import RequestRecord
from servelab.reports.derive import ThinnedSteps, request_metrics
from servelab.reports.run_figures import request_timeline
from servelab.reports.run_report import build_run_report

PLOTLY_HEADER = "* plotly.js v"
RUN_TITLES = (
    "TTFT CDF",
    "TPOT CDF",
    "E2E latency CDF",
    "Normalized latency CDF",
    "Request timeline",
    "Batch size per step",
    "Tokens per step",
    "KV cache over time",
    "MFU and MBU per step",
    "Steps on the roofline",
    "Telemetry over time",
)
HOSTILE = "<script>alert(7)</script>"


def figure_titles(html: str) -> list[str]:
    """The title text of every plotly figure in the page, in order."""
    return re.findall(r'"title":\{"text":"([^"]*)"', html)


@pytest.fixture(scope="module")
def full_report(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("run")
    spec = RunSpec(strategy=HOSTILE, prompt=HOSTILE, preempted=2, failed=1)
    path = build_run_report(write_run(root, spec))
    assert path == root / "run" / "report.html"
    return page_text(path)


def test_every_figure_is_present(full_report: str) -> None:
    titles = [t for t in figure_titles(full_report) if t in RUN_TITLES]
    assert titles == list(RUN_TITLES)
    assert full_report.count('class="plotly-graph-div"') == len(RUN_TITLES)


def test_plotly_js_is_embedded_once_and_nothing_is_fetched(full_report: str) -> None:
    assert full_report.count(PLOTLY_HEADER) == 1
    own_part = full_report.replace(plotly.offline.get_plotlyjs(), "")
    assert len(own_part) < len(full_report) / 10
    assert not re.search(r"https?://", own_part)
    assert not re.search(r"<script[^>]+src=", own_part)


def test_text_from_configs_and_prompts_is_escaped(full_report: str) -> None:
    assert HOSTILE not in full_report
    escaped = "&lt;script&gt;alert(7)&lt;\\u002fscript&gt;"
    assert "<td>&lt;script&gt;alert(7)&lt;/script&gt;</td>" in full_report
    assert f"request r0: {escaped} #0" in full_report
    assert "<title>Run report: &lt;script&gt;alert(7)&lt;/script&gt; on chat</title>" in full_report


def test_axes_carry_units(full_report: str) -> None:
    axis_titles = re.findall(r'"(?:x|y)axis\d*":\{[^{}]*"title":\{"text":"([^"]*)"', full_report)
    assert axis_titles
    for title in axis_titles:
        assert re.search(r"\(.+\)", title), title


def test_summary_tables_show_the_summary(full_report: str) -> None:
    assert "<td>completed requests</td><td>9</td>" in full_report
    assert "<td>failed requests</td><td>1</td>" in full_report
    assert "<td>correctness</td>" not in full_report


def test_crashed_run_gets_a_report_from_its_requests(tmp_path: Path) -> None:
    spec = RunSpec(summary=False, truncated_tail=True, roofline=False, telemetry=False)
    html = page_text(build_run_report(write_run(tmp_path, spec)))
    assert "Summary recomputed from the records" in html
    assert "<td>status</td><td>incomplete</td>" in html
    assert "<td>completed requests</td><td>10</td>" in html
    titles = figure_titles(html)
    assert "Steps on the roofline" not in titles
    assert "MFU and MBU per step" not in titles
    assert "Telemetry over time" not in titles
    assert "No telemetry recorded" in html


def test_optional_summary_fields_are_shown(tmp_path: Path) -> None:
    extra = {
        "correctness": {"check": "greedy-fp32", "identical_share": 0.5, "max_margin": 0.25},
        "j_per_token": 0.125,
        "acceptance_rate": 0.75,
        "mean_accepted_length": 2.5,
        "acceptance_histogram": [3, 0, 5],
    }
    html = page_text(build_run_report(write_run(tmp_path, RunSpec(extra_summary=extra))))
    assert "<td>greedy-fp32, 50.0% identical, max_margin=0.25</td>" in html
    assert "<td>energy per output token</td><td>0.125</td><td>J/token</td>" in html
    assert "<td>speculative acceptance rate</td><td>0.75</td>" in html
    assert "<td>tokens emitted per target forward</td><td>2.5</td>" in html
    assert "Accepted drafts per verification" in figure_titles(html)
    assert "Accepted drafts per verification" not in figure_titles(
        page_text(build_run_report(write_run(tmp_path / "plain", RunSpec())))
    )


def test_report_can_go_elsewhere(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, RunSpec())
    out = build_run_report(run_dir, tmp_path / "out" / "r.html")
    assert out.is_file() and not (run_dir / "report.html").exists()


def test_timeline_splits_engine_queue_from_prefill_and_shows_held_responses() -> None:
    records = [
        RequestRecord(id="a", prompt_len=3, output_len=2, t_scheduled=0.0, t_send=0.25,
                      t_admitted=0.5, t_done=2.5, token_times=[1.0, 2.0], output_ids=[1, 2],
                      finish_reason="stop", preemptions=1),
        RequestRecord(id="b", prompt_len=3, output_len=1, t_scheduled=0.1, t_send=0.1,
                      t_done=0.5, token_times=[0.5], output_ids=[1], finish_reason="stop"),
    ]  # fmt: skip
    requests = pd.DataFrame.from_records([r.to_json() for r in records])
    figure = request_timeline(request_metrics(records), requests)
    segments = {
        t.name: (list(t.y), list(t.base), list(t.x)) for t in figure.data if t.type == "bar"
    }
    # rows in order of arrival: a (arrived at 0) is row 0, b (arrived at 0.1) row 1
    assert segments == {
        "queued (client)": ([0], [0.0], [0.25]),
        "queued (engine)": ([0], [0.25], [0.25]),
        "prefill": ([0], [0.5], [0.5]),
        "waiting + prefill": ([1], [0.1], [0.4]),
        "decode": ([0], [1.0], [1.0]),
        "held (batch end)": ([0], [2.0], [0.5]),
    }
    (preempted,) = [t for t in figure.data if t.name == "preempted"]
    assert list(preempted.x) == [2.0] and list(preempted.y) == [0]


def test_failed_run_says_so(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, RunSpec(error="RuntimeError: <out of memory>"))
    html = page_text(build_run_report(run_dir))
    assert "The run failed: RuntimeError: &lt;out of memory&gt;" in html
    assert "<td>status</td><td>failed</td>" in html


def test_steps_above_the_calibrated_peak_are_flagged(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, RunSpec())
    steps = (run_dir / "steps.jsonl").read_text().splitlines()
    steps[2] = steps[2].replace('"mfu": 0.03', '"mfu": 1.25')
    (run_dir / "steps.jsonl").write_text("\n".join(steps) + "\n")
    html = page_text(build_run_report(run_dir))
    assert "1 step(s) exceed an MFU or MBU of 1" in html
    clean = page_text(build_run_report(write_run(tmp_path, RunSpec(name="clean"))))
    assert "exceed an MFU or MBU of 1" not in clean


def test_thinned_steps_average_each_group_and_sample_every_group_th_step() -> None:
    steps = pd.DataFrame(
        {"step": range(10), "t_start": [0.5 * i for i in range(10)], "num_seqs": range(10)}
    )
    thinned = ThinnedSteps.of(steps, limit=4)  # 10 steps, at most 4 points: groups of 3
    assert thinned.group == 3
    assert thinned.over_time["num_seqs"].tolist() == [1.0, 4.0, 7.0, 9.0]
    assert thinned.over_time["t_start"].tolist() == [0.0, 1.5, 3.0, 4.5]
    assert thinned.sampled["step"].tolist() == [0, 3, 6, 9]
    assert ThinnedSteps.of(steps, limit=10).over_time is steps


def test_a_run_with_more_steps_than_a_figure_draws_says_how_they_were_thinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = write_run(tmp_path, RunSpec())
    steps = len((run_dir / "steps.jsonl").read_text().splitlines())
    monkeypatch.setattr("servelab.reports.run_report.STEP_POINTS", 4)
    html = page_text(build_run_report(run_dir))
    group = -(-steps // 4)
    assert f"{steps:,} steps: the figures over time show the mean of each {group:,}" in html
    assert "Batch size per step" in figure_titles(html)


def test_the_command_that_asked_for_a_run_draws_its_report(monkeypatch, tmp_path: Path) -> None:
    """`servelab` (the run verb) draws report.html once the run's summary is written; the
    runner itself draws none, so a search's or a gate's caller decides (`reported`)."""
    import sys

    from servelab.commands.cli import main
    from servelab.harness.run.compose import compose
    from servelab.harness.run.run import run

    common = ["model=dummy-tiny", "workload=smoke", "workload.num_requests=3",
              "telemetry.roofline=false"]  # fmt: skip
    run(compose(common), tmp_path / "library", progress=False)
    assert (tmp_path / "library" / "summary.json").is_file()
    assert not (tmp_path / "library" / "report.html").exists()
    argv = ["servelab", *common, f"hydra.run.dir={tmp_path / 'command'}"]
    monkeypatch.setattr(sys, "argv", argv)
    main()
    page = (tmp_path / "command" / "report.html").read_text()
    assert "Run report: fastertransformer on smoke" in page
