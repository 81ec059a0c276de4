"""`servelab claims` on the tiny model: each paper claim gets its measurements (gate claims
measured side by side) and the verdict they support; a claims file's mistakes are refused
before any work; an earlier claims run is read again without measuring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.harness.claims.papers import PaperClaim, Verdict, parse_claims_file, verdict_of
from servelab.harness.measure.bootstrap import Outcome
from tests.conftest import servelab

MEASUREMENTS = """
name: tiny-claims
repeats: 2
overrides: [model=dummy-tiny, telemetry.roofline=false, engine.dtype=fp32]
workloads:
  small: [workload=offline, workload.num_requests=2, workload.input_len.lo=8,
          workload.input_len.hi=16, workload.output_len.value=2]
claims:
  - {name: slowed, workload: small, metric: output_throughput,
     of: "orca +engine.test_step_delay_s=0.5", over: orca, at_least: 0.8}
  - {name: waste, workload: small, metric: kv_waste_mean, of: orca, at_most: 1.0}
  - {name: lossless, kind: identical, workload: small, of: vllm, over: orca}
"""


def _claim(name: str, measured: list[str], not_testable: str | None = None) -> str:
    entry = (
        f"  - name: {name}\n    paper: Paper {name}\n    says: It is so.\n    figure: 2x\n"
        f"    conditions: a GPU\n    measured: {measured}\n    differs: a CPU.\n"
    )
    return entry + (f"    not_testable: {not_testable}\n" if not_testable else "")


KNEES = "knees:\n  - {name: sustained, of: vllm, over: orca, at_least: 1.5}\n"
PAPERS = (
    "name: tiny\nmeasurements: measurements.yaml\n"
    + KNEES
    + "claims:\n"
    + "".join(
        [
            _claim("a", ["waste", "lossless"]),
            _claim("b", ["slowed", "waste"]),
            _claim("c", ["slowed"]),
            _claim("d", ["waste"], not_testable="Needs uptraining."),
            _claim("e", ["sustained"]),
        ]
    )
)


def _search_dir(root: Path) -> Path:
    """A knee search's record with vllm at 2 [1.8, 2.2] and orca at 1 [0.9, 1.1]."""

    def knee(strategy: str, rate: float) -> dict:
        return {"strategy": strategy, "ceiling": 4 * rate, "estimate": rate,
                "low": 0.9 * rate, "high": 1.1 * rate, "note": ""}  # fmt: skip

    root.mkdir()
    record = {"settings": {}, "knees": [knee("vllm", 2.0), knee("orca", 1.0)]}
    (root / "search.json").write_text(json.dumps(record))
    return root


def _paper(not_testable: str | None = None) -> PaperClaim:
    return PaperClaim("x", "P", "s", "f", "c", ("m",), "d", not_testable)


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ([Outcome.PASS, Outcome.PASS], Verdict.HOLDS),
        ([Outcome.PASS, Outcome.FAIL], Verdict.IN_PART),
        ([Outcome.PASS, Outcome.INCONCLUSIVE], Verdict.IN_PART),
        ([Outcome.FAIL, Outcome.INCONCLUSIVE], Verdict.DOES_NOT_HOLD),
        ([Outcome.REFUSED], Verdict.DOES_NOT_HOLD),
        ([Outcome.INCONCLUSIVE, Outcome.INCONCLUSIVE], Verdict.UNDECIDED),
    ],
)
def test_a_verdict_follows_its_measurements(outcomes: list[Outcome], expected: Verdict) -> None:
    assert verdict_of(_paper(), outcomes) is expected


def test_a_claim_that_cannot_be_tested_here_says_so_whatever_is_measured() -> None:
    assert verdict_of(_paper("no uptraining"), [Outcome.PASS]) is Verdict.NOT_TESTABLE


def test_a_measurement_the_gate_file_lacks_is_refused(tmp_path: Path) -> None:
    (tmp_path / "measurements.yaml").write_text(MEASUREMENTS)
    path = tmp_path / "papers.yaml"
    with pytest.raises(ConfigError, match=r"claims\[0\] \(a\).measured: 'nope' is not a claim"):
        parse_claims_file(
            "measurements: measurements.yaml\nclaims:\n" + _claim("a", ["nope"]), path, {"waste"}
        )
    with pytest.raises(ConfigError, match=r"claims\[0\] \(a\).says: give it as text"):
        parse_claims_file(
            "measurements: measurements.yaml\nclaims:\n"
            + _claim("a", ["waste"]).replace("    says: It is so.\n", ""),
            path,
            {"waste"},
        )


def _claims(*args: str) -> tuple[int, str, str]:
    """`servelab claims ARGS` in this process: (exit status, stdout, stderr)."""
    return servelab("claims", *args)


