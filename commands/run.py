"""`servelab [overrides]`: one run of one configuration (`-m` for a sweep), through Hydra.

Each job writes its run directory (Hydra's output directory) and prints the one-screen
summary; a job whose directory already holds a complete run of the same configuration is
not run again, so a sweep restarted after a crash redoes only what did not finish.
"""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import check_group_choices
from servelab.harness.run.schema import check
from servelab.harness.run.settings import CONF_DIR

SUMMARY = "run one configuration (the default verb; -m sweeps)"
USAGE = """usage: servelab [OVERRIDE ...]        one run, e.g. strategy=vllm workload=offline
       servelab -m KEY=A,B [...]          a sweep: one run per combination, then its report

Every key of conf/config.yaml can be overridden (engine.*, strategy.*, workload.*, slo.*).
Presets: strategy=NAME (conf/strategy), workload=NAME (conf/workload), model=NAME (conf/model).
Hydra's own options work too: --cfg job prints the composed configuration."""


def main(args: list[str]) -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base=None)
    def job(cfg: DictConfig) -> None:
        from servelab.harness.measure.summary_table import render_summary
        from servelab.harness.run.run import completed_summary, run
        from servelab.harness.run.servers.managed import ServerFailed
        from servelab.reports.run_report import write_run_report

        run_dir = Path(HydraConfig.get().runtime.output_dir)
        try:
            check(cfg)
            earlier = completed_summary(cfg, run_dir)
            if earlier is not None:
                print(f"already complete, not run again: {run_dir}")
                render_summary(earlier, str(run_dir))
                return
            summary = run(cfg, run_dir)
        except ConfigError as error:
            print(f"servelab: error: {error}", file=sys.stderr)
            sys.exit(2)
        except ServerFailed as error:
            print(f"servelab: error: {error}", file=sys.stderr)
            sys.exit(1)
        write_run_report(run_dir)
        render_summary(summary, str(run_dir))

    check_group_choices([a for a in args if not a.startswith("-")])
    job()
