"""The declared fields (`harness/run/schema.py`): each is in the config tree, each bad value is
one line naming its field as soon as a tree is composed, whichever node the verb reads, and
the readers read what the schema allows."""

from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf

from servelab.base.errors import ConfigError
from servelab.commands.cli import main
from servelab.harness.run.compose import compose
from servelab.harness.run.schema import FLAG, SCHEMA, checked
from servelab.harness.run.spec import run_spec

OWN_PARSERS = ("model", "workload", "strategy", "slo")  # presets' shapes; SLO.of_config


def test_the_schema_is_the_tree() -> None:
    """Every field of the tree's own nodes (a node's keys, `plan.engine` one field) is
    declared, and every declared field is in it: a new field without its declaration fails."""
    tree = OmegaConf.to_container(compose([]))
    fields = set()
    for name, node in tree.items():
        if name in OWN_PARSERS:
            continue
        fields |= {f"{name}.{key}" for key in node} if isinstance(node, dict) else {name}
    assert fields == set(SCHEMA)


@pytest.mark.parametrize("path", sorted(SCHEMA))
def test_a_bad_value_fails_at_compose(path: str) -> None:
    bad = "nope" if SCHEMA[path] is FLAG else "true"
    with pytest.raises(ConfigError) as error:
        compose([f"{path}={bad}"])
    shown = "'nope'" if bad == "nope" else "True"
    assert str(error.value).startswith(f"{path}: {shown} must be ")


def test_one_name_is_a_list_of_one() -> None:
    """`search.strategies=vllm` is the list [vllm], not its letters."""
    cfg = compose(["search.strategies=vllm", "plan.hardware=h100-80gb"])
    assert checked(cfg.search, "search.strategies") == ("vllm",)
    assert checked(cfg.plan, "plan.hardware") == ("h100-80gb",)
    assert checked(compose([]).search, "search.strategies") == ("fastertransformer", "orca", "vllm")


@pytest.mark.parametrize(
    ("override", "fails"),
    [
        ("serve.port=0", False),
        ("serve.port=-1", True),
        ("serve.port=65536", True),
        ("search.confidence=0.99", False),
        ("search.confidence=1", True),
        ("plan.memory_utilization=1", False),
        ("plan.memory_utilization=0", True),
        ("plan.price_per_hour=0", False),
        ("endpoint.workers=auto", False),
        ("endpoint.workers=3", False),
        ("endpoint.workers=0", True),
        ("endpoint.metrics_period_s=null", False),
        ("endpoint.metrics_period_s=0", True),
        ("engine.attention=triton", False),
        ("engine.seed=-3", False),
        ("engine.seed=1.5", True),
        ("replay.skip_idle=1", True),
        ("profile.first_step=0", False),
        ("profile.num_steps=0", True),
        ("search.span=0", False),
        ("search.span=-1", True),
    ],
)
def test_each_kind_of_field_bounds(override: str, fails: bool) -> None:
    if fails:
        with pytest.raises(ConfigError, match=override.partition("=")[0]):
            compose([override])
    else:
        compose([override])


def test_a_reader_checks_what_it_is_handed() -> None:
    """A tree built without `compose` (a recorded config, a probe's copy) is checked by the
    reader of its node, against the same declaration."""
    cfg = compose([])
    cfg.replay.skip_idle = "maybe"
    with pytest.raises(ConfigError, match="replay.skip_idle: 'maybe' must be true or false"):
        run_spec(cfg)
    assert checked({}, "engine.warmup", True) is True


def test_a_run_stops_on_a_field_it_does_not_read(monkeypatch, capsys, tmp_path) -> None:
    """`servelab` (a run) with a bad search field: one line, exit 2, nothing run."""
    run_dir = tmp_path / "run"
    argv = ["servelab", "search.budget_s=abc", f"hydra.run.dir={run_dir}"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == ["servelab: error: search.budget_s: 'abc' must be seconds > 0"]
    assert not (run_dir / "requests.jsonl").exists()
