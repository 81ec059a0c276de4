"""The compiled CPU operators, one build per ISA level: every level this CPU runs is built and
loaded beside the others under its own namespace, dispatch takes the build of its level, and
every level above this CPU's is at least compiled (its branches cannot run here, but a CPU of
that level runs them, and no one else would see them fail to compile)."""

from __future__ import annotations

import threading

import pytest
import torch

from servelab.kernels.capabilities import LEVELS, capabilities, runnable_levels
from servelab.kernels.cpu_build import (
    _build,
    _exclusive,
    build_name,
    compile_check,
    cpu_ops,
    extensions_root,
    level_flags,
    levels_not_run,
    namespace,
)
from tests.conftest import CpuBuild


def test_every_level_has_its_flags_and_namespace() -> None:
    assert [namespace(level) for level in LEVELS] == [
        "servelab_baseline",
        "servelab_avx2",
        "servelab_avx512",
        "servelab_avx512_bf16",
    ]
    for level in LEVELS:
        assert f"-DSERVELAB_OPS={namespace(level)}" in level_flags(level)
        assert "-march=native" not in level_flags(level)  # a build is the same on every CPU
    with pytest.raises(ValueError, match="unknown ISA level 'avx3'"):
        level_flags("avx3")


def test_each_runnable_build_registers_its_own_operators(cpu_build: CpuBuild) -> None:
    assert cpu_build.ops is getattr(torch.ops, namespace(cpu_build.level))
    assert cpu_ops() is cpu_build.ops  # dispatch, lowered to this level, takes this build
    with_panels = cpu_build.level == "avx512-bf16"
    assert cpu_build.ops.panel_products_available() is with_panels
    assert hasattr(cpu_build.ops, "flash_attention") is with_panels


def test_every_runnable_build_loads_side_by_side() -> None:
    loaded = [cpu_ops(level) for level in runnable_levels()]
    assert all(ops is not None for ops in loaded)
    assert len({id(ops) for ops in loaded}) == len(loaded)
    assert cpu_ops() is cpu_ops(capabilities().level)


@pytest.mark.last  # the session's prebuild compiles these meanwhile, on the other core
@pytest.mark.parametrize("level", levels_not_run() or ["none"])
def test_levels_above_this_cpu_compile(level: str) -> None:
    if level == "none":
        pytest.skip("this CPU runs every level: each build is loaded and tested")
    assert compile_check(level) is None


def test_a_build_killed_midway_does_not_stall_the_next(cpu_build: CpuBuild) -> None:
    """A build interrupted (Ctrl-C, a timeout) leaves torch's `lock` file in its directory,
    and torch waits for as long as it exists. The next build of that level, holding the
    cross-process build lock, removes it and loads."""
    name = build_name(cpu_build.level)
    build_dir = extensions_root() / "servelab" / name
    with _exclusive(build_dir.with_name(f"{name}.building")):  # no other worker mid-build
        (build_dir / "lock").touch()
    outcome: list[str | None] = []
    loader = threading.Thread(target=lambda: outcome.append(_build(cpu_build.level)), daemon=True)
    loader.start()
    loader.join(300)
    assert outcome == [None] and not (build_dir / "lock").exists()


def test_a_build_made_before_is_loaded_without_compiling(
    cpu_build: CpuBuild, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh clone with its own environment finds the build of these sources, flags and
    torch version and loads it: torch's build (which would compile it all again, since the
    environment's include paths are in each command) is not called."""
    from torch.utils import cpp_extension

    def no_compiling(**kwargs: object) -> None:
        raise AssertionError(f"compiled {kwargs['name']} again")

    monkeypatch.setattr(cpp_extension, "load", no_compiling)
    assert _build(cpu_build.level) is None
