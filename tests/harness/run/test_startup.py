"""Start-up: this machine's peaks are calibrated before the KV cache is allocated, so the
calibration's buffers fit beside the weights even when the KV cache is to take nearly all the
memory left (on a GPU, engine.kv_budget near the whole device); the step hooks a CPU engine
runs (no GPU timing: there is no GPU)."""

from __future__ import annotations

from servelab.harness.run import build, startup
from servelab.harness.run.compose import compose
from servelab.harness.run.spec import engine_spec


def test_peaks_are_calibrated_before_the_kv_cache_is_allocated(monkeypatch) -> None:
    order: list[str] = []
    measure, allocate = startup.measure_peaks, build.allocate_kv_cache

    def measured(*args, **kwargs):
        order.append("peaks")
        return measure(*args, **kwargs)

    def allocated(*args, **kwargs):
        order.append("kv cache")
        return allocate(*args, **kwargs)

    monkeypatch.setattr(startup, "measure_peaks", measured)
    monkeypatch.setattr(build, "allocate_kv_cache", allocated)
    cfg = compose(["model=dummy-tiny", "engine.dtype=fp32"])
    started = startup.start_engine(engine_spec(cfg), clock=lambda: 0.0, progress=False)
    assert order == ["peaks", "kv cache"]
    assert started.roofline is not None


def test_a_cpu_engine_times_no_gpu() -> None:
    cfg = compose(["model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false"])
    started = startup.start_engine(engine_spec(cfg), clock=lambda: 0.0, progress=False)
    assert not any(isinstance(h, startup.GpuTimeHook) for h in started.step_hooks())
    assert started.engine.runner.gpu_seconds() is None
