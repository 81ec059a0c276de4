"""`servelab workload show`: what a workload sends, described without loading a model."""

from __future__ import annotations

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import compose

SUMMARY = "describe what a workload sends (no model loaded)"
USAGE = """usage: servelab workload show [workload=NAME] [OVERRIDE ...]

Prints the request count, arrival process, prompt and output length distributions and a
few example prompts of the composed workload."""


def main(args: list[str]) -> None:
    from servelab.harness.run.settings import model_of
    from servelab.models.load import model_config_of, tokenizer_for
    from servelab.workloads.build import build_workload
    from servelab.workloads.show import render_workload

    if not args or args[0] != "show":
        raise ConfigError("workload", USAGE.splitlines()[0])
    cfg = compose(args[1:])
    tokenizer = tokenizer_for(model_of(cfg))
    max_context = model_config_of(model_of(cfg)).max_context
    print(render_workload(build_workload(cfg.workload, tokenizer, max_context), max_context))