@pytest.mark.integration
def test_claims_get_their_measurements_and_verdicts_and_a_rerun_reads_them(
    tmp_path: Path,
) -> None:
    (tmp_path / "measurements.yaml").write_text(MEASUREMENTS)
    (tmp_path / "papers.yaml").write_text(PAPERS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code, table, err = _claims(f"claims={tmp_path / 'papers.yaml'}", f"out={tmp_path / 'out'}")
    finally:
        torch.set_num_threads(threads)
    assert code == 0, err
    record = json.loads((tmp_path / "out" / "claims.json").read_text())
    verdicts = {c["name"]: c["verdict"] for c in record["claims"]}
    assert verdicts == {
        "a": "holds",
        "b": "holds in part",
        "c": "does not hold here",
        "d": "not testable here",
        "e": "undecided here",  # its one measurement needs search=DIR
    }
    assert record["claims"][4]["not_measured"] == ["sustained"]
    b = record["claims"][1]
    assert [m["name"] for m in b["measured"]] == ["slowed", "waste"]
    assert b["measured"][0]["outcome"] == "fail" and b["measured"][0]["high"] < 0.8
    assert record["read_from"] is None and "holds in part" in table
    markdown = (tmp_path / "out" / "claims.md").read_text()
    assert markdown.count("\n| Paper ") == 5 and "**does not hold here**" in markdown
    page = (tmp_path / "out" / "claims.html").read_text()
    assert page.count("<svg") == 6 and "Needs uptraining." in page
    assert "not measured (no search=DIR): sustained" in page
    code, _, err = _claims(
        f"claims={tmp_path / 'papers.yaml'}",
        f"from={tmp_path / 'out'}",
        f"out={tmp_path / 'again'}",
        f"search={_search_dir(tmp_path / 'search')}",
    )
    assert code == 0, err
    again = json.loads((tmp_path / "again" / "claims.json").read_text())
    assert again["read_from"] == str(tmp_path / "out")
    assert [c["verdict"] for c in again["claims"]] == [*list(verdicts.values())[:4], "holds"]
    sustained = again["claims"][4]["measured"][0]
    assert sustained["estimate"] == pytest.approx(2.0)
    assert (sustained["low"], sustained["high"]) == pytest.approx((1.8 / 1.1, 2.2 / 0.9))
    assert sustained["notes"] == ["interval from the two knees' intervals"]


def test_the_shipped_claims_file_names_the_five_papers_and_measurements_that_exist() -> None:
    from servelab.harness.claims.papers import read_measurements_path
    from servelab.harness.gate.fingerprint import machine_fingerprint
    from servelab.harness.gate.spec import load_gate

    path = Path("conf/claims/papers.yaml")
    measurements = load_gate(read_measurements_path(path), machine_fingerprint())
    claims = parse_claims_file(path.read_text(), path, {c.name for c in measurements.claims})
    assert [c.name for c in claims.claims] == ["orca", "vllm", "gqa", "awq", "speculative"]
    assert [k.name for k in claims.knees][:2] == ["orca-sustained-paper", "orca-sustained"]
    assert [c.name for c in claims.claims if c.not_testable] == ["gqa"]


def test_a_knee_ratio_joins_the_intervals_far_ends_and_an_open_side_is_inconclusive(
    tmp_path: Path,
) -> None:
    from servelab.harness.claims.knees import KneeClaim, knee_measurement, read_knees

    record = {
        "knees": [
            {"strategy": "vllm", "ceiling": 4.0, "estimate": 1.5, "low": 1.0, "high": 2.0},
            {"strategy": "ft", "ceiling": 1.0, "estimate": None, "low": None, "high": 0.2},
            {"strategy": "orca", "ceiling": 3.0, "estimate": 0.75, "low": 0.5, "high": 1.0},
        ]
    }
    (tmp_path / "search.json").write_text(json.dumps(record))
    knees = read_knees(tmp_path)
    over_orca = knee_measurement(KneeClaim("x", "vllm", "orca", "at_least", 1.0), knees, tmp_path)
    assert (over_orca["low"], over_orca["high"]) == (1.0, 4.0)  # 1 / 1, 2 / 0.5
    assert over_orca["outcome"] == "pass" and over_orca["estimate"] == pytest.approx(2.0)
    over_ft = knee_measurement(KneeClaim("y", "vllm", "ft", "at_least", 2.0), knees, tmp_path)
    assert (over_ft["low"], over_ft["high"]) == (5.0, None)  # ft has no low end: no upper end
    assert over_ft["outcome"] == "pass" and over_ft["estimate"] is None
    below = knee_measurement(KneeClaim("z", "vllm", "ft", "at_most", 2.0), knees, tmp_path)
    assert below["outcome"] == "fail"
    with pytest.raises(ConfigError, match="has no knee of sglang"):
        knee_measurement(KneeClaim("w", "sglang", "ft", "at_least", 1.0), knees, tmp_path)


def test_a_measurement_with_an_open_interval_shows_the_side_it_has() -> None:
    from servelab.harness.claims.record import measurement_text

    base = {"statement": "sustained rate a / b >= 2", "outcome": "pass", "counted": "pass"}
    assert (
        measurement_text({**base, "estimate": None, "low": 3.71, "high": None})
        == "sustained rate a / b >= 2: ? [3.71, ?], pass"
    )
    assert (
        measurement_text({**base, "estimate": None, "low": None, "high": None})
        == "sustained rate a / b >= 2: no value, pass"
    )
