"""Sweep report: groups, sustained load, baseline ratios, summary.csv, colours, CLI, callback."""

from __future__ import annotations

import csv
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from reports_rundirs import RunSpec, page_text, write_run

from servelab.base.errors import ConfigError
from servelab.reports.callback import SweepReportCallback
from servelab.reports.cli import report_main
from servelab.reports.colors import PALETTE, PRESET_COLORS, assign_colors, strategy_color
from servelab.reports.derive import slo_attainment
from servelab.reports.grouping import group_runs, strategy_labels
from servelab.reports.load import find_run_dirs, load_run
from servelab.reports.sustain import group_slo, sustained_loads
from servelab.reports.sweep_figures import group_figures, pareto_figure
from servelab.reports.sweep_report import build_sweep_report
from servelab.reports.sweep_table import choose_baseline

HOSTILE = "<script>alert(7)</script>"
SLO = {"ttft_s": 0.5}
# request i of 10 has TTFT = ttft * (1 + 0.1 i): 0.1 passes (all 10 under 0.5 s),
# 0.3 fails (7 of 10), 0.4 fails (3 of 10); a run needs 9 of 10.
TTFTS = {
    "fastertransformer": {1.0: 0.1, 2.0: 0.4, 4.0: 0.1},
    "orca": {1.0: 0.1, 2.0: 0.1, 4.0: 0.3},
    "vllm": {1.0: 0.1, 2.0: 0.1, 4.0: 0.1},
}


def write_sweep(root: Path) -> Path:
    for strategy, by_rate in TTFTS.items():
        for rate, ttft in by_rate.items():
            spec = RunSpec(
                name=f"{strategy}-{rate:g}",
                strategy=strategy,
                rate=rate,
                ttft=ttft,
                slo=SLO,
                extra_summary={"correctness": {"check": "greedy", "identical_share": 1.0}},
            )
            write_run(root, spec)
    write_run(root, RunSpec(name="failing-1", strategy=HOSTILE, rate=1.0, slo=SLO, failed=2))
    write_run(root, RunSpec(name="crashed-2", strategy="vllm", rate=2.0, slo=SLO, summary=False))
    write_run(root, RunSpec(name="failed-4", strategy="orca", rate=4.0, slo=SLO, error="boom"))
    return root


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sweep(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="module")
def sweep_html(sweep: Path) -> str:
    return page_text(build_sweep_report([sweep], sweep / "report.html", None))


def test_sweep_report_has_every_figure_once_per_group(sweep_html: str) -> None:
    titles = re.findall(r'"title":\{"text":"([^"]*)"', sweep_html)
    expected = [
        "Normalized latency vs request rate",
        "p99 TTFT vs request rate",
        "Goodput vs request rate",
        "Output throughput vs request rate",
        "Per-user vs total output rate",
        "KV cache waste vs request rate",
    ]
    assert [t for t in titles if t in expected] == expected
    assert sweep_html.count("* plotly.js v") == 1
    assert sweep_html.count('class="plotly-graph-div"') == len(expected)
    assert "Sustained load under the SLO" in sweep_html
    assert "at least 90% of its requests" in sweep_html
    assert "TTFT ≤ 0.5 s (latencies from arrival)" in sweep_html
    assert "baseline strategy: fastertransformer" in sweep_html
    assert (
        "2 run(s) in this group failed or did not finish; the figures leave them out." in sweep_html
    )
    assert "12 runs (10 complete, 1 failed, 1 incomplete) in 1 group(s)" in sweep_html


def test_strategy_names_are_escaped_everywhere(sweep_html: str) -> None:
    assert HOSTILE not in sweep_html
    assert "&lt;script&gt;alert(7)&lt;/script&gt;</td>" in sweep_html
    assert '"name":"&lt;script&gt;alert(7)&lt;\\u002fscript&gt;"' in sweep_html


