"""`servelab report DIR...`: the HTML report of one run, or the sweep report of several."""

from __future__ import annotations

from pathlib import Path

from servelab.base.errors import ConfigError

SUMMARY = "HTML report of a run, or the comparison report of several runs or sweeps"
USAGE = """usage: servelab report DIR [DIR ...] [--out FILE] [--baseline STRATEGY]

One run directory gives its report.html; several, or a sweep directory, give a sweep
report (throughput against load, latency CDFs, ratios against the baseline strategy)."""


def main(args: list[str]) -> None:
    from servelab.reports.cli import report_main

    options: dict[str, str | None] = {"--out": None, "--baseline": None}
    for option in options:
        if option in args:
            index = args.index(option)
            if index + 1 >= len(args):
                raise ConfigError("report", f"{option} needs a value; {USAGE.splitlines()[0]}")
            options[option] = args[index + 1]
            args = args[:index] + args[index + 2 :]
    if not args:
        raise ConfigError("report", USAGE.splitlines()[0])
    out = Path(options["--out"]) if options["--out"] else None
    for path in report_main([Path(a) for a in args], out, options["--baseline"]):
        print(path)
