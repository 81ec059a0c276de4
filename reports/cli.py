"""`servelab report DIR [DIR ...]`: the report for one run, or the sweep report for several.

One run directory gives its own `report.html`; several directories, or a directory that
holds runs below it (a sweep), give a sweep report, by default in the directory common
to all of them. Every path is checked before anything is built.
"""

from __future__ import annotations

import os
from pathlib import Path

from servelab.base.errors import ConfigError
from servelab.reports.load import is_run_dir
from servelab.reports.run_report import REPORT_NAME, build_run_report
from servelab.reports.sweep_report import build_sweep_report


def report_main(paths: list[Path], out: Path | None, baseline: str | None) -> list[Path]:
    """Build the report(s) for `paths`; return the paths of the HTML files written."""
    if not paths:
        raise ConfigError("paths", "give at least one run or sweep directory")
    missing = [p for p in paths if not p.is_dir()]
    if missing:
        raise ConfigError(
            "paths", f"{missing[0]} is not a directory; pass run or sweep directories"
        )
    if out is not None and out.is_dir():
        out = out / REPORT_NAME
    if len(paths) == 1 and is_run_dir(paths[0]):
        if baseline is not None:
            raise ConfigError("baseline", "a single run has nothing to compare; drop --baseline")
        return [build_run_report(paths[0], out)]
    common = Path(os.path.commonpath([p.resolve() for p in paths]))
    return [build_sweep_report(paths, out or common / REPORT_NAME, baseline)]