def test_sustained_rate_on_a_constructed_sweep(sweep: Path) -> None:
    """Ten requests a run bound no quantile from above (the largest of ten is no 95% bound
    of a 0.9-quantile), so no knee has a low end; fastertransformer's misses at 2 req/s
    bound its knee from above there, a pass at 4 above them notwithstanding, and orca's at 4
    (rising through the run: over capacity); vllm passed
    every load: its knee lies above them, bounded by nothing."""
    (group,) = group_runs([load_run(d) for d in find_run_dirs([sweep])])
    found = {s.label: s.knee for s in sustained_loads(group)}
    assert set(found) == {"fastertransformer", "orca", "vllm", HOSTILE}
    assert all(knee.low is None for knee in found.values())
    assert found["fastertransformer"].high == 2.0 and found["orca"].high == 4.0
    assert (found["vllm"].below, found["vllm"].above, found["vllm"].high) == (4.0, None, None)
    assert found[HOSTILE].high == 1.0  # two of ten failed at its only load
    assert {s.label: s.tested for s in sustained_loads(group)}["vllm"] == (1.0, 2.0, 4.0)


def test_a_sweep_s_knee_is_the_search_s_estimate_with_its_interval(tmp_path: Path) -> None:
    """96 requests a run, each run's TTFT rising through it (as a queue's does) and with the
    load: at 4 req/s the rise is a queue growing (over capacity) though every request met the
    SLO, so the knee is a cliff between 2 and 4 req/s, bounded on both sides (the low end
    where the pooled upper bounds cross 1); `fit_knee` gives the same for the same requests,
    and the page says so."""
    from servelab.harness.measure.slo.limits import SLO as Limits
    from servelab.harness.search.estimator import fit_knee
    from servelab.harness.search.probe_ratios import probe_ratios

    for rate, ttft in ((1.0, 0.01), (2.0, 0.02), (4.0, 0.04), (8.0, 0.2)):
        spec = RunSpec(name=f"vllm-{rate:g}", rate=rate, ttft=ttft, slo=SLO, num_requests=96)
        write_run(tmp_path, spec)
    (group,) = group_runs([load_run(d) for d in find_run_dirs([tmp_path])])
    (found,) = sustained_loads(group)
    knee = found.knee
    assert knee.cliff and (knee.below, knee.above, knee.low, knee.high) == (2.0, 4.0, 2.0, 4.0)
    assert found.tested == (1.0, 2.0, 4.0, 8.0)
    rule = Limits.from_config(SLO)
    probes = [probe_ratios(r.x, r.run.request_records, rule) for r in group.runs]
    assert fit_knee(probes, 0.9, 0.95) == knee
    html = build_sweep_report([tmp_path], tmp_path / "report.html").read_text()
    row = 'a cliff between 2 and 4</td><td class="t">[2, 4]</td><td class="t">1, 2, 4, 8</td>'
    assert row in html


def test_normalized_latency_is_one_more_per_request_limit(tmp_path: Path) -> None:
    slo = {"ttft_s": 0.5, "normalized_latency_s": 0.05}
    for name, tpot in (("a", 0.01), ("b", 0.1)):
        write_run(tmp_path, RunSpec(name=name, slo=slo, ttft=0.01, tpot=tpot, summary=False))
    runs = [load_run(tmp_path / n) for n in ("a", "b")]
    (group,) = group_runs(runs)
    rule = group_slo(group)
    assert rule is not None and rule.normalized_latency_s == 0.05
    assert "normalized latency ≤ 0.05 s" in rule.describe()
    shares = [slo_attainment(r.run.request_records, rule) for r in group.runs]
    assert [rule.sustains(share) for share in shares] == [True, False]
    assert group_slo(group_runs([load_run(tmp_path / "a")])[0]) is not None
    write_run(tmp_path, RunSpec(name="c", slo={"ttft_s": None}))
    assert group_slo(group_runs([load_run(tmp_path / "c")])[0]) is None


def test_summary_csv_holds_every_run_with_exact_values(sweep: Path, sweep_html: str) -> None:
    with (sweep / "summary.csv").open() as handle:
        rows = {Path(r["run_dir"]).name: r for r in csv.DictReader(handle)}
    assert len(rows) == 12
    assert rows["failed-4"]["status"] == "failed"
    del rows["failed-4"]
    for name, row in rows.items():
        path = sweep / name / "summary.json"
        if not path.exists():
            assert row["status"] == "incomplete" and row["completed"] == ""
            continue
        summary = json.loads(path.read_text())
        assert row["status"] == "complete"
        assert int(row["completed"]) == summary["completed"]
        assert float(row["output_throughput"]) == summary["output_throughput"]
        assert float(row["ttft_p99"]) == summary["ttft"]["p99"]
        assert float(row["normalized_latency_mean"]) == summary["normalized_latency"]["mean"]
    orca, base = rows["orca-4"], rows["fastertransformer-4"]
    ratio = float(orca["output_throughput"]) / float(base["output_throughput"])
    assert float(orca["output_throughput_vs_baseline"]) == pytest.approx(ratio)
    assert float(base["ttft_p99_vs_baseline"]) == 1.0
    assert rows["failing-1"]["slo_met_share"] == "0.8"
    assert rows["orca-4"]["slo_met_share"] == "0.7"
    assert rows["vllm-1"]["correctness"] == "greedy, 100.0% identical"
    assert rows["vllm-1"]["identical_share"] == "1.0"
    assert rows["crashed-2"]["output_throughput_vs_baseline"] == ""


