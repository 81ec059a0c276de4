"""Open generated reports in headless Chromium: no page errors, every figure drawn, a screenshot.

The page's own probe script (reports/html.py) writes `data-errors`, `data-rendered` and
`data-figures` onto `<body>`; `--dump-dom` returns the DOM after the page ran, offline.
Skipped when Debian's `chromium` is not installed (`apt-get install -y chromium`).
The screenshot lands in the test's tmp_path, and is copied into `$SERVELAB_ARTIFACTS` when
that variable names a directory, to keep it.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from reports_rundirs import RunSpec, write_run

from servelab.reports.run_report import build_run_report
from servelab.reports.sweep_report import build_sweep_report

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)"
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium on `page` with networking off and a throwaway profile."""
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-quic",
        "--no-first-run",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
        *extra,
        page.resolve().as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


def body_attributes(page: Path, profile: Path) -> dict[str, str]:
    """The `data-*` attributes the page's probe left on `<body>`."""
    dom = chromium(page, profile, "--dump-dom").stdout
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None, dom[:500]
    return {k: html.unescape(v) for k, v in re.findall(r'(data-[a-z]+)="([^"]*)"', body[1])}


def expect_clean_render(page: Path, profile: Path) -> None:
    figures = page.read_text().count('class="plotly-graph-div"')
    attributes = body_attributes(page, profile)
    assert json.loads(attributes["data-errors"]) == []
    assert int(attributes["data-figures"]) == figures > 0
    assert int(attributes["data-rendered"]) == figures


def screenshot(page: Path, shot: Path, profile: Path) -> None:
    """Save a laptop-width screenshot of `page`; keep a copy in $SERVELAB_ARTIFACTS if set."""
    chromium(page, profile, f"--screenshot={shot}", "--window-size=1400,2400")
    assert shot.read_bytes()[:8] == PNG_MAGIC
    assert shot.stat().st_size > 50_000
    keep = os.environ.get("SERVELAB_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)


def test_run_report_renders_without_errors(tmp_path: Path) -> None:
    spec = RunSpec(strategy="<b>bold</b>", prompt="<script>x</script>", preempted=2, failed=1)
    page = build_run_report(write_run(tmp_path, spec))
    expect_clean_render(page, tmp_path / "profile-dom")
    screenshot(page, tmp_path / "run-report.png", tmp_path / "profile-shot")


def test_sweep_report_renders_without_errors(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    for strategy, slow in (("fastertransformer", 2.0), ("orca", 1.5), ("vllm", 1.0)):
        for rate in (1.0, 2.0, 4.0):
            spec = RunSpec(
                name=f"{strategy}-{rate:g}", strategy=strategy, rate=rate, ttft=0.05 * slow * rate
            )
            write_run(sweep, spec)
    page = build_sweep_report([sweep], sweep / "report.html", None)
    expect_clean_render(page, tmp_path / "profile-dom")
    screenshot(page, tmp_path / "sweep-report.png", tmp_path / "profile-shot")


def test_a_search_report_renders_without_errors(tmp_path: Path) -> None:
    """A knee search's report: its answer, its knee table and a quantile curve per strategy
    (log axes, the limit, the interval and the knee drawn over the probes)."""
    from test_reports_search import search_record

    rates = {"vllm": [1.0, 2.0, 4.0], "orca": [0.5, 1.0, 2.0]}
    for strategy, probed in rates.items():
        for rate in probed:
            spec = RunSpec(name=f"rate-{rate:g}-n10", strategy=strategy, rate=rate, ttft=0.1)
            write_run(tmp_path / "search" / strategy, spec)
    (tmp_path / "search" / "search.json").write_text(json.dumps(search_record(rates)))
    page = build_sweep_report([tmp_path / "search"], tmp_path / "search" / "report.html")
    expect_clean_render(page, tmp_path / "profile-dom")
    screenshot(page, tmp_path / "search-report.png", tmp_path / "profile-shot")


INJECT = "document.body.setAttribute('data-injected', 'yes')"
PAYLOADS = (
    f"<script>{INJECT}</script>",
    f'"><img src=x onerror="{INJECT}">',
    f"</script><script>{INJECT}</script>",
)


def test_markup_in_prompts_and_config_strings_stays_inert(tmp_path: Path) -> None:
    """A prompt, a strategy name, a workload and model name and an error holding markup that
    would mark the page if it ever ran: the page renders, shows the text, and stays unmarked."""
    payload = "".join(PAYLOADS)
    spec = RunSpec(
        strategy=f"vllm{payload}",
        workload=f"chat{payload}",
        model=f"m{payload}",
        prompt=f"Summarise {payload}",
        error=f"boom {payload}",
        failed=1,
        preempted=1,
    )
    run_dir = write_run(tmp_path / "runs", spec)
    write_run(tmp_path / "runs", RunSpec(name="other", strategy=f"orca{payload}"))
    page = build_run_report(run_dir)
    sweep = build_sweep_report([tmp_path / "runs"], tmp_path / "sweep.html", None)
    for shown, profile in ((page, "profile-run"), (sweep, "profile-sweep")):
        attributes = body_attributes(shown, tmp_path / profile)
        assert "data-injected" not in attributes, shown
        assert json.loads(attributes["data-errors"]) == []
    assert html.escape(f"boom {payload}") in page.read_text()
