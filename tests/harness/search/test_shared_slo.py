"""`search.slo_from`: a search judged against the SLO an earlier search recorded, every limit
replaced, its attainment share kept, its reference floor set beside the earlier one's; and a
search that measured its speed drift widens its fitted knees by it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from servelab.base.errors import ConfigError
from servelab.harness.measure.slo.earlier_run import SourceSLO, judged_record, read_source, with_slo
from servelab.harness.measure.slo.limits import SLO

TINY = [
    "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false", "workload=random",
    "workload.input_len.dist=fixed", "workload.input_len.value=8",
    "workload.output_len.value=6", "search.strategies=[fastertransformer,vllm]",
    "search.predict=false",
    "search.floor_requests=3", "search.ceiling_requests=4", "search.budget_s=0.01",
]  # fmt: skip


def write_search(directory: Path, record: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "search.json").write_text(json.dumps(record))
    return directory


def recorded(slo: SLO, strategy: str = "fastertransformer", tpot_s: float = 0.03) -> dict:
    return {
        "settings": {"strategies": [strategy, "vllm"]},
        "slo": judged_record(slo),
        "drift": {"before_s": tpot_s, "after_s": tpot_s, "change": 0.0},
    }


def test_the_recorded_slo_is_read_back_whole(tmp_path) -> None:
    slo = SLO(ttft_s=0.2548, ttft_per_prompt_token_s=0.01117, normalized_latency_s=0.06436)
    source = read_source(str(write_search(tmp_path, recorded(slo))), 0.9)
    assert source.path == tmp_path / "search.json"
    assert source.limits == {
        "ttft_s": 0.2548,
        "tpot_s": None,
        "e2e_s": None,
        "normalized_latency_s": 0.06436,
        "ttft_per_prompt_token_s": 0.01117,
    }
    assert (source.attainment, source.reference_strategy) == (0.9, "fastertransformer")
    assert source.reference_tpot_s == 0.03
    assert read_source(str(tmp_path / "search.json"), 0.9) == source


def test_every_limit_of_this_search_is_replaced_by_the_source_s() -> None:
    """A limit the source set none of is set to null, not left at this search's value."""
    source = SourceSLO(
        Path("s/search.json"),
        {"ttft_s": 0.25, "tpot_s": None, "e2e_s": None, "normalized_latency_s": 0.0644,
         "ttft_per_prompt_token_s": 0.0112},
        0.9, "fastertransformer", None,
    )  # fmt: skip
    given = OmegaConf.create({"slo": {"tpot_s": 0.1, "e2e_s": 9.0, "ttft_s": 2.0}})
    judged = with_slo(given, source.limits)
    assert OmegaConf.to_container(judged.slo) == source.limits
    assert given.slo.tpot_s == 0.1  # a copy: the given config is left as it was
    assert source.line() == (
        "SLO from s/search.json: A request meets the SLO when TTFT ≤ 0.25 s + 0.0112 s per "
        "prompt token, normalized latency ≤ 0.0644 s (latencies from arrival); a run sustains "
        "its load when at least 90% of its requests do (failed and rejected requests count as "
        "misses)."
    )


def test_the_speed_against_the_source_is_the_same_strategy_s_floor_only() -> None:
    source = SourceSLO(Path("s"), {"ttft_s": 1.0}, 0.9, "fastertransformer", 0.025)
    speed = source.speed_against("fastertransformer", {"tpot": {"p50": 0.03}})
    assert speed is not None and speed.change == pytest.approx(0.2)
    assert speed.line() == (
        "machine speed against the search the SLO is from: one request at a time, median TPOT "
        "25 ms then, 30 ms now (+20.0%); a slower machine sustains less under the same limits, "
        "and every knee moves with it"
    )
    assert source.speed_against("vllm", {"tpot": {"p50": 0.03}}) is None
    assert source.speed_against("fastertransformer", {"tpot": {"p50": None}}) is None


@pytest.mark.parametrize(
    ("record", "attainment", "message"),
    [
        (None, 0.9, "does not exist; give a search's out_dir"),
        ({"knees": []}, 0.9, "records no SLO"),
        ({"slo": judged_record(SLO())}, 0.9, "records an SLO without limits"),
        ({"slo": {"ttft_s": -1}}, 0.9, r"slo\.ttft_s: -1 must be a positive"),
        ({"slo": judged_record(SLO(tpot_s=0.1))}, 0.95, r"give \+slo\.attainment=0\.9 to"),
    ],
)
def test_a_source_that_cannot_be_repeated_is_refused(
    tmp_path, record: dict | None, attainment: float, message: str
) -> None:
    if record is not None:
        write_search(tmp_path, record)
    with pytest.raises(ConfigError, match=rf"search\.slo_from: .*{message}"):
        read_source(str(tmp_path / "none" if record is None else tmp_path), attainment)