def test_baseline_choice(sweep: Path, tmp_path: Path) -> None:
    groups = group_runs([load_run(d) for d in find_run_dirs([sweep])])
    assert choose_baseline(groups, None) == "fastertransformer"
    assert choose_baseline(groups, "orca") == "orca"
    with pytest.raises(ConfigError, match="baseline: no run has strategy 'nope'"):
        choose_baseline(groups, "nope")
    write_run(tmp_path, RunSpec(name="x", strategy="zeta"))
    write_run(tmp_path, RunSpec(name="y", strategy="beta"))
    others = group_runs([load_run(d) for d in find_run_dirs([tmp_path])])
    assert choose_baseline(others, None) == "beta"


def test_ablations_get_distinct_labels(tmp_path: Path) -> None:
    mha = RunSpec().axes | {"heads": "mha"}
    runs = [
        load_run(write_run(tmp_path, RunSpec(name="a"))),
        load_run(write_run(tmp_path, RunSpec(name="b", axes=mha))),
        load_run(write_run(tmp_path, RunSpec(name="c", strategy="orca"))),
    ]
    assert strategy_labels(runs) == ["vllm (heads=gqa)", "vllm (heads=mha)", "orca"]


def test_groups_split_by_workload_and_closed_loop_runs_use_concurrency(tmp_path: Path) -> None:
    specs = [
        RunSpec(name="on-1", rate=1.0),
        RunSpec(name="on-2", rate=2.0),
        RunSpec(name="other", workload="code", rate=1.0),
        RunSpec(name="closed-4", process="closed_loop", rate=None, concurrency=4),
        RunSpec(name="closed-8", process="closed_loop", rate=None, concurrency=8),
        RunSpec(name="bare", workload="bulk", process="offline", rate=None),
        RunSpec(name="bare-orca", strategy="orca", workload="bulk", process="offline", rate=None),
    ]
    groups = group_runs([load_run(write_run(tmp_path, s)) for s in specs])
    summary = [(g.title, g.x_kind, [r.x for r in g.runs]) for g in groups]
    assert summary == [
        ("chat · smollm2-135m · online", "rate", [1.0, 2.0]),
        ("code · smollm2-135m · online", "rate", [1.0]),
        ("chat · smollm2-135m · closed loop", "concurrency", [4.0, 8.0]),
        ("bulk · smollm2-135m · offline", "none", [None, None]),
    ]
    bars = group_figures(groups[3], assign_colors(["vllm", "orca"]))
    normalized = bars[0]
    assert [(t.type, t.name, tuple(t.x), t.offsetgroup) for t in normalized.data] == [
        ("bar", "orca", ("orca",), "mean"),
        ("bar", "orca", ("orca",), "p99"),
        ("bar", "vllm", ("vllm",), "mean"),
        ("bar", "vllm", ("vllm",), "p99"),
    ]
    assert normalized.layout.xaxis.type is None
    html = page_text(build_sweep_report([tmp_path], tmp_path / "report.html", None))
    assert "Normalized latency vs concurrency" in html
    assert "Normalized latency by strategy" in html
    assert "These runs have no rate or concurrency: no sustained load." in html


def test_same_workload_with_other_settings_gets_its_own_titled_group(tmp_path: Path) -> None:
    runs = [
        load_run(write_run(tmp_path, RunSpec(name="a", num_requests=6))),
        load_run(write_run(tmp_path, RunSpec(name="b", num_requests=8))),
    ]
    titles = [g.title for g in group_runs(runs)]
    assert titles == [
        "chat · smollm2-135m · online (workload.num_requests=6)",
        "chat · smollm2-135m · online (workload.num_requests=8)",
    ]


