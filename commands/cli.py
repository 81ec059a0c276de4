"""The `servelab` command: dispatch to a verb's module, or run a configuration through Hydra.

`servelab [overrides]` is one run (`-m` sweeps); `servelab VERB [args]` runs a tool verb,
each in its own module of this package with a `SUMMARY`, a `USAGE` and a `main(args)`.
`servelab --help` lists the verbs; `servelab VERB --help` explains one. Bad input prints one
line naming the field and the fix, and exits with status 2.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from servelab.base.errors import ConfigError

VERBS = {
    "run": "servelab.commands.run",
    "workload": "servelab.commands.workload",
    "report": "servelab.commands.report",
    "summarize": "servelab.commands.summarize",
    "calibrate": "servelab.commands.calibrate",
    "kv-size": "servelab.commands.kv_size",
    "search": "servelab.commands.search",
    "perplexity": "servelab.commands.perplexity",
    "quantize": "servelab.commands.quantize",
    "salient": "servelab.commands.salient",
    "verify": "servelab.commands.verify",
    "serve": "servelab.commands.serve",
    "gate": "servelab.commands.gate",
    "claims": "servelab.commands.claims",
    "fit-steps": "servelab.commands.fit_steps",
    "profile-steps": "servelab.commands.profile_steps",
    "plan": "servelab.commands.plan",
    "knee": "servelab.commands.knee",
    "step-errors": "servelab.commands.step_errors",
}
HELP_FLAGS = ("-h", "--help")


def verb_module(name: str) -> ModuleType:
    return importlib.import_module(VERBS[name])


def overview() -> str:
    lines = [
        "servelab: LLM serving strategies side by side on one model, one workload, one report.",
        "",
        "usage: servelab [OVERRIDE ...]          one run (servelab -m ... for a sweep)",
        "       servelab VERB [ARG ...]          a tool; servelab VERB --help explains it",
        "",
        "verbs:",
    ]
    width = max(len(name) for name in VERBS)
    lines += [f"  {name:<{width}}  {verb_module(name).SUMMARY}" for name in VERBS]
    return "\n".join(lines)


def main() -> None:
    args = sys.argv[1:]
    try:
        if args and args[0] in HELP_FLAGS:
            print(overview())
        elif args and args[0] in VERBS:
            module = verb_module(args[0])
            if any(a in HELP_FLAGS for a in args[1:]):
                print(f"{module.SUMMARY}\n\n{module.USAGE}")
            else:
                module.main(args[1:] if args[0] != "run" else _hydra_args(args[1:]))
        else:
            verb_module("run").main(args)
    except ConfigError as error:
        print(f"servelab: error: {error}", file=sys.stderr)
        sys.exit(2)


def _hydra_args(args: list[str]) -> list[str]:
    """`servelab run ARGS` is `servelab ARGS`: Hydra reads sys.argv itself."""
    sys.argv = [sys.argv[0], *args]
    return args


if __name__ == "__main__":  # `python -m servelab.commands.cli`: servelab without its script
    main()
