"""`servelab calibrate`: this machine's measured matmul and copy peaks (MFU/MBU denominators)."""

from __future__ import annotations

from servelab.harness.run.compose import compose

SUMMARY = "measure this machine's matmul and memory-copy peaks (cached per host)"
USAGE = """usage: servelab calibrate [--refresh] [engine.device=cpu|cuda]

Prints the cached peaks, measuring those not cached yet; --refresh measures again (a new
measurement replaces a cached peak only when it is higher: load only ever slows a run)."""


def main(args: list[str]) -> None:
    from servelab.harness.measure.calibrate import calibrate_main
    from servelab.harness.run.settings import DTYPES, cache_dir_of, resolve_device

    refresh = "--refresh" in args
    cfg = compose([a for a in args if a != "--refresh"])
    device = resolve_device(str(cfg.engine.device))
    dtypes = [DTYPES["fp32"], DTYPES["bf16"]] + ([DTYPES["fp16"]] if device.type == "cuda" else [])
    print(calibrate_main(device, dtypes, cache_dir_of(cfg), refresh))