def test_colours_are_fixed_per_strategy() -> None:
    assert strategy_color("vllm") == PRESET_COLORS["vllm"] == "#2ca02c"
    assert strategy_color("fastertransformer") == "#1f77b4"
    assert strategy_color("my-strategy") == strategy_color("my-strategy") in PALETTE
    names = [f"custom-{i}" for i in range(len(PALETTE))] + ["vllm", "orca"]
    colors = assign_colors(names)
    assert len(set(colors.values())) == len(names)
    assert assign_colors(reversed(names)) == colors
    assert colors["vllm"] == "#2ca02c" and colors["orca"] == "#ff7f0e"


def test_same_colour_in_every_figure_and_table(sweep_html: str) -> None:
    orca = PRESET_COLORS["orca"]
    traces = re.findall(r'"line":\{"color":"(#[0-9a-f]{6})"[^}]*\},"marker"[^}]*\},"mode"[^}]*'
                        r'"name":"orca"', sweep_html)  # fmt: skip
    assert traces and set(traces) == {orca}
    assert f'<span class="swatch" style="background:{orca}"></span>orca' in sweep_html


def test_report_main_single_run_sweep_and_several_dirs(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    a = write_run(sweep, RunSpec(name="a"))
    b = write_run(sweep, RunSpec(name="b", strategy="orca"))
    assert report_main([a], None, None) == [a / "report.html"]
    assert report_main([sweep], None, "orca") == [sweep.resolve() / "report.html"]
    assert (sweep / "summary.csv").is_file()
    out = tmp_path / "elsewhere"
    out.mkdir()
    assert report_main([a, b], out, None) == [out / "report.html"]
    assert (out / "summary.csv").is_file()
    with pytest.raises(ConfigError, match="paths: .* is not a directory"):
        report_main([tmp_path / "missing"], None, None)
    with pytest.raises(ConfigError, match="baseline"):
        report_main([a], None, "orca")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="paths: no run directories"):
        report_main([empty], None, None)


def test_callback_builds_the_report_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sweep = tmp_path / "multirun"
    write_run(sweep / "0", RunSpec(name="run"))
    callback = SweepReportCallback(baseline=None)
    callback.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    assert (sweep / "report.html").is_file() and (sweep / "summary.csv").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    with caplog.at_level(logging.WARNING, logger="servelab.reports.callback"):
        callback.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(empty)}}}))
    assert "sweep report not built: paths: no run directories" in caplog.text
    assert not (empty / "report.html").exists()


HYDRA_APP = """
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig

sys.path.insert(0, {tests!r})
from reports_rundirs import RunSpec, write_run


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg) -> None:
    write_run(Path(HydraConfig.get().runtime.output_dir), RunSpec(name="run", rate=cfg.rate))


main()
"""
HYDRA_CONFIG = """
rate: 1.0
hydra:
  sweep:
    dir: {sweep}
  callbacks:
    sweep_report:
      _target_: servelab.reports.callback.SweepReportCallback
      baseline: null
"""


