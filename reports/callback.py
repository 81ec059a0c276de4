"""A Hydra callback that builds the sweep report when a multirun ends.

Enable it in `conf/config.yaml`:

    hydra:
      callbacks:
        sweep_report:
          _target_: servelab.reports.callback.SweepReportCallback
          baseline: null

It writes `report.html` and `summary.csv` into `hydra.sweep.dir`. A report that cannot be
built never fails the sweep: the measured runs are what matter, so it logs a warning.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from servelab.reports.run_report import REPORT_NAME
from servelab.reports.sweep_report import build_sweep_report

log = logging.getLogger(__name__)


class SweepReportCallback(Callback):
    """Build `<sweep dir>/report.html` after every multirun, never raising."""

    def __init__(self, baseline: str | None = None) -> None:
        self.baseline = baseline

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Called by Hydra once all jobs of the sweep returned."""
        try:
            sweep_dir = Path(str(config.hydra.sweep.dir))
            report = build_sweep_report([sweep_dir], sweep_dir / REPORT_NAME, self.baseline)
        except Exception as exc:  # any failure: the measured runs matter more than the report
            log.warning("sweep report not built: %s", exc)
            return
        log.info("sweep report: %s", report)
