"""The capability probe: the level each CPU gets, the override, and what dispatch reads of it.

Flag sets are those /proc/cpuinfo reports on the CPUs servelab has been developed on (Zen 3:
AVX2 only; Zen 4: AVX-512 with BF16; a Xeon with AMX) and on a CPU without AVX2, so each
machine's answer is checked on every machine.
"""

from __future__ import annotations

import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.harness.run import settings
from servelab.kernels import capabilities as caps
from servelab.kernels.capabilities import LEVELS, OVERRIDE_ENV, capabilities, native_level
from servelab.kernels.paths import RunKernels, kernel_record
from tests.conftest import CpuBuild

V3 = {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe", "xsave"}
V4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
ZEN3 = frozenset({"sse4_2", *V3})
ZEN4 = frozenset({*ZEN3, *V4, "avx512_bf16", "avx512vbmi", "avx512_vnni"})
SAPPHIRE_RAPIDS = frozenset({*ZEN4, "amx_tile", "amx_bf16", "avx512_fp16"})
SKYLAKE_X = frozenset({*ZEN3, *V4})


@pytest.mark.parametrize(
    ("flags", "machine", "level"),
    [
        (ZEN3, "x86_64", "avx2"),
        (ZEN4, "x86_64", "avx512-bf16"),
        (SAPPHIRE_RAPIDS, "x86_64", "avx512-bf16"),
        (SKYLAKE_X, "x86_64", "avx512"),
        (frozenset({"sse4_2", "avx"}), "x86_64", "baseline"),
        (ZEN3 - {"fma"}, "x86_64", "baseline"),  # one flag of x86-64-v3 missing
        (frozenset({*ZEN3, "avx512f"}), "x86_64", "avx2"),  # AVX-512 F alone is not v4
        (frozenset({"asimd", "bf16", "sve"}), "aarch64", "baseline"),
    ],
)
def test_each_cpu_gets_the_highest_level_whose_every_flag_it_has(flags, machine, level) -> None:
    assert native_level(flags, machine) == level


def test_the_override_lowers_the_level_and_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OVERRIDE_ENV, "baseline")
    capabilities.cache_clear()
    probe = capabilities()
    assert probe.level == "baseline" and probe.override == "baseline"
    assert not probe.onednn_bf16 and not probe.bf16_native  # as a baseline CPU answers
    assert probe.record()["override"] == "baseline"
    assert caps.runnable_levels() == ("baseline",)


@pytest.mark.parametrize(
    ("value", "message"),
    [("avx3", "'avx3' is not one of: native, baseline"), ("AVX2", "'AVX2' is not one of")],
)
def test_an_unknown_override_is_a_config_error(monkeypatch, value: str, message: str) -> None:
    monkeypatch.setenv(OVERRIDE_ENV, value)
    capabilities.cache_clear()
    with pytest.raises(ConfigError, match=f"{OVERRIDE_ENV}: {message}"):
        capabilities()


def test_an_override_above_this_cpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(caps, "cpu_flags", lambda: ZEN3)
    monkeypatch.setattr(caps.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv(OVERRIDE_ENV, "avx512")
    capabilities.cache_clear()
    with pytest.raises(ConfigError, match="avx512 is above this CPU's level \\(avx2\\)"):
        capabilities()
    monkeypatch.setenv(OVERRIDE_ENV, "native")
    capabilities.cache_clear()
    assert capabilities().level == "avx2" and capabilities().override == "native"


def _probe_on(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str]) -> caps.Capabilities:
    monkeypatch.setattr(caps, "cpu_flags", lambda: flags)
    monkeypatch.setattr(caps.platform, "machine", lambda: "x86_64")
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    capabilities.cache_clear()
    return capabilities()