def test_a_real_hydra_multirun_ends_with_a_sweep_report(tmp_path: Path) -> None:
    sweep = tmp_path / "multirun"
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text(HYDRA_CONFIG.format(sweep=sweep))
    app = tmp_path / "app.py"
    app.write_text(HYDRA_APP.format(tests=str(Path(__file__).resolve().parent.parent)))
    subprocess.run(
        [sys.executable, str(app), "-m", "rate=1.0,2.0"], cwd=tmp_path, check=True,
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert (sweep / "report.html").is_file()
    with (sweep / "summary.csv").open() as handle:
        rates = sorted(float(row["rate"]) for row in csv.DictReader(handle))
    assert rates == [1.0, 2.0]


def test_weights_quality_columns_and_the_dense_baseline(tmp_path: Path) -> None:
    figures = {"dense": (513.1, 15.9, None), "int4-awq": (162.6, 17.2, 0.75)}
    for weights, (mib, perplexity, agreement) in figures.items():
        summary = {
            "weights": {
                "option": weights,
                "weight_bytes": int(mib * 2**20),
                "perplexity_fp32": perplexity,
                "greedy_agreement": agreement,
            }
        }
        # the dense run's label sorts last: the baseline rule, not the alphabet, must pick it
        heads = "mha" if weights == "dense" else "gqa"
        axes = RunSpec().axes | {"weights": weights, "heads": heads}
        write_run(tmp_path, RunSpec(name=weights, axes=axes, extra_summary=summary))
    groups = group_runs([load_run(d) for d in find_run_dirs([tmp_path])])
    dense = "vllm (heads=mha, weights=dense)"
    assert choose_baseline(groups, None) == dense
    build_sweep_report([tmp_path], tmp_path / "report.html", None)
    with (tmp_path / "summary.csv").open() as handle:
        rows = {r["strategy"]: r for r in csv.DictReader(handle)}
    awq = rows["vllm (heads=gqa, weights=int4-awq)"]
    assert float(awq["perplexity"]) == 17.2 and float(awq["greedy_agreement"]) == 0.75
    assert float(awq["weight_mib"]) == pytest.approx(162.6, abs=1e-6)
    assert float(rows[dense]["perplexity"]) == 15.9
    assert rows[dense]["greedy_agreement"] == ""
    html = (tmp_path / "report.html").read_text()
    assert "perplexity (held-out, fp32)" in html


def test_peers_are_told_apart_by_label_and_backend(tmp_path: Path) -> None:
    """A peer server's run sits beside the engine's with its own label, its backend and the
    p50 as well as the p99 of TTFT and TPOT."""
    write_run(tmp_path, RunSpec(name="engine", strategy="vllm"))
    peer = write_run(tmp_path, RunSpec(name="peer", strategy="vllm", ttft=0.2))
    config = yaml.safe_load((peer / "config.yaml").read_text())
    (peer / "config.yaml").write_text(yaml.safe_dump({**config, "backend": "openai"}))
    meta = json.loads((peer / "meta.json").read_text())
    meta["strategy"] = {"name": "vllm-cpu", "backend": "openai", "model": "smollm2-135m"}
    (peer / "meta.json").write_text(json.dumps(meta))
    html = page_text(build_sweep_report([tmp_path], tmp_path / "report.html", "vllm"))
    assert "TTFT p50 (s)" in html and "TPOT p50 (s)" in html and "openai" in html
    with (tmp_path / "summary.csv").open() as handle:
        rows = {Path(r["run_dir"]).name: r for r in csv.DictReader(handle)}
    assert (rows["engine"]["strategy"], rows["engine"]["backend"]) == ("vllm", "inprocess")
    assert (rows["peer"]["strategy"], rows["peer"]["backend"]) == ("vllm-cpu", "openai")
    for name, row in rows.items():
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        for metric in ("ttft", "tpot"):
            assert float(row[f"{metric}_p50"]) == summary[metric]["p50"]


def test_an_offline_run_shows_no_rate_even_if_its_preset_has_one(tmp_path: Path) -> None:
    write_run(tmp_path, RunSpec(name="offline", process="offline", rate=2.0))
    write_run(tmp_path, RunSpec(name="poisson", process="poisson", rate=2.0))
    build_sweep_report([tmp_path], tmp_path / "report.html", None)
    with (tmp_path / "summary.csv").open() as handle:
        rows = {Path(r["run_dir"]).name: r for r in csv.DictReader(handle)}
    assert (rows["offline"]["rate"], rows["poisson"]["rate"]) == ("", "2.0")


def test_the_pareto_view_puts_each_run_at_its_total_and_per_user_rate(tmp_path: Path) -> None:
    """One point per complete run: x its output throughput, y one over its mean TPOT, joined
    in load order per strategy; shaded above one over the TPOT limit."""
    slo = {"ttft_s": 0.5, "tpot_s": 0.05}
    specs = [
        RunSpec(name=f"{strategy}-{rate:g}", strategy=strategy, rate=rate, tpot=tpot, slo=slo)
        for strategy, tpot in (("orca", 0.02), ("vllm", 0.04))
        for rate in (2.0, 1.0)
    ]
    groups = group_runs([load_run(write_run(tmp_path, spec)) for spec in specs])
    figure = pareto_figure(groups[0], assign_colors(["orca", "vllm"]))
    for trace in figure.data:
        runs = sorted(
            (r for r in groups[0].runs if r.label == trace.name), key=lambda r: r.x or 0.0
        )
        summaries = [r.run.summary for r in runs]
        assert list(trace.x) == [s["output_throughput"] for s in summaries]
        assert list(trace.y) == pytest.approx([1 / s["tpot"]["mean"] for s in summaries])
    assert [t.name for t in figure.data] == ["orca", "vllm"]
    (shade,) = figure.layout.shapes
    assert shade.y0 == pytest.approx(1 / 0.05)
