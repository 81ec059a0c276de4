"""`servelab knee DIR...` on rate runs of the tiny model on disk: one knee per strategy from
their requests' SLO ratios, as lines and JSON, against the SLO they recorded or one given; bad
input refused in one line before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.base.errors import ConfigError
from servelab.commands.knee import main
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run

DELAY = 0.03  # every step delayed: the step time dwarfs the tiny model's own
RATES = (0.5, 2.0, 8.0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("probes")
    for rate in RATES:
        cfg = compose([
            "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false",
            "strategy=vllm", "workload=random", "workload.num_requests=24",
            "workload.input_len.dist=fixed", "workload.input_len.value=8",
            "workload.output_len.value=6", "engine.max_batch_size=8",
            "workload.arrival.process=poisson", f"workload.arrival.rate={rate}",
            f"+engine.test_step_delay_s={DELAY}",
            f"slo.e2e_s={20 * DELAY}", "replay.skip_idle=true",
        ])  # fmt: skip
        run(cfg, root / f"rate-{rate:g}", progress=False)
    return root


def test_the_knee_of_rate_runs_on_disk(runs: Path, capsys: pytest.CaptureFixture) -> None:
    out = runs / "knee.json"
    main([str(runs), "--json", str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert "E2E ≤ 0.6 s" in printed[0] and printed[1].startswith("knee: where the 0.9-quantile")
    result = json.loads(out.read_text())
    (name,) = result["knees"]
    assert name == "vllm/random/dummy-tiny" and printed[2].startswith(name)
    knee = result["knees"][name]
    assert [r["rate"] for r in knee["rates"]] == list(RATES)
    assert all(r["requests"] == 24 for r in knee["rates"])
    assert knee["next_rate"] is not None and "next probe at" in printed[2]


def test_a_slo_given_judges_the_same_runs_again(runs: Path, capsys) -> None:
    main([str(runs), "--slo", f"e2e_s={40 * DELAY}", "--json", str(runs / "loose.json")])
    loose = json.loads((runs / "loose.json").read_text())
    main([str(runs), "--json", str(runs / "tight.json")])
    tight = json.loads((runs / "tight.json").read_text())
    name = "vllm/random/dummy-tiny"
    for a, b in zip(loose["knees"][name]["rates"], tight["knees"][name]["rates"], strict=True):
        assert a["quantile"] == pytest.approx(b["quantile"] / 2)  # half the ratio, every rate


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], r"^knee: no DIR given"),
        (["/no/such/dir"], r"^knee: /no/such/dir is not a directory"),
        ([".", "--confidence", "1.5"], r"^knee\.confidence: 1\.5 must be a share"),
        (["--slo", "ttft_s"], r"^knee"),
    ],
)
def test_bad_input_is_one_line_before_any_work(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        main(args)


def test_a_folder_with_no_rate_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^knee: no rate run"):
        main([str(tmp_path)])


def test_a_simulated_run_is_a_knee_of_its_own(runs: Path, tmp_path: Path) -> None:
    """A search's prediction lies beside its probes: simulated runs of the same strategy,
    workload and model are their own group, named by their backend."""
    import shutil

    import yaml

    simulated = tmp_path / "predicted" / "rate-2"
    shutil.copytree(runs / "rate-2", simulated)
    config = yaml.safe_load((simulated / "config.yaml").read_text())
    (simulated / "config.yaml").write_text(yaml.safe_dump({**config, "backend": "simulated"}))
    for rate in RATES:
        shutil.copytree(runs / f"rate-{rate:g}", tmp_path / f"rate-{rate:g}")
    out = tmp_path / "knee.json"
    main([str(tmp_path), "--json", str(out)])
    knees = json.loads(out.read_text())["knees"]
    assert set(knees) == {"vllm/random/dummy-tiny", "vllm/random/dummy-tiny/simulated"}
    assert [r["rate"] for r in knees["vllm/random/dummy-tiny"]["rates"]] == list(RATES)
    assert [r["rate"] for r in knees["vllm/random/dummy-tiny/simulated"]["rates"]] == [2.0]