def test_bf16_is_native_only_at_the_bf16_level(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _probe_on(monkeypatch, ZEN4).bf16_native
    assert _probe_on(monkeypatch, SAPPHIRE_RAPIDS).fp16_native
    assert not _probe_on(monkeypatch, SKYLAKE_X).bf16_native
    assert not _probe_on(monkeypatch, ZEN3).bf16_native
    monkeypatch.setenv(OVERRIDE_ENV, "avx2")  # a Zen 4 run as an AVX2 machine
    monkeypatch.setattr(caps, "cpu_flags", lambda: ZEN4)
    capabilities.cache_clear()
    assert not capabilities().bf16_native


CPU = torch.device("cpu")


def test_auto_dtype_is_bf16_only_where_the_cpu_multiplies_it(monkeypatch) -> None:
    _probe_on(monkeypatch, ZEN4)
    name, why = settings.choose_dtype("auto", CPU)
    assert (name, why) == ("bf16", "auto: this CPU multiplies bf16 natively (level avx512-bf16)")
    _probe_on(monkeypatch, ZEN3)
    name, why = settings.choose_dtype("auto", CPU)
    assert name == "fp32" and why.startswith("auto: no native bf16 product at level avx2")
    assert settings.choose_dtype("fp32", CPU) == ("fp32", "set")


def test_auto_dtype_on_a_gpu_is_the_models_own_bf16() -> None:
    cuda = torch.device("cuda")  # choosing touches no device: this runs without one
    assert settings.choose_dtype("auto", cuda) == (
        "bf16", "auto: the GPU default, the model's own dtype"
    )  # fmt: skip
    assert settings.choose_dtype("fp16", cuda) == ("fp16", "set")


def test_an_explicit_bf16_without_native_products_runs_with_a_note(monkeypatch, caplog) -> None:
    _probe_on(monkeypatch, ZEN3)
    name, why = settings.choose_dtype("bf16", CPU)
    assert name == "bf16" and "no native bf16 product at level avx2" in why
    assert "runs correctly but slowly" in caplog.text
    with pytest.raises(ConfigError, match="engine.dtype: 'fp8' is not one of auto"):
        settings.choose_dtype("fp8", CPU)


def test_a_visible_gpu_that_torch_cannot_use_is_said(monkeypatch, caplog) -> None:
    monkeypatch.setattr(caps, "gpu_visible", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    capabilities.cache_clear()
    assert settings.resolve_device("auto") == CPU
    assert "a GPU is visible (nvidia-smi or /dev/nvidia*) but torch" in caplog.text
    monkeypatch.setattr(caps, "gpu_visible", lambda: False)
    capabilities.cache_clear()
    assert settings.cpu_fallback_note() is None


def test_each_level_is_a_known_build_level() -> None:
    assert capabilities().level in LEVELS and capabilities().native_level in LEVELS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_run_record_names_each_operations_path(cpu_build: CpuBuild, dtype) -> None:
    run = RunKernels(CPU, dtype, "cpu", dtype == torch.bfloat16, True, ("torch-packed",) * 7)
    record = kernel_record(run)
    paths = record["paths"]
    assert record["level"] == cpu_build.level and record["build"] == "built"
    assert set(paths) == {
        "prefill_attention",
        "decode_attention",
        "dense_linear",
        "fused_layer",
        "int4_matmul",
    }
    bf16 = dtype == torch.bfloat16
    own_flash = bf16 and cpu_build.level == "avx512-bf16"
    assert paths["prefill_attention"]["path"] == (
        "compiled flash_attention (vdpbf16ps)" if own_flash else "torch's CPU flash kernel"
    )
    assert paths["decode_attention"]["path"].startswith("compiled cpu_paged_attention")
    if not bf16:
        assert paths["dense_linear"]["path"] == "compiled panel_linear_f32 at every row count"
    elif not capabilities().onednn_bf16:
        assert paths["dense_linear"]["path"] == "compiled matvec at every row count"
    assert paths["fused_layer"]["path"] == ("compiled decode_layer" if bf16 else "layer modules")