def test_a_repeat_judges_every_probe_against_the_first_search_s_slo(tmp_path) -> None:
    """A scaled search, then the same search with `search.slo_from` on it (refused with other
    limits given beside it, before any run): every probe of the repeat ran under the first
    search's limits exactly, both record the one SLO, and the repeat sets its reference floor
    beside the first's and measures its own drift."""
    from servelab.harness.run.compose import compose
    from servelab.harness.run.run import run
    from servelab.harness.search.knee_search import search

    def run_quietly(cfg, d):
        return run(cfg, d, progress=False)

    first_dir, repeat_dir = tmp_path / "first", tmp_path / "repeat"
    scaled = ["search.slo_scale.ttft_s=40", "search.slo_scale.normalized_latency_s=20"]
    search([*TINY, *scaled, f"search.out_dir={first_dir}"], compose, run_quietly)
    first = json.loads((first_dir / "search.json").read_text())
    said: list[str] = []
    repeat_of_it = [*TINY, f"search.slo_from={first_dir}", f"search.out_dir={repeat_dir}"]
    for other in (scaled, ["slo.tpot_s=5"]):  # a second source for a limit: refused, not run
        with pytest.raises(ConfigError, match=r"search\.slo_from: each limit has one source"):
            search([*repeat_of_it, *other], compose, run_quietly)
    assert not repeat_dir.exists()
    search(repeat_of_it, compose, run_quietly, say=said.append)
    out = "\n".join(said)
    repeat = json.loads((repeat_dir / "search.json").read_text())
    assert repeat["slo"] == first["slo"]
    assert first["slo"]["ttft_s"] is not None and first["slo"]["tpot_s"] is None
    assert f"SLO from {first_dir / 'search.json'}: A request meets the SLO when TTFT" in out
    assert "SLO scaled from" not in out
    for probe in ("reference-floor", "floor", "ceiling", "reference-floor-end"):
        slo = OmegaConf.to_container(
            OmegaConf.load(repeat_dir / "fastertransformer" / probe / "config.yaml").slo
        )
        assert {k: slo[k] for k in first["slo"] if k != "attainment"} == {
            k: v for k, v in first["slo"].items() if k != "attainment"
        }, probe
    before = repeat["speed_against_slo_source"]
    assert before["before_s"] == first["drift"]["before_s"]
    reference = json.loads(
        (repeat_dir / "fastertransformer/reference-floor/summary.json").read_text()
    )
    assert before["after_s"] == reference["tpot"]["p50"] == repeat["drift"]["before_s"]
    assert "machine speed against the search the SLO is from" in out


def test_a_search_whose_machine_slowed_widens_its_fitted_knees_by_the_drift(tmp_path) -> None:
    """The same simulated search twice, deterministic, except that in the second the
    reference floor after the last probe runs on a step-cost model 25% slower (a machine
    that slowed while the search ran): the second records a +25% drift and every fitted
    knee's interval is the first's moved out by 1.25 on each side."""
    from servelab.harness.run.compose import compose
    from servelab.harness.run.run import run
    from servelab.harness.run.simulate.cost_model import StepCostModel
    from servelab.harness.search.knee_search import search

    per_unit = {"step": 0.004, "seqs": 0.0003, "tokens": 0.0001, "logits_rows": 0.0002}
    steady, slowed = tmp_path / "steady.json", tmp_path / "slowed.json"
    StepCostModel(per_unit, 0.0, {"model": "dummy-tiny"}).save(steady)
    StepCostModel({k: 1.25 * v for k, v in per_unit.items()}, 0.0, {}).save(slowed)
    overrides = [
        "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false", "workload=random",
        "workload.input_len.dist=uniform_range", "workload.input_len.lo=8",
        "workload.input_len.hi=48", "workload.output_len.dist=uniform_range",
        "workload.output_len.lo=4", "workload.output_len.hi=60", "backend=simulated",
        f"simulate.cost_model={steady}", "search.strategies=[vllm]", "search.requests=48",
        "search.resolution=0.5", "search.max_requests=96", "search.budget_s=600",
        "search.slo_scale.ttft_s=3", "search.slo_scale.normalized_latency_s=2",
    ]  # fmt: skip

    def searched(out_dir: Path, end_cost: Path) -> dict:
        def run_on(cfg, run_dir: Path) -> dict:
            if run_dir.name == "reference-floor-end":
                cfg.simulate.cost_model = str(end_cost)
            return run(cfg, run_dir, progress=False)

        search([*overrides, f"search.out_dir={out_dir}"], compose, run_on)
        return json.loads((out_dir / "search.json").read_text())

    first, second = searched(tmp_path / "a", steady), searched(tmp_path / "b", slowed)
    assert first["drift"]["change"] == 0.0
    assert second["drift"]["change"] == pytest.approx(0.25)
    (fit,), (wide,) = (s["knees"] for s in (first, second))
    assert fit is not None and fit["low"] is not None and fit["high"] is not None
    assert (fit["widened_by"], wide["widened_by"]) == (1.0, pytest.approx(1.25))
    assert wide["estimate"] == fit["estimate"]
    for knee in (fit, wide):  # resolved says the recorded (widened) interval is within 50%
        assert knee["resolved"] == (knee["high"] / knee["low"] <= 1.5)
    assert (wide["low"], wide["high"]) == (
        pytest.approx(fit["low"] / 1.25),
        pytest.approx(fit["high"] * 1.25),
    )


def test_a_scaled_limit_given_again_is_refused_others_combine() -> None:
    from servelab.harness.run.compose import compose
    from servelab.harness.search.knee_search import SearchSettings

    for given in ("slo.ttft_s=1", "slo.ttft_per_prompt_token_s=0.01"):  # TTFT's scale sets both
        with pytest.raises(ConfigError, match=r"slo\.ttft\S*: each limit has one source"):
            SearchSettings.of(compose(["search.slo_scale.ttft_s=8", given]))
    settings = SearchSettings.of(compose(["search.slo_scale.ttft_s=8", "slo.tpot_s=0.2"]))
    assert settings.slo_scale == {"ttft_s": 8.0}
